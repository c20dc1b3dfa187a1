"""Reward-hacking detectors (tandem_grpo.evaluation.hacks) on hand-made completions with known values."""

from __future__ import annotations

import pytest

from tandem_grpo.evaluation.hacks import boxed_share, distinct_n, hack_detectors, repeated_ngram_share


def test_repetition_measures() -> None:
    assert repeated_ngram_share([1, 2, 3, 4, 5, 6]) == 0.0
    # 1 2 3 4 | 1 2 3 4: grams (1234)(2341)(3412)(4123)(1234) -> the last repeats the first.
    assert repeated_ngram_share([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)
    assert repeated_ngram_share([7] * 10) == pytest.approx(6 / 7)
    assert repeated_ngram_share([1, 2]) == 0.0
    assert distinct_n([1, 2, 1, 2]) == pytest.approx(2 / 3)
    assert distinct_n([5]) == 1.0


def test_boxed_share() -> None:
    assert boxed_share("") == 0.0
    assert boxed_share("no box") == 0.0
    assert boxed_share("\\boxed{7}") == 1.0
    text = "so \\boxed{\\frac{1}{2}} done"
    assert boxed_share(text) == pytest.approx(len("\\boxed{\\frac{1}{2}}") / len(text))
    assert boxed_share("a \\boxed{7") == pytest.approx(len("\\boxed{7") / len("a \\boxed{7"))


def test_hack_detectors_per_problem_means_and_cap_rate() -> None:
    eos = 0
    completions = [[[1, 2, 3, eos], [4, 4, 4, 4]], [[5, eos], [6, 7, 8, 9]]]
    texts = [["a", "\\boxed{4}"], ["b", "c"]]
    out = hack_detectors(completions, texts, max_new_tokens=4, eos_token_ids=[eos])
    # Capped: no EOS at the cap (the second sample of each problem).
    assert out["cap_rate"]["value"] == pytest.approx(0.5)
    assert out["num_tokens"]["value"] == pytest.approx((4 + 4 + 2 + 4) / 4)
    assert out["boxed_share"]["value"] == pytest.approx((0.5 + 0.0) / 2)
    assert out["repeated_4gram_share"]["value"] == pytest.approx(0.0)
    assert out["repeated_4gram_share"]["num_problems"] == 2
    with pytest.raises(ValueError, match="same"):
        hack_detectors(completions, [["a"], ["b"]], 4, [eos])
