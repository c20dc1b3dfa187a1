"""The tandem step both logits processors run on their tandem rows
([`processor_v1`][tandem_grpo.vllm.processor_v1], [`processor_v2`][tandem_grpo.vllm.processor_v2]), as functions of
tensors: scale and log-softmax both models' logits, mix them
([`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs]), compute the position's side records
([`tandem_grpo.vllm.side_records`][tandem_grpo.vllm.side_records]), truncate
([`truncate_with_kept_mass`][tandem_grpo.sampling.truncate_with_kept_mass]: top-k, then top-p, then min-p, as the
transformers path; the log of the kept mass joins the ``corrections`` record) and write the result into vLLM's
logits. No vLLM import.

Both models' logits are cut to the ``V`` ids of the boundary tables (the tokenizer's length,
[`BoundaryTables.from_tokenizer`][tandem_grpo.handoff.BoundaryTables.from_tokenizer]) before mixing; columns past ``V``
(embedding padding of either checkpoint) get probability 0, so a junior whose logits are wider or narrower than the
senior's (down to ``V``) mixes correctly and vLLM's sampler never draws an id the tokenizer does not know.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..guards import require_finite_logprobs
from ..handoff import (
    SENIOR,
    BoundaryTables,
    HandoffRule,
    HandoffState,
    boundary_mask,
    handoff_rows,
    mixture_logprobs,
)
from ..sampling import truncate_with_kept_mass, vocabulary_mass
from ._compat import ARCHITECTURE
from .side_records import add_vocabulary_mass

Setting = float | int | torch.Tensor
"""A per-row setting of a group of ``g`` rows: one Python number for all, or a tensor ``[g]`` on the logits' device."""


@dataclass
class StepSettings:
    """What [`mix`][tandem_grpo.vllm.mixing.mix] divides each model's logits by (1: vLLM applied the temperature
    already) and the mixture's truncation (``top_k`` 0, ``top_p`` 1.0 and ``min_p`` 0.0 are off) as
    [`truncate_logprobs`][tandem_grpo.sampling.truncate_logprobs] takes it; each a ``Setting``."""

    senior_temperature: Setting
    junior_temperature: Setting
    top_k: Setting = 0
    top_p: Setting = 1.0
    min_p: Setting = 0.0


def is_tandem_engine(model_config) -> bool:
    """Whether the engine's model is ``TandemForCausalLM`` (a processor elsewhere is a no-op)."""
    return ARCHITECTURE in (getattr(model_config.hf_config, "architectures", None) or [])


def uniform(values: Sequence | np.ndarray, dtype: torch.dtype, device: torch.device) -> Setting:
    """One Python number when every entry of ``values`` (``[g]``, on the host) is the same (no device work), else a
    tensor ``[g]`` of ``dtype`` on ``device``."""
    values = np.asarray(values)
    first = values[0].item()
    if (values == first).all():
        return first
    return torch.from_numpy(np.ascontiguousarray(values)).to(device=device, dtype=dtype, non_blocking=True)


def step_tables(
    model_config, cache: dict[int, BoundaryTables], logits: torch.Tensor, junior_logits: torch.Tensor | None, needs=""
) -> BoundaryTables:
    """The boundary tables of a step's senior ``logits`` (``[n, W]``): for ``W`` columns, on ``logits``' device, built
    once per width into ``cache`` from ``model_config`` (the engine's ``ModelConfig``: its tokenizer, and the EOS ids
    that [`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs] put in its hf_config, else
    [`engine_eos_token_ids`][tandem_grpo.vllm.engine.engine_eos_token_ids]).

    Raises:
        RuntimeError: the model published no junior logits of this step with one row per row of ``logits`` and at
            least ``V`` columns; ``needs`` completes the message (what the engine must run with).
    """
    width = logits.shape[-1]
    if width not in cache:
        from transformers import AutoTokenizer

        cfg = model_config
        tokenizer = AutoTokenizer.from_pretrained(
            cfg.tokenizer, revision=cfg.tokenizer_revision, trust_remote_code=cfg.trust_remote_code
        )
        eos = getattr(cfg.hf_config, "tandem_eos_token_ids", None)
        if eos is None:
            from .engine import engine_eos_token_ids

            eos = engine_eos_token_ids(cfg.model, cfg.trust_remote_code)
        cache[width] = BoundaryTables.from_tokenizer(tokenizer, width, list(eos)).to(logits.device)
    tables = cache[width]
    got = None if junior_logits is None else tuple(junior_logits.shape)
    if got is None or got[0] != logits.shape[0] or got[-1] < tables.vocab_size:
        raise RuntimeError(
            f"Tandem rows need the junior's logits of this step ({logits.shape[0]} rows, at least "
            f"{tables.vocab_size} columns; got {got}): the engine must run {ARCHITECTURE}{needs}."
        )
    return tables


def _scaled(logits: torch.Tensor, temperature: Setting) -> torch.Tensor:
    if isinstance(temperature, torch.Tensor):
        return logits / temperature.unsqueeze(1)
    return logits if temperature == 1.0 else logits / temperature


def mix(
    senior, junior, state: HandoffState, tables: BoundaryTables, rule: HandoffRule, settings: StepSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """The tandem step of ``g`` rows under one rule; no host sync.

    Args:
        senior: float ``[g, >= V]``, the senior's logits as vLLM hands them over (after its penalties).
        junior: float ``[g, >= V]``, the junior's logits after the same penalties.
        state: the rows' rule state before this position.
        tables: the boundary tables; their ``vocab_size`` is ``V``.
        rule: the rows' handoff rule.
        settings: the rows' temperatures and truncation.

    Returns:
        ``(logprobs, records, nonfinite)``: float ``[g, V]``, the truncated mixture's log-probabilities (``-inf`` on
        dropped tokens); the position's side records, float ``[g]`` by
        [`POSITION_RECORDS`][tandem_grpo.vllm.side_records.POSITION_RECORDS] name (empty under ``"after_boundary"``,
        where every position keeps the records' fill values); bool ``[2]``: whether the senior's, the junior's
        log-probabilities hold NaN, for the processor's deferred check
        ([`raise_nonfinite`][tandem_grpo.vllm.mixing.raise_nonfinite]).
    """
    width = tables.vocab_size
    scaled = _scaled(senior, settings.senior_temperature)
    inside = vocabulary_mass(scaled, width)  # log M on a checkpoint padded past the tokenizer (side_records)
    senior_lp = torch.log_softmax(scaled[:, :width], dim=-1)
    junior_lp = torch.log_softmax(_scaled(junior[:, :width].float(), settings.junior_temperature), dim=-1)
    boundary = boundary_mask(state, tables, rule)
    whole_unit = rule.mode == "whole_unit"
    mixed = mixture_logprobs(senior_lp, junior_lp, state, boundary, sync_strategy="masked" if whole_unit else "none")
    records = _whole_unit_records(senior_lp, junior_lp, state, boundary) if whole_unit else {}
    into_senior = records.pop("into_senior", None)
    nonfinite = torch.stack([torch.isnan(senior_lp).any(), torch.isnan(junior_lp).any()])
    mixed, kept = truncate_with_kept_mass(mixed, settings.top_k, settings.top_p, settings.min_p)
    if kept is not None:  # + log Z_t: the senior's term over the whole vocabulary (side_records)
        records["corrections"] = records["corrections"] + kept if "corrections" in records else kept
    if inside is not None:
        corrections, handovers = add_vocabulary_mass(inside, into_senior, records.get("corrections"),
                                                     records.get("handovers"))  # fmt: skip
        records["corrections"] = corrections
        if handovers is not None:
            records["handovers"] = handovers
    return mixed, records, nonfinite


def raise_nonfinite(flags: torch.Tensor) -> None:
    """Raise ``FloatingPointError`` (naming the model) if ``flags``, [`mix`][tandem_grpo.vllm.mixing.mix]'s OR-ed
    over steps, shows NaN; one host sync."""
    for model, bad in zip(("senior", "junior"), flags.tolist(), strict=True):
        if bad:
            require_finite_logprobs(torch.tensor([float("nan")]), model)


def _whole_unit_records(senior_lp, junior_lp, state: HandoffState, boundary: torch.Tensor) -> dict[str, torch.Tensor]:
    """``corrections`` and ``handovers`` ``[g]`` as [`side_records`][tandem_grpo.vllm.side_records] defines them:
    nonzero (finite) only on rows where ``B`` is a proper subset and the owner may change."""
    switching = handoff_rows(state, boundary)
    neg_inf = torch.tensor(float("-inf"), dtype=senior_lp.dtype, device=senior_lp.device)
    senior_b = torch.logsumexp(torch.where(boundary, senior_lp, neg_inf), dim=-1)
    junior_b = torch.logsumexp(torch.where(boundary, junior_lp, neg_inf), dim=-1)
    into_senior = switching & (state.next_owner == SENIOR)
    return {
        "corrections": torch.where(into_senior & torch.isfinite(junior_b), -junior_b, torch.zeros_like(junior_b)),
        "handovers": torch.where(switching & ~into_senior, senior_b, torch.full_like(senior_b, math.nan)),
        "into_senior": into_senior,  # where log M cancels (popped by mix, not a record)
    }


def write_rows(logits: torch.Tensor, rows: torch.Tensor | slice, mixed: torch.Tensor) -> None:
    """Put ``mixed`` (float ``[g, V]``) into ``rows`` of vLLM's ``logits`` (``[n, >= V]``, in place; ``rows`` a device
    index ``[g]``, or ``slice(None)`` for all ``n`` rows in order), ``-inf`` past ``V``: ids past the tokenizer
    (embedding padding) keep probability 0 in what vLLM samples from."""
    width = mixed.shape[-1]
    if isinstance(rows, slice):
        logits[:, width:] = float("-inf")
        logits[:, :width] = mixed.to(logits.dtype)
        return
    out = torch.full((mixed.shape[0], logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=logits.device)
    out[:, :width] = mixed.to(logits.dtype)
    logits.index_copy_(0, rows, out)
