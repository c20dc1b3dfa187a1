"""The handoff rule: who writes the next token of a tandem completion. One implementation, shared by every backend.

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166), section 3. ``HandoffRule.mode``
picks ``"after_boundary"`` (default; the paper authors' rule, CSSLab/Tandem-RLVR ``tandem_sampler.py``, ``word``
strategy) or ``"whole_unit"``. Both are one mixture of the current owner ``o`` and the pre-drawn next owner ``n``
over the set ``B`` of unit-starting tokens:

    P(x) = p_o(x)                       for x not in B
    P(x) = p_o(B) * p_n(x) / p_n(B)     for x in B        (P = p_o when n == o)

so one [`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs] and one [`advance`][tandem_grpo.handoff.advance]
serve both. Under ``"whole_unit"`` the senior's exact terms carry ``log p_s(B)`` at handoffs
([`senior_token_terms`][tandem_grpo.handoff.senior_token_terms]). Coins are counter-based
([`draw_owners`][tandem_grpo.handoff.draw_owners]), so authorship is rebuilt from seeds and tokens
([`replay`][tandem_grpo.handoff.replay]). The boundary sets of each rule and granularity, and why the loss is the
exact policy gradient: docs/method.md, "The two handoff rules".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

import torch

from .guards import require_finite_logprobs

SENIOR = 1
JUNIOR = 0
GRANULARITIES = ("token", "word", "sentence")
Granularity = Literal["token", "word", "sentence"]
MODES = ("after_boundary", "whole_unit")
Mode = Literal["after_boundary", "whole_unit"]
_SENTENCE_END = (".", "!", "?", "\n")
_MASK32 = 0xFFFFFFFF


def _setting(default, help: str, **metadata):  # noqa: A002 - HfArgumentParser's metadata key
    """A field of [`HandoffSettings`][tandem_grpo.handoff.HandoffSettings]; ``help`` is what ``--help`` prints."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class HandoffSettings:
    """The handoff rule's settings as users name them: the one declaration of their names, defaults, help texts and
    checks. [`TandemGRPOConfig`][tandem_grpo.config.TandemGRPOConfig] inherits these fields, ``tandem-grpo
    evaluate`` parses them as its flags (``--junior_probability`` ...), and
    [`HandoffRule`][tandem_grpo.handoff.HandoffRule] takes its defaults from them
    ([`RULE_FIELDS`][tandem_grpo.handoff.RULE_FIELDS] pairs the names).

    Attributes:
        handoff_mode (str): ``"after_boundary"`` (default; the paper authors' rule: a coin after each boundary
            token) or ``"whole_unit"`` (each unit written by one model); docs/method.md, "The two handoff rules".
        handoff_granularity (str): what a unit is: ``"token"``, ``"word"`` (default; the paper's) or ``"sentence"``.
        junior_probability (float): chance in [0, 1] that the junior writes a new unit (default 0.5, the paper's);
            ``0`` leaves the senior alone (plain GRPO rollouts in training).
        max_gap_tokens (int): a unit lasting this many tokens (>= 1) forces a handoff decision (default 32, paper).

    Raises:
        ValueError: a value outside its range, naming the field, the value and the range.
    """

    handoff_mode: str = _setting(
        "after_boundary",
        "Handoff rule: 'after_boundary' (the paper authors': a coin after each boundary token) or 'whole_unit' "
        "(each unit written by one model).",
        choices=list(MODES),
    )
    handoff_granularity: str = _setting(
        "word", "Handoff unit: 'token', 'word' (the paper's) or 'sentence'.", choices=list(GRANULARITIES)
    )
    junior_probability: float = _setting(
        0.5,
        "Probability in [0, 1] that the junior writes each new unit (paper: 0.5); 0 leaves the senior alone "
        "(plain GRPO rollouts in training).",
    )
    max_gap_tokens: int = _setting(
        32, "A unit that has lasted this many tokens (>= 1) forces a handoff decision (paper: 32)."
    )

    def __post_init__(self) -> None:
        validate_rule_fields(self.handoff_granularity, self.junior_probability, self.max_gap_tokens, self.handoff_mode)
        # In TandemGRPOConfig(HandoffSettings, GRPOConfig) the next __post_init__ is GRPOConfig's; alone, none.
        if (following := getattr(super(), "__post_init__", None)) is not None:
            following()

    @property
    def handoff_rule(self) -> HandoffRule:
        """The rule these fields describe, for [`tandem_generate`][tandem_grpo.generation.tandem_generate]."""
        return HandoffRule.from_config(self)


RULE_FIELDS = {"granularity": "handoff_granularity", "junior_probability": "junior_probability",
               "max_gap_tokens": "max_gap_tokens", "mode": "handoff_mode"}  # fmt: skip
"""Each [`HandoffRule`][tandem_grpo.handoff.HandoffRule] field and the
[`HandoffSettings`][tandem_grpo.handoff.HandoffSettings] field it is declared by (the rule's names are shorter)."""

_DECLARED = {f.name: f for f in fields(HandoffSettings)}


def _rule_field(name: str):
    """The ``HandoffRule`` field ``name`` with its setting's default and help."""
    declared = _DECLARED[RULE_FIELDS[name]]
    return field(default=declared.default, metadata=declared.metadata)


@dataclass(frozen=True)
class HandoffRule:
    """The handoff rule that generation and replay run. Its fields are the
    [`HandoffSettings`][tandem_grpo.handoff.HandoffSettings] fields under the shorter names of
    [`RULE_FIELDS`][tandem_grpo.handoff.RULE_FIELDS], with their meanings, defaults and checks (``ValueError``).
    """

    granularity: Granularity = _rule_field("granularity")
    junior_probability: float = _rule_field("junior_probability")
    max_gap_tokens: int = _rule_field("max_gap_tokens")
    mode: Mode = _rule_field("mode")

    def __post_init__(self) -> None:
        validate_rule_fields(self.granularity, self.junior_probability, self.max_gap_tokens, self.mode)

    @classmethod
    def from_config(cls, config) -> HandoffRule:
        """The rule of an object with the [`HandoffSettings`][tandem_grpo.handoff.HandoffSettings] fields, e.g.
        ``TandemGRPOConfig``; ``handoff_mode`` may be missing (its default is used); as ``checked``."""
        mode = getattr(config, "handoff_mode", _DECLARED["handoff_mode"].default)
        return cls.checked(config.handoff_granularity, config.junior_probability, config.max_gap_tokens, mode)

    @classmethod
    def checked(cls, granularity, junior_probability, max_gap_tokens, mode) -> HandoffRule:
        """The rule of raw values (a config's, a request's), checked (``ValueError``) before any conversion."""
        validate_rule_fields(granularity, junior_probability, max_gap_tokens, mode)
        return cls(granularity, float(junior_probability), int(max_gap_tokens), mode)

    @property
    def sole_writer(self) -> str | None:
        """``"senior"`` (``junior_probability`` 0) or ``"junior"`` (1) where one model writes every token, else
        ``None``: whether the junior runs at all, the one test the trainer, TRL generation and the evaluation make."""
        return {0.0: "senior", 1.0: "junior"}.get(float(self.junior_probability))

    @classmethod
    def alone(cls, writer: str) -> HandoffRule:
        """The rule under which ``writer`` (``"senior"`` or ``"junior"``) writes every token."""
        return cls("token", 1.0 if writer == "junior" else 0.0)


def validate_rule_fields(
    granularity: object, junior_probability: object, max_gap_tokens: object, mode: object = "after_boundary"
) -> None:
    """Raise ``ValueError`` naming the field, the value and the allowed range (shared by every config class)."""
    if mode not in MODES:
        raise ValueError(
            f"handoff_mode={mode!r} is not supported; use 'after_boundary' (the paper authors' rule, default) or "
            "'whole_unit' (each unit written by one model)."
        )
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
        starts_word: bool ``[V]``, the token's text starts with whitespace, or it is an EOS token (``"whole_unit"``
            word boundaries).
        ends_sentence: bool ``[V]``, the token's text ends with ``.``, ``!``, ``?`` or a newline.
        is_eos: bool ``[V]``, the token is one of the EOS ids.
        starts_space: bool ``[V]``, the token's text starts with a space (``Ġ``/``▁`` pieces; not newlines, not
            EOS): the ``"after_boundary"`` word boundaries, as the paper authors' ``build_word_boundary_ids.py``.
    """

    starts_word: torch.Tensor
    ends_sentence: torch.Tensor
    is_eos: torch.Tensor
    starts_space: torch.Tensor

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int, eos_token_ids: list[int]) -> BoundaryTables:
        """Tables for the first ``V = min(len(tokenizer), vocab_size)`` ids; every backend cuts logits to these
        ``V`` columns, so embedding padding rows are never sampled. EOS ids ``>= V`` are left out. A leading ``▁``
        (dropped by ``decode``) is read from the raw token string.
        """
        n = min(len(tokenizer), vocab_size)
        texts = tokenizer.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        starts = [t[:1].isspace() or (p or "").startswith("▁") for t, p in zip(texts, pieces, strict=True)]
        spaces = [t[:1] == " " or (p or "").startswith(("▁", "Ġ")) for t, p in zip(texts, pieces, strict=True)]
        ends = [t.endswith(_SENTENCE_END) for t in texts]
        is_eos = torch.zeros(n, dtype=torch.bool)
        is_eos[[i for i in eos_token_ids if 0 <= i < n]] = True
        return cls(
            starts_word=torch.tensor(starts, dtype=torch.bool) | is_eos,
            ends_sentence=torch.tensor(ends, dtype=torch.bool),
            is_eos=is_eos,
            starts_space=torch.tensor(spaces, dtype=torch.bool) & ~is_eos,
        )

    @property
    def vocab_size(self) -> int:
        """``V``: the number of token ids (logits columns) the tables cover."""
        return int(self.is_eos.shape[0])

    def to(self, device: torch.device | str) -> BoundaryTables:
        return BoundaryTables(
            self.starts_word.to(device), self.ends_sentence.to(device), self.is_eos.to(device),
            self.starts_space.to(device),
        )  # fmt: skip


@dataclass
class HandoffState:
    """Per-sequence rule state; every tensor has shape ``[B]`` and lives on the logits' device.

    Attributes:
        owner: author of the running unit (``SENIOR`` = 1 or ``JUNIOR`` = 0), long.
        next_owner: pre-drawn author of the next unit, long.
        unit_length: tokens in the running unit; 0 before the first completion token, long.
        unit_index: index of the next unit to draw an owner for, long.
        unit_ended: the previous token ended the running unit, so this position starts a new one (a forced unit
            start): a sentence end for ``"whole_unit"`` sentences, the rule's boundary token for ``"after_boundary"``
            (so this position draws a coin), bool.
        seeds: coin-stream seed of each sequence, long.
    """

    owner: torch.Tensor
    next_owner: torch.Tensor
    unit_length: torch.Tensor
    unit_index: torch.Tensor
    unit_ended: torch.Tensor
    seeds: torch.Tensor


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    # MurmurHash3's 32-bit finalizer on int64; the mask keeps values in [0, 2^32) so shifts are logical.
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def draw_owners(seeds: torch.Tensor, unit_index: torch.Tensor, junior_probability: float) -> torch.Tensor:
    """Owner (long ``[B]``, ``SENIOR``/``JUNIOR``) of unit ``unit_index`` (long ``[B]``) of each sequence:
    ``JUNIOR`` iff ``hash(seed, unit_index) / 2**32 < junior_probability`` (in [0, 1]); deterministic per (seed, unit),
    independent across units and seeds (``seeds``: long ``[B]``, each sequence's coin-stream seed)."""
    key = (_fmix32(seeds.long() & _MASK32) + unit_index.long() * 0x9E3779B9) & _MASK32
    u = _fmix32(key).double() / 2.0**32
    return torch.where(u < junior_probability, JUNIOR, SENIOR).long()


def init_state(seeds: torch.Tensor, rule: HandoffRule) -> HandoffState:
    """State before the first completion token; the first unit is written by ``draw_owners(seeds, 0)``."""
    seeds = seeds.long()
    zeros = torch.zeros_like(seeds)
    return HandoffState(
        owner=torch.full_like(seeds, SENIOR),
        next_owner=draw_owners(seeds, zeros, rule.junior_probability),
        unit_length=zeros.clone(),
        unit_index=zeros.clone(),
        unit_ended=torch.zeros_like(seeds, dtype=torch.bool),
        seeds=seeds,
    )


def _unit_starts(state: HandoffState, tables: BoundaryTables, rule: HandoffRule) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table, forced)``: ``B`` is ``table[v] | forced[row]``; ``table`` is empty under ``"after_boundary"``."""
    forced = (state.unit_length == 0) | (state.unit_length >= rule.max_gap_tokens)
    if rule.mode == "after_boundary":
        return torch.zeros_like(tables.is_eos), forced | state.unit_ended
    return unit_start_ids(tables, rule), forced | state.unit_ended


def unit_start_ids(tables: BoundaryTables, rule: HandoffRule) -> torch.Tensor:
    """The token-dependent part of ``B`` under ``"whole_unit"``, bool ``[V]``: ``starts_word`` (word), EOS
    (sentence), every id (token); ``B`` at an unforced position, what ``log p_s(B)`` sums over.

    Raises:
        ValueError: ``rule.mode`` is not ``"whole_unit"`` (the other rule's ``B`` is empty or everything).
    """
    if rule.mode != "whole_unit":
        raise ValueError(f"unit_start_ids is the 'whole_unit' rule's set; this rule is {rule.mode!r}.")
    if rule.granularity == "token":
        return torch.ones_like(tables.is_eos)
    return tables.starts_word if rule.granularity == "word" else tables.is_eos


def _ends_unit(tokens: torch.Tensor, tables: BoundaryTables, rule: HandoffRule) -> torch.Tensor:
    """Whether each token makes the *next* position a forced unit start (``unit_ended`` of the next state)."""
    if rule.mode == "whole_unit":
        ends = tables.ends_sentence[tokens]
        return ends if rule.granularity == "sentence" else torch.zeros_like(ends)
    if rule.granularity == "word":
        return tables.starts_space[tokens]
    if rule.granularity == "sentence":
        return tables.ends_sentence[tokens]
    return torch.ones_like(tokens, dtype=torch.bool)


def boundary_mask(state: HandoffState, tables: BoundaryTables, rule: HandoffRule) -> torch.Tensor:
    """The set ``B`` for each sequence at the current position, bool ``[B, V]``."""
    table, forced = _unit_starts(state, tables, rule)
    return table.unsqueeze(0) | forced.unsqueeze(1)


def mixture_logprobs(
    senior_logprobs: torch.Tensor,
    junior_logprobs: torch.Tensor,
    state: HandoffState,
    boundary: torch.Tensor,
    *,
    sync_strategy: Literal["detect", "masked", "none"] = "detect",
) -> torch.Tensor:
    """Log-probabilities of the tandem mixture ``P`` (module docstring) at the current position; truncation
    (top-k/top-p/min-p) comes after, on the mixture.

    Args:
        senior_logprobs: float ``[B, V]``, the senior's log-probabilities after temperature and penalties.
        junior_logprobs: float ``[B, V]``, the junior's, after the same transforms.
        state: the rule state before this position.
        boundary: bool ``[B, V]`` from [`boundary_mask`][tandem_grpo.handoff.boundary_mask].
        sync_strategy: whether and how the call waits on the device to find the rows reshaped on ``B``
            ([`handoff_rows`][tandem_grpo.handoff.handoff_rows]); same values in every mode. ``"detect"``
            (default): syncs, for the NaN check and to reshape the switching rows alone. ``"masked"``: no sync,
            no NaN check, reshaping computed on every row. ``"none"``: no sync, no check, no row reshaped (right
            under ``"after_boundary"``).

    Returns:
        float ``[B, V]``: ``log P``, normalized, ``-inf`` where ``P`` is 0.

    Raises:
        FloatingPointError: either model's log-probabilities hold NaN (NaN or ``+inf`` logits), naming the model
            (``sync_strategy="detect"`` only).
    """
    if sync_strategy == "detect":
        require_finite_logprobs(senior_logprobs, "senior")
        require_finite_logprobs(junior_logprobs, "junior")
    # Where B is every token, P = p_n: selected, not computed, so a self-paired tandem draws the senior's numbers.
    whole = boundary.all(dim=-1)
    writer = torch.where(whole, state.next_owner, state.owner)
    o_lp = torch.where((writer == SENIOR).unsqueeze(1), senior_logprobs, junior_logprobs)
    if sync_strategy == "none":
        return o_lp
    switching = handoff_rows(state, boundary)
    if sync_strategy == "masked":
        n_lp = torch.where((state.next_owner == SENIOR).unsqueeze(1), senior_logprobs, junior_logprobs)
        return torch.where(switching.unsqueeze(1), _reshape_on_boundary(o_lp, n_lp, boundary), o_lp)
    if not bool(switching.any()):
        return o_lp
    # The full-vocabulary work runs on the switching rows alone.
    rows = switching.nonzero().squeeze(1)
    o_sw = o_lp.index_select(0, rows)
    n_is_senior = (state.next_owner.index_select(0, rows) == SENIOR).unsqueeze(1)
    n_sw = torch.where(n_is_senior, senior_logprobs.index_select(0, rows), junior_logprobs.index_select(0, rows))
    return o_lp.index_copy(0, rows, _reshape_on_boundary(o_sw, n_sw, boundary.index_select(0, rows)))


def _reshape_on_boundary(o_lp: torch.Tensor, n_lp: torch.Tensor, boundary: torch.Tensor) -> torch.Tensor:
    """``log P`` of a switching row: ``log p_o`` off ``B``, ``log p_o(B) + log p_n(x) - log p_n(B)`` on ``B``."""
    neg_inf = torch.tensor(float("-inf"), dtype=o_lp.dtype, device=o_lp.device)
    o_mass_b = torch.logsumexp(torch.where(boundary, o_lp, neg_inf), dim=-1, keepdim=True)
    n_in_b = torch.where(boundary, n_lp, neg_inf)
    n_given_b = n_in_b - torch.logsumexp(n_in_b, dim=-1, keepdim=True)
    return torch.where(boundary, o_mass_b + n_given_b, o_lp)


def handoff_rows(state: HandoffState, boundary: torch.Tensor) -> torch.Tensor:
    """bool ``[B]``: rows whose next token may change the owner within a proper, non-empty ``B`` (``"whole_unit"``
    only), the only rows where ``P`` differs from one model's distribution. ``boundary``: ``boundary_mask``'s."""
    return (state.owner != state.next_owner) & ~boundary.all(dim=-1) & boundary.any(dim=-1)


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
        unit_ended=_ends_unit(tokens, tables, rule),
        seeds=state.seeds,
    )
    return new_state, authors, unit_start


def boundary_coefficients(
    state: HandoffState, authors: torch.Tensor, unit_start: torch.Tensor, tables: BoundaryTables, rule: HandoffRule
) -> torch.Tensor:
    """Coefficient of ``log p_s(B)`` in the senior's exact score term of the token just drawn, long ``[B]``: ``-1``
    where the senior takes a unit over, ``+1`` where it hands one to the junior, ``0`` elsewhere (wherever ``B`` is
    every token, so always under ``"after_boundary"``). ``state`` is the one *before* the token; ``authors`` and
    ``unit_start`` what [`advance`][tandem_grpo.handoff.advance] returned for it, given ``tables`` and ``rule``."""
    table, forced = _unit_starts(state, tables, rule)
    partial = unit_start & ~forced & ~table.all()
    handoff = partial & (state.owner != authors)
    coefficient = torch.where(authors == SENIOR, -1, 1)
    return torch.where(handoff, coefficient, 0).long()


@dataclass
class HandoffTrace:
    """Who wrote each token of a batch of completions, and the senior's exact score terms; tensors ``[B, T]``.

    Attributes:
        authorship: long, 1 where the senior wrote the token, 0 where the junior did (the authorship mask).
        unit_starts: bool, the token began a new unit.
        boundary_coef: long in {-1, 0, 1}, see
            [`boundary_coefficients`][tandem_grpo.handoff.boundary_coefficients]; all 0 under ``"after_boundary"``.
    """

    authorship: torch.Tensor
    unit_starts: torch.Tensor
    boundary_coef: torch.Tensor


def replay(
    completion_ids: torch.Tensor, seeds: torch.Tensor, tables: BoundaryTables, rule: HandoffRule
) -> HandoffTrace:
    """Rebuild authorship and the senior's score coefficients from the tokens and seeds alone: a
    [`HandoffTrace`][tandem_grpo.handoff.HandoffTrace] of ``[B, T]`` tensors. ``completion_ids`` is long ``[B, T]``
    (positions after a sequence's end may hold anything: mask them yourself), ``seeds`` long ``[B]``; ``seeds``,
    ``tables`` and ``rule`` must be those the completions were generated with."""
    state = init_state(seeds.to(completion_ids.device), rule)
    tables = tables.to(completion_ids.device)
    authors, starts, coefs = [], [], []
    for t in range(completion_ids.shape[1]):
        before = state
        state, author, start = advance(state, completion_ids[:, t], tables, rule)
        authors.append(author)
        starts.append(start)
        coefs.append(boundary_coefficients(before, author, start, tables, rule))
    if not authors:
        empty = completion_ids.new_zeros(completion_ids.shape)
        return HandoffTrace(empty, empty.bool(), empty.clone())
    return HandoffTrace(torch.stack(authors, dim=1), torch.stack(starts, dim=1), torch.stack(coefs, dim=1))


def replay_authorship(
    completion_ids: torch.Tensor, seeds: torch.Tensor, tables: BoundaryTables, rule: HandoffRule
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(authorship, unit_starts)`` of [`replay`][tandem_grpo.handoff.replay]: long and bool ``[B, T]``."""
    trace = replay(completion_ids, seeds, tables, rule)
    return trace.authorship, trace.unit_starts


def boundary_logprobs(logprobs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log p(B)``, float ``[N]`` (differentiable): the log of the mass each row of ``logprobs`` (float ``[N, V]``,
    log-probabilities or logits: the result normalizes itself) puts on the token set ``ids`` (bool ``[V]``,
    [`unit_start_ids`][tandem_grpo.handoff.unit_start_ids])."""
    inside = logprobs.masked_fill(~ids.to(logprobs.device), float("-inf"))
    return torch.logsumexp(inside, dim=-1) - torch.logsumexp(logprobs, dim=-1)


def senior_token_terms(
    token_logprobs: torch.Tensor,
    boundary_logprob: torch.Tensor,
    authorship: torch.Tensor,
    boundary_coef: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The senior's per-token score terms ``authorship * log p_s(x_t) + boundary_coef * log p_s(B_t)``: summed, the
    log of the senior's factor of the trajectory's probability (docs/method.md, "Why the loss is the exact policy
    gradient"). The trainer uses them as TRL's per-token log-probs and ``mask`` as its completion mask.

    Args:
        token_logprobs: float ``[..., T]``, ``log p_s(x_t)`` of every token (any value on junior tokens).
        boundary_logprob: float ``[..., T]``, ``log p_s(B_t)`` where ``boundary_coef != 0``
            ([`boundary_logprobs`][tandem_grpo.handoff.boundary_logprobs]; any finite value elsewhere).
        authorship: ``[..., T]``, 1 senior, 0 junior; ``boundary_coef``: ``[..., T]`` in {-1, 0, 1}
            ([`replay`][tandem_grpo.handoff.replay]).

    Returns:
        ``(terms, mask)``: float ``[..., T]`` (0 where the senior has no factor) and bool ``[..., T]`` (the
        positions whose term involves the senior).
    """
    senior = authorship.bool()
    coef = boundary_coef.to(token_logprobs.dtype)
    with_boundary = boundary_coef != 0
    terms = torch.where(senior, token_logprobs, torch.zeros_like(token_logprobs))
    terms = terms + torch.where(with_boundary, coef * boundary_logprob, torch.zeros_like(terms))
    return terms, senior | with_boundary
