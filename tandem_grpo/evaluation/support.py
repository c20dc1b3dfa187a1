"""Support: what repeated sampling still finds, and how completions open, for two models sampled on the same problems
(after arXiv 2608.00220): pass@k at chosen ``k``, rewardable support (problems solved by at least one of ``n``
samples) and openings (the first tokens' entropy and the share opening as the reference model's most common ones),
each with a bootstrap interval over problems and a two-halves null; definitions: docs/api/evaluation/support.md.
Openings depend on ``n``: compare models at the same ``n`` only.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

from .solo import paired_accuracy_difference, permutation_null
from .stats import per_problem_pass_at_k

Opening = tuple[int, ...]


def openings(ids: Sequence[Sequence[Sequence[int]]], length: int = 3) -> list[list[Opening]]:
    """``[P][n]`` openings: the first ``length`` token ids of each of a problem's completions (fewer for a shorter
    completion). ``ids``: ``[P][n]`` completion token ids (``samples.jsonl``'s ``ids``).

    Raises:
        ValueError: ``length < 1``.
    """
    if length < 1:
        raise ValueError(f"length={length}: an opening holds at least one token.")
    return [[tuple(sample[:length]) for sample in problem] for problem in ids]


def opening_entropy(problem: Sequence[Opening]) -> float:
    """Plug-in entropy (nats) of one problem's openings: ``-sum_o f_o log f_o`` over their empirical frequencies
    ``f_o``; 0 when every sample opens alike, ``log n`` when all differ."""
    counts = Counter(problem).values()
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts)


def modal_share(problem: Sequence[Opening], reference: Sequence[Opening]) -> float:
    """Share of ``problem``'s openings that are among ``reference``'s most common ones (every tied mode counts): how
    many of a model's samples still start the way the reference (the base) usually starts on this problem."""
    counts = Counter(reference)
    top = max(counts.values())
    modes = {opening for opening, c in counts.items() if c == top}
    return sum(opening in modes for opening in problem) / len(problem)


def split_null(
    before: Sequence[Sequence],
    after: Sequence[Sequence],
    statistic: Callable[[Sequence[Sequence]], list[float]],
    confidence: float = 0.95,
    num_splits: int = 1000,
    seed: int = 0,
) -> dict:
    """The two-halves null of a paired difference of ``mean(statistic(after)) - mean(statistic(before))``, for any
    per-problem statistic of a problem's samples: each problem's pooled ``2n`` samples are split at random into two
    halves of ``n``, ``num_splits`` times.

    Args:
        before: ``[P][n]`` per-sample items (openings, verdicts) of the first model.
        after: the same for the second model, on the same problems.
        statistic: ``[P][n]`` items to ``[P]`` per-problem values.

    Returns:
        ``{"value": 0.0, "ci_low": -r, "ci_high": r, "p_value", "confidence", "ci_method", "num_problems",
        "definition"}``, ``r`` the ``confidence`` quantile of the absolute split difference.

    Raises:
        ValueError: different numbers of problems or samples, or no problem.
    """
    import numpy as np

    if len(before) != len(after) or not before or any(len(b) != len(a) for b, a in zip(before, after, strict=True)):
        raise ValueError("the null pairs the same problems with the same number of samples of each model.")
    rng = np.random.default_rng(seed)
    pooled = [list(b) + list(a) for b, a in zip(before, after, strict=True)]
    sizes = [len(b) for b in before]
    observed = abs(_mean(statistic(after)) - _mean(statistic(before)))
    values = []
    for _ in range(num_splits):
        orders = [rng.permutation(len(p)) for p in pooled]
        first = [[p[i] for i in order[:n]] for p, order, n in zip(pooled, orders, sizes, strict=True)]
        second = [[p[i] for i in order[n:]] for p, order, n in zip(pooled, orders, sizes, strict=True)]
        values.append(abs(_mean(statistic(first)) - _mean(statistic(second))))
    radius = float(np.quantile(values, confidence))
    return {"value": 0.0, "ci_low": -radius, "ci_high": radius,
            "p_value": float(np.mean([v >= observed - 1e-12 for v in values])), "confidence": confidence,
            "ci_method": f"permutation: {num_splits} random splits of the pooled samples (seed {seed})",
            "num_problems": len(before),
            "definition": "the same difference between two random halves of each problem's pooled samples of both "
                          "models"}  # fmt: skip


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def compare_support(
    before_correct: Sequence[Sequence[bool]],
    after_correct: Sequence[Sequence[bool]],
    before_openings: Sequence[Sequence[Opening]],
    after_openings: Sequence[Sequence[Opening]],
    ks: Sequence[int] = (1, 8, 32),
    confidence: float = 0.95,
) -> dict:
    """``after`` against ``before`` (e.g. a trained arm against the base), on the same problems with the same ``n``
    samples each: pass@k, rewardable support and openings, each a paired difference with its interval and null.

    Args:
        before_correct: ``[P][n]`` verdicts of the first model (the base).
        after_correct: ``[P][n]`` verdicts of the second, on the same problems.
        before_openings: ``[P][n]`` openings of the first ([`openings`][tandem_grpo.evaluation.support.openings]).
        after_openings: ``[P][n]`` openings of the second.
        ks: the pass@k to compare (those above ``n`` are left out).

    Returns:
        ``{"num_problems", "num_samples", "pass_at_k": {k: {"before", "after", "difference", "null"}},
        "support": {"before", "after", "lost", "gained", "difference", "null"}, "opening_entropy": {...},
        "base_opening_share": {...}}``; support counts are problems, the rest fractions (entropy in nats).
        ``base_opening_share`` is the share of samples opening as ``before``'s most common openings: ``before``'s
        own share is measured on one half of its samples against the other half (so that it is not its own
        reference), the same for ``after`` against ``before``'s other half.

    Raises:
        ValueError: the two were sampled on different problems or numbers of samples.
    """
    n = len(before_correct[0]) if before_correct else 0
    given = (before_correct, after_correct, before_openings, after_openings)
    shapes = {(len(x), len(x[0]) if x else 0) for x in given}
    if len(shapes) != 1 or n < 2 or any(len(p) != n for x in (before_correct, after_correct) for p in x):
        raise ValueError(f"compare_support needs both models' [P][n] verdicts and openings with the same P and n >= "
                         f"2 (got shapes {sorted(shapes)}).")  # fmt: skip
    counts_before = [sum(map(bool, p)) for p in before_correct]
    counts_after = [sum(map(bool, p)) for p in after_correct]
    out: dict = {"num_problems": len(before_correct), "num_samples": n, "pass_at_k": {}}
    for k in (k for k in ks if 1 <= k <= n):
        b, a = per_problem_pass_at_k(before_correct, k), per_problem_pass_at_k(after_correct, k)
        paired = paired_accuracy_difference(b, a, confidence)
        out["pass_at_k"][k] = {"before": paired["before"], "after": paired["after"],
                               "difference": paired["difference"],
                               "null": permutation_null(counts_before, counts_after, n, confidence, k=k)}  # fmt: skip
    solved_before = [c > 0 for c in counts_before]
    solved_after = [c > 0 for c in counts_after]
    support = paired_accuracy_difference([float(s) for s in solved_before], [float(s) for s in solved_after],
                                         confidence)  # fmt: skip
    out["support"] = {"before": sum(solved_before), "after": sum(solved_after),
                      "lost": sum(b and not a for b, a in zip(solved_before, solved_after, strict=True)),
                      "gained": sum(a and not b for b, a in zip(solved_before, solved_after, strict=True)),
                      "difference": support["difference"],
                      "null": permutation_null(counts_before, counts_after, n, confidence, k=n),
                      "definition": "problems with at least one correct sample among n; difference and null as "
                                    "fractions of the problems"}  # fmt: skip

    def entropy(samples: Sequence[Sequence[Opening]]) -> list[float]:
        return [opening_entropy(p) for p in samples]

    paired = paired_accuracy_difference(entropy(before_openings), entropy(after_openings), confidence)
    out["opening_entropy"] = {"before": paired["before"], "after": paired["after"],
                              "difference": paired["difference"],
                              "null": split_null(before_openings, after_openings, entropy, confidence)}  # fmt: skip
    half = n // 2
    reference = [p[half:] for p in before_openings]

    share = share_against(reference)
    first_before, first_after = [p[:half] for p in before_openings], [p[:half] for p in after_openings]
    paired = paired_accuracy_difference(share(first_before), share(first_after), confidence)
    out["base_opening_share"] = {"before": paired["before"], "after": paired["after"],
                                 "difference": paired["difference"],
                                 "null": split_null(first_before, first_after, share, confidence),
                                 "definition": "share of a model's first n/2 samples opening as the most common "
                                               "openings of the reference's last n/2 samples"}  # fmt: skip
    return out


def share_against(reference: Sequence[Sequence[Opening]]) -> Callable[[Sequence[Sequence[Opening]]], list[float]]:
    """``[P][m]`` openings to each problem's share opening as ``reference``'s modes
    ([`modal_share`][tandem_grpo.evaluation.support.modal_share])."""
    return lambda samples: [modal_share(p, r) for p, r in zip(samples, reference, strict=True)]
