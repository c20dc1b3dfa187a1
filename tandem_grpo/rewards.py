"""Verifiable math rewards in TRL's reward-function format.

TRL's ``GRPOTrainer`` calls each reward function as ``f(prompts=..., completions=..., **columns)`` where
``columns`` are the other dataset columns (here ``answer``, see :mod:`tandem_grpo.data`), and expects one
float per completion. Completions are plain strings for standard datasets and lists of messages such as
``[{"role": "assistant", "content": "..."}]`` for conversational ones; both are handled.

Answers are compared with math-verify. Its timeouts use ``signal.alarm``, which only works in the main
thread (elsewhere math-verify raises even with ``raise_on_error=False``), so off the main thread they are
disabled; a cheap guard rejects answers whose evaluation could hang (numeric power towers, huge exponents
or factorials). :func:`is_correct` never raises.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from tandem_grpo.data import last_boxed

__all__ = ["accuracy_reward", "completion_text", "extract_answer", "format_reward", "is_correct"]

logger = logging.getLogger(__name__)

PARSE_TIMEOUT_S = 5
"""math-verify parsing timeout (seconds, main thread only)."""
VERIFY_TIMEOUT_S = 5
"""math-verify comparison timeout (seconds, main thread only)."""

# Module-level (hashable, frozen) configs so that math-verify's cached regex compilation is reused.
_EXTRACTION_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

# A number: optional sign (not after a word character or closing bracket, so "5-3" gives "3"), digits with
# optional thousands commas, optional decimals, optional "/denominator".
_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")
# Plain scientific notation, which math-verify would read as 4.5 * e * 33 (e = Euler's number).
_SCIENTIFIC_RE = re.compile(r"(-?\d+(?:\.\d+)?)[eE]([-+]?\d+)")
# Answers whose evaluation can take unbounded time (best effort): numeric power towers, huge exponents or factorials.
_UNSAFE_RE = re.compile(
    r"(?:\^|\*\*)[\s{(]*[-+]?\d+(?:\.\d+)?[\s}]*(?:\^|\*\*|!)"  # 10^{10^{10}}, 9^9^9, 9**(9**9), 10^{10}^{10}, 2^{10!}
    r"|(?:\*\*|\^)[\s{(]*\d{6,}"  # 10^{1000000}
    r"|\d{5,}\s*!"  # 100000!
)
_MAX_ANSWER_CHARS = 1000


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; for a conversational completion (a list of messages),
    the content of its last message, with list-of-parts contents (``[{"type": "text", "text": ...}]``)
    joined. Anything else gives ``""``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion:
        message = completion[-1]
        content = message.get("content") if isinstance(message, dict) else message
        if isinstance(content, str):
            return content
        if isinstance(content, (list, tuple)):
            return "".join(
                part.get("text", "") if isinstance(part, dict) else part if isinstance(part, str) else ""
                for part in content
            )
    return ""


def extract_answer(text: str) -> str | None:
    """The final answer written in ``text``.

    Returns the (stripped) content of the last complete ``\\boxed{...}``/``\\fbox{...}`` if there is one
    and it is not empty; otherwise the last number in the text (``1,234`` is returned as ``"1234"``;
    ``-3``, ``2.5`` and ``3/4`` as written); otherwise None.
    """
    if not isinstance(text, str):
        return None
    boxed = last_boxed(text)
    if boxed:
        return boxed
    numbers = _NUMBER_RE.findall(text)
    if not numbers:
        return None
    return re.sub(r"\s+", "", numbers[-1]).replace(",", "")


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _normalize(answer: str) -> str:
    answer = answer.strip()
    match = _SCIENTIFIC_RE.fullmatch(answer)
    if match:
        return f"{match.group(1)} \\times 10^{{{int(match.group(2))}}}"
    return answer


def _parse(text: str, parsing_timeout: int | None) -> list:
    return parse(
        f"\\boxed{{{text}}}",
        extraction_config=_EXTRACTION_CONFIG,
        parsing_timeout=parsing_timeout,
        raise_on_error=False,
    )


def is_correct(completion: str, gold: str) -> bool:
    """Whether the final answer of ``completion`` equals ``gold``, mathematically.

    The answer is taken with :func:`extract_answer` (last ``\\boxed{}``, else last number) and compared
    with ``gold`` (an integer or float string, or LaTeX such as ``\\frac{\\pi}{2}``) by math-verify's
    ``parse``/``verify``, so ``\\frac{1}{2}`` equals ``0.5`` and ``1,234`` equals ``1234``.

    Never raises: a missing answer, a parse error or a timeout gives False. In the main thread
    math-verify's signal-based timeouts (``PARSE_TIMEOUT_S``, ``VERIFY_TIMEOUT_S``) apply; in other
    threads they are disabled, since ``signal.alarm`` only works in the main thread. In every thread a
    cheap best-effort pre-check counts answers whose evaluation could take unbounded time (numeric power
    towers such as ``10^{10^{10}}``, exponents of 6+ digits, factorials of 5+ digits) as wrong, unless
    they are written exactly like the gold; such answers would otherwise stall the main thread for the
    whole timeout, or hang a worker thread (sympy holds the GIL) for good.
    """
    try:
        if not isinstance(completion, str):
            completion = completion_text(completion)
        if gold is None:
            return False
        answer = extract_answer(completion)
        gold_text = str(gold).strip()
        if not answer or not gold_text or len(answer) > _MAX_ANSWER_CHARS:
            return False
        answer, gold_text = _normalize(answer), _normalize(gold_text)
        if " ".join(answer.split()) == " ".join(gold_text.split()):
            return True
        if _UNSAFE_RE.search(answer) or _UNSAFE_RE.search(gold_text):
            return False
        main = _in_main_thread()
        parse_timeout = PARSE_TIMEOUT_S if main else None
        gold_parsed = _parse(gold_text, parse_timeout)
        answer_parsed = _parse(answer, parse_timeout)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(
            verify(
                gold_parsed,
                answer_parsed,
                timeout_seconds=VERIFY_TIMEOUT_S if main else None,
                raise_on_error=False,
            )
        )
    except (Exception, TimeoutException):  # TimeoutException derives from BaseException
        logger.debug("is_correct failed for gold %r", gold, exc_info=True)
        return False


def _golds(answer: Any, n: int) -> Sequence[Any]:
    if isinstance(answer, (str, int, float)) or answer is None:
        return [answer] * n
    answer = list(answer)
    if len(answer) != n:
        raise ValueError(f"accuracy_reward got {n} completions but {len(answer)} gold answers.")
    return answer


def accuracy_reward(completions: Sequence[Any], answer: Sequence[str] | str, **kwargs: Any) -> list[float]:
    """1.0 for each completion whose final answer equals its gold answer, else 0.0.

    Follows TRL's reward-function signature ``f(completions, **kwargs) -> list[float]``: ``answer`` is the
    dataset's gold-answer column, which TRL passes as a keyword (one gold per completion); other keywords
    (``prompts``, ``completion_ids``, ...) are ignored. Completions may be strings or conversational
    message lists. Correctness is :func:`is_correct`.

    Raises:
        ValueError: if ``answer`` is a list whose length differs from ``completions``.
    """
    golds = _golds(answer, len(completions))
    return [1.0 if is_correct(completion_text(c), g) else 0.0 for c, g in zip(completions, golds, strict=True)]


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 for each completion that gives its final answer in a non-empty ``\\boxed{...}``, else 0.0.

    Follows TRL's reward-function signature ``f(completions, **kwargs) -> list[float]``; completions may be
    strings or conversational message lists, and dataset columns passed as keywords are ignored.
    """
    return [1.0 if last_boxed(completion_text(c)) else 0.0 for c in completions]
