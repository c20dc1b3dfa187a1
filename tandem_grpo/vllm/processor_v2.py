"""The tandem logits processor of vLLM's Model Runner V2 (``vllm.v1.worker.gpu.sample.logits_processor``).

The step of the V1 processor ([`mix`][tandem_grpo.vllm.mixing.mix], the same side records), driven by vLLM's request
slots (recycled with no remove hook: a slot's records are copied out before its next occupant is written), the
previous token read from vLLM's device token history (no host sync, so async scheduling stays on), the temperature
and truncation applied here (Model Runner V2 runs custom processors before its own); no speculative decoding. How
vLLM drives it, in detail: docs/api/vllm/processor_v2.md.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor

from ..handoff import BoundaryTables, HandoffRule
from ._slot import take_junior_logits
from .mixing import StepSettings, is_tandem_engine, mix, raise_nonfinite, step_tables, uniform, write_rows
from .request_args import UID_KEY, is_tandem_request, sampling_from_params, validate_tandem_params
from .side_records import LOCK, PROCESSORS, LiveRecords, Record, record_for


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
        self.model_config = vllm_config.model_config
        self.enabled = is_tandem_engine(self.model_config)
        if self.enabled and getattr(vllm_config, "speculative_config", None) is not None:
            raise ValueError(
                "The tandem engine does not support speculative decoding: each draft row would need the junior's "
                "logits and the handoff state at its own position. Remove speculative_config."
            )
        self.req_states = req_states
        self.device = device = req_states.device
        slots = req_states.max_num_reqs
        self._tables: dict[int, BoundaryTables] = {}  # by logits width
        self._staged: list[tuple[int, SamplingParams]] = []
        # Host, per slot: the occupant, its rule (index into _rules; -1 = not a tandem request), its settings.
        self._occupants: list[Record | None] = [None] * slots
        self._slot_of: dict[str, int] = {}  # uid -> slot of its latest occupancy
        self._rules: list[HandoffRule] = []
        self._rule_id = np.full(slots, -1, dtype=np.int64)
        self._temperature = np.ones(slots, dtype=np.float32)
        self._top_k = np.zeros(slots, dtype=np.int64)
        self._top_p = np.ones(slots, dtype=np.float32)
        self._min_p = np.zeros(slots, dtype=np.float32)
        self._penalized = np.zeros(slots, dtype=bool)
        self._catch_up = np.zeros(slots, dtype=np.int64)  # tokens to advance over beyond this step's one
        # Device, per slot: rule state and records, completion tokens advanced over, record length, penalties.
        self.live = LiveRecords(slots, device)
        self._position = torch.zeros(slots, dtype=torch.long, device=device)
        self._written = torch.zeros(slots, dtype=torch.long, device=device)
        self._penalties = torch.zeros(slots, 3, dtype=torch.float32, device=device)  # repetition, frequency, presence
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
                if occupant is not None and self._slot_of.get(occupant.uid) == slot:
                    del self._slot_of[occupant.uid]
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
        tables = step_tables(self.model_config, self._tables, logits, junior_logits)
        tandem_slots = slots_np[tandem]
        prompt_np = self.req_states.prompt_len.np[tandem_slots]
        outputs_bound = np.maximum(ctx.seq_lens_upper_bound_np[tandem] - prompt_np, 0)
        self.live.reserve(int(outputs_bound.max()) + 1)
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
        """Copy the state and records of the slots whose record ``which(record)`` selects from the device into their
        [`Record`][tandem_grpo.vllm.side_records.Record], after checking the deferred non-finite flags."""
        self._sync_slots([s for s in self._slot_of.values() if which(self._occupants[s])])

    def record(self, slot: int) -> Record:
        """The up-to-date record of the tandem request in ``slot`` (host sync; for tests and debugging)."""
        with LOCK:
            self._sync_slots([slot])
        return self._occupants[slot]

    def _sync_slots(self, slots: list[int]) -> None:
        raise_nonfinite(self._nonfinite)
        slots = [s for s in slots if self._occupants[s] is not None]
        if slots:
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            position = self._position.index_select(0, index).tolist()
            written = self._written.index_select(0, index).tolist()
            self.live.copy_out(index, [self._occupants[s] for s in slots], position, written)

    def _admit(self, new: list[tuple[int, SamplingParams]]) -> None:
        """Write the state of new tandem occupants (``[(slot, params)]``) from their host records."""
        records, outputs, penalties = [], [], []
        for slot, params in new:
            record = record_for(params.extra_args, 0)
            # Output tokens already in the slot's history: a preempted request resumes with them in its prefill.
            done = int(self.req_states.prefill_len.np[slot]) - int(self.req_states.prompt_len.np[slot])
            if record.position > done:  # vLLM dropped tokens the record had advanced over: replay from the start
                record.restart(kept=done)
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
            self._occupants[slot] = record
            self._slot_of[record.uid] = slot
        self.live.reserve(max(outputs) + 1)
        device = self.device
        index = torch.tensor([slot for slot, _ in new], dtype=torch.long, device=device)
        self.live.load(index, records)
        self._position[index] = torch.tensor([r.position for r in records], dtype=torch.long, device=device)
        self._written[index] = torch.tensor([len(r.corrections) for r in records], dtype=torch.long, device=device)
        self._penalties[index] = torch.tensor(penalties, dtype=torch.float32, device=device)

    # --- the step -------------------------------------------------------------------------------------------------

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
            self.live.advance(slots, position.clamp(max=self.live.width - 1), pending, tokens, tables, rule)
            self._position[slots] = position + pending.long()
        return outputs

    def _mix(self, logits, junior_logits, tables, rule, rows, slots, slots_np, outputs, length: int) -> None:
        """[`mix`][tandem_grpo.vllm.mixing.mix] on the group's ``rows`` of ``logits``, the records stored at each
        slot's position ``outputs``; ``length``: a host upper bound of the rows' sequence lengths (for the junior's
        penalties)."""
        device = logits.device
        whole = isinstance(rows, slice)
        senior = logits if whole else logits.index_select(0, rows)
        junior = (junior_logits if whole else junior_logits.index_select(0, rows))[:, : tables.vocab_size].float()
        if self._penalized[slots_np].any():
            junior = self._penalize(junior, slots, length)
        temperature = uniform(self._temperature[slots_np], torch.float32, device)
        settings = StepSettings(temperature, temperature, uniform(self._top_k[slots_np], torch.long, device),
                                uniform(self._top_p[slots_np], torch.float32, device),
                                uniform(self._min_p[slots_np], torch.float32, device))  # fmt: skip
        mixed, records, nonfinite = mix(senior, junior, self.live.state_of(slots), tables, rule, settings)
        self._nonfinite |= nonfinite
        if records:  # the records at the position being sampled
            column = outputs.clamp(max=self.live.width - 1)
            self.live.write(slots, column, records)
            self._written[slots] = torch.maximum(self._written[slots], column + 1)
        write_rows(logits, rows, mixed)

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
