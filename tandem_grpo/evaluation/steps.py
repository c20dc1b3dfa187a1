"""Reasoning steps of a solution text, for the step-handoff schedules (paper section 5, handoff robustness).

A step is a block of text separated from the next by a blank line (a newline, optional horizontal whitespace, another
newline). Solutions without any blank line (GSM8K's reference solutions, most short model outputs) fall back to one
step per non-empty line.
"""

from __future__ import annotations

import re

_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_STEP_SEPARATOR = re.compile(r"(?:\n[ \t\r\f\v]*){2,}")


def step_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the reasoning steps of ``text`` (module docstring), increasing, with
    ``0 <= start < end <= len(text)``. Each span is stripped of surrounding whitespace and whitespace-only pieces are
    not steps, so the text between two spans is only the separator; empty or whitespace-only ``text`` gives ``[]``.
    """
    separator = _STEP_SEPARATOR if _BLANK_LINE.search(text) else re.compile(r"\n")
    spans = []
    start = 0
    for match in separator.finditer(text):
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(text)))
    out = []
    for a, b in spans:
        piece = text[a:b]
        stripped = piece.strip()
        if not stripped:
            continue
        lead = len(piece) - len(piece.lstrip())
        out.append((a + lead, a + lead + len(stripped)))
    return out


def split_steps(text: str) -> list[str]:
    """The reasoning steps of ``text`` as strings (see [`step_spans`][tandem_grpo.evaluation.steps.step_spans] for the
    rule)."""
    return [text[a:b] for a, b in step_spans(text)]


def handover_region(text: str, num_steps: int) -> tuple[int, int] | None:
    """Character offsets ``(start, end)`` of the whitespace between step ``num_steps`` (``>= 1``) and the next of
    ``text``: a handover anywhere in it leaves the first steps whole to the first model. ``None`` when ``text`` has
    ``num_steps`` steps or fewer (nothing left to hand over).

    Raises:
        ValueError: ``num_steps < 1``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps!r} must be >= 1 (a schedule hands over after at least one step).")
    spans = step_spans(text)
    if len(spans) <= num_steps:
        return None
    return spans[num_steps - 1][1], spans[num_steps][0]


def prefix_end(text: str, num_steps: int) -> int | None:
    """Character offset where step ``num_steps + 1`` starts (``handover_region(...)[1]``), or ``None``.

    ``text[:prefix_end(text, s)]`` is the first ``s`` steps with the separator after them.

    Raises:
        ValueError: ``num_steps < 1``.
    """
    region = handover_region(text, num_steps)
    return None if region is None else region[1]
