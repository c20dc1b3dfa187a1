"""Legibility as the paper's authors average it (mean per chain of thought, then over chains of thought, then a macro
average over benchmarks), with a bootstrap interval over problems, a null, and paired differences.

Source of the averaging: the authors' ``eval/legibility.py`` (repository CSSLab/Tandem-RLVR). Each chain of thought
(CoT, one sampled completion) gets the mean of the junior's ``-log p`` over its tokens (EOS excluded: they score the
decoded text, which carries no EOS); a benchmark's figure is the plain mean of those per-CoT values over every CoT
of the benchmark (each CoT weighs the same, whatever its length); the headline is the macro average of the benchmark
figures ([`benchmark_means`][tandem_grpo.evaluation.legibility_intervals.benchmark_means],
[`macro_average`][tandem_grpo.evaluation.legibility_intervals.macro_average]; with its interval and null:
[`macro_mean`][tandem_grpo.evaluation.legibility_intervals.macro_mean]). CoTs with nothing left to score are left
out. The per-CoT values come from
[`metrics.legibility`][tandem_grpo.evaluation.metrics.legibility] (``per_completion``); this module adds the
uncertainty the paper does not report:

- **Interval**: problems are the random unit. Each bootstrap resample draws the problems with replacement and
  recomputes the same statistic (the mean over the CoTs of the drawn problems, a problem drawn twice counting its
  CoTs twice).
- **Null**: the same statistic on the even-indexed samples of every problem minus the odd-indexed ones, for one
  model's own samples. Both halves come from the same model on the same problems, so the null is 0 in expectation,
  and its interval shows how large a difference between two samplings of the same model is. It compares halves
  (``k / 2`` samples per problem each), so its spread is about ``sqrt(2)`` times that of the difference between two
  full samplings of ``k``.
- **Paired difference** of two models' statistics on the same problems (e.g. a checkpoint's legibility minus the
  junior's on its own samples): both sides are recomputed on the same resample of problems.

Intervals are normal intervals whose standard error is the standard deviation of the bootstrap replicates, as in
[`evaluation.drift`][tandem_grpo.evaluation.drift] (same resampling, same interval dicts: ``value``, ``ci_low``,
``ci_high``, ``confidence``, ``ci_method``, ``num_problems``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from .drift import DEFAULT_NUM_RESAMPLES, _estimate, _weights

Grouped = Sequence[Sequence[float | None]]
"""``[num_problems][num_samples]`` per-CoT values (problem-major, as the evaluation draws them); ``None`` (or NaN)
marks a CoT that was not scored (nothing left after removing EOS)."""


def _method(num_resamples: int, seed: int) -> str:
    return f"normal interval, standard error from a bootstrap over problems ({num_resamples} resamples, seed {seed})"


def _sums(groups: Grouped, keep=lambda i: True) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``[P]`` sums and counts of the scored values of every problem (samples whose index passes ``keep``)."""
    sums, counts = [], []
    for g in groups:
        scored = [float(v) for i, v in enumerate(g) if keep(i) and v is not None and not math.isnan(float(v))]
        sums.append(sum(scored))
        counts.append(len(scored))
    return torch.tensor(sums, dtype=torch.float64), torch.tensor(counts, dtype=torch.float64)


def _mean_over_cots(weights: torch.Tensor, sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[1 + R]`` the mean over the CoTs of each (re)sample of problems; NaN where no CoT was scored."""
    return (weights @ sums) / (weights @ counts)


def _check(name: str, groups: Grouped) -> None:
    if len(groups) == 0:
        raise ValueError(f"{name}: no problems.")


def cot_mean(
    values: Grouped,
    *,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """The authors' mean over CoTs of per-CoT values, its interval over problems, and the even/odd null.

    Args:
        values: ``[P][k]`` per-CoT values of one model on one benchmark, e.g. the junior's mean cross-entropy per
            CoT (nats/token) from [`metrics.legibility`][tandem_grpo.evaluation.metrics.legibility]
            (``per_completion``), grouped by problem. ``None`` or NaN entries are left out.
        confidence: interval level, in (0, 1) (default 0.95).
        num_resamples: bootstrap resamples over problems (default 1000).
        seed: resampling seed (default 0); the same seed draws the same resamples as
            [`paired_difference`][tandem_grpo.evaluation.legibility_intervals.paired_difference] and
            [`evaluation.drift`][tandem_grpo.evaluation.drift].

    Returns:
        ``{"mean": interval, "null_half_difference": interval or None, "num_problems": P, "num_scored": int,
        "num_skipped": int, "estimator": str}``. ``mean.value`` is the mean over every scored CoT (each CoT weighs
        the same; with the same number of scored CoTs in every problem it is the mean of per-problem means).
        ``null_half_difference`` is the same statistic on the even-indexed samples minus the odd-indexed ones
        (``None`` when a problem has fewer than 2 samples). Units are those of ``values``.

    Raises:
        ValueError: no problems, or ``confidence`` outside (0, 1).
    """
    _check("cot_mean", values)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1).")
    weights = _weights(len(values), num_resamples, seed)
    method, problems = _method(num_resamples, seed), len(values)
    sums, counts = _sums(values)
    mean = _estimate(_mean_over_cots(weights, sums, counts), confidence, method, problems)
    null = None
    if min(len(g) for g in values) >= 2:
        even = _mean_over_cots(weights, *_sums(values, lambda i: i % 2 == 0))
        odd = _mean_over_cots(weights, *_sums(values, lambda i: i % 2 == 1))
        null = _estimate(even - odd, confidence, method, problems)
    total = sum(len(g) for g in values)
    return {
        "mean": mean,
        "null_half_difference": null,
        "num_problems": problems,
        "num_scored": int(counts.sum()),
        "num_skipped": total - int(counts.sum()),
        "estimator": (
            "mean over CoTs of the per-CoT mean (authors' eval/legibility.py); null: the same mean on each "
            "problem's even-indexed samples minus its odd-indexed samples"
        ),
    }


def paired_difference(
    values_a: Grouped,
    values_b: Grouped,
    *,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """``mean(a) - mean(b)`` of two models' per-CoT values on the same problems, with a paired interval.

    Each side's statistic is the mean over its CoTs, as in
    [`cot_mean`][tandem_grpo.evaluation.legibility_intervals.cot_mean]; both are recomputed on the same bootstrap
    resample of problems, so what the problems share (some are harder to read for every model) cancels from the
    interval.

    Args:
        values_a: ``[P][k_a]`` per-CoT values of the first model (e.g. a checkpoint's).
        values_b: ``[P][k_b]`` per-CoT values of the second (e.g. the junior's on its own samples), problems in the
            same order.
        confidence: interval level, in (0, 1) (default 0.95).
        num_resamples: bootstrap resamples over problems (default 1000).
        seed: resampling seed (default 0).

    Returns:
        An interval dict (``value``, ``ci_low``, ``ci_high``, ``confidence``, ``ci_method``, ``num_problems``) plus
        ``"value_a"`` and ``"value_b"``, the two means; units are those of the values.

    Raises:
        ValueError: no problems, different problem counts, or ``confidence`` outside (0, 1).
    """
    _check("paired_difference", values_a)
    if len(values_a) != len(values_b):
        raise ValueError(f"paired_difference: {len(values_a)} problems for a but {len(values_b)} for b.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1).")
    weights = _weights(len(values_a), num_resamples, seed)
    a = _mean_over_cots(weights, *_sums(values_a))
    b = _mean_over_cots(weights, *_sums(values_b))
    out = _estimate(a - b, confidence, _method(num_resamples, seed) + ", paired", len(values_a))
    return out | {"value_a": float(a[0]), "value_b": float(b[0])}


def benchmark_means(values: Grouped, benchmarks: Sequence[str]) -> dict[str, float | None]:
    """Each benchmark's figure as the authors compute it: the mean over the benchmark's scored CoTs.

    Args:
        values: ``[P][k]`` per-CoT values of one model over the problems of every benchmark (``None`` or NaN: not
            scored), grouped by problem as in [`cot_mean`][tandem_grpo.evaluation.legibility_intervals.cot_mean].
        benchmarks: ``[P]`` the benchmark name of each problem.

    Returns:
        Benchmark name (in order of first appearance) to the mean over its scored CoTs, in the units of ``values``;
        ``None`` for a benchmark with no scored CoT. Feed it to
        [`macro_average`][tandem_grpo.evaluation.legibility_intervals.macro_average] for the headline.

    Raises:
        ValueError: ``benchmarks`` not aligned with ``values``.
    """
    if len(benchmarks) != len(values):
        raise ValueError(f"benchmark_means: {len(benchmarks)} benchmark names for {len(values)} problems.")
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, group in zip(benchmarks, values, strict=True):
        scored = [float(v) for v in group if v is not None and not math.isnan(float(v))]
        sums[name] = sums.get(name, 0.0) + sum(scored)
        counts[name] = counts.get(name, 0) + len(scored)
    return {name: sums[name] / counts[name] if counts[name] else None for name in sums}


def macro_average(by_benchmark: Mapping[str, float | None]) -> float | None:
    """The authors' headline: the plain mean over benchmarks of each benchmark's mean over CoTs (``macro_ce``).

    Args:
        by_benchmark: benchmark name to its figure (e.g. ``cot_mean(...)["mean"]["value"]``); ``None`` or NaN
            entries (a benchmark with nothing scored) are left out, as the authors' average has no such set.

    Returns:
        The mean, or ``None`` when no benchmark has a figure.
    """
    figures = [float(v) for v in by_benchmark.values() if v is not None and not math.isnan(float(v))]
    return sum(figures) / len(figures) if figures else None


def macro_mean(
    values: Grouped,
    benchmarks: Sequence[str],
    *,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """The authors' macro average ([`macro_average`][tandem_grpo.evaluation.legibility_intervals.macro_average] of
    [`benchmark_means`][tandem_grpo.evaluation.legibility_intervals.benchmark_means]) with an interval and a null.

    Each bootstrap resample draws every benchmark's problems with replacement within the benchmark (stratified, so
    every resample keeps every benchmark and the macro average stays an average over all of them), recomputes each
    benchmark's mean over its CoTs and averages them; the null is the same statistic on the even-indexed samples
    minus the odd-indexed ones, as in [`cot_mean`][tandem_grpo.evaluation.legibility_intervals.cot_mean].

    Args:
        values: ``[P][k]`` per-CoT values of one model over the problems of every benchmark (``None`` or NaN: not
            scored).
        benchmarks: ``[P]`` the benchmark name of each problem.
        confidence: interval level, in (0, 1) (default 0.95).
        num_resamples: bootstrap resamples (default 1000).
        seed: resampling seed (default 0); benchmark ``i`` (in order of first appearance) resamples with ``seed + i``.

    Returns:
        ``{"mean": interval, "null_half_difference": interval or None, "benchmarks": [names]}``; a benchmark with
        no scored CoT is left out of the average. ``mean.value`` equals ``macro_average(benchmark_means(...))``.

    Raises:
        ValueError: no problems, ``benchmarks`` not aligned with ``values``, or ``confidence`` outside (0, 1).
    """
    _check("macro_mean", values)
    if len(benchmarks) != len(values):
        raise ValueError(f"macro_mean: {len(benchmarks)} benchmark names for {len(values)} problems.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1).")
    names = list(dict.fromkeys(benchmarks))
    groups = {b: [g for g, name in zip(values, benchmarks, strict=True) if name == b] for b in names}
    weights = {b: _weights(len(groups[b]), num_resamples, seed + i) for i, b in enumerate(names)}

    def macro(keep=lambda i: True) -> torch.Tensor:
        means = torch.stack([_mean_over_cots(weights[b], *_sums(groups[b], keep)) for b in names])
        return means.nanmean(dim=0)

    method = _method(num_resamples, seed) + ", stratified by benchmark"
    null = None
    if min(len(g) for g in values) >= 2:
        null = _estimate(macro(lambda i: i % 2 == 0) - macro(lambda i: i % 2 == 1), confidence, method, len(values))
    return {"mean": _estimate(macro(), confidence, method, len(values)), "null_half_difference": null,
            "benchmarks": names}  # fmt: skip
