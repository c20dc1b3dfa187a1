"""The instructions appended to every question: step-by-step reasoning (the default) or a one-line answer."""

from __future__ import annotations

__all__ = ["ANSWER_LINE_INSTRUCTION", "INSTRUCTION", "INSTRUCTIONS", "ONE_LINE_INSTRUCTION", "STEPS_INSTRUCTION"]

INSTRUCTION = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."
"""Appended to every question by default: asks for step-by-step reasoning and a final answer in ``\\boxed{}``."""

ONE_LINE_INSTRUCTION = (
    "\n\nCompute it in one line, then give the answer as \\boxed{}. Example: 3 + 4 = 7, so \\boxed{7}."
)
"""A short-answer instruction for small models and short completions. Measured on SmolLM2-135M-Instruct with
``python bench/probe_instructions.py`` (8 built-in problems x 4 samples, temperature 1, 64 new tokens): 25% of
completions give a ``\\boxed{}`` answer and 28% reach the token cap, against 3% and 91% with
[`INSTRUCTION`][tandem_grpo.data.INSTRUCTION], which leaves GRPO almost no reward to learn from at that length."""

STEPS_INSTRUCTION = (
    "\n\nSolve it step by step: write one calculation per line, leave a blank line between the lines, "
    "and give the final answer as \\boxed{}."
)
"""One calculation per paragraph: steps the paper's alternating handoff protocol (which splits on blank lines) can
hand over; the reproduction study's instruction (chosen by ``bench/pilot_task.py``, whose output is in
``results/pilot``)."""

ANSWER_LINE_INSTRUCTION = (
    "\n\nSolve it step by step: write one calculation per line, leave a blank line between the lines, "
    'and end with a last line of the form "Answer: <number>".'
)
"""[`STEPS_INSTRUCTION`][tandem_grpo.data.STEPS_INSTRUCTION]'s steps, ending with an ``Answer:`` line (what
[`stated_answer`][tandem_grpo.data.stated_answer] reads) instead of a ``\\boxed{}`` a 135M model rarely writes."""

INSTRUCTIONS: dict[str, str] = {
    "step_by_step": INSTRUCTION,
    "one_line": ONE_LINE_INSTRUCTION,
    "steps": STEPS_INSTRUCTION,
    "answer_line": ANSWER_LINE_INSTRUCTION,
}
"""The instructions by the names the command lines take (``--instruction step_by_step|one_line|steps|answer_line``)."""
