"""The side records of the tandem logits processors (both runners:
[`processor_v1`][tandem_grpo.vllm.processor_v1], [`processor_v2`][tandem_grpo.vllm.processor_v2]), read back by the
client ([`pop_records`][tandem_grpo.vllm.side_records.pop_records], reached through the worker extension's
``collective_rpc``): per request uid, the author of each completion token the processor has advanced over, and per
position what turns vLLM's log-prob into the senior's exact score term
([`senior_token_terms`][tandem_grpo.handoff.senior_token_terms]). vLLM returns ``log P'(x_t)``, the log-probability
under the truncated mixture ``P' = P / Z_t`` on the kept tokens (``logprobs_mode="processed_logprobs"``: the
log-softmax of what the processor wrote, since vLLM's own top-k/top-p are off for tandem requests); ``Z_t`` is the
mixture mass the truncation kept (1 without truncation). The records
([`mix`][tandem_grpo.vllm.mixing.mix] computes the per-position ones):

- ``corrections[t]``: ``log Z_t``, plus ``-log p_j(B)`` where the unit may pass from the junior to the senior at ``t``
  (``B`` not every token; ``whole_unit`` only): a senior token there has ``P = p_j(B) p_s(x) / p_s(B)``, elsewhere
  ``P = p_s`` (every position under the ``after_boundary`` mode), so ``log P'(x_t) + c_t`` is the senior's term over
  the whole vocabulary, ``log p_s(x_t)`` (less ``log p_s(B)`` at such a handoff): the value the trainer's loss
  recomputes, so the engine can be checked against it token by token (``tandem_grpo.engine_check``). ``log Z_t`` is
  one ``logsumexp`` over the truncated row, taken only where truncation is on; 0 where nothing applies.
- ``handovers[t]``: ``log p_s(B)`` where the unit may pass from the senior to the junior at ``t`` (``whole_unit``
  only): the senior's whole term when the junior's token is drawn there, untruncated. ``NaN`` elsewhere.

Both models are cut to the tokenizer's ``V`` ids before mixing, while the trainer normalizes the senior over all of
its logits columns; for a checkpoint padded past the tokenizer both records also carry ``log M``, the mass the
senior's full distribution puts on the ``V`` ids ([`vocabulary_mass`][tandem_grpo.sampling.vocabulary_mass];
``M`` cancels where the senior takes a unit over, whose term is a ratio of two of its probabilities).

A record lives here, on the host, from a request's first step until it is popped; while its request is in a
processor's batch, the processor's [`LiveRecords`][tandem_grpo.vllm.side_records.LiveRecords] hold the live copy (the
runners differ only in which request a row of those tensors holds: V1, a batch row; V2, a vLLM request slot).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..handoff import HandoffRule, HandoffState, advance, init_state
from .request_args import SEED_KEY, UID_KEY, rule_from_extra_args

MAX_RECORDS = 1 << 16  # finished-but-unread requests kept before the oldest are dropped

STATE_FIELDS = ("owner", "next_owner", "unit_length", "unit_index", "unit_ended")
"""The layout of a request's rule state wherever it is stored as numbers: column ``i`` of the long state tensor
``[rows, len(STATE_FIELDS)]`` holds the [`HandoffState`][tandem_grpo.handoff.HandoffState] field (and
[`Record`][tandem_grpo.vllm.side_records.Record] attribute) ``STATE_FIELDS[i]``; ``unit_ended`` is stored as 0/1. The
coin seeds are kept apart (they never change). [`pack_state`][tandem_grpo.vllm.side_records.pack_state],
[`unpack_state`][tandem_grpo.vllm.side_records.unpack_state] and ``Record.state_row``/``set_state_row`` are its only
readers and writers."""
POSITION_RECORDS = {"corrections": 0.0, "handovers": math.nan}
"""The per-position float records (module docstring) and the value of a position that has none: the attributes of
[`Record`][tandem_grpo.vllm.side_records.Record] and the keys of what [`mix`][tandem_grpo.vllm.mixing.mix] returns."""


def add_vocabulary_mass(inside: torch.Tensor, into_senior: torch.Tensor | None, corrections, handovers):
    """The records of one step with ``log M`` (``inside``, ``[g]``) added: to ``corrections`` except where the senior
    takes a unit over (``into_senior``, ``[g]`` bool, or ``None`` under ``after_boundary``), and to ``handovers``
    (either may be ``None``: none written yet)."""
    add = inside if into_senior is None else torch.where(into_senior, torch.zeros_like(inside), inside)
    corrections = add if corrections is None else corrections + add
    return corrections, None if handovers is None else handovers + inside


def pack_state(state: HandoffState) -> torch.Tensor:
    """``state`` (``[B]`` per field) as one long tensor ``[B, len(STATE_FIELDS)]`` in the ``STATE_FIELDS`` layout."""
    return torch.stack([getattr(state, name).long() for name in STATE_FIELDS], dim=1)


def unpack_state(packed: torch.Tensor, seeds: torch.Tensor) -> HandoffState:
    """The [`HandoffState`][tandem_grpo.handoff.HandoffState] of a long ``[B, len(STATE_FIELDS)]`` tensor in the
    ``STATE_FIELDS`` layout and the coin seeds ``[B]``; the fields are column views of ``packed``
    (``unit_ended`` a bool copy)."""
    fields = {name: packed[:, i] for i, name in enumerate(STATE_FIELDS)}
    fields["unit_ended"] = fields["unit_ended"].bool()
    return HandoffState(**fields, seeds=seeds)


@dataclass
class Record:
    """Rule state and side records of one request (by uid), on the host; survives the request leaving the batch.

    While the request is in a processor's batch its state and records live in that processor's
    [`LiveRecords`][tandem_grpo.vllm.side_records.LiveRecords] and this copy is stale; it is brought up to date (in one
    batch per call) when the request leaves the batch, when its records are popped, and by the processors' ``record``.
    """

    uid: str
    seed: int
    rule: HandoffRule
    prompt_len: int
    owner: int
    next_owner: int
    unit_length: int = 0
    unit_index: int = 0
    unit_ended: bool = False
    position: int = 0  # completion tokens advanced over
    authors: list[int] = field(default_factory=list)
    corrections: list[float] = field(default_factory=list)
    handovers: list[float] = field(default_factory=list)

    def state_row(self) -> list[int]:
        """The rule state as one row in the ``STATE_FIELDS`` layout."""
        return [int(getattr(self, name)) for name in STATE_FIELDS]

    def set_state_row(self, row: Sequence[int]) -> None:
        """Set the rule state from one row in the ``STATE_FIELDS`` layout."""
        for name, value in zip(STATE_FIELDS, row, strict=True):
            setattr(self, name, bool(value) if name == "unit_ended" else int(value))

    def restart(self, kept: int = 0) -> None:
        """Back to the rule's initial state, nothing advanced over, the position records of the first ``kept``
        positions kept (host sync)."""
        self.set_state_row(pack_state(init_state(torch.tensor([self.seed]), self.rule))[0].tolist())
        self.position, self.authors = 0, []
        for name in POSITION_RECORDS:
            setattr(self, name, getattr(self, name)[:kept])


class LiveRecords:
    """The state and side records of a processor's live rows, on ``device``: ``state`` long ``[n, len(STATE_FIELDS)]``,
    ``seeds`` long ``[n]``, ``authors`` int8 ``[n, W]`` and ``positions``, one float32 ``[n, W]`` per
    [`POSITION_RECORDS`][tandem_grpo.vllm.side_records.POSITION_RECORDS] name; ``W`` (at least 16) grows by
    doubling."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.device = device
        self.state = torch.zeros(rows, len(STATE_FIELDS), dtype=torch.long, device=device)
        self.seeds = torch.zeros(rows, dtype=torch.long, device=device)
        self.authors = torch.zeros(rows, 16, dtype=torch.int8, device=device)
        self.positions = {n: torch.full_like(self.authors, f, dtype=torch.float) for n, f in POSITION_RECORDS.items()}

    @property
    def width(self) -> int:
        """``W``: the positions each row holds."""
        return self.authors.shape[1]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"state": self.state, "seeds": self.seeds, "authors": self.authors, **self.positions}

    def replace(self, tensors: dict[str, torch.Tensor]) -> None:
        """Take ``tensors`` (keyed as [`tensors`][tandem_grpo.vllm.side_records.LiveRecords.tensors]) as the rows."""
        tensors = dict(tensors)
        self.state, self.seeds, self.authors = tensors.pop("state"), tensors.pop("seeds"), tensors.pop("authors")
        self.positions = tensors

    def reserve(self, positions: int) -> None:
        """Make the record tensors at least ``positions`` columns wide (doubling; rare)."""
        width = self.width
        if positions <= width:
            return
        extra = max(positions, 2 * width) - width

        def grow(t: torch.Tensor, fill) -> torch.Tensor:
            return torch.cat([t, torch.full((t.shape[0], extra), fill, dtype=t.dtype, device=t.device)], dim=1)

        self.authors = grow(self.authors, 0)
        self.positions = {name: grow(t, POSITION_RECORDS[name]) for name, t in self.positions.items()}

    def rows_of(self, records: Sequence[Record]) -> dict[str, torch.Tensor]:
        """``records`` as rows on the device, keyed as [`tensors`][tandem_grpo.vllm.side_records.LiveRecords.tensors]
        (``[len(records), ...]``, padded to ``W`` with each record's fill; ``W`` reserved for them first)."""
        self.reserve(max(len(getattr(r, n)) for r in records for n in ("authors", *POSITION_RECORDS)) + 1)

        def padded(name: str, fill, dtype: torch.dtype) -> torch.Tensor:
            out = torch.full((len(records), self.width), fill, dtype=dtype)
            for k, record in enumerate(records):
                values = getattr(record, name)
                out[k, : len(values)] = torch.tensor(values, dtype=dtype)
            return out

        rows = {
            "state": torch.tensor([r.state_row() for r in records], dtype=torch.long).reshape(-1, len(STATE_FIELDS)),
            "seeds": torch.tensor([r.seed for r in records], dtype=torch.long),
            "authors": padded("authors", 0, torch.int8),
            **{name: padded(name, fill, torch.float32) for name, fill in POSITION_RECORDS.items()},
        }
        return {name: t.to(self.device) for name, t in rows.items()}

    def load(self, index: torch.Tensor, records: Sequence[Record]) -> None:
        """Write ``records`` into rows ``index`` (a device index ``[len(records)]``), in place."""
        for name, rows in self.rows_of(records).items():
            self.tensors()[name][index] = rows

    def state_of(self, rows: torch.Tensor | slice) -> HandoffState:
        return unpack_state(self.state[rows], self.seeds[rows])

    def advance(self, rows: torch.Tensor, columns: torch.Tensor, moved: torch.Tensor, tokens, tables, rule) -> None:
        """Advance the rule state of ``rows`` (a device index ``[g]``) over ``tokens`` ``[g]`` where ``moved`` (bool
        ``[g]``), writing each token's author at ``columns`` ``[g]``; no host sync."""
        current = self.state[rows]
        new, authors, _ = advance(unpack_state(current, self.seeds[rows]), tokens, tables, rule)
        self.state[rows] = torch.where(moved.unsqueeze(1), pack_state(new), current)
        self.authors[rows, columns] = torch.where(moved, authors.to(torch.int8), self.authors[rows, columns])

    def write(self, rows: torch.Tensor, columns: torch.Tensor, step: dict[str, torch.Tensor]) -> None:
        """Store what [`mix`][tandem_grpo.vllm.mixing.mix] returned for ``rows`` at ``columns`` (both ``[g]``)."""
        for name, values in step.items():
            self.positions[name][rows, columns] = values.float()

    def copy_out(self, index: torch.Tensor, records: Sequence[Record], position, written) -> None:
        """Copy rows ``index`` (``[k]``) into ``records`` (one host transfer per tensor): the rule state,
        ``position[i]`` tokens advanced over and their authors, the position records of the first ``written[i]``
        positions."""
        values = {name: t.index_select(0, index).tolist() for name, t in self.tensors().items() if name != "seeds"}
        for k, record in enumerate(records):
            record.set_state_row(values["state"][k])
            record.position = int(position[k])
            record.authors = values["authors"][k][: record.position]
            for name in POSITION_RECORDS:
                setattr(record, name, values[name][k][: int(written[k])])


_RECORDS: OrderedDict[str, Record] = OrderedDict()
LOCK = threading.RLock()
"""Held while records move between the processors' tensors and ``_RECORDS``."""
PROCESSORS: weakref.WeakSet = weakref.WeakSet()
"""Every live logits processor of this process, of either runner (each adds itself; anything with a
``sync_records(which)`` that copies the live rows whose [`Record`][tandem_grpo.vllm.side_records.Record]
``which(record)`` selects); ``pop_records`` copies their rows out first."""


def record_for(extra_args: dict, prompt_len: int) -> Record:
    """The record of the tandem request with these extra args: the stored one (a preempted request resuming), or a
    new one holding the rule's initial state (host sync; a request's first arrival only). Call under ``LOCK``.

    Raises:
        ValueError: bad rule fields in the extra args
            ([`rule_from_extra_args`][tandem_grpo.vllm.request_args.rule_from_extra_args]).
    """
    uid = extra_args[UID_KEY]
    record = _RECORDS.get(uid)
    if record is not None:
        _RECORDS.move_to_end(uid)
        return record
    rule = rule_from_extra_args(extra_args)
    record = Record(uid=uid, seed=int(extra_args[SEED_KEY]), rule=rule, prompt_len=prompt_len, owner=0, next_owner=0)
    record.restart()
    _RECORDS[uid] = record
    while len(_RECORDS) > MAX_RECORDS:
        _RECORDS.popitem(last=False)
    return record


def pop_records(uids: list[str]) -> dict[str, dict]:
    """Remove and return the side records of ``uids`` (JSON-ready): ``{uid: {"authors": [...], "corrections": [...],
    "handovers": [...]}}``. ``authors[t]`` in {1 senior, 0 junior} for the tokens the processor has advanced over (all
    but the last token of a finished completion); ``corrections[t]`` and ``handovers[t]`` (``None`` for no handover)
    of position ``t`` (module docstring). Unknown uids map to ``None``.

    Records of requests still in a batch are first copied out of the processors' tensors (one batch per processor).

    Raises:
        FloatingPointError: a model's logits were not finite in a step since the last check.
    """
    with LOCK:
        wanted = set(uids)
        for processor in list(PROCESSORS):
            processor.sync_records(lambda record: record.uid in wanted)
        out: dict[str, dict | None] = {}
        for uid in uids:
            record = _RECORDS.pop(uid, None)
            # None, not NaN, where a record has no value: the records travel as JSON from a server.
            out[uid] = None if record is None else {
                "authors": record.authors,
                **{n: [v if math.isfinite(v) else None for v in getattr(record, n)] for n in POSITION_RECORDS},
            }  # fmt: skip
        return out
