"""The handoff rule: who writes the next token of a tandem completion. One implementation, shared by every backend.

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166), section 3 (tandem rollouts).

Each sequence carries a [`HandoffState`][tandem_grpo.handoff.HandoffState]: the current owner ``o`` (who writes the
running unit), a pre-drawn owner ``n`` for the next unit, the running unit's length, and a per-sequence coin stream.
At each position the set ``B`` of tokens that would *start a new unit* is

- ``"word"``: tokens whose text starts with whitespace (this includes newlines), and EOS;
- ``"sentence"``: every token when the previous token ended with ``.``, ``!``, ``?`` or a newline; otherwise EOS;
- ``"token"``: every token;
- any granularity: every token at the first completion position, and once the running unit has lasted
  ``max_gap_tokens`` tokens (the paper's cap for long sub-word runs such as numbers or LaTeX).

The rule: sample ``x`` from ``o``'s distribution; if ``x`` is in ``B`` and ``n != o``, replace ``x`` by a sample from
``n``'s distribution restricted to ``B``; if ``x`` is in ``B`` the unit's owner becomes ``n`` and a fresh ``n`` is
drawn (junior with probability ``junior_probability``). Sampling ``x`` that way is the same as sampling once from
the mixture

    P(x) = p_o(x)                       for x not in B
    P(x) = p_o(B) * p_n(x) / p_n(B)     for x in B        (P = p_o when n == o)

and the author of ``x`` is then a function of ``x``: ``n`` when ``x`` is in ``B``, else ``o``. That is why
[`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs] returns log P for a sampler to draw from (a vLLM logits
processor can hand it to vLLM's sampler unchanged), and [`advance`][tandem_grpo.handoff.advance] recovers authorship
from the sampled tokens alone. With a junior that equals the senior, ``P = p`` exactly: self-paired tandem rollouts
are distributed like solo rollouts.

Coins are counter-based: the owner of unit ``k`` of a sequence with seed ``s`` is a hash of ``(s, k)``
([`draw_owners`][tandem_grpo.handoff.draw_owners]), so authorship can be rebuilt from the seed and the tokens
([`replay_authorship`][tandem_grpo.handoff.replay_authorship]) and does not depend on batch composition or on which
backend generated the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .guards import require_finite_logprobs

SENIOR = 1
JUNIOR = 0
GRANULARITIES = ("token", "word", "sentence")
Granularity = Literal["token", "word", "sentence"]
_SENTENCE_END = (".", "!", "?", "\n")
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class HandoffRule:
    """Settings of the handoff rule (paper defaults: word units, p = 0.5, a 32-token cap).

    Args:
        granularity: ``"token"``, ``"word"`` (default) or ``"sentence"``: what a unit is.
        junior_probability: chance in [0, 1] that a new unit is written by the junior; 0 = senior alone.
        max_gap_tokens: a unit that has lasted this many tokens (>= 1) forces a handoff decision.

    Raises:
        ValueError: a value outside its range, naming the field.
    """

    granularity: Granularity = "word"
    junior_probability: float = 0.5
    max_gap_tokens: int = 32

    def __post_init__(self) -> None:
        validate_rule_fields(self.granularity, self.junior_probability, self.max_gap_tokens)

    @classmethod
    def from_config(cls, config) -> HandoffRule:
        """The rule of any object with the fields ``handoff_granularity``, ``junior_probability`` and
        ``max_gap_tokens`` (a ``TandemGRPOConfig``, an ``EvaluationConfig``): the one way to build it from a config.

        Raises:
            ValueError: a value outside its range, naming the field (checked before any conversion).
        """
        granularity, probability, max_gap = (
            config.handoff_granularity,
            config.junior_probability,
            config.max_gap_tokens,
        )
        validate_rule_fields(granularity, probability, max_gap)
        return cls(granularity, float(probability), int(max_gap))


def validate_rule_fields(granularity: object, junior_probability: object, max_gap_tokens: object) -> None:
    """Raise ``ValueError`` naming the field, the value and the allowed range (shared by every config class)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"handoff_granularity={granularity!r} is not supported; use one of {GRANULARITIES}.")
    if isinstance(junior_probability, bool) or not isinstance(junior_probability, (int, float)):
        raise ValueError(f"junior_probability={junior_probability!r} must be a number in [0, 1].")
    if not 0.0 <= float(junior_probability) <= 1.0:
        raise ValueError(f"junior_probability={junior_probability!r} is outside [0, 1].")
    if isinstance(max_gap_tokens, bool) or not isinstance(max_gap_tokens, int) or max_gap_tokens < 1:
        raise ValueError(f"max_gap_tokens={max_gap_tokens!r} must be an integer >= 1.")


@dataclass(frozen=True)
class BoundaryTables:
    """Per-vocabulary facts the rule needs, computed once from the tokenizer.

    Attributes:
        starts_word: bool ``[V]``, the token's text starts with whitespace, or it is an EOS token.
        ends_sentence: bool ``[V]``, the token's text ends with ``.``, ``!``, ``?`` or a newline.
        is_eos: bool ``[V]``, the token is one of the EOS ids.
    """

    starts_word: torch.Tensor
    ends_sentence: torch.Tensor
    is_eos: torch.Tensor

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int, eos_token_ids: list[int]) -> BoundaryTables:
        """Build the tables for the ids a model with ``vocab_size`` logits can write that the tokenizer knows: the
        first ``V = min(len(tokenizer), vocab_size)`` ids. Every backend cuts the logits to these ``V`` columns
        before mixing, so the rows a checkpoint pads its embeddings with (e.g. 151936 or 152064 rows for Qwen's
        151665 tokens) are never sampled, and two models whose widths differ only by padding can be mixed.

        Token texts come from decoding each id alone; SentencePiece marks a leading space with ``▁``, which
        ``decode`` drops, so the raw token string is checked for it too. EOS ids ``>= V`` are left out.
        """
        n = min(len(tokenizer), vocab_size)
        texts = tokenizer.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        starts = [t[:1].isspace() or (p or "").startswith("▁") for t, p in zip(texts, pieces, strict=True)]
        ends = [t.endswith(_SENTENCE_END) for t in texts]
        is_eos = torch.zeros(n, dtype=torch.bool)
        is_eos[[i for i in eos_token_ids if 0 <= i < n]] = True
        return cls(
            starts_word=torch.tensor(starts, dtype=torch.bool) | is_eos,
            ends_sentence=torch.tensor(ends, dtype=torch.bool),
            is_eos=is_eos,
        )

    @property
    def vocab_size(self) -> int:
        """``V``: the number of token ids (logits columns) the tables cover."""
        return int(self.is_eos.shape[0])

    def to(self, device: torch.device | str) -> BoundaryTables:
        return BoundaryTables(self.starts_word.to(device), self.ends_sentence.to(device), self.is_eos.to(device))


@dataclass
class HandoffState:
    """Per-sequence rule state; every tensor has shape ``[B]`` and lives on the logits' device.

    Attributes:
        owner: author of the running unit (``SENIOR`` = 1 or ``JUNIOR`` = 0), long.
        next_owner: pre-drawn author of the next unit, long.
        unit_length: tokens in the running unit; 0 before the first completion token, long.
        unit_index: index of the next unit to draw an owner for, long.
        after_sentence_end: the previous token ended a sentence (used by ``"sentence"``), bool.
        seeds: coin-stream seed of each sequence, long.
    """

    owner: torch.Tensor
    next_owner: torch.Tensor
    unit_length: torch.Tensor
    unit_index: torch.Tensor
    after_sentence_end: torch.Tensor
    seeds: torch.Tensor


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    # MurmurHash3's 32-bit finalizer on int64 tensors; masking keeps every value in [0, 2^32), so the shifts are
    # logical and a product's wrap-around in int64 leaves the low 32 bits right.
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def draw_owners(seeds: torch.Tensor, unit_index: torch.Tensor, junior_probability: float) -> torch.Tensor:
    """Owner of unit ``unit_index`` of each sequence: ``JUNIOR`` with probability ``junior_probability``.

    A counter-based coin: ``u = hash(seed, unit_index) / 2**32`` and the unit is the junior's iff
    ``u < junior_probability``. Deterministic per (seed, unit), independent across units and seeds.

    Args:
        seeds: long ``[B]``, the coin-stream seed of each sequence.
        unit_index: long ``[B]``, the unit to draw an owner for.
        junior_probability: chance in [0, 1] that the unit is the junior's.

    Returns:
        long ``[B]`` of ``SENIOR``/``JUNIOR``.
    """
    key = (_fmix32(seeds.long() & _MASK32) + unit_index.long() * 0x9E3779B9) & _MASK32
    u = _fmix32(key).double() / 2.0**32
    return torch.where(u < junior_probability, JUNIOR, SENIOR).long()


def init_state(seeds: torch.Tensor, rule: HandoffRule) -> HandoffState:
    """State before the first completion token. The first token is always a boundary, so the initial ``owner``
    never writes anything; the first unit is written by ``draw_owners(seeds, 0)``."""
    seeds = seeds.long()
    zeros = torch.zeros_like(seeds)
    return HandoffState(
        owner=torch.full_like(seeds, SENIOR),
        next_owner=draw_owners(seeds, zeros, rule.junior_probability),
        unit_length=zeros.clone(),
        unit_index=zeros.clone(),
        after_sentence_end=torch.zeros_like(seeds, dtype=torch.bool),
        seeds=seeds,
    )


def _unit_starts(state: HandoffState, tables: BoundaryTables, rule: HandoffRule) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table, forced)``: ``B`` is ``table[v] | forced[row]`` — the one definition of a boundary."""
    forced = (state.unit_length == 0) | (state.unit_length >= rule.max_gap_tokens)
    if rule.granularity == "token":
        return torch.ones_like(tables.is_eos), forced
    if rule.granularity == "word":
        return tables.starts_word, forced
    return tables.is_eos, forced | state.after_sentence_end


def boundary_mask(state: HandoffState, tables: BoundaryTables, rule: HandoffRule) -> torch.Tensor:
    """The set ``B`` for each sequence at the current position, bool ``[B, V]``."""
    table, forced = _unit_starts(state, tables, rule)
    return table.unsqueeze(0) | forced.unsqueeze(1)


def mixture_logprobs(
    senior_logprobs: torch.Tensor, junior_logprobs: torch.Tensor, state: HandoffState, boundary: torch.Tensor
) -> torch.Tensor:
    """Log-probabilities of the tandem mixture ``P`` (module docstring) for the current position.

    Truncation (top-k/top-p/min-p) is applied to the mixture afterwards, not to the inputs, so that ``n`` always has
    mass on ``B``. ``boundary`` is the set ``B`` that [`boundary_mask`][tandem_grpo.handoff.boundary_mask] returns.

    Args:
        senior_logprobs: float ``[B, V]``, normalized log-probabilities of the senior after the per-model sampling
            transforms (temperature, repetition penalty).
        junior_logprobs: float ``[B, V]``, normalized log-probabilities of the junior after the same transforms.
        state: the rule state before this position.
        boundary: bool ``[B, V]`` from ``boundary_mask``.

    Returns:
        float ``[B, V]``: ``log P``, normalized, ``-inf`` where ``P`` is 0.

    Raises:
        FloatingPointError: either model's log-probabilities hold NaN (NaN or ``+inf`` logits), naming the model.
    """
    require_finite_logprobs(senior_logprobs, "senior")
    require_finite_logprobs(junior_logprobs, "junior")
    o_lp = torch.where((state.owner == SENIOR).unsqueeze(1), senior_logprobs, junior_logprobs)
    switching = state.owner != state.next_owner
    if not bool(switching.any()):
        return o_lp
    # Only rows whose next owner differs from the current one are reshaped on B; the full-vocabulary work below
    # runs on those rows alone (about half of them at junior_probability 0.5).
    rows = switching.nonzero().squeeze(1)
    o_sw = o_lp.index_select(0, rows)
    n_is_senior = (state.next_owner.index_select(0, rows) == SENIOR).unsqueeze(1)
    n_sw = torch.where(n_is_senior, senior_logprobs.index_select(0, rows), junior_logprobs.index_select(0, rows))
    b_sw = boundary.index_select(0, rows)
    neg_inf = torch.tensor(float("-inf"), dtype=o_lp.dtype, device=o_lp.device)
    o_mass_b = torch.logsumexp(torch.where(b_sw, o_sw, neg_inf), dim=-1, keepdim=True)
    n_in_b = torch.where(b_sw, n_sw, neg_inf)
    n_given_b = n_in_b - torch.logsumexp(n_in_b, dim=-1, keepdim=True)
    return o_lp.index_copy(0, rows, torch.where(b_sw, o_mass_b + n_given_b, o_sw))


def advance(
    state: HandoffState, tokens: torch.Tensor, tables: BoundaryTables, rule: HandoffRule
) -> tuple[HandoffState, torch.Tensor, torch.Tensor]:
    """Update the state after each sequence emitted ``tokens`` (long ``[B]``) at the current position.

    Returns:
        ``(new_state, authors, unit_start)``: ``authors`` long ``[B]`` (1 senior, 0 junior) and ``unit_start``
        bool ``[B]`` (the token is in ``B``, so it began a new unit).
    """
    tokens = tokens.long()
    table, forced = _unit_starts(state, tables, rule)
    unit_start = table[tokens] | forced
    authors = torch.where(unit_start, state.next_owner, state.owner)
    unit_index = state.unit_index + unit_start.long()
    redrawn = draw_owners(state.seeds, unit_index, rule.junior_probability)
    new_state = HandoffState(
        owner=authors,
        next_owner=torch.where(unit_start, redrawn, state.next_owner),
        unit_length=torch.where(unit_start, torch.ones_like(state.unit_length), state.unit_length + 1),
        unit_index=unit_index,
        after_sentence_end=tables.ends_sentence[tokens],
        seeds=state.seeds,
    )
    return new_state, authors, unit_start


def replay_authorship(
    completion_ids: torch.Tensor, seeds: torch.Tensor, tables: BoundaryTables, rule: HandoffRule
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rebuild authorship from the tokens and seeds alone (what a backend that only returns text needs).

    Args:
        completion_ids: long ``[B, T]``; positions after a sequence's end may hold anything (mask them yourself).
        seeds: long ``[B]``, the seeds the completions were generated with.
        tables: the boundary tables of the tokenizer the completions were generated with.
        rule: the handoff rule they were generated with.

    Returns:
        ``(authorship, unit_starts)``: long ``[B, T]`` (1 senior, 0 junior) and bool ``[B, T]``.
    """
    state = init_state(seeds.to(completion_ids.device), rule)
    tables = tables.to(completion_ids.device)
    authors, starts = [], []
    for t in range(completion_ids.shape[1]):
        state, author, start = advance(state, completion_ids[:, t], tables, rule)
        authors.append(author)
        starts.append(start)
    if not authors:
        empty = completion_ids.new_zeros(completion_ids.shape)
        return empty, empty.bool()
    return torch.stack(authors, dim=1), torch.stack(starts, dim=1)
