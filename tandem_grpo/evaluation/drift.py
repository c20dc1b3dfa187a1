"""Drift (paper section 5.3): a checkpoint's marginal-token drift from the base
([`drift`][tandem_grpo.evaluation.drift.drift]: KL of coarsened marginal token distributions between disjoint halves
of the samples, beside the base's own halves as the null) and the share of GRPO's most-shifted tokens it moves back
([`moved_back`][tandem_grpo.evaluation.drift.moved_back], beside GRPO's own samples as the null), each with a paired
interval over problems. The estimators in full: docs/api/evaluation/drift.md. Every function takes ``confidence``
(interval level in (0, 1)), ``num_resamples`` and ``seed`` (of the resampling).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .stats import DEFAULT_NUM_RESAMPLES, normal_interval, normal_method, resample_weights

DEFAULT_DRIFT_BINS = 100
"""Most frequent tokens kept as their own bins by [`drift`][tandem_grpo.evaluation.drift.drift] (the rest share one
bin)."""

DEFAULT_MIN_COUNT = 10
"""Fewest occurrences (GRPO's and the base's selection samples together) for a token to be selected by
[`moved_back`][tandem_grpo.evaluation.drift.moved_back]."""

DEFAULT_DRIFT_PREFIX_TOKENS = 8
"""Completion tokens counted as the response's start in drift's ``by_position`` blocks."""

PSEUDO_COUNT = 0.5
"""Jeffreys pseudo-count per bin (drift) or per token (moved-back measurement)."""

Completions = Sequence[Sequence[Sequence[int]]]
"""``[num_problems][num_samples]`` completion token ids (each cut at its end)."""


def _check_grouped(name: str, groups: Completions, min_samples: int) -> None:
    if len(groups) == 0:
        raise ValueError(f"{name}: no problems.")
    short = [i for i, g in enumerate(groups) if len(g) < min_samples]
    if short:
        raise ValueError(
            f"{name}: problem {short[0]} has {len(groups[short[0]])} samples; this statistic splits each problem's "
            f"samples into disjoint parts and needs at least {min_samples} per problem (raise --k)."
        )


def _subset(groups: Completions, every: int, offset: int) -> list[list[list[int]]]:
    """The samples of each problem whose index is ``offset`` mod ``every``."""
    return [[list(c) for c in list(g)[offset::every]] for g in groups]


def _problem_counts(groups: Sequence[Sequence[Sequence[int]]], ids: torch.Tensor) -> torch.Tensor:
    """float64 ``[P, len(ids)]`` token counts per problem over the compressed vocabulary ``ids`` (sorted)."""
    out = torch.zeros(len(groups), len(ids), dtype=torch.float64)
    for p, g in enumerate(groups):
        flat = [t for c in g for t in c]
        if flat:
            col = torch.searchsorted(ids, torch.tensor(flat, dtype=torch.long))
            out[p].index_add_(0, col, torch.ones(len(flat), dtype=torch.float64))
    return out


def _vocabulary(*sets: Completions) -> torch.Tensor:
    """The sorted ids that occur anywhere in ``sets`` (every statistic here depends on observed tokens only)."""
    seen = {t for groups in sets for g in groups for c in g for t in c}
    return torch.tensor(sorted(seen) or [0], dtype=torch.long)


def binned_kl(p_counts: torch.Tensor, q_counts: torch.Tensor, bins: int = DEFAULT_DRIFT_BINS) -> torch.Tensor:
    """KL(p || q) in nats between two token-count vectors coarsened to the ``bins`` ids of largest pooled count
    ``p + q`` (per row) plus one bin for the rest, with ``PSEUDO_COUNT`` added to every bin on both sides.

    Args:
        p_counts: float ``[..., V]`` counts of the first set.
        q_counts: float ``[..., V]`` counts of the second set, same shape.
        bins: ``>= 1``; fewer when ``V`` is smaller.

    Returns:
        float64 ``[...]``; NaN where either side has no tokens.

    Raises:
        ValueError: ``bins < 1`` or shapes that differ.
    """
    if bins < 1:
        raise ValueError(f"bins={bins!r} must be >= 1.")
    if p_counts.shape != q_counts.shape:
        raise ValueError(f"count shapes differ: {tuple(p_counts.shape)} vs {tuple(q_counts.shape)}.")
    p_counts, q_counts = p_counts.double(), q_counts.double()
    k = min(bins, p_counts.shape[-1])
    top = torch.topk(p_counts + q_counts, k, dim=-1, sorted=False).indices

    def coarse(counts: torch.Tensor) -> torch.Tensor:
        kept = counts.gather(-1, top)
        rest = counts.sum(-1, keepdim=True) - kept.sum(-1, keepdim=True)
        return torch.cat([kept, rest.clamp(min=0)], dim=-1) + PSEUDO_COUNT

    p, q = coarse(p_counts), coarse(q_counts)
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    kl = (p * (p.log() - q.log())).sum(-1)
    empty = (p_counts.sum(-1) == 0) | (q_counts.sum(-1) == 0)
    return kl.masked_fill(empty, float("nan"))


def _method(num_resamples: int, seed: int) -> str:
    return normal_method(num_resamples, seed) + ", paired with the null"


def drift(
    model: Completions,
    base: Completions,
    *,
    bins: int = DEFAULT_DRIFT_BINS,
    prefix_tokens: int | None = None,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """A checkpoint's marginal-token drift from the base, its null and the excess, with paired intervals.

    The estimator: docs/api/evaluation/drift.md. ``prefix_tokens`` adds ``"first"`` (each completion's first ``N``
    tokens) and ``"rest"`` blocks of the same statistics (a change confined to how responses begin shows in
    ``"first"`` only; Su et al., arXiv 2608.00220).

    Args:
        model: ``[P][k]`` the checkpoint's solo completions (token ids, EOS included), ``k >= 2``.
        base: ``[P][k]`` the base's solo completions of the same problems.
        prefix_tokens: ``N >= 1`` for the by-position blocks, or ``None`` for none.

    Returns:
        ``{"kl_nats", "null_kl_nats", "excess_nats"}`` (each an interval dict: ``value``, ``ci_low``,
        ``ci_high``, ...), ``"num_tokens"``, ``"base_num_tokens"``, ``"bins"``, ``"estimator"``, and with
        ``prefix_tokens`` ``"by_position": {"prefix_tokens", "first": {...}, "rest": {...}}``.

    Raises:
        ValueError: different problem counts, a problem with fewer than 2 samples, ``bins < 1``,
            ``prefix_tokens < 1``.
    """
    if len(model) != len(base):
        raise ValueError(f"{len(model)} problems for the model but {len(base)} for the base.")
    _check_grouped("drift (model)", model, 2)
    _check_grouped("drift (base)", base, 2)
    if prefix_tokens is not None and prefix_tokens < 1:
        raise ValueError(f"prefix_tokens={prefix_tokens!r} must be >= 1.")
    weights, method = resample_weights(len(model), num_resamples, seed), _method(num_resamples, seed)

    def block(model_groups: Completions, base_groups: Completions) -> dict:
        return _drift_block(model_groups, base_groups, bins, weights, confidence, method)

    out = block(model, base)
    out["estimator"] = (
        f"KL of marginal token distributions coarsened to the {bins} most frequent tokens + 1 bin, pseudo-count "
        f"{PSEUDO_COUNT}, between even and odd samples (model vs base, averaged both ways); null: the base's own "
        "even vs odd samples"
    )
    if prefix_tokens is not None:
        out["by_position"] = _by_position(block, (model, base), prefix_tokens)
    return out


def _kl_rows(model, base, bins, weights) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``(arm, null, model tokens, base tokens)``: the binned KL of the model's halves against the base's and of the
    base's two halves, each float64 ``[1 + R]`` (row 0 the point estimate, then one per resample of ``weights``)."""
    ids = _vocabulary(model, base)
    m_even, m_odd = _problem_counts(_subset(model, 2, 0), ids), _problem_counts(_subset(model, 2, 1), ids)
    b_even, b_odd = _problem_counts(_subset(base, 2, 0), ids), _problem_counts(_subset(base, 2, 1), ids)
    me, mo, be, bo = (weights @ c for c in (m_even, m_odd, b_even, b_odd))
    arm = (binned_kl(me, bo, bins) + binned_kl(mo, be, bins)) / 2
    # The null over the base's own ids: which of equally frequent ids become bins depends on the columns, and the
    # null must be the base's alone, the same for every model compared with it.
    own = _vocabulary(base)
    be, bo = (weights @ _problem_counts(_subset(base, 2, half), own) for half in (0, 1))
    null = (binned_kl(be, bo, bins) + binned_kl(bo, be, bins)) / 2
    return arm, null, int(m_even.sum() + m_odd.sum()), int(b_even.sum() + b_odd.sum())


def _drift_block(model, base, bins, weights, confidence, method) -> dict:
    arm, null, num_tokens, base_num_tokens = _kl_rows(model, base, bins, weights)
    problems = weights.shape[1]
    intervals = {name: normal_interval(values, confidence, method, problems) for name, values in
                 (("kl_nats", arm), ("null_kl_nats", null), ("excess_nats", arm - null))}  # fmt: skip
    return intervals | {"num_tokens": num_tokens, "base_num_tokens": base_num_tokens, "bins": bins}


def _by_position(block, sets: Sequence[Completions], prefix_tokens: int) -> dict:
    """``{"prefix_tokens", "first", "rest"}``: ``block(*sets)`` on each completion's first ``prefix_tokens`` tokens
    and on the rest."""
    out: dict = {"prefix_tokens": prefix_tokens}
    for part, cut in (("first", slice(None, prefix_tokens)), ("rest", slice(prefix_tokens, None))):
        out[part] = block(*([[list(c)[cut] for c in g] for g in groups] for groups in sets))
    return out


def drift_difference(
    model_a: Completions,
    model_b: Completions,
    base: Completions,
    *,
    bins: int = DEFAULT_DRIFT_BINS,
    prefix_tokens: int | None = None,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """The drift of ``model_a`` from the base minus that of ``model_b``, with a paired interval.

    Both drifts are [`drift`][tandem_grpo.evaluation.drift.drift]'s ``kl_nats`` recomputed on the same bootstrap
    resamples of the problems (the same ``seed`` gives ``drift``'s resamples), so the value is exactly the difference
    of the two ``drift`` values, and of their ``excess_nats`` (both subtract the same null), and what the problems
    share cancels from the interval. ``bins`` and ``prefix_tokens`` are ``drift``'s.

    Args:
        model_a: ``[P][k]`` solo completions (token ids) of the first model, ``k >= 2``.
        model_b: ``[P][k]`` of the second, the same problems in the same order.
        base: ``[P][k]`` the base's.

    Returns:
        ``{"kl_nats": interval dict of a - b}``, with ``prefix_tokens`` also
        ``"by_position": {"prefix_tokens", "first": {"kl_nats": ...}, "rest": {"kl_nats": ...}}``.

    Raises:
        ValueError: as ``drift``, for either model.
    """
    if not len(model_a) == len(model_b) == len(base):
        raise ValueError(f"problem counts differ: a {len(model_a)}, b {len(model_b)}, base {len(base)}.")
    for name, groups in (("a", model_a), ("b", model_b), ("base", base)):
        _check_grouped(f"drift_difference ({name})", groups, 2)
    if prefix_tokens is not None and prefix_tokens < 1:
        raise ValueError(f"prefix_tokens={prefix_tokens!r} must be >= 1.")
    weights = resample_weights(len(base), num_resamples, seed)
    method = normal_method(num_resamples, seed) + ", paired between the models"

    def difference(a, b, reference) -> dict:
        arm_a, arm_b = _kl_rows(a, reference, bins, weights)[0], _kl_rows(b, reference, bins, weights)[0]
        return {"kl_nats": normal_interval(arm_a - arm_b, confidence, method, len(base))}

    out = difference(model_a, model_b, base)
    if prefix_tokens is not None:
        out["by_position"] = _by_position(difference, (model_a, model_b, base), prefix_tokens)
    return out


def _thin(a: torch.Tensor, b: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Binomially thin whichever of two ``[V]`` count vectors has more tokens to the other's total (in
    expectation), so both are compared at equal token counts."""
    na, nb = float(a.sum()), float(b.sum())
    if na == nb or min(na, nb) == 0:
        return a, b
    if na > nb:
        return _binomial(a, nb / na, generator), b
    return a, _binomial(b, na / nb, generator)


def _binomial(counts: torch.Tensor, keep: float, generator: torch.Generator) -> torch.Tensor:
    # torch.binomial takes no generator: draw uniforms per token occurrence instead (counts are small integers).
    n = counts.round().long()
    total = int(n.sum())
    owner = torch.repeat_interleave(torch.arange(len(n)), n)
    kept = torch.rand(total, generator=generator, dtype=torch.float64) < keep
    return torch.zeros_like(counts).index_add_(0, owner[kept], torch.ones(int(kept.sum()), dtype=counts.dtype))


def _log_rate(counts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return (counts + PSEUDO_COUNT).log() - torch.log(counts.sum() + PSEUDO_COUNT * vocab_size)


def _closer(candidate: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """1 where ``|candidate| < |reference|``, 0.5 on ties, 0 otherwise (mean over the selected tokens)."""
    c, r = candidate.abs(), reference.abs()
    return ((c < r).double() + 0.5 * (c == r).double()).mean()


def moved_back(
    base: Completions,
    grpo: Completions,
    checkpoint: Completions,
    vocab_size: int,
    *,
    top_n: int = 500,
    min_count: int = DEFAULT_MIN_COUNT,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """The share of GRPO's most-shifted tokens that ``checkpoint`` moves back towards the base, with its null.

    The paper's measure (section 5.3) with disjoint selection and measurement samples, equal token totals and a null
    (docs/api/evaluation/drift.md). Sample parts by index within each problem: selection ``0 mod 2`` (GRPO and
    base), base reference ``1 mod 2``, checkpoint ``1 mod 4``, GRPO ``3 mod 4``, null GRPO ``1 mod 4``.

    Args:
        base: ``[P][k]`` the base's solo completions, ``k >= 4``.
        grpo: ``[P][k]`` the GRPO checkpoint's.
        checkpoint: ``[P][k]`` the checkpoint compared with GRPO.
        vocab_size: ``V``, the normalizer of the per-token pseudo-count.
        top_n: tokens selected at most (the paper's 500); fewer when fewer pass ``min_count``.
        min_count: fewest selection-sample occurrences of a candidate.
        seed: seed of the resampling and of the thinning.

    Returns:
        ``{"fraction_moved_back", "null_fraction", "excess"}`` (interval dicts), ``"num_selected"``,
        ``"token_ids"`` (the point estimate's selection, largest GRPO shift first), ``"top_n"``, ``"min_count"``,
        ``"definition"``.

    Raises:
        ValueError: different problem counts, fewer than 4 samples in a problem, ``top_n`` or ``min_count < 1``.
    """
    if not len(base) == len(grpo) == len(checkpoint):
        raise ValueError(f"problem counts differ: base {len(base)}, grpo {len(grpo)}, checkpoint {len(checkpoint)}.")
    for name, groups in (("base", base), ("grpo", grpo), ("checkpoint", checkpoint)):
        _check_grouped(f"moved_back ({name})", groups, 4)
    if top_n < 1 or min_count < 1:
        raise ValueError(f"top_n={top_n!r} and min_count={min_count!r} must both be >= 1.")
    ids = _vocabulary(base, grpo, checkpoint)
    parts = {"base_sel": _subset(base, 2, 0), "grpo_sel": _subset(grpo, 2, 0), "base_ref": _subset(base, 2, 1),
             "grpo_ref": _subset(grpo, 4, 3), "arm": _subset(checkpoint, 4, 1),
             "null": _subset(grpo, 4, 1)}  # fmt: skip
    counts = {name: _problem_counts(groups, ids) for name, groups in parts.items()}
    weights = resample_weights(len(base), num_resamples, seed)
    generator = torch.Generator().manual_seed(seed)
    arm_values, null_values, selected_ids, num_selected = [], [], [], 0
    for r, w in enumerate(weights):
        c = {name: w @ value for name, value in counts.items()}
        candidates = (c["base_sel"] + c["grpo_sel"]) >= min_count
        shift = (_log_rate(c["grpo_sel"], vocab_size) - _log_rate(c["base_sel"], vocab_size)).abs()
        n = min(top_n, int(candidates.sum()))
        if n == 0:
            arm_values.append(float("nan"))
            null_values.append(float("nan"))
            continue
        # A stable sort on -|shift| keeps ties in id order, so the selection is deterministic.
        order = torch.sort(-shift.masked_fill(~candidates, -1.0), stable=True).indices[:n]
        reference = _log_rate(c["base_ref"], vocab_size)[order]
        arm, grpo_arm = _thin(c["arm"], c["grpo_ref"], generator)
        null, grpo_null = _thin(c["null"], c["grpo_ref"], generator)
        shifts = [_log_rate(x, vocab_size)[order] - reference for x in (arm, grpo_arm, null, grpo_null)]
        arm_values.append(float(_closer(shifts[0], shifts[1])))
        null_values.append(float(_closer(shifts[2], shifts[3])))
        if r == 0:
            selected_ids, num_selected = ids[order].tolist(), n
    arm_t = torch.tensor(arm_values, dtype=torch.float64)
    null_t = torch.tensor(null_values, dtype=torch.float64)
    method, problems = _method(num_resamples, seed), len(base)
    intervals = {name: normal_interval(values, confidence, method, problems) for name, values in
                 (("fraction_moved_back", arm_t), ("null_fraction", null_t), ("excess", arm_t - null_t))}  # fmt: skip
    definition = ("GRPO's most-shifted tokens selected on even samples (>= min_count occurrences), measured on odd "
                  "samples at equal token counts: checkpoint (1 mod 4) closer to the base (odd) than GRPO (3 mod 4); "
                  "null: GRPO (1 mod 4) in place of the checkpoint")  # fmt: skip
    return intervals | {"num_selected": num_selected, "token_ids": selected_ids, "top_n": top_n,
                        "min_count": min_count, "definition": definition}  # fmt: skip
