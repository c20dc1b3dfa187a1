"""The tandem logits processor (vLLM v1 ``LogitsProcessor`` interface, V1 model runner).

Per request it keeps the rule state ([`HandoffState`][tandem_grpo.handoff.HandoffState]) and, every step, replaces
the request's row of the senior logits with the log probabilities of the tandem mixture ``P``
([`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs]), truncated. vLLM's sampler then draws the token from that;
the token's author is a function of the token ([`advance`][tandem_grpo.handoff.advance]), so nothing else has to be
decided here.

Where it sits in vLLM's sampler (``vllm/v1/sample/sampler.py``, vLLM 0.32): the processor declares itself
argmax-invariant, so it runs *after* vLLM has applied the penalties and the request's temperature to the senior's
logits and *before* vLLM's top-k/top-p. Tandem requests are sent at temperature 1 with their real temperature in
their extra args ([`tandem_grpo.vllm.request_args`][tandem_grpo.vllm.request_args]); the processor divides the
senior's logits by that (by its ratio to the request's temperature, 1 for a request of the older form), applies the
same penalties and temperature to the junior's logits (taken from ``tandem_grpo.vllm._slot``), mixes, and truncates
the mixture itself with
[`truncate_logprobs`][tandem_grpo.sampling.truncate_logprobs] (top-k, then top-p, then min-p): the same function, in
the same order, as the transformers path. Tandem requests therefore carry their truncation in their extra args and
must sample ([`tandem_grpo.vllm.request_args`][tandem_grpo.vllm.request_args] says what makes a request a tandem
request and what it may not ask for).

Both models' logits are cut to the ``V`` ids of the boundary tables (the tokenizer's length, see
[`BoundaryTables.from_tokenizer`][tandem_grpo.handoff.BoundaryTables.from_tokenizer]) before mixing; columns past ``V``
(embedding padding of either checkpoint) get probability 0, so a junior whose logits are wider or narrower than the
senior's (down to ``V``) mixes correctly and vLLM's sampler never draws an id the tokenizer does not know.

The processor needs vLLM's async scheduling off ([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs] sets
``async_scheduling=False``): with it on, a request's last sampled token can still be a placeholder (``-1``) when
the processor runs, and the rule state would be one token behind; the processor raises instead.

The authorship and score records the processor keeps per request are described in
[`tandem_grpo.vllm.side_records`][tandem_grpo.vllm.side_records].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from ..handoff import (
    SENIOR,
    BoundaryTables,
    HandoffRule,
    HandoffState,
    advance,
    boundary_mask,
    handoff_rows,
    mixture_logprobs,
    nonfinite_flags,
    raise_nonfinite,
)
from ..sampling import SamplingSettings, truncate_with_kept_mass, vocabulary_mass
from ._compat import ARCHITECTURE
from ._slot import take_junior_logits
from ._tables import engine_boundary_tables
from .request_args import is_tandem_request, sampling_from_params, validate_tandem_params
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
class _Row:
    record: _Record
    prefix: list[int]  # completion tokens vLLM moved into the prompt when it resumed a preempted request
    outputs: list[int]  # live reference to the request's output token list (vLLM appends to it)
    prompt: list[int] | None
    sampling: SamplingSettings
    senior_temperature: float  # what the senior's logits still need dividing by (vLLM applied the request's)
    frequency_penalty: float
    presence_penalty: float
    slot: int = -1  # row of the processor's state tensors; -1 until the batch is rebuilt with it

    def token(self, position: int) -> int:
        return self.prefix[position] if position < len(self.prefix) else self.outputs[position - len(self.prefix)]

    def has_penalties(self) -> bool:
        return self.sampling.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


@dataclass
class _Group:
    """The tandem rows of one rule, fixed until the batch changes."""

    rule: HandoffRule
    slots: torch.Tensor | slice  # rows of the state tensors (a slice when the group is every tandem row)
    batch_index: torch.Tensor  # rows of the logits
    temperature: torch.Tensor  # [g, 1]
    senior_temperature: float | torch.Tensor  # a number, or [g, 1]
    top_k: int | torch.Tensor  # a number where every row of the group has the same setting (no host sync)
    top_p: float | torch.Tensor
    min_p: float | torch.Tensor
    penalized: list[_Row] | None  # the group's rows, where some carry penalties


def _uniform(values: list, dtype: torch.dtype, device: torch.device):
    """One Python number when every row has the same value, else a per-row tensor."""
    return values[0] if len(set(values)) == 1 else torch.tensor(values, dtype=dtype, device=device)


def _column(value):
    """A per-row tensor as ``[g, 1]`` (to scale rows of logits); a number unchanged."""
    return value.unsqueeze(1) if isinstance(value, torch.Tensor) else float(value)


class TandemLogitsProcessor(LogitsProcessor):
    """Turns each tandem request's senior logits into the tandem mixture's log-probabilities (module docstring).

    Constructed by vLLM in every worker: ``(vllm_config, device, is_pin_memory)``. Inactive (a no-op) on engines
    whose model is not ``TandemForCausalLM``.

    The rule state of the tandem rows lives in tensors on ``device`` (one row per tandem request, in batch order),
    and so do the side records (authors, corrections, handovers per position). Python work per request happens only
    when the batch changes ([`update_state`][tandem_grpo.vllm.processor.TandemLogitsProcessor.update_state]: rows
    gathered into the new order, records of departed requests copied out in one batch) and on rare steps (a resumed
    request catching up over several tokens, penalties). A plain step reads the lengths of vLLM's output lists and
    their last tokens on the host (vLLM's V1 runner keeps token history only there), copies those to the device and
    does the rest there: no host sync.

    Args:
        vllm_config: the engine's config; its model's architecture decides whether the processor is active.
        device: the worker's device.
        is_pin_memory: part of vLLM's constructor interface; not used.
    """

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        model_config = vllm_config.model_config
        self.enabled = ARCHITECTURE in (getattr(model_config.hf_config, "architectures", None) or [])
        self.model_config = model_config
        self.device = device
        self.rows: dict[int, _Row] = {}
        self._tables: dict[int, tuple[BoundaryTables, BoundaryTables]] = {}  # by logits width
        self._live: list[_Row] = []  # the tandem rows in batch order; row.slot indexes the tensors below
        self._outputs: list[list[int]] = []
        self._batch_rows = np.zeros(0, dtype=np.int64)
        self._prefix_len = np.zeros(0, dtype=np.int64)
        self._position = np.zeros(0, dtype=np.int64)  # completion tokens advanced over, per slot
        self._written = np.zeros(0, dtype=np.int64)  # length of the correction/handover records, per slot
        self._groups: list[_Group] = []
        self._state = torch.zeros(0, len(STATE_FIELDS), dtype=torch.long, device=device)
        self._seeds = torch.zeros(0, dtype=torch.long, device=device)
        self._authors = torch.zeros(0, 0, dtype=torch.int8, device=device)
        self._corrections = torch.zeros(0, 0, dtype=torch.float32, device=device)
        self._handovers = torch.zeros(0, 0, dtype=torch.float32, device=device)
        self._nonfinite = torch.zeros(2, dtype=torch.bool, device=device)
        PROCESSORS.add(self)

    # --- vLLM interface -------------------------------------------------------------------------------------------

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """[`validate_tandem_params`][tandem_grpo.vllm.request_args.validate_tandem_params] (vLLM's API process)."""
        validate_tandem_params(params)

    def is_argmax_invariant(self) -> bool:
        # Not literally true; the flag places the processor after penalties/temperature and before top-k/top-p,
        # which is where the mixture belongs. It also means greedy rows skip it, which validate_params forbids.
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Per-batch bookkeeping, only when the batch changed: the tensors are rebuilt in the new row order and the
        records of requests that left are copied out.

        Raises:
            FloatingPointError: a model's logits were not finite in a step since the last check.
        """
        if self.enabled and process_dict_updates(self.rows, batch_update, self._new_row):
            with LOCK:
                self._rebuild()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        junior_logits = take_junior_logits() if self.enabled else None
        if not self.rows:
            return logits
        tables, _ = self._boundary_tables(logits.shape[-1], logits.device)
        if (
            junior_logits is None
            or junior_logits.shape[0] != logits.shape[0]
            or junior_logits.shape[-1] < tables.vocab_size
        ):
            got = None if junior_logits is None else tuple(junior_logits.shape)
            raise RuntimeError(
                f"Tandem rows need the junior's logits of this step ({logits.shape[0]} rows, at least "
                f"{tables.vocab_size} columns; got {got}): the engine must run {ARCHITECTURE} with the V1 model "
                "runner and no speculative decoding."
            )
        num_tokens = self._prefix_len + np.fromiter(map(len, self._outputs), dtype=np.int64, count=len(self._live))
        self._reserve(int(num_tokens.max()) + 1)
        self._catch_up(num_tokens, tables)
        for group in self._groups:
            self._mix(logits, junior_logits, tables, group, num_tokens)
        np.maximum(self._written, num_tokens + 1, out=self._written)
        return logits

    def record(self, batch_row: int) -> _Record:
        """The up-to-date record of the tandem request in ``batch_row`` (host sync; for tests and debugging)."""
        row = self.rows[batch_row]
        with LOCK:
            self.sync_records(lambda r: r is row)
        return row.record

    # --- internals ------------------------------------------------------------------------------------------------

    def _new_row(self, params: SamplingParams, prompt: list[int] | None, outputs: list[int]) -> _Row | None:
        if not is_tandem_request(params):
            return None
        with LOCK:
            record = record_for(params.extra_args, len(prompt or []))
        prefix = list(prompt[record.prompt_len :]) if prompt is not None else []
        return _Row(
            record=record,
            prefix=prefix,
            outputs=outputs,
            prompt=prompt,
            sampling=(sampling := sampling_from_params(params)),
            senior_temperature=sampling.temperature / float(params.temperature),
            frequency_penalty=float(params.frequency_penalty),
            presence_penalty=float(params.presence_penalty),
        )

    def sync_records(self, which) -> None:
        """Copy the state and records of the live rows ``which(row)`` selects from the tensors into their
        ``_Record`` (one host transfer per tensor), after checking the deferred non-finite flags."""
        raise_nonfinite(self._nonfinite)
        rows = [row for row in self._live if which(row)]
        if not rows:
            return
        slots = torch.tensor([row.slot for row in rows], dtype=torch.long, device=self.device)
        state = self._state.index_select(0, slots).tolist()
        authors = self._authors.index_select(0, slots).tolist()
        corrections = self._corrections.index_select(0, slots).tolist()
        handovers = self._handovers.index_select(0, slots).tolist()
        for k, row in enumerate(rows):
            record = row.record
            record.set_state_row(state[k])
            record.position = int(self._position[row.slot])
            written = int(self._written[row.slot])
            record.authors = authors[k][: record.position]
            record.corrections = corrections[k][:written]
            record.handovers = handovers[k][:written]

    def _rebuild(self) -> None:
        """Lay the tensors out for the batch in ``self.rows``: rows that stay are gathered from the old tensors,
        new rows loaded from their records, departed rows' records copied out first."""
        live = [row for _, row in sorted(self.rows.items())]
        staying = {id(row) for row in live}
        self.sync_records(lambda row: id(row) not in staying)
        old = len(self._live)
        new_rows = [row for row in live if row.slot < 0 or id(row) not in {id(r) for r in self._live}]
        width = max([self._authors.shape[1], 16] + [len(r.record.corrections) + 1 for r in new_rows])
        self._reserve(width)
        width = self._authors.shape[1]

        def padded(values: list, fill, dtype) -> torch.Tensor:
            out = torch.full((len(new_rows), width), fill, dtype=dtype)
            for k, v in enumerate(values):
                out[k, : len(v)] = torch.tensor(v, dtype=dtype)
            return out.to(self.device)

        fresh = {id(row): old + k for k, row in enumerate(new_rows)}
        source = torch.tensor([fresh.get(id(row), row.slot) for row in live], dtype=torch.long, device=self.device)
        records = [row.record for row in new_rows]
        new_state = torch.tensor([r.state_row() for r in records], dtype=torch.long).reshape(
            len(records), len(STATE_FIELDS)
        )
        self._state = torch.cat([self._state, new_state.to(self.device)]).index_select(0, source)
        seeds = torch.tensor([r.seed for r in records], dtype=torch.long, device=self.device)
        self._seeds = torch.cat([self._seeds, seeds]).index_select(0, source)
        self._authors = torch.cat([self._authors, padded([r.authors for r in records], 0, torch.int8)]).index_select(
            0, source
        )
        self._corrections = torch.cat(
            [self._corrections, padded([r.corrections for r in records], 0.0, torch.float32)]
        ).index_select(0, source)
        self._handovers = torch.cat(
            [self._handovers, padded([r.handovers for r in records], math.nan, torch.float32)]
        ).index_select(0, source)
        position = np.concatenate([self._position, [r.position for r in records]]).astype(np.int64)
        written = np.concatenate([self._written, [len(r.corrections) for r in records]]).astype(np.int64)
        source_np = source.cpu().numpy()
        self._position, self._written = position[source_np], written[source_np]
        for slot, row in enumerate(live):
            row.slot = slot
        self._live = live
        self._outputs = [row.outputs for row in live]
        self._batch_rows = np.array(sorted(self.rows), dtype=np.int64)
        self._prefix_len = np.array([len(row.prefix) for row in live], dtype=np.int64)
        self._groups = self._build_groups()

    def _build_groups(self) -> list[_Group]:
        by_rule: dict[HandoffRule, list[int]] = {}
        for slot, row in enumerate(self._live):
            by_rule.setdefault(row.record.rule, []).append(slot)
        groups = []
        device = self.device
        for rule, slots in by_rule.items():
            rows = [self._live[s] for s in slots]
            settings = [row.sampling for row in rows]
            groups.append(
                _Group(
                    rule=rule,
                    slots=slice(None) if len(by_rule) == 1 else torch.tensor(slots, dtype=torch.long, device=device),
                    batch_index=torch.tensor(self._batch_rows[slots], dtype=torch.long, device=device),
                    temperature=torch.tensor(
                        [s.temperature for s in settings], dtype=torch.float32, device=device
                    ).unsqueeze(1),
                    senior_temperature=_column(_uniform([r.senior_temperature for r in rows], torch.float32, device)),
                    top_k=_uniform([s.top_k for s in settings], torch.long, device),
                    top_p=_uniform([s.top_p for s in settings], torch.float32, device),
                    min_p=_uniform([s.min_p for s in settings], torch.float32, device),
                    penalized=rows if any(row.has_penalties() for row in rows) else None,
                )
            )
        return groups

    def _reserve(self, positions: int) -> None:
        """Make the record tensors at least ``positions`` columns wide (doubling; rare)."""
        width = self._authors.shape[1]
        if positions <= width:
            return
        grown = max(positions, 2 * width)
        extra = grown - width
        rows = self._authors.shape[0]

        def grow(t: torch.Tensor, fill) -> torch.Tensor:
            return torch.cat([t, torch.full((rows, extra), fill, dtype=t.dtype, device=t.device)], dim=1)

        self._authors = grow(self._authors, 0)
        self._corrections = grow(self._corrections, 0.0)
        self._handovers = grow(self._handovers, math.nan)

    def _boundary_tables(self, vocab_size: int, device: torch.device) -> tuple[BoundaryTables, BoundaryTables]:
        return engine_boundary_tables(self.model_config, self._tables, vocab_size, device)

    def _handoff_state(self, slots: torch.Tensor | slice) -> HandoffState:
        return unpack_state(self._state[slots], self._seeds[slots])

    def _catch_up(self, num_tokens: np.ndarray, tables: BoundaryTables) -> None:
        """Advance each request's rule state over the tokens vLLM sampled since the last step (normally one, the
        last of its output list: read on the host with no Python loop; a resumed request's several tokens take the
        slow path).

        Raises:
            RuntimeError: a token not sampled yet (vLLM's async-scheduling placeholder ``-1``): the state would be
                one token behind, so the mixture of this step would use the wrong owner and boundary set.
        """
        while True:
            pending = num_tokens > self._position
            if not pending.any():
                return
            if (num_tokens - self._position).max() == 1 and not (pending & (self._position < self._prefix_len)).any():
                tokens = np.zeros(len(self._live), dtype=np.int64)
                tokens[pending] = list(map(itemgetter(-1), compress(self._outputs, pending)))
            else:  # a resumed request catching up over its prefix: one token per row per round
                tokens = np.array(
                    [row.token(int(self._position[s])) if pending[s] else 0 for s, row in enumerate(self._live)],
                    dtype=np.int64,
                )
            if (tokens < 0).any():
                raise RuntimeError(
                    f"Batch rows {self._batch_rows[tokens < 0].tolist()} hold a placeholder token (-1) where the last "
                    "sampled token should be: vLLM's async scheduling is on. The tandem logits processor needs every "
                    "sampled token before the next step; build the engine with "
                    "tandem_grpo.vllm.engine.engine_kwargs() (it sets async_scheduling=False) or pass "
                    "--no-async-scheduling to the server."
                )
            self._advance(torch.from_numpy(tokens), torch.from_numpy(pending), tables)
            self._position += pending

    def _advance(self, tokens: torch.Tensor, pending: torch.Tensor, tables: BoundaryTables) -> None:
        device = self.device
        tokens = tokens.to(device, non_blocking=True)
        pending = pending.to(device, non_blocking=True)
        positions = torch.from_numpy(self._position).to(device, non_blocking=True)
        for group in self._groups:
            slots = group.slots
            state = self._handoff_state(slots)
            new, authors, _ = advance(state, tokens[slots], tables, group.rule)
            moved = pending[slots]
            packed = pack_state(new)
            self._state[slots] = torch.where(moved.unsqueeze(1), packed, self._state[slots])
            rows = torch.arange(len(self._live), device=device)[slots]
            cols = positions[slots]
            self._authors[rows, cols] = torch.where(moved, authors.to(torch.int8), self._authors[rows, cols])

    def _mix(
        self,
        logits: torch.Tensor,
        junior_logits: torch.Tensor,
        tables: BoundaryTables,
        group: _Group,
        num_tokens: np.ndarray,
    ) -> None:
        device = logits.device
        width = tables.vocab_size
        index = group.batch_index
        rule = group.rule
        state = self._handoff_state(group.slots)
        senior = logits.index_select(0, index)
        if not isinstance(group.senior_temperature, float) or group.senior_temperature != 1.0:
            senior = senior / group.senior_temperature
        inside = vocabulary_mass(senior, width)  # log M on a checkpoint padded past the tokenizer (side_records)
        senior_lp = torch.log_softmax(senior[:, :width], dim=-1)
        junior = junior_logits.index_select(0, index)[:, :width].float()
        if group.penalized is not None:
            junior = self._penalize(junior, group.penalized)
        junior_lp = torch.log_softmax(junior / group.temperature, dim=-1)
        self._nonfinite |= nonfinite_flags(senior_lp, junior_lp)
        boundary = boundary_mask(state, tables, rule)
        whole_unit = rule.mode == "whole_unit"
        sync = "masked" if whole_unit else "none"
        mixed = mixture_logprobs(senior_lp, junior_lp, state, boundary, sync_strategy=sync)

        corrections, cells, handovers, into = None, None, None, None
        if whole_unit:
            # Rows where B is a proper subset and the owner may change: there the senior's term differs from vLLM's
            # log P (module docstring). Under "after_boundary" there are none: the records keep their 0 / NaN.
            switching = handoff_rows(state, boundary)
            neg_inf = torch.tensor(float("-inf"), dtype=senior_lp.dtype, device=device)
            senior_b = torch.logsumexp(torch.where(boundary, senior_lp, neg_inf), dim=-1)
            junior_b = torch.logsumexp(torch.where(boundary, junior_lp, neg_inf), dim=-1)
            into_senior = switching & (state.next_owner == SENIOR)
            zero = torch.zeros_like(junior_b)
            corrections = torch.where(into_senior & torch.isfinite(junior_b), -junior_b, zero)
            handovers = torch.where(switching & ~into_senior, senior_b, torch.full_like(senior_b, math.nan))
            into = switching & into_senior

        mixed, kept = truncate_with_kept_mass(mixed, group.top_k, group.top_p, group.min_p)
        if kept is not None:  # + log Z_t: the senior's term over the whole vocabulary (side_records)
            corrections = kept if corrections is None else corrections + kept
        if inside is not None:
            corrections, handovers = add_vocabulary_mass(inside, into, corrections, handovers)
        if handovers is not None:
            cells = self._cells(group, num_tokens)
            self._handovers[cells] = handovers.float()
        if corrections is not None:
            self._corrections[cells or self._cells(group, num_tokens)] = corrections.float()
        # Ids past the tokenizer (embedding padding) keep probability 0 in what vLLM samples from.
        out = torch.full((index.shape[0], logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=device)
        out[:, :width] = mixed.to(logits.dtype)
        logits.index_copy_(0, index, out)

    def _cells(self, group: _Group, num_tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, columns)`` of the group's record cells at the positions being sampled."""
        rows = torch.arange(len(self._live), device=self.device)[group.slots]
        return rows, torch.from_numpy(num_tokens).to(self.device, non_blocking=True)[group.slots]

    @staticmethod
    def _penalize(junior: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """vLLM's penalties (``vllm/model_executor/layers/utils.py::apply_penalties``) on the junior's logits:
        repetition over prompt and output tokens, frequency and presence over output tokens."""
        vocab = junior.shape[-1]
        for k, row in enumerate(rows):
            if not row.has_penalties():
                continue
            outputs = torch.tensor([t for t in row.outputs if 0 <= t < vocab], dtype=torch.long, device=junior.device)
            counts = torch.bincount(outputs, minlength=vocab)[:vocab].to(junior.dtype)
            output_mask = counts > 0
            penalty = row.sampling.repetition_penalty
            if penalty != 1.0:
                seen = output_mask.clone()
                prompt = [t for t in (row.prompt or []) if 0 <= t < vocab]
                if prompt:
                    seen[torch.tensor(prompt, dtype=torch.long, device=junior.device)] = True
                scale = torch.where(junior[k] > 0, 1.0 / penalty, penalty)
                junior[k] = torch.where(seen, junior[k] * scale, junior[k])
            junior[k] -= row.frequency_penalty * counts + row.presence_penalty * output_mask.to(junior.dtype)
        return junior
