"""Support and openings (tandem_grpo.evaluation.support): estimators checked on enumerable toys."""

import itertools
import math

import pytest

from tandem_grpo.evaluation import support


def _enumerate(distribution: dict, n: int):
    """Every sequence of ``n`` independent draws from ``distribution`` with its probability."""
    for draws in itertools.product(distribution, repeat=n):
        yield list(draws), math.prod(distribution[d] for d in draws)


def test_modal_share_is_unbiased_for_the_chance_of_opening_as_the_references_modes():
    """Over every sample of 3 openings, the expected share equals the probability mass the model puts on the
    reference's modal openings (both tied modes count)."""
    reference = [(1,), (1,), (2,), (2,), (3,)]  # modes (1,) and (2,)
    model = {(1,): 0.2, (2,): 0.3, (3,): 0.5}
    expected = sum(p * support.modal_share(s, reference) for s, p in _enumerate(model, 3))
    assert expected == pytest.approx(0.2 + 0.3)


def test_opening_entropy_is_the_plug_in_entropy_of_the_samples():
    assert support.opening_entropy([(1, 2)] * 4) == 0.0
    assert support.opening_entropy([(1,), (2,), (3,), (4,)]) == pytest.approx(math.log(4))
    assert support.opening_entropy([(1,), (1,), (2,), (3,)]) == pytest.approx(-(0.5 * math.log(0.5) + 0.5 *
                                                                                   math.log(0.25)))  # fmt: skip


def test_openings_take_the_first_tokens():
    assert support.openings([[[5, 6, 7, 8], [5]]], length=3) == [[(5, 6, 7), (5,)]]
    with pytest.raises(ValueError, match="length=0"):
        support.openings([[[1]]], length=0)


def test_split_null_holds_an_identical_model_and_refuses_a_far_one():
    """Two models with the same per-problem statistic sit inside the null; a model that opens otherwise everywhere
    is far outside it (p-value 0)."""
    same = [[(1,), (2,), (2,), (3,)] * 2 for _ in range(20)]
    other = [[(3,)] * 8 for _ in range(20)]

    def entropy(samples):
        return [support.opening_entropy(p) for p in samples]

    null = support.split_null(same, same, entropy, num_splits=200)
    assert null["p_value"] == 1.0 and null["ci_high"] > 0
    assert support.split_null(same, other, entropy, num_splits=200)["p_value"] == 0.0
    with pytest.raises(ValueError, match="same problems"):
        support.split_null(same, other[:3], entropy)


def test_compare_support_counts_lost_and_gained_problems_and_its_differences():
    """Problem 0 solved only by before, problem 1 only by after, problem 2 by both: support 2 each, one lost, one
    gained, difference 0; pass@1 and openings differences match a hand count."""
    before = [[True, False, False, False], [False] * 4, [True] * 4]
    after = [[False] * 4, [True, True, False, False], [True] * 4]
    opening = [[(1,), (1,), (2,), (2,)]] * 3
    shifted = [[(9,), (9,), (9,), (9,)]] * 3
    out = support.compare_support(before, after, opening, shifted, ks=(1, 4, 8))
    assert out["num_samples"] == 4 and set(out["pass_at_k"]) == {1, 4}
    assert out["pass_at_k"][1]["difference"]["value"] == pytest.approx((-0.25 + 0.5 + 0) / 3)
    assert (out["support"]["before"], out["support"]["after"], out["support"]["lost"], out["support"]["gained"]) == (
        2, 2, 1, 1,
    )  # fmt: skip
    assert out["opening_entropy"]["difference"]["value"] == pytest.approx(-math.log(2))
    # before's first half (1, 1) against its second half's mode (2, 2): 0; after's (9, 9): 0 as well.
    assert out["base_opening_share"]["before"] == 0.0 and out["base_opening_share"]["after"] == 0.0
    with pytest.raises(ValueError, match="same P and n"):
        support.compare_support(before, after[:2], opening, shifted)
