"""The tandem logits processor for vLLM's Model Runner V2 (``vllm.v1.worker.gpu.sample.logits_processor``).

Same job as the V1 processor ([`tandem_grpo.vllm.processor`][tandem_grpo.vllm.processor]), same rule
([`tandem_grpo.handoff`][tandem_grpo.handoff]: [`advance`][tandem_grpo.handoff.advance],
[`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs]), same side records
([`tandem_grpo.vllm.side_records`][tandem_grpo.vllm.side_records]); what differs is how vLLM drives it. Followed:
``vllm/v1/worker/gpu/sample/logits_processor/interface.py`` and ``vllm/v1/worker/gpu/sample/sampler.py`` (vLLM
0.32; the interface is unchanged through 0.34).

- **Slots, not rows.** Per-request state lives in device tensors indexed by vLLM's request slot (``req_idx``,
  ``max_num_reqs`` of them). vLLM recycles a slot with no remove hook, so
  [`add_request`][tandem_grpo.vllm.processor_v2.TandemLogitsProcessorV2.add_request] stages a full rewrite of the
  slot and [`apply_staged_writes`][tandem_grpo.vllm.processor_v2.TandemLogitsProcessorV2.apply_staged_writes] first
  copies the previous occupant's records out to the host (one transfer per tensor, on steps that admit requests
  only), then writes the new occupant's state. ``apply`` maps each logits row to its slot with
  ``ctx.idx_mapping``; rows are reordered every step.
- **Token history on the device.** The previous token is read from vLLM's ``all_token_ids[slot, total_len - 1]``
  (``LogitsProcRequestState``), which Model Runner V2 writes on the device after each sample: a step needs no host
  sync, and async scheduling (vLLM's default) works. A request resumed after preemption catches up over its earlier
  tokens from the same buffer (the count is known on the host at admission).
- **Before temperature.** Model Runner V2 runs custom processors after penalties and before temperature, min-p and
  top-k/top-p. Tandem requests are sent at temperature 1 with vLLM's truncation off and carry their temperature and
  truncation in their extra args ([`tandem_grpo.vllm.request_args`][tandem_grpo.vllm.request_args]); the processor
  scales both models, mixes and truncates (top-k, then top-p, then min-p, as the transformers path), so vLLM's own
  stages after it are no-ops. The senior's penalties are vLLM's; the junior gets the same
  (``vllm/v1/worker/gpu/sample/penalties.py``: repetition over prompt and output, frequency and presence over
  output), computed here from the device token history.
- **No speculative decoding.** Under it a request owns several logits rows per step; the processor refuses such an
  engine at construction and such a batch in ``apply``.

Both models' logits are cut to the ``V`` ids of the boundary tables before mixing; columns past ``V`` get
probability 0, as in the V1 processor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor

from ..handoff import (
    SENIOR,
    BoundaryTables,
    HandoffRule,
    advance,
    boundary_mask,
    handoff_rows,
    init_state,
    mixture_logprobs,
    nonfinite_flags,
    raise_nonfinite,
)
from ..sampling import truncate_with_kept_mass, vocabulary_mass
from ._compat import ARCHITECTURE
from ._slot import take_junior_logits
from ._tables import engine_boundary_tables
from .request_args import UID_KEY, is_tandem_request, sampling_from_params, validate_tandem_params
from .side_records import (
    LOCK,
    PROCESSORS,
    STATE_FIELDS,
    _Record,
    add_vocabulary_mass,
    pack_state,
    record_for,
    unpack_state,
)


@dataclass(eq=False)
class _Occupant:
    """The tandem request in a slot (``sync_records`` callers select by ``occupant.record``)."""

    record: _Record


def _uniform(values: np.ndarray, dtype: torch.dtype, device: torch.device):
    """One Python number when every entry is the same (no device work), else a tensor ``[n]`` on ``device``."""
    first = values[0].item()
    if (values == first).all():
        return first
    return torch.from_numpy(np.ascontiguousarray(values)).to(device=device, dtype=dtype, non_blocking=True)


class TandemLogitsProcessorV2(LogitsProcessor):
    """Turns each tandem request's senior logits into the tandem mixture's truncated log-probabilities, under Model
    Runner V2 (module docstring).

    Constructed by vLLM in every worker: ``(vllm_config, req_states)``. Inactive (a no-op) on engines whose model is
    not ``TandemForCausalLM``.

    Args:
        vllm_config: the engine's config; its model's architecture decides whether the processor is active.
        req_states: vLLM's read-only view of the slots (``LogitsProcRequestState``: ``device``, ``max_num_reqs``,
            ``all_token_ids`` ``[max_num_reqs, max_model_len]``, ``prompt_len``, ``prefill_len``, ``total_len``).

    Raises:
        ValueError: a tandem engine with speculative decoding (several logits rows per request).
    """

    def __init__(self, vllm_config, req_states) -> None:
        model_config = vllm_config.model_config
        self.enabled = ARCHITECTURE in (getattr(model_config.hf_config, "architectures", None) or [])
        if self.enabled and getattr(vllm_config, "speculative_config", None) is not None:
            raise ValueError(
                "The tandem engine does not support speculative decoding: each draft row would need the junior's "
                "logits and the handoff state at its own position. Remove speculative_config."
            )
        self.model_config = model_config
        self.req_states = req_states
        self.device = device = req_states.device
        slots = req_states.max_num_reqs
        self._tables: dict[int, tuple[BoundaryTables, BoundaryTables]] = {}  # by logits width
        self._staged: list[tuple[int, SamplingParams]] = []
        # Host, per slot: the occupant, its rule (index into _rules; -1 = not a tandem request), its settings.
        self._occupants: list[_Occupant | None] = [None] * slots
        self._slot_of: dict[str, int] = {}  # uid -> slot of its latest occupancy
        self._rules: list[HandoffRule] = []
        self._rule_id = np.full(slots, -1, dtype=np.int64)
        self._temperature = np.ones(slots, dtype=np.float32)
        self._top_k = np.zeros(slots, dtype=np.int64)
        self._top_p = np.ones(slots, dtype=np.float32)
        self._min_p = np.zeros(slots, dtype=np.float32)
        self._penalized = np.zeros(slots, dtype=bool)
        self._catch_up = np.zeros(slots, dtype=np.int64)  # tokens to advance over beyond this step's one
        # Device, per slot: rule state, coin seed, completion tokens advanced over, record length, penalties.
        self._state = torch.zeros(slots, len(STATE_FIELDS), dtype=torch.long, device=device)
        self._seeds = torch.zeros(slots, dtype=torch.long, device=device)
        self._position = torch.zeros(slots, dtype=torch.long, device=device)
        self._written = torch.zeros(slots, dtype=torch.long, device=device)
        self._penalties = torch.zeros(slots, 3, dtype=torch.float32, device=device)  # repetition, frequency, presence
        self._authors = torch.zeros(slots, 16, dtype=torch.int8, device=device)
        self._corrections = torch.zeros(slots, 16, dtype=torch.float32, device=device)
        self._handovers = torch.full((slots, 16), math.nan, dtype=torch.float32, device=device)
        self._nonfinite = torch.zeros(2, dtype=torch.bool, device=device)
        PROCESSORS.add(self)

    # --- vLLM interface -------------------------------------------------------------------------------------------

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """[`validate_tandem_params`][tandem_grpo.vllm.request_args.validate_tandem_params], and a tandem request
        must come at ``temperature=1`` (vLLM scales after this processor; the real temperature travels in the extra
        args). Runs in vLLM's API process.

        Raises:
            ValueError: as ``validate_tandem_params``; a tandem request with ``SamplingParams.temperature != 1``.
        """
        validate_tandem_params(sampling_params)
        if is_tandem_request(sampling_params) and sampling_params.temperature != 1.0:
            raise ValueError(
                "Under vLLM's Model Runner V2 tandem requests are sent at temperature 1 (vLLM applies the temperature "
                "after the logits processor); pass the temperature as extra_args['tandem_temperature'] "
                f"(tandem_extra_args(..., sampling)); got temperature={sampling_params.temperature}."
            )

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        """Stage the slot's rewrite for ``apply_staged_writes``; whether the request is a tandem request."""
        self._staged.append((req_idx, sampling_params))
        return self.enabled and is_tandem_request(sampling_params)

    def apply_staged_writes(self) -> None:
        """Rewrite the slots staged by ``add_request``: the records of their previous occupants (and of a resumed
        request's earlier slot) are copied out to the host first, then each new tandem occupant's state, settings and
        records (from its host record: a new one, or the one it left when preempted) are written to the device.

        Raises:
            FloatingPointError: a model's logits were not finite in a step since the last check.
        """
        if not self._staged:
            return
        staged, self._staged = self._staged, []
        with LOCK:
            uids = {p.extra_args[UID_KEY] for _, p in staged if self.enabled and is_tandem_request(p)}
            leaving = {slot for slot, _ in staged if self._occupants[slot] is not None}
            leaving |= {self._slot_of[uid] for uid in uids if uid in self._slot_of}
            self._sync_slots(sorted(leaving))
            for slot in leaving:
                occupant = self._occupants[slot]
                self._occupants[slot] = None
                self._rule_id[slot] = -1
                if occupant is not None and self._slot_of.get(occupant.record.uid) == slot:
                    del self._slot_of[occupant.record.uid]
            new = [(slot, params) for slot, params in staged if self.enabled and is_tandem_request(params)]
            for slot, _ in staged:
                self._rule_id[slot] = -1
            if new:
                self._admit(new)

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        """Replace the tandem rows of ``logits`` (``[num_rows, vocab]`` float32, one row per request) with the
        mixture's truncated log-probabilities; other rows are left as they are.

        Raises:
            RuntimeError: several rows per request (speculative decoding), or no junior logits of this step.
        """
        junior_logits = take_junior_logits() if self.enabled else None
        slots_np = ctx.idx_mapping_np
        rule_ids = self._rule_id[slots_np]
        tandem = rule_ids >= 0
        if not tandem.any():
            return logits
        if logits.shape[0] != slots_np.shape[0]:
            raise RuntimeError(
                f"{logits.shape[0]} logits rows for {slots_np.shape[0]} requests: the tandem processor takes one row "
                "per request (no speculative decoding)."
            )
        tables, _ = self._boundary_tables(logits.shape[-1], logits.device)
        if (
            junior_logits is None
            or junior_logits.shape[0] != logits.shape[0]
            or junior_logits.shape[-1] < tables.vocab_size
        ):
            got = None if junior_logits is None else tuple(junior_logits.shape)
            raise RuntimeError(
                f"Tandem rows need the junior's logits of this step ({logits.shape[0]} rows, at least "
                f"{tables.vocab_size} columns; got {got}): the engine must run {ARCHITECTURE}."
            )
        tandem_slots = slots_np[tandem]
        prompt_np = self.req_states.prompt_len.np[tandem_slots]
        outputs_bound = np.maximum(ctx.seq_lens_upper_bound_np[tandem] - prompt_np, 0)
        self._reserve(int(outputs_bound.max()) + 1)
        rounds = 1 + int(self._catch_up[tandem_slots].max())
        self._catch_up[tandem_slots] = 0
        for rows, slots, rows_np in self._groups(ctx, rule_ids, tandem):
            rule = self._rules[int(rule_ids[rows_np[0]])]
            outputs = self._advance(slots, rule, tables, rounds)
            bound = int(ctx.seq_lens_upper_bound_np[rows_np].max())
            self._mix(logits, junior_logits, tables, rule, rows, slots, slots_np[rows_np], outputs, bound)
        return logits

    # --- records --------------------------------------------------------------------------------------------------

    def sync_records(self, which) -> None:
        """Copy the state and records of the slots whose occupant ``which(occupant)`` selects from the device into
        their ``_Record`` (one host transfer per tensor), after checking the deferred non-finite flags."""
        self._sync_slots([s for s in self._slot_of.values() if which(self._occupants[s])])

    def record(self, slot: int) -> _Record:
        """The up-to-date record of the tandem request in ``slot`` (host sync; for tests and debugging)."""
        with LOCK:
            self._sync_slots([slot])
        return self._occupants[slot].record

    def _sync_slots(self, slots: list[int]) -> None:
        raise_nonfinite(self._nonfinite)
        slots = [s for s in slots if self._occupants[s] is not None]
        if not slots:
            return
        index = torch.tensor(slots, dtype=torch.long, device=self.device)
        state = self._state.index_select(0, index).tolist()
        position = self._position.index_select(0, index).tolist()
        written = self._written.index_select(0, index).tolist()
        authors = self._authors.index_select(0, index).tolist()
        corrections = self._corrections.index_select(0, index).tolist()
        handovers = self._handovers.index_select(0, index).tolist()
        for k, slot in enumerate(slots):
            record = self._occupants[slot].record
            record.set_state_row(state[k])
            record.position = position[k]
            record.authors = authors[k][: position[k]]
            record.corrections = corrections[k][: written[k]]
            record.handovers = handovers[k][: written[k]]

    def _admit(self, new: list[tuple[int, SamplingParams]]) -> None:
        """Write the state of new tandem occupants (``[(slot, params)]``) from their host records."""
        records, outputs, penalties = [], [], []
        for slot, params in new:
            record = record_for(params.extra_args, 0)
            # Output tokens already in the slot's history: a preempted request resumes with them in its prefill.
            done = int(self.req_states.prefill_len.np[slot]) - int(self.req_states.prompt_len.np[slot])
            if record.position > done:  # vLLM dropped tokens the record had advanced over: replay from the start
                record.set_state_row(pack_state(init_state(torch.tensor([record.seed]), record.rule))[0].tolist())
                record.position, record.authors = 0, []
                record.corrections, record.handovers = record.corrections[:done], record.handovers[:done]
            records.append(record)
            outputs.append(done)
            sampling = sampling_from_params(params)
            rule = record.rule
            if rule not in self._rules:
                self._rules.append(rule)
            self._rule_id[slot] = self._rules.index(rule)
            self._temperature[slot] = sampling.temperature
            self._top_k[slot], self._top_p[slot], self._min_p[slot] = sampling.top_k, sampling.top_p, sampling.min_p
            penalty = (sampling.repetition_penalty, float(params.frequency_penalty), float(params.presence_penalty))
            penalties.append(penalty)
            self._penalized[slot] = penalty != (1.0, 0.0, 0.0)
            self._catch_up[slot] = done - record.position
            self._occupants[slot] = _Occupant(record)
            self._slot_of[record.uid] = slot
        self._reserve(max([len(r.corrections) + 1 for r in records] + [d + 1 for d in outputs]))
        width = self._authors.shape[1]

        def padded(values: list[list], fill, dtype) -> torch.Tensor:
            out = torch.full((len(values), width), fill, dtype=dtype)
            for k, v in enumerate(values):
                out[k, : len(v)] = torch.tensor(v, dtype=dtype)
            return out.to(self.device)

        device = self.device
        index = torch.tensor([slot for slot, _ in new], dtype=torch.long, device=device)
        self._state[index] = torch.tensor([r.state_row() for r in records], dtype=torch.long, device=device)
        self._seeds[index] = torch.tensor([r.seed for r in records], dtype=torch.long, device=device)
        self._position[index] = torch.tensor([r.position for r in records], dtype=torch.long, device=device)
        self._written[index] = torch.tensor([len(r.corrections) for r in records], dtype=torch.long, device=device)
        self._penalties[index] = torch.tensor(penalties, dtype=torch.float32, device=device)
        self._authors[index] = padded([r.authors for r in records], 0, torch.int8)
        self._corrections[index] = padded([r.corrections for r in records], 0.0, torch.float32)
        self._handovers[index] = padded([r.handovers for r in records], math.nan, torch.float32)

    def _reserve(self, positions: int) -> None:
        """Make the record tensors at least ``positions`` columns wide (doubling; rare)."""
        width = self._authors.shape[1]
        if positions <= width:
            return
        extra = max(positions, 2 * width) - width
        rows = self._authors.shape[0]

        def grow(t: torch.Tensor, fill) -> torch.Tensor:
            return torch.cat([t, torch.full((rows, extra), fill, dtype=t.dtype, device=t.device)], dim=1)

        self._authors = grow(self._authors, 0)
        self._corrections = grow(self._corrections, 0.0)
        self._handovers = grow(self._handovers, math.nan)

    # --- the step -------------------------------------------------------------------------------------------------

    def _boundary_tables(self, vocab_size: int, device: torch.device) -> tuple[BoundaryTables, BoundaryTables]:
        return engine_boundary_tables(self.model_config, self._tables, vocab_size, device)

    def _groups(self, ctx: LogitsContext, rule_ids: np.ndarray, tandem: np.ndarray):
        """``(rows, slots, rows_np)`` per rule among the tandem rows: the logits rows (a slice or a device index),
        their slots on the device, and the rows on the host. One rule and every row tandem (the common batch):
        vLLM's own device index, no copy."""
        rows_np = np.flatnonzero(tandem)
        ids = rule_ids[rows_np]
        if rows_np.shape[0] == rule_ids.shape[0] and (ids == ids[0]).all():
            yield slice(None), ctx.idx_mapping.long(), rows_np
            return
        for rule_id in np.unique(ids):
            chosen = rows_np[ids == rule_id]
            rows = torch.from_numpy(chosen).to(self.device, non_blocking=True)
            yield rows, torch.from_numpy(ctx.idx_mapping_np[chosen].astype(np.int64)).to(self.device), chosen

    def _advance(self, slots: torch.Tensor, rule: HandoffRule, tables: BoundaryTables, rounds: int) -> torch.Tensor:
        """Advance the slots' rule state over the tokens committed since the last step (one, or more for a resumed
        request: ``rounds``); returns each slot's output count ``[g]`` (the position being sampled now)."""
        history = self.req_states.all_token_ids.gpu
        prompt = self.req_states.prompt_len.gpu[slots].long()
        outputs = self.req_states.total_len.gpu[slots].long() - prompt
        last_column = history.shape[1] - 1
        for _ in range(rounds):
            position = self._position[slots]
            pending = position < outputs
            tokens = history[slots, (prompt + position).clamp(max=last_column)].long()
            # Rows with nothing pending read a stale cell; any id inside the tables keeps the gather in range.
            tokens = torch.where(pending, tokens, 0).clamp(0, tables.vocab_size - 1)
            current = self._state[slots]
            new, authors, _ = advance(unpack_state(current, self._seeds[slots]), tokens, tables, rule)
            self._state[slots] = torch.where(pending.unsqueeze(1), pack_state(new), current)
            column = position.clamp(max=self._authors.shape[1] - 1)
            self._authors[slots, column] = torch.where(pending, authors.to(torch.int8), self._authors[slots, column])
            self._position[slots] = position + pending.long()
        return outputs

    def _mix(self, logits, junior_logits, tables, rule, rows, slots, slots_np, outputs, length: int) -> None:
        """Write the mixture's truncated log-probabilities into the group's ``rows`` of ``logits``; ``length``: a
        host upper bound of the rows' sequence lengths (for the junior's penalties)."""
        device = logits.device
        width = tables.vocab_size
        whole = isinstance(rows, slice)
        senior = logits if whole else logits.index_select(0, rows)
        junior = (junior_logits if whole else junior_logits.index_select(0, rows))[:, :width].float()
        if self._penalized[slots_np].any():
            junior = self._penalize(junior, slots, length)
        temperature = _uniform(self._temperature[slots_np], torch.float32, device)
        if not isinstance(temperature, float):
            temperature = temperature.unsqueeze(1)
        senior = senior / temperature
        inside = vocabulary_mass(senior, width)  # log M on a checkpoint padded past the tokenizer (side_records)
        senior_lp = torch.log_softmax(senior[:, :width], dim=-1)
        junior_lp = torch.log_softmax(junior / temperature, dim=-1)
        self._nonfinite |= nonfinite_flags(senior_lp, junior_lp)
        state = unpack_state(self._state[slots], self._seeds[slots])
        boundary = boundary_mask(state, tables, rule)
        whole_unit = rule.mode == "whole_unit"
        sync = "masked" if whole_unit else "none"
        mixed = mixture_logprobs(senior_lp, junior_lp, state, boundary, sync_strategy=sync)
        corrections, handovers, into = None, None, None
        column = outputs.clamp(max=self._corrections.shape[1] - 1)
        if whole_unit:  # the records at the position being sampled (tandem_grpo.vllm.side_records)
            switching = handoff_rows(state, boundary)
            neg_inf = torch.tensor(float("-inf"), dtype=senior_lp.dtype, device=device)
            senior_b = torch.logsumexp(torch.where(boundary, senior_lp, neg_inf), dim=-1)
            junior_b = torch.logsumexp(torch.where(boundary, junior_lp, neg_inf), dim=-1)
            into_senior = switching & (state.next_owner == SENIOR)
            corrections = torch.where(into_senior & torch.isfinite(junior_b), -junior_b, torch.zeros_like(junior_b))
            handovers = torch.where(switching & ~into_senior, senior_b, torch.full_like(senior_b, math.nan))
            into = switching & into_senior
        top_k = _uniform(self._top_k[slots_np], torch.long, device)
        top_p = _uniform(self._top_p[slots_np], torch.float32, device)
        min_p = _uniform(self._min_p[slots_np], torch.float32, device)
        mixed, kept = truncate_with_kept_mass(mixed, top_k, top_p, min_p)
        if kept is not None:  # + log Z_t: the senior's term over the whole vocabulary (side_records)
            corrections = kept if corrections is None else corrections + kept
        if inside is not None:
            corrections, handovers = add_vocabulary_mass(inside, into, corrections, handovers)
        if handovers is not None:
            self._handovers[slots, column] = handovers.float()
        if corrections is not None:
            self._corrections[slots, column] = corrections.float()
            self._written[slots] = torch.maximum(self._written[slots], column + 1)
        # Ids past the tokenizer (embedding padding) keep probability 0 in what vLLM samples from.
        if whole:
            logits[:, width:] = float("-inf")
            logits[:, :width] = mixed.to(logits.dtype)
            return
        out = torch.full((mixed.shape[0], logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=device)
        out[:, :width] = mixed.to(logits.dtype)
        logits.index_copy_(0, rows, out)

    def _penalize(self, junior: torch.Tensor, slots: torch.Tensor, length: int) -> torch.Tensor:
        """vLLM's penalties (``vllm/v1/worker/gpu/sample/penalties.py``) on the junior's logits ``[g, V]``: repetition
        over prompt and output tokens, frequency and presence over output tokens, from the first ``length`` (a host
        upper bound of the sequence length) cells of each slot's token history."""
        history = self.req_states.all_token_ids.gpu
        length = max(1, min(length, history.shape[1]))
        tokens = history[slots, :length].long()
        vocab = junior.shape[-1]
        column = torch.arange(length, device=junior.device)
        known = (column < self.req_states.total_len.gpu[slots].long().unsqueeze(1)) & (tokens < vocab) & (tokens >= 0)
        is_output = known & (column >= self.req_states.prompt_len.gpu[slots].long().unsqueeze(1))
        tokens = tokens.clamp(0, vocab - 1)
        counts = torch.zeros_like(junior).scatter_add_(1, tokens, is_output.to(junior.dtype))
        in_prompt = torch.zeros_like(junior).scatter_add_(1, tokens, (known & ~is_output).to(junior.dtype)) > 0
        repetition, frequency, presence = self._penalties[slots].unbind(1)
        seen = in_prompt | (counts > 0)
        scale = torch.where(seen, repetition.unsqueeze(1), torch.ones_like(junior))
        junior = junior * torch.where(junior > 0, 1.0 / scale, scale)
        return junior - frequency.unsqueeze(1) * counts - presence.unsqueeze(1) * (counts > 0).to(junior.dtype)
