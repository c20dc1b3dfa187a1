"""The statistics every measurement shares: the unbiased pass@k estimator, bootstrap resampling over problems (the
random unit: a problem's samples move together) and the interval dicts written to ``results.json``: percentile
intervals of a mean ([`bootstrap_mean`][tandem_grpo.evaluation.stats.bootstrap_mean]) and normal intervals over
resample replicates ([`normal_interval`][tandem_grpo.evaluation.stats.normal_interval]); which is used where, and
why: docs/api/evaluation/stats.md.

Every interval dict has ``value``, ``ci_low``, ``ci_high``, ``confidence``, ``ci_method`` and ``num_problems``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import torch

DEFAULT_NUM_RESAMPLES = 1000
"""Bootstrap resamples of the normal intervals."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: ``1 - C(n - c, k) / C(n, k)``.

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1, in its numerically stable
    product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.

    Args:
        n: samples drawn for the problem, ``>= 1``.
        c: correct samples among them, ``0 <= c <= n``.
        k: ``1 <= k <= n``.

    Returns:
        The probability in [0, 1] that at least one of ``k`` samples drawn without replacement is correct.

    Raises:
        ValueError: a value outside these ranges (``k > n`` names the fix).
    """
    if n < 1:
        raise ValueError(f"pass_at_k needs n >= 1 samples, got n={n}.")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got c={c}, n={n}.")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass@{k} needs 1 <= k <= n; only n={n} samples per problem were drawn. Draw more or lower k."
        )
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def per_problem_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> list[float]:
    """[`pass_at_k`][tandem_grpo.evaluation.stats.pass_at_k] of each problem of ``[P][n]`` verdicts."""
    return [pass_at_k(len(row), int(sum(bool(x) for x in row)), k) for row in correct]


def by_problem(values: Sequence, k: int) -> list[list]:
    """``[P * k]`` problem-major rows as ``[P][k]``."""
    return [list(values[i : i + k]) for i in range(0, len(values), k)]


def group_by_benchmark(rows: Sequence, benchmarks: Sequence[str], caller: str = "") -> dict[str, list]:
    """Per-problem ``rows`` grouped by each problem's benchmark name, benchmarks in order of first appearance.

    Raises:
        ValueError: ``benchmarks`` not aligned with ``rows`` (the message starts with ``caller``).
    """
    if len(benchmarks) != len(rows):
        raise ValueError(f"{caller}{len(benchmarks)} benchmark names for {len(rows)} problems.")
    grouped: dict[str, list] = {}
    for name, row in zip(benchmarks, rows, strict=True):
        grouped.setdefault(name, []).append(row)
    return grouped


@dataclass(frozen=True)
class Estimate:
    """A mean over ``num_problems`` problems, ``value``, with its interval ``[low, high]`` at level ``confidence``
    (e.g. 0.95), computed as ``method`` says; [`to_dict`][tandem_grpo.evaluation.stats.Estimate.to_dict] gives the
    interval dict."""

    value: float
    low: float
    high: float
    confidence: float
    method: str
    num_problems: int

    def to_dict(self) -> dict:
        """The interval dict of ``results.json`` (module docstring)."""
        return {
            "value": self.value,
            "ci_low": self.low,
            "ci_high": self.high,
            "confidence": self.confidence,
            "ci_method": self.method,
            "num_problems": self.num_problems,
        }


def check_confidence(confidence: float) -> None:
    """Raise ``ValueError`` unless the interval level ``confidence`` is in (0, 1)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1).")


def _percentile_bootstrap(
    groups: Mapping[str, Sequence[float]], confidence: float, num_resamples: int, seed: int
) -> tuple[float, float, float]:
    """``(value, low, high)``: the plain mean over groups of each group's mean, and the ``(1 -+ confidence) / 2``
    quantiles of the same statistic over resamples that draw each group's values from that group alone, group by
    group from one ``torch.Generator`` seeded by ``seed``."""
    check_confidence(confidence)
    generator = torch.Generator().manual_seed(seed)
    values, replicates = [], torch.zeros(num_resamples, dtype=torch.float64)
    for group in groups.values():
        data = torch.tensor([float(v) for v in group], dtype=torch.float64)
        index = torch.randint(0, len(data), (num_resamples, len(data)), generator=generator)
        values.append(float(data.mean()))
        replicates += data[index].mean(dim=1)
    alpha = (1.0 - confidence) / 2.0
    quantiles = torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64)
    low, high = torch.quantile(replicates / len(groups), quantiles).tolist()
    return sum(values) / len(values), float(low), float(high)


def bootstrap_mean(
    values: Sequence[float], confidence: float = 0.95, num_resamples: int = 2000, seed: int = 0
) -> Estimate:
    """Mean of per-problem ``values`` with a percentile-bootstrap interval over problems: ``num_resamples`` draws of
    the problems with replacement, seeded by ``seed`` (reruns report the same interval), bounds at the
    ``(1 -+ confidence) / 2`` quantiles of the resampled means.

    Args:
        values: one number per problem.

    Returns:
        [`Estimate`][tandem_grpo.evaluation.stats.Estimate], ``method`` naming ``num_resamples`` and ``seed``.

    Raises:
        ValueError: ``values`` empty or ``confidence`` outside (0, 1).
    """
    if len(values) == 0:
        raise ValueError("bootstrap_mean needs at least one problem; the dataset is empty.")
    value, low, high = _percentile_bootstrap({"": values}, confidence, num_resamples, seed)
    method = f"percentile bootstrap over problems ({num_resamples} resamples, seed {seed})"
    return Estimate(value, low, high, confidence, method, len(values))


def macro_bootstrap_mean(
    groups: Mapping[str, Sequence[float]], confidence: float = 0.95, num_resamples: int = 2000, seed: int = 0
) -> Estimate:
    """The plain mean over benchmarks of each benchmark's mean over its problems, with a percentile bootstrap
    stratified by benchmark.

    Source of the average: CSSLab/Tandem-RLVR ``eval/common.py`` ``metrics_by_set`` (``"macro"``), so every benchmark
    weighs the same whatever its size. Each resample draws every benchmark's problems from that benchmark alone, in
    insertion order: with one benchmark, value, draws and interval equal
    [`bootstrap_mean`][tandem_grpo.evaluation.stats.bootstrap_mean]'s (whose other arguments these are).

    Args:
        groups: benchmark name to its per-problem values, each non-empty.

    Returns:
        [`Estimate`][tandem_grpo.evaluation.stats.Estimate]; ``num_problems`` is the total over benchmarks.

    Raises:
        ValueError: no benchmark, an empty benchmark, or ``confidence`` outside (0, 1).
    """
    if not groups:
        raise ValueError("macro_bootstrap_mean needs at least one benchmark.")
    empty = [name for name, values in groups.items() if len(values) == 0]
    if empty:
        raise ValueError(f"macro_bootstrap_mean: benchmark(s) {empty} have no problems.")
    value, low, high = _percentile_bootstrap(groups, confidence, num_resamples, seed)
    method = (
        f"percentile bootstrap over problems stratified by benchmark ({len(groups)} benchmarks, "
        f"{num_resamples} resamples, seed {seed})"
    )
    return Estimate(value, low, high, confidence, method, sum(len(g) for g in groups.values()))


def resample_weights(num_problems: int, num_resamples: int = DEFAULT_NUM_RESAMPLES, seed: int = 0) -> torch.Tensor:
    """float64 ``[1 + R, P]`` problem multiplicities: row 0 all ones (the point estimate), then ``R`` bootstrap
    resamples of the ``P`` problems. A statistic of per-problem sums ``s [P, ...]`` is recomputed on every resample
    as ``weights @ s``, so two statistics computed with the same weights are paired."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, num_problems, (num_resamples, num_problems), generator=generator)
    resampled = torch.zeros(num_resamples, num_problems, dtype=torch.float64)
    resampled.scatter_add_(1, index, torch.ones_like(index, dtype=torch.float64))
    return torch.cat([torch.ones(1, num_problems, dtype=torch.float64), resampled])


def normal_method(num_resamples: int, seed: int) -> str:
    """The ``ci_method`` of a [`normal_interval`][tandem_grpo.evaluation.stats.normal_interval]."""
    return f"normal interval, standard error from a bootstrap over problems ({num_resamples} resamples, seed {seed})"


def normal_interval(values: torch.Tensor, confidence: float, method: str, num_problems: int) -> dict:
    """Interval dict of ``values[0]`` (the point estimate) as ``value +- z * sd(values[1:])`` (the bootstrap
    replicates, NaN ones dropped); NaN bounds with fewer than two replicates or a NaN point estimate."""
    point, reps = float(values[0]), values[1:]
    reps = reps[~torch.isnan(reps)]
    if len(reps) > 1 and point == point:
        half = NormalDist().inv_cdf((1.0 + confidence) / 2.0) * float(reps.std())
        low, high = point - half, point + half
    else:
        low = high = float("nan")
    return Estimate(point, low, high, confidence, method, num_problems).to_dict()
