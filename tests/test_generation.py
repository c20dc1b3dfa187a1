"""The transformers co-generation loop on tiny random models (fast) and its statistics."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import TINY_VOCAB, build_tiny_model, pad_vocabulary

from tandem_grpo.generation import tandem_generate
from tandem_grpo.handoff import JUNIOR, SENIOR, BoundaryTables, HandoffRule, draw_owners, init_state
from tandem_grpo.sampling import SamplingSettings


def _same_rollout(a, b, atol: float = 1e-5) -> None:
    """Two rollouts alike: every field equal, the senior's log-probs (NaN on junior tokens) within ``atol``."""
    assert dataclasses.replace(a, senior_logprobs=None) == dataclasses.replace(b, senior_logprobs=None)
    nan = float("nan")
    torch.testing.assert_close(a.tensor("senior_logprobs", pad=nan), b.tensor("senior_logprobs", pad=nan), atol=atol,
                               rtol=0, equal_nan=True)  # fmt: skip


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
    _same_rollout(a, b, atol=0.0)
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
    from tandem_grpo.model_calls import mixed_adapter_batches

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
    _same_rollout(one, two)
    written = [a for row in one.authorship for a in row]
    assert 0 < sum(written) < len(written), "both models wrote"


def test_mixed_adapter_batch_logits_match_each_model_step_by_step(tiny_tokenizer):
    """Teacher-forced: at the prefill and every decode step, the senior rows give the adapter's logits and the junior
    rows the base's, as two separate passes do; and the adapter really changes the logits."""
    from tandem_grpo.model_calls import _senior_and_base, _two_models

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

    from tandem_grpo.model_calls import mixed_adapter_batches

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


# ------------------------------------------------------- architectures and generate's model calls


def _full_forward_reference(model, ids, mask, steps: int = 6) -> list[torch.Tensor]:
    """Last-position logits of a full forward without cache (fresh each time) over the prompt and then the prompt
    plus the teacher-forced tokens of ``_teacher_forced``."""
    out = []
    with torch.no_grad():
        for step in range(steps):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out.append(model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float())
            ids = torch.cat([ids, torch.full((ids.shape[0], 1), 3 + step)], dim=1)
            mask = torch.cat([mask, torch.ones(ids.shape[0], 1, dtype=mask.dtype)], dim=1)
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma2", "cohere2", "qwen3_moe", "gpt_oss", "nemotron_h"])
def test_every_architecture_decodes_as_its_full_forward(arch, tiny_tokenizer, tables):
    """The loop calls each model as ``generate`` does: a cache built from the model's config (sliding-window layers;
    the hybrid Nemotron-H's Mamba convolution and SSM states, which a bare ``DynamicCache()`` lacks), router logits
    off for a Mixture-of-Experts model whose config turns them on (Qwen3-MoE, gpt-oss: their load-balancing loss
    fails on a one-token step against the whole mask). Teacher-forced over left-padded prompts, the logits of both
    models at the prefill and every decode step equal a full forward without cache; then two models of the
    architecture co-generate to the cap."""
    from contextlib import nullcontext

    from tiny_architectures import CAUSAL_LMS

    from tandem_grpo.model_calls import _two_models

    senior, junior = CAUSAL_LMS[arch](0), CAUSAL_LMS[arch](1)
    ids, mask = _prompts(tiny_tokenizer, 3)
    stepped = _teacher_forced(_two_models(senior, junior, nullcontext), ids, mask)
    for name, model, index in (("senior", senior, 0), ("junior", junior, 1)):
        for step, (got, want) in enumerate(zip([s[index] for s in stepped], _full_forward_reference(model, ids, mask),
                                               strict=True)):  # fmt: skip
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"{arch} {name} step {step}")
    out = tandem_generate(senior, junior, ids, mask, rule=HandoffRule("word", 0.5, 32), tables=tables,
                          max_new_tokens=10, eos_token_ids=[1], pad_token_id=0, seeds=torch.arange(3))  # fmt: skip
    assert all(ids[-1] == 1 or len(ids) == 10 for ids in out.completion_ids)
    assert max(map(max, out.completion_ids)) < len(TINY_VOCAB)


def test_model_call_reads_what_generate_passes():
    from tiny_architectures import gpt_oss, nemotron_h

    from tandem_grpo.model_calls import ModelCall

    llama = ModelCall.of(build_tiny_model(0))
    assert llama.flags == {"use_cache": True, "logits_to_keep": 1}, "no router flag for a dense model"
    assert llama.attention_mask and llama.position_ids and llama.default_cache
    assert ModelCall.of(gpt_oss(0)).flags["output_router_logits"] is False
    model = nemotron_h(0)
    hybrid = ModelCall.of(model)
    # Nemotron-H's MoE layers have the config field from transformers 5.19 on (none to turn off before).
    assert hybrid.flags.get("output_router_logits", "absent") == (
        False if hasattr(model.config, "output_router_logits") else "absent"
    )
    cache = hybrid.new_cache()
    assert len(cache.layers) == 3 and type(cache.layers[0]) is not type(cache.layers[1]), "Mamba and attention layers"
    plain = ModelCall.of(lambda **kwargs: None)  # a callable that is not a transformers model: the plain contract
    assert plain.cache_config is None and plain.flags == {"use_cache": True, "logits_to_keep": 1}


def _moe_lora_senior(arch: str):
    from peft import LoraConfig, get_peft_model
    from tiny_architectures import CAUSAL_LMS

    if arch == "gpt_oss":  # LoRA on the stacked expert weights (PEFT's ParamWrapper), as TRL's MoE PEFT test
        config = LoraConfig(r=2, target_parameters=["mlp.experts.down_proj", "mlp.experts.gate_up_proj"])
    else:
        config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(CAUSAL_LMS[arch](0), config)
    torch.manual_seed(4)
    with torch.no_grad():  # a trained adapter: the senior and its base differ
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 2.0)
    return model


@pytest.mark.parametrize(("arch", "one_pass"), [("qwen3_moe", True), ("gpt_oss", False)])
def test_moe_lora_senior_with_base_junior(arch, one_pass, tiny_tokenizer, tables):
    """A LoRA senior of a MoE model with router logits on, its base as junior (``junior=None``): LoRA on linear
    layers runs one pass over both models' rows; LoRA on gpt-oss's stacked expert weights (``target_parameters``)
    folds its update into the weights, so ``lora_B`` never runs a forward and zeroing its output would leave the
    junior rows with the senior's function: that senior falls back to two passes. Either way the draws are those of
    the two-pass loop with the adapter disabled for the junior, and both models wrote."""
    from tandem_grpo.model_calls import mixed_adapter_batches

    senior = _moe_lora_senior(arch).eval()
    assert mixed_adapter_batches(senior) is one_pass
    ids, mask = _prompts(tiny_tokenizer, 8)
    kw = dict(rule=HandoffRule("token", 0.5, 32), tables=tables, max_new_tokens=12, eos_token_ids=[],
              pad_token_id=0, seeds=torch.arange(8))  # fmt: skip
    one = tandem_generate(senior, None, ids, mask, generator=torch.Generator().manual_seed(1), **kw)
    two = tandem_generate(senior, senior, ids, mask, generator=torch.Generator().manual_seed(1),
                          junior_context=senior.disable_adapter, **kw)  # fmt: skip
    solo = tandem_generate(senior, senior, ids, mask, generator=torch.Generator().manual_seed(1), **kw)
    _same_rollout(one, two)
    assert one.completion_ids != solo.completion_ids, "the junior is the base, not the senior"
    written = [a for row in one.authorship for a in row]
    assert 0 < sum(written) < len(written)


# ------------------------------------------------------------------ generate's keyword arguments

# What TRL 1.16's GRPOTrainer passes to `generate` (its sampling fields), before `GRPOConfig.generation_kwargs`.
_TRL_GENERATION_KWARGS = dict(max_new_tokens=12, do_sample=True, pad_token_id=0, bos_token_id=None, eos_token_id=[1],
                              temperature=0.7, top_p=0.9, top_k=5, min_p=0.0, repetition_penalty=1.1,
                              cache_implementation=None)  # fmt: skip


def test_generation_kwargs_honoured():
    from tandem_grpo.sampling import sampling_from_generation_kwargs

    settings, cap = sampling_from_generation_kwargs(_TRL_GENERATION_KWARGS, [1], 0.7)
    assert settings == SamplingSettings(temperature=0.7, top_p=0.9, top_k=5, min_p=0.0, repetition_penalty=1.1)
    assert cap == 12
    inert = {"num_beams": 1, "length_penalty": 2.0, "use_cache": True, "disable_compile": True,
             "num_return_sequences": 1, "cache_implementation": "dynamic", "typical_p": None, "top_k": 3,
             "min_p": 0.2}  # fmt: skip
    settings, _ = sampling_from_generation_kwargs({**_TRL_GENERATION_KWARGS, **inert}, [1], 0.7)
    assert (settings.top_k, settings.min_p) == (3, 0.2)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("num_beams", 2, "beam search"),
        ("do_sample", False, "always sample"),
        ("num_return_sequences", 4, "num_generations"),
        ("cache_implementation", "static", "cache_implementation=None"),
        ("no_repeat_ngram_size", 3, "honours only temperature"),
        ("eos_token_id", [7], r"EOS ids \[1\]"),
        ("temperature", 0.5, "set GRPOConfig.temperature instead"),
        ("top_p", 1.5, r"top_p=1.5 must be in \(0, 1\]"),
    ],
)
def test_generation_kwargs_refused_with_the_key(key, value, why):
    from tandem_grpo.sampling import sampling_from_generation_kwargs

    with pytest.raises(ValueError, match=why) as err:
        sampling_from_generation_kwargs({**_TRL_GENERATION_KWARGS, key: value}, [1], 0.7)
    assert key in str(err.value)


def test_trainer_honours_generation_kwargs_or_refuses_them(tmp_path, tiny_model_dirs, tiny_tokenizer):
    """``GRPOConfig.generation_kwargs`` reach co-generation: ``top_k=1`` leaves one token of the (self-paired)
    mixture, so a group's completions are identical; beam search is refused at construction, naming the key."""
    from conftest import tiny_prompts, tiny_tandem_config

    from tandem_grpo import TandemGRPOTrainer

    def build(**generation_kwargs):
        return TandemGRPOTrainer(
            model=tiny_model_dirs[0], reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=tiny_tandem_config(tmp_path / "out", generation_kwargs=generation_kwargs),
            train_dataset=tiny_prompts(), processing_class=tiny_tokenizer,
        )  # fmt: skip

    with pytest.raises(ValueError, match=r"generation_kwargs\['num_beams'\]=2 cannot be honoured"):
        build(do_sample=True, num_beams=2)
    trainer = build(top_k=1)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{"prompt": "ab c"}] * 4)
    rows = batch["completion_ids"].tolist()
    assert trainer._rollout is not None and rows[0] == rows[1] == rows[2] == rows[3]
    assert any(0 in row for row in trainer._rollout.authorship), "the junior wrote: top_k acted on the mixture"


def test_prompt_learning_senior_is_refused_with_a_clear_message(tiny_tokenizer, tables):
    """A PEFT prompt-tuning senior prepends its virtual tokens at every forward: the step-by-step loop refuses it by
    name (it used to fail inside the model with a shape mismatch)."""
    from peft import PromptTuningConfig, TaskType, get_peft_model

    senior = get_peft_model(
        build_tiny_model(0), PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4)
    )
    ids, mask = _prompts(tiny_tokenizer, 2)
    for junior in (None, build_tiny_model(1)):
        with pytest.raises(ValueError, match="does not support PEFT prompt-learning models \\(PROMPT_TUNING\\)"):
            tandem_generate(senior, junior, ids, mask, rule=HandoffRule(), tables=tables, eos_token_ids=[1],
                            pad_token_id=0, max_new_tokens=4)  # fmt: skip
