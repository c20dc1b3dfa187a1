"""The tandem logits processor (vLLM v1 ``LogitsProcessor`` interface, V1 model runner).

Per request it keeps the handoff-rule state of [`tandem_grpo.handoff`][tandem_grpo.handoff] (owner, pre-drawn next
owner, unit length, unit index, sentence flag, coin seed) and, every step, replaces the request's row of the senior
logits with the log probabilities of the tandem mixture ``P``
([`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs]), truncated. vLLM's sampler then draws the token from that;
the token's author is a function of the token ([`advance`][tandem_grpo.handoff.advance]), so nothing else has to be
decided here.

Where it sits in vLLM's sampler (``vllm/v1/sample/sampler.py``, vLLM 0.32): the processor declares itself
argmax-invariant, so it runs *after* vLLM has applied the penalties and the temperature to the senior's logits and
*before* vLLM's top-k/top-p. It applies the same penalties and temperature to the junior's logits (taken from
``tandem_grpo.vllm._slot``), mixes, and truncates the mixture itself with
[`truncate_logprobs`][tandem_grpo.sampling.truncate_logprobs] (top-k, then top-p, then min-p): the same function, in
the same order, as the transformers path. Tandem requests therefore carry ``top_k``/``top_p``/``min_p`` in their extra
args ([`tandem_extra_args`][tandem_grpo.vllm.processor.tandem_extra_args]) and send vLLM's own
``top_k``/``top_p``/``min_p`` turned off (vLLM would apply min-p before this processor and top-k/top-p after it,
another order). Greedy requests never reach argmax-invariant processors, so tandem requests must sample
(``temperature > 0``);
[`TandemLogitsProcessor.validate_params`][tandem_grpo.vllm.processor.TandemLogitsProcessor.validate_params] enforces
that and the other limits.

Both models' logits are cut to the ``V`` ids of the boundary tables (the tokenizer's length, see
[`BoundaryTables.from_tokenizer`][tandem_grpo.handoff.BoundaryTables.from_tokenizer]) before mixing; columns past ``V``
(embedding padding of either checkpoint) get probability 0, so a junior whose logits are wider or narrower than the
senior's (down to ``V``) mixes correctly and vLLM's sampler never draws an id the tokenizer does not know.

The processor needs vLLM's async scheduling off ([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs] sets
``async_scheduling=False``): with it on, a request's last sampled token can still be a placeholder (``-1``) when
the processor runs, and the rule state would be one token behind; the processor raises instead.

Requests opt in through ``SamplingParams.extra_args``
([`tandem_extra_args`][tandem_grpo.vllm.processor.tandem_extra_args]); other requests in the same batch are left
untouched (plain senior sampling), which is how the tests compare tandem with solo generation in one engine.

Side records, read back by the client ([`pop_records`][tandem_grpo.vllm.processor.pop_records], reached through the
worker extension's ``collective_rpc``): per request uid, the author of each completion token the processor has advanced
over, and per position what turns vLLM's log-prob into the senior's exact score term
([`senior_token_terms`][tandem_grpo.handoff.senior_token_terms]). vLLM returns ``log P'(x_t)``, the log-probability
under the truncated mixture ``P' = P / Z_t`` on the kept tokens (``logprobs_mode="processed_logprobs"``: the
log-softmax of what this processor wrote, since vLLM's own top-k/top-p are off for tandem requests); ``Z_t`` is the
mixture mass the truncation kept (1 without truncation). The records:

- ``corrections[t]``: ``-log p_j(B)`` where the unit may pass from the junior to the senior at ``t`` (``B`` not every
  token; ``whole_unit`` only): a senior token there has ``P = p_j(B) p_s(x) / p_s(B)``, so
  ``log P'(x_t) + c_t = log p_s(x_t) - log p_s(B) - log Z_t``, the senior's term. 0 elsewhere, where a senior token has
  ``P = p_s`` (every position of ``after_boundary``).
- ``handovers[t]``: ``log p_s(B)`` where the unit may pass from the senior to the junior at ``t`` (``whole_unit``
  only): the senior's whole term when the junior's token is drawn there. ``NaN`` elsewhere. It carries no
  ``- log Z_t``: under truncation (top-k/top-p/min-p; off by default) TRL's importance ratio at these positions
  compares the senior's untruncated boundary mass.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

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
    init_state,
    mixture_logprobs,
    validate_rule_fields,
)
from ..sampling import SamplingSettings, truncate_logprobs
from ._compat import ARCHITECTURE
from ._slot import take_junior_logits

SEED_KEY = "tandem_seed"
UID_KEY = "tandem_uid"
GRANULARITY_KEY = "tandem_granularity"
PROBABILITY_KEY = "tandem_junior_probability"
MAX_GAP_KEY = "tandem_max_gap_tokens"
MODE_KEY = "tandem_handoff_mode"
TOP_K_KEY = "tandem_top_k"
TOP_P_KEY = "tandem_top_p"
MIN_P_KEY = "tandem_min_p"
MAX_RECORDS = 1 << 16  # finished-but-unread requests kept before the oldest are dropped
_SAMPLING_EPS = 1e-5  # vLLM's threshold below which a request is greedy


def tandem_extra_args(seed: int, uid: str, rule: HandoffRule, sampling: SamplingSettings | None = None) -> dict:
    """``SamplingParams.extra_args`` (or the OpenAI server's ``vllm_xargs``) that make a request a tandem request.

    Args:
        seed: the request's coin-stream seed (any int; hashed to 32 bits by the rule).
        uid: a string unique per request, the key of its side records
            ([`pop_records`][tandem_grpo.vllm.processor.pop_records]).
        rule: the handoff rule.
        sampling: its ``top_k``, ``top_p`` and ``min_p`` truncate the mixture here (default: no truncation); the
            request's own ``top_k``/``top_p``/``min_p`` must be off
            ([`request_fields`][tandem_grpo.vllm.engine.request_fields]) and its temperature and repetition penalty are
            the request's.
    """
    sampling = sampling or SamplingSettings()
    return {
        SEED_KEY: int(seed),
        UID_KEY: str(uid),
        GRANULARITY_KEY: rule.granularity,
        PROBABILITY_KEY: float(rule.junior_probability),
        MAX_GAP_KEY: int(rule.max_gap_tokens),
        MODE_KEY: rule.mode,
        TOP_K_KEY: int(sampling.top_k),
        TOP_P_KEY: float(sampling.top_p),
        MIN_P_KEY: float(sampling.min_p),
    }


def is_tandem_request(params: SamplingParams) -> bool:
    return bool(params.extra_args) and SEED_KEY in params.extra_args


def rule_from_extra_args(extra_args: dict) -> HandoffRule:
    return HandoffRule(
        granularity=extra_args.get(GRANULARITY_KEY, "word"),
        junior_probability=float(extra_args.get(PROBABILITY_KEY, 0.5)),
        max_gap_tokens=int(extra_args.get(MAX_GAP_KEY, 32)),
        mode=extra_args.get(MODE_KEY, "after_boundary"),
    )


def sampling_from_params(params: SamplingParams) -> SamplingSettings:
    """A tandem request's sampling settings: temperature and repetition penalty from the request, the mixture's
    truncation from its extra args.

    Raises:
        ValueError: a value outside its range (see [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings]).
    """
    extra = params.extra_args or {}
    return SamplingSettings(
        temperature=float(params.temperature),
        top_k=extra.get(TOP_K_KEY, 0),
        top_p=extra.get(TOP_P_KEY, 1.0),
        min_p=extra.get(MIN_P_KEY, 0.0),
        repetition_penalty=float(params.repetition_penalty),
    )


@dataclass
class _Record:
    """Rule state and side records of one request (by uid); survives the request leaving the batch."""

    seed: int
    rule: HandoffRule
    prompt_len: int
    owner: int
    next_owner: int
    unit_length: int = 0
    unit_index: int = 0
    after_boundary: bool = False
    position: int = 0  # completion tokens advanced over
    authors: list[int] = field(default_factory=list)
    corrections: list[float] = field(default_factory=list)
    handovers: list[float] = field(default_factory=list)


@dataclass
class _Row:
    record: _Record
    prefix: list[int]  # completion tokens vLLM moved into the prompt when it resumed a preempted request
    outputs: list[int]  # live reference to the request's output token list (vLLM appends to it)
    prompt: list[int] | None
    sampling: SamplingSettings
    frequency_penalty: float
    presence_penalty: float

    def num_tokens(self) -> int:
        return len(self.prefix) + len(self.outputs)

    def token(self, position: int) -> int:
        return self.prefix[position] if position < len(self.prefix) else self.outputs[position - len(self.prefix)]

    def has_penalties(self) -> bool:
        return self.sampling.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


_RECORDS: OrderedDict[str, _Record] = OrderedDict()
_LOCK = threading.Lock()


def pop_records(uids: list[str]) -> dict[str, dict]:
    """Remove and return the side records of ``uids`` (JSON-ready): ``{uid: {"authors": [...], "corrections": [...],
    "handovers": [...]}}``. ``authors[t]`` in {1 senior, 0 junior} for the tokens the processor has advanced over (all
    but the last token of a finished completion); ``corrections[t]`` and ``handovers[t]`` (``None`` for no handover)
    of position ``t`` (module docstring). Unknown uids map to ``None``."""
    with _LOCK:
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


def _state(records: list[_Record], device: torch.device) -> HandoffState:
    def col(values, dtype=torch.long):
        return torch.tensor(values, dtype=dtype, device=device)

    return HandoffState(
        owner=col([r.owner for r in records]),
        next_owner=col([r.next_owner for r in records]),
        unit_length=col([r.unit_length for r in records]),
        unit_index=col([r.unit_index for r in records]),
        after_boundary=col([r.after_boundary for r in records], torch.bool),
        seeds=col([r.seed for r in records]),
    )


def _store(records: list[_Record], state: HandoffState) -> None:
    fields = zip(
        state.owner.tolist(),
        state.next_owner.tolist(),
        state.unit_length.tolist(),
        state.unit_index.tolist(),
        state.after_boundary.tolist(),
        strict=True,
    )
    for record, (owner, next_owner, unit_length, unit_index, sentence) in zip(records, fields, strict=True):
        record.owner, record.next_owner = owner, next_owner
        record.unit_length, record.unit_index, record.after_boundary = unit_length, unit_index, sentence


def _group_by_rule(rows: list[tuple[int, _Row]]) -> dict[HandoffRule, list[tuple[int, _Row]]]:
    groups: dict[HandoffRule, list[tuple[int, _Row]]] = {}
    for item in rows:
        groups.setdefault(item[1].record.rule, []).append(item)
    return groups


def _put(values: list[float], position: int, value: float, missing: float) -> None:
    """``values[position] = value``, filling skipped positions with ``missing``; a re-sampled position (e.g. after a
    partial prefill) is overwritten."""
    if len(values) <= position:
        values.extend([missing] * (position + 1 - len(values)))
    values[position] = value


class TandemLogitsProcessor(LogitsProcessor):
    """Turns each tandem request's senior logits into the tandem mixture's log-probabilities (module docstring).

    Constructed by vLLM in every worker: ``(vllm_config, device, is_pin_memory)``. Inactive (a no-op) on engines
    whose model is not ``TandemForCausalLM``.

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

    # --- vLLM interface -------------------------------------------------------------------------------------------

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """Reject tandem requests whose settings the mixture cannot honour (runs in the API process).

        Raises:
            ValueError: bad ``tandem_*`` extra args, ``n != 1``, greedy sampling, ``top_k``/``top_p``/``min_p`` set
                in SamplingParams (they belong in the extra args), or an option that vLLM applies to the senior's
                logits alone (``logit_bias``, ``min_tokens``, ``bad_words``, ``allowed_token_ids``, structured
                outputs).
        """
        if not is_tandem_request(params):
            return
        extra = params.extra_args
        seed, uid = extra.get(SEED_KEY), extra.get(UID_KEY)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{SEED_KEY}={seed!r} must be an integer.")
        if not isinstance(uid, str) or not uid:
            raise ValueError(f"{UID_KEY}={uid!r} must be a non-empty string unique per request.")
        validate_rule_fields(
            extra.get(GRANULARITY_KEY, "word"),
            extra.get(PROBABILITY_KEY, 0.5),
            extra.get(MAX_GAP_KEY, 32),
            extra.get(MODE_KEY, "after_boundary"),
        )
        if params.n != 1:
            raise ValueError(
                f"Tandem requests take n=1 (got n={params.n}): send one request per completion, each "
                "with its own seed and uid."
            )
        if params.temperature < _SAMPLING_EPS:
            raise ValueError("Tandem requests must sample (temperature > 0); there is no greedy tandem decoding.")
        if params.top_k not in (0, -1) or params.top_p < 1.0 or params.min_p:
            raise ValueError(
                f"Tandem requests truncate the mixture in the logits processor: pass top_k/top_p/min_p as "
                f"extra_args['{TOP_K_KEY}'/'{TOP_P_KEY}'/'{MIN_P_KEY}'] (tandem_extra_args(..., sampling)) and leave "
                f"SamplingParams' own off (got top_k={params.top_k}, top_p={params.top_p}, min_p={params.min_p})."
            )
        try:
            sampling_from_params(params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Tandem extra args: {exc}") from exc
        senior_only = {
            "logit_bias": params.logit_bias,
            "min_tokens": params.min_tokens,
            "bad_words": params.bad_words,
            "allowed_token_ids": params.allowed_token_ids,
            "structured_outputs": params.structured_outputs,
        }
        used = [name for name, value in senior_only.items() if value]
        if used:
            raise ValueError(f"{used} act on the senior's logits alone in vLLM; tandem requests do not support them.")

    def is_argmax_invariant(self) -> bool:
        # Not literally true; the flag places the processor after penalties/temperature and before top-k/top-p,
        # which is where the mixture belongs. It also means greedy rows skip it, which validate_params forbids.
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.enabled:
            process_dict_updates(self.rows, batch_update, self._new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        junior_logits = take_junior_logits() if self.enabled else None
        if not self.rows:
            return logits
        tables, cpu_tables = self._boundary_tables(logits.shape[-1], logits.device)
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
        items = sorted(self.rows.items())
        self._catch_up(items, cpu_tables)
        for rule, members in _group_by_rule(items).items():
            self._mix(logits, junior_logits, tables, rule, members)
        return logits

    # --- internals ------------------------------------------------------------------------------------------------

    def _new_row(self, params: SamplingParams, prompt: list[int] | None, outputs: list[int]) -> _Row | None:
        if not is_tandem_request(params):
            return None
        extra = params.extra_args
        uid = extra[UID_KEY]
        with _LOCK:
            record = _RECORDS.get(uid)
            if record is None:
                rule = rule_from_extra_args(extra)
                seed = int(extra[SEED_KEY])
                initial = init_state(torch.tensor([seed]), rule)
                record = _Record(seed=seed, rule=rule, prompt_len=len(prompt or []), owner=0, next_owner=0)
                _store([record], initial)
                _RECORDS[uid] = record
                while len(_RECORDS) > MAX_RECORDS:
                    _RECORDS.popitem(last=False)
            else:
                _RECORDS.move_to_end(uid)
        prefix = list(prompt[record.prompt_len :]) if prompt is not None else []
        return _Row(
            record=record,
            prefix=prefix,
            outputs=outputs,
            prompt=prompt,
            sampling=sampling_from_params(params),
            frequency_penalty=float(params.frequency_penalty),
            presence_penalty=float(params.presence_penalty),
        )

    def _boundary_tables(self, vocab_size: int, device: torch.device) -> tuple[BoundaryTables, BoundaryTables]:
        """Boundary tables for senior logits ``vocab_size`` wide, on ``device`` and on the CPU (built once)."""
        if vocab_size not in self._tables:
            from transformers import AutoTokenizer

            cfg = self.model_config
            tokenizer = AutoTokenizer.from_pretrained(
                cfg.tokenizer, revision=cfg.tokenizer_revision, trust_remote_code=cfg.trust_remote_code
            )
            eos = getattr(cfg.hf_config, "tandem_eos_token_ids", None)
            if eos is None:
                from .engine import engine_eos_token_ids

                eos = engine_eos_token_ids(cfg.model, cfg.trust_remote_code)
            tables = BoundaryTables.from_tokenizer(tokenizer, vocab_size, list(eos))
            self._tables[vocab_size] = (tables.to(device), tables)
        return self._tables[vocab_size]

    def _catch_up(self, items: list[tuple[int, _Row]], tables: BoundaryTables) -> None:
        """Advance each request's rule state over the tokens vLLM sampled since the last step (normally one).

        Raises:
            RuntimeError: a token not sampled yet (vLLM's async-scheduling placeholder ``-1``): the state would be
                one token behind, so the mixture of this step would use the wrong owner and boundary set.
        """
        while True:
            pending = [(index, row) for index, row in items if row.record.position < row.num_tokens()]
            if not pending:
                return
            placeholders = [index for index, row in pending if row.token(row.record.position) < 0]
            if placeholders:
                raise RuntimeError(
                    f"Batch rows {placeholders} hold a placeholder token (-1) where the last sampled token should be: "
                    "vLLM's async scheduling is on. The tandem logits processor needs every sampled token before the "
                    "next step; build the engine with tandem_grpo.vllm.engine.engine_kwargs() (it sets "
                    "async_scheduling=False) or pass --no-async-scheduling to the server."
                )
            for rule, members in _group_by_rule(pending).items():
                records = [row.record for _, row in members]
                tokens = torch.tensor([row.token(row.record.position) for _, row in members], dtype=torch.long)
                state, authors, _ = advance(_state(records, torch.device("cpu")), tokens, tables, rule)
                _store(records, state)
                for record, author in zip(records, authors.tolist(), strict=True):
                    record.authors.append(author)
                    record.position += 1

    def _mix(
        self,
        logits: torch.Tensor,
        junior_logits: torch.Tensor,
        tables: BoundaryTables,
        rule: HandoffRule,
        members: list[tuple[int, _Row]],
    ) -> None:
        device = logits.device
        width = tables.vocab_size
        index = torch.tensor([i for i, _ in members], dtype=torch.long, device=device)
        rows = [row for _, row in members]
        state = _state([row.record for row in rows], device)
        senior_lp = torch.log_softmax(logits.index_select(0, index)[:, :width], dim=-1)
        junior = junior_logits.index_select(0, index)[:, :width].float()
        if any(row.has_penalties() for row in rows):
            junior = self._penalize(junior, rows)
        temperature = torch.tensor([row.sampling.temperature for row in rows], dtype=junior.dtype, device=device)
        junior_lp = torch.log_softmax(junior / temperature.unsqueeze(1), dim=-1)
        boundary = boundary_mask(state, tables, rule)
        mixed = mixture_logprobs(senior_lp, junior_lp, state, boundary)

        # Rows where B is a proper subset and the owner may change ("whole_unit" handoffs): there the senior's term
        # differs from vLLM's log P (module docstring). Full-vocabulary sums on those rows only.
        switching = handoff_rows(state, boundary)
        corrections, handovers = [0.0] * len(rows), [math.nan] * len(rows)
        if bool(switching.any()):
            sub = switching.nonzero().squeeze(1)
            b_sub = boundary.index_select(0, sub)
            neg_inf = torch.tensor(float("-inf"), dtype=senior_lp.dtype, device=device)
            senior_b = torch.logsumexp(torch.where(b_sub, senior_lp.index_select(0, sub), neg_inf), dim=-1).tolist()
            junior_b = torch.logsumexp(torch.where(b_sub, junior_lp.index_select(0, sub), neg_inf), dim=-1).tolist()
            into_senior = (state.next_owner.index_select(0, sub) == SENIOR).tolist()
            for k, s_b, j_b, to_senior in zip(sub.tolist(), senior_b, junior_b, into_senior, strict=True):
                if to_senior:
                    corrections[k] = -j_b if math.isfinite(j_b) else 0.0
                else:
                    handovers[k] = s_b

        def column(name: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([getattr(row.sampling, name) for row in rows], dtype=dtype, device=device)

        mixed = truncate_logprobs(
            mixed, column("top_k", torch.long), column("top_p", mixed.dtype), column("min_p", mixed.dtype)
        )
        # Ids past the tokenizer (embedding padding) keep probability 0 in what vLLM samples from.
        out = torch.full((len(rows), logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=device)
        out[:, :width] = mixed.to(logits.dtype)
        logits.index_copy_(0, index, out)
        for row, correction, handover in zip(rows, corrections, handovers, strict=True):
            position = row.num_tokens()
            _put(row.record.corrections, position, correction, 0.0)
            _put(row.record.handovers, position, handover, math.nan)

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
