"""The regime map: where tandem's senior keeps up with GRPO, read from committed pieces only.

Each lever is one study folder (``--results_dir``) that changes one thing against the cpu-paper setting. For every
trained piece in it (full pieces under ``seed-<s>/`` and pilots under ``pilot/seed-<s>/``), the map gives the held-out
solo pass@1 gain over that folder's base piece and, for tandem and the controls, the difference from the same seed's
GRPO, both paired over problems with a percentile-bootstrap interval. A lever is read only where its GRPO learnt.

    python examples/reproduce_paper.py --map      # results/map/map.json, map.md, map.png
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .pieces import learnt, solo_block
from .plan import CO_GENERATING, LABELS, PIECE_FILE, SOLO_EVALUATION, check_same_evaluation

LEVERS: dict[str, dict] = {
    "cpu-paper": {
        "results_dir": "results/cpu-paper",
        "label": "cpu-paper: last number read, 2 prompts x 8, 30 steps",
        "stale_head": True,
    },
    "fixed-head": {
        "results_dir": "results/map/fixed-head",
        "label": "cpu-paper rerun with the fixed tied head (repack_tied_layers)",
    },
    "answer-line": {
        "results_dir": "results/map/answer-line",
        "label": "answer line: only a stated 'Answer:' read (reward and evaluation)",
    },
    "budget": {
        "results_dir": "results/map/budget",
        "label": "budget: tandem on 4 prompts x 8 a step, as many senior tokens as GRPO's 2 x 8",
        "grpo_from": "results/map/fixed-head",
    },
    "competent-junior": {
        "results_dir": "results/map/chain2-small",
        "label": "competent junior: chain2_small (smaller numbers), where the base, and so the junior, solves more",
    },
}
"""The levers of the map, in the order shown: name -> the study folder (``results_dir``), what it changes (``label``)
and, for a lever that trains tandem alone, the folder whose GRPO it is read against (``grpo_from``; its base piece is
the same one, linked into ``results_dir``). ``stale_head`` (true) marks a lever whose pieces, or the GRPO it reads,
trained on rollouts that vLLM sampled on a CPU with the base's output head (before
``vllm.model.repack_tied_layers``; CHANGELOG, Fixed)."""

KEEPS_UP_POINTS = 0.05
"""Tandem keeps up where its solo pass@1 is within 5 points of GRPO's, or the interval of the difference holds 0."""

_FOLDER = re.compile(r"(?P<arm>[a-z_]+?)(?:-p(?P<p>[0-9.]+))?")


def _pieces(results_dir: Path) -> list[tuple[int, str, float, Path]]:
    """``(seed, arm, junior probability, folder)`` of every finished trained piece; a full piece wins over the
    pilot of the same seed, arm and probability (the pilot's training, sampled the same way)."""
    found: dict[tuple[int, str, float], Path] = {}
    for root in (results_dir / "pilot", results_dir):  # full pieces last, so they replace pilots
        for folder in sorted(root.glob("seed-*/*")):
            match = _FOLDER.fullmatch(folder.name)
            finished = (folder / PIECE_FILE).is_file() or (folder / "pilot.json").is_file()
            if not (match and finished and (folder / "results.json").is_file()):
                continue
            arm, p = match["arm"], match["p"]
            if arm not in LABELS or arm == "base":
                continue
            if arm not in CO_GENERATING:  # its evaluation's handoff rule is not how it trained
                probability = 0.0
            else:
                results = json.loads((folder / "results.json").read_text())
                probability = float(p) if p else results["settings"]["handoff"]["junior_probability"]
            found[(int(folder.parent.name.removeprefix("seed-")), arm, probability)] = folder
    return [(seed, arm, p, folder) for (seed, arm, p), folder in sorted(found.items())]


def _problems_sha256(folder: Path) -> str | None:
    """The held-out file's sha256 a piece recorded (``piece.json``, or a hand-finished pilot's ``pilot.json``)."""
    for name in (PIECE_FILE, "pilot.json"):
        if (folder / name).is_file():
            sha = json.loads((folder / name).read_text()).get("eval_problems_sha256")
            if sha:
                return sha
    return None


def _solo(results: dict) -> list[float]:
    solo = solo_block(results)
    return [c / solo["num_samples"] for c in solo["correct_per_problem"]]


def _paired(a: dict, b: dict, confidence: float, problems_sha256: str | None) -> dict:
    """``a``'s per-problem solo accuracy minus ``b``'s, bootstrap over problems (the same problems and settings), with
    its permutation ``"null"``."""
    from tandem_grpo.evaluation.solo import paired_accuracy_difference, permutation_null

    sha = {"eval_problems_sha256": problems_sha256}
    check_same_evaluation({"results": b} | sha, {"results": a} | sha, "the map's pair", SOLO_EVALUATION)
    counts = [solo_block(r) for r in (b, a)]
    difference = paired_accuracy_difference(_solo(b), _solo(a), confidence)["difference"]
    null = permutation_null(counts[0]["correct_per_problem"], counts[1]["correct_per_problem"],
                            counts[0]["num_samples"], confidence)  # fmt: skip
    return difference | {"null": null}


def lever_rows(name: str, lever: dict[str, str], confidence: float = 0.95) -> list[dict]:
    """One row per trained piece of one lever (``LEVERS``' entries): its gain over the base and its difference from
    its seed's GRPO."""
    results_dir = Path(lever["results_dir"])
    base_file = results_dir / "base" / "results.json"
    if not base_file.is_file():
        return []
    base = json.loads(base_file.read_text())
    base_sha = _problems_sha256(results_dir / "base")
    pieces = _pieces(results_dir)
    # A lever that changes tandem's budget alone is read against the GRPO of the setting it changes ("grpo_from").
    grpo_pieces = _pieces(Path(lever["grpo_from"])) if "grpo_from" in lever else pieces
    grpo = {seed: folder for seed, arm, _, folder in grpo_pieces if arm == "grpo"}
    rows = []
    for seed, arm, p, folder in pieces:
        results = json.loads((folder / "results.json").read_text())
        # The same held-out file, byte for byte, wherever a piece read it from; else the paths must agree.
        sha = base_sha if base_sha is not None and _problems_sha256(folder) == base_sha else None
        verdict = learnt(base, results, confidence, problems_sha256=sha)
        row = {"lever": name, "lever_label": lever["label"], "seed": seed, "arm": arm,
               "junior_probability": p if arm in CO_GENERATING else None, "folder": str(folder),
               "base_pass@1": verdict["base_pass@1"], "pass@1": verdict["arm_pass@1"],
               "gain": verdict["difference"] | {"null": verdict["null"]}, "learnt": verdict["learnt"],
               "stale_head": bool(lever.get("stale_head"))}  # fmt: skip
        if arm != "grpo" and seed in grpo:
            # A pair is compared by sha256 only where both pieces recorded the base piece's file; else by path.
            pair_sha = sha if sha is not None and _problems_sha256(grpo[seed]) == base_sha else None
            grpo_results = json.loads((grpo[seed] / "results.json").read_text())
            row["minus_grpo"] = _paired(results, grpo_results, confidence, pair_sha)
            gap = row["minus_grpo"]
            row["keeps_up"] = bool(gap["value"] >= -KEEPS_UP_POINTS or gap["ci_high"] >= 0)
        rows.append(row)
    return rows


def _label(row: dict) -> str:
    arm = LABELS[row["arm"]]
    p = row["junior_probability"]
    return f"{arm} p {p:g}" if p is not None else arm


def markdown_map(rows: list[dict]) -> str:
    """The map as a Markdown table, one line per piece, with whether the lever's GRPO learnt."""

    def cell(e: dict | None) -> str:
        if e is None:
            return "—"
        null = e["null"]
        p = "p < 0.001" if null["p_value"] < 0.001 else f"p {null['p_value']:.3f}"
        return (f"{100 * e['value']:+.1f} [{100 * e['ci_low']:+.1f}, {100 * e['ci_high']:+.1f}] "
                f"(null ±{100 * null['ci_high']:.1f}, {p})")  # fmt: skip

    lines = ["Held-out solo pass@1 of each committed piece (100 problems x 8 samples): its gain over its lever's base "
             "piece and its difference from the same seed's GRPO, per problem, paired, with 95% percentile-bootstrap "
             "intervals (recomputed here, so an end can differ by 0.1 from a report's). Tandem keeps up where it is "
             f"within {100 * KEEPS_UP_POINTS:g} points of GRPO or the interval of the difference holds 0. A pilot "
             "finished by hand has pilot.json and no piece.json (tandem p 0.25).", "",
             "Each difference has its null: the same statistic between two random halves of the two pieces' pooled "
             "samples (8 of each problem's 16), as if both were one model, over 2000 splits "
             "(`tandem_grpo.evaluation.solo.permutation_null`): the 95% range sampling alone gives on these "
             "problems, and the p-value of the difference. The bootstrap interval speaks for other problems, the "
             "null for these ones.", "",
             "| lever | seed | arm | solo pass@1 | gain over the base (points) | minus GRPO (points) | keeps up |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    bases = {}
    for r in rows:
        keeps = {True: "yes", False: "no"}.get(r.get("keeps_up"), "—")
        stale = " (stale head)" if r["stale_head"] else ""
        lines.append(f"| {r['lever_label']} | {r['seed']} | {_label(r)}{stale} | {100 * r['pass@1']:.1f}% "
                     f"| {cell(r['gain'])} | {cell(r.get('minus_grpo'))} | {keeps} |")  # fmt: skip
        bases.setdefault(r["lever_label"], r["base_pass@1"])
    lines.append("")
    lines += [f"- {label}: the base's solo pass@1 {100 * p:.1f}%." for label, p in bases.items()]
    if any(r["stale_head"] for r in rows):
        lines += ["", "(stale head): the piece's training rollouts were sampled by vLLM on a CPU with the base's "
                  "output head and the synced body (SmolLM2 ties its head to the input embedding, and vLLM's CPU "
                  "reload did not repack it; fixed by `tandem_grpo.vllm.model.repack_tied_layers`). Its evaluation "
                  "loaded the trained model whole. docs/reproducing.md says what rerunning with the fix "
                  "changed."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot_map(rows: list[dict], path: Path) -> None:
    """One row of the figure per piece (grouped by lever): the gain over the base in points with its interval,
    coloured by arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"grpo": "#1f77b4", "live_junior": "#2ca02c", "tandem": "#d62728", "kl_to_junior": "#9467bd"}
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.4))
    labels = []
    for y, r in enumerate(reversed(rows)):
        g = r["gain"]
        x = 100 * g["value"]
        ax.errorbar(x, y, xerr=[[x - 100 * g["ci_low"]], [100 * g["ci_high"] - x]], fmt="o",
                    color=colours.get(r["arm"], "grey"), capsize=3)  # fmt: skip
        labels.append(f"{r['lever']} · seed {r['seed']} · {_label(r)}" + (" (stale head)" if r["stale_head"] else ""))
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("held-out solo pass@1 gain over the base (points, 95% paired bootstrap CI)")
    ax.set_title("Where the senior learns: SmolLM2-135M, chain2 problems, 100 held-out x 8", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the long row labels push the axis label past the figure
    plt.close(fig)


def build_map(out_dir: Path = Path("results/map"), levers: dict[str, dict[str, str]] = LEVERS) -> list[dict]:
    """``map.json``, ``map.md`` and ``map.png`` in ``out_dir`` from every lever's committed pieces.

    Raises:
        ValueError: no lever has a base piece and a trained piece; or a piece was evaluated otherwise than its
            lever's base (named).
    """
    rows = [row for name, lever in levers.items() for row in lever_rows(name, lever)]
    if not rows:
        folders = ", ".join(lever["results_dir"] for lever in levers.values())
        raise ValueError(f"the map needs a base piece and a trained piece in one of {folders}.")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "map.json").write_text(json.dumps({"levers": levers, "keeps_up_points": KEEPS_UP_POINTS,
                                                  "rows": rows}, indent=1))  # fmt: skip
    (out_dir / "map.md").write_text(markdown_map(rows))
    plot_map(rows, out_dir / "map.png")
    print(f"map: {len(rows)} pieces over {len({r['lever'] for r in rows})} levers -> {out_dir}", flush=True)
    return rows
