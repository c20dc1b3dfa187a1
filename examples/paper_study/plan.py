"""The study's plan, built before any model loads: the arms' configs, the training problems and held-out problems,
the evaluation every piece starts from, and the time estimates."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem_grpo import TandemGRPOConfig
from tandem_grpo.data import INSTRUCTIONS, builtin_problems, builtin_split, load_math_dataset

from .presets import TIMINGS

ARMS = ("grpo", "tandem", "kl_to_junior")
"""The paper's arms, in the order they are trained, evaluated and shown."""
CONTROLS = ("live_junior",)
"""Controls that separate the method from its cost, run and read as pilots (``--pilot``): ``live_junior`` is tandem
with the engine's junior reloaded with the senior's weights at every weight sync, so co-generation is solo sampling
of the current policy and only the authorship mask (the loss on the senior's tokens) differs from GRPO."""

CO_GENERATING = ("tandem", "live_junior")
"""The arms whose rollouts the junior co-writes: their junior probability tells their pieces apart."""

LABELS = {"base": "base", "grpo": "GRPO", "tandem": "tandem", "kl_to_junior": "KL-to-junior",
          "live_junior": "live junior"}  # fmt: skip
"""Display names of the base and of each arm."""
ARM_FIELDS = ("junior_probability", "kl_to_junior", "beta")
"""The config fields the arms differ in."""

SHARED_FIELDS = (
    "seed", "max_steps", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
    "num_generations", "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "loss_type", "handoff_mode", "handoff_granularity", "max_gap_tokens", "junior_model_name_or_path",
    "junior_token_loss_weight", "use_vllm", "vllm_mode", "vllm_importance_sampling_correction", "bf16",
    "reward_weights",
)  # fmt: skip
"""The config fields every arm shares (the seed: every arm of one seed)."""


PAPER_JUNIOR_PROBABILITY = 0.5
"""The paper's junior probability; pieces at another value are committed under ``<arm>-p<value>``."""

PIECE_FILE = "piece.json"
"""A piece folder's record (arm, seed, training summary, config, wall times and the CPU they were measured on); it
is written last, so a folder without it is unfinished."""


def arm_config(shared: TandemGRPOConfig, arm: str, seed: int, output_dir: Path, kl_beta: float) -> TandemGRPOConfig:
    """The config of ``arm`` at ``seed``: the shared config with the arm's fields (``ARM_FIELDS``) and folder.

    Args:
        shared: the settings every arm shares; its ``junior_probability`` is the tandem arm's.
        arm: one of ``ARMS`` or ``CONTROLS``.
        seed: the training seed.
        output_dir: the arm's folder.
        kl_beta: the KL coefficient of the ``kl_to_junior`` arm (the others get ``shared.beta``).

    Returns:
        A new ``TandemGRPOConfig`` (``run_name`` ``"<arm>-seed-<seed>"``).

    Raises:
        ValueError: an unknown ``arm``, or a value ``TandemGRPOConfig`` refuses.
    """
    fields_ = dict(seed=seed, output_dir=str(output_dir), run_name=f"{arm}-seed-{seed}", kl_to_junior=False)
    if arm == "grpo":
        fields_ |= dict(junior_probability=0.0)
    elif arm in CO_GENERATING:
        fields_ |= dict(junior_probability=shared.junior_probability)
    elif arm == "kl_to_junior":
        fields_ |= dict(junior_probability=0.0, kl_to_junior=True, beta=kl_beta)
    else:
        raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS + CONTROLS)}")
    return TandemGRPOConfig.from_grpo_config(shared, **fields_)


def prompts_per_step(training: TandemGRPOConfig) -> int:
    """Problems one optimizer step uses (one process): completions per step over generations per problem."""
    completions = training.per_device_train_batch_size * training.gradient_accumulation_steps
    return max(1, completions // training.num_generations)


@dataclass
class Plan:
    """Everything the study will do, built before any model is loaded."""

    study: Any  # reproduce_paper.StudyArguments
    shared: TandemGRPOConfig
    root: Path
    report_dir: Path
    train_dataset: object
    eval_source: str
    eval_rows: list[dict] | None  # held-out built-in problems, written to eval_problems.jsonl when the study runs
    configs: dict[tuple[int, str], TandemGRPOConfig]
    evaluation: object  # the EvaluationConfig every piece starts from
    results_dir: Path

    def piece_dir(self, seed: int, arm: str, pilot: bool | None = None) -> Path:
        """Where a piece is committed: ``<results_dir>/base`` or ``<results_dir>/[pilot/]seed-<s>/<arm>``
        (``pilot``: default, this run's ``--pilot``)."""
        if arm == "base":
            return self.results_dir / "base"
        pilot = self.study.pilot if pilot is None else pilot
        return self.results_dir / ("pilot" if pilot else "") / f"seed-{seed}" / self.folder_name(arm)

    def folder_name(self, arm: str) -> str:
        return folder_name(arm, self.shared.junior_probability)


def report_folder(junior_probability: float) -> str:
    """The report's folder in the results folder: ``report``, or ``report-p<junior_probability>`` for a report whose
    tandem arm is the piece at another junior probability (``--report --junior_probability 0.1``)."""
    p = junior_probability
    return "report" if p == PAPER_JUNIOR_PROBABILITY else f"report-p{p:g}"


def folder_name(arm: str, junior_probability: float) -> str:
    """``arm``, with ``-p<junior_probability>`` for a co-generating arm away from the paper's 0.5
    (``tandem-p0.1``): a dose-response piece sits beside the 0.5 one instead of replacing it."""
    p = junior_probability
    return f"{arm}-p{p:g}" if arm in CO_GENERATING and p != PAPER_JUNIOR_PROBABILITY else arm


# The evaluation's flags that this script names --eval_<flag> (StudyArguments).
EVAL_FLAG_RE = re.compile(r"--(limit|k|max_new_tokens|step_grid|schedules|backend|batch_size|seed)\b")


def load_training_problems(study: Any, training: TandemGRPOConfig):
    """The training set and, for the built-in problems, held-out evaluation rows ``{"question", "answer"}``.

    Built-in problems: [`builtin_split`][tandem_grpo.data.builtin_split] (``--problem_seed``), the held-out rows
    without the instruction; with ``--curve_steps`` the held-out rows are those a study of the first curve step
    holds out, so its base piece is the curves' too. Other sets load ``--num_problems`` rows of their train split.
    """
    num = study.num_problems or prompts_per_step(training) * training.max_steps
    instruction = INSTRUCTIONS[study.instruction]
    if study.dataset_name is not None:
        return load_math_dataset(study.dataset_name, split=study.dataset_train_split, limit=num,
                                 instruction=instruction), None  # fmt: skip
    if study.eval_dataset is not None:  # evaluated on another set: nothing to hold out
        return builtin_problems(study.task, num, seed=study.problem_seed, instruction=instruction), None
    curve = getattr(study, "curve_steps", None)
    after = prompts_per_step(training) * curve[0] if curve and not study.num_problems else None
    train, held = builtin_split(study.task, num, study.eval_limit, seed=study.problem_seed, instruction=instruction,
                                held_out_after=after)  # fmt: skip
    held_out = [{"question": prompt[0]["content"].removesuffix(instruction), "answer": answer}
                for prompt, answer in zip(held["prompt"], held["answer"], strict=True)]  # fmt: skip
    return train, held_out


def eval_sampling(study: Any, shared: TandemGRPOConfig):
    """The evaluation's sampling settings: the training's, with ``--eval_temperature/top_p/top_k`` where given."""
    import dataclasses

    from tandem_grpo.sampling import SamplingSettings

    given = {"temperature": study.eval_temperature, "top_p": study.eval_top_p, "top_k": study.eval_top_k}
    return dataclasses.replace(
        SamplingSettings.from_config(shared), **{k: v for k, v in given.items() if v is not None}
    )


def build_plan(study: Any, shared: TandemGRPOConfig) -> Plan:
    """Load the data, build every arm's config and the pieces' evaluation settings (no model is loaded).

    Raises:
        ValueError, OSError: bad data or settings, naming what was wrong.
    """
    from tandem_grpo.evaluation import EvaluationConfig
    from tandem_grpo.handoff import HandoffRule

    root = Path(shared.output_dir)
    results_dir = Path(study.results_dir or f"results/{study.preset}")
    report_dir = Path(study.report_dir) if study.report_dir else results_dir / report_folder(shared.junior_probability)
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
        for arm in ARMS + CONTROLS
    }
    evaluation = EvaluationConfig(
        checkpoints=[study.model_name_or_path],
        junior=study.model_name_or_path,
        base=study.model_name_or_path,
        dataset=eval_source,
        split="test" if held_out is not None else study.eval_split,
        instruction=study.instruction,
        answer=study.answer,
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
    study, evaluation = plan.study, plan.evaluation
    problems = study.eval_limit or 0
    scale = evaluation.k * evaluation.max_new_tokens / (t["eval_k"] * t["eval_tokens"])
    # The alternating protocol and the word rule, one schedule each, and the step grid, two each (senior/junior first).
    runs = {"alternating": 1, "word": 1, "steps": 2 * len(evaluation.step_grid)}
    schedules = 0 if study.pilot else sum(runs[s] for s in evaluation.schedules)  # a pilot samples solo only
    # TIMINGS' eval_base was measured for the whole-study evaluation, 4 models sampled alone; a piece samples one.
    per_piece = problems * (t["eval_base"] / 4 + schedules * t["eval_schedule"] / 3) * scale + t["overhead"]
    out = {"base": problems * t["eval_base"] / 4 * scale + t["overhead"]}  # no handoff schedules
    for arm in ARMS + CONTROLS:
        out[arm] = per_piece + (0.0 if study.from_pilot else training_seconds(plan, arm))
    return out, t["measured"]


def training_seconds(plan: Plan, arm: str) -> float:
    """Estimated seconds of training one arm (``TIMINGS``' step time, scaled by completions x tokens a step)."""
    t = TIMINGS[plan.study.preset]
    shared = plan.shared
    size = shared.per_device_train_batch_size * shared.gradient_accumulation_steps * shared.max_completion_length
    step = t["step"][arm if arm in ARMS else "tandem"]  # a control's step is a tandem step
    return step * shared.max_steps * size / (t["completions"] * t["tokens"])


def holds_trained_model(weights: str | Path) -> bool:
    """Does a weights folder hold a trained model with its ``log_history.json`` (what ``--from_pilot`` reads)?"""
    return (Path(weights) / "log_history.json").is_file() and (Path(weights) / "config.json").is_file()


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
        if state == "to run" and study.from_pilot:
            state = f"to evaluate from its pilot's weights {config.output_dir}"
        seconds_here = seconds[arm]
        if study.restore_weights:
            pilot = plan.piece_dir(seed, arm, pilot=True)
            state = f"to train again as its pilot {pilot} did -> {config.output_dir}, not evaluated"
            if holds_trained_model(config.output_dir):
                state = f"its weights are in {config.output_dir}, skipped"
            seconds_here = training_seconds(plan, arm)
        lines.append(
            f"  seed {seed} {arm:<13} junior_probability={config.junior_probability:g} "
            f"kl_to_junior={config.kl_to_junior} beta={config.beta:g} -> {plan.piece_dir(seed, arm)} ({state}, "
            f"~{_duration(seconds_here)})"
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


SAME_EVALUATION = ("dataset", "split", "instruction", "answer", "limit", "k", "sampling", "max_new_tokens",
                   "handoff", "max_rounds", "seed", "num_problems")  # fmt: skip
"""Evaluation settings every piece must share with the base piece: the report pairs pieces by problem."""
SOLO_EVALUATION = tuple(key for key in SAME_EVALUATION if key not in ("handoff", "max_rounds"))
"""The settings a solo pass@1 depends on: a pilot at another junior probability samples its senior alone as the
base piece did, so the handoff rule its evaluation records does not enter the comparison."""
SETTING_BEFORE_IT_EXISTED = {"answer": "final"}
"""What a setting added later was in pieces written before it (their ``results.json`` lacks it)."""


def check_same_evaluation(base: dict, piece: dict, name: str, keys: tuple[str, ...] = SAME_EVALUATION) -> None:
    """Refuse a piece whose problems or evaluation settings (``keys``) differ from the base piece's.

    Raises:
        ValueError: naming the piece and the first setting that differs.
    """
    a, b = base["results"]["settings"], piece["results"]["settings"]
    sha = (base.get("eval_problems_sha256"), piece.get("eval_problems_sha256"))
    for key in keys:
        if key == "dataset" and None not in sha and sha[0] == sha[1]:
            continue  # the same held-out file, byte for byte, wherever it was read from
        default = SETTING_BEFORE_IT_EXISTED.get(key)
        if a.get(key, default) != b.get(key, default):
            raise ValueError(
                f"{name}: evaluation setting {key!r} is {b.get(key)!r}, the base piece's is "
                f"{a.get(key)!r}; pieces compared problem by problem must share it (rerun the piece)."
            )
    if None not in sha and sha[0] != sha[1]:
        raise ValueError(f"{name}: sampled on other held-out problems than the base piece (rerun the piece).")
