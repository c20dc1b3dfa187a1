"""Reasoning-step splitting on real GSM8K solutions (blank lines, else single lines)."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_DATA

from tandem_grpo.evaluation.steps import prefix_end, split_steps, step_spans

GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def solutions() -> list[str]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"{GSM8K_TEST} missing (set TANDEM_GRPO_DATA_DIR to a mirror of the math sets)")
    with GSM8K_TEST.open(encoding="utf-8") as handle:
        return [json.loads(line)["answer"] for _, line in zip(range(200), handle, strict=False)]


def test_first_gsm8k_solution_splits_into_its_lines(solutions):
    assert split_steps(solutions[0]) == [
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.",
        "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer\u2019s market.",
        "#### 18",
    ]


def test_gsm8k_solutions_fall_back_to_lines(solutions):
    # GSM8K solutions have no blank lines: every non-empty line is one step, in order.
    assert not any("\n\n" in s for s in solutions)
    for text in solutions:
        expected = [line.strip() for line in text.split("\n") if line.strip()]
        assert split_steps(text) == expected
        assert len(expected) >= 2  # at least one reasoning line and the "#### answer" line


def test_blank_lines_take_precedence_over_lines(solutions):
    # Two whole GSM8K solutions separated by a blank line (with stray spaces) are two steps, each keeping its own
    # single newlines inside.
    text = solutions[1] + "\n  \n\n" + solutions[2] + "\n"
    assert split_steps(text) == [solutions[1], solutions[2]]


def test_spans_point_into_the_text_and_prefix_end(solutions):
    text = solutions[3]
    steps = split_steps(text)
    spans = step_spans(text)
    assert [text[a:b] for a, b in spans] == steps
    assert all(text[b : spans[i + 1][0]].isspace() for i, (_, b) in enumerate(spans[:-1]))
    # The prefix after s steps keeps the separator, so the next model starts at the start of step s + 1.
    end = prefix_end(text, 1)
    assert text[:end] == steps[0] + "\n"
    assert text[end:].startswith(steps[1])
    assert prefix_end(text, len(steps)) is None  # nothing left to hand over
    assert prefix_end(text, len(steps) + 5) is None
    with pytest.raises(ValueError, match="num_steps"):
        prefix_end(text, 0)


def test_edge_cases():
    assert split_steps("") == []
    assert split_steps(" \n\n \n") == []
    assert split_steps("one line") == ["one line"]
    assert split_steps("\n  a\n\n\n b \n") == ["a", "b"]
    assert step_spans("x\n\ny") == [(0, 1), (3, 4)]
