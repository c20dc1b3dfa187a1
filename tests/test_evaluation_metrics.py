"""Each evaluation metric against a value computed by hand on tiny inputs."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tandem_grpo.evaluation.junior_legibility import legibility
from tandem_grpo.evaluation.solo import (
    capability,
    capability_by_benchmark,
    paired_accuracy_difference,
    pass_at_k_curve,
)
from tandem_grpo.evaluation.stats import bootstrap_mean, macro_bootstrap_mean, pass_at_k


def tiny_llama(seed: int, vocab_size: int = 64) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharpen the random head so distributions are far from uniform
        model.lm_head.weight.mul_(30)
    return model


# ------------------------------------------------------------------------------------------------------ pass@k


def test_pass_at_k_hand_values():
    # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # 1 - C(8,3)/C(10,3) = 1 - 56/120
    assert pass_at_k(10, 2, 3) == pytest.approx(1 - 56 / 120)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is c/n
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong samples: every k-subset has a correct one


def test_pass_at_k_matches_binomial_formula_everywhere():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


@pytest.mark.parametrize(("n", "c", "k", "match"), [(4, 1, 5, "pass@5"), (4, 5, 1, "c <= n"), (0, 0, 1, "n >= 1")])
def test_pass_at_k_rejects_bad_arguments(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_capability_means_over_problems():
    correct = [[True, False, False, False, True], [False] * 5]
    out = capability(correct, ks=[1, 2])
    assert out["pass@2"]["value"] == pytest.approx((0.7 + 0.0) / 2)
    assert out["pass@1"]["value"] == pytest.approx((0.4 + 0.0) / 2)
    assert out["mean_accuracy"]["value"] == pytest.approx(0.2)
    assert out["correct_per_problem"] == [2, 0]
    assert out["num_samples"] == 5
    assert out["pass@1"]["confidence"] == 0.95
    narrow, wide = capability(correct, ks=[1], confidence=0.5), capability(correct, ks=[1], confidence=0.99)
    assert narrow["pass@1"]["confidence"] == 0.5
    assert (
        narrow["pass@1"]["ci_high"] - narrow["pass@1"]["ci_low"]
        <= wide["pass@1"]["ci_high"] - wide["pass@1"]["ci_low"]
    )
    with pytest.raises(ValueError, match="pass@6"):
        capability(correct, ks=[6])
    with pytest.raises(ValueError, match="empty"):
        capability([], ks=[1])


def test_capability_by_benchmark_is_the_authors_macro():
    T, F = True, False
    # Benchmark a: c = 1 and 2 of 4 (pass@1 1/4, 1/2); b: c = 4 of 4 (pass@1 1). Pooled pass@1 (1/4 + 1/2 + 1) / 3.
    correct = [[T, F, F, F], [T, T, F, F], [T, T, T, T]]
    out = capability_by_benchmark(correct, ["a", "a", "b"], ks=[1, 2], seed=5)
    assert list(out["by_benchmark"]) == ["a", "b"] and out["macro"]["benchmarks"] == ["a", "b"]
    assert out["by_benchmark"]["a"]["correct_per_problem"] == [1, 2]
    assert out["by_benchmark"]["a"] == capability(correct[:2], ks=[1, 2], seed=5)
    assert out["macro"]["pass@1"]["value"] == pytest.approx(((1 / 4 + 1 / 2) / 2 + 1.0) / 2)
    assert out["macro"]["pass@2"]["value"] == pytest.approx(((1 / 2 + 5 / 6) / 2 + 1.0) / 2)
    assert out["macro"]["mean_accuracy"]["value"] == pytest.approx((3 / 8 + 1.0) / 2)
    macro = out["macro"]["pass@1"]
    assert macro["ci_low"] <= macro["value"] <= macro["ci_high"] and macro["num_problems"] == 3
    # One benchmark: the macro is that benchmark's (and the pooled) estimate, interval included.
    many = [[i % 2 == 0, i % 3 == 0, i % 5 == 0, False] for i in range(20)]
    single = capability_by_benchmark(many, ["a"] * 20, ks=[1, 2], seed=5)
    pooled = capability(many, ks=[1, 2], seed=5)
    for key in ("pass@1", "pass@2", "mean_accuracy"):
        assert single["by_benchmark"]["a"][key] == pooled[key]
        assert {**single["macro"][key], "ci_method": ""} == {**pooled[key], "ci_method": ""}
    # Stratified by benchmark: each resample keeps every benchmark's size, so two constant benchmarks give a
    # point interval at their plain mean (a bootstrap over the pooled problems would vary the mix).
    est = macro_bootstrap_mean({"a": [1.0, 1.0, 1.0], "b": [0.0]})
    assert (est.value, est.low, est.high) == (0.5, 0.5, 0.5) and "stratified" in est.method
    with pytest.raises(ValueError, match="2 benchmark names for 3 problems"):
        capability_by_benchmark(correct, ["a", "b"], ks=[1])
    with pytest.raises(ValueError, match="no problems"):
        macro_bootstrap_mean({"a": [1.0], "b": []})


def test_pass_at_k_curve_hand_values():
    T, F = True, False
    correct = [[T, F, F, F], [F, F, F, F], [T, T, F, F]]
    # Per problem, 1 - C(n - c, k) / C(n, k) with n = 4:
    #   c=1: k=1 1/4, k=2 1 - 3/6 = 1/2, k=3 1 - 1/4 = 3/4, k=4 1;  c=0: 0;  c=2: 1/2, 1 - 1/6 = 5/6, 1, 1.
    curve = pass_at_k_curve(correct, max_k=32)
    assert curve["k"] == [1, 2, 3, 4] and curve["num_samples"] == 4  # stops at n = 4 samples
    expected = [(1 / 4 + 1 / 2) / 3, (1 / 2 + 5 / 6) / 3, (3 / 4 + 1) / 3, 2 / 3]
    assert [e["value"] for e in curve["pass_at_k"]] == pytest.approx(expected)
    assert curve["coverage"]["value"] == pytest.approx(2 / 3)  # two of three problems have a correct sample
    assert curve["pass_at_k"][-1]["value"] == pytest.approx(curve["coverage"]["value"])  # pass@n is coverage
    for est in [*curve["pass_at_k"], curve["coverage"]]:
        assert est["ci_low"] <= est["value"] <= est["ci_high"] and est["confidence"] == 0.95
        assert est["num_problems"] == 3 and "bootstrap" in est["ci_method"]
    # The curve's points are the same estimates as capability's pass@k (same bootstrap seed).
    cap = capability(correct, ks=[1, 2, 4], seed=7)
    seeded = pass_at_k_curve(correct, max_k=4, seed=7)
    for k in (1, 2, 4):
        assert seeded["pass_at_k"][k - 1] == cap[f"pass@{k}"]
    # max_k below n cuts the curve; coverage still counts all n samples.
    short = pass_at_k_curve(correct, max_k=2)
    assert short["k"] == [1, 2] and short["coverage"]["value"] == pytest.approx(2 / 3)


def test_pass_at_k_curve_to_32():
    # One problem with 1 correct sample of 32: pass@k = 1 - C(31, k) / C(32, k) = k / 32. One always solved: 1.
    correct = [[True] + [False] * 31, [True] * 32]
    curve = pass_at_k_curve(correct)
    assert curve["k"] == list(range(1, 33)) and curve["max_k"] == 32
    assert [e["value"] for e in curve["pass_at_k"]] == pytest.approx([(k / 32 + 1) / 2 for k in range(1, 33)])
    assert curve["coverage"] == {**curve["coverage"], "value": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    # Two problems: resamples are (a, a), (a, b), (b, b), so the interval spans [pass@k of problem 1, 1].
    est = curve["pass_at_k"][0]
    assert est["ci_low"] == pytest.approx(1 / 32) and est["ci_high"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="max_k"):
        pass_at_k_curve(correct, max_k=0)
    with pytest.raises(ValueError, match="empty"):
        pass_at_k_curve([])


def test_bootstrap_interval():
    constant = bootstrap_mean([0.5] * 7)
    assert (constant.value, constant.low, constant.high) == (0.5, 0.5, 0.5)
    values = [0.0, 1.0] * 20
    a, b = bootstrap_mean(values, seed=3), bootstrap_mean(values, seed=3)
    assert a == b  # fixed seed: reruns report the same interval
    assert a.value == pytest.approx(0.5)
    # Standard error of a mean of 40 fair coins is 0.079: the 95% interval is about 0.5 +- 0.155.
    assert 0.30 < a.low < 0.40 and 0.60 < a.high < 0.70
    assert "bootstrap" in a.method and a.num_problems == 40
    with pytest.raises(ValueError, match="empty"):
        bootstrap_mean([])


def test_paired_accuracy_difference_pairs_problem_by_problem():
    before, after = [0.0, 0.25, 1.0, 0.5], [0.5, 0.25, 0.75, 1.0]
    out = paired_accuracy_difference(before, after)
    assert (out["before"], out["after"]) == (0.4375, 0.625)
    # The interval is the bootstrap of the per-problem differences [0.5, 0, -0.25, 0.5], not of the two means apart.
    assert out["difference"] == bootstrap_mean([0.5, 0.0, -0.25, 0.5]).to_dict()
    same = paired_accuracy_difference(before, before)["difference"]
    assert (same["value"], same["ci_low"], same["ci_high"]) == (0.0, 0.0, 0.0)  # a model against itself: exactly 0
    with pytest.raises(ValueError, match="before has 4 problems and after 3"):
        paired_accuracy_difference(before, after[:3])


@pytest.mark.parametrize("n", [2, 4, 6])
def test_the_permutation_null_splits_like_a_fixed_split_of_exchangeable_samples(n):
    """Enumerable toy: with c correct of n pooled samples in a random order, the correct ones in the first half
    (indices [0, n/2)) have an exact distribution over the equally likely placements; the split drawn from the counts
    must follow it (so the null statistic, first half minus second, has expectation 0)."""
    from collections import Counter
    from itertools import combinations

    from tandem_grpo.evaluation.solo import _split_halves

    draws = 40_000
    for c in range(n + 1):
        placements = list(combinations(range(n), c))
        exact = Counter(sum(i < n // 2 for i in chosen) for chosen in placements)
        drawn = Counter(_split_halves([c] * draws, n, num_splits=1, seed=c)[0].tolist())
        assert set(drawn) <= set(exact)
        for first, count in exact.items():
            assert drawn[first] / draws == pytest.approx(count / len(placements), abs=0.01), (c, first)


@pytest.mark.parametrize("k", [1, 4])
def test_the_permutation_null_is_sized_for_two_models_and_rejects_at_its_level(k):
    """Two models with the same per-problem accuracy, sampled 8 times each on 60 problems: their paired difference
    of pass@k falls outside the null's 95% range (p below 0.05) about 5% of the time. Halves of one model's own 8
    samples (4 each) would give twice the variance (by the normal approximation, rejecting about 0.6% of the time)."""
    import numpy as np

    from tandem_grpo.evaluation.solo import permutation_null

    rng = np.random.default_rng(1)
    n, problems, trials = 8, 60, 300
    rejected = 0
    for _ in range(trials):
        p = rng.beta(0.5, 1.5, problems)
        before, after = rng.binomial(n, p).tolist(), rng.binomial(n, p).tolist()
        seed = int(rng.integers(1 << 30))
        rejected += permutation_null(before, after, n, num_splits=400, seed=seed, k=k)["p_value"] < 0.05
    assert 0.02 <= rejected / trials <= 0.09


def test_the_permutation_null_repeats_a_committed_one_bit_for_bit():
    """A null committed before ``k`` existed (cpu-paper seed 1, tandem against the base) comes out the same to the
    last bit: the integer scores of k 1 keep the accuracy null's arithmetic (float pass@k scores move its 95% range
    from 0.0325 to 0.032)."""
    import json
    from pathlib import Path

    from tandem_grpo.evaluation.solo import permutation_null

    folder = Path(__file__).resolve().parents[1] / "results" / "cpu-paper"
    read = lambda *parts: json.loads(folder.joinpath(*parts).read_text())  # noqa: E731
    base = read("base", "results.json")["junior"]["solo"]["correct_per_problem"]
    (entry,) = read("seed-1", "tandem", "results.json")["checkpoints"].values()
    committed = read("report", "results.json")["comparison"]["learnt"]["1"]["tandem"]["null"]
    assert permutation_null(base, entry["solo"]["correct_per_problem"], 8) == committed


def test_the_permutation_null_of_pass_at_k_reads_the_paired_pass_at_k_difference():
    """The observed statistic is the mean over problems of pass@k(after) - pass@k(before), the unbiased estimator's:
    a split whose halves hold exactly the two models' counts is as far from 0 as the observation (p 1 when the
    split cannot change anything), and pass@k for k = n is coverage (any sample right)."""
    from tandem_grpo.evaluation.solo import permutation_null
    from tandem_grpo.evaluation.stats import pass_at_k

    before, after = [0, 1, 2, 0, 4] * 20, [1, 1, 3, 2, 4] * 20
    for k in (1, 2, 4):
        pairs = zip(before, after, strict=True)
        observed = sum(pass_at_k(4, a, k) - pass_at_k(4, b, k) for b, a in pairs) / len(before)
        null = permutation_null(before, after, 4, k=k)
        assert observed > 0 and (null["p_value"] < 0.01) == (observed > null["ci_high"])
        assert (k > 1) == ("pass@" in null["definition"])
    # Coverage: one model right once on every problem, the other never (observed 1). The pooled sample that is right
    # lands in either half, so each problem adds +1 or -1 with equal chance: the 95% radius is about 2 / sqrt(50).
    null = permutation_null([0] * 50, [1] * 50, 4, k=4)
    assert null["p_value"] == 0.0 and null["ci_high"] == pytest.approx(2 / 50**0.5, abs=0.03)
    assert permutation_null([0, 4], [4, 0], 4, k=4)["p_value"] == 1.0  # same coverage on the whole: observed 0
    assert permutation_null([1] * 30, [4] * 30, 4, k=4)["p_value"] == 1.0  # pass@4 is 1 for both: no difference
    assert permutation_null([1] * 30, [4] * 30, 4)["p_value"] == 0.0  # their accuracy differs
    with pytest.raises(ValueError, match="pass@5 needs 1 <= k <= num_samples=4"):
        permutation_null([1], [2], 4, k=5)


def test_the_permutation_null_reads_the_observed_difference_and_refuses_bad_counts():
    from tandem_grpo.evaluation.solo import permutation_null

    before, after = [0, 1, 2, 3, 4, 8, 5, 2] * 25, [1, 1, 3, 3, 5, 8, 6, 2] * 25
    null = permutation_null(before, after, 8)
    assert null["value"] == 0.0 and null["ci_low"] == -null["ci_high"] and null["num_problems"] == 200
    assert null["p_value"] < 0.01 and "halves of 8" in null["definition"]  # +0.5 of 8 a problem on 200 problems
    assert permutation_null(before, before, 8)["p_value"] == 1.0  # no difference: every split is as far from 0
    assert permutation_null(before, after, 8) == null  # seeded: the same null on a rerun
    assert permutation_null([0, 4, 4], [0, 4, 4], 4)["ci_high"] == 0.0  # all or none right: halves cannot differ
    assert permutation_null([1], [0], 1)["ci_high"] == 1.0  # one sample a model: still two halves of the pool
    with pytest.raises(ValueError, match="3 and 2 problems"):
        permutation_null([1, 2, 3], [1, 2], 4)
    with pytest.raises(ValueError, match="after: problem 1 has 5 correct of 4"):
        permutation_null([1, 1], [1, 5], 4)


def test_solo_verdicts_scores_k_samples_per_problem_against_their_own_gold(smollm2_tokenizer, monkeypatch):
    """Prompts are repeated k times problem-major and each completion is scored against its own problem's gold."""
    from tandem_grpo.backends import TransformersBackend
    from tandem_grpo.evaluation.held_out import solo_verdicts
    from tandem_grpo.sampling import SamplingSettings

    texts = iter(
        ["\\boxed{7}", "\\boxed{9}", "so 9", "7"]
    )  # problem 0 (gold 7): right, wrong; problem 1 (9): right, wrong
    seen = []

    def generate(self, prompts, sampling, *, max_new_tokens, seed=0, desc="", stop=()):
        seen.extend(prompts)
        return [smollm2_tokenizer(next(texts), add_special_tokens=False)["input_ids"] for _ in prompts]

    monkeypatch.setattr(TransformersBackend, "generate", generate)
    prompts = [[{"role": "user", "content": "What is 3 + 4?"}], [{"role": "user", "content": "What is 4 + 5?"}]]
    verdicts = solo_verdicts(tiny_llama(0), smollm2_tokenizer, prompts, ["7", "9"], k=2,
                             sampling=SamplingSettings(), max_new_tokens=16)  # fmt: skip
    assert verdicts == [[True, False], [True, False]]
    assert seen[0] == seen[1] != seen[2] == seen[3]
    with pytest.raises(ValueError, match="2 prompts and 1 answers"):
        solo_verdicts(tiny_llama(0), smollm2_tokenizer, prompts, ["7"], k=1, sampling=SamplingSettings(),
                      max_new_tokens=16)  # fmt: skip


# -------------------------------------------------------------------------------------------------- legibility


def _greedy(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_cross_entropy_of_model_on_its_own_greedy_text():
    model = tiny_llama(0)
    prompts = [[5, 9, 13, 17, 21], [7, 11]]  # different lengths: the batch is left-padded
    completions = [_greedy(model, p, 6) for p in prompts]
    completions[1] = completions[1][:4]  # and right-padded
    expected = []
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            for t, token in enumerate(c):
                logits = model(torch.tensor([p + c[:t]])).logits[0, -1]
                expected.append(-float(torch.log_softmax(logits, -1)[token]))
    out = legibility(None, model, prompts, completions, pad_token_id=0, batch_size=2, eos_token_ids=[])
    assert out["num_tokens"] == 10
    # The headline is the mean of per-completion means (tests/test_evaluation_legibility.py).
    per_completion = [sum(expected[:6]) / 6, sum(expected[6:]) / 4]
    assert out["junior_cross_entropy"] == pytest.approx(sum(per_completion) / 2, rel=1e-4)
    assert out["overlap"] is None
    # Greedy tokens are each position's argmax: their -log p is at most that of any other token (< log V).
    assert max(expected) < math.log(64)


def test_overlap_is_one_for_identical_models_and_less_otherwise():
    model = tiny_llama(0)
    twin = copy.deepcopy(model)  # a distinct module with the same weights: the real two-model path runs
    prompts, completions = [[3, 4, 5], [6, 7]], [[8, 9, 10], [11, 12, 13, 14]]
    same = legibility(model, twin, prompts, completions, pad_token_id=0, eos_token_ids=[1])
    assert same["overlap"] == pytest.approx(1.0, abs=1e-5)
    other = legibility(tiny_llama(1), model, prompts, completions, pad_token_id=0, eos_token_ids=[1])
    assert 0.0 < other["overlap"] < 0.99
    assert other["junior_cross_entropy"] == pytest.approx(same["junior_cross_entropy"], rel=1e-5)  # same junior
    with pytest.raises(ValueError, match="shared vocabulary"):
        legibility(tiny_llama(1, vocab_size=80), model, prompts, completions, pad_token_id=0, eos_token_ids=[1])
