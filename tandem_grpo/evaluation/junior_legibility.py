"""Legibility to the junior (paper section 5.4): the junior's per-token cross-entropy on a senior's completions and
the overlap of the two models' next-token distributions, averaged as the authors do (per CoT without its trailing
EOS, then over CoTs, then over benchmarks), with an interval over problems, an even/odd null and paired differences
(docs/api/evaluation/junior_legibility.md). Every function takes ``confidence`` (interval level in (0, 1)),
``num_resamples`` and ``seed`` (of the resampling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from ..backends import left_pad, strip_eos
from ..model_calls import ModelCall
from .stats import (
    DEFAULT_NUM_RESAMPLES,
    by_problem,
    check_confidence,
    group_by_benchmark,
    normal_interval,
    normal_method,
    resample_weights,
)

Grouped = Sequence[Sequence[float | None]]
"""``[P][k]`` per-CoT values, problem-major; ``None`` (or NaN) marks a CoT that was not scored."""

METRICS = ("junior_cross_entropy", "overlap")
"""The two per-CoT figures: the junior's cross-entropy (nats/token) and the overlap (in [0, 1])."""


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """float64 ``[B, T]`` ``-log softmax(logits)[target]`` in nats, for float ``[B, T, V]`` logits and long
    ``[B, T]`` targets (on ``logits``' device)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.to(logits.device).unsqueeze(-1)).squeeze(-1).double()


def token_overlap(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """float64 ``[B, T]`` overlap ``sum_v min(p_a(v), p_b(v))`` of ``p = softmax(logits)`` (temperature 1) for two
    float ``[B, T, V]`` logits: 1 for identical distributions, 0 for disjoint supports (1 minus the total variation
    distance)."""
    # Accumulate in float64: a float32 sum over ~50k entries is off by ~1e-5.
    return torch.minimum(torch.softmax(logits_a.float(), dim=-1), torch.softmax(logits_b.float(), dim=-1)).sum(
        -1, dtype=torch.float64
    )


def pad_batch(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts and right-pad completions into one teacher-forcing batch.

    Returns:
        long ``(input_ids [B, P + T], attention_mask [B, P + T], completion_ids [B, T], completion_mask [B, T])``,
        ``P`` the longest prompt, ``T`` the longest completion (at least 1), padded with ``pad_token_id``.
    """
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    t_len = max(1, max(len(c) for c in completions))
    comp = torch.tensor([list(c) + [pad_token_id] * (t_len - len(c)) for c in completions], dtype=torch.long)
    comp_mask = torch.tensor([[1] * len(c) + [0] * (t_len - len(c)) for c in completions], dtype=torch.long)
    return torch.cat([prompt_ids, comp], dim=1), torch.cat([prompt_mask, comp_mask], dim=1), comp, comp_mask


def completion_logits(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_completion: int
) -> torch.Tensor:
    """float ``[B, T, V]`` teacher-forced logits predicting the last ``T = num_completion`` tokens of ``input_ids``
    (long ``[B, L]`` from [`pad_batch`][tandem_grpo.evaluation.junior_legibility.pad_batch]).

    Position ids follow the attention mask (``cumsum - 1``) as ``generate`` does for left-padded prompts; only the
    needed positions' logits are materialized (``logits_to_keep``).
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    device = next(model.parameters()).device
    out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                position_ids=position_ids.to(device), logits_to_keep=num_completion + 1, use_cache=False)  # fmt: skip
    return out.logits[:, :-1, :].float()


def shared_prompt_logits(
    model, prompt: Sequence[int], completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    """float ``[B, T, V]`` teacher-forced logits predicting ``B`` right-padded completions (long ``completion_ids``
    and ``completion_mask`` ``[B, T]``) of one ``prompt``: the prompt runs once and its KV cache is repeated for the
    ``B`` rows, so ``k`` samples cost one prompt pass. Equal to
    [`completion_logits`][tandem_grpo.evaluation.junior_legibility.completion_logits] up to float rounding. The model
    is called as ``generate`` calls it ([`ModelCall`][tandem_grpo.model_calls.ModelCall]); it needs a ``DynamicCache``
    ([`can_share_prompt`][tandem_grpo.evaluation.junior_legibility.can_share_prompt])."""
    device = next(model.parameters()).device
    rows, t_len = completion_ids.shape
    p_len = len(prompt)
    call = ModelCall.of(model)
    cache = call.new_cache()
    # The prompt pass needs its last logit only (call.flags keep one); the completion pass needs them all.
    all_logits = {k: v for k, v in call.flags.items() if k not in ("logits_to_keep", "num_logits_to_keep")}
    out = model(input_ids=torch.tensor([list(prompt)], device=device), **{call.cache_name: cache}, **call.flags,
                position_ids=torch.arange(p_len, device=device).unsqueeze(0))  # fmt: skip
    first = out.logits[:, -1:, :].float().expand(rows, 1, -1)
    if t_len == 1:
        return first
    # As generate: continue from the cache the model returned.
    cache = next((getattr(out, n) for n in ("cache", "past_key_values") if getattr(out, n, None) is not None), cache)
    cache.batch_repeat_interleave(rows)
    attention_mask = torch.cat([torch.ones(rows, p_len, dtype=torch.long), completion_mask.long()], dim=1)
    rest = model(input_ids=completion_ids[:, :-1].to(device), attention_mask=attention_mask[:, :-1].to(device),
                 position_ids=torch.arange(p_len, p_len + t_len - 1, device=device).expand(rows, -1),
                 **{call.cache_name: cache}, **all_logits)  # fmt: skip
    return torch.cat([first, rest.logits.float()], dim=1)


def can_share_prompt(model) -> bool:
    """Whether [`shared_prompt_logits`][tandem_grpo.evaluation.junior_legibility.shared_prompt_logits] can score
    ``model``: a transformers model that takes ``attention_mask`` and ``position_ids`` and whose ``generate`` builds
    a ``DynamicCache`` of plain or sliding-window attention layers, which repeat along the batch; hybrid layers with
    recurrent state (linear attention, SSMs) and Mamba-style ``cache_params`` do not."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    call = ModelCall.of(model)
    if call.cache_config is None or not call.default_cache or call.cache_name == "cache_params":
        return False
    if not (call.attention_mask and call.position_ids):
        return False
    layers = getattr(call.new_cache(), "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def _batch_logits(
    model, can_share: bool, shared_prompt, input_ids, attention_mask, completion_ids, completion_mask
) -> torch.Tensor:
    """One batch's completion logits: one prompt pass for rows of one prompt (``shared_prompt``) where the model
    ``can_share`` ([`can_share_prompt`][tandem_grpo.evaluation.junior_legibility.can_share_prompt]), else the padded
    batch."""
    if shared_prompt is not None and can_share:
        return shared_prompt_logits(model, shared_prompt, completion_ids, completion_mask)
    return completion_logits(model, input_ids, attention_mask, completion_ids.shape[1])


def _batches(prompts: Sequence[Sequence[int]], batch_size: int):
    """``(start, stop, shared_prompt)`` row ranges of at most ``batch_size`` rows: a run of rows with one prompt (a
    problem's ``k`` samples) stays in batches of its own, with that prompt as ``shared_prompt`` when a batch has
    several rows; other rows are batched as they come (``shared_prompt`` ``None``)."""
    same = lambda a, b: b < len(prompts) and list(prompts[a]) == list(prompts[b])  # noqa: E731
    start = 0
    while start < len(prompts):
        stop, shared = start + 1, same(start, start + 1)
        if shared:
            while stop - start < batch_size and same(start, stop):
                stop += 1
        else:
            while stop - start < batch_size and stop < len(prompts) and not same(stop, stop + 1):
                stop += 1
        yield start, stop, prompts[start] if shared and stop - start > 1 else None
        start = stop


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
    """Junior cross-entropy on the senior's completions and senior/junior overlap, per CoT and averaged over CoTs.

    Both models are teacher-forced on ``prompt + completion``; per completion token, the cross-entropy is
    ``-log p_junior(token | prefix)`` in nats and the overlap ``sum_v min(p_senior, p_junior)`` at temperature 1,
    averaged per CoT and over CoTs as the authors do (module docstring; a completion cut at the length cap has no
    EOS and is scored whole).

    Args:
        senior: the model that wrote ``completions``; ``None`` skips the overlap.
        prompts: ``[N]`` prompt token ids (chat template applied).
        completions: ``[N]`` completion ids, cut after EOS.
        batch_size: sequences per forward pass.
        progress: optional tqdm-like object; ``update(n)`` per batch.
        eos_token_ids: ids left out of the per-CoT means when trailing; ``[]`` scores every token.

    Returns:
        ``{"junior_cross_entropy": float (nats/token, NaN when nothing was scored), "overlap": float or None,
        "num_tokens": completion tokens with EOS, "num_scored_tokens": tokens without trailing EOS,
        "num_completions": N, "num_scored", "num_skipped_empty", "per_completion": {"junior_cross_entropy": [N],
        "overlap": [N] or None, "num_tokens": [N]}, "averaging": str}``; a skipped CoT's values are ``None``.

    Raises:
        ValueError: ``prompts`` and ``completions`` of different lengths, or logits widths that differ.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions.")
    eos = {int(i) for i in eos_token_ids}
    with_overlap = senior is not None
    count = 0
    cot_ce: list[float | None] = []
    cot_overlap: list[float | None] = []
    cot_tokens: list[int] = []
    # Read once per model, not per batch (it inspects the forward's signature and builds a cache).
    junior_shares = can_share_prompt(junior)
    senior_shares = with_overlap and senior is not junior and can_share_prompt(senior)
    for start, stop, shared in _batches(prompts, batch_size):
        batch_c = completions[start:stop]
        input_ids, attn, comp, comp_mask = pad_batch(prompts[start:stop], batch_c, pad_token_id)
        batch = (shared, input_ids, attn, comp, comp_mask)
        junior_logits = _batch_logits(junior, junior_shares, *batch)
        nll = token_cross_entropy(junior_logits, comp).cpu()
        overlap = None
        if with_overlap:
            # The same module in both roles gives identical distributions: skip the second forward pass.
            senior_logits = junior_logits if senior is junior else _batch_logits(senior, senior_shares, *batch)
            if senior_logits.shape[-1] != junior_logits.shape[-1]:
                raise ValueError(
                    f"senior and junior logits differ in width ({senior_logits.shape[-1]} vs "
                    f"{junior_logits.shape[-1]}); they need one shared vocabulary."
                )
            overlap = token_overlap(senior_logits, junior_logits).cpu()
            del senior_logits
        del junior_logits
        count += int(comp_mask.sum())
        for row, c in enumerate(batch_c):
            n = len(strip_eos(c, eos))
            cot_tokens.append(n)
            cot_ce.append(float(nll[row, :n].mean()) if n else None)
            if overlap is not None:
                cot_overlap.append(float(overlap[row, :n].mean()) if n else None)
        if progress is not None:
            progress.update(len(batch_c))
    scored_ce = [v for v in cot_ce if v is not None]
    scored_overlap = [v for v in cot_overlap if v is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {
        "junior_cross_entropy": mean(scored_ce),
        "overlap": mean(scored_overlap) if with_overlap else None,
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
            "mean over completions of each completion's per-token mean, trailing EOS excluded, empty completions "
            "skipped (authors' eval/legibility.py)"
        ),
    }


def _scored(values, keep=lambda i: True) -> list[float]:
    """The values whose index passes ``keep`` that were scored (neither ``None`` nor NaN)."""
    return [float(v) for i, v in enumerate(values) if keep(i) and v is not None and not math.isnan(float(v))]


def _sums(groups: Grouped, keep=lambda i: True) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``[P]`` sums and counts of the scored values of every problem (samples whose index passes ``keep``)."""
    scored = [_scored(g, keep) for g in groups]
    return tuple(torch.tensor([f(s) for s in scored], dtype=torch.float64) for f in (sum, len))


def _mean_over_cots(weights: torch.Tensor, sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[1 + R]`` the mean over the CoTs of each (re)sample of problems; NaN where no CoT was scored."""
    return (weights @ sums) / (weights @ counts)


def _with_null(statistic, values: Grouped, confidence: float, method: str) -> tuple[dict, dict | None]:
    """Interval dicts of ``statistic(keep)`` (``[1 + R]`` replicates over the samples whose index passes ``keep``) on
    every sample, and of its even-minus-odd null (``None`` when a problem has fewer than 2 samples)."""
    mean = normal_interval(statistic(lambda i: True), confidence, method, len(values))
    if min(len(g) for g in values) < 2:
        return mean, None
    halves = statistic(lambda i: i % 2 == 0) - statistic(lambda i: i % 2 == 1)
    return mean, normal_interval(halves, confidence, method, len(values))


def _check(name: str, groups: Grouped, confidence: float) -> None:
    if len(groups) == 0:
        raise ValueError(f"{name}: no problems.")
    check_confidence(confidence)


def cot_mean(
    values: Grouped,
    *,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """The authors' mean over CoTs of per-CoT values, its interval over problems, and the even/odd null.

    Args:
        values: ``[P][k]`` per-CoT values of one model (e.g. ``per_completion`` of
            [`legibility`][tandem_grpo.evaluation.junior_legibility.legibility] grouped by problem); ``None`` or NaN
            entries are left out.

    Returns:
        ``{"mean": interval dict, "null_half_difference": interval dict or None (a problem with fewer than 2
        samples), "num_problems": P, "num_scored", "num_skipped", "estimator"}``, in the units of ``values``.

    Raises:
        ValueError: no problems, or ``confidence`` outside (0, 1).
    """
    _check("cot_mean", values, confidence)
    weights = resample_weights(len(values), num_resamples, seed)
    mean, null = _with_null(lambda keep: _mean_over_cots(weights, *_sums(values, keep)), values, confidence,
                            normal_method(num_resamples, seed))  # fmt: skip
    num_scored = int(_sums(values)[1].sum())
    estimator = ("mean over CoTs of the per-CoT mean (authors' eval/legibility.py); null: the same mean on each "
                 "problem's even-indexed samples minus its odd-indexed samples")  # fmt: skip
    return {"mean": mean, "null_half_difference": null, "num_problems": len(values), "num_scored": num_scored,
            "num_skipped": sum(len(g) for g in values) - num_scored, "estimator": estimator}  # fmt: skip


def paired_difference(
    values_a: Grouped,
    values_b: Grouped,
    *,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """``mean(a) - mean(b)`` of two models' per-CoT values on the same problems (each side as in
    [`cot_mean`][tandem_grpo.evaluation.junior_legibility.cot_mean]), both recomputed on the same resamples.

    Args:
        values_a: ``[P][k_a]`` per-CoT values of the first model (e.g. a checkpoint's).
        values_b: ``[P][k_b]`` per-CoT values of the second (e.g. the junior's on its own samples), same problems.

    Returns:
        An interval dict plus ``"value_a"`` and ``"value_b"``, the two means, in the units of the values.

    Raises:
        ValueError: no problems, different problem counts, or ``confidence`` outside (0, 1).
    """
    _check("paired_difference", values_a, confidence)
    if len(values_a) != len(values_b):
        raise ValueError(f"paired_difference: {len(values_a)} problems for a but {len(values_b)} for b.")
    weights = resample_weights(len(values_a), num_resamples, seed)
    a = _mean_over_cots(weights, *_sums(values_a))
    b = _mean_over_cots(weights, *_sums(values_b))
    out = normal_interval(a - b, confidence, normal_method(num_resamples, seed) + ", paired", len(values_a))
    return out | {"value_a": float(a[0]), "value_b": float(b[0])}


def benchmark_means(values: Grouped, benchmarks: Sequence[str]) -> dict[str, float | None]:
    """Each benchmark's figure as the authors compute it: the mean over the benchmark's scored CoTs.

    Args:
        values: ``[P][k]`` per-CoT values of one model over every benchmark's problems (``None`` or NaN: not scored).
        benchmarks: ``[P]`` each problem's benchmark name.

    Returns:
        Benchmark name (in order of first appearance) to its mean, in the units of ``values``; ``None`` for a
        benchmark with no scored CoT.

    Raises:
        ValueError: ``benchmarks`` not aligned with ``values``.
    """
    means = {}
    for name, groups in group_by_benchmark(values, benchmarks, "benchmark_means: ").items():
        scored = [_scored(g) for g in groups]
        count = sum(len(s) for s in scored)
        means[name] = sum(sum(s) for s in scored) / count if count else None
    return means


def macro_average(by_benchmark: Mapping[str, float | None]) -> float | None:
    """The authors' headline (``macro_ce``): the plain mean of the benchmarks' figures, ``None`` or NaN ones left
    out; ``None`` when none has a figure."""
    figures = _scored(list(by_benchmark.values()))
    return sum(figures) / len(figures) if figures else None


def macro_mean(
    values: Grouped,
    benchmarks: Sequence[str],
    *,
    confidence: float = 0.95,
    num_resamples: int = DEFAULT_NUM_RESAMPLES,
    seed: int = 0,
) -> dict:
    """The authors' macro average ([`macro_average`][tandem_grpo.evaluation.junior_legibility.macro_average] of
    [`benchmark_means`][tandem_grpo.evaluation.junior_legibility.benchmark_means]) with an interval and the
    even/odd null, problems resampled within each benchmark (every resample keeps every benchmark).

    Args:
        values: ``[P][k]`` per-CoT values, as for ``benchmark_means``.
        benchmarks: ``[P]`` each problem's benchmark name.
        seed: benchmark ``i`` (in order of first appearance) resamples with ``seed + i``.

    Returns:
        ``{"mean": interval, "null_half_difference": interval or None, "benchmarks": [names]}``; a benchmark with
        no scored CoT is left out of the average. ``mean.value`` equals ``macro_average(benchmark_means(...))``.

    Raises:
        ValueError: no problems, ``benchmarks`` not aligned with ``values``, or ``confidence`` outside (0, 1).
    """
    _check("macro_mean", values, confidence)
    groups = group_by_benchmark(values, benchmarks, "macro_mean: ")
    weights = {b: resample_weights(len(rows), num_resamples, seed + i) for i, (b, rows) in enumerate(groups.items())}

    def macro(keep=lambda i: True) -> torch.Tensor:
        means = torch.stack([_mean_over_cots(weights[b], *_sums(rows, keep)) for b, rows in groups.items()])
        return means.nanmean(dim=0)

    method = normal_method(num_resamples, seed) + ", stratified by benchmark"
    mean, null = _with_null(macro, values, confidence, method)
    return {"mean": mean, "null_half_difference": null, "benchmarks": list(groups)}


def legibility_block(out: dict, benchmarks: Sequence[str], k: int, *, confidence: float = 0.95, seed: int = 0) -> dict:
    """The ``results.json`` legibility block of one model: ``out`` (from
    [`legibility`][tandem_grpo.evaluation.junior_legibility.legibility]) with each metric's
    [`cot_mean`][tandem_grpo.evaluation.junior_legibility.cot_mean] (``<metric>_with_null``), ``by_benchmark``
    (each benchmark's mean, and with several benchmarks its own ``<metric>_with_null``) and ``macro`` (the headline
    with [`macro_mean`][tandem_grpo.evaluation.junior_legibility.macro_mean]'s interval and null).

    Args:
        out: one model's legibility output over ``P * k`` completions, problem-major.
        benchmarks: ``[P]`` each problem's benchmark name.
        k: samples per problem.
    """
    stats = {"confidence": confidence, "seed": seed}
    entry = dict(out)
    names = list(dict.fromkeys(benchmarks))
    per_cot = out["per_completion"]
    grouped = {m: None if per_cot[m] is None else by_problem(per_cot[m], k) for m in METRICS}
    by_benchmark: dict[str, dict] = {b: {} for b in names}
    for metric, values in grouped.items():
        # Over every CoT of the run: with several benchmarks a pooled figure, so each benchmark also gets its own.
        entry[f"{metric}_with_null"] = None if values is None else cot_mean(values, **stats)
        means = dict.fromkeys(names) if values is None else benchmark_means(values, benchmarks)
        for b in names:
            by_benchmark[b][metric] = means[b]
        if values is not None and len(names) > 1:
            for b, rows in group_by_benchmark(values, benchmarks).items():
                by_benchmark[b][f"{metric}_with_null"] = cot_mean(rows, **stats)
    entry["with_null_pooled_over_benchmarks"] = len(names) > 1
    entry["by_benchmark"] = by_benchmark
    entry["macro"] = {m: macro_average({b: v[m] for b, v in by_benchmark.items()}) for m in METRICS}
    entry["macro"]["benchmarks"] = names
    for metric, values in grouped.items():
        entry["macro"][f"{metric}_with_null"] = None if values is None else macro_mean(values, benchmarks, **stats)
    return entry
