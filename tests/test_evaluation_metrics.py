"""Each evaluation metric against a value computed by hand on tiny inputs."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tandem_grpo.evaluation.metrics import (
    bootstrap_mean,
    capability,
    drift_reversal,
    kl_divergence,
    legibility,
    marginal_kl,
    masked_overlap,
    masked_token_cross_entropy,
    pass_at_k,
    smoothed_distribution,
    token_counts,
)


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


# ------------------------------------------------------------------------------------------------------- drift


def test_token_counts_and_smoothing():
    counts = token_counts([[0, 2, 2], [2, 1]], vocab_size=4)
    assert counts.tolist() == [1.0, 1.0, 3.0, 0.0]
    p = smoothed_distribution(counts, smoothing=1.0)
    assert p.tolist() == pytest.approx([2 / 9, 2 / 9, 4 / 9, 1 / 9])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_counts([[4]], vocab_size=4)
    with pytest.raises(ValueError, match="smoothing"):
        smoothed_distribution(counts, smoothing=0.0)


def test_kl_with_known_distributions():
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    assert kl_divergence(p, q) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    assert kl_divergence(p, p) == 0.0
    # counts [3, 1] and [1, 1] with one pseudo-count each: p = (2/3, 1/3), q = (1/2, 1/2)
    kl = marginal_kl(torch.tensor([3.0, 1.0]), torch.tensor([1.0, 1.0]), smoothing=1.0)
    assert kl == pytest.approx(2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3))


def test_drift_reversal_hand_example():
    base = torch.tensor([10.0, 10.0, 10.0, 10.0])  # smoothed: 1/4 each
    grpo = torch.tensor([40.0, 0.0, 10.0, 2.0])  # smoothed: (41, 1, 11, 3) / 56
    tandem = torch.tensor([20.0, 8.0, 10.0, 0.0])  # smoothed: (21, 9, 11, 1) / 42
    # |GRPO shifts|: ln(41/14)=1.07, ln(14)=2.64, ln(14/11)=0.24, ln(14/3)=1.54 -> order 1, 3, 0, 2
    # |tandem shifts|: ln(21*4/42)=0.69, ln(42/36)=0.15, ln(44/42)=0.05, ln(42/4)=2.35
    out = drift_reversal(base, grpo, tandem, top_n=2, smoothing=1.0)
    assert out["token_ids"] == [1, 3]
    assert out["num_moved_back"] == 1  # token 1 moved back (0.15 < 2.64), token 3 did not (2.35 > 1.54)
    assert out["fraction_moved_back"] == pytest.approx(0.5)
    assert out["grpo_shift"][0] == pytest.approx(math.log(1 / 56 * 4))
    assert out["tandem_shift"][1] == pytest.approx(math.log(1 / 42 * 4))
    top3 = drift_reversal(base, grpo, tandem, top_n=3, smoothing=1.0)
    assert top3["token_ids"] == [1, 3, 0] and top3["fraction_moved_back"] == pytest.approx(2 / 3)
    # Only tokens GRPO shifted are candidates: all four here, so N=500 is cut to 4 ...
    assert drift_reversal(base, grpo, tandem, top_n=500, smoothing=1.0)["top_n"] == 4
    # ... but token 1 has the same smoothed share (11/44) under this GRPO and the base, so it is left out.
    same = drift_reversal(base, torch.tensor([20.0, 10.0, 5.0, 5.0]), base, top_n=500, smoothing=1.0)
    assert same["top_n"] == 3 and sorted(same["token_ids"]) == [0, 2, 3]


# -------------------------------------------------------------------------------------------------- legibility


def test_masked_cross_entropy_and_overlap_hand_values():
    logits_a = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0]]])  # p = (3/4, 1/4), (1/2, 1/2)
    logits_b = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])
    targets = torch.tensor([[0, 1]])
    total, count = masked_token_cross_entropy(logits_a, targets, torch.tensor([[1, 0]]))
    assert (total, count) == (pytest.approx(-math.log(0.75)), 1)
    total, count = masked_token_cross_entropy(logits_a, targets, torch.tensor([[1, 1]]))
    assert total == pytest.approx(-math.log(0.75) - math.log(0.5)) and count == 2
    # min(3/4, 1/2) + min(1/4, 1/2) = 0.75 at position 0; identical distributions at position 1
    overlap, count = masked_overlap(logits_a, logits_b, torch.tensor([[1, 1]]))
    assert overlap == pytest.approx(0.75 + 1.0) and count == 2


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
    out = legibility(None, model, prompts, completions, pad_token_id=0, batch_size=2)
    assert out["num_tokens"] == 10
    assert out["junior_cross_entropy"] == pytest.approx(sum(expected) / len(expected), rel=1e-4)
    assert out["overlap"] is None
    # Greedy tokens are each position's argmax: their -log p is at most that of any other token (< log V).
    assert max(expected) < math.log(64)


def test_overlap_is_one_for_identical_models_and_less_otherwise():
    model = tiny_llama(0)
    twin = copy.deepcopy(model)  # a distinct module with the same weights: the real two-model path runs
    prompts, completions = [[3, 4, 5], [6, 7]], [[8, 9, 10], [11, 12, 13, 14]]
    same = legibility(model, twin, prompts, completions, pad_token_id=0)
    assert same["overlap"] == pytest.approx(1.0, abs=1e-5)
    other = legibility(tiny_llama(1), model, prompts, completions, pad_token_id=0)
    assert 0.0 < other["overlap"] < 0.99
    assert other["junior_cross_entropy"] == pytest.approx(same["junior_cross_entropy"], rel=1e-5)  # same junior
    with pytest.raises(ValueError, match="shared vocabulary"):
        legibility(tiny_llama(1, vocab_size=80), model, prompts, completions, pad_token_id=0)
