"""The transformers co-generation loop on tiny random models (fast) and its statistics."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_VOCAB, build_tiny_model, pad_vocabulary

from tandem_grpo.generation import tandem_generate
from tandem_grpo.handoff import JUNIOR, SENIOR, BoundaryTables, HandoffRule, draw_owners, init_state
from tandem_grpo.sampling import SamplingSettings


@pytest.fixture(scope="module")
def models():
    return build_tiny_model(0), build_tiny_model(1)


@pytest.fixture(scope="module")
def tables(tiny_tokenizer):
    return BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])


def _prompts(tokenizer, n: int, texts=("ab c", "d", "e f.\ng")):
    tokenizer.padding_side = "left"
    enc = tokenizer([texts[i % len(texts)] for i in range(n)], return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def _generate(models, tokenizer, tables, rule, n=64, tokens=40, seed=0, **kw):
    senior, junior = models
    ids, mask = _prompts(tokenizer, n)
    return tandem_generate(
        senior,
        junior,
        ids,
        mask,
        rule=rule,
        tables=tables,
        max_new_tokens=tokens,
        eos_token_ids=[1],
        pad_token_id=0,
        seeds=torch.arange(n) + 1000 * seed,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


def _chi2_sf(stat: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0)))


@pytest.mark.parametrize("granularity", ["token", "word", "sentence"])
def test_probability_zero_and_one_give_single_authors(models, tiny_tokenizer, tables, granularity):
    for p, author in ((0.0, SENIOR), (1.0, JUNIOR)):
        out = _generate(models, tiny_tokenizer, tables, HandoffRule(granularity, p, 32), n=16, tokens=20)
        written = out.tensor("authorship")[out.completion_mask().bool()]
        assert written.numel() > 0 and bool((written == author).all()), (granularity, p)


@pytest.mark.parametrize("p", [0.3, 0.5, 0.8])
def test_junior_unit_fraction_matches_probability(models, tiny_tokenizer, tables, p):
    out = _generate(models, tiny_tokenizer, tables, HandoffRule("word", p, 32), n=96, tokens=40)
    mask = out.completion_mask().bool()
    starts = out.tensor("unit_starts") & mask
    junior_units = (starts & (out.tensor("authorship") == JUNIOR)).sum().item()
    units = starts.sum().item()
    assert units > 500
    sd = math.sqrt(p * (1 - p) / units)
    assert abs(junior_units / units - p) < 4 * sd, (junior_units / units, p)


def test_no_unit_exceeds_max_gap(models, tiny_tokenizer, tables):
    def longest_unit(out) -> int:
        longest = 0
        for starts in out.unit_starts:
            run = 0
            for s in starts:
                run = 1 if s else run + 1
                longest = max(longest, run)
        return longest

    # Sentence units are long under these models; without the cap some unit runs past 3 tokens ...
    uncapped = _generate(models, tiny_tokenizer, tables, HandoffRule("sentence", 0.5, 1000), n=32, tokens=40)
    assert longest_unit(uncapped) > 3
    # ... and with the cap none does.
    capped = _generate(models, tiny_tokenizer, tables, HandoffRule("sentence", 0.5, 3), n=32, tokens=40)
    assert longest_unit(capped) == 3


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_self_pairing_is_distributed_like_the_model_alone(models, tiny_tokenizer, tables, mode):
    """Tandem(senior, copy of senior) vs the senior's exact two-token distribution, chi-square at 0.1 %, under both
    handoff rules."""
    senior = models[0]
    n = 4000
    out = tandem_generate(
        senior,
        build_tiny_model(0),
        *_prompts(tiny_tokenizer, n, texts=("ab c",)),
        rule=HandoffRule("word", 0.5, 32, mode),
        tables=tables,
        max_new_tokens=2,
        eos_token_ids=[1],
        pad_token_id=0,
        seeds=torch.arange(n),
        generator=torch.Generator().manual_seed(7),
    )
    handed_off = (out.tensor("authorship", pad=SENIOR) == JUNIOR).any(dim=1).double().mean().item()
    assert 0.3 < handed_off < 0.9, "the test must exercise real handoffs"
    prompt = torch.tensor([tiny_tokenizer("ab c").input_ids])
    with torch.no_grad():
        p1 = torch.softmax(senior(prompt).logits[0, -1].double(), -1)
        seconds = torch.cat([prompt.repeat(len(TINY_VOCAB), 1), torch.arange(len(TINY_VOCAB))[:, None]], dim=1)
        p2 = torch.softmax(senior(seconds).logits[:, -1].double(), -1)
    expected = (p1[:, None] * p2).flatten() * n
    expected[1 * len(TINY_VOCAB) : 2 * len(TINY_VOCAB)] = 0  # after EOS the second token is padding
    expected[1 * len(TINY_VOCAB)] = p1[1] * n
    ids = out.tensor("completion_ids")  # padded with 0, the pad id, after EOS
    pairs = ids[:, 0] * len(TINY_VOCAB) + ids[:, 1]
    observed = torch.bincount(pairs, minlength=len(TINY_VOCAB) ** 2).double()
    big = expected >= 5
    rest_obs, rest_exp = observed[~big].sum(), expected[~big].sum()
    stat = (((observed[big] - expected[big]) ** 2) / expected[big]).sum().item()
    stat += ((rest_obs - rest_exp) ** 2 / rest_exp).item() if rest_exp >= 5 else 0.0
    dof = int(big.sum().item()) + (1 if rest_exp >= 5 else 0) - 1
    assert _chi2_sf(stat, dof) > 1e-3, (stat, dof)


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_mixture_sampling_matches_the_literal_rule(models, tiny_tokenizer, tables, mode):
    """Sampling from the mixture vs the rule as stated, implemented here independently; first two tokens,
    two-sample chi-square at 0.1 %. whole_unit: sample from o; on a boundary with n != o, resample from n restricted
    to B. after_boundary (the authors'): sample from the owner; after a space-initial token a coin draws a new
    owner."""
    senior, junior = models
    rule = HandoffRule("word", 0.5, 32, mode)
    n = 4000
    ids, mask = _prompts(tiny_tokenizer, n, texts=("ab",))
    tandem = tandem_generate(
        senior, junior, ids, mask, rule=rule, tables=tables, max_new_tokens=2, eos_token_ids=[1], pad_token_id=0,
        seeds=torch.arange(n), generator=torch.Generator().manual_seed(3),
    )  # fmt: skip

    g = torch.Generator().manual_seed(11)
    state = init_state(torch.arange(n), rule)  # same seeds, so the same owners per unit
    owner, nxt = state.owner.clone(), state.next_owner.clone()
    seq = ids
    tokens = []
    for position in range(2):
        with torch.no_grad():
            p_s = torch.softmax(senior(seq, attention_mask=torch.ones_like(seq)).logits[:, -1], -1)
            p_j = torch.softmax(junior(seq, attention_mask=torch.ones_like(seq)).logits[:, -1], -1)
        if mode == "after_boundary":
            # The coin of unit k is the k-th redraw: unit 0 at the first token, unit 1 after a space-initial token.
            starts = position == 0 or tables.starts_space[tokens[-1]]
            author = draw_owners(torch.arange(n), torch.full((n,), 0 if position == 0 else 1), 0.5)
            author = torch.where(torch.as_tensor(starts), author, owner)
            p_a = torch.where((author == SENIOR)[:, None], p_s, p_j)
            x = torch.multinomial(p_a, 1, generator=g).squeeze(1)
            owner = author
            tokens.append(x)
            seq = torch.cat([seq, x[:, None]], dim=1)
            continue
        p_o = torch.where((owner == SENIOR)[:, None], p_s, p_j)
        p_n = torch.where((nxt == SENIOR)[:, None], p_s, p_j)
        boundary = torch.ones_like(p_s, dtype=torch.bool) if position == 0 else tables.starts_word.expand_as(p_s)
        x = torch.multinomial(p_o, 1, generator=g).squeeze(1)
        in_b = boundary.gather(1, x[:, None]).squeeze(1)
        resample = in_b & (owner != nxt)
        x_n = torch.multinomial(p_n * boundary, 1, generator=g).squeeze(1)
        x = torch.where(resample, x_n, x)
        owner = torch.where(in_b, nxt, owner)
        nxt = torch.where(in_b, torch.tensor(-1), nxt)  # a fresh draw; position 1's boundary tokens need unit 1
        nxt = torch.where(nxt < 0, draw_owners(torch.arange(n), torch.full((n,), position + 1), 0.5), nxt)
        tokens.append(x)
        seq = torch.cat([seq, x[:, None]], dim=1)
    reference = tokens[0] * len(TINY_VOCAB) + torch.where(tokens[0] == 1, 0, tokens[1])
    drawn = tandem.tensor("completion_ids")
    got = drawn[:, 0] * len(TINY_VOCAB) + drawn[:, 1]
    a = torch.bincount(got, minlength=len(TINY_VOCAB) ** 2).double()
    b = torch.bincount(reference, minlength=len(TINY_VOCAB) ** 2).double()
    keep = (a + b) >= 10
    stat = (((a - b) ** 2 / (a + b))[keep]).sum().item()
    assert _chi2_sf(stat, int(keep.sum()) - 1) > 1e-3, stat


def test_generation_is_reproducible_and_stops_at_eos(models, tiny_tokenizer, tables):
    rule = HandoffRule("word", 0.5, 32)
    a = _generate(models, tiny_tokenizer, tables, rule, n=8, tokens=30, seed=5)
    b = _generate(models, tiny_tokenizer, tables, rule, n=8, tokens=30, seed=5)
    assert a == b
    c = _generate(models, tiny_tokenizer, tables, rule, n=8, tokens=30, seed=6)
    assert a.completion_ids != c.completion_ids
    for ids in a.completion_ids:
        assert 1 not in ids[:-1], "nothing is generated after EOS"
        assert ids[-1] == 1 or len(ids) == 30, "a completion ends at EOS or at the cap"


def test_truncation_applies_to_the_mixture(models, tiny_tokenizer, tables):
    ids, mask = _prompts(tiny_tokenizer, 32)
    runs = [
        tandem_generate(
            *models, ids, mask, rule=HandoffRule("token", 0.5, 32), tables=tables, max_new_tokens=5,
            eos_token_ids=[1], pad_token_id=0, seeds=torch.arange(32), sampling=SamplingSettings(top_k=top_k),
            generator=torch.Generator().manual_seed(draw),
        ).completion_ids
        for top_k, draw in ((1, 0), (1, 1), (0, 0), (0, 1))
    ]  # fmt: skip
    assert runs[0] == runs[1], "top_k=1 leaves one token of the mixture: the draws no longer matter"
    assert runs[2] != runs[3], "without truncation they do"


def test_padded_logits_are_cut_to_the_tokenizer(models, tiny_tokenizer, tables):
    """A model whose logits are wider than the tokenizer (padded embeddings, as Qwen's) co-generates exactly like
    the same model cut to the tokenizer: same draws, and no id past the tokenizer, although the padding rows copy
    the logits of real word starts (so they would be drawn often if they were mixed)."""
    wide = (pad_vocabulary(build_tiny_model(0), 3), pad_vocabulary(build_tiny_model(1), 3))
    sampling = SamplingSettings(temperature=1.5, top_k=12, top_p=0.9, min_p=0.05)
    runs = {}
    for name, pair in {
        "cut": models,
        "wide junior": (models[0], wide[1]),
        "wide senior": (wide[0], models[1]),
        "both wide": wide,
    }.items():
        # "both wide" builds its tables from the tokenizer: for the tokenizer's length, not the logits width.
        out = tandem_generate(
            *pair, *_prompts(tiny_tokenizer, 32), rule=HandoffRule("word", 0.5, 32), sampling=sampling,
            tables=None if name == "both wide" else tables, tokenizer=tiny_tokenizer, max_new_tokens=20,
            seeds=torch.arange(32), generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        runs[name] = out.completion_ids
    for name, ids in runs.items():
        assert ids == runs["cut"], name
    assert max(map(max, runs["cut"])) < len(TINY_VOCAB)


def test_logits_narrower_than_the_tables_are_refused(models, tiny_tokenizer):
    ids, mask = _prompts(tiny_tokenizer, 2)
    wide_tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])
    narrow = build_tiny_model(1, vocab_size=len(TINY_VOCAB) - 3)
    with pytest.raises(ValueError, match=r"cover 25 token ids but the logits of \{'junior': 22\} are narrower"):
        tandem_generate(
            models[0], narrow, ids, mask, rule=HandoffRule(), tables=wide_tables, eos_token_ids=[1], pad_token_id=0
        )


def _lora_senior(seed: int = 2):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_tiny_model(0), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(seed)
    with torch.no_grad():  # a trained adapter: B != 0, so the senior and its base really differ
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return model.train()  # the trainer's senior is in training mode; generation must not depend on it


def _forward_counter(model):
    calls = []
    hook = model.get_base_model().model.register_forward_hook
    handle = hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    return calls, handle


def test_lora_senior_with_base_junior_is_one_forward_with_the_two_pass_distribution(tiny_tokenizer, tables):
    """A LoRA senior whose junior is its base (`junior=None`) runs one forward per step over both models' rows, and
    draws exactly what the two-pass loop (junior = senior under `disable_adapter`) draws."""
    from tandem_grpo.generation import mixed_adapter_batches

    senior = _lora_senior()
    assert mixed_adapter_batches(senior)
    ids, mask = _prompts(tiny_tokenizer, 12)
    rule = HandoffRule("word", 0.5, 32)
    kw = dict(rule=rule, tables=tables, max_new_tokens=24, eos_token_ids=[1], pad_token_id=0,
              seeds=torch.arange(12) + 7)  # fmt: skip

    calls, handle = _forward_counter(senior)
    one = tandem_generate(senior, None, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    one_calls = list(calls)
    calls.clear()
    senior.eval()  # the reference two-pass loop, without dropout
    two = tandem_generate(senior, senior, ids, mask, generator=torch.Generator().manual_seed(3),
                          junior_context=senior.disable_adapter, **kw)  # fmt: skip
    handle.remove()
    steps = max(one.lengths)
    assert len(one_calls) == steps and all(shape[0] == 2 * 12 for shape in one_calls), "one pass of 2B rows per step"
    assert len(calls) == 2 * steps, "the reference ran two passes per step"
    assert one == two
    written = [a for row in one.authorship for a in row]
    assert 0 < sum(written) < len(written), "both models wrote"


def test_mixed_adapter_batch_logits_match_each_model_step_by_step(tiny_tokenizer):
    """Teacher-forced: at the prefill and every decode step, the senior rows give the adapter's logits and the junior
    rows the base's, as two separate passes do; and the adapter really changes the logits."""
    from tandem_grpo.generation import _senior_and_base, _two_models

    senior = _lora_senior().eval()
    ids, mask = _prompts(tiny_tokenizer, 5)
    reference = _teacher_forced(_two_models(senior, senior, senior.disable_adapter), ids, mask)
    with _senior_and_base(senior, 5) as one:
        mixed = _teacher_forced(one, ids, mask)
    assert all(not module._forward_hooks for module in senior.modules()), "no hook left on the senior"
    for (s1, j1), (s2, j2) in zip(mixed, reference, strict=True):
        torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(j1, j2, atol=1e-5, rtol=1e-5)
        assert (s1 - j1).abs().max() > 1e-2, "the adapter changes the senior"


def _teacher_forced(forward, ids, mask, steps: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Logits of the prefill and ``steps - 1`` decode steps on fixed tokens."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    step_ids, out = ids, []
    with torch.no_grad():
        for step in range(steps):
            out.append(forward(step_ids, mask, positions))
            step_ids = torch.full((ids.shape[0], 1), 3 + step)
            mask = torch.cat([mask, torch.ones(ids.shape[0], 1, dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1
    return out


def test_lora_generation_restores_training_mode_and_falls_back_for_dora(tiny_tokenizer, tables):
    from peft import LoraConfig, get_peft_model

    from tandem_grpo.generation import mixed_adapter_batches

    senior = _lora_senior()
    ids, mask = _prompts(tiny_tokenizer, 4)
    kw = dict(rule=HandoffRule("word", 0.5, 32), tables=tables, max_new_tokens=6, eos_token_ids=[1], pad_token_id=0)
    tandem_generate(senior, None, ids, mask, **kw)
    assert senior.training, "training mode restored"
    dora = get_peft_model(build_tiny_model(0), LoraConfig(r=4, target_modules="all-linear", use_dora=True))
    assert not mixed_adapter_batches(dora), "DoRA's update does not go through lora_B alone"
    embeddings = get_peft_model(build_tiny_model(0), LoraConfig(r=4, target_modules=["embed_tokens", "q_proj"]))
    assert not mixed_adapter_batches(embeddings), "an embedding's LoRA update has no lora_B module"
    calls, handle = _forward_counter(dora)
    out = tandem_generate(dora, None, ids, mask, **kw)
    handle.remove()
    assert len(calls) == 2 * max(out.lengths), "DoRA: two passes, the second with the adapter disabled"
    with pytest.raises(ValueError, match="not a PEFT model"):
        tandem_generate(build_tiny_model(0), None, ids, mask, **kw)
