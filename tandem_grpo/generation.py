"""Tandem co-generation on the transformers path: one batched decode loop, one forward pass of each model per step
(or one over both for a LoRA senior with its base as junior), tokens drawn from the mixture of
[`tandem_grpo.handoff`][tandem_grpo.handoff]. How the loop calls the models (caches, LoRA hooks, mixed-adapter
batches) is [`tandem_grpo.model_calls`][tandem_grpo.model_calls].
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
)

from .handoff import (
    BoundaryTables,
    HandoffRule,
    HandoffState,
    HandoffTrace,
    advance,
    boundary_coefficients,
    boundary_mask,
    init_state,
    mixture_logprobs,
    senior_token_terms,
)
from .model_calls import Forward, co_generation_forward
from .rollout import Rollout
from .sampling import SamplingSettings, vocabulary_mass


@torch.no_grad()
def tandem_generate(
    senior: PreTrainedModel,
    junior: PreTrainedModel | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    rule: HandoffRule,
    tables: BoundaryTables | None = None,
    tokenizer=None,
    sampling: SamplingSettings | None = None,
    max_new_tokens: int = 256,
    eos_token_ids: list[int] | None = None,
    pad_token_id: int | None = None,
    seeds: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    junior_context: Callable[[], contextlib.AbstractContextManager] | None = None,
    synced: bool = False,
) -> Rollout:
    """Co-generate completions with a senior and a junior (paper section 3).

    Args:
        senior: causal LM sharing one tokenizer with ``junior``; only read. Logits width ``V_s`` is cut to the
            ``V`` ids of ``tables``.
        junior: causal LM, likewise (width ``V_j``). ``None``: the base of a PEFT ``senior``: one pass over ``2B``
            rows where [`mixed_adapter_batches`][tandem_grpo.model_calls.mixed_adapter_batches], else two passes,
            the second under ``senior.disable_adapter``.
        input_ids: long ``[B, P]`` left-padded prompts, on the models' device.
        attention_mask: long ``[B, P]``, the mask of ``input_ids``.
        rule: the handoff rule ([`tandem_grpo.handoff`][tandem_grpo.handoff]).
        tables: boundary tables; default
            [`BoundaryTables.from_tokenizer`][tandem_grpo.handoff.BoundaryTables.from_tokenizer] for
            ``min(len(tokenizer), V_s, V_j)`` ids.
        tokenizer: the shared tokenizer; needed when ``tables``, ``eos_token_ids`` or ``pad_token_id`` is omitted.
        sampling: per-model and mixture sampling settings (default: plain sampling at temperature 1).
        max_new_tokens: completion length cap, in tokens.
        eos_token_ids: default: the tokenizer's EOS id.
        pad_token_id: default: the tokenizer's pad id.
        seeds: long ``[B]`` coin-stream seeds (default ``0..B-1``).
        generator: drives the token draws.
        junior_context: entered around every junior forward of the two-pass loop (e.g. ``senior.disable_adapter``).
        synced: step in lockstep with the default ``torch.distributed`` group (as ``generate``'s ``synced_gpus``): a
            done process runs forwards on pad tokens until every process is done, one all-reduce per step. Needed
            when a forward is a collective (ZeRO-3, FSDP); ignored without a group of more than one process.

    Returns:
        A [`Rollout`][tandem_grpo.rollout.Rollout]: completions up to and including the first EOS (at most
        ``max_new_tokens``), authorship, unit starts, ``log p_s(B)`` coefficients, ``seeds`` and the senior's score
        terms (``senior_logprobs``, at the sampling temperature and repetition penalty); no mixture log-probs.

    Raises:
        ValueError: a model's logits are narrower than the ``V`` ids of ``tables``, or neither ``tables`` nor
            ``tokenizer`` is given (nor ``eos_token_ids`` and ``pad_token_id``), or ``junior`` is ``None`` and
            ``senior`` is not a PEFT model, or a model is a PEFT prompt-learning model
            ([`check_co_generation_model`][tandem_grpo.model_calls.check_co_generation_model]).
    """
    sampling = sampling or SamplingSettings()
    if eos_token_ids is None or pad_token_id is None:
        if tokenizer is None:
            raise ValueError("Pass `eos_token_ids` and `pad_token_id`, or a `tokenizer` to take them from.")
        eos_token_ids = eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id]
        pad_token_id = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
    if tables is None and tokenizer is None:
        raise ValueError("Pass boundary `tables` or a `tokenizer` to build them from.")
    batch = input_ids.shape[0]
    seeds = torch.arange(batch, device=input_ids.device) if seeds is None else seeds.to(input_ids.device)
    with co_generation_forward(senior, junior, batch, junior_context) as forward:
        return _decode(forward, input_ids, attention_mask, rule=rule, tables=tables, tokenizer=tokenizer,
                       sampling=sampling, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                       pad_token_id=pad_token_id, seeds=seeds, generator=generator, synced=synced)  # fmt: skip


def _decode(
    forward: Forward,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    rule: HandoffRule,
    tables: BoundaryTables | None,
    tokenizer,
    sampling: SamplingSettings,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    seeds: torch.Tensor,
    generator: torch.Generator | None,
    synced: bool,
) -> Rollout:
    """The decode loop of [`tandem_generate`][tandem_grpo.generation.tandem_generate], its defaults resolved: the
    prefill, then one token per pass (draw, handoff state, trace, stop test, forward) until every row has met EOS or
    ``max_new_tokens``."""
    device, batch = input_ids.device, input_ids.shape[0]

    # Prefill: both models read the prompts; their logits widths fix (or check) the tables' V.
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    senior_logits, junior_logits = forward(input_ids, attention_mask, position_ids)
    tables = _checked_tables(tables, tokenizer, eos_token_ids, senior_logits, junior_logits).to(device)
    next_position = position_ids[:, -1:] + 1

    state = init_state(seeds, rule)
    history = input_ids  # only the repetition penalty reads it
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    written = _Written()
    all_done = _all_done_reducer(device) if synced else bool
    done = max_new_tokens <= 0
    pad_ids = torch.full((batch, 1), pad_token_id, dtype=torch.long, device=device)  # a done process's input
    while True:  # exactly one `all_done` per pass: under `synced` every process makes the same calls
        step_ids = pad_ids
        if not done:
            logits = (senior_logits, junior_logits)
            mixed, senior_lp, boundary = _next_token(*logits, state, tables, rule, sampling, history)
            token = torch.multinomial(torch.softmax(mixed, dim=-1), 1, generator=generator).squeeze(1)
            token = torch.where(finished, pad_token_id, token)
            before = state
            state, author, start = advance(state, token, tables, rule)
            coef = boundary_coefficients(before, author, start, tables, rule)
            term = _senior_term(senior_lp, boundary, token, author, coef, senior_logits, sampling)
            written.append(token, author, start, coef, term, alive=~finished)
            finished = finished | tables.is_eos[token]
            done = bool(finished.all()) or len(written) >= max_new_tokens
            step_ids = token.unsqueeze(1)
            history = torch.cat([history, step_ids], dim=1) if sampling.repetition_penalty != 1.0 else history
        if all_done(done):
            break
        # A process already done only keeps a collective forward in step with the others: pad tokens, output dropped.
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, 1)], dim=1)
        senior_logits, junior_logits = forward(step_ids, attention_mask, next_position)
        next_position = next_position + 1
    return written.rollout(batch, seeds.tolist())


def next_token_logprobs(
    senior_logits: torch.Tensor,
    junior_logits: torch.Tensor,
    state: HandoffState,
    tables: BoundaryTables,
    rule: HandoffRule,
    sampling: SamplingSettings,
    history: torch.Tensor,
) -> torch.Tensor:
    """The distribution [`tandem_generate`][tandem_grpo.generation.tandem_generate] draws the next token from: logits
    cut to ``V``, per-model penalty and temperature, [`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs], then
    [`truncate_logprobs`][tandem_grpo.sampling.truncate_logprobs].

    Args:
        senior_logits: float ``[B, V_s]``, the senior's logits, ``V_s >= V``.
        junior_logits: float ``[B, V_j]``, the junior's logits, ``V_j >= V``.
        state: the rule state before this position.
        tables: the boundary tables; their ``vocab_size`` is ``V``.
        rule: the handoff rule.
        sampling: the sampling settings.
        history: long ``[B, L]``, prompt and completion so far (only the repetition penalty reads it).

    Returns:
        float ``[B, V]``: normalized log-probabilities, ``-inf`` where the token cannot be drawn.
    """
    return _next_token(senior_logits, junior_logits, state, tables, rule, sampling, history)[0]


def _next_token(senior_logits, junior_logits, state, tables, rule, sampling, history):
    """[`next_token_logprobs`][tandem_grpo.generation.next_token_logprobs]'s result, the senior's log-probabilities
    ``[B, V]`` (penalty and temperature applied) and the boundary mask ``[B, V]`` it mixed with."""
    width = tables.vocab_size
    steps = _per_model_steps(sampling)
    senior_lp = torch.log_softmax(steps(history, senior_logits[:, :width]), dim=-1)
    junior_lp = torch.log_softmax(steps(history, junior_logits[:, :width]), dim=-1)
    boundary = boundary_mask(state, tables, rule)
    return sampling.truncate(mixture_logprobs(senior_lp, junior_lp, state, boundary)), senior_lp, boundary


def _senior_term(senior_lp, boundary, token, author, coef, senior_logits, sampling) -> torch.Tensor:
    """The senior's score term of each drawn token ``[B]``
    ([`senior_token_terms`][tandem_grpo.handoff.senior_token_terms], over the whole vocabulary and every logits
    column), ``NaN`` where the senior has none: what the trainer's loss recomputes, kept so that the trainer can check
    its loss against the loop (``tandem_grpo.engine_check``)."""
    token_lp = senior_lp.gather(1, token.unsqueeze(1)).squeeze(1)
    b_lp = torch.zeros_like(token_lp)
    if bool(coef.any()):  # "whole_unit" handoffs: log p_s(B)
        b_lp = torch.logsumexp(senior_lp.masked_fill(~boundary, float("-inf")), dim=-1)
    terms, involved = senior_token_terms(token_lp, b_lp, author, coef)
    if senior_logits.shape[-1] > senior_lp.shape[-1]:  # columns past the tokenizer: the loss normalizes over them
        inside = vocabulary_mass(senior_logits.float() / sampling.temperature, senior_lp.shape[-1])
        terms = terms + (author + coef).to(terms.dtype) * inside  # M cancels where the senior takes a unit over
    return torch.where(involved, terms, torch.full_like(terms, float("nan")))


def _per_model_steps(sampling: SamplingSettings) -> LogitsProcessorList:
    # transformers' own processors, so that a self-paired tandem samples exactly like ``model.generate``.
    steps = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        steps.append(RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty))
    if sampling.temperature != 1.0:
        steps.append(TemperatureLogitsWarper(sampling.temperature))
    return steps


def _checked_tables(
    tables: BoundaryTables | None,
    tokenizer,
    eos_token_ids: list[int],
    senior_logits: torch.Tensor,
    junior_logits: torch.Tensor,
) -> BoundaryTables:
    """``tables``, or the tokenizer's for the narrower logits width; refused where a model's logits are narrower."""
    widths = {"senior": senior_logits.shape[-1], "junior": junior_logits.shape[-1]}
    if tables is None:
        tables = BoundaryTables.from_tokenizer(tokenizer, min(widths.values()), eos_token_ids)
    narrow = {name: width for name, width in widths.items() if width < tables.vocab_size}
    if narrow:
        raise ValueError(
            f"The boundary tables cover {tables.vocab_size} token ids but the logits of {narrow} are narrower: "
            "both models must score every id of the shared tokenizer. Build the tables with "
            "BoundaryTables.from_tokenizer(tokenizer, <narrowest logits width>, eos_token_ids)."
        )
    return tables


def _all_done_reducer(device: torch.device) -> Callable[[bool], bool]:
    """``done -> every process is done``: one all-reduce (SUM of not-done flags) per call, as transformers'
    ``_has_unfinished_sequences`` under ``synced_gpus``; the local flag alone without a multi-process group."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return bool
    if torch.distributed.get_world_size() < 2:
        return bool

    def all_done(done: bool) -> bool:
        flag = torch.tensor(0.0 if done else 1.0, device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.SUM)
        return flag.item() == 0.0

    return all_done


@dataclass
class _Written:
    """What the loop drew, one bool/long/float ``[B]`` tensor per step: tokens (pad after a row's EOS), authors, unit
    starts, ``log p_s(B)`` coefficients, and whether the row was still writing."""

    tokens: list[torch.Tensor] = field(default_factory=list)
    authors: list[torch.Tensor] = field(default_factory=list)
    starts: list[torch.Tensor] = field(default_factory=list)
    coefs: list[torch.Tensor] = field(default_factory=list)
    terms: list[torch.Tensor] = field(default_factory=list)
    alive: list[torch.Tensor] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token, author, start, coef, term, *, alive) -> None:
        self.tokens.append(token)
        self.authors.append(author)
        self.starts.append(start)
        self.coefs.append(coef)
        self.terms.append(term)
        self.alive.append(alive)

    def rollout(self, batch: int, seeds: list[int]) -> Rollout:
        """The rollout of ``batch`` rows: each row cut after its EOS."""
        if not self.tokens:
            empty = [[] for _ in range(batch)]
            return Rollout(empty, empty, empty, empty, seeds, senior_logprobs=empty)
        lengths = torch.stack(self.alive, dim=1).sum(dim=1).tolist()
        ids = [row[:n] for row, n in zip(torch.stack(self.tokens, dim=1).tolist(), lengths, strict=True)]
        steps = (torch.stack(self.authors, dim=1), torch.stack(self.starts, dim=1), torch.stack(self.coefs, dim=1))
        terms = [row[: len(i)] for row, i in zip(torch.stack(self.terms, dim=1).float().tolist(), ids, strict=True)]
        return Rollout.from_trace(ids, HandoffTrace(*steps), seeds, senior_logprobs=terms)
