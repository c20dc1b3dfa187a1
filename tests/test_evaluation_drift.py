"""Drift and moved-back statistics (tandem_grpo.evaluation.drift) on synthetic token streams with known answers.

Each statistic is checked three ways: its null is a null (two sets drawn from one distribution give an excess
whose interval covers 0), it sees a real effect, and the drift estimator's value is stable across sample sizes
where the whole-vocabulary smoothed KL of 0.1 is not.
"""

from __future__ import annotations

import pytest
import torch

from tandem_grpo.evaluation.drift import binned_kl, drift, drift_difference, moved_back
from tandem_grpo.evaluation.metrics import marginal_kl, token_counts

V = 3000


def _zipf(seed: int = 0) -> torch.Tensor:
    ranks = torch.arange(1, V + 1, dtype=torch.float64)
    p = ranks**-1.1
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    return (p / p.sum())[perm]


def _boosted(p: torch.Tensor, factor: float = 6.0, count: int = 40, seed: int = 1) -> torch.Tensor:
    """``p`` with ``count`` mid-frequency tokens made ``factor`` times likelier (GRPO's shift)."""
    order = torch.argsort(p, descending=True)
    chosen = order[20 : 20 + 4 * count : 4]
    q = p.clone()
    q[chosen] *= factor
    return q / q.sum()


def _sample(p: torch.Tensor, problems: int, k: int, length: int, seed: int) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(p, problems * k * length, replacement=True, generator=g).view(problems, k, length)
    return draws.tolist()


BASE = _zipf()
GRPO = _boosted(BASE)


def test_binned_kl_is_zero_for_equal_counts_and_positive_otherwise() -> None:
    counts = torch.tensor([[5.0, 3.0, 0.0, 2.0]])
    assert binned_kl(counts, counts, bins=2).item() == pytest.approx(0.0, abs=1e-12)
    assert binned_kl(counts, torch.tensor([[0.0, 3.0, 5.0, 2.0]]), bins=2).item() > 0.1
    assert torch.isnan(binned_kl(counts, torch.zeros(1, 4), bins=2)).all()
    with pytest.raises(ValueError, match="bins"):
        binned_kl(counts, counts, bins=0)


def test_drift_null_is_a_null_and_model_equal_to_base_adds_nothing() -> None:
    base = _sample(BASE, 40, 4, 40, seed=1)
    same = drift(base, base, num_resamples=200)
    assert same["excess_nats"]["value"] == pytest.approx(0.0, abs=1e-12)
    # An independent sample of the base's own distribution: the excess is noise around 0.
    other = drift(_sample(BASE, 40, 4, 40, seed=2), base, num_resamples=300)
    assert other["excess_nats"]["ci_low"] < 0 < other["excess_nats"]["ci_high"]
    shifted = drift(_sample(GRPO, 40, 4, 40, seed=3), base, num_resamples=300)
    assert shifted["excess_nats"]["ci_low"] > 0
    assert shifted["kl_nats"]["value"] > shifted["null_kl_nats"]["value"]


def test_drift_is_stable_across_sample_sizes_where_smoothed_kl_is_not() -> None:
    values, smoothed = [], []
    for problems in (25, 100, 400):
        model = _sample(GRPO, problems, 4, 40, seed=10 + problems)
        base = _sample(BASE, problems, 4, 40, seed=20 + problems)
        values.append(drift(model, base, num_resamples=1)["excess_nats"]["value"])
        flat = lambda groups: [c for g in groups for c in g]  # noqa: E731
        smoothed.append(marginal_kl(token_counts(flat(model), V), token_counts(flat(base), V), 0.1))
    # 4k to 64k tokens per side: the excess drift stays within 25% of its largest-sample value ...
    assert max(abs(v - values[-1]) for v in values) < 0.25 * values[-1], values
    # ... while the whole-vocabulary smoothed KL falls by almost half (the pseudo-count dominates at 4k).
    assert smoothed[0] > 1.8 * smoothed[-1], smoothed


def test_drift_by_position_and_errors() -> None:
    base = _sample(BASE, 10, 2, 20, seed=4)
    out = drift(base, base, prefix_tokens=5, num_resamples=10)
    assert out["by_position"]["first"]["num_tokens"] == 10 * 2 * 5
    assert out["by_position"]["rest"]["num_tokens"] == 10 * 2 * 15
    with pytest.raises(ValueError, match="at least 2 per problem"):
        drift([[[1, 2]]], [[[1, 2]]])
    with pytest.raises(ValueError, match="problems"):
        drift(base, base[:5])
    with pytest.raises(ValueError, match="prefix_tokens"):
        drift(base, base, prefix_tokens=0)


def test_drift_difference_is_the_difference_of_the_drifts_with_a_paired_interval() -> None:
    base = _sample(BASE, 40, 4, 40, seed=1)
    shifted, plain = _sample(GRPO, 40, 4, 40, seed=3), _sample(BASE, 40, 4, 40, seed=2)
    kw = dict(prefix_tokens=5, num_resamples=200)
    a, b, diff = drift(shifted, base, **kw), drift(plain, base, **kw), drift_difference(shifted, plain, base, **kw)
    for keys in ((), ("by_position", "first"), ("by_position", "rest")):
        pa, pb, pd = a, b, diff
        for key in keys:
            pa, pb, pd = pa[key], pb[key], pd[key]
        assert pd["kl_nats"]["value"] == pytest.approx(pa["kl_nats"]["value"] - pb["kl_nats"]["value"], abs=1e-12)
        assert pd["kl_nats"]["value"] == pytest.approx(pa["excess_nats"]["value"] - pb["excess_nats"]["value"])
    assert a["null_kl_nats"] == b["null_kl_nats"]  # the base's own halves, whatever it is compared with
    assert diff["kl_nats"]["ci_low"] > 0  # GRPO's shift against a fresh sample of the base
    # Paired: a model against itself differs by exactly 0 on every resample, so the interval has no width, where
    # each drift alone has one.
    same = drift_difference(shifted, shifted, base, num_resamples=200)["kl_nats"]
    assert same["value"] == same["ci_low"] == same["ci_high"] == 0.0
    assert a["kl_nats"]["ci_high"] - a["kl_nats"]["ci_low"] > 0.01
    with pytest.raises(ValueError, match="problem counts"):
        drift_difference(shifted, plain[:5], base)
    with pytest.raises(ValueError, match="at least 2 per problem"):
        drift_difference([[[1, 2]]], [[[1, 2]]], [[[1, 2]]])


def test_moved_back_null_is_one_half_and_a_returned_checkpoint_is_seen() -> None:
    # A checkpoint that is GRPO again, ten times over: the excess is centred on 0 and its intervals cover 0 about
    # as often as they claim (a single draw is outside 5% of the time by design).
    excess, covered, nulls = [], 0, []
    for r in range(10):
        base, grpo = _sample(BASE, 40, 4, 40, seed=100 + r), _sample(GRPO, 40, 4, 40, seed=200 + r)
        out = moved_back(base, grpo, _sample(GRPO, 40, 4, 40, seed=300 + r), V, num_resamples=100)
        excess.append(out["excess"]["value"])
        nulls.append(out["null_fraction"]["value"])
        covered += out["excess"]["ci_low"] < 0 < out["excess"]["ci_high"]
        assert 0 < out["num_selected"] <= 500
    assert abs(sum(excess) / len(excess)) < 0.03, excess
    assert abs(sum(nulls) / len(nulls) - 0.5) < 0.03, nulls
    assert covered >= 8, excess
    # A checkpoint with the base's distribution moves GRPO's shifted tokens back.
    base, grpo = _sample(BASE, 60, 8, 40, seed=5), _sample(GRPO, 60, 8, 40, seed=6)
    back = moved_back(base, grpo, _sample(BASE, 60, 8, 40, seed=8), V, num_resamples=200)
    assert back["excess"]["ci_low"] > 0.05
    assert back["fraction_moved_back"]["value"] > 0.6


def test_moved_back_selects_frequent_tokens_only_and_checks_inputs() -> None:
    base = _sample(BASE, 20, 4, 30, seed=9)
    grpo = _sample(GRPO, 20, 4, 30, seed=10)
    out = moved_back(base, grpo, grpo, V, min_count=10, num_resamples=5)
    pooled = token_counts([c for g in base for c in g[0::2]] + [c for g in grpo for c in g[0::2]], V)
    assert all(pooled[t] >= 10 for t in out["token_ids"])
    with pytest.raises(ValueError, match="at least 4 per problem"):
        moved_back([g[:2] for g in base], grpo, grpo, V)
    with pytest.raises(ValueError, match="problem counts differ"):
        moved_back(base, grpo[:3], grpo, V)
