"""Solo capability (paper section 5.1): pass@k and mean accuracy with intervals over problems, per benchmark and
their macro average, and the pass@k curve with coverage.

Estimator: the unbiased pass@k ([`pass_at_k`][tandem_grpo.evaluation.stats.pass_at_k]) averaged over problems;
interval: percentile bootstrap over problems ([`bootstrap_mean`][tandem_grpo.evaluation.stats.bootstrap_mean],
stratified by benchmark for the macro average). Handoff schedules are scored with the same functions. The curve and
coverage go beyond the paper, after Su et al. (arXiv 2608.00220; docs/evaluation.md says why).

Every function takes ``confidence`` and ``seed``, [`bootstrap_mean`][tandem_grpo.evaluation.stats.bootstrap_mean]'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from .stats import bootstrap_mean, group_by_benchmark, macro_bootstrap_mean, per_problem_pass_at_k

DEFAULT_CURVE_MAX_K = 32
"""Largest k of the pass@k curve ([`pass_at_k_curve`][tandem_grpo.evaluation.solo.pass_at_k_curve])."""


def per_problem_accuracy(correct: Sequence[Sequence[bool]]) -> list[float]:
    """Share of correct samples of each problem of ``[P][n]`` verdicts.

    Raises:
        ValueError: a problem with no samples.
    """
    out = []
    for i, row in enumerate(correct):
        if len(row) == 0:
            raise ValueError(f"problem {i} has no samples; accuracy needs at least one.")
        out.append(sum(bool(x) for x in row) / len(row))
    return out


def capability(correct: Sequence[Sequence[bool]], ks: Sequence[int], seed: int = 0, confidence: float = 0.95) -> dict:
    """pass@k for each ``k`` of ``ks`` and mean accuracy, each with a bootstrap interval over problems.

    Args:
        correct: ``[P][n]`` per-sample verdicts.
        ks: the k values, each ``<= n``.

    Returns:
        ``{"pass@k": interval dict, ..., "mean_accuracy": interval dict, "num_samples": n,
        "correct_per_problem": [c_i]}``.

    Raises:
        ValueError: no problems, or a ``k`` larger than a problem's sample count.
    """
    if len(correct) == 0:
        raise ValueError("No problems to score: the dataset is empty.")
    out: dict = {}
    for k in ks:
        out[f"pass@{k}"] = bootstrap_mean(per_problem_pass_at_k(correct, k), confidence, seed=seed).to_dict()
    out["mean_accuracy"] = bootstrap_mean(per_problem_accuracy(correct), confidence, seed=seed).to_dict()
    out["num_samples"] = len(correct[0])
    out["correct_per_problem"] = [int(sum(bool(x) for x in row)) for row in correct]
    return out


def capability_by_benchmark(
    correct: Sequence[Sequence[bool]],
    benchmarks: Sequence[str],
    ks: Sequence[int],
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """[`capability`][tandem_grpo.evaluation.solo.capability] of each benchmark and their macro average (the
    authors' headline, CSSLab/Tandem-RLVR ``eval/common.py`` ``metrics_by_set``).

    Args:
        correct: ``[P][n]`` per-sample verdicts, the problems of every benchmark together.
        benchmarks: ``[P]`` each problem's benchmark name.
        ks: the k values, each ``<= n``.

    Returns:
        ``{"by_benchmark": {name: capability dict}, "macro": {"pass@k": interval dict, ..., "mean_accuracy",
        "benchmarks", "averaging"}}``, benchmarks in order of first appearance; macro intervals from
        [`macro_bootstrap_mean`][tandem_grpo.evaluation.stats.macro_bootstrap_mean] (with one benchmark they equal
        the pooled ones).

    Raises:
        ValueError: ``benchmarks`` not aligned with ``correct``, no problems, or a ``k`` over a sample count.
    """
    grouped = group_by_benchmark(correct, benchmarks)
    by_benchmark = {name: capability(rows, ks, seed=seed, confidence=confidence) for name, rows in grouped.items()}
    macro: dict = {}
    for k in ks:
        per_problem = {name: per_problem_pass_at_k(rows, k) for name, rows in grouped.items()}
        macro[f"pass@{k}"] = macro_bootstrap_mean(per_problem, confidence, seed=seed).to_dict()
    accuracy = {name: per_problem_accuracy(rows) for name, rows in grouped.items()}
    macro["mean_accuracy"] = macro_bootstrap_mean(accuracy, confidence, seed=seed).to_dict()
    macro["benchmarks"] = list(grouped)
    macro["averaging"] = (
        "plain mean over benchmarks of each benchmark's mean over its problems (authors' eval/common.py "
        "metrics_by_set); interval: percentile bootstrap over problems stratified by benchmark"
    )
    return {"by_benchmark": by_benchmark, "macro": macro}


def pass_at_k_curve(
    correct: Sequence[Sequence[bool]], max_k: int = DEFAULT_CURVE_MAX_K, seed: int = 0, confidence: float = 0.95
) -> dict:
    """pass@k for every k from 1 to ``min(max_k, n)``, and coverage (share of problems with a correct sample among
    all ``n``, i.e. pass@n), each with a bootstrap interval over problems.

    Args:
        correct: ``[P][n]`` per-sample verdicts; ``n`` is the smallest sample count of any problem.
        max_k: the curve's last k, ``>= 1`` (default 32).

    Returns:
        ``{"k": [1..K], "pass_at_k": [interval dict per k], "coverage": interval dict, "num_samples": n,
        "max_k": max_k}`` with ``K = min(max_k, n)``.

    Raises:
        ValueError: no problems, a problem without samples, ``max_k < 1`` or ``confidence`` outside (0, 1).
    """
    if len(correct) == 0:
        raise ValueError("No problems to score: the dataset is empty.")
    if max_k < 1:
        raise ValueError(f"max_k={max_k!r} must be >= 1.")
    n = min(len(row) for row in correct)
    if n < 1:
        raise ValueError("pass_at_k_curve needs at least one sample per problem.")
    ks = list(range(1, min(max_k, n) + 1))
    covered = [float(any(bool(x) for x in row)) for row in correct]
    return {
        "k": ks,
        "pass_at_k": [bootstrap_mean(per_problem_pass_at_k(correct, k), confidence, seed=seed).to_dict() for k in ks],
        "coverage": bootstrap_mean(covered, confidence, seed=seed).to_dict(),
        "num_samples": n,
        "max_k": max_k,
    }


def paired_accuracy_difference(
    before: Sequence[float], after: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> dict:
    """Mean accuracy of ``after`` minus ``before`` on the same problems, paired problem by problem: the mean of the
    per-problem differences with a percentile-bootstrap interval over problems
    ([`bootstrap_mean`][tandem_grpo.evaluation.stats.bootstrap_mean]).

    Args:
        before: ``[P]`` per-problem accuracies in [0, 1]
            ([`per_problem_accuracy`][tandem_grpo.evaluation.solo.per_problem_accuracy] of ``[P][n]`` verdicts, or
            correct counts divided by ``n``).
        after: the same, on the same problems in the same order.

    Returns:
        ``{"before": mean accuracy, "after": mean accuracy, "difference": interval dict}`` (fractions, not points).

    Raises:
        ValueError: different numbers of problems, or none.
    """
    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} problems and after {len(after)}: pairing needs the same ones.")
    difference = bootstrap_mean([b - a for a, b in zip(before, after, strict=True)], confidence, seed=seed)
    return {"before": sum(before) / len(before), "after": sum(after) / len(after), "difference": difference.to_dict()}


def permutation_null(
    before: Sequence[int],
    after: Sequence[int],
    num_samples: int,
    confidence: float = 0.95,
    num_splits: int = 2000,
    seed: int = 0,
    k: int = 1,
) -> dict:
    """The null of a paired difference of mean pass@k over problems (``k`` 1: of
    [`paired_accuracy_difference`][tandem_grpo.evaluation.solo.paired_accuracy_difference]) for two models sampled
    ``num_samples`` times on each problem: the same statistic between two halves of their pooled samples, as if both
    were one model. Each problem's ``2 * num_samples`` samples are split at random into two halves of
    ``num_samples`` (the first half holds a hypergeometric number of the problem's correct ones), and the mean over
    problems of the first half's pass@k ([`pass_at_k`][tandem_grpo.evaluation.stats.pass_at_k], unbiased) minus the
    second's is taken, ``num_splits`` times (why pooled halves: docs/evaluation.md; a permutation test, exact given the
    counts, of these problems only: the bootstrap interval over problems speaks of others).

    Args:
        before: ``[P]`` correct samples of each problem for the first model, each in ``[0, num_samples]``.
        after: the same for the second model, on the same problems in the same order.
        num_samples: samples per problem and model, ``>= 1``.
        num_splits: random splits, ``>= 1``.
        seed: seeds the splits (numpy); the same seed gives the same null.
        k: the statistic's pass@k, ``1 <= k <= num_samples`` (default 1: accuracy).

    Returns:
        ``{"value": 0.0, "ci_low": -r, "ci_high": r, "p_value", "confidence", "ci_method", "num_problems",
        "definition"}`` (fractions): ``r`` is the ``confidence`` quantile of the statistic's absolute value over the
        splits (the null is symmetric: swapping the halves negates it), ``p_value`` the share of splits at least as
        far from 0 as the observed difference.

    Raises:
        ValueError: different numbers of problems or none, a count outside ``[0, num_samples]``, ``num_samples < 1``,
            ``num_splits < 1``, ``k`` outside ``[1, num_samples]`` or ``confidence`` outside (0, 1).
    """
    import math

    import numpy as np

    if len(before) != len(after) or not before:
        raise ValueError(f"{len(before)} and {len(after)} problems: the null pairs the same problems, at least one.")
    if num_samples < 1 or num_splits < 1 or not 0 < confidence < 1:
        raise ValueError(f"num_samples={num_samples}, num_splits={num_splits}, confidence={confidence}: need >= 1 "
                         "sample and split and 0 < confidence < 1.")  # fmt: skip
    for name, counts in (("before", before), ("after", after)):
        bad = [i for i, c in enumerate(counts) if not 0 <= c <= num_samples]
        if bad:
            raise ValueError(f"{name}: problem {bad[0]} has {counts[bad[0]]} correct of {num_samples} samples.")
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= num_samples={num_samples}.")
    # pass@k of c correct is score[c] / C(n, k) (Chen et al.'s estimator, as in stats.pass_at_k). Integer scores keep
    # every sum exact (numpy's mean adds them in float64: exact below 2**53), so the figures do not depend on the
    # order of the rounding; k 1 gives counts over n, the accuracy null's arithmetic.
    total = math.comb(num_samples, k)
    exact = total * len(before) < 2**53
    score = np.array([total - math.comb(num_samples - c, k) for c in range(num_samples + 1)],
                     dtype=np.int64 if exact else np.float64)  # fmt: skip
    pooled = np.array([b + a for b, a in zip(before, after, strict=True)])
    first = _split_halves(pooled, 2 * num_samples, num_splits, seed)  # [num_splits, P]
    statistic = np.abs((score[first] - score[pooled - first]).mean(axis=1)) / total  # [num_splits], |first - second|
    observed = abs(score[np.asarray(after)].sum() - score[np.asarray(before)].sum()) / total / len(before)
    radius = float(np.quantile(statistic, confidence))
    of = f" of pass@{k}" if k > 1 else ""
    return {"value": 0.0, "ci_low": -radius, "ci_high": radius,
            "p_value": float((statistic >= observed - 1e-12).mean()), "confidence": confidence,
            "ci_method": f"permutation: {num_splits} random splits of the pooled samples (seed {seed})",
            "num_problems": len(before),
            "definition": f"the same difference{of} between two random halves of {num_samples} of each problem's "
                          f"{2 * num_samples} pooled samples of both models"}  # fmt: skip


def _split_halves(correct_per_problem: Sequence[int], num_samples: int, num_splits: int, seed: int):
    """Int array ``[num_splits, P]``: the correct samples in a random half (``num_samples // 2``) of each problem's
    ``num_samples`` samples, ``correct_per_problem[p]`` of them correct; the other half holds the rest."""
    import numpy as np

    rng = np.random.default_rng(seed)
    correct = np.broadcast_to(np.asarray(correct_per_problem, dtype=np.int64), (num_splits, len(correct_per_problem)))
    return rng.hypergeometric(correct, num_samples - correct, num_samples // 2)
