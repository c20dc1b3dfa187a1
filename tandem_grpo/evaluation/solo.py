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


def split_half_null(
    correct_per_problem: Sequence[int],
    num_samples: int,
    confidence: float = 0.95,
    num_splits: int = 2000,
    seed: int = 0,
) -> dict:
    """The null of [`paired_accuracy_difference`][tandem_grpo.evaluation.solo.paired_accuracy_difference]: the same
    statistic between two halves of one model's own samples, so a difference between two models reads against what
    sampling alone gives on these problems. Each problem's samples are split at random into two halves of
    ``num_samples // 2`` (one left out when ``num_samples`` is odd), and the mean over problems of the first half's
    accuracy minus the second's is taken; over ``num_splits`` such splits its mean is the null's value (0 in
    expectation) and its central ``confidence`` range the interval. A halving of ``n // 2`` samples is a little
    noisier than two models sampled ``n`` times each, so the range is slightly wide: conservative.

    With ``c`` correct of ``n``, the first half holds a hypergeometric number of them. The samples of a problem are
    exchangeable (independent draws of one model), so this is distributed as a fixed split (even and odd sample
    index, say) and needs only the counts that ``results.json`` and ``held_out.json`` keep. Many splits rather than
    one: a single split is one draw of the null, and a study reading many models against one seeded split would
    read the same draw everywhere.

    Args:
        correct_per_problem: ``[P]`` correct samples of each problem, each in ``[0, num_samples]``.
        num_samples: samples per problem, ``>= 2``.
        num_splits: random splits, ``>= 1``.
        seed: seeds the splits (numpy); the same seed gives the same null.

    Returns:
        An interval dict as ``paired_accuracy_difference``'s ``"difference"`` (fractions), with ``"definition"``.

    Raises:
        ValueError: ``num_samples < 2``, no problems, a count outside ``[0, num_samples]``, ``num_splits < 1`` or
            ``confidence`` outside (0, 1).
    """
    import numpy as np

    if num_samples < 2:
        raise ValueError(f"num_samples={num_samples}: a split-half null needs at least 2 samples per problem.")
    if not correct_per_problem:
        raise ValueError("split_half_null needs at least one problem.")
    bad = [i for i, c in enumerate(correct_per_problem) if not 0 <= c <= num_samples]
    if bad:
        raise ValueError(f"problem {bad[0]} has {correct_per_problem[bad[0]]} correct of {num_samples} samples.")
    if num_splits < 1 or not 0 < confidence < 1:
        raise ValueError(f"num_splits={num_splits}, confidence={confidence}: need >= 1 split and 0 < confidence < 1.")
    half = num_samples // 2
    first, second = _split_halves(correct_per_problem, num_samples, num_splits, seed)
    statistic = (first - second).mean(axis=1) / half  # [num_splits]
    low, high = np.quantile(statistic, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"value": float(statistic.mean()), "ci_low": float(low), "ci_high": float(high),
            "confidence": confidence, "ci_method": f"central range over {num_splits} random splits (seed {seed})",
            "num_problems": len(correct_per_problem),
            "definition": f"two random halves of {half} of each problem's {num_samples} samples of one model: the "
                          "first's accuracy minus the second's, averaged over problems"}  # fmt: skip


def _split_halves(correct_per_problem: Sequence[int], num_samples: int, num_splits: int, seed: int):
    """``(first, second)``: int arrays ``[num_splits, P]`` of the correct samples in each of two random disjoint
    halves of ``num_samples // 2`` of each problem's samples."""
    import numpy as np

    rng = np.random.default_rng(seed)
    half = num_samples // 2
    correct = np.broadcast_to(np.asarray(correct_per_problem, dtype=np.int64), (num_splits, len(correct_per_problem)))
    first = rng.hypergeometric(correct, num_samples - correct, half)
    left, left_correct = num_samples - half, correct - first
    if left == half:
        return first, left_correct
    # num_samples odd: the second half is what is left less one random sample.
    return first, rng.hypergeometric(left_correct, left - left_correct, half)
