"""The study's presets: the settings a piece starts from, and the rates its time estimates use."""

from tandem_grpo.models import SMOLLM2_ID

PRESETS = ("cpu-paper", "cpu-small", "gpu-1")


# The paper's evaluation decoding (the authors' eval scripts; `tandem-grpo evaluate --preset paper`).
PAPER_EVAL_SAMPLING = dict(eval_temperature=0.7, eval_top_p=0.8, eval_top_k=20)
PRESET_STUDY = {
    # Every core (--cpu_threads default): one job at a time. Two jobs side by side at one thread each were each about
    # 2.9x slower than alone at two threads (measured: a tandem step 81 s instead of 28 s).
    # cpu-paper: the task bench/pilot_task.py chose (results/pilot: the base's pass@1 between 10% and 40% at the
    # evaluation's sampling, several blank-line-separated steps), the paper's evaluation sizes and decoding.
    "cpu-paper": dict(model_name_or_path=SMOLLM2_ID, dtype="float32", dataset_name=None, task="chain2", lora_r=0,
                      instruction="steps", kl_beta=1e-3, eval_max_new_tokens=256,
                      eval_limit=100, eval_k=8, eval_step_grid=[1], eval_backend="vllm", eval_batch_size=16,
                      eval_schedules=["alternating", "word"], **PAPER_EVAL_SAMPLING),
    # cpu-small: the earlier study (results/cpu-small), kept to reread it; its base solved none of its problems.
    "cpu-small": dict(model_name_or_path=SMOLLM2_ID, dtype="float32", dataset_name=None, task="two_operand", lora_r=0,
                      instruction="one_line", kl_beta=0.04, eval_max_new_tokens=None,
                      eval_limit=20, eval_k=4, eval_step_grid=[1], eval_backend="transformers",
                      eval_batch_size=16, eval_schedules=None, eval_temperature=None, eval_top_p=None,
                      eval_top_k=None),
    "gpu-1": dict(model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16", dataset_name="gsm8k", lora_r=0,
                  task=None, instruction="step_by_step", eval_max_new_tokens=None,
                  kl_beta=1e-3, eval_limit=500, eval_k=8, eval_step_grid=[1, 2, 3], eval_backend="vllm",
                  eval_batch_size=64, eval_schedules=None, **PAPER_EVAL_SAMPLING),
}  # fmt: skip
PRESET_TRAINING = {
    "cpu-paper": dict(
        output_dir="outputs/reproduce-cpu-paper",
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,  # 16 completions = 2 prompts x 8 generations per optimizer step
        num_generations=8,
        max_completion_length=128,  # training; the evaluation gets the pilot's 256 (--eval_max_new_tokens)
        max_steps=30,
        # Full fine-tuning: a LoRA senior's step was not cheaper here (results/levers).
        learning_rate=2e-5,
        # Rollouts at the evaluation's decoding, not the authors' plain temperature 0.6: at 0.6 with the 128-token cap
        # the base solved 8.4% of its rollouts (results/pilot/rollout_log.txt), most groups carried no reward, and
        # GRPO at learning rate 5e-5 got worse (results/cpu-paper/earlier/). With this decoding GRPO learnt
        # (results/cpu-paper/pilot/seed-1/grpo). TRL's importance-sampling correction would scale the truncated
        # rollouts' loss to almost nothing (docs/training.md), so it is off.
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        vllm_importance_sampling_correction=False,
        # The paper's reward: the binary verifier alone. format_reward is logged (rewards/format_reward/mean), not
        # rewarded.
        reward_weights=[1.0, 0.0],
        # Colocated vLLM rollouts (the authors' engine; the junior in the same engine with its own KV cache). A GRPO
        # step still took 68-75 s here: a py-spy profile put 80% of it in the policy's forward and backward passes.
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.35,
        # A 135M model on a CPU has memory to spare, so activations are kept, not recomputed (the step time moved
        # within its spread either way: README, Speed).
        gradient_checkpointing=False,
    ),
    "cpu-small": dict(
        output_dir="outputs/reproduce-cpu-small",
        # The main job's settings (examples/train_math.py), with which its format reward rises within 30 steps.
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,  # 16 completions = 4 prompts x 4 generations per optimizer step
        num_generations=4,
        max_completion_length=64,
        max_steps=30,
        learning_rate=2e-5,
    ),
    "gpu-1": dict(
        output_dir="outputs/reproduce-gpu-1",
        per_device_train_batch_size=32,
        gradient_accumulation_steps=4,  # 128 completions = 16 prompts x 8 generations per optimizer step
        num_generations=8,
        max_completion_length=512,
        max_steps=100,
        learning_rate=1e-6,
        temperature=0.6,  # the authors' rollout temperature
        reward_weights=[1.0, 0.0],  # the binary verifier alone; the format reward is logged, not rewarded
        # bf16 is left unset: TandemGRPOConfig turns it on where the GPU supports it (and off for a CPU dry run).
        gradient_checkpointing=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
    ),
}
COMMON_TRAINING = dict(
    junior_probability=0.5,
    handoff_granularity="word",
    max_gap_tokens=32,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    log_completions=False,
    disable_tqdm=False,
)

# Seconds measured for cpu-small (see the module docstring) and the sizes they were measured at; the gpu-1 numbers
# are guesses from the sizes, not measurements. Training steps scale with completions x tokens; the evaluation per
# problem with k x tokens: ``eval_base`` (solo samples, legibility) plus ``eval_schedule`` per handoff schedule.
TIMINGS = {
    # cpu-paper, measured on the fixed engine's pieces (results/map/fixed-head, AMD EPYC 2 cores, torch AVX512,
    # 2026-12-06/07): 30 GRPO steps took 9.1-10.0 min alone, tandem 15.4-16.6 and KL-to-junior 15.8 (26.4 beside
    # unit tests); a pilot's solo evaluation 1.7-2.7 min (eval_base: four such), a full piece's (solo, legibility, two
    # schedules) 10.3-15.4 min, for 100 problems x 8. The base piece's legibility is not in eval_base: its estimate
    # is low.
    "cpu-paper": dict(measured=True, step={"grpo": 19.0, "tandem": 32.0, "kl_to_junior": 31.0}, completions=16,
                      tokens=128, eval_base=4.4, eval_schedule=10.0, eval_k=8, eval_tokens=256, overhead=30.0),
    # Median step times of the committed run (results/cpu-small); its evaluation took 10.6 min for 20 problems, split
    # between solo samples plus legibility and each handoff schedule in the proportion measured earlier (52.5 : 32.8).
    "cpu-small": dict(measured=True, step={"grpo": 20.8, "tandem": 27.5, "kl_to_junior": 23.2}, completions=16,
                      tokens=64, eval_base=11.1, eval_schedule=6.9, eval_k=4, eval_tokens=64, overhead=60.0),
    "gpu-1": dict(measured=False, step={"grpo": 7.0, "tandem": 10.0, "kl_to_junior": 8.0}, completions=128,
                  tokens=512, eval_base=0.6, eval_schedule=0.15, eval_k=8, eval_tokens=512, overhead=600.0),
}  # fmt: skip
