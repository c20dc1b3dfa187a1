"""Learning curves (``--curve_steps 30 60 90``): each arm trained once to the last curve step, on one learning-rate
schedule over all of them, its senior saved at every curve step and sampled alone on the held-out problems there.

Each point is a piece of its own, ``<results_dir>/curves/seed-<s>/<arm>/step-<n>/`` (the evaluation's
``results.json`` and samples, ``training_curves.png`` up to that step, ``piece.json`` last), committed when it
finishes. Training runs in segments, one per point: a segment resumes from the last complete checkpoint in the arm's
weights folder (``<output_dir>/curves/seed-<s>/<arm>``) and stops at the next curve step; on the way it saves a resume
point every ``RESUME_EVERY`` steps (deleted once a later checkpoint is complete), so a sitting that ends loses at most
that many steps of training. ``curves.json``, ``curves.md`` and ``curves.png`` in ``<results_dir>/curves``
read every committed point: each arm's gain over the base against the step, and tandem minus GRPO at each step.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import time
from pathlib import Path

from transformers import TrainerCallback

from tandem_grpo.checkpointing import is_complete_checkpoint, last_complete_checkpoint

from .plan import ARMS, LABELS, PIECE_FILE, Plan, prompts_per_step

CURVES_DIR = "curves"
CURVE_ARMS = ("grpo", "tandem")
"""The arms a learning curve is drawn for (KL-to-junior and the controls are read at 30 steps, on the map)."""
RESUME_EVERY = 10
"""Steps between a segment's resume points (a complete checkpoint each: weights, optimizer, RNG states)."""


class SaveAndStopAt(TrainerCallback):
    """Save a complete checkpoint at each of ``steps`` and stop training at ``stop_at`` (the end of a segment; None:
    at the end of training). The Trainer's own ``save_strategy`` is left as the preset's (``"no"``)."""

    def __init__(self, steps: tuple[int, ...], stop_at: int | None = None):
        self.steps, self.stop_at = frozenset(steps), stop_at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_save = True
        if state.global_step == self.stop_at:
            control.should_training_stop = True
        return control


def curve_steps_of(plan: Plan) -> tuple[int, ...]:
    return tuple(plan.study.curve_steps)


def save_points(curve_steps: tuple[int, ...], stop_at: int) -> tuple[int, ...]:
    """The steps a segment ending at ``stop_at`` saves at: every curve step and every ``RESUME_EVERY``-th step."""
    return tuple(sorted({*curve_steps, *range(RESUME_EVERY, stop_at + 1, RESUME_EVERY)}))


def prune_resume_points(weights: Path, curve_steps: tuple[int, ...]) -> None:
    """Delete the checkpoints in ``weights`` that are neither a curve step's nor the last complete one (resume points
    a later checkpoint has replaced; ~1.6 GB each for SmolLM2-135M with its optimizer)."""
    last = last_complete_checkpoint(weights)
    if last is None:
        return
    for path in weights.glob("checkpoint-*"):
        if checkpoint_step(path) not in curve_steps and checkpoint_step(path) < checkpoint_step(last):
            shutil.rmtree(path)


def point_dir(plan: Plan, seed: int, arm: str, step: int) -> Path:
    """Where a point is committed: ``<results_dir>/curves/seed-<s>/<arm folder>/step-<step>``."""
    return plan.results_dir / CURVES_DIR / f"seed-{seed}" / plan.folder_name(arm) / f"step-{step}"


def weights_dir(plan: Plan, seed: int, arm: str) -> Path:
    """The arm's checkpoints (never committed): ``<output_dir>/curves/seed-<s>/<arm folder>``."""
    return plan.root / CURVES_DIR / f"seed-{seed}" / plan.folder_name(arm)


def curve_arms(plan: Plan) -> list[str]:
    return [arm for arm in CURVE_ARMS if arm in plan.study.arms]


def checkpoint_step(path: str | Path) -> int:
    return int(Path(path).name.rsplit("-", 1)[1])


def run_curves(plan: Plan) -> None:
    """Every point of ``--curve_steps`` for each arm of ``--arms`` (grpo, tandem) and seed, skipping committed ones;
    the curves' summary is rewritten after each point."""
    from .pieces import check_held_out

    base = plan.piece_dir(0, "base") / PIECE_FILE
    if not base.is_file():
        raise FileNotFoundError(f"--curve_steps compares each point with the base piece: run --arms base first "
                                f"({base.parent} is missing).")  # fmt: skip
    check_held_out(plan)
    points = [(seed, arm, step) for seed in plan.study.seeds for arm in curve_arms(plan)
              for step in plan.study.curve_points or curve_steps_of(plan)]  # fmt: skip
    for number, (seed, arm, step) in enumerate(points, 1):
        print(f"== curve point {number}/{len(points)}: seed {seed}, {arm}, step {step}", flush=True)
        if run_point(plan, seed, arm, step) is not None:
            write_curves(plan.results_dir)


def run_point(plan: Plan, seed: int, arm: str, step: int) -> Path | None:
    """Train ``arm`` at ``seed`` up to ``step`` (from its last checkpoint), sample its senior alone on the held-out
    problems, and commit the point; None when it was already committed.

    Raises:
        ValueError: the arm's weights folder holds a later checkpoint but not this step's (deleted by hand): the
            point cannot be made without training the arm again from the start.
    """
    from .pieces import (
        _config_record,
        _evaluate_in_process,
        _in_fresh_process,
        _sha256,
        _training_record,
        check_held_out,
        command_line,
        cpu_name,
        learnt,
        train_arm,
        training_summary,
        versions,
    )

    final = point_dir(plan, seed, arm, step)
    label = f"[seed {seed}, {arm}, step {step}]"
    if (final / PIECE_FILE).is_file():
        print(f"{label} {final} exists, skipped", flush=True)
        return None
    weights = weights_dir(plan, seed, arm)
    checkpoint = weights / f"checkpoint-{step}"
    config = copy.deepcopy(plan.configs[(seed, arm)])
    config.output_dir = str(weights)
    point: dict = {"arm": arm, "seed": seed, "step": step, "curve_steps": list(curve_steps_of(plan)),
                   "preset": plan.study.preset, "cpu": cpu_name(), "command": command_line(), "versions": versions(),
                   "wall_seconds": {}}  # fmt: skip
    if not is_complete_checkpoint(checkpoint):
        resume = last_complete_checkpoint(weights)
        if resume is not None and checkpoint_step(resume) > step:
            raise ValueError(f"{weights} holds {Path(resume).name} but not checkpoint-{step}: the point at step "
                             f"{step} needs the arm trained again from the start (delete {weights}).")  # fmt: skip
        start = 0 if resume is None else checkpoint_step(resume)
        print(f"{label} training steps {start + 1}-{step} of {config.max_steps} -> {checkpoint}", flush=True)
        started = time.perf_counter()
        _in_fresh_process(train_arm, config, plan.study.model_name_or_path, plan.study.dtype, plan.train_dataset,
                          plan.study.cpu_threads, plan.study.lora_r, False, plan.study.answer,
                          save_points(curve_steps_of(plan), step), step, resume)  # fmt: skip
        prune_resume_points(weights, curve_steps_of(plan))
        point["wall_seconds"]["training"] = time.perf_counter() - started
        point["trained_steps"] = [start + 1, step]
        point["resumed_from"] = None if resume is None else Path(resume).name
        if not is_complete_checkpoint(checkpoint):
            raise RuntimeError(f"{label} the training ended without writing {checkpoint}; see above.")
    else:
        point["trained_steps"] = None  # trained by an earlier sitting, whose time is not known here
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    point["training"] = training_summary(history, config.beta)
    # Which training the checkpoint is: a point of the support folder and the curve's point at the same step name
    # the same one when these agree (an arm trained again from the start after its checkpoints were lost does not).
    point["log_history_sha256"] = hashlib.sha256(json.dumps(_training_record(history)).encode()).hexdigest()
    point["config"] = _config_record(plan, seed, arm)
    point["config"]["output_dir"] = str(weights)
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    print(f"{label} evaluating: {plan.evaluation.limit} problems x k={plan.evaluation.k} -> {final}", flush=True)
    import dataclasses

    evaluation = dataclasses.replace(plan.evaluation, checkpoints=[str(checkpoint)], grpo_checkpoint=None,
                                     output_dir=str(partial), measurements=[], junior_solo=False)  # fmt: skip
    started = time.perf_counter()
    _in_fresh_process(_evaluate_in_process, evaluation)
    point["wall_seconds"]["evaluation"] = time.perf_counter() - started
    (partial / "log_history.json").write_text(json.dumps(history, indent=1))
    from tandem_grpo.plotting import plot_training_curves

    plot_training_curves(history, partial / "training_curves.png")
    problems_sha256 = check_held_out(plan)
    if Path(plan.eval_source).is_file():
        point["eval_problems_sha256"] = _sha256(Path(plan.eval_source))
    base_results = json.loads((plan.piece_dir(0, "base") / "results.json").read_text())
    point["learnt"] = learnt(base_results, json.loads((partial / "results.json").read_text()),
                             problems_sha256=problems_sha256)  # fmt: skip
    point["wall_seconds"]["total"] = sum(point["wall_seconds"].values())
    verdict = point["learnt"]
    print(f"{label} held-out pass@1 {verdict['base_pass@1']:.3f} (base) -> {verdict['arm_pass@1']:.3f}, "
          f"difference {verdict['difference']['value']:+.3f} [{verdict['difference']['ci_low']:+.3f}, "
          f"{verdict['difference']['ci_high']:+.3f}]", flush=True)  # fmt: skip
    (partial / PIECE_FILE).write_text(json.dumps(point, indent=1, default=str))
    final.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(final)
    return final


def describe_curves(plan: Plan) -> str:
    """The curves' plan: each point, its state and its estimated time (``pieces``' rates)."""
    from .plan import estimate_seconds, training_seconds

    seconds, measured = estimate_seconds(plan)
    steps = curve_steps_of(plan)
    per_step = {arm: training_seconds(plan, arm) / plan.shared.max_steps for arm in curve_arms(plan)}
    evaluation = seconds["base"]  # a point samples its senior alone, as the base piece does
    lines = [f"Learning curves: {', '.join(curve_arms(plan))} trained to step {steps[-1]} (one linear schedule "
             f"over {steps[-1]} steps, {prompts_per_step(plan.shared)} prompts a step, "
             f"{len(plan.train_dataset)} training problems; the held-out problems are those of a {steps[0]}-step "
             f"study), sampled alone at steps {', '.join(map(str, steps))}."]  # fmt: skip
    total = 0.0
    for seed in plan.study.seeds:
        for arm in curve_arms(plan):
            previous = 0
            for step in plan.study.curve_points or steps:
                folder = point_dir(plan, seed, arm, step)
                if (folder / PIECE_FILE).is_file():
                    state, estimate = "committed, will be skipped", 0.0
                elif is_complete_checkpoint(weights_dir(plan, seed, arm) / f"checkpoint-{step}"):
                    state, estimate = "checkpoint saved, to evaluate", evaluation
                else:
                    state, estimate = "to train and evaluate", per_step[arm] * (step - previous) + evaluation
                total += estimate
                previous = step
                lines.append(f"  seed {seed} {arm:<7} step {step:>4} -> {folder} ({state}, ~{estimate / 60:.0f} min)")
    lines.append(
        f"Checkpoints (not committed): {weights_dir(plan, 0, 'grpo').parent.parent}/seed-<s>/<arm>. "
        f"Estimated total ~{total / 3600:.1f} h from {'measured' if measured else 'unmeasured'} rates."
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- the summary


def committed_points(results_dir: Path) -> list[dict]:
    """Every committed point under ``<results_dir>/curves``: ``{"seed", "arm", "folder", "step", "piece",
    "results"}``, in a stable order."""
    out = []
    for piece_file in sorted((results_dir / CURVES_DIR).glob(f"seed-*/*/step-*/{PIECE_FILE}")):
        folder = piece_file.parent
        out.append({"seed": int(folder.parent.parent.name.removeprefix("seed-")), "arm": folder.parent.name,
                    "step": int(folder.name.removeprefix("step-")), "folder": folder,
                    "piece": json.loads(piece_file.read_text()),
                    "results": json.loads((folder / "results.json").read_text())})  # fmt: skip
    return sorted(out, key=lambda p: (p["seed"], p["arm"], p["step"]))


def write_curves(results_dir: Path) -> dict:
    """``curves.json``, ``curves.md`` and ``curves.png`` in ``<results_dir>/curves`` from the committed points: each
    point's gain over the base (paired over problems, bootstrap interval, two-halves null), and at each step and
    seed where GRPO and a tandem arm both have a point, tandem minus GRPO with its interval and null."""
    from tandem_grpo.evaluation.solo import paired_accuracy_difference, permutation_null

    from .pieces import solo_block

    points = committed_points(results_dir)
    rows = [{"seed": p["seed"], "arm": p["arm"], "step": p["step"], "learnt": p["piece"]["learnt"],
             "training_seconds": p["piece"]["wall_seconds"].get("training"), "cpu": p["piece"]["cpu"]}
            for p in points]  # fmt: skip
    gaps = []
    by_key = {(p["seed"], p["arm"], p["step"]): solo_block(p["results"]) for p in points}
    for (seed, arm, step), tandem in by_key.items():
        grpo = by_key.get((seed, "grpo", step))
        if not arm.startswith("tandem") or grpo is None:
            continue
        n = grpo["num_samples"]
        gap = paired_accuracy_difference([c / n for c in grpo["correct_per_problem"]],
                                         [c / n for c in tandem["correct_per_problem"]])  # fmt: skip
        gaps.append(
            {
                "seed": seed,
                "arm": arm,
                "step": step,
                "tandem_minus_grpo": gap["difference"],
                "null": permutation_null(grpo["correct_per_problem"], tandem["correct_per_problem"], n),
            }
        )
    summary = {
        "points": rows,
        "tandem_minus_grpo": gaps,
        "support": support_rows(results_dir, points),
        "definition": "gain: held-out solo pass@1 of the arm at that step minus the base's, paired over "
        "problems (bootstrap 95%); tandem_minus_grpo: the same difference between the tandem arm and GRPO at "
        "the same step and seed; null: that statistic between two random halves of both arms' pooled samples",
    }
    folder = results_dir / CURVES_DIR
    (folder / "curves.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (folder / "curves.md").write_text(_markdown(summary))
    if rows:
        _figure(summary, folder / "curves.png")
    if summary["support"]:
        _support_figure(results_dir, points, folder / "support.png")
    return summary


def _support_figure(results_dir: Path, points: list[dict], path: Path) -> None:
    """pass@k against k (1 to n) for the base and every point sampled for support."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tandem_grpo.evaluation.stats import pass_at_k

    from .pieces import solo_block

    def curve(block: dict) -> tuple[list[int], list[float]]:
        n = block["num_samples"]
        ks = list(range(1, n + 1))
        counts = block["correct_per_problem"]
        return ks, [100 * sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ks]

    figure, axis = plt.subplots(figsize=(7, 4.2))
    base = json.loads((results_dir / "base" / "results.json").read_text())["junior"]["solo"]
    axis.plot(*curve(base), color="black", label="base")
    styles = {30: ":", 60: "-.", 90: "-"}
    colours = {"grpo": "tab:blue", "tandem": "tab:orange", "tandem-p0.1": "tab:green"}
    for point in points:
        block = solo_block(point["results"])
        if block["num_samples"] < SUPPORT_MIN_SAMPLES:
            continue
        axis.plot(*curve(block), linestyle=styles.get(point["step"], "--"), color=colours.get(point["arm"], "gray"),
                  label=f"{point['arm']} step {point['step']}, seed {point['seed']}")  # fmt: skip
    axis.set_xscale("log", base=2)
    ticks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= base["num_samples"]]
    axis.set_xticks(ticks, [str(k) for k in ticks])
    axis.set_xlabel("k (samples per problem)")
    axis.set_ylabel("held-out pass@k (%)")
    axis.set_title("Support: pass@k on the held-out problems (unbiased estimator)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


SUPPORT_MIN_SAMPLES = 16
"""Points sampled at least this many times per problem (``--eval_k 32``) are also read for support."""


def solo_samples(folder: Path, length: int = 3) -> tuple[list[list[bool]], list[list[tuple[int, ...]]]]:
    """A piece's solo verdicts and openings, ``[P][n]`` each, from its ``samples.jsonl``."""
    from tandem_grpo.evaluation.support import openings

    rows = [json.loads(line) for line in (folder / "samples.jsonl").open() if line.strip()]
    rows = sorted((r for r in rows if r["schedule"] == "solo"), key=lambda r: (r["problem"], r["sample"]))
    by_problem: dict[int, list[dict]] = {}
    for row in rows:
        by_problem.setdefault(row["problem"], []).append(row)
    problems = [by_problem[p] for p in sorted(by_problem)]
    return [[r["correct"] for r in p] for p in problems], openings([[r["ids"] for r in p] for p in problems], length)


def support_rows(results_dir: Path, points: list[dict]) -> list[dict]:
    """Each point sampled ``SUPPORT_MIN_SAMPLES`` times or more against the base piece of ``results_dir``
    ([`compare_support`][tandem_grpo.evaluation.support.compare_support]: pass@1, 8 and n, rewardable support,
    openings), with the base's own support."""
    from tandem_grpo.evaluation.support import compare_support

    from .pieces import solo_block

    chosen = [p for p in points if solo_block(p["results"])["num_samples"] >= SUPPORT_MIN_SAMPLES]
    if not chosen:
        return []
    base_correct, base_openings = solo_samples(results_dir / "base")
    n = len(base_correct[0])
    out = []
    for point in chosen:
        correct, opening = solo_samples(point["folder"])
        out.append({"seed": point["seed"], "arm": point["arm"], "step": point["step"],
                    **compare_support(base_correct, correct, base_openings, opening, ks=(1, 8, n))})  # fmt: skip
    return out


def _points(value: dict) -> str:
    return f"{100 * value['value']:+.1f} [{100 * value['ci_low']:+.1f}, {100 * value['ci_high']:+.1f}]"


def _with_null(entry: dict) -> str:
    """``after - before`` in points with its interval and the null's half-width."""
    return f"{_points(entry['difference'])} ±{100 * entry['null']['ci_high']:.1f}"


def _markdown(summary: dict) -> str:
    lines = ["# Learning curves", "", "Held-out solo pass@1 gain over the base (points, 95% interval; null: the "
             "same difference between two halves of pooled samples).", "",
             "| seed | arm | step | pass@1 | gain over the base | null | training min |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in summary["points"]:
        learnt = row["learnt"]
        minutes = "—" if row["training_seconds"] is None else f"{row['training_seconds'] / 60:.1f}"
        lines.append(
            f"| {row['seed']} | {row['arm']} | {row['step']} | {100 * learnt['arm_pass@1']:.1f}% | "
            f"{_points(learnt['difference'])} | ±{100 * learnt['null']['ci_high']:.1f} | {minutes} |"
        )
    if summary["tandem_minus_grpo"]:
        lines += [
            "",
            "Tandem minus GRPO at the same step and seed:",
            "",
            "| seed | arm | step | tandem minus GRPO | null |",
            "| --- | --- | --- | --- | --- |",
        ]
        for gap in summary["tandem_minus_grpo"]:
            lines.append(
                f"| {gap['seed']} | {gap['arm']} | {gap['step']} | {_points(gap['tandem_minus_grpo'])} | "
                f"±{100 * gap['null']['ci_high']:.1f} |"
            )
    if summary["support"]:
        n = summary["support"][0]["num_samples"]
        lines += ["", f"Support against the base, {n} samples a problem (pass@k: unbiased; support: problems with a "
                  f"correct sample among {n}; openings: the first 3 tokens):", "",
                  f"| seed | arm | step | pass@1 | pass@{n} | support (lost, gained) | support diff | "
                  "opening entropy diff (nats) | base-opening share diff |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for row in summary["support"]:
            sup, top, entropy = row["support"], row["pass_at_k"][n], row["opening_entropy"]
            spread = entropy["difference"]
            lines.append(
                f"| {row['seed']} | {row['arm']} | {row['step']} | {_with_null(row['pass_at_k'][1])} | "
                f"{_with_null(top)} | {sup['after']} of {row['num_problems']} (base {sup['before']}; -{sup['lost']}, "
                f"+{sup['gained']}) | {_points(sup['difference'])} ±{100 * sup['null']['ci_high']:.1f} | "
                f"{spread['value']:+.3f} [{spread['ci_low']:+.3f}, {spread['ci_high']:+.3f}] "
                f"±{entropy['null']['ci_high']:.3f} | "
                f"{_with_null(row['base_opening_share'])} |"
            )
    cpus = sorted({row["cpu"] for row in summary["points"]})
    lines += ["", f"Training minutes: the segment that reached the step, on {'; '.join(cpus)}.", ""]
    return "\n".join(lines)


def _figure(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axis = plt.subplots(figsize=(7, 4.2))
    series: dict[tuple[str, int], list[dict]] = {}
    for row in summary["points"]:
        series.setdefault((row["arm"], row["seed"]), []).append(row)
    colours = {"grpo": "tab:blue", "tandem": "tab:orange", "tandem-p0.1": "tab:green"}
    for (arm, seed), rows in sorted(series.items()):
        steps = [r["step"] for r in rows]
        gain = [100 * r["learnt"]["difference"]["value"] for r in rows]
        low = [100 * r["learnt"]["difference"]["ci_low"] for r in rows]
        high = [100 * r["learnt"]["difference"]["ci_high"] for r in rows]
        name = LABELS.get(arm, arm.replace("tandem-p", "tandem p "))
        if arm == "tandem":
            name = "tandem p 0.5"
        spread = [[g - lo for g, lo in zip(gain, low, strict=True)], [h - g for g, h in zip(gain, high, strict=True)]]
        axis.errorbar(steps, gain, yerr=spread,
                      marker="o" if seed == 1 else "s", linestyle="-" if seed == 1 else "--", capsize=3,
                      color=colours.get(arm, "tab:gray"), label=f"{name}, seed {seed}")  # fmt: skip
    axis.axhline(0, color="black", linewidth=0.8)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("training step")
    axis.set_ylabel("held-out solo pass@1 gain over the base (points)")
    axis.set_title("Learning curves (95% intervals, paired over 100 problems)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


__all__ = ["ARMS", "SaveAndStopAt", "describe_curves", "run_curves", "write_curves"]
