"""Tests for tandem_grpo.rewards: answer extraction, math-verify comparison and TRL reward functions."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tandem_grpo.rewards import accuracy_reward, extract_answer, format_reward, is_correct

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _conv(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# --------------------------------------------------------------------------------------------------
# extract_answer
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"first \boxed{3} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"So the answer is $\boxed{ 42 }$.", "42"),
        ("We get 12 and then 1,234 apples.", "1234"),
        ("The temperature is -3 degrees.", "-3"),
        ("It costs 2.5 dollars.", "2.5"),
        ("She ate 3/4 of the pie", "3/4"),
        ("5-3 = 2", "2"),
        (r"The box \boxed{} is empty, the answer is 7", "7"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# --------------------------------------------------------------------------------------------------
# is_correct
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (r"... so \boxed{72}", "72"),
        (r"\boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{1,234}", "1234"),
        ("Adding up gives 1,234.", "1234"),
        (r"\boxed{1234}", "1,234"),
        (r"\boxed{\dfrac{\pi}{2}}", r"\frac{\pi}{2}"),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"\boxed{27}", "27.0"),
        (r"\boxed{25}", "025"),
        ("The answer is 3/4", "0.75"),
        (r"\boxed{4.5 \times 10^{33}}", "4.5e33"),
        (r"\boxed{\$18}", "18"),
        (r"\boxed{e^{-x^2}}", r"e^{-x^{2}}"),  # symbolic nested powers are not mistaken for towers
        (r"\boxed{(2^{3})^{2}}", "64"),
    ],
)
def test_is_correct_accepts_equivalent_answers(completion, gold):
    assert is_correct(completion, gold) is True


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (r"\boxed{71}", "72"),
        (r"\boxed{-3}", "3"),
        (r"\boxed{\frac{\pi}{3}}", r"\frac{\pi}{2}"),
        (r"\boxed{0.333}", r"\frac{1}{3}"),
        (r"\boxed{72} is wrong, it is \boxed{73}", "72"),  # the last box counts
        ("I don't know.", "72"),  # nothing to extract
        (r"\boxed{\frac{", "72"),  # unparsable
        (r"\boxed{\sqrt{}}", "2"),
        (r"\boxed{72}", ""),
        (r"\boxed{72}", None),
    ],
)
def test_is_correct_rejects_wrong_or_unparsable(completion, gold):
    assert is_correct(completion, gold) is False


def test_is_correct_accepts_conversational_completion():
    assert is_correct(_conv(r"\boxed{\frac{1}{2}}"), "0.5") is True
    assert is_correct(_conv(r"\boxed{2}"), "0.5") is False


def test_is_correct_works_off_the_main_thread():
    cases = [
        (r"\boxed{\frac{1}{2}}", "0.5", True),
        (r"\boxed{1,234}", "1234", True),
        (r"\boxed{\frac{\pi}{3}}", r"\frac{\pi}{2}", False),
        (r"\boxed{\frac{", "1", False),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: is_correct(case[0], case[1]), cases))
    assert results == [expected for _, _, expected in cases]


def test_power_tower_is_rejected_quickly_in_main_thread():
    start = time.monotonic()
    assert is_correct(r"\boxed{10^{10^{10^{10}}}}", "5") is False
    assert time.monotonic() - start < 2.0  # without the guard math-verify waits for its 5 s timeout


def test_power_tower_does_not_hang_a_worker_thread():
    # Without timeouts (worker thread), sympy would hold the GIL for ever: run it in a subprocess.
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from tandem_grpo.rewards import is_correct\n"
        "cases = [(r'\\boxed{10^{10^{10}}}', '5'), (r'\\boxed{9^9^9}', '5'), (r'\\boxed{9**9**9}', '5'),\n"
        "         (r'\\boxed{2^{2^{10}}}', '5'), (r'\\boxed{10^{12345678}}', '5'),\n"
        "         (r'\\boxed{10^{(10^{10})}}', '5')]\n"
        "with ThreadPoolExecutor(1) as pool:\n"
        "    print(list(pool.map(lambda c: is_correct(*c), cases)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[False, False, False, False, False, False]"


# --------------------------------------------------------------------------------------------------
# TRL reward functions
# --------------------------------------------------------------------------------------------------


def test_accuracy_reward_plain_and_conversational():
    completions = [r"\boxed{4}", "The result is 5", r"\boxed{\frac{1}{2}}", "no idea"]
    golds = ["4", "4", "0.5", "1"]
    expected = [1.0, 0.0, 1.0, 0.0]
    assert accuracy_reward(completions, answer=golds) == expected
    conversational = [_conv(c) for c in completions]
    # TRL passes prompts and other columns as keywords too: they must be ignored.
    assert accuracy_reward(conversational, answer=golds, prompts=["p"] * 4, completion_ids=[[1]] * 4) == expected


def test_accuracy_reward_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        accuracy_reward([r"\boxed{1}", r"\boxed{2}"], answer=["1"])


def test_format_reward():
    completions = [r"so \boxed{12}", "so 12", r"empty \boxed{}", r"truncated \boxed{12", _conv(r"\boxed{x}")]
    assert format_reward(completions) == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert format_reward([_conv("plain")], answer=["1"]) == [0.0]


def test_accuracy_reward_on_gsm8k_test_golds():
    path = DATA_DIR / "gsm8k" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"shared GSM8K data not found at {path}")
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(next(handle)) for _ in range(50)]
    written = [r["answer"].rsplit("####", 1)[1].strip() for r in rows]  # as in the file (may have commas)
    golds = [w.replace(",", "") for w in written]
    assert accuracy_reward([f"Reasoning.\n\\boxed{{{w}}}" for w in written], answer=golds) == [1.0] * 50
    off_by_one = [f"\\boxed{{{float(g) + 1:g}}}" for g in golds]
    assert accuracy_reward(off_by_one, answer=golds) == [0.0] * 50
