"""vLLM samples the transformers path's mixture: a real tandem engine on two different tiny Llamas (skipped without
vLLM; the engine starts in seconds).

The tiny models are the conftest's (``build_tiny_model`` seeds 0 and 1, the tiny word-level tokenizer) with
``head_dim=32`` (vLLM's CPU attention refuses the default 8). The senior's logits are padded 3 columns past the
tokenizer, as Qwen's 7B pads 152064 rows for 151665 tokens (the junior's are not), and the padding rows copy the
logits of real word starts, so an engine that mixed or sampled them would draw them often.

Every position of every completion is recomputed with transformers along vLLM's tokens
(:func:`tandem_grpo.generation.next_token_logprobs`, what ``tandem_generate`` draws from) and compared, whole
distribution against whole distribution, with vLLM's processed log-probabilities, at word granularity and with
top-k, top-p and min-p all set (top-p and min-p do not commute: a backend with another order fails), under both
handoff rules; and the senior's score terms vLLM's rollout returns are checked against the same recomputation.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_VOCAB, build_tiny_model, pad_vocabulary, skip_without_vllm

skip_without_vllm()

from tandem_grpo.generation import next_token_logprobs  # noqa: E402
from tandem_grpo.handoff import (  # noqa: E402
    HandoffRule,
    advance,
    boundary_logprobs,
    init_state,
    replay,
    unit_start_ids,
)
from tandem_grpo.rollout import Rollout  # noqa: E402
from tandem_grpo.sampling import SamplingSettings, truncate_logprobs  # noqa: E402
from tandem_grpo.vllm.engine import (  # noqa: E402
    boundary_tables,
    build_llm,
    engine_info,
    merge_records,
    new_uids,
    sampling_params,
)

pytestmark = pytest.mark.vllm

SAMPLING = SamplingSettings(temperature=1.5, top_k=12, top_p=0.8, min_p=0.1)
LENGTH = 10
PADDING = 3
SIZE = len(TINY_VOCAB)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tiny_tokenizer) -> tuple[str, str]:
    paths = []
    for name, model in (
        ("senior", pad_vocabulary(build_tiny_model(0, head_dim=32), PADDING)),
        ("junior", build_tiny_model(1, head_dim=32)),
    ):
        path = tmp_path_factory.mktemp(f"vllm-{name}")
        model.save_pretrained(path)
        tiny_tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def engine(model_dirs):
    # An explicit KV-cache size: a fraction of memory would depend on what the process already holds.
    return build_llm(
        *model_dirs,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=128,
        max_num_seqs=64,
        max_logprobs=SIZE + PADDING,
        seed=0,
        enforce_eager=True,
        dtype="float32",
    )


@pytest.fixture(scope="module", params=["after_boundary", "whole_unit"])
def rule(request) -> HandoffRule:
    return HandoffRule("word", 0.5, 32, request.param)


@pytest.fixture(scope="module")
def run(engine, tiny_tokenizer, rule):
    """24 tandem completions of ``LENGTH`` tokens (EOS ignored, so all have that length) with full distributions."""
    prompts = [tiny_tokenizer(text).input_ids for text in ("ab c", "d e", "f.\ng", "h")]
    prompt_ids = [p for p in prompts for _ in range(6)]
    seeds = list(range(100, 100 + len(prompt_ids)))
    uids = new_uids(len(seeds))
    params = sampling_params(
        SAMPLING,
        seeds,
        uids,
        rule,
        max_tokens=LENGTH,
        generation_kwargs={"ignore_eos": True, "logprobs": SIZE + PADDING},
    )
    outputs = engine.generate([{"prompt_token_ids": p} for p in prompt_ids], sampling_params=params, use_tqdm=False)
    records = merge_records(engine.collective_rpc("tandem_pop_records", args=(uids,)), uids)
    completions = [list(out.outputs[0].token_ids) for out in outputs]
    distributions = torch.full((len(outputs), LENGTH, SIZE + PADDING), float("-inf"))
    for row, out in enumerate(outputs):
        for t, entry in enumerate(out.outputs[0].logprobs):
            for token, logprob in entry.items():
                distributions[row, t, token] = logprob.logprob
    sampled = [[distributions[row, t, tok].item() for t, tok in enumerate(ids)] for row, ids in enumerate(completions)]
    info = engine_info(engine)
    tables = boundary_tables(info["model"], info["vocab_size"], tuple(info["eos_token_ids"]))
    rollout = Rollout.from_engine(completions, sampled, records, seeds, rule, tables)
    return prompt_ids, seeds, rollout, distributions, tables


@pytest.fixture(scope="module")
def reference(model_dirs, run, rule):
    """transformers along vLLM's tokens: the truncated and the untruncated mixture, and the senior's own log-probs."""
    from transformers import AutoModelForCausalLM

    prompt_ids, seeds, rollout, _, tables = run
    senior, junior = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval() for path in model_dirs)

    def logits(model) -> torch.Tensor:
        with torch.no_grad():
            rows = [
                model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
                for p, c in zip(prompt_ids, rollout.completion_ids, strict=True)
            ]
        return torch.stack(rows)  # [R, LENGTH, V]

    senior_logits, junior_logits = logits(senior), logits(junior)
    tokens = torch.tensor(rollout.completion_ids)
    state = init_state(torch.tensor(seeds), rule)
    plain = SamplingSettings(temperature=SAMPLING.temperature)
    truncated, untruncated = [], []
    for t in range(LENGTH):
        args = (senior_logits[:, t], junior_logits[:, t], state, tables, rule)
        truncated.append(next_token_logprobs(*args, SAMPLING, None))
        untruncated.append(next_token_logprobs(*args, plain, None))
        state, _, _ = advance(state, tokens[:, t], tables, rule)
    # Over every logits column, padding included, as the trainer's loss normalizes.
    senior_own = torch.log_softmax(senior_logits / SAMPLING.temperature, dim=-1)
    return torch.stack(truncated, dim=1), torch.stack(untruncated, dim=1), senior_own


def test_vllm_samples_the_transformers_mixture(run, reference):
    _, _, rollout, vllm_logprobs, _ = run
    expected, untruncated, _ = reference
    assert bool(torch.isinf(vllm_logprobs[..., SIZE:]).all()), "ids past the tokenizer must have probability 0"
    got = vllm_logprobs[..., :SIZE]
    assert torch.equal(torch.isfinite(got), torch.isfinite(expected)), "the truncations keep different tokens"
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)
    # The data tells the orders apart: the old vLLM placement (min-p on the mixture, then vLLM's top-k/top-p)
    # keeps other tokens at some positions, so it would fail the support check above.
    flat = untruncated.reshape(-1, SIZE)
    min_p_first = truncate_logprobs(truncate_logprobs(flat, min_p=SAMPLING.min_p), SAMPLING.top_k, SAMPLING.top_p)
    assert not torch.equal(torch.isfinite(min_p_first), torch.isfinite(expected.reshape(-1, SIZE)))
    authors = [a for row in rollout.authorship for a in row]
    assert 0 < sum(authors) < len(authors), "both models must write"
    assert max(max(ids) for ids in rollout.completion_ids) < SIZE


def test_senior_terms_under_truncation(rule, run, reference):
    """The rollout's senior log-probs are the senior's exact score terms (``handoff.senior_token_terms``) over the
    whole vocabulary and every logits column (the senior's are padded), what the trainer's loss recomputes, although
    vLLM samples from the truncated mixture over the tokenizer's ids: on senior
    tokens ``log p_s(x)`` (minus ``log p_s(B)`` where it took a unit over), the processor's record adding back the
    log of the mixture mass the truncation kept; on junior tokens the senior handed a unit to, ``log p_s(B)``; NaN on
    other junior tokens. vLLM's own log-probs are those of the truncated mixture (the kept mass is below 1 here)."""
    _, seeds, rollout, _, tables = run
    expected, untruncated, senior_own = reference
    kept_mass = torch.logsumexp(untruncated.masked_fill(~torch.isfinite(expected), float("-inf")), dim=-1)
    assert float(kept_mass.min()) < -1e-2, "the truncation must drop mass for the test to mean something"
    trace = replay(torch.tensor(rollout.completion_ids), torch.tensor(seeds), tables, rule)
    if rule.mode == "whole_unit":
        starts = torch.nn.functional.pad(unit_start_ids(tables, rule), (0, PADDING))  # padding ids start no unit
        b_lp = boundary_logprobs(senior_own, starts)
    else:
        b_lp = torch.zeros(senior_own.shape[:2])
        assert not bool(trace.boundary_coef.any())
    counts = {-1: 0, 1: 0}
    for row, (ids, authors, own) in enumerate(
        zip(rollout.completion_ids, rollout.authorship, rollout.senior_logprobs, strict=True)
    ):
        for t, (token, author) in enumerate(zip(ids, authors, strict=True)):
            coef = int(trace.boundary_coef[row, t])
            counts[coef] = counts.get(coef, 0) + 1
            if author == 0:
                if coef == 1:
                    assert own[t] == pytest.approx(b_lp[row, t].item(), abs=2e-3), (row, t)
                else:
                    assert math.isnan(own[t])
                continue
            target = senior_own[row, t, token].item() + coef * b_lp[row, t].item()
            assert own[t] == pytest.approx(target, abs=2e-3), (row, t)
    if rule.mode == "whole_unit":
        assert counts[-1] > 0 and counts[1] > 0, "handoffs both ways, where the terms carry log p_s(B), must occur"
