"""The tandem logits processor of vLLM's Model Runner V1 (the ``vllm.v1.sample.logits_processor`` interface).

Per request it keeps the rule state ([`HandoffState`][tandem_grpo.handoff.HandoffState]) and, every step, replaces
the request's row of the senior logits with the truncated log-probabilities of the tandem mixture ``P``
([`mix`][tandem_grpo.vllm.mixing.mix]); vLLM's sampler draws the token from that, and the token's author is a
function of the token ([`advance`][tandem_grpo.handoff.advance]). Where it sits in vLLM's sampler:
docs/api/vllm/processor_v1.md. It needs vLLM's async scheduling off
([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs] sets ``async_scheduling=False``): with it on, a request's
last sampled token can still be a placeholder (``-1``) when the processor runs, and it raises ``RuntimeError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import itemgetter

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from ..handoff import BoundaryTables, HandoffRule
from ..sampling import SamplingSettings
from ._slot import take_junior_logits
from .mixing import StepSettings, is_tandem_engine, mix, raise_nonfinite, step_tables, uniform, write_rows
from .request_args import is_tandem_request, sampling_from_params, validate_tandem_params
from .side_records import LOCK, PROCESSORS, LiveRecords, Record, record_for


@dataclass(eq=False)
class _Row:
    record: Record
    prefix: list[int]  # completion tokens vLLM moved into the prompt when it resumed a preempted request
    outputs: list[int]  # live reference to the request's output token list (vLLM appends to it)
    prompt: list[int] | None
    sampling: SamplingSettings
    senior_temperature: float  # what the senior's logits still need dividing by (vLLM applied the request's)
    frequency_penalty: float
    presence_penalty: float
    slot: int = -1  # row of the processor's LiveRecords; -1 until the batch is rebuilt with it

    def token(self, position: int) -> int:
        return self.prefix[position] if position < len(self.prefix) else self.outputs[position - len(self.prefix)]

    def has_penalties(self) -> bool:
        return self.sampling.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


@dataclass
class _Group:
    """The tandem rows of one rule, fixed until the batch changes (settings: a number where every row of the group
    has the same, so no host sync)."""

    rule: HandoffRule
    slots: torch.Tensor  # rows of the LiveRecords
    batch_index: torch.Tensor  # rows of the logits
    settings: StepSettings
    penalized: list[_Row] | None  # the group's rows, where some carry penalties


class TandemLogitsProcessor(LogitsProcessor):
    """Turns each tandem request's senior logits into the tandem mixture's log-probabilities (module docstring).

    Constructed by vLLM in every worker: ``(vllm_config, device, is_pin_memory)``. Inactive (a no-op) on engines
    whose model is not ``TandemForCausalLM``.

    The rule state and side records of the tandem rows live on ``device``
    ([`LiveRecords`][tandem_grpo.vllm.side_records.LiveRecords], one row per tandem request, in batch order). Python
    work per request happens only when the batch changes
    ([`update_state`][tandem_grpo.vllm.processor_v1.TandemLogitsProcessor.update_state]: rows gathered into the new
    order, records of departed requests copied out in one batch) and on rare steps (a resumed request catching up over
    several tokens, penalties). A plain step reads the lengths of vLLM's output lists and their last tokens on the
    host (vLLM's V1 runner keeps token history only there), copies those to the device and does the rest there: no
    host sync.

    Args:
        vllm_config: the engine's config; its model's architecture decides whether the processor is active.
        device: the worker's device.
        is_pin_memory: part of vLLM's constructor interface; not used.
    """

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.model_config = vllm_config.model_config
        self.enabled = is_tandem_engine(self.model_config)
        self.device = device
        self.rows: dict[int, _Row] = {}
        self._tables: dict[int, BoundaryTables] = {}  # by logits width
        self._live: list[_Row] = []  # the tandem rows in batch order; row.slot indexes self.live
        self._outputs: list[list[int]] = []
        self._batch_rows = np.zeros(0, dtype=np.int64)
        self._prefix_len = np.zeros(0, dtype=np.int64)
        self._position = np.zeros(0, dtype=np.int64)  # completion tokens advanced over, per slot
        self._written = np.zeros(0, dtype=np.int64)  # length of the position records, per slot
        self._groups: list[_Group] = []
        self.live = LiveRecords(0, device)
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
        needs = " with the V1 model runner and no speculative decoding"
        tables = step_tables(self.model_config, self._tables, logits, junior_logits, needs)
        num_tokens = self._prefix_len + np.fromiter(map(len, self._outputs), dtype=np.int64, count=len(self._live))
        self.live.reserve(int(num_tokens.max()) + 1)
        self._catch_up(num_tokens, tables)
        columns = torch.from_numpy(num_tokens).to(self.device, non_blocking=True)
        for group in self._groups:
            junior = junior_logits.index_select(0, group.batch_index)[:, : tables.vocab_size].float()
            if group.penalized is not None:
                junior = self._penalize(junior, group.penalized)
            senior = logits.index_select(0, group.batch_index)
            state = self.live.state_of(group.slots)
            mixed, records, nonfinite = mix(senior, junior, state, tables, group.rule, group.settings)
            self._nonfinite |= nonfinite
            self.live.write(group.slots, columns[group.slots], records)
            write_rows(logits, group.batch_index, mixed)
        np.maximum(self._written, num_tokens + 1, out=self._written)
        return logits

    def record(self, batch_row: int) -> Record:
        """The up-to-date record of the tandem request in ``batch_row`` (host sync; for tests and debugging)."""
        record = self.rows[batch_row].record
        with LOCK:
            self.sync_records(lambda r: r is record)
        return record

    def sync_records(self, which) -> None:
        """Copy the state and records of the live rows whose record ``which(record)`` selects from the device into
        their [`Record`][tandem_grpo.vllm.side_records.Record], after checking the deferred non-finite flags."""
        raise_nonfinite(self._nonfinite)
        rows = [row for row in self._live if which(row.record)]
        if rows:
            slots = [row.slot for row in rows]
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            self.live.copy_out(index, [row.record for row in rows], self._position[slots], self._written[slots])

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

    def _rebuild(self) -> None:
        """Lay the tensors out for the batch in ``self.rows``: rows that stay are gathered from the old tensors,
        new rows loaded from their records, departed rows' records copied out first."""
        live = [row for _, row in sorted(self.rows.items())]
        staying = {id(row.record) for row in live}
        self.sync_records(lambda record: id(record) not in staying)
        old = len(self._live)
        kept = {id(r) for r in self._live}
        new_rows = [row for row in live if row.slot < 0 or id(row) not in kept]
        fresh = {id(row): old + k for k, row in enumerate(new_rows)}
        source = torch.tensor([fresh.get(id(row), row.slot) for row in live], dtype=torch.long, device=self.device)
        records = [row.record for row in new_rows]
        if records:
            added = self.live.rows_of(records)
            grown = {name: torch.cat([t, added[name]]) for name, t in self.live.tensors().items()}
        else:
            grown = self.live.tensors()
        self.live.replace({name: t.index_select(0, source) for name, t in grown.items()})
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
                    slots=torch.tensor(slots, dtype=torch.long, device=device),
                    batch_index=torch.tensor(self._batch_rows[slots], dtype=torch.long, device=device),
                    settings=StepSettings(
                        uniform([r.senior_temperature for r in rows], torch.float32, device),
                        uniform([s.temperature for s in settings], torch.float32, device),
                        uniform([s.top_k for s in settings], torch.long, device),
                        uniform([s.top_p for s in settings], torch.float32, device),
                        uniform([s.min_p for s in settings], torch.float32, device),
                    ),
                    penalized=rows if any(row.has_penalties() for row in rows) else None,
                )
            )
        return groups

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
            device = self.device
            tokens_d = torch.from_numpy(tokens).to(device, non_blocking=True)
            pending_d = torch.from_numpy(pending).to(device, non_blocking=True)
            positions = torch.from_numpy(self._position).to(device, non_blocking=True)
            for group in self._groups:
                slots = group.slots
                self.live.advance(slots, positions[slots], pending_d[slots], tokens_d[slots], tables, group.rule)
            self._position += pending

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
