"""Verifiable math rewards in TRL's reward-function format.

TRL's ``GRPOTrainer`` calls each reward function as ``f(prompts=..., completions=..., completion_ids=...,
**columns)`` (``columns``: the dataset's other columns, here ``answer``, see :mod:`tandem_grpo.data`, plus
``trainer_state``, ``log_extra``, ``log_metric``) and expects one float per completion. Completions may be strings
or conversational message lists.

Answers are compared with math-verify in a long-lived worker process, one at a time, each under a time limit
(:data:`VERIFY_TIMEOUT_S`); past it an answer scores 0, is counted (:func:`pop_verify_timeouts`) and a stuck worker
is restarted. This works in any thread (math-verify's own ``signal.alarm`` timeouts need the main thread).
"""

from __future__ import annotations

import atexit
import inspect
import logging
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from tandem_grpo.data import last_boxed, stated_answer

__all__ = [
    "VERIFY_TIMEOUT_S",
    "accuracy_reward",
    "completion_text",
    "extract_answer",
    "format_reward",
    "is_correct",
    "stated_accuracy_reward",
    "pop_verify_counts",
    "pop_verify_timeouts",
]

logger = logging.getLogger(__name__)

VERIFY_TIMEOUT_S: float = 5.0
"""Default time limit (seconds) for math-verify to parse and compare one completion's answer with its gold.
Overridden by the environment variable ``TANDEM_GRPO_VERIFY_TIMEOUT`` (seconds) and, above both, by the
``verify_timeout`` argument of :func:`accuracy_reward` and :func:`is_correct`."""

TIMEOUT_ENV_VAR = "TANDEM_GRPO_VERIFY_TIMEOUT"

# The worker stops a check itself after the time limit (SIGALRM in its main thread); the parent kills it only if
# it has not answered this much later (stuck in C code that never returns to the interpreter).
_KILL_GRACE_S = 1.0
# Starting the worker means starting Python and importing sympy: seconds on a busy machine, never minutes.
_START_TIMEOUT_S = 120.0

_MAX_ANSWER_CHARS = 1000

# A number: optional sign (not after a word character or closing bracket, so "5-3" gives "3"), digits with
# optional thousands commas, optional decimals, optional "/denominator".
_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")
# Plain scientific notation, which math-verify would read as 4.5 * e * 33 (e = Euler's number).
_SCIENTIFIC_RE = re.compile(r"(-?\d+(?:\.\d+)?)[eE]([-+]?\d+)")

# Unit words after a number ("18 dollars", "18\ \text{square feet}."): math-verify drops the units it knows
# (apples, hours) and reads the others as products of variables (18*d*o*l*l*a*r*s), so they are cut off first.
# A word has 2+ letters (a single letter may be a variable: "18 x") and a bare word needs a space before it
# ("2pi" stays).
_TEXT_COMMAND = r"\\(?:text|textrm|textnormal|textit|textbf|mathrm|mbox)\s*"
_UNIT_TAIL_RE = re.compile(
    rf"(?:(?:\s|~|\\[ ,;:!])*{_TEXT_COMMAND}\{{[\sA-Za-z.]*\}}|(?:\s|~|\\[ ,;:!])+[A-Za-z]{{2,}}\.?)+\s*\.?\s*$"
)
_WRAPPED_RE = re.compile(rf"{_TEXT_COMMAND}\{{([^{{}}]*)\}}")
# Words that change the value or hedge it ("18 or more", "2 million", "18 percent", which math-verify reads as
# 0.18): with one of these the answer is left to math-verify as written.
_VALUE_WORDS = frozenset(
    {"or", "and", "not", "pi", "percent", "hundred", "thousand", "million", "billion", "trillion", "dozen"}
)


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


def _strip_units(answer: str) -> str:
    """``answer`` without trailing unit words when what precedes them is a number (letters only in LaTeX
    commands: ``18``, ``\\$1,234.50``, ``\\frac{3}{4}``, ``2\\pi``); otherwise ``answer`` unchanged."""
    wrapped = _WRAPPED_RE.fullmatch(answer)
    text = wrapped.group(1).strip() if wrapped else answer  # \text{18 dollars}
    tail = _UNIT_TAIL_RE.search(text)
    if not tail or tail.start() == 0:
        return answer
    head = text[: tail.start()].strip()
    words = {word.lower() for word in re.findall(r"[A-Za-z]+", _WRAPPED_RE.sub(r" \1 ", tail.group(0)))}
    bare_head = re.sub(r"\\[A-Za-z]+", "", head)
    if words & _VALUE_WORDS or not re.search(r"\d", bare_head) or re.search(r"[A-Za-z]", bare_head):
        return answer
    return head


def _normalize(answer: str) -> str:
    answer = _strip_units(answer.strip())
    match = _SCIENTIFIC_RE.fullmatch(answer)
    if match:
        return f"{match.group(1)} \\times 10^{{{int(match.group(2))}}}"
    return answer


# --------------------------------------------------------------------------------------------------
# The verification worker
# --------------------------------------------------------------------------------------------------


def _worker_main() -> None:
    """Body of the verification worker process. It runs as ``python -c`` with this function's source, so it
    must be self-contained and import only the standard library and math-verify: importing this package would
    load torch, and multiprocessing's spawn/forkserver would re-run the user's training script as ``__mp_main__``.

    Protocol, over the two pipe file descriptors given as arguments: it sends ``"ready"``, then for each request
    ``(answer, gold, timeout_s, cpu_limit_s)`` sends True/False, or None when the check ran past ``timeout_s``.
    It exits when the request pipe closes (the parent exited or closed it).
    """
    import logging
    import signal
    import sys
    from multiprocessing.connection import Connection

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    class CheckTimeout(BaseException):  # not Exception: sympy and math-verify catch those
        pass

    armed = False

    def on_alarm(signum, frame):
        if armed:  # an alarm that lands after the check finished must not abort the next send
            raise CheckTimeout

    # One alarm bounds the whole check, so math-verify's per-call timeouts are off; silence its warning about it.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    # Ctrl-C reaches the whole process group; the parent decides what happens and its exit closes our pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, on_alarm)
    requests = Connection(int(sys.argv[1]), writable=False)
    results = Connection(int(sys.argv[2]), readable=False)
    config = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

    def check(answer: str, gold: str) -> bool:
        gold_parsed = parse(f"\\boxed{{{gold}}}", extraction_config=config, parsing_timeout=None)
        answer_parsed = parse(f"\\boxed{{{answer}}}", extraction_config=config, parsing_timeout=None)
        return bool(gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=None))

    results.send("ready")
    while True:
        try:
            answer, gold, timeout_s, cpu_limit_s = requests.recv()
        except EOFError:
            return
        # SIGPROF is left at its default action, termination, which the kernel applies even inside C code that
        # never returns to the interpreter: if the parent died mid-check (SIGKILL, no atexit), this still ends.
        signal.setitimer(signal.ITIMER_PROF, cpu_limit_s)
        try:
            try:
                armed = True
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
                verdict = check(answer, gold)
            finally:
                armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CheckTimeout:
            verdict = None
        except Exception:
            verdict = False
        signal.setitimer(signal.ITIMER_PROF, 0)
        try:
            results.send(verdict)
        except OSError:  # the parent is gone (or gave up on us): nobody is listening
            return


class _VerifyWorker:
    """The parent's handle on one worker process, shared by all threads of this process (checks are serialised).

    Started on first use; after a check that does not answer within its time limit plus ``_KILL_GRACE_S`` the
    worker is killed, and the next check starts a new one. Killed at interpreter exit; a worker whose parent dies
    without running ``atexit`` sees its request pipe close and exits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._requests: Connection | None = None
        self._results: Connection | None = None
        self._code: str | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def check(self, answer: str, gold: str, timeout_s: float) -> bool | None:
        """True/False, or None when the check did not finish within ``timeout_s`` (plus the kill grace)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._start()
            try:
                self._requests.send((answer, gold, timeout_s, timeout_s + _KILL_GRACE_S))
                if self._results.poll(timeout_s + _KILL_GRACE_S):
                    return self._results.recv()
            except (EOFError, OSError):
                pass  # it died mid-check: its CPU limit, or the kernel's out-of-memory killer
            self._stop()
            return None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> None:
        if self._code is None:
            try:
                self._code = f"{textwrap.dedent(inspect.getsource(_worker_main))}\n_worker_main()\n"
            except OSError as err:  # installed without its .py sources
                raise RuntimeError(f"Cannot read the math-verify worker's source code: {err}") from err
        request_read, request_write = os.pipe()
        result_read, result_write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", self._code, str(request_read), str(result_write)],
                pass_fds=(request_read, result_write),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError as err:
            for fd in (request_read, request_write, result_read, result_write):
                os.close(fd)
            raise RuntimeError(f"Could not start the math-verify worker with {sys.executable!r}: {err}") from err
        # Only the worker may hold these ends, or it would never see its request pipe close.
        os.close(request_read)
        os.close(result_write)
        self._requests = Connection(request_write, readable=False)
        self._results = Connection(result_read, writable=False)
        try:
            ready = self._results.poll(_START_TIMEOUT_S) and self._results.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._stop()
            raise RuntimeError(
                f"The math-verify worker process did not start within {_START_TIMEOUT_S:g} s (see its error "
                "above); check that `python -c 'import math_verify'` works with this interpreter."
            )

    def _stop(self) -> None:
        for connection in (self._requests, self._results):
            if connection is not None:
                connection.close()
        self._requests = self._results = None
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()

    def _forget_after_fork(self) -> None:
        # A forked child must not talk to (or kill) its parent's worker; it starts its own when it needs one.
        self._lock = threading.Lock()
        for connection in (self._requests, self._results):
            if connection is not None:
                connection.close()
        self._requests = self._results = None
        self._proc = None


_WORKER = _VerifyWorker()
atexit.register(_WORKER.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER._forget_after_fork)

_counts = {"checked": 0, "timed_out": 0}
_counts_lock = threading.Lock()


def pop_verify_counts() -> tuple[int, int]:
    """``(checked, timed_out)``: answers :func:`is_correct` was asked about, and those whose verification ran past
    its time limit (and so scored 0), in this process since the previous call of this or
    :func:`pop_verify_timeouts`; resets both. A trainer logs ``rewards/verify_timeouts`` only where ``checked`` > 0:
    without a math-verify reward the count means nothing."""
    with _counts_lock:
        counts = (_counts["checked"], _counts["timed_out"])
        _counts.update(checked=0, timed_out=0)
    return counts


def pop_verify_timeouts() -> int:
    """The ``timed_out`` of :func:`pop_verify_counts` (which it resets, with ``checked``)."""
    return pop_verify_counts()[1]


def _count(name: str) -> None:
    with _counts_lock:
        _counts[name] += 1


def _resolve_timeout(verify_timeout: float | None) -> float:
    source = "verify_timeout"
    if verify_timeout is None and (env := os.environ.get(TIMEOUT_ENV_VAR)):
        source = f"${TIMEOUT_ENV_VAR}"
        try:
            verify_timeout = float(env)
        except ValueError:
            raise ValueError(f"{source} must be a number of seconds, got {env!r}.") from None
    elif verify_timeout is None:
        source, verify_timeout = "tandem_grpo.rewards.VERIFY_TIMEOUT_S", VERIFY_TIMEOUT_S
    if isinstance(verify_timeout, bool) or not isinstance(verify_timeout, (int, float)):
        raise ValueError(f"{source} must be a number of seconds, got {verify_timeout!r}.")
    if not (verify_timeout > 0 and math.isfinite(verify_timeout)):
        raise ValueError(f"{source} must be a positive, finite number of seconds, got {verify_timeout!r}.")
    return float(verify_timeout)


def is_correct(
    completion: Any, gold: Any, *, truncated: bool = False, verify_timeout: float | None = None, stated: bool = False
) -> bool:
    """Whether the final answer of ``completion`` equals ``gold``, mathematically.

    The answer (:func:`extract_answer`: last ``\\boxed{}``, else last number) is compared with ``gold`` (a number
    string or LaTeX) by math-verify's ``parse``/``verify``, so ``\\frac{1}{2}`` equals ``0.5``. Trailing unit words
    are ignored (``18 dollars`` equals ``18``) unless they change or hedge the value (``18 percent``, ``2 million``).

    Args:
        completion: the completion text, or a conversational completion (see :func:`completion_text`).
        gold: the gold answer; None or empty gives False.
        truncated: the completion was cut off at the length limit: only a ``\\boxed{}`` counts as its answer (with
            ``stated``, an ``Answer:`` line that the cut did not reach, too).
        verify_timeout: time limit in seconds for math-verify on this answer; default ``$TANDEM_GRPO_VERIFY_TIMEOUT``
            if set, else :data:`VERIFY_TIMEOUT_S` (5). Past it the answer is wrong and counted; the call returns
            within about this plus 1 s (plus worker start-up and other threads' checks, which run one at a time).
        stated: read only the answer the completion states
            ([`stated_answer`][tandem_grpo.data.stated_answer]: its ``\\boxed{}`` or ``Answer:`` line), never
            the last number of the text.

    Returns:
        True or False; a missing answer, a parse error or a timeout gives False.

    Raises:
        ValueError: ``verify_timeout`` (or the environment variable) is not a positive number of seconds.
        RuntimeError: the math-verify worker process cannot be started.
    """
    timeout_s = _resolve_timeout(verify_timeout)
    _count("checked")
    try:
        text = completion if isinstance(completion, str) else completion_text(completion)
        if gold is None:
            return False
        if stated:  # a cut-off completion: only lines the cut did not reach
            answer = stated_answer(text[: text.rfind("\n") + 1] if truncated else text)
        else:
            answer = last_boxed(text) if truncated else extract_answer(text)
        gold_text = str(gold).strip()
        if not answer or not gold_text or max(len(answer), len(gold_text)) > _MAX_ANSWER_CHARS:
            return False
        answer, gold_text = _normalize(answer), _normalize(gold_text)
    except Exception:
        logger.debug("is_correct could not read the answer for gold %r", gold, exc_info=True)
        return False
    if " ".join(answer.split()) == " ".join(gold_text.split()):
        return True
    verdict = _WORKER.check(answer, gold_text, timeout_s)
    if verdict is None:
        _count("timed_out")
        logger.warning(
            "math-verify did not finish within %g s on answer %.200r (gold %.200r): scored 0.", timeout_s, answer, gold
        )
        return False
    return verdict


def _golds(answer: Any, n: int) -> Sequence[Any]:
    if isinstance(answer, (str, int, float)) or answer is None:
        return [answer] * n
    answer = list(answer)
    if len(answer) != n:
        raise ValueError(f"accuracy_reward got {n} completions but {len(answer)} gold answers.")
    return answer


def _truncated(
    completion_ids: Sequence[Sequence[int]] | None, max_completion_length: int | None, n: int, kwargs: dict
) -> list[bool]:
    if max_completion_length is None:
        # TRL passes its trainer's bound method as `log_metric`.
        trainer = getattr(kwargs.get("log_metric"), "__self__", None)
        max_completion_length = getattr(trainer, "max_completion_length", None)
    if completion_ids is None or not isinstance(max_completion_length, int) or max_completion_length <= 0:
        return [False] * n
    if len(completion_ids) != n:
        raise ValueError(f"accuracy_reward got {n} completions but {len(completion_ids)} completion_ids.")
    return [len(ids) >= max_completion_length for ids in completion_ids]


def accuracy_reward(
    completions: Sequence[Any],
    answer: Sequence[str] | str,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    max_completion_length: int | None = None,
    verify_timeout: float | None = None,
    **kwargs: Any,
) -> list[float]:
    """1.0 for each completion whose final answer equals its gold answer, else 0.0.

    TRL's reward-function signature; ``answer`` is the gold column (one per completion), other keywords are
    ignored. Correctness is :func:`is_correct`. A completion with ``max_completion_length`` tokens or more in
    ``completion_ids`` (so also one whose EOS is its last allowed token) was truncated: it scores 1 only through a
    complete ``\\boxed{}``. ``max_completion_length`` defaults to the calling ``GRPOTrainer``'s (through the
    ``log_metric`` TRL passes); with it or ``completion_ids`` unknown, nothing counts as truncated. Each check is
    bounded by ``verify_timeout`` as in :func:`is_correct`; set it (or ``max_completion_length``) for a trainer
    with ``functools.partial(accuracy_reward, verify_timeout=10)``, still logged as ``accuracy_reward``.

    Raises:
        ValueError: ``answer`` or ``completion_ids`` is a list whose length differs from ``completions``, or the
            time limit is not a positive number of seconds.
        RuntimeError: the math-verify worker process cannot be started.
    """
    return _scores(completions, answer, completion_ids, max_completion_length, verify_timeout, kwargs, stated=False)


def stated_accuracy_reward(
    completions: Sequence[Any],
    answer: Sequence[str] | str,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    max_completion_length: int | None = None,
    verify_timeout: float | None = None,
    **kwargs: Any,
) -> list[float]:
    """:func:`accuracy_reward` reading only the answer a completion states (``\\boxed{}`` or an ``Answer:``
    line, :func:`is_correct` with ``stated=True``): a completion that never states one scores 0, however its last
    number reads. The authors' reward reads only ``\\boxed{}``; pair it with
    [`ANSWER_LINE_INSTRUCTION`][tandem_grpo.data.ANSWER_LINE_INSTRUCTION] for a model that rarely boxes.

    Raises:
        ValueError, RuntimeError: as :func:`accuracy_reward`.
    """
    return _scores(completions, answer, completion_ids, max_completion_length, verify_timeout, kwargs, stated=True)


def _scores(completions, answer, completion_ids, max_completion_length, verify_timeout, kwargs, *, stated: bool):
    golds = _golds(answer, len(completions))
    truncated = _truncated(completion_ids, max_completion_length, len(completions), kwargs)
    timeout_s = _resolve_timeout(verify_timeout)
    return [
        1.0 if is_correct(completion_text(c), g, truncated=t, verify_timeout=timeout_s, stated=stated) else 0.0
        for c, g, t in zip(completions, golds, truncated, strict=True)
    ]


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 for each completion that gives its final answer in a non-empty ``\\boxed{...}``, else 0.0.

    TRL's reward-function signature; other keywords are ignored.
    """
    return [1.0 if last_boxed(completion_text(c)) else 0.0 for c in completions]
