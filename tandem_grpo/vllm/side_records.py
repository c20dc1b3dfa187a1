"""The tandem logits processor's side records, read back by the client
([`pop_records`][tandem_grpo.vllm.side_records.pop_records], reached through the worker extension's
``collective_rpc``): per request uid, the author of each completion token the processor has advanced
over, and per position what turns vLLM's log-prob into the senior's exact score term
([`senior_token_terms`][tandem_grpo.handoff.senior_token_terms]). vLLM returns ``log P'(x_t)``, the log-probability
under the truncated mixture ``P' = P / Z_t`` on the kept tokens (``logprobs_mode="processed_logprobs"``: the
log-softmax of what the processor wrote, since vLLM's own top-k/top-p are off for tandem requests); ``Z_t`` is the
mixture mass the truncation kept (1 without truncation). The records:

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
processor's batch, the processor's tensors hold the live copy.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..handoff import HandoffRule, HandoffState, init_state
from .request_args import SEED_KEY, UID_KEY, rule_from_extra_args

MAX_RECORDS = 1 << 16  # finished-but-unread requests kept before the oldest are dropped

STATE_FIELDS = ("owner", "next_owner", "unit_length", "unit_index", "unit_ended")
"""The layout of a request's rule state wherever it is stored as numbers: column ``i`` of the processor's long
state tensor ``[rows, len(STATE_FIELDS)]`` holds the [`HandoffState`][tandem_grpo.handoff.HandoffState] field (and
``_Record`` attribute) ``STATE_FIELDS[i]``; ``unit_ended`` is stored as 0/1. The coin seeds are kept apart (they
never change). [`pack_state`][tandem_grpo.vllm.side_records.pack_state],
[`unpack_state`][tandem_grpo.vllm.side_records.unpack_state] and ``_Record.state_row``/``set_state_row`` are its only
readers and writers."""


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
class _Record:
    """Rule state and side records of one request (by uid), on the host; survives the request leaving the batch.

    While the request is in a processor's batch its state and records live in that processor's tensors and this
    copy is stale; it is brought up to date (in one batch per call) when the request leaves the batch, when its
    records are popped, and by [`record`][tandem_grpo.vllm.processor.TandemLogitsProcessor.record].
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


_RECORDS: OrderedDict[str, _Record] = OrderedDict()
LOCK = threading.RLock()
"""Held while records move between the processors' tensors and ``_RECORDS``."""
PROCESSORS: weakref.WeakSet = weakref.WeakSet()
"""Every live [`TandemLogitsProcessor`][tandem_grpo.vllm.processor.TandemLogitsProcessor] of this process (each adds
itself; anything with its ``sync_records(which)``); ``pop_records`` copies their rows out first."""


def record_for(extra_args: dict, prompt_len: int) -> _Record:
    """The record of the tandem request with these extra args: the stored one (a preempted request resuming), or a
    new one holding the rule's initial state (host sync; a request's first arrival only). Call under ``LOCK``."""
    uid = extra_args[UID_KEY]
    record = _RECORDS.get(uid)
    if record is not None:
        _RECORDS.move_to_end(uid)
        return record
    rule = rule_from_extra_args(extra_args)
    seed = int(extra_args[SEED_KEY])
    record = _Record(uid=uid, seed=seed, rule=rule, prompt_len=prompt_len, owner=0, next_owner=0)
    record.set_state_row(pack_state(init_state(torch.tensor([seed]), rule))[0].tolist())
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
            processor.sync_records(lambda row: row.record.uid in wanted)
        out: dict[str, dict | None] = {}
        for uid in uids:
            record = _RECORDS.pop(uid, None)
            out[uid] = (
                None
                if record is None
                else {
                    "authors": record.authors,
                    "corrections": record.corrections,
                    # None, not NaN, where there is none: the records travel as JSON from a server.
                    "handovers": [v if math.isfinite(v) else None for v in record.handovers],
                }
            )
        return out
