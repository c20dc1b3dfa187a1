"""Where one step of the main job goes: ``examples/train_math.py`` (its defaults) for a few steps under cProfile.

    python bench/profile_step.py                   # 3 steps; the first (warm-up) is left out of the per-step figures
    python bench/profile_step.py --steps 4 -- --handoff_mode whole_unit

Runs the main job's own ``main()`` in this process (single process, every core, as ``accelerate launch`` runs it
here) with ``--max_steps --steps``, ``--log_completions false`` and a temporary output folder, then prints the
seconds per optimizer step spent in each phase, measured as the cumulative time of the function that does it:

- ``co-generation``: ``tandem_generate`` (both models' forward passes, the handoff rule, sampling);
- ``rewards``: TRL's ``_calculate_rewards`` (math-verify);
- ``log-probs forward``: TRL's ``_get_per_token_logps_and_entropies`` (the senior's forward with the fused LM head,
  in the loss and, where TRL needs them, for old or reference log-probs);
- ``backward``: ``torch.Tensor.backward``;
- ``optimizer``: ``torch.optim.Optimizer.step`` wrappers (AdamW);
- ``tandem metrics``: ``TandemGRPOTrainer._log_tandem_metrics`` (logging; a replay for senior-only rollouts);
- ``step total``: ``transformers.Trainer.training_step`` plus TRL's rollout in ``_prepare_inputs``.

Also prints the CPU's instruction set (``torch.backends.cpu.get_cpu_capability()``) and a 20-call matmul probe
(GFLOP/s of a 1024x1024 float32 matmul), so that step times from different machines can be compared as multiples.
Run it alone: another torch process on the same cores slows every figure.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

PHASES = {
    "co-generation": ("generation.py", "tandem_generate"),
    "rewards": ("grpo_trainer.py", "_calculate_rewards"),
    "log-probs forward": ("grpo_trainer.py", "_get_per_token_logps_and_entropies"),
    "backward": ("_tensor.py", "backward"),
    "optimizer": ("optimizer.py", "wrapper"),
    "tandem metrics": ("trainer.py", "_log_tandem_metrics"),
    "rollout (_prepare_inputs)": ("grpo_trainer.py", "_prepare_inputs"),
    "loss (training_step)": ("trainer.py", "training_step"),
}


def matmul_gflops(size: int = 1024, calls: int = 20) -> float:
    """float32 matmul throughput of this process's torch threads, in GFLOP/s."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    start = time.perf_counter()
    for _ in range(calls):
        a @ b
    return 2 * size**3 * calls / (time.perf_counter() - start) / 1e9


def cumulative(stats: pstats.Stats, filename: str, function: str) -> float:
    """Largest cumulative time of a function whose file name ends with ``filename`` (outermost calls counted once)."""
    best = 0.0
    for (file, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        if name == function and file.endswith(filename):
            best = max(best, ct)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="Optimizer steps to run (the first is a warm-up).")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    sys.path.insert(0, str(ROOT / "examples"))
    import train_math

    with tempfile.TemporaryDirectory() as out:
        sys.argv = ["train_math.py", "--max_steps", str(args.steps), "--log_completions", "false",
                    "--output_dir", out, *extra]  # fmt: skip
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.runcall(train_math.main)
        wall = time.perf_counter() - start
        history = __import__("json").loads((Path(out) / "log_history.json").read_text())
    stats = pstats.Stats(profile)
    step_times = [h["step_time"] for h in history if "step_time" in h]
    print(f"\nCPU capability: {torch.backends.cpu.get_cpu_capability()}, torch threads: {torch.get_num_threads()}, "
          f"matmul probe: {matmul_gflops():.0f} GFLOP/s")  # fmt: skip
    print(
        f"whole command in-process: {wall:.1f} s for {args.steps} steps; TRL step_time per step: "
        + ", ".join(f"{t:.1f}" for t in step_times)
        + " s (under cProfile)"
    )
    print(f"{'phase':<28}{'s over all steps':>18}{'s per step':>12}")
    for phase, (filename, function) in PHASES.items():
        total = cumulative(stats, filename, function)
        print(f"{phase:<28}{total:>18.1f}{total / args.steps:>12.1f}")
    print("\nTop 25 functions by own time:")
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
