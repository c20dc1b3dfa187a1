"""Legibility averaged as the paper's authors do (tandem_grpo.evaluation.junior_legibility.legibility: per completion
without EOS, then over completions) and its intervals, null and paired differences, against values computed by hand
or drawn with a known answer."""

from __future__ import annotations

import math

import pytest
import torch
from test_evaluation_metrics import tiny_llama
from tiny_architectures import CAUSAL_LMS

from tandem_grpo.evaluation.junior_legibility import (
    benchmark_means,
    can_share_prompt,
    cot_mean,
    legibility,
    macro_average,
    macro_mean,
    paired_difference,
)

EOS = (1, 2)


@torch.no_grad()
def _per_token(senior, junior, prompt: list[int], completion: list[int]) -> tuple[list[float], list[float]]:
    """Each completion token's junior ``-log p`` and senior/junior overlap, one forward pass per prefix."""
    nll, overlap = [], []
    for t, token in enumerate(completion):
        ids = torch.tensor([prompt + completion[:t]])
        logp_j = torch.log_softmax(junior(ids).logits[0, -1].double(), -1)
        p_s = torch.softmax(senior(ids).logits[0, -1].double(), -1)
        nll.append(-float(logp_j[token]))
        overlap.append(float(torch.minimum(p_s, logp_j.exp()).sum()))
    return nll, overlap


def _mean(xs):
    return sum(xs) / len(xs)


# ------------------------------------------------------------------------------------ per-completion averaging


def test_each_completion_mean_leaves_out_its_trailing_eos():
    senior, junior = tiny_llama(1), tiny_llama(0)
    prompts = [[5, 9, 13], [7, 11], [4, 6, 8], [3, 3]]
    completions = [
        [8, 9, 10, 2],  # ends with the second EOS id
        [20, 21, 22, 23, 24, 25],  # cut at the length cap: no EOS, every token scored
        [1],  # nothing but EOS: skipped
        [30, 31, 1],
    ]
    out = legibility(senior, junior, prompts, completions, pad_token_id=0, batch_size=3, eos_token_ids=EOS)
    per_ce, per_ov, kept = [], [], []
    all_nll = []
    for p, c in zip(prompts, completions, strict=True):
        nll, overlap = _per_token(senior, junior, p, c)
        all_nll += nll
        n = len(c) - (1 if c[-1] in EOS else 0)
        kept.append(n)
        per_ce.append(_mean(nll[:n]) if n else None)
        per_ov.append(_mean(overlap[:n]) if n else None)
    got = out["per_completion"]
    assert got["num_tokens"] == kept == [3, 6, 0, 2]
    assert got["junior_cross_entropy"][2] is None and got["overlap"][2] is None
    for i in (0, 1, 3):
        assert got["junior_cross_entropy"][i] == pytest.approx(per_ce[i], rel=1e-4)
        assert got["overlap"][i] == pytest.approx(per_ov[i], rel=1e-4)
    assert (out["num_completions"], out["num_scored"], out["num_skipped_empty"]) == (4, 3, 1)
    assert out["num_scored_tokens"] == 11 and out["num_tokens"] == 14
    assert out["junior_cross_entropy"] == pytest.approx(_mean([per_ce[i] for i in (0, 1, 3)]), rel=1e-4)
    assert out["overlap"] == pytest.approx(_mean([per_ov[i] for i in (0, 1, 3)]), rel=1e-4)
    # The EOS tokens do matter here: including them moves the first completion's mean.
    nll0, _ = _per_token(senior, junior, prompts[0], completions[0])
    assert abs(_mean(nll0) - per_ce[0]) > 1e-3


def test_a_problems_samples_share_one_prompt_pass_and_score_as_if_each_ran_alone():
    senior, junior = tiny_llama(1), tiny_llama(0)
    # Two problems x 3 samples (problem-major, as the evaluation writes them), then a lone prompt.
    prompts = [[5, 9, 13]] * 3 + [[7, 11, 4, 6]] * 3 + [[3, 3]]
    completions = [[8, 9, 10, 2], [20, 21], [1], [30, 31, 32, 33, 34], [40], [41, 42, 1], [50, 51]]
    calls = []
    hook = junior.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                            with_kwargs=True)  # fmt: skip
    out = legibility(senior, junior, prompts, completions, pad_token_id=0, batch_size=4, eos_token_ids=EOS)
    hook.remove()
    # Each problem: one pass over its prompt alone, one over its samples' completions; the lone prompt: one pass.
    assert calls == [(1, 3), (3, 3), (1, 4), (3, 4), (1, 4)]
    got = out["per_completion"]
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        nll, overlap = _per_token(senior, junior, p, c)
        n = len(c) - (1 if c[-1] in EOS else 0)
        if n == 0:
            assert got["junior_cross_entropy"][i] is None
            continue
        assert got["junior_cross_entropy"][i] == pytest.approx(_mean(nll[:n]), rel=1e-5)
        assert got["overlap"][i] == pytest.approx(_mean(overlap[:n]), rel=1e-5)


class _Wrapped(torch.nn.Module):
    """A model behind a plain forward(**kwargs): no config to build a cache from, so no shared prompt pass."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        return self.inner(**kwargs)


def test_a_model_without_a_dynamic_cache_is_scored_one_padded_batch_at_a_time():
    junior = tiny_llama(0)
    prompts, completions = [[5, 9, 13]] * 3, [[8, 9, 10, 2], [20, 21], [30, 31, 32]]
    calls = []
    hook = junior.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                            with_kwargs=True)  # fmt: skip
    wrapped = legibility(None, _Wrapped(junior), prompts, completions, pad_token_id=0, eos_token_ids=EOS)
    hook.remove()
    assert calls == [(3, 7)]  # one padded batch: the prompt (3) + the longest completion (4)
    shared = legibility(None, junior, prompts, completions, pad_token_id=0, eos_token_ids=EOS)
    assert wrapped["per_completion"]["junior_cross_entropy"] == pytest.approx(
        shared["per_completion"]["junior_cross_entropy"], rel=1e-5
    )


def test_mean_over_completions_is_not_the_pooled_token_mean_when_lengths_differ():
    junior = tiny_llama(0)
    prompts = [[5, 9], [7, 11]]
    completions = [[40, 41], [10, 12, 14, 16, 18, 20, 22, 24]]  # 2 and 8 tokens, no EOS
    out = legibility(None, junior, prompts, completions, pad_token_id=0, eos_token_ids=EOS)
    nll = [_per_token(junior, junior, p, c)[0] for p, c in zip(prompts, completions, strict=True)]
    mean_of_means = _mean([_mean(x) for x in nll])
    pooled = _mean(nll[0] + nll[1])
    assert abs(mean_of_means - pooled) > 0.05  # the example separates the two averages
    assert out["junior_cross_entropy"] == pytest.approx(mean_of_means, rel=1e-4)
    assert out["overlap"] is None and out["per_completion"]["overlap"] is None


# ----------------------------------------------------------------------------------- intervals, null, difference


def _draw(problems: int, k: int, seed: int, shift: float = 0.0, effects: torch.Tensor | None = None) -> list[list]:
    """Per-CoT values: a problem effect (sd 1, shared when ``effects`` is given) plus i.i.d. noise (sd 0.5)."""
    g = torch.Generator().manual_seed(seed)
    if effects is None:
        effects = torch.randn(problems, 1, generator=g, dtype=torch.float64)
    noise = 0.5 * torch.randn(problems, k, generator=g, dtype=torch.float64)
    return (2.0 + shift + effects + noise).tolist()


def test_cot_mean_is_the_mean_over_scored_cots_with_an_interval():
    values = [[1.0, 3.0, None], [2.0, 2.0, 5.0], [float("nan"), 4.0, 0.0]]
    out = cot_mean(values, confidence=0.9, seed=4)
    flat = [1.0, 3.0, 2.0, 2.0, 5.0, 4.0, 0.0]
    assert out["mean"]["value"] == pytest.approx(sum(flat) / len(flat))  # each CoT weighs the same
    assert (out["num_problems"], out["num_scored"], out["num_skipped"]) == (3, 7, 2)
    assert out["mean"]["ci_low"] < out["mean"]["value"] < out["mean"]["ci_high"]
    assert out["mean"]["confidence"] == 0.9 and "seed 4" in out["mean"]["ci_method"]
    assert cot_mean([[1.0], [2.0]])["null_half_difference"] is None  # one sample per problem: no halves
    with pytest.raises(ValueError, match="no problems"):
        cot_mean([])


def test_null_covers_zero_for_one_model_and_has_the_width_of_two_halves():
    problems, k, sd = 40, 4, 0.5
    covered, half_widths = 0, []
    for seed in range(20):
        null = cot_mean(_draw(problems, k, seed), seed=seed)["null_half_difference"]
        covered += null["ci_low"] <= 0.0 <= null["ci_high"]
        half_widths.append((null["ci_high"] - null["ci_low"]) / 2)
    assert covered >= 16  # 19 expected at 95%
    # Even minus odd halves of 2 samples each: per problem sd * sqrt(1/2 + 1/2), over P problems. The problem effect
    # (sd 1) cancels only when both halves are resampled together.
    expected = 1.96 * sd / math.sqrt(problems)
    assert 0.7 * expected < _mean(half_widths) < 1.4 * expected


def test_paired_difference_covers_the_true_difference():
    problems, k, sd, shift = 40, 4, 0.5, 0.3
    covered, half_widths = 0, []
    for seed in range(20):
        g = torch.Generator().manual_seed(1000 + seed)
        effects = torch.randn(problems, 1, generator=g, dtype=torch.float64)  # the same problems for both models
        a = _draw(problems, k, seed, shift=shift, effects=effects)
        b = _draw(problems, k, 500 + seed, effects=effects)
        diff = paired_difference(a, b, seed=seed)
        covered += diff["ci_low"] <= shift <= diff["ci_high"]
        half_widths.append((diff["ci_high"] - diff["ci_low"]) / 2)
        assert diff["value"] == pytest.approx(diff["value_a"] - diff["value_b"])
        assert diff["ci_low"] > 0.0  # 0.3 is about five standard errors: the difference is seen
    assert covered >= 16
    expected = 1.96 * sd * math.sqrt(2 / k / problems)  # paired: the problem effects cancel
    assert 0.7 * expected < _mean(half_widths) < 1.4 * expected
    with pytest.raises(ValueError, match="problems"):
        paired_difference([[1.0]], [[1.0], [2.0]])


def test_macro_average_is_the_mean_over_benchmarks():
    assert macro_average({"aime24": 1.0, "amc23": 2.0, "math500": 6.0}) == pytest.approx(3.0)
    assert macro_average({"aime24": 1.5, "empty": None, "nan": float("nan")}) == 1.5
    assert macro_average({}) is None


def test_benchmark_means_are_each_benchmarks_mean_over_its_cots():
    values = [[1.0, None], [3.0, 5.0], [float("nan"), None], [2.0, 4.0]]
    means = benchmark_means(values, ["a", "a", "b", "c"])
    assert means == {"a": pytest.approx(3.0), "b": None, "c": pytest.approx(3.0)}  # b: nothing scored
    assert macro_average(means) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="3 benchmark names for 4 problems"):
        benchmark_means(values, ["a", "a", "b"])


def test_macro_mean_has_the_headline_value_an_interval_that_covers_and_a_null_about_zero():
    """Two benchmarks of different sizes and levels: the value is the authors' macro average, the stratified
    interval covers the true macro mean (the mean of the two levels) in most replications, the even/odd null covers 0,
    and a benchmark with nothing scored is left out."""
    covered = null_covered = 0
    for seed in range(20):
        a = _draw(30, 4, seed)  # level 2
        b = _draw(10, 4, 300 + seed, shift=2.0)  # level 4: the macro mean is 3.0 whatever the sizes
        values, names = a + b, ["a"] * 30 + ["b"] * 10
        out = macro_mean(values, names, seed=seed)
        assert out["mean"]["value"] == pytest.approx(macro_average(benchmark_means(values, names)))
        covered += out["mean"]["ci_low"] <= 3.0 <= out["mean"]["ci_high"]
        null_covered += out["null_half_difference"]["ci_low"] <= 0.0 <= out["null_half_difference"]["ci_high"]
    assert covered >= 16 and null_covered >= 16  # 19 expected at 95%
    pooled = cot_mean(values)["mean"]["value"]
    assert abs(pooled - out["mean"]["value"]) > 0.3, "the pooled mean weighs the larger benchmark more"
    empty = macro_mean([[1.0, 3.0], [None, None]], ["a", "b"])
    assert empty["mean"]["value"] == pytest.approx(2.0) and empty["benchmarks"] == ["a", "b"]
    with pytest.raises(ValueError, match="1 benchmark names for 2 problems"):
        macro_mean([[1.0], [2.0]], ["a"])


@pytest.mark.parametrize("family", sorted(CAUSAL_LMS))
def test_shared_prompt_scoring_matches_per_prefix_scoring_on_every_architecture(family):
    """Sliding-window, MoE and hybrid (Mamba) caches: a cache that repeats along the batch gets one prompt pass, a
    hybrid one the padded batch; the numbers are each prefix's own forward pass either way."""
    model = CAUSAL_LMS[family](0)
    prompts = [[5, 9, 13, 4, 6]] * 3 + [[7, 11]] * 2
    completions = [[8, 9, 10, 12, 14, 1], [10, 11], [12], [3, 4, 5, 6, 7, 8, 9], [15, 16, 1]]
    out = legibility(None, model, prompts, completions, pad_token_id=0, batch_size=4, eos_token_ids=EOS)
    assert can_share_prompt(model) == (family != "nemotron_h")
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        nll, _ = _per_token(model, model, p, c)
        n = len(c) - (1 if c[-1] in EOS else 0)
        assert out["per_completion"]["junior_cross_entropy"][i] == pytest.approx(_mean(nll[:n]), rel=1e-4), i
