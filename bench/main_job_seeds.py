"""Does the main job learn? Run ``accelerate launch examples/train_math.py`` (its defaults) once per seed and read
the senior's held-out solo accuracy before and after training (train_math.py's ``held_out.json``: paired over
problems, with its interval), and the first and the last logged steps of each seed's reward curves.

    python bench/main_job_seeds.py                          # seeds 0 1 2, one after the other (about 22 min each here)
    python bench/main_job_seeds.py --seeds 3 --window 10    # another seed, 10-step windows
    python bench/main_job_seeds.py --reuse                  # only re-read finished runs' log_history.json

Each seed trains in ``<output_dir>/seed-<s>`` (a run whose ``log_history.json`` exists is reused, not retrained, with
``--reuse``). For each seed it prints the wall time of the whole command (start-up included; a reused run's from the
earlier ``seeds.json``), the
trainer's ``train_runtime``, and the mean format, team and accuracy reward over the first and the last ``--window``
steps with their difference and its bootstrap 95% interval (resampling the steps of each window); and the held-out
difference beside its null, two halves of the pooled before and after samples (``permutation_null``). It writes
``seeds.json`` and ``seeds.png`` (the three rewards per step, one line per seed) to ``--output_dir``. Arguments after
``--`` go to train_math.py unchanged, e.g. ``-- --max_steps 20``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tandem_grpo.evaluation.solo import permutation_null

ROOT = Path(__file__).resolve().parents[1]
CURVES = {"format": "rewards/format_reward/mean", "team": "reward", "accuracy": "rewards/accuracy_reward/mean"}


def run_seed(seed: int, output_dir: Path, extra: list[str]) -> float:
    """Train one seed with the main job's command; returns the wall time in seconds."""
    command = ["accelerate", "launch", str(ROOT / "examples" / "train_math.py"), "--seed", str(seed),
               "--output_dir", str(output_dir), "--log_completions", "false", *extra]  # fmt: skip
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def window_difference(first: np.ndarray, last: np.ndarray, rng: np.random.Generator) -> dict:
    """Mean of ``last`` minus mean of ``first`` with a bootstrap 95% interval (each window resampled on its own)."""
    draws = [rng.choice(last, last.size).mean() - rng.choice(first, first.size).mean() for _ in range(10_000)]
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"first": float(first.mean()), "last": float(last.mean()), "difference": float(last.mean() - first.mean()),
            "ci95": [float(low), float(high)]}  # fmt: skip


def verdict(curve: dict) -> str:
    """How the last window's mean compares with the first's, read with the interval of the difference."""
    low, high = curve["ci95"]
    return "rose" if low > 0 else "fell" if high < 0 else "no significant change"


def summarize(history: list[dict], window: int, seed: int) -> dict:
    steps = [h for h in history if CURVES["format"] in h and "step" in h]
    if len(steps) < 2 * window:
        raise SystemExit(f"seed {seed}: {len(steps)} logged steps, fewer than two windows of {window}.")
    rng = np.random.default_rng(seed)
    runtime = next((h["train_runtime"] for h in history if "train_runtime" in h), None)
    out = {"train_runtime_s": runtime, "steps": [h["step"] for h in steps]}
    for name, key in CURVES.items():
        values = np.array([h[key] for h in steps], dtype=float)
        out[name] = {"curve": values.tolist(), **window_difference(values[:window], values[-window:], rng)}
    return out


def plot(results: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3))
    for ax, name in zip(axes, CURVES, strict=True):
        for seed, result in results.items():
            ax.plot(result["steps"], result[name]["curve"], marker="o", markersize=2, label=f"seed {seed}")
        ax.set_title(f"{name} reward (mean of 16 completions)", fontsize=9)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # The team reward is the weighted sum of the rewards: 1 at most with the main job's weights (1, 0).
        top = max([1.0, *(max(r[name]["curve"]) for r in results.values())])
        ax.set_ylim(-0.05, top + 0.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--window", type=int, default=10, help="Steps in the first and the last window.")
    parser.add_argument("--output_dir", default="outputs/main-job-seeds")
    parser.add_argument("--reuse", action="store_true", help="Reuse runs whose log_history.json exists.")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window {args.window}: must be >= 1.")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds}: each seed once.")
    root = Path(args.output_dir)
    earlier = json.loads((root / "seeds.json").read_text())["seeds"] if (root / "seeds.json").is_file() else {}
    results = {}
    for seed in args.seeds:
        folder = root / f"seed-{seed}"
        log = folder / "log_history.json"
        wall = earlier.get(str(seed), {}).get("wall_s")  # a reused run keeps the wall time measured when it ran
        if not (args.reuse and log.is_file()):
            wall = run_seed(seed, folder, extra)
        results[seed] = {"wall_s": wall, **summarize(json.loads(log.read_text()), args.window, seed)}
        held_out = folder / "held_out.json"
        h = results[seed]["held_out"] = json.loads(held_out.read_text()) if held_out.is_file() else None
        if h is not None:  # from the counts, so a held_out.json that predates its "null" is read the same way
            counts = h["correct_per_problem"]
            results[seed]["held_out_null"] = permutation_null(counts["before"], counts["after"],
                                                              h["samples_per_problem"])  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "seeds.json").write_text(json.dumps({"window": args.window, "extra_args": extra, "seeds": results},
                                                indent=1))  # fmt: skip
    plot(results, root / "seeds.png")
    print(f"\nfirst vs last {args.window} steps (mean reward per step; bootstrap 95% interval of the difference)")
    for seed, r in results.items():
        wall = f"{r['wall_s'] / 60:.1f} min" if r["wall_s"] is not None else "reused"
        wall += f", train_runtime {r['train_runtime_s'] / 60:.1f} min" if r["train_runtime_s"] else ""
        parts = [f"{name} {r[name]['first']:.3f} -> {r[name]['last']:.3f} ({r[name]['difference']:+.3f}, "
                 f"[{r[name]['ci95'][0]:+.3f}, {r[name]['ci95'][1]:+.3f}])" for name in CURVES]  # fmt: skip
        print(f"seed {seed} ({wall}): " + "; ".join(parts) + f"; accuracy {verdict(r['accuracy'])}")
    rose = sum(r["accuracy"]["ci95"][0] > 0 for r in results.values())
    print(f"the team's training accuracy rose (interval of the difference above 0) on {rose} of {len(results)} seeds")
    print("\nthe senior alone on held-out problems, before -> after training (paired 95% bootstrap over problems)")
    for seed, r in results.items():
        h = r["held_out"]
        if h is None:
            print(f"seed {seed}: no held_out.json (trained with --held_out_problems 0)")
            continue
        d = {key: 100 * h["difference"][key] for key in ("value", "ci_low", "ci_high")}
        null = r["held_out_null"]
        print(
            f"seed {seed} ({h['problems']} problems x {h['samples_per_problem']}): {h['before']:.1%} -> "
            f"{h['after']:.1%}, {d['value']:+.1f} points [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}]; sampling alone "
            f"(two halves of the pooled samples) gives ±{100 * null['ci_high']:.1f}, p {null['p_value']:.3f}"
        )
    measured = [r["held_out"] for r in results.values() if r["held_out"] is not None]
    senior = sum(h["difference"]["ci_low"] > 0 for h in measured)
    print(f"the senior's held-out solo accuracy rose (interval above 0) on {senior} of {len(measured)} seeds")
    print(f"wrote {root / 'seeds.json'} and {root / 'seeds.png'}")


if __name__ == "__main__":
    main()
