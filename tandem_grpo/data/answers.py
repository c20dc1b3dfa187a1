"""Gold answers in text: the last ``\\boxed{...}`` of a solution or completion, GSM8K's ``#### <answer>`` line, the
answer a completion states (its last ``\\boxed{}`` or ``Answer:`` line), and the normalization of gold strings and
numbers (``"025"`` and ``25.0`` are written ``"25"``).

[`last_boxed`][tandem_grpo.data.last_boxed] is also what [`tandem_grpo.rewards`][tandem_grpo.rewards] reads a
completion's answer with.
"""

from __future__ import annotations

import math
import re

__all__ = ["gsm8k_gold", "last_boxed", "stated_answer"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index`` (escaped ``\\{``/``\\}`` ignored), or None."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # skip escaped characters such as \{ and \}
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _boxed_candidates(text: str) -> list[tuple[int, str]]:
    """All complete ``\\boxed``/``\\fbox`` contents as ``(start, content)``, in order of appearance."""
    found = []
    for command in _BOX_COMMANDS:
        for match in re.finditer(re.escape(command) + r"(?![A-Za-z])", text):
            i = match.end()
            while i < len(text) and text[i] in " \t":
                i += 1
            if i < len(text) and text[i] == "{":
                close = _matching_brace(text, i)
                if close is not None:
                    found.append((match.start(), text[i + 1 : close]))
            elif i > match.end():
                # The brace-less form "\boxed 5": a single token.
                token = re.match(r"[^\s$]+", text[i:])
                if token:
                    found.append((match.start(), token.group(0)))
    return sorted(found)


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``, stripped.

    Nested braces are handled (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``), as is the brace-less
    ``\\boxed 5``. A box whose closing brace is missing (a truncated generation) is ignored.

    Returns:
        The content (possibly ``""`` for an empty ``\\boxed{}``), or None when there is no complete box.
    """
    if not isinstance(text, str):
        return None
    candidates = _boxed_candidates(text)
    if not candidates:
        return None
    return candidates[-1][1].strip()


# "Answer: 42", "**Answer:** 42", "The answer: 42." at the start of a line; the value runs to the end of that line.
_ANSWER_LINE_RE = re.compile(r"^[ \t*#>_-]*(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*)?[:=][ \t*_]*(.*?)[ \t*_.]*$",
                             re.IGNORECASE | re.MULTILINE)  # fmt: skip


def stated_answer(text: str) -> str | None:
    """The answer ``text`` states as its answer: the content of its last complete ``\\boxed{}``, else the value of
    its last ``Answer: <value>`` line (``**Answer:** 42``, ``Final answer: 42.`` too); never a number elsewhere.

    The authors' reward reads only the box; the ``Answer:`` line is what a small model asked for it writes more
    often (``tandem_grpo.data.ANSWER_LINE_INSTRUCTION``). Unlike the reward's default reader (the last number of the
    text when there is no box), a co-author writing past the answer does not change it.

    Returns:
        The stripped answer (an empty box gives ``""``), or None when ``text`` states none.
    """
    if not isinstance(text, str):
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    lines = [m.group(1).strip() for m in _ANSWER_LINE_RE.finditer(text)]
    lines = [line for line in lines if line]
    return lines[-1] if lines else None


def gsm8k_gold(answer_text: str) -> str:
    """The gold answer of a GSM8K ``answer`` field: the text after the last ``#### ``, commas removed.

    Example: ``"... so she has 1,080 cents.\\n#### 1,080"`` gives ``"1080"``.

    Raises:
        ValueError: when there is no ``####`` marker or nothing after it.
    """
    if not isinstance(answer_text, str) or "####" not in answer_text:
        raise ValueError(
            "GSM8K answer has no '#### <answer>' line at the end; got "
            f"{str(answer_text)[-80:]!r}. GSM8K-style rows end their 'answer' field with '#### <number>'."
        )
    gold = answer_text.rsplit("####", 1)[1].strip()
    gold = gold.replace(",", "").strip()
    if gold.startswith("$"):
        gold = gold[1:].strip()
    gold = gold.rstrip(".").strip()
    if not gold:
        raise ValueError("GSM8K answer has nothing after its '####' marker.")
    return gold


def _format_number(value: int | float) -> str:
    """``27.0`` -> ``"27"``, ``2.5`` -> ``"2.5"``, ``7`` -> ``"7"``."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        if value.is_integer():
            return str(int(value))
        return repr(value)
    return str(value)


def _normalize_gold_string(text: str) -> str:
    """Strip whitespace; write integral numbers without leading zeros or ``.0`` (``"025"`` -> ``"25"``)."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return str(int(text))
    if re.fullmatch(r"-?\d+\.0+", text):
        return str(int(float(text)))
    return text
