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
        ax.bar(xs, ys, width=width, label=label, yerr=[err_lo, err_hi], capsize=2)
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
                est = entry.get(f"pass@{k}") if entry else None
                row.append((est["value"], est["ci_low"], est["ci_high"]) if est else None)
            series[name] = row
        junior = results.get("junior", {}).get("solo")
        if junior and f"pass@{k}" in junior:
            ax.axhline(junior[f"pass@{k}"]["value"], color="grey", linestyle="--", linewidth=1, label="junior solo")
        _bar_groups(ax, schedules, series, f"pass@{k}")
        ax.set_ylim(0, 1)
        ax.set_title(f"pass@{k} by schedule ({results['settings']['confidence']:.0%} CI)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_drift(results: dict, path: str | Path) -> Path:
    """Left: KL(checkpoint || base) of marginal token distributions. Right (with a GRPO checkpoint): each of GRPO's
    top-N shifted tokens as (GRPO shift, tandem shift); points inside the grey band moved back toward the base."""
    plt = _pyplot()
    checkpoints = results["checkpoints"]
    reversals = {n: c["drift_reversal"] for n, c in checkpoints.items() if c.get("drift_reversal")}
    fig, axes = plt.subplots(1, 2 if reversals else 1, figsize=(11 if reversals else 6, 4), squeeze=False)
    ax = axes[0][0]
    names = list(checkpoints)
    kls = [checkpoints[n].get("drift", {}).get("kl_to_base_nats") for n in names]
    grpo = results.get("grpo", {}).get("drift", {}).get("kl_to_base_nats")
    labels = names + (["GRPO"] if grpo is not None else [])
    values = kls + ([grpo] if grpo is not None else [])
    ax.bar(range(len(values)), [v if v is not None else 0.0 for v in values], color="tab:purple")
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("KL(model || base), nats")
    ax.set_title("Marginal token distribution drift", fontsize=9)
    if reversals:
        ax2 = axes[0][1]
        lim = 0.0
        for name, rev in reversals.items():
            ax2.scatter(
                rev["grpo_shift"],
                rev["tandem_shift"],
                s=6,
                alpha=0.6,
                label=f"{name}: {rev['fraction_moved_back']:.0%} of top {rev['top_n']} moved back",
            )
            lim = max([lim] + [abs(v) for v in rev["grpo_shift"]] + [abs(v) for v in rev["tandem_shift"]])
        xs = [-lim, 0.0, lim]
        ax2.fill_between(xs, [-abs(x) for x in xs], [abs(x) for x in xs], color="grey", alpha=0.15)
        ax2.set_xlabel("GRPO shift: log p_grpo - log p_base")
        ax2.set_ylabel("tandem shift: log p_tandem - log p_base")
        ax2.set_title("GRPO's most-shifted tokens under tandem training", fontsize=9)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


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
    """Write ``results.json``, the three plots and ``samples.html`` into ``output_dir``; returns their paths."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "pass_at_k_plot": plot_pass_at_k(results, out / PASS_AT_K_PLOT),
        "drift_plot": plot_drift(results, out / DRIFT_PLOT),
        "legibility_plot": plot_legibility(results, out / LEGIBILITY_PLOT),
    }
    (out / SAMPLES_HTML).write_text(render_samples_html(samples), encoding="utf-8")
    paths["samples_html"] = out / SAMPLES_HTML
    results["outputs"] = {k: str(v) for k, v in paths.items()} | {"results": str(out / RESULTS_FILE)}
    paths["results"] = write_results_json(results, out / RESULTS_FILE)
    return {k: str(v) for k, v in paths.items()}
