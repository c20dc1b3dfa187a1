"""The study's report, from committed pieces only: each seed's evaluation assembled from its pieces (the figures
that compare pieces computed from their samples), the comparison tables, ``report.md`` and ``report.html``."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import sys
from pathlib import Path

from .pieces import learnt, versions
from .plan import (
    ARMS,
    LABELS,
    PAPER_JUNIOR_PROBABILITY,
    PIECE_FILE,
    SOLO_EVALUATION,
    check_same_evaluation,
    folder_name,
    report_folder,
)
from .table import DIFFERENCES, INTERVALS, comparison_rows, comparison_table, html_table, markdown_table, sources

TRAINING_HEADER = ["arm", "seed", "beta", "mean KL", "mean KL term (beta·KL)", "mean policy loss",
                   "mean |policy loss|", "mean reward", "senior token share",
                   "groups with an advantage (rewards not all equal)"]  # fmt: skip
"""Columns of the training table (``training_rows``)."""


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


def committed_pieces(
    results_dir: Path, junior_probability: float = PAPER_JUNIOR_PROBABILITY
) -> tuple[dict | None, dict[int, dict[str, dict]]]:
    """The base piece (or None) and every finished arm piece by seed, read from ``results_dir``; the tandem arm is
    the piece at ``junior_probability`` (``seed-<s>/tandem-p0.1`` for 0.1, ``plan.folder_name``)."""
    base_dir = results_dir / "base"
    base = _read_piece(base_dir) if (base_dir / PIECE_FILE).is_file() else None
    seeds: dict[int, dict[str, dict]] = {}
    for folder in sorted(results_dir.glob("seed-*")):
        if not re.fullmatch(r"seed-\d+", folder.name):
            continue
        names = {arm: folder_name(arm, junior_probability) for arm in ARMS}
        arms = {
            arm: _read_piece(folder / name) for arm, name in names.items() if (folder / name / PIECE_FILE).is_file()
        }
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
    from tandem_grpo.evaluation.junior_legibility import paired_difference

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


def paired_differences(base: dict, arms: dict[str, dict]) -> dict[str, dict]:
    """The differences between the arms of one seed (``table.DIFFERENCES``) of the figures computed from samples,
    each with a paired interval: the drift from the base (whole and by position;
    [`drift_difference`][tandem_grpo.evaluation.drift.drift_difference]) and the junior's cross-entropy (the
    authors' averaging; ``paired_difference``). Keyed as ``table.comparison_rows``'s ``paired`` argument."""
    from tandem_grpo.evaluation.drift import drift_difference
    from tandem_grpo.evaluation.junior_legibility import paired_difference

    settings = base["results"]["settings"]
    stats = {"confidence": settings["confidence"], "seed": settings["seed"]}
    out: dict[str, dict] = {}
    for a, b in DIFFERENCES:
        if a not in arms or b not in arms:
            continue
        key = f"{a} - {b}"
        if settings["k"] >= 2:
            d = drift_difference(arms[a]["ids"], arms[b]["ids"], base["ids"],
                                 prefix_tokens=settings["drift_prefix_tokens"], **stats)  # fmt: skip
            out.setdefault("drift_with_null", {})[key] = d["kl_nats"]
            for part in ("first", "rest") if "by_position" in d else ():
                out.setdefault(f"drift_with_null.by_position.{part}", {})[key] = d["by_position"][part]["kl_nats"]
        ce = [arms[a]["ce"], arms[b]["ce"]]
        if all(v is not None for side in ce for g in side for v in g):
            out.setdefault("legibility.junior_cross_entropy_with_null", {})[key] = paired_difference(*ce, **stats)
    return out


def _same_problems(base: dict, piece: dict) -> str | None:
    """The held-out file's sha256 where the base and the piece recorded the same one (the piece may have read it
    through another path: a lever whose base piece is linked from another folder), else None."""
    sha = base.get("eval_problems_sha256")
    return sha if sha is not None and piece.get("eval_problems_sha256") == sha else None


def report_command(results_dir: Path, report_dir: Path | None = None,
                   junior_probability: float = PAPER_JUNIOR_PROBABILITY) -> str:  # fmt: skip
    """The command that rebuilds this report from the committed pieces, whichever command built it (a piece's run
    rebuilds it too)."""
    command = [sys.executable, "examples/reproduce_paper.py", "--report", "--results_dir", str(results_dir)]
    if junior_probability != PAPER_JUNIOR_PROBABILITY:
        command += ["--junior_probability", f"{junior_probability:g}"]
    return shlex.join(command + (["--report_dir", str(report_dir)] if report_dir else []))


def build_report(results_dir: Path, report_dir: Path | None = None,
                 junior_probability: float = PAPER_JUNIOR_PROBABILITY) -> dict:  # fmt: skip
    """The three-arm comparison from committed pieces only (no model is loaded): ``results.json``, ``report.md`` and
    ``report.html`` in ``report_dir`` (default ``<results_dir>/report``, or ``report-p0.1`` for a
    ``junior_probability`` of 0.1, whose tandem arm is ``seed-<s>/tandem-p0.1``); with several seeds, the table
    pooled over them too.

    Raises:
        FileNotFoundError: no base piece, or no arm piece, in ``results_dir``.
    """
    from tandem_grpo.evaluation.report import write_results_json

    base, seeds = committed_pieces(results_dir, junior_probability)
    if base is None or not seeds:
        raise FileNotFoundError(f"{results_dir}: the report needs the base piece and at least one arm's piece (run "
                                "with --arms base grpo ... first).")  # fmt: skip
    # The base runs no handoff schedule, so its recorded rule does not matter; the arms are compared under one rule
    # (a tandem arm at p 0.1 with the others evaluated at --junior_probability 0.1 too).
    first = next(iter(next(iter(seeds.values())).items()))
    for seed, arms in seeds.items():
        for arm, piece in arms.items():
            check_same_evaluation(base, piece, f"seed-{seed}/{arm}", SOLO_EVALUATION)
            check_same_evaluation(first[1], piece, f"seed-{seed}/{arm} (against {first[0]})")
    confidence = base["results"]["settings"]["confidence"]
    eval_seed = base["results"]["settings"]["seed"]
    per_seed = {seed: seed_results(base, arms) for seed, arms in seeds.items()}
    rows = {
        seed: comparison_rows(per_seed[seed], {arm: arm for arm in ARMS}, paired_differences(base, seeds[seed]))
        for seed in seeds
    }
    comparison = {
        "confidence": confidence,
        "intervals": INTERVALS,
        "learnt": {
            str(s): {
                arm: learnt(base["results"], p["results"], confidence, problems_sha256=_same_problems(base, p))
                for arm, p in arms.items()
            }
            for s, arms in seeds.items()
        },  # fmt: skip
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
            "folders": {str(s): str(results_dir / f"seed-{s}" / folder_name(arm, junior_probability)) for s in pieces},
            "training": {str(s): p["training"] for s, p in pieces.items()},
            "wall_seconds": {str(s): p["wall_seconds"] for s, p in pieces.items()},
            "cpu": {str(s): p["cpu"] for s, p in pieces.items()},
        }
    results = {
        "paper": "Tandem Reinforcement Learning with Verifiable Rewards (arXiv 2606.28166)",
        "study": {
            "command": report_command(results_dir, report_dir, junior_probability),
            "junior_probability": junior_probability,
            "versions": versions(),
            "preset": base.get("preset") or "unknown",
            "base": base["results"]["settings"]["base"],
            "seeds": sorted(seeds),
            "arms": arms_info,
            "base_piece": {"wall_seconds": base["wall_seconds"], "cpu": base["cpu"]},
        },
        "base": {
            "path": base["results"]["settings"]["base"],
            "role": "pre-RL model, drift reference and self-paired junior",
        },  # fmt: skip
        "comparison": comparison,
        "evaluation": {str(s): r for s, r in per_seed.items()},
    }
    out = report_dir or results_dir / report_folder(junior_probability)
    out.mkdir(parents=True, exist_ok=True)
    folders = {"base": results_dir / "base"} | {
        f"seed {s} {LABELS[arm]}": results_dir / f"seed-{s}" / folder_name(arm, junior_probability)
        for s, arms in sorted(seeds.items())
        for arm in arms
    }
    links = {name: [os.path.relpath(f, out) for f in sorted(folder.iterdir()) if f.suffix in (".png", ".html")]
             for name, folder in folders.items()}  # fmt: skip
    results["study"]["links"] = {name: found for name, found in links.items() if found}
    write_results_json(results, out / "results.json")
    commands = [f"base: {base.get('command')}"] + [
        f"seed {s} {arm}: {p.get('command')}" for s, arms in sorted(seeds.items()) for arm, p in arms.items()
    ]
    report = f"report: {results['study']['command']}"
    (out / "command.txt").write_text("\n".join([report, *commands]) + "\n")
    (out / "report.md").write_text(markdown_report(results), encoding="utf-8")
    (out / "report.html").write_text(html_report(results), encoding="utf-8")
    print(f"Report ({len(seeds)} seed(s): {', '.join(map(str, sorted(seeds)))}): {out / 'report.md'}", flush=True)
    return results


def training_rows(results: dict) -> list[list[str]]:
    """The training table's cells (columns ``TRAINING_HEADER``): one row per arm and seed that has a summary.

    Args:
        results: the study's results: ``results["study"]["arms"][arm]["training"][seed]`` is a
            ``training_summary`` or None.
    """
    rows = []
    for arm, info in results["study"]["arms"].items():
        for seed, s in info["training"].items():
            if not s:
                continue
            fmt = lambda v: "—" if v is None else f"{v:.4g}"  # noqa: E731
            rows.append([LABELS[arm], seed, fmt(s["beta"]), fmt(s["mean_kl"]), fmt(s["mean_kl_term"]),
                         fmt(s["mean_policy_loss"]), fmt(s["mean_abs_policy_loss"]), fmt(s["mean_reward"]),
                         fmt(s["mean_senior_token_fraction"]), fmt(s.get("graded_group_share"))])  # fmt: skip
    return rows


def _report_sections(comparison: dict) -> list[tuple[str, list[dict]]]:
    sections = [(f"Seed {s}", t) for s, t in comparison["seeds"].items()]
    if "pooled_over_seeds" in comparison:
        sections.append(("All seeds (per-problem values averaged over seeds)", comparison["pooled_over_seeds"]))
    return sections


def _verdict(learnt: dict) -> str:
    """ "learnt" (interval above 0), "worse than the base" (interval below 0) or "no significant change"."""
    if learnt["learnt"]:
        return "learnt"
    return "worse than the base" if learnt["difference"]["ci_high"] < 0 else "no significant change"


def learnt_lines(comparison: dict) -> list[str]:
    """The report's first section: each arm's held-out pass@1 against the base's, whether it learnt, and what a
    GRPO arm that did not learn means for the rest (nothing can be read from the comparison)."""
    lines = []
    for seed, arms in comparison.get("learnt", {}).items():
        for arm, v in arms.items():
            d = v["difference"]
            null = f" (null ±{v['null']['ci_high']:.3f}, p {v['null']['p_value']:.3f})"  # what sampling alone gives
            lines.append(f"seed {seed}, {LABELS[arm]}: pass@1 {v['base_pass@1']:.3f} (base) -> {v['arm_pass@1']:.3f}, "
                         f"difference {d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]{null}: "
                         f"{_verdict(v)}")  # fmt: skip
        if "grpo" in arms and not arms["grpo"]["learnt"]:
            lines.append(f"seed {seed}: GRPO did not learn, so the arms' comparison of this seed measures "
                         "nothing (the study's rule: check that GRPO learnt first).")  # fmt: skip
    return lines


def markdown_report(results: dict) -> str:
    """The study's report as Markdown: the comparison per seed (and pooled), where each row comes from, the training
    table, links to the plots.

    Args:
        results: the study's results: ``study`` (``preset``, ``base``, ``seeds``, ``arms``) and ``comparison``
            (``confidence``; ``seeds``: each seed's
            ``comparison_table``; optional ``pooled_over_seeds``).

    Returns:
        The text of ``report.md``, ending with a newline; the links point into ``seed-<s>/`` next to it.
    """
    study = results["study"]
    comparison = results["comparison"]
    md = [
        "# Tandem RL reproduction: GRPO, tandem and KL-to-junior",
        "",
        f"Preset `{study['preset']}`, base `{study['base']}`, seeds {study['seeds']}, the tandem arm's junior "
        f"probability {study.get('junior_probability', PAPER_JUNIOR_PROBABILITY):g}. Command in `command.txt`.",
        f"Values: estimate [{comparison['confidence']:.0%} interval]; null where the figure has one. {INTERVALS}",
        "",
    ]
    md += ["## Did each arm learn? (held-out solo pass@1 against the base, paired over problems)", ""]
    md += [f"- {line}" for line in learnt_lines(comparison)] + [""]
    sections = _report_sections(comparison)
    for title, table in sections:
        md += [f"## {title}", "", markdown_table(table), ""]
    md += ["## Where each row comes from", "", "`<arm>` is the arm's entry in the evaluation's `checkpoints`.", ""]
    md += [f"- {metric}: `{source}`" for metric, source in sources(sections[0][1])] + [""]
    training = training_rows(results)
    header = [cell.replace("|", r"\|") for cell in TRAINING_HEADER]  # "|policy loss|" must not end a cell
    md += ["## Training (means over logged steps)", "", "| " + " | ".join(header) + " |",
           "|" + "---|" * len(TRAINING_HEADER)] + ["| " + " | ".join(r) + " |" for r in training] + [""]  # fmt: skip
    md += ["## Plots and samples", ""]
    for name, links in study.get("links", {}).items():
        md += [f"- {name}: " + ", ".join(f"[{Path(link).name}]({link})" for link in links)]
    return "\n".join(md) + "\n"


def html_report(results: dict) -> str:
    """The study's report as a standalone HTML page: the same content as
    ``markdown_report``, the command, and the plots inline.

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
        f"</code>, seeds {html.escape(str(study['seeds']))}. Values: estimate [{comparison['confidence']:.0%} "
        f"interval]; null where the figure has one. {html.escape(INTERVALS)}</p>",
        f"<pre>{html.escape(study['command'])}</pre>",
    ]
    learnt_items = "".join(f"<li>{html.escape(line)}</li>" for line in learnt_lines(comparison))
    parts += ["<h2>Did each arm learn? (held-out solo pass@1 against the base, paired over problems)</h2>",
              f"<ul>{learnt_items}</ul>"]  # fmt: skip
    sections = _report_sections(comparison)
    for title, table in sections:
        parts += [f"<h2>{html.escape(title)}</h2>", html_table(table)]
    rows = sources(sections[0][1])
    legend = "".join(f"<li>{html.escape(m)}: <code>{html.escape(src)}</code></li>" for m, src in rows)
    parts += ["<h2>Where each row comes from</h2>", "<p><code>&lt;arm&gt;</code> is the arm's entry in the "
              f"evaluation's <code>checkpoints</code>.</p><ul>{legend}</ul>"]  # fmt: skip
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TRAINING_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in training_rows(results))
    parts += ["<h2>Training (means over logged steps)</h2>", f"<table><tr>{head}</tr>{body}</table>"]
    for name, links in study.get("links", {}).items():
        parts.append(f"<h2>{html.escape(name)}: plots</h2>")
        parts += [
            f"<img src='{html.escape(link)}' alt='{html.escape(link)}'>" for link in links if link.endswith(".png")
        ]
        parts += [f"<p><a href='{html.escape(link)}'>Authorship view (samples.html)</a></p>" for link in links
                  if link.endswith(".html")]  # fmt: skip
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
