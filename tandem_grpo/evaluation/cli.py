"""``tandem-grpo evaluate``: the command-line front of ``tandem_grpo.evaluation.runner.evaluate``.

The options are parsed into an [`EvaluationConfig`][tandem_grpo.evaluation.runner.EvaluationConfig] and run by
[`evaluate`][tandem_grpo.evaluation.runner.evaluate].

Example (SmolLM2 evaluated against itself on 100 GSM8K test problems, 4 samples each):

    tandem-grpo evaluate --checkpoints HuggingFaceTB/SmolLM2-135M-Instruct \\
        --junior HuggingFaceTB/SmolLM2-135M-Instruct --dataset gsm8k --split test --limit 100 --k 4 \\
        --output_dir results/smollm2-self
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..sampling import SamplingSettings
from .backends import BACKENDS, PLANNED_BACKENDS
from .metrics import DEFAULT_KL_SMOOTHING
from .runner import MEASUREMENTS, EvaluationConfig, EvaluationError, evaluate


def build_parser(prog: str = "tandem-grpo evaluate") -> argparse.ArgumentParser:
    """The argument parser of ``tandem-grpo evaluate`` (every option maps to an
    [`EvaluationConfig`][tandem_grpo.evaluation.runner.EvaluationConfig] field)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Measure solo capability, handoff robustness, distribution drift and legibility to the junior "
        "(Tandem RL, arXiv 2606.28166, section 5) and write results.json, plots and an authorship view.",
    )
    models = p.add_argument_group("models")
    models.add_argument("--checkpoints", nargs="+", required=True, metavar="PATH_OR_ID", help="senior checkpoints")
    models.add_argument("--junior", help="frozen junior (required unless --base is given; defaults to --base)")
    models.add_argument("--base", help="pre-RL model for drift (default: --junior)")
    models.add_argument("--grpo_checkpoint", help="vanilla GRPO senior, for the drift-reversal measurement")
    data = p.add_argument_group("data")
    data.add_argument("--dataset", default="gsm8k", help="jsonl path or gsm8k, math500, minerva_math, aime24, amc23, "
                      "multiarith (default: gsm8k)")  # fmt: skip
    data.add_argument("--split", default="test", help="default: test")
    data.add_argument("--limit", type=int, help="first N problems (default: all)")
    gen = p.add_argument_group("generation")
    gen.add_argument("--k", type=int, default=4, help="samples per problem (default: 4)")
    gen.add_argument("--pass_at", type=int, nargs="+", help="k values of pass@k (default: 1, 2, 4, ... and --k)")
    gen.add_argument("--max_new_tokens", type=int, default=256, help="default: 256")
    gen.add_argument("--temperature", type=float, default=1.0, help="default: 1.0")
    gen.add_argument("--top_p", type=float, default=1.0, help="default: 1.0 (off)")
    gen.add_argument("--top_k", type=int, default=0, help="default: 0 (off)")
    gen.add_argument("--min_p", type=float, default=0.0, help="default: 0.0 (off)")
    gen.add_argument("--repetition_penalty", type=float, default=1.0, help="default: 1.0 (off)")
    gen.add_argument("--seed", type=int, default=0, help="default: 0")
    gen.add_argument("--backend", default="transformers", help=f"one of {list(BACKENDS)} (planned: "
                     f"{list(PLANNED_BACKENDS)})")  # fmt: skip
    gen.add_argument("--batch_size", type=int, default=16, help="sequences per generation call (default: 16)")
    gen.add_argument("--score_batch_size", type=int, default=4, help="sequences per scoring pass (default: 4)")
    gen.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    gen.add_argument("--num_threads", type=int, help="torch CPU threads (default: torch's; 1 on a busy shared CPU)")
    sched = p.add_argument_group("handoff schedules")
    sched.add_argument("--junior_probability", type=float, default=0.5, help="word-rule junior share (default 0.5)")
    sched.add_argument("--handoff_granularity", default="word", help="word (default), sentence or token")
    sched.add_argument("--max_gap_tokens", type=int, default=32, help="default: 32")
    sched.add_argument("--step_grid", type=int, nargs="+", default=[1, 2, 3], help="step counts s (default: 1 2 3)")
    other = p.add_argument_group("measurements and output")
    other.add_argument("--skip", nargs="+", default=[], choices=MEASUREMENTS, help="measurements to leave out")
    other.add_argument("--drift_top_n", type=int, default=500, help="N of the drift reversal (default: 500)")
    other.add_argument("--kl_smoothing", type=float, default=DEFAULT_KL_SMOOTHING,
                       help=f"additive pseudo-count per token (default: {DEFAULT_KL_SMOOTHING})")  # fmt: skip
    other.add_argument("--confidence", type=float, default=0.95, help="bootstrap interval level (default: 0.95)")
    other.add_argument("--num_html_samples", type=int, default=6, help="problems shown per checkpoint (default: 6)")
    other.add_argument("--output_dir", default="evaluation_results", help="default: evaluation_results")
    other.add_argument("--no_progress", action="store_true", help="hide progress bars")
    return p


def config_from_args(args: argparse.Namespace) -> EvaluationConfig:
    """Build the run's [`EvaluationConfig`][tandem_grpo.evaluation.runner.EvaluationConfig] from parsed arguments.

    Raises:
        EvaluationError: invalid generation settings (named).
    """
    try:
        sampling = SamplingSettings.from_config(args)
    except ValueError as err:
        raise EvaluationError(f"--{err}") from err
    return EvaluationConfig(
        checkpoints=args.checkpoints,
        junior=args.junior,
        base=args.base,
        grpo_checkpoint=args.grpo_checkpoint,
        dataset=args.dataset,
        split=args.split,
        limit=args.limit,
        k=args.k,
        pass_at=args.pass_at,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        junior_probability=args.junior_probability,
        handoff_granularity=args.handoff_granularity,
        max_gap_tokens=args.max_gap_tokens,
        step_grid=args.step_grid,
        measurements=[m for m in MEASUREMENTS if m not in args.skip],
        backend=args.backend,
        batch_size=args.batch_size,
        score_batch_size=args.score_batch_size,
        device=args.device,
        dtype=args.dtype,
        num_threads=args.num_threads,
        drift_top_n=args.drift_top_n,
        kl_smoothing=args.kl_smoothing,
        confidence=args.confidence,
        num_html_samples=args.num_html_samples,
        output_dir=args.output_dir,
        show_progress=not args.no_progress,
        seed=args.seed,
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``tandem-grpo evaluate`` with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        0 on success; 2 on a usage error (printed as one ``error:`` line on stderr, no traceback) — argparse's own
        errors exit 2 the same way.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        results = evaluate(config_from_args(args))
    except EvaluationError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(_summary(results))
    return 0


def _summary(results: dict) -> str:
    ks = results["settings"]["pass_at"]
    lines = [f"Results in {results['outputs'].get('results')} ({results['timing_seconds']['total']:.0f} s)"]
    for name, entry in results["checkpoints"].items():
        solo = ", ".join(f"pass@{k} {entry['solo'][f'pass@{k}']['value']:.3f}" for k in ks)
        lines.append(f"{name}: solo {solo}")
        for sched, h in entry.get("handoff", {}).items():
            lines.append(f"  {sched}: pass@{ks[-1]} {h[f'pass@{ks[-1]}']['value']:.3f}")
        if "drift" in entry:
            lines.append(f"  KL(checkpoint || base) {entry['drift']['kl_to_base_nats']:.4f} nats")
        if "legibility" in entry:
            leg = entry["legibility"]
            ov = "n/a" if leg["overlap"] is None else f"{leg['overlap']:.3f}"
            lines.append(f"  junior cross-entropy {leg['junior_cross_entropy']:.3f} nats/token, overlap {ov}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
