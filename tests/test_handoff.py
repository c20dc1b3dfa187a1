"""The handoff rule: boundary sets, coins, the mixture, and authorship replay."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_VOCAB

from tandem_grpo.handoff import (
    JUNIOR,
    SENIOR,
    BoundaryTables,
    HandoffRule,
    advance,
    boundary_mask,
    draw_owners,
    init_state,
    mixture_logprobs,
    replay_authorship,
)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def _first_token(tokenizer, text: str) -> int:
    return _ids(tokenizer, text)[0]


def test_word_and_sentence_tables_on_real_smollm2_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    tables = BoundaryTables.from_tokenizer(tok, 49152, [tok.eos_token_id])
    starts, ends = tables.starts_word, tables.ends_sentence
    # A word starts at whitespace-led tokens, newlines and EOS ...
    for text in [" the", " answer", "\n", "\n\n", " 5", " \\frac"]:
        assert starts[_first_token(tok, text)], text
    assert starts[tok.eos_token_id] and tables.is_eos[tok.eos_token_id]
    # ... not inside a word, a number or a LaTeX command.
    the, frac = _ids(tok, "the"), _ids(tok, "\\frac{1}{2}")
    assert not starts[the[0]]
    assert not any(starts[i] for i in frac), [tok.decode([i]) for i in frac]
    digits = _ids(tok, " 51")  # SmolLM2 splits numbers into single digits: " ", "5", "1"
    assert [bool(starts[i]) for i in digits] == [True] + [False] * (len(digits) - 1)
    # Sentences end after . ! ? and newlines, not after commas or words.
    for text in [".", "!", "?", "\n"]:
        assert ends[_first_token(tok, text)], text
    for text in [",", " the", "5", ":"]:
        assert not ends[_first_token(tok, text)], text


def test_boundary_sets_per_granularity(tiny_tokenizer):
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])
    seeds = torch.tensor([5])
    v = TINY_VOCAB.index
    for granularity in ("token", "word", "sentence"):
        rule = HandoffRule(granularity, 0.5, 32, "whole_unit")
        state = init_state(seeds, rule)
        assert boundary_mask(state, tables, rule).all(), "the first completion token is always a boundary"
        state, _, _ = advance(state, torch.tensor([v("a")]), tables, rule)
        b = boundary_mask(state, tables, rule)[0]
        if granularity == "token":
            assert b.all()
        elif granularity == "word":
            assert b[v(" a")] and b[v("\n")] and b[1] and not b[v("a")] and not b[v(".")]
        else:
            assert b.tolist() == [i == 1 for i in range(len(TINY_VOCAB))], "mid-sentence only EOS starts a unit"
            state, _, _ = advance(state, torch.tensor([v(".")]), tables, rule)
            assert boundary_mask(state, tables, rule).all(), "after '.' every token starts a sentence"


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_max_gap_forces_a_decision(tiny_tokenizer, mode):
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])
    rule = HandoffRule("word", 0.5, 3, mode)
    state = init_state(torch.tensor([0]), rule)
    a = torch.tensor([TINY_VOCAB.index("a")])
    starts = []
    for _ in range(8):
        starts.append(bool(boundary_mask(state, tables, rule)[0, a[0]]))
        state, _, start = advance(state, a, tables, rule)
        assert bool(start) == starts[-1]
    assert starts == [True, False, False, True, False, False, True, False]


def test_coins_are_deterministic_and_match_probability():
    seeds = torch.arange(20000)
    for p in (0.0, 0.25, 0.5, 1.0):
        owners = draw_owners(seeds, torch.full_like(seeds, 3), p)
        junior_fraction = (owners == JUNIOR).double().mean().item()
        assert abs(junior_fraction - p) < 4 * math.sqrt(p * (1 - p) / len(seeds)) + 1e-9, (p, junior_fraction)
    a = draw_owners(seeds, torch.zeros_like(seeds), 0.5)
    assert torch.equal(a, draw_owners(seeds, torch.zeros_like(seeds), 0.5))
    b = draw_owners(seeds, torch.ones_like(seeds), 0.5)
    agreement = (a == b).double().mean().item()
    assert abs(agreement - 0.5) < 0.03, "coins of consecutive units must be independent"


def _random_logprobs(batch: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(batch, vocab, generator=g) * 2, dim=-1)


def _state(owner: list[int], next_owner: list[int]):
    state = init_state(torch.zeros(len(owner), dtype=torch.long), HandoffRule())
    state.owner = torch.tensor(owner)
    state.next_owner = torch.tensor(next_owner)
    return state


def test_mixture_matches_the_two_stage_rule_exactly():
    """P(x) = p_o(x) off B, p_o(B) p_n(x | B) on B, computed here by hand, row by row."""
    vocab = 7
    s, j = _random_logprobs(4, vocab, 0), _random_logprobs(4, vocab, 1)
    boundary = torch.tensor([[True, False, True, False, False, True, False]] * 4)
    state = _state([SENIOR, SENIOR, JUNIOR, JUNIOR], [SENIOR, JUNIOR, SENIOR, JUNIOR])
    got = mixture_logprobs(s, j, state, boundary).exp()
    for row, (o, n) in enumerate([(s, s), (s, j), (j, s), (j, j)]):
        p_o, p_n = o[row].exp(), n[row].exp()
        mass_o = p_o[boundary[row]].sum()
        mass_n = p_n[boundary[row]].sum()
        expected = torch.where(boundary[row], mass_o * p_n / mass_n, p_o)
        torch.testing.assert_close(got[row], expected, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(got[row].sum(), torch.tensor(1.0), rtol=1e-5, atol=1e-6)


def test_self_pairing_mixture_is_the_model_itself():
    lp = _random_logprobs(3, 11, 2)
    boundary = torch.rand(3, 11, generator=torch.Generator().manual_seed(3)) < 0.4
    state = _state([SENIOR, JUNIOR, SENIOR], [JUNIOR, SENIOR, SENIOR])
    torch.testing.assert_close(mixture_logprobs(lp, lp.clone(), state, boundary), lp)


def test_authors_follow_the_tokens(tiny_tokenizer):
    """A token in B is written by the pre-drawn next owner; a token outside B by the running owner."""
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])
    rule = HandoffRule("word", 0.5, 32, "whole_unit")
    state = init_state(torch.arange(64), rule)
    v = TINY_VOCAB.index
    for token in ["a", " b", "c", "c", " d", "\n", "e"]:
        before_owner, before_next = state.owner.clone(), state.next_owner.clone()
        in_b = boundary_mask(state, tables, rule)[:, v(token)]
        state, authors, starts = advance(state, torch.full((64,), v(token)), tables, rule)
        assert torch.equal(starts, in_b)
        assert torch.equal(authors, torch.where(in_b, before_next, before_owner))


def test_replay_reproduces_step_by_step_authorship(tiny_tokenizer):
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])
    rule = HandoffRule("sentence", 0.5, 4, "whole_unit")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, len(TINY_VOCAB), (16, 30), generator=g)
    seeds = torch.randint(0, 2**31 - 1, (16,), generator=g)
    state = init_state(seeds, rule)
    authors = []
    for t in range(ids.shape[1]):
        state, author, _ = advance(state, ids[:, t], tables, rule)
        authors.append(author)
    replayed, _ = replay_authorship(ids, seeds, tables, rule)
    assert torch.equal(replayed, torch.stack(authors, 1))
    other, _ = replay_authorship(ids, seeds + 1, tables, rule)
    assert not torch.equal(other, replayed), "authorship must depend on the seed"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("granularity", "paragraph"),
        ("junior_probability", 1.5),
        ("junior_probability", -0.1),
        ("max_gap_tokens", 0),
        ("max_gap_tokens", 2.5),
        ("mode", "per_word"),
    ],
)
def test_rule_rejects_bad_values(field, value):
    kwargs = {"granularity": "word", "junior_probability": 0.5, "max_gap_tokens": 32, field: value}
    with pytest.raises(ValueError, match=repr(value).replace(".", r"\.")):
        HandoffRule(**kwargs)


def test_rule_from_a_config_reads_the_tandem_fields():
    from types import SimpleNamespace

    config = SimpleNamespace(handoff_granularity="sentence", junior_probability=1, max_gap_tokens=8)
    rule = HandoffRule.from_config(config)
    assert rule == HandoffRule("sentence", 1.0, 8) and isinstance(rule.junior_probability, float)
    assert rule.mode == "after_boundary", "the paper authors' rule is the default"
    config.handoff_mode = "whole_unit"
    assert HandoffRule.from_config(config).mode == "whole_unit"
    # Checked before converting: 2.5 gap tokens must not silently become 2.
    with pytest.raises(ValueError, match="max_gap_tokens=2.5"):
        HandoffRule.from_config(
            SimpleNamespace(handoff_granularity="word", junior_probability=0.5, max_gap_tokens=2.5)
        )


def test_tables_cover_the_tokenizer_not_the_padding(tiny_tokenizer):
    wide = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB) + 64, [1, len(TINY_VOCAB) + 2])
    assert wide.vocab_size == len(TINY_VOCAB) == wide.starts_word.shape[0] == wide.ends_sentence.shape[0]
    assert wide.is_eos.nonzero().squeeze(1).tolist() == [1]
    assert BoundaryTables.from_tokenizer(tiny_tokenizer, 10, [1]).vocab_size == 10


def test_authors_word_boundaries_are_space_initial_tokens(smollm2_tokenizer):
    """The paper authors' word set: tokens whose text starts with a space (``Ġ``); not newlines, not EOS."""
    tok = smollm2_tokenizer
    tables = BoundaryTables.from_tokenizer(tok, 49152, [tok.eos_token_id])
    for text in [" the", " answer", " 5", " \\frac"]:
        assert tables.starts_space[_first_token(tok, text)], text
    for text in ["\n", "\n\n", "the", "5", "."]:
        assert not tables.starts_space[_first_token(tok, text)], text
    assert not tables.starts_space[tok.eos_token_id]
    pieces = tok.convert_ids_to_tokens(list(range(tables.vocab_size)))
    expected = torch.tensor([p.startswith("Ġ") for p in pieces]) & ~tables.is_eos
    assert torch.equal(tables.starts_space, expected), "exactly the authors' rule: the raw piece starts with Ġ"


def test_after_boundary_draws_a_coin_after_each_boundary_token(tiny_tokenizer):
    """The authors' rule: the token after a boundary token gets a fresh owner (the boundary token keeps its author);
    a position that draws a coin has B = every token, so the drawn owner writes from its own distribution."""
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])
    v = TINY_VOCAB.index
    seeds = torch.arange(256)
    cases = {
        "word": (["a", " b", "c", "c", " d", "\n", "e", "."], [0, 2, 5]),
        "sentence": (["a", " b", ".", "c", "\n", "e", " f", "."], [0, 3, 5]),
        "token": (["a", " b", ".", "c"], [0, 1, 2, 3]),
    }
    for granularity, (tokens, coin_positions) in cases.items():
        rule = HandoffRule(granularity, 0.5, 32)
        state = init_state(seeds, rule)
        starts = []
        for position, token in enumerate(tokens):
            before_owner, before_next = state.owner.clone(), state.next_owner.clone()
            boundary = boundary_mask(state, tables, rule)
            whole = bool(boundary.all())
            assert whole or not bool(boundary.any()), "B is every token or none under the authors' rule"
            state, authors, start = advance(state, torch.full((256,), v(token)), tables, rule)
            assert torch.equal(start, torch.full((256,), whole))
            assert torch.equal(authors, before_next if whole else before_owner)
            if whole:
                starts.append(position)
        assert starts == coin_positions, granularity
        # the coins are fair and per sequence: both owners occur at the second coin
        assert 0 < int(authors.sum()) < 256


def test_after_boundary_mixture_is_the_owners_own_distribution():
    """P = p_owner off coin positions and p_next at them, exactly (selected, not recomputed)."""
    s, j = _random_logprobs(4, 9, 4), _random_logprobs(4, 9, 5)
    state = _state([SENIOR, SENIOR, JUNIOR, JUNIOR], [SENIOR, JUNIOR, SENIOR, JUNIOR])
    none = torch.zeros(4, 9, dtype=torch.bool)
    assert torch.equal(mixture_logprobs(s, j, state, none), torch.stack([s[0], s[1], j[2], j[3]]))
    assert torch.equal(mixture_logprobs(s, j, state, ~none), torch.stack([s[0], j[1], s[2], j[3]]))
