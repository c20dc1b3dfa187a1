"""Outputs of an evaluation run: ``results.json``, PNG plots and an HTML authorship view.

Plots use matplotlib's Agg backend (no display needed). The HTML page colours each contiguous run of senior- and
junior-written tokens, so a reader sees at a glance who wrote what in a tandem completion.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..authorship import spans_to_html

SENIOR_COLOUR = "#cfe3ff"  # light blue
JUNIOR_COLOUR = "#ffd9b3"  # light orange

RESULTS_FILE = "results.json"
PASS_AT_K_PLOT = "pass_at_k.png"
PASS_AT_K_CURVE_PLOT = "pass_at_k_curve.png"
DRIFT_PLOT = "drift.png"
LEGIBILITY_PLOT = "cross_entropy.png"
SAMPLES_HTML = "samples.html"


def _json_safe(value):
    # JSON has no NaN/inf: write them as null rather than produce a file strict parsers reject.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_results_json(results: dict, path: str | Path) -> Path:
    """Write ``results`` as indented, strict JSON (non-finite floats become ``null``); returns the path."""
    path = Path(path)
    path.write_text(json.dumps(_json_safe(results), indent=2, allow_nan=False) + "\n")
    return path


# ------------------------------------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    """Lay out ``fig``, write it to ``path`` and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _interval(estimate: dict | None) -> tuple[float, float, float] | None:
    """``(value, low, high)`` of an interval dict (``None`` without one or without a value)."""
    if not estimate or estimate["value"] is None:
        return None
    return estimate["value"], estimate["ci_low"], estimate["ci_high"]


def _bar_groups(ax, groups: Sequence[str], series: dict[str, list[tuple[float, float, float] | None]], ylabel: str):
    """Grouped bars: one group per entry of ``groups``, one bar per series; values are (value, low, high)."""
    n = max(1, len(series))
    width = 0.8 / n
    for j, (label, values) in enumerate(series.items()):
        xs, ys, err_lo, err_hi = [], [], [], []
        for i, v in enumerate(values):
            if v is None or v[0] is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(v[0])
            err_lo.append(max(0.0, v[0] - v[1]))
            err_hi.append(max(0.0, v[2] - v[0]))
        has_interval = any(err_lo) or any(err_hi)
        ax.bar(xs, ys, width=width, label=label, yerr=[err_lo, err_hi] if has_interval else None, capsize=2)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def plot_pass_at_k(results: dict, path: str | Path) -> Path:
    """Bar chart of pass@k (every k evaluated, one panel each) per schedule (x) and checkpoint (bars), with CIs."""
    plt = _pyplot()
    checkpoints = results["checkpoints"]
    ks = results["settings"]["pass_at"]
    schedules: list[str] = ["solo"]
    for ckpt in checkpoints.values():
        schedules += [s for s in ckpt.get("handoff", {}) if s not in schedules]
    fig, axes = plt.subplots(1, len(ks), figsize=(max(6, 1.1 * len(schedules)) * len(ks) / 1.5, 4), squeeze=False)
    for ax, k in zip(axes[0], ks, strict=True):
        series = {}
        for name, ckpt in checkpoints.items():
            row = []
            for s in schedules:
                entry = ckpt["solo"] if s == "solo" else ckpt.get("handoff", {}).get(s)
                row.append(_interval(entry.get(f"pass@{k}")) if entry else None)
            series[name] = row
        junior = results.get("junior", {}).get("solo")
        if junior and f"pass@{k}" in junior:
            ax.axhline(junior[f"pass@{k}"]["value"], color="grey", linestyle="--", linewidth=1, label="junior solo")
        _bar_groups(ax, schedules, series, f"pass@{k}")
        ax.set_ylim(0, 1)
        ax.set_title(f"pass@{k} by schedule ({results['settings']['confidence']:.0%} CI)", fontsize=9)
    return _save(fig, path)


def _solo_curves(results: dict) -> dict[str, dict]:
    """Every model's solo pass@k curve, by label: the checkpoints, then the GRPO checkpoint and the junior."""
    curves = {name: c["solo"].get("pass_at_k_curve") for name, c in results["checkpoints"].items()}
    curves["GRPO"] = results.get("grpo", {}).get("solo", {}).get("pass_at_k_curve")
    curves["junior"] = results.get("junior", {}).get("solo", {}).get("pass_at_k_curve")
    return {label: curve for label, curve in curves.items() if curve}


def plot_pass_at_k_curve(results: dict, path: str | Path) -> Path:
    """Solo pass@k against k (log2 axis, every k from 1 to the curve's end) for each model, with the bootstrap
    interval as a band; the legend gives each model's coverage (share of problems solved by any sample)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    curves = _solo_curves(results)
    for label, curve in curves.items():
        ks = curve["k"]
        values = [e["value"] for e in curve["pass_at_k"]]
        cov = curve["coverage"]
        line = ax.plot(ks, values, marker="o", markersize=3, label=f"{label} (coverage {cov['value']:.2f})")[0]
        lows, highs = [e["ci_low"] for e in curve["pass_at_k"]], [e["ci_high"] for e in curve["pass_at_k"]]
        ax.fill_between(ks, lows, highs, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    last = max((curve["k"][-1] for curve in curves.values()), default=1)
    ticks = sorted({2**i for i in range(last.bit_length()) if 2**i <= last} | {last})
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.minorticks_off()
    ax.set_ylim(0, 1)
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("pass@k (unbiased)")
    ax.set_title(f"Solo pass@k curve ({results['settings']['confidence']:.0%} bootstrap CI)", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _drift_value(entry: dict, part: str | None) -> tuple[float, float, float] | None:
    """``(value, low, high)`` of a checkpoint's drift from the base, whole (``part=None``) or ``"first"``/``"rest"``:
    ``drift_with_null.kl_nats``, else the smoothed ``drift.kl_to_base_nats`` of earlier results (no interval);
    ``None`` when absent or NaN (nothing in that part)."""
    with_null = entry.get("drift_with_null")
    if with_null:
        block = with_null if part is None else with_null.get("by_position", {}).get(part, {})
        est = block.get("kl_nats")
        if est and est["value"] is not None and est["value"] == est["value"]:
            low, high = est["ci_low"], est["ci_high"]
            usable = low is not None and low == low and high is not None and high == high
            return (est["value"], low, high) if usable else (est["value"],) * 3
        return None
    old = entry.get("drift") or {}
    value = (
        old.get("kl_to_base_nats") if part is None else old.get("by_position", {}).get(part, {}).get("kl_to_base_nats")
    )
    return None if value is None or value != value else (value, value, value)


def plot_drift(results: dict, path: str | Path) -> Path:
    """Left: each checkpoint's drift from the base (KL, nats), whole and split into the first N completion tokens and
    the rest, with intervals. Right, with a GRPO checkpoint: the share of GRPO's most-shifted tokens moved back and
    its null (``moved_back``), or for earlier results the scatter of the smoothed ``drift_reversal``."""
    plt = _pyplot()
    checkpoints = results["checkpoints"]
    reversals = {n: c["drift_reversal"] for n, c in checkpoints.items() if c.get("drift_reversal")}
    moved = {n: c["moved_back"] for n, c in checkpoints.items() if c.get("moved_back")}
    right = bool(moved or reversals)
    fig, axes = plt.subplots(1, 2 if right else 1, figsize=(11 if right else 6, 4), squeeze=False)
    ax = axes[0][0]
    drifts = dict(checkpoints)
    if results.get("grpo", {}).get("drift_with_null") or results.get("grpo", {}).get("drift"):
        drifts["GRPO"] = results["grpo"]
    blocks = [d.get("drift_with_null") or d.get("drift") or {} for d in drifts.values()]
    prefix = next((b["by_position"]["prefix_tokens"] for b in blocks if b.get("by_position")), None)
    series = {"whole completion": [_drift_value(d, None) for d in drifts.values()]}
    if prefix is not None:
        series[f"first {prefix} tokens"] = [_drift_value(d, "first") for d in drifts.values()]
        series[f"after token {prefix}"] = [_drift_value(d, "rest") for d in drifts.values()]
    _bar_groups(ax, list(drifts), series, "KL(model || base), nats")
    ax.set_title("Marginal token distribution drift, by completion position", fontsize=9)
    if moved:
        series = {"checkpoint": [_interval(m["fraction_moved_back"]) for m in moved.values()],
                  "null (GRPO vs itself)": [_interval(m["null_fraction"]) for m in moved.values()]}  # fmt: skip
        _bar_groups(axes[0][1], list(moved), series, "share moved back")
        axes[0][1].set_ylim(0, 1)
        axes[0][1].set_title("GRPO's most-shifted tokens moved back toward the base", fontsize=9)
    elif reversals:
        ax2 = axes[0][1]
        lim = 0.0
        for name, rev in reversals.items():
            label = f"{name}: {rev['fraction_moved_back']:.0%} of top {rev['top_n']} moved back"
            ax2.scatter(rev["grpo_shift"], rev["tandem_shift"], s=6, alpha=0.6, label=label)
            lim = max([lim] + [abs(v) for v in rev["grpo_shift"]] + [abs(v) for v in rev["tandem_shift"]])
        xs = [-lim, 0.0, lim]
        ax2.fill_between(xs, [-abs(x) for x in xs], [abs(x) for x in xs], color="grey", alpha=0.15)
        ax2.set_xlabel("GRPO shift: log p_grpo - log p_base")
        ax2.set_ylabel("tandem shift: log p_tandem - log p_base")
        ax2.set_title("GRPO's most-shifted tokens under tandem training", fontsize=9)
        ax2.legend(fontsize=7)
    return _save(fig, path)


def plot_legibility(results: dict, path: str | Path) -> Path:
    """Junior per-token cross-entropy on each checkpoint's completions (left) and per-token overlap (right)."""
    plt = _pyplot()
    checkpoints = results["checkpoints"]
    names = list(checkpoints)
    ce = [checkpoints[n].get("legibility", {}).get("junior_cross_entropy") for n in names]
    ov = [checkpoints[n].get("legibility", {}).get("overlap") for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].bar(range(len(names)), [v if v is not None else 0.0 for v in ce], color="tab:orange")
    ref = results.get("junior", {}).get("legibility_self", {}).get("junior_cross_entropy")
    if ref is not None:
        axes[0].axhline(ref, color="grey", linestyle="--", linewidth=1, label="junior on its own samples")
        axes[0].legend(fontsize=7)
    axes[0].set_ylabel("junior cross-entropy, nats/token")
    axes[0].set_title("Legibility: junior cross-entropy on senior text", fontsize=9)
    axes[1].bar(range(len(names)), [v if v is not None else 0.0 for v in ov], color="tab:green")
    axes[1].set_ylim(0, 1)
    axes[1].set_ylabel("sum_v min(p_senior, p_junior)")
    axes[1].set_title("Per-token distribution overlap", fontsize=9)
    for ax in axes:
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    return _save(fig, path)


# ------------------------------------------------------------------------------------------------ authorship


@dataclass
class SampleView:
    """One completion to show: where it came from, the problem, and its ``(text, author)`` spans
    ([`authorship_spans`][tandem_grpo.authorship.authorship_spans]; author 1 = senior, 0 = junior)."""

    checkpoint: str
    schedule: str
    problem: str
    gold: str
    correct: bool
    spans: list[tuple[str, int]]


_CSS = f"""
body {{ font-family: sans-serif; max-width: 60em; margin: 2em auto; line-height: 1.5; }}
.completion {{ white-space: pre-wrap; font-family: monospace; border: 1px solid #ccc; padding: .6em; }}
.senior {{ background: {SENIOR_COLOUR}; }}
.junior {{ background: {JUNIOR_COLOUR}; }}
.legend span {{ padding: 0 .5em; margin-right: 1em; }}
.meta {{ color: #555; font-size: .9em; }}
.ok {{ color: #1a7f37; }} .bad {{ color: #cf222e; }}
"""


def render_samples_html(samples: Sequence[SampleView], title: str = "Tandem completions") -> str:
    """An HTML page with each sample's text coloured by author, a legend, and all text escaped."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<p class="legend">Legend: <span class="senior">senior wrote this</span>'
        '<span class="junior">junior wrote this</span></p>',
    ]
    for s in samples:
        verdict = '<span class="ok">correct</span>' if s.correct else '<span class="bad">incorrect</span>'
        body = spans_to_html(s.spans)
        parts += [
            f"<h3>{html.escape(s.checkpoint)} &middot; {html.escape(s.schedule)}</h3>",
            f'<p class="meta"><b>Problem:</b> {html.escape(s.problem)}<br>'
            f"<b>Gold:</b> {html.escape(s.gold)} &middot; {verdict}</p>",
            f'<div class="completion">{body}</div>',
        ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(results: dict, output_dir: str | Path, samples: Sequence[SampleView]) -> dict[str, str]:
    """Write ``results.json``, the four plots and ``samples.html`` into ``output_dir``; returns their paths.

    Keys of the returned dict (also stored as ``results["outputs"]``): ``pass_at_k_plot``, ``pass_at_k_curve_plot``,
    ``drift_plot``, ``legibility_plot``, ``samples_html``, ``results``.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "pass_at_k_plot": plot_pass_at_k(results, out / PASS_AT_K_PLOT),
        "pass_at_k_curve_plot": plot_pass_at_k_curve(results, out / PASS_AT_K_CURVE_PLOT),
        "drift_plot": plot_drift(results, out / DRIFT_PLOT),
        "legibility_plot": plot_legibility(results, out / LEGIBILITY_PLOT),
    }
    (out / SAMPLES_HTML).write_text(render_samples_html(samples), encoding="utf-8")
    paths["samples_html"] = out / SAMPLES_HTML
    results["outputs"] = {k: str(v) for k, v in paths.items()} | {"results": str(out / RESULTS_FILE)}
    paths["results"] = write_results_json(results, out / RESULTS_FILE)
    return {k: str(v) for k, v in paths.items()}


# -------------------------------------------------------------------------------------------------- samples


def sample_records(checkpoint, schedule, completions, authorship, correct, tokenizer, k, benchmarks) -> list[dict]:
    """The ``samples.jsonl`` lines of one model's (or schedule's) ``P * k`` completions, problem-major: names,
    benchmark, problem and sample index, verdict, token count, the senior's tokens, text, ``ids`` and per-token
    ``authorship`` (1 = senior)."""
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return [
        {"checkpoint": checkpoint, "schedule": schedule, "benchmark": benchmarks[i // k], "problem": i // k,
         "sample": i % k, "correct": bool(ok), "num_tokens": len(ids), "senior_tokens": int(sum(a)), "text": text,
         "ids": [int(t) for t in ids], "authorship": list(a)}
        for i, (ids, a, ok, text) in enumerate(zip(completions, authorship, correct, texts, strict=True))
    ]  # fmt: skip


def attach_per_completion(records: list[dict], checkpoint: str, per_completion: dict) -> None:
    """Write each solo completion's legibility values (``per_completion``, aligned with the rows) into its record."""
    solo = [r for r in records if r["schedule"] == "solo" and r["checkpoint"] == checkpoint]
    for metric in ("junior_cross_entropy", "overlap"):
        values = per_completion.get(metric)
        if values is not None:
            for record, value in zip(solo, values, strict=True):
                record[metric] = value


def authorship_views(schedule_outputs: dict, records: list[dict], prompts, golds, tokenizer, k: int, shown: int):
    """The [`SampleView`][tandem_grpo.evaluation.report.SampleView]s of ``samples.html``: per checkpoint (key of
    ``schedule_outputs``, a list of schedule outputs), the first schedule's first ``shown`` problems (the
    alternating protocol by default), then two problems of each of the next two schedules."""
    from ..authorship import authorship_spans

    by_row = {(r["checkpoint"], r["schedule"], r["problem"], r["sample"]): r for r in records}
    n_show = min(shown, len(prompts))
    views = []
    for name, outputs in schedule_outputs.items():
        for out, count in [(outputs[0], n_show)] + [(o, min(2, n_show)) for o in outputs[1:3]]:
            for problem in range(count):
                row = problem * k
                spans = authorship_spans(out.completion_ids[row], out.authorship[row], tokenizer)
                views.append(SampleView(name, out.name, prompts[problem][-1]["content"], golds[problem],
                                        by_row[(name, out.name, problem, 0)]["correct"], spans))  # fmt: skip
    return views
