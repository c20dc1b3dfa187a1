"""The one rollout type: what every generator returns, and the record the trainer reads instead of replaying."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import TINY_VOCAB, build_tiny_model

from tandem_grpo.generation import tandem_generate
from tandem_grpo.handoff import BoundaryTables, HandoffRule, boundary_logprobs, senior_token_terms, unit_start_ids
from tandem_grpo.rollout import Rollout


@pytest.fixture(scope="module")
def tables(tiny_tokenizer):
    return BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])


def _generate(tiny_tokenizer, tables, rule, n=24, tokens=30):
    tiny_tokenizer.padding_side = "left"
    enc = tiny_tokenizer(["ab c", "d", "e f.\ng"] * (n // 3), return_tensors="pt", padding=True)
    return tandem_generate(
        build_tiny_model(0), build_tiny_model(1), enc.input_ids, enc.attention_mask, rule=rule, tables=tables,
        max_new_tokens=tokens, eos_token_ids=[1], pad_token_id=0, seeds=torch.arange(n) + 50,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_the_decode_loop_records_what_a_replay_rebuilds(tiny_tokenizer, tables, mode):
    """The record tandem_generate keeps while drawing (authorship, unit starts, log p_s(B) coefficients) equals the
    rule replayed over its tokens and seeds: the trainer can read it instead of replaying."""
    rule = HandoffRule("word", 0.5, 32, mode)
    out = _generate(tiny_tokenizer, tables, rule)
    assert out.seeds == list(range(50, 74))
    replayed = Rollout.replay(out.completion_ids, out.seeds, rule, tables)
    assert dataclasses.replace(out, senior_logprobs=None) == replayed
    coefs = [c for row in out.boundary_coef for c in row]
    if mode == "whole_unit":
        assert {-1, 1} <= set(coefs), "handoffs both ways must occur for the comparison to mean something"
    else:
        assert set(coefs) == {0}
    assert out.mixture_logprobs is None


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_the_decode_loop_keeps_the_seniors_terms(tiny_tokenizer, tables, mode):
    """The loop's ``senior_logprobs`` are what the trainer's loss recomputes along its tokens
    (``handoff.senior_token_terms`` of the senior's own log-probs: ``log p_s(x)``, less ``log p_s(B)`` where the
    senior took a unit over, ``log p_s(B)`` alone on a junior token it handed over), NaN on other junior tokens: the
    trainer's engine check compares the two."""
    rule = HandoffRule("word", 0.5, 32, mode)
    out = _generate(tiny_tokenizer, tables, rule)
    tiny_tokenizer.padding_side = "left"
    prompts = tiny_tokenizer(["ab c", "d", "e f.\ng"] * 8).input_ids
    senior = build_tiny_model(0)
    starts = unit_start_ids(tables, rule) if mode == "whole_unit" else torch.ones(len(TINY_VOCAB), dtype=torch.bool)
    checked = 0
    for prompt, ids, authors, coefs, terms in zip(prompts, out.completion_ids, out.authorship, out.boundary_coef,
                                                  out.senior_logprobs, strict=True):  # fmt: skip
        with torch.no_grad():
            logprobs = torch.log_softmax(senior(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1], -1)
        token_lp = logprobs.gather(1, torch.tensor(ids).unsqueeze(1))[:, 0]
        expected, involved = senior_token_terms(token_lp, boundary_logprobs(logprobs, starts),
                                                torch.tensor(authors), torch.tensor(coefs))  # fmt: skip
        for t, term in enumerate(terms):
            if not involved[t]:
                assert math.isnan(term)
                continue
            assert term == pytest.approx(expected[t].item(), abs=1e-4), (t, coefs[t])
            checked += 1
    assert checked > 20


def test_replay_takes_one_rule_per_completion(tiny_tokenizer, tables):
    rules = [HandoffRule("word", 0.0, 32), HandoffRule("word", 1.0, 32)] * 12
    out = _generate(tiny_tokenizer, tables, HandoffRule("word", 0.5, 32))
    replayed = Rollout.replay(out.completion_ids, out.seeds, rules, tables)
    for row, authors in enumerate(replayed.authorship):
        assert set(authors) <= {1 - row % 2}
    with pytest.raises(ValueError, match="24 completions but 24 seeds and 2 rules"):
        Rollout.replay(out.completion_ids, out.seeds, rules[:2], tables)


def test_fields_must_fit_the_completions():
    with pytest.raises(ValueError, match="2 completions but 1 seeds"):
        Rollout([[5], [6, 1]], [[1], [1, 0]], [[True], [True, False]], [[0], [0, 0]], [0])
    with pytest.raises(ValueError, match="`authorship` does not have one value per token"):
        Rollout([[5], [6, 1]], [[1], [1]], [[True], [True, False]], [[0], [0, 0]], [0, 1])


def test_select_tensor_and_share():
    rollout = Rollout([[5], [6, 1], []], [[1], [1, 0], []], [[True], [True, True], []], [[0], [0, 1], []], [7, 8, 9],
                      senior_logprobs=[[-0.5], [-1.0, math.nan], []])  # fmt: skip
    assert rollout.select([1]).completion_ids == [[6, 1]] and rollout.select([1]).seeds == [8]
    assert rollout.select(slice(0, 1)).senior_logprobs == [[-0.5]]
    assert rollout.tensor("completion_ids", pad=3).tolist() == [[5, 3], [6, 1], [3, 3]]
    assert rollout.tensor("unit_starts").tolist() == [[True, False], [True, True], [False, False]]
    assert rollout.completion_mask().tolist() == [[1, 0], [1, 1], [0, 0]]
    assert rollout.senior_token_share() == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no `mixture_logprobs`"):
        rollout.tensor("mixture_logprobs")


def test_from_engine_checks_the_engine_record_and_builds_the_senior_terms(tiny_tokenizer, tables):
    """What the vLLM paths return: the replayed record, the engine's authorship checked against it, and the senior's
    terms from vLLM's log P plus the processor's correction (senior tokens), its log p_s(B) (handed-over junior
    tokens), NaN (other junior tokens)."""
    rule = HandoffRule("word", 0.5, 32, "whole_unit")
    drawn = _generate(tiny_tokenizer, tables, rule)
    mixture = [[-0.25] * n for n in drawn.lengths]
    records = [
        {"authors": authors[:-1], "corrections": [0.5] * len(authors), "handovers": [-2.0] * len(authors)}
        for authors in drawn.authorship
    ]
    rollout = Rollout.from_engine(drawn.completion_ids, mixture, records, drawn.seeds, rule, tables)
    assert (rollout.authorship, rollout.unit_starts, rollout.boundary_coef) == (
        drawn.authorship, drawn.unit_starts, drawn.boundary_coef,
    )  # fmt: skip
    assert rollout.mixture_logprobs == mixture
    for authors, terms in zip(rollout.authorship, rollout.senior_logprobs, strict=True):
        for author, term in zip(authors, terms, strict=True):
            assert term == 0.25 if author == 1 else term == -2.0
    records[3] = {**records[3], "authors": [1 - a for a in records[3]["authors"]]}
    with pytest.raises(RuntimeError, match="Completion 3: the engine's authorship differs"):
        Rollout.from_engine(drawn.completion_ids, mixture, records, drawn.seeds, rule, tables)
    longest = max(range(3), key=lambda i: drawn.lengths[i])
    assert drawn.lengths[longest] > 1
    short = [{**r, "authors": []} if i == longest else r for i, r in enumerate(records)]  # a record that stopped early
    with pytest.raises(RuntimeError, match=f"Completion {longest}: the engine's authorship differs"):
        Rollout.from_engine(drawn.completion_ids, mixture, short, drawn.seeds, rule, tables)
    with pytest.raises(RuntimeError, match="kept no record for completion 0"):
        Rollout.from_engine(drawn.completion_ids, mixture, [None] * len(records), drawn.seeds, rule, tables)
