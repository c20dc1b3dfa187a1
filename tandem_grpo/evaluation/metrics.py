"""The numbers of the evaluation suite: solo capability, distribution drift, legibility to the junior.

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166), section 5 (evaluation):
pass@k and accuracy (5.1), handoff robustness (5.2, scored with the same pass@k), marginal-token drift and the
tokens GRPO shifts that tandem training moves back (5.3), and the junior's cross-entropy and distribution overlap
on the senior's text (5.4).

Beyond the paper, after Su et al. (arXiv 2608.00220: RLVR can raise pass@1 while shrinking the set of problems
solved at all, and the change sits in the first response tokens): the whole pass@k curve with coverage
([`pass_at_k_curve`][tandem_grpo.evaluation.metrics.pass_at_k_curve]) and drift split by completion position
([`marginal_kl_by_position`][tandem_grpo.evaluation.metrics.marginal_kl_by_position]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

DEFAULT_KL_SMOOTHING = 0.1
"""Additive pseudo-count per vocabulary entry for marginal token distributions (see
[`smoothed_distribution`][tandem_grpo.evaluation.metrics.smoothed_distribution]).

A full add-one (Laplace) count would put ~49k pseudo-tokens on SmolLM2's vocabulary, comparable to the ~50k
tokens of a 100-problem evaluation, and flatten every distribution towards uniform; 0.1 keeps unseen tokens finite
while letting the observed counts dominate."""

DEFAULT_CURVE_MAX_K = 32
"""Largest k of the pass@k curve ([`pass_at_k_curve`][tandem_grpo.evaluation.metrics.pass_at_k_curve])."""

DEFAULT_DRIFT_PREFIX_TOKENS = 8
"""Completion tokens counted as the response's start by
[`marginal_kl_by_position`][tandem_grpo.evaluation.metrics.marginal_kl_by_position]."""


# ----------------------------------------------------------------------------------------------- solo capability


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem: ``1 - C(n - c, k) / C(n, k)``.

    Follows Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1 and its numerically stable
    product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``).

    Args:
        n: samples drawn for the problem (``>= 1``).
        c: correct samples among them (``0 <= c <= n``).
        k: the k of pass@k (``1 <= k <= n``).

    Returns:
        The probability, in [0, 1], that at least one of ``k`` samples drawn without replacement from the ``n`` is
        correct.

    Raises:
        ValueError: a value outside the ranges above (``k > n`` names both and the fix).
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
    """[`pass_at_k`][tandem_grpo.evaluation.metrics.pass_at_k] for each problem; ``correct[i]`` holds the
    per-sample verdicts of problem ``i``."""
    return [pass_at_k(len(row), int(sum(bool(x) for x in row)), k) for row in correct]


def per_problem_accuracy(correct: Sequence[Sequence[bool]]) -> list[float]:
    """Fraction of correct samples for each problem (the problem's accuracy@n, n = its sample count).

    Raises:
        ValueError: a problem with no samples.
    """
    out = []
    for i, row in enumerate(correct):
        if len(row) == 0:
            raise ValueError(f"problem {i} has no samples; accuracy needs at least one.")
        out.append(sum(bool(x) for x in row) / len(row))
    return out


@dataclass(frozen=True)
class Estimate:
    """A mean over problems with its confidence interval.

    Attributes:
        value: the mean over problems.
        low: the interval's lower bound.
        high: the interval's upper bound.
        confidence: the interval's confidence level, e.g. 0.95.
        method: how the interval was computed.
        num_problems: problems averaged.
    """

    value: float
    low: float
    high: float
    confidence: float
    method: str
    num_problems: int

    def to_dict(self) -> dict:
        return {
            "value": self.value,
            "ci_low": self.low,
            "ci_high": self.high,
            "confidence": self.confidence,
            "ci_method": self.method,
            "num_problems": self.num_problems,
        }


def bootstrap_mean(
    values: Sequence[float], confidence: float = 0.95, num_resamples: int = 2000, seed: int = 0
) -> Estimate:
    """Mean of per-problem ``values`` with a percentile-bootstrap confidence interval over problems.

    Problems are resampled with replacement ``num_resamples`` times with a ``torch.Generator`` seeded by ``seed``
    (so reruns report the same interval); the bounds are the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` quantiles (linear interpolation) of the resampled means. The interval treats problems
    as the random unit and the samples within a problem as fixed, as is usual for benchmark pass@k.

    Args:
        values: one number per problem (e.g.
            [`per_problem_pass_at_k`][tandem_grpo.evaluation.metrics.per_problem_pass_at_k]).
        confidence: in (0, 1) (default 0.95).
        num_resamples: bootstrap resamples ``B`` (default 2000).
        seed: seed ``S`` of the resampling generator (default 0).

    Returns:
        [`Estimate`][tandem_grpo.evaluation.metrics.Estimate] with
        ``method="percentile bootstrap over problems (B resamples, seed S)"``.

    Raises:
        ValueError: ``values`` empty or ``confidence`` outside (0, 1).
    """
    if len(values) == 0:
        raise ValueError("bootstrap_mean needs at least one problem; the dataset is empty.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1).")
    data = torch.tensor([float(v) for v in values], dtype=torch.float64)
    mean = float(data.mean())
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, len(data), (num_resamples, len(data)), generator=generator)
    means = data[index].mean(dim=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = torch.quantile(means, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64)).tolist()
    return Estimate(
        value=mean,
        low=float(low),
        high=float(high),
        confidence=confidence,
        method=f"percentile bootstrap over problems ({num_resamples} resamples, seed {seed})",
        num_problems=len(data),
    )


def capability(correct: Sequence[Sequence[bool]], ks: Sequence[int], seed: int = 0, confidence: float = 0.95) -> dict:
    """pass@k for each ``k`` in ``ks`` and mean accuracy, each with a bootstrap interval (paper section 5.1).

    Args:
        correct: ``[num_problems][n]`` per-sample verdicts.
        ks: the k values, each ``<= n``.
        seed: seed of the bootstrap intervals ([`bootstrap_mean`][tandem_grpo.evaluation.metrics.bootstrap_mean];
            default 0).
        confidence: confidence level of the bootstrap intervals (default 0.95).

    Returns:
        ``{"pass@k": Estimate dict, ..., "mean_accuracy": Estimate dict, "num_samples": n,
        "correct_per_problem": [c_i, ...]}``.

    Raises:
        ValueError: empty ``correct``, or a ``k`` larger than a problem's sample count.
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


def macro_bootstrap_mean(
    groups: Mapping[str, Sequence[float]], confidence: float = 0.95, num_resamples: int = 2000, seed: int = 0
) -> Estimate:
    """The plain mean over benchmarks of each benchmark's mean over its problems, with a stratified bootstrap
    interval.

    The value is the paper authors' macro average (CSSLab/Tandem-RLVR ``eval/common.py``, ``metrics_by_set``: each
    benchmark's pass@k over its problems, then ``"macro"``, the unweighted mean over benchmarks), so every benchmark
    weighs the same whatever its size. The interval is a percentile bootstrap stratified by benchmark: each resample
    draws every benchmark's problems with replacement from that benchmark alone (its size kept) and recomputes the
    macro mean; the bounds are the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles. Benchmarks are
    drawn in order from one ``torch.Generator`` seeded by ``seed``, so with a single benchmark the value, the draws
    and the interval are exactly those of [`bootstrap_mean`][tandem_grpo.evaluation.metrics.bootstrap_mean] with
    the same seed.

    Args:
        groups: benchmark name to its per-problem values (e.g.
            [`per_problem_pass_at_k`][tandem_grpo.evaluation.metrics.per_problem_pass_at_k] of its problems), each
            non-empty; insertion order is the draw order.
        confidence: in (0, 1) (default 0.95).
        num_resamples: bootstrap resamples ``B`` (default 2000).
        seed: seed ``S`` of the resampling generator (default 0).

    Returns:
        [`Estimate`][tandem_grpo.evaluation.metrics.Estimate]; ``num_problems`` is the total over benchmarks and
        ``method`` names the stratification.

    Raises:
        ValueError: no benchmark, an empty benchmark, or ``confidence`` outside (0, 1).
    """
    if not groups:
        raise ValueError("macro_bootstrap_mean needs at least one benchmark.")
    empty = [name for name, values in groups.items() if len(values) == 0]
    if empty:
        raise ValueError(f"macro_bootstrap_mean: benchmark(s) {empty} have no problems.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1).")
    generator = torch.Generator().manual_seed(seed)
    values, replicates = [], torch.zeros(num_resamples, dtype=torch.float64)
    for group in groups.values():
        data = torch.tensor([float(v) for v in group], dtype=torch.float64)
        index = torch.randint(0, len(data), (num_resamples, len(data)), generator=generator)
        values.append(float(data.mean()))
        replicates += data[index].mean(dim=1)
    replicates /= len(groups)
    alpha = (1.0 - confidence) / 2.0
    low, high = torch.quantile(replicates, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64)).tolist()
    return Estimate(
        value=sum(values) / len(values),
        low=float(low),
        high=float(high),
        confidence=confidence,
        method=(
            f"percentile bootstrap over problems stratified by benchmark ({len(groups)} benchmarks, "
            f"{num_resamples} resamples, seed {seed})"
        ),
        num_problems=sum(len(g) for g in groups.values()),
    )


def capability_by_benchmark(
    correct: Sequence[Sequence[bool]],
    benchmarks: Sequence[str],
    ks: Sequence[int],
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """[`capability`][tandem_grpo.evaluation.metrics.capability] per benchmark and its macro average over
    benchmarks (the paper authors' headline, CSSLab/Tandem-RLVR ``eval/common.py`` ``metrics_by_set``).

    Args:
        correct: ``[num_problems][n]`` per-sample verdicts, problems of every benchmark together.
        benchmarks: ``[num_problems]`` the benchmark name of each problem (any order; a benchmark's problems keep
            their relative order).
        ks: the k values, each ``<= n``.
        seed: seed of every bootstrap interval (default 0).
        confidence: confidence level of the intervals (default 0.95).

    Returns:
        ``{"by_benchmark": {name: capability dict}, "macro": {"pass@k": Estimate dict, ..., "mean_accuracy":
        Estimate dict, "benchmarks": [names], "averaging": str}}``; benchmarks in order of first appearance. Each
        macro value is the plain mean of the benchmarks' values, with the stratified interval of
        [`macro_bootstrap_mean`][tandem_grpo.evaluation.metrics.macro_bootstrap_mean]; with one benchmark it equals
        that benchmark's (and the pooled) estimate, interval included.

    Raises:
        ValueError: ``benchmarks`` not aligned with ``correct``, no problems, or a ``k`` larger than a problem's
            sample count.
    """
    if len(benchmarks) != len(correct):
        raise ValueError(f"{len(benchmarks)} benchmark names for {len(correct)} problems.")
    grouped: dict[str, list[Sequence[bool]]] = {}
    for name, row in zip(benchmarks, correct, strict=True):
        grouped.setdefault(name, []).append(row)
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
    """The pass@k curve for every k from 1 to ``min(max_k, n)``, and coverage, each with a bootstrap interval.

    pass@k is the unbiased estimator ([`pass_at_k`][tandem_grpo.evaluation.metrics.pass_at_k]) averaged over
    problems. Coverage is the share of problems with at least one correct sample among all ``n`` drawn (it equals
    pass@n, and is what Su et al., arXiv 2608.00220, find RLVR can shrink while pass@1 rises). Intervals are
    [`bootstrap_mean`][tandem_grpo.evaluation.metrics.bootstrap_mean] over problems, as for every other metric.

    Args:
        correct: ``[num_problems][n]`` per-sample verdicts; ``n`` is the smallest sample count of any problem.
        max_k: the curve's last k, ``>= 1`` (default 32); the curve stops at ``n`` when fewer samples were drawn.
        seed: seed of the bootstrap intervals (default 0).
        confidence: confidence level of the intervals, in (0, 1) (default 0.95).

    Returns:
        ``{"k": [1, ..., K], "pass_at_k": [Estimate dict per k], "coverage": Estimate dict, "num_samples": n,
        "max_k": max_k}`` with ``K = min(max_k, n)``; Estimate dicts as
        [`Estimate`][tandem_grpo.evaluation.metrics.Estimate].

    Raises:
        ValueError: empty ``correct``, a problem without samples, ``max_k < 1`` or ``confidence`` outside (0, 1).
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


# ------------------------------------------------------------------------------------------------ drift (5.3)


def token_counts(completions: Sequence[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """How often each vocabulary id occurs in ``completions`` (completion tokens only, EOS included).

    Args:
        completions: token id lists, each already cut at its end.
        vocab_size: ``V``.

    Returns:
        float64 ``[V]`` counts.

    Raises:
        ValueError: an id outside ``[0, V)``.
    """
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    flat = [t for row in completions for t in row]
    if flat:
        ids = torch.tensor(flat, dtype=torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"token id {int(ids.max())} is outside the vocabulary of size {vocab_size}.")
        counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.float64))
    return counts


def smoothed_distribution(counts: torch.Tensor, smoothing: float = DEFAULT_KL_SMOOTHING) -> torch.Tensor:
    """Additive smoothing: ``p(v) = (count(v) + smoothing) / (sum(count) + smoothing * V)``.

    Args:
        counts: ``[V]`` non-negative counts.
        smoothing: pseudo-count per entry, ``> 0`` (default
            [`DEFAULT_KL_SMOOTHING`][tandem_grpo.evaluation.metrics.DEFAULT_KL_SMOOTHING] = 0.1).

    Returns:
        float64 ``[V]``, strictly positive, sums to 1.

    Raises:
        ValueError: ``smoothing <= 0`` (a zero probability makes the KL infinite).
    """
    if not smoothing > 0:
        raise ValueError(f"smoothing={smoothing!r} must be > 0 so that every token has non-zero probability.")
    counts = counts.double()
    return (counts + smoothing) / (counts.sum() + smoothing * counts.numel())


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """``KL(p || q) = sum_v p(v) (log p(v) - log q(v))`` in nats, for strictly positive ``[V]`` distributions."""
    p, q = p.double(), q.double()
    return float((p * (p.log() - q.log())).sum())


def marginal_kl(
    counts_model: torch.Tensor, counts_base: torch.Tensor, smoothing: float = DEFAULT_KL_SMOOTHING
) -> float:
    """KL(model || base) in nats between the smoothed marginal token distributions of two sets of completions.

    The marginal distribution is the unigram frequency of completion tokens over the vocabulary (paper section
    5.3), smoothed by [`smoothed_distribution`][tandem_grpo.evaluation.metrics.smoothed_distribution] with the same
    ``smoothing`` on both sides.

    Args:
        counts_model: float ``[V]`` token counts of the model's completions, from
            [`token_counts`][tandem_grpo.evaluation.metrics.token_counts].
        counts_base: float ``[V]`` token counts of the base's completions, from
            [`token_counts`][tandem_grpo.evaluation.metrics.token_counts].
        smoothing: pseudo-count per entry, ``> 0`` (default 0.1).
    """
    return kl_divergence(smoothed_distribution(counts_model, smoothing), smoothed_distribution(counts_base, smoothing))


def marginal_kl_by_position(
    completions_model: Sequence[Sequence[int]],
    completions_base: Sequence[Sequence[int]],
    vocab_size: int,
    prefix_tokens: int = DEFAULT_DRIFT_PREFIX_TOKENS,
    smoothing: float = DEFAULT_KL_SMOOTHING,
) -> dict:
    """[`marginal_kl`][tandem_grpo.evaluation.metrics.marginal_kl] on two parts of every completion: its first
    ``prefix_tokens`` tokens, and the rest.

    Each side's marginal distribution is taken over the same positions (the model's first tokens against the
    base's first tokens), so a change confined to how responses begin (Su et al., arXiv 2608.00220) shows as
    drift in ``"first"`` and none in ``"rest"``.

    Args:
        completions_model: the model's completion token ids, each cut at its end (EOS included).
        completions_base: the base's completion token ids.
        vocab_size: ``V``.
        prefix_tokens: ``N >= 1``, completion positions ``0 .. N-1`` form the first part (default 8).
        smoothing: pseudo-count per entry, ``> 0`` (default 0.1).

    Returns:
        ``{"prefix_tokens": N, "first": part, "rest": part}``, each part ``{"kl_to_base_nats", "num_tokens",
        "base_num_tokens"}``; the KL (nats) is NaN when either side has no token in that part (e.g. every
        completion is at most ``N`` tokens long).

    Raises:
        ValueError: ``prefix_tokens < 1``, ``smoothing <= 0`` or an id outside ``[0, V)``.
    """
    if prefix_tokens < 1:
        raise ValueError(f"prefix_tokens={prefix_tokens!r} must be >= 1.")
    if not smoothing > 0:
        raise ValueError(f"smoothing={smoothing!r} must be > 0 so that every token has non-zero probability.")
    out: dict = {"prefix_tokens": prefix_tokens}
    for part, cut in (("first", slice(None, prefix_tokens)), ("rest", slice(prefix_tokens, None))):
        model = token_counts([list(c)[cut] for c in completions_model], vocab_size)
        base = token_counts([list(c)[cut] for c in completions_base], vocab_size)
        empty = not (model.sum() > 0 and base.sum() > 0)
        out[part] = {
            "kl_to_base_nats": float("nan") if empty else marginal_kl(model, base, smoothing),
            "num_tokens": int(model.sum()),
            "base_num_tokens": int(base.sum()),
        }
    return out


def drift_reversal(
    counts_base: torch.Tensor,
    counts_grpo: torch.Tensor,
    counts_tandem: torch.Tensor,
    top_n: int = 500,
    smoothing: float = DEFAULT_KL_SMOOTHING,
) -> dict:
    """The ``top_n`` tokens GRPO shifted most, and the fraction a tandem checkpoint moves back (paper: N=500, 87%).

    With ``p_m`` the smoothed marginal distribution of model ``m``
    ([`smoothed_distribution`][tandem_grpo.evaluation.metrics.smoothed_distribution]) and
    ``shift_m(v) = log p_m(v) - log p_base(v)``:

    - GRPO's top-N tokens are the ``top_n`` ids with the largest ``|shift_grpo(v)|`` (ties broken by lower id);
    - a token is *moved back* when ``|shift_tandem(v)| < |shift_grpo(v)|``, i.e. the tandem checkpoint's
      frequency of it is closer to the base's (in log space) than GRPO's is;
    - ``fraction_moved_back`` is the moved-back count over the number selected. Only tokens with a non-zero GRPO
      shift are candidates, so fewer than ``top_n`` are selected when fewer moved (NaN when none did).

    Args:
        counts_base: float ``[V]`` token counts of the base model's completions.
        counts_grpo: float ``[V]`` token counts of the GRPO checkpoint's completions.
        counts_tandem: float ``[V]`` token counts of the tandem checkpoint's completions.
        top_n: N (the number actually used, at most ``V``, is returned as ``"top_n"``).
        smoothing: pseudo-count per entry of the smoothed distributions, ``> 0`` (default 0.1).

    Returns:
        ``{"top_n", "fraction_moved_back", "num_moved_back", "token_ids", "grpo_shift", "tandem_shift"}``; the
        last three are lists in GRPO-shift order (largest first), shifts in nats.

    Raises:
        ValueError: ``top_n < 1`` or count tensors of different sizes.
    """
    if top_n < 1:
        raise ValueError(f"top_n={top_n!r} must be >= 1.")
    if not counts_base.shape == counts_grpo.shape == counts_tandem.shape:
        raise ValueError(
            f"token counts differ in vocabulary size: base {tuple(counts_base.shape)}, grpo "
            f"{tuple(counts_grpo.shape)}, tandem {tuple(counts_tandem.shape)}."
        )
    log_base = smoothed_distribution(counts_base, smoothing).log()
    grpo_shift = smoothed_distribution(counts_grpo, smoothing).log() - log_base
    tandem_shift = smoothed_distribution(counts_tandem, smoothing).log() - log_base
    # Tokens GRPO did not shift at all (equal counts, e.g. unseen by both) are no candidates: counting them as
    # "not moved back" would dilute the fraction when fewer than N tokens moved.
    n = min(top_n, int((grpo_shift != 0).sum()))
    # A stable sort on (-|shift|) keeps ties in id order, so the selection is deterministic.
    order = torch.sort(-grpo_shift.abs(), stable=True).indices[:n]
    moved_back = tandem_shift[order].abs() < grpo_shift[order].abs()
    return {
        "top_n": n,
        "num_moved_back": int(moved_back.sum()),
        "fraction_moved_back": float(moved_back.double().mean()) if n else float("nan"),
        "token_ids": order.tolist(),
        "grpo_shift": grpo_shift[order].tolist(),
        "tandem_shift": tandem_shift[order].tolist(),
    }


# ------------------------------------------------------------------------------------------- legibility (5.4)


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position ``-log softmax(logits)[target]`` in nats.

    Args:
        logits: float ``[B, T, V]``, the predictive logits for each target position.
        targets: long ``[B, T]``.

    Returns:
        float64 ``[B, T]`` (on ``logits``' device).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.to(logits.device).unsqueeze(-1)).squeeze(-1).double()


def token_overlap(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """Per-position overlap ``sum_v min(p_a(v), p_b(v))`` with ``p = softmax(logits)`` at temperature 1.

    The overlap is 1 for identical distributions and 0 for disjoint supports (it equals 1 minus the total
    variation distance).

    Args:
        logits_a: float ``[B, T, V]``, the logits of ``p_a``.
        logits_b: float ``[B, T, V]``, the logits of ``p_b``.

    Returns:
        float64 ``[B, T]`` (on ``logits_a``' device).
    """
    # Accumulate in float64: a float32 sum over ~50k entries drifts by ~1e-5 from the exact value.
    return torch.minimum(torch.softmax(logits_a.float(), dim=-1), torch.softmax(logits_b.float(), dim=-1)).sum(
        -1, dtype=torch.float64
    )


def masked_token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """Summed [`token_cross_entropy`][tandem_grpo.evaluation.metrics.token_cross_entropy] over masked positions,
    and the number of positions.

    Args:
        logits: float ``[B, T, V]``, the predictive logits for each target position.
        targets: long ``[B, T]``.
        mask: ``[B, T]``, 1 where the position counts.

    Returns:
        ``(sum in nats, count)``; divide for the per-token mean.
    """
    nll = token_cross_entropy(logits, targets)
    mask = mask.to(nll.device).bool()
    return float(nll[mask].sum()), int(mask.sum())


def masked_overlap(logits_a: torch.Tensor, logits_b: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """Summed [`token_overlap`][tandem_grpo.evaluation.metrics.token_overlap] over masked positions, and the count.

    Args:
        logits_a: float ``[B, T, V]``, the logits of ``p_a``.
        logits_b: float ``[B, T, V]``, the logits of ``p_b``.
        mask: ``[B, T]``, 1 where the position counts.

    Returns:
        ``(sum, count)``.
    """
    overlap = token_overlap(logits_a, logits_b)
    mask = mask.to(overlap.device).bool()
    return float(overlap[mask].sum()), int(mask.sum())


def pad_batch(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts and right-pad completions into one teacher-forcing batch.

    Args:
        prompts: prompt token ids, one list per sequence.
        completions: completion token ids, one list per sequence.
        pad_token_id: filler id for both paddings.

    Returns:
        ``(input_ids [B, P + T], attention_mask [B, P + T], completion_ids [B, T], completion_mask [B, T])`` with
        ``P`` the longest prompt and ``T`` the longest completion (at least 1).
    """
    p_len = max(len(p) for p in prompts)
    t_len = max(1, max(len(c) for c in completions))
    ids, attn, comp, comp_mask = [], [], [], []
    for p, c in zip(prompts, completions, strict=True):
        p_pad, c_pad = p_len - len(p), t_len - len(c)
        ids.append([pad_token_id] * p_pad + list(p) + list(c) + [pad_token_id] * c_pad)
        attn.append([0] * p_pad + [1] * (len(p) + len(c)) + [0] * c_pad)
        comp.append(list(c) + [pad_token_id] * c_pad)
        comp_mask.append([1] * len(c) + [0] * c_pad)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return as_long(ids), as_long(attn), as_long(comp), as_long(comp_mask)


def completion_logits(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_completion: int
) -> torch.Tensor:
    """Teacher-forced logits that predict the last ``num_completion`` tokens of ``input_ids``.

    Position ids follow the attention mask (``cumsum - 1``), as ``generate`` does for left-padded prompts, so a
    padded row sees the same positions as the same row alone. Only the needed positions' logits are materialized
    (``logits_to_keep``), which keeps ``[B, T, V]`` memory to the completion.

    Args:
        model: a causal LM.
        input_ids: long ``[B, L]`` from [`pad_batch`][tandem_grpo.evaluation.metrics.pad_batch].
        attention_mask: long ``[B, L]`` from [`pad_batch`][tandem_grpo.evaluation.metrics.pad_batch].
        num_completion: ``T``.

    Returns:
        float ``[B, T, V]``: row ``t`` is the model's prediction for completion token ``t``.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    device = next(model.parameters()).device
    out = model(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        logits_to_keep=num_completion + 1,
        use_cache=False,
    )
    return out.logits[:, :-1, :].float()


def _trailing_eos_free_length(ids: Sequence[int], eos: set[int]) -> int:
    """Length of ``ids`` without its trailing run of EOS ids."""
    n = len(ids)
    while n > 0 and int(ids[n - 1]) in eos:
        n -= 1
    return n


@torch.no_grad()
def legibility(
    senior,
    junior,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_token_id: int,
    batch_size: int = 4,
    progress=None,
    *,
    eos_token_ids: Sequence[int],
) -> dict:
    """Junior cross-entropy on the senior's completions and senior/junior overlap, averaged as the paper's authors
    do (paper section 5.4; authors' ``eval/legibility.py``, repository CSSLab/Tandem-RLVR).

    Both models are teacher-forced on ``prompt + completion``; only completion tokens count. Per token, the
    cross-entropy is ``-log p_junior(token | prefix)`` in nats and the overlap ``sum_v min(p_senior(v | prefix),
    p_junior(v | prefix))`` at temperature 1 (in [0, 1]).

    Headline averaging (the authors'): each completion (chain of thought, CoT) gets the mean over its tokens
    **without its trailing EOS tokens** (the authors score the decoded text, which carries no EOS; a completion cut
    at the length cap has none and is scored whole), then the figures are the plain mean of those per-CoT means, so
    every CoT weighs the same whatever its length. A completion with no token left once EOS is removed is skipped
    (counted in ``num_skipped_empty``). The macro average over benchmarks and the intervals are in
    [`legibility_intervals`][tandem_grpo.evaluation.legibility_intervals]. Unlike the authors, nothing is dropped
    for length (they drop CoTs that do not fit their 4096-token engine context).

    The pooled figures are the ones this function returned before (every completion token, EOS included, pooled:
    a token-weighted mean in which long completions weigh more), kept for comparison with earlier results.

    Args:
        senior: the model that wrote ``completions`` (``None`` skips the overlap).
        junior: the frozen junior.
        prompts: prompt token ids (chat template applied).
        completions: completion ids, cut after EOS.
        pad_token_id: filler id (masked out).
        batch_size: sequences per forward pass.
        progress: optional tqdm-like object, ``update(n)`` is called per batch.
        eos_token_ids: ids that end a completion (e.g. the generation backend's ``eos_token_ids``); the trailing
            run of them is left out of the per-CoT means. Pass ``[]`` to score every token.

    Returns:
        A dict (``N = len(completions)``; ``overlap*`` are ``None`` when ``senior`` is ``None``):

        - ``"junior_cross_entropy"``: float, nats/token, mean over scored CoTs of each CoT's mean junior
        cross-entropy (EOS excluded); NaN when no CoT was scored. The authors' ``mean_ce`` on one benchmark.
        - ``"overlap"``: float in [0, 1], the same averaging of the per-token overlap.
        - ``"junior_cross_entropy_pooled"``: float, nats/token, token-weighted over every completion token, EOS
        included (the figure earlier results call ``junior_cross_entropy``).
        - ``"overlap_pooled"``: float, the same pooling of the overlap (earlier results' ``overlap``).
        - ``"num_tokens"``: int, completion tokens of the pooled figures (EOS included).
        - ``"num_scored_tokens"``: int, tokens of the per-CoT means (EOS excluded).
        - ``"num_completions"``: ``N``; ``"num_scored"``: CoTs averaged; ``"num_skipped_empty"``: CoTs skipped
        because nothing was left after removing EOS.
        - ``"per_completion"``: ``{"junior_cross_entropy": [N], "overlap": [N] or None, "num_tokens": [N]}``,
        aligned with ``completions``: each CoT's mean cross-entropy (nats/token) and mean overlap over its
        tokens without trailing EOS (``None`` for a skipped CoT), and that token count.
        - ``"averaging"``: a one-line statement of the above.

    Raises:
        ValueError: ``prompts`` and ``completions`` of different lengths, or logits widths that differ.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions.")
    eos = {int(i) for i in eos_token_ids}
    with_overlap = senior is not None
    ce_sum, overlap_sum, count = 0.0, 0.0, 0
    cot_ce: list[float | None] = []
    cot_overlap: list[float | None] = []
    cot_tokens: list[int] = []
    for start in range(0, len(prompts), batch_size):
        batch_p = prompts[start : start + batch_size]
        batch_c = completions[start : start + batch_size]
        input_ids, attn, comp, comp_mask = pad_batch(batch_p, batch_c, pad_token_id)
        t_len = comp.shape[1]
        # The per-CoT mask: each completion's positions before its trailing EOS run.
        kept = torch.tensor([_trailing_eos_free_length(c, eos) for c in batch_c], dtype=torch.long)
        junior_logits = completion_logits(junior, input_ids, attn, t_len)
        nll = token_cross_entropy(junior_logits, comp).cpu()
        overlap = None
        if with_overlap:
            # The same module in both roles gives identical distributions: skip the second forward pass.
            senior_logits = junior_logits if senior is junior else completion_logits(senior, input_ids, attn, t_len)
            if senior_logits.shape[-1] != junior_logits.shape[-1]:
                raise ValueError(
                    f"senior and junior logits differ in width ({senior_logits.shape[-1]} vs "
                    f"{junior_logits.shape[-1]}); they need one shared vocabulary."
                )
            overlap = token_overlap(senior_logits, junior_logits).cpu()
            del senior_logits
        del junior_logits
        pooled = comp_mask.bool()
        ce_sum, count = ce_sum + float(nll[pooled].sum()), count + int(pooled.sum())
        if overlap is not None:
            overlap_sum += float(overlap[pooled].sum())
        for row, n in enumerate(kept.tolist()):
            cot_tokens.append(n)
            cot_ce.append(float(nll[row, :n].mean()) if n else None)
            if overlap is not None:
                cot_overlap.append(float(overlap[row, :n].mean()) if n else None)
        if progress is not None:
            progress.update(len(batch_p))
    scored_ce = [v for v in cot_ce if v is not None]
    scored_overlap = [v for v in cot_overlap if v is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {
        "junior_cross_entropy": mean(scored_ce),
        "overlap": mean(scored_overlap) if with_overlap else None,
        "junior_cross_entropy_pooled": ce_sum / count if count else float("nan"),
        "overlap_pooled": (overlap_sum / count if count else float("nan")) if with_overlap else None,
        "num_tokens": count,
        "num_scored_tokens": sum(cot_tokens),
        "num_completions": len(completions),
        "num_scored": len(scored_ce),
        "num_skipped_empty": len(completions) - len(scored_ce),
        "per_completion": {
            "junior_cross_entropy": cot_ce,
            "overlap": cot_overlap if with_overlap else None,
            "num_tokens": cot_tokens,
        },
        "averaging": (
            "headline: mean over completions of each completion's per-token mean, trailing EOS excluded, empty "
            "completions skipped (authors' eval/legibility.py); *_pooled: token-weighted over every completion "
            "token, EOS included"
        ),
    }
