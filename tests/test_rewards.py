"""Tests for tandem_grpo.rewards: answer extraction, math-verify comparison and TRL reward functions."""

from __future__ import annotations

import inspect
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tandem_grpo import rewards
from tandem_grpo.rewards import accuracy_reward, extract_answer, format_reward, is_correct, pop_verify_timeouts

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _conv(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture(autouse=True)
def _fresh_timeout_count(monkeypatch):
    monkeypatch.delenv(rewards.TIMEOUT_ENV_VAR, raising=False)
    pop_verify_timeouts()


def _exited(pid: int) -> bool:
    """Whether process ``pid`` is gone (or a zombie: exited, waiting to be reaped by whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


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


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (r"\boxed{18 dollars}", "18"),
        (r"\boxed{18 cookies}", "18"),
        (r"\boxed{18 apples}", "18"),  # a unit math-verify knows itself
        (r"\boxed{18 \text{dollars}}", "18"),
        (r"\boxed{\text{18 dollars}}", "18"),
        (r"\boxed{18\ \text{square feet}.}", "18"),
        (r"\boxed{18~Dollars}", "18"),
        (r"\boxed{\$18 dollars}", "18"),
        (r"\boxed{1,234 dollars}", "1234"),
        (r"\boxed{18 times}", "18"),
        (r"\boxed{\frac{3}{4} cups}", "0.75"),
        (r"\boxed{18 percent}", "0.18"),  # left to math-verify, which reads it as 0.18
    ],
)
def test_trailing_unit_words_do_not_change_the_score(completion, gold):
    assert is_correct(completion, gold) is True


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (r"\boxed{19 dollars}", "18"),
        (r"\boxed{18 cookies}", "19"),
        (r"\boxed{18 \text{ or } 19}", "18"),
        (r"\boxed{18 or 19}", "18"),
        (r"\boxed{18 or more}", "18"),
        (r"\boxed{18 dollars and 50 cents}", "18"),
        (r"\boxed{2 million}", "2"),
        (r"\boxed{18 dozen}", "18"),
        (r"\boxed{2 pi}", "2"),
        (r"\boxed{2pi}", "2"),
        (r"\boxed{18 x}", "18"),  # a single letter may be a variable
        (r"\boxed{x dollars}", "18"),
        (r"\boxed{2x dollars}", "2"),
    ],
)
def test_unit_words_do_not_make_wrong_answers_right(completion, gold):
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


# --------------------------------------------------------------------------------------------------
# Time limits: every check is bounded, in any thread, and counted
# --------------------------------------------------------------------------------------------------

# Slack for a loaded machine on top of the limit and the parent's kill grace.
_SLACK_S = 5.0


def _call_in_daemon_thread(function, *args, timeout: float, **kwargs):
    """``function(*args, **kwargs)`` run in a daemon thread, which (unlike a ThreadPoolExecutor's) is not joined at
    interpreter exit: if the call hangs, this raises after ``timeout`` seconds and pytest can still exit."""
    outcome = queue.Queue()
    threading.Thread(target=lambda: outcome.put(function(*args, **kwargs)), daemon=True).start()
    return outcome.get(timeout=timeout)


def test_hanging_answer_is_bounded_in_a_worker_thread():
    # The case: math-verify's signal timeouts are off outside the main thread, so this never returned.
    start = time.monotonic()
    completions, golds = [r"\boxed{(9999!)^{9999}}", r"\boxed{\frac{1}{2}}"], ["5", "0.5"]
    scores = _call_in_daemon_thread(accuracy_reward, completions, answer=golds, verify_timeout=1, timeout=60)
    assert scores == [0.0, 1.0]
    assert time.monotonic() - start < 1 + rewards._KILL_GRACE_S + _SLACK_S
    assert pop_verify_timeouts() == 1
    assert pop_verify_timeouts() == 0  # popping resets the count


@pytest.mark.parametrize(
    "answer", [r"10^{10^{10^{10}}}", r"9^{9^{9}}", r"10^{12345678}", r"(9999!)^{9999}", r"3^{3^{3^{3}}}"]
)
def test_hanging_answers_are_bounded_in_the_main_thread(answer):
    start = time.monotonic()
    assert is_correct(rf"\boxed{{{answer}}}", "5", verify_timeout=1) is False
    assert time.monotonic() - start < 1 + rewards._KILL_GRACE_S + _SLACK_S
    assert pop_verify_timeouts() == 1


def test_big_but_quick_answers_are_checked_not_timed_out():
    assert is_correct(r"\boxed{2^{2^{10}}}", "5", verify_timeout=5) is False
    assert is_correct(r"\boxed{(2^{3})^{2}}", "64", verify_timeout=5) is True
    assert is_correct(r"\boxed{10^{10^{10}}}", r"10^{10^{10}}", verify_timeout=1) is True  # written like the gold
    assert pop_verify_timeouts() == 0


def test_timeout_comes_from_the_environment_variable(monkeypatch):
    monkeypatch.setenv(rewards.TIMEOUT_ENV_VAR, "1")
    start = time.monotonic()
    assert accuracy_reward([r"\boxed{(9999!)^{9999}}"], answer=["5"]) == [0.0]
    elapsed = time.monotonic() - start
    assert elapsed < rewards.VERIFY_TIMEOUT_S  # the 5 s default would take at least 5 s
    assert pop_verify_timeouts() == 1


def test_timeout_default_is_the_module_setting(monkeypatch):
    monkeypatch.setattr(rewards, "VERIFY_TIMEOUT_S", 1.0)
    start = time.monotonic()
    assert is_correct(r"\boxed{(9999!)^{9999}}", "5") is False
    assert time.monotonic() - start < 1 + rewards._KILL_GRACE_S + _SLACK_S
    assert pop_verify_timeouts() == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "5", True])
def test_bad_timeout_raises(bad):
    with pytest.raises(ValueError, match="verify_timeout"):
        accuracy_reward([r"\boxed{1}"], answer=["1"], verify_timeout=bad)


@pytest.mark.parametrize("bad", ["soon", "0", "-2"])
def test_bad_timeout_environment_variable_raises(monkeypatch, bad):
    monkeypatch.setenv(rewards.TIMEOUT_ENV_VAR, bad)
    with pytest.raises(ValueError, match=rewards.TIMEOUT_ENV_VAR):
        is_correct(r"\boxed{1}", "2")


def test_unresponsive_worker_is_killed_and_replaced():
    # A stopped worker stands for one stuck in C code that never returns to the interpreter (and so ignores its
    # own alarm): the caller must still get an answer in time, and the next check a fresh worker.
    assert is_correct(r"\boxed{1}", "2") is False  # starts the worker
    pid = rewards._WORKER.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert is_correct(r"\boxed{\frac{1}{2}}", "0.5", verify_timeout=1) is False
        assert time.monotonic() - start < 1 + rewards._KILL_GRACE_S + _SLACK_S
    finally:
        if not _exited(pid):
            os.kill(pid, signal.SIGKILL)
    assert _exited(pid)
    assert pop_verify_timeouts() == 1
    assert is_correct(r"\boxed{\frac{1}{2}}", "0.5") is True
    assert rewards._WORKER.pid not in (None, pid)


def test_worker_that_died_while_idle_is_restarted_without_a_timeout():
    assert is_correct(r"\boxed{1}", "2") is False
    proc = rewards._WORKER._proc
    proc.kill()
    proc.wait(timeout=30)
    assert is_correct(r"\boxed{\frac{1}{2}}", "0.5") is True
    assert pop_verify_timeouts() == 0


def test_concurrent_callers_share_the_worker():
    cases = [(rf"\boxed{{\frac{{{i}}}{{2}}}}", str(i / 2), True) for i in range(12)]
    cases += [(rf"\boxed{{{i}}}", str(i + 1), False) for i in range(12)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda case: is_correct(case[0], case[1]), cases))
    assert results == [expected for _, _, expected in cases]


def test_worker_exits_when_its_parent_goes_away():
    # A parent that dies without running atexit (SIGKILL) closes the worker's request pipe: the worker must exit.
    assert is_correct(r"\boxed{1}", "2") is False
    proc = rewards._WORKER._proc
    rewards._WORKER._requests.close()
    assert proc.wait(timeout=30) == 0  # a clean exit, not a kill
    assert is_correct(r"\boxed{\frac{1}{2}}", "0.5") is True  # the next check starts a new worker
    assert pop_verify_timeouts() == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_starts_its_own_worker():
    assert is_correct(r"\boxed{1}", "2") is False
    parent_worker = rewards._WORKER.pid
    read_end, write_end = os.pipe()
    with rewards._WORKER._lock:  # as when another thread is mid-check at the fork: the child must not wait on it
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            try:
                os.close(read_end)
                verdict = is_correct(r"\boxed{\frac{1}{2}}", "0.5")
                os.write(write_end, f"{verdict} {rewards._WORKER.pid}".encode())
            finally:
                os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 60)
        assert ready, "the forked child did not answer within 60 s"
        verdict, child_worker = os.read(read_end, 100).decode().split()
    finally:
        os.close(read_end)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert verdict == "True"
    assert int(child_worker) != parent_worker
    assert rewards._WORKER.pid == parent_worker  # the child neither used nor killed the parent's worker
    assert is_correct(r"\boxed{\frac{1}{2}}", "0.5") is True


_SCRIPT = """
import sys
from concurrent.futures import ThreadPoolExecutor

# No `if __name__ == "__main__"` guard, as in many training scripts: the worker must not run this file again.
with open(sys.argv[1], "a") as marker:
    marker.write("ran\\n")

from tandem_grpo import rewards

with ThreadPoolExecutor(1) as pool:
    scores = pool.submit(
        rewards.accuracy_reward,
        [r"\\boxed{(9999!)^{9999}}", r"\\boxed{\\frac{1}{2}}"],
        answer=["5", "0.5"],
        verify_timeout=1,
    ).result(timeout=60)
print(scores, rewards.pop_verify_timeouts(), rewards._WORKER.pid, flush=True)
"""


def test_script_process_uses_one_worker_and_leaves_none_behind(tmp_path):
    # As under `accelerate launch`: a script run by path, calling the reward from a thread, then exiting (the
    # worker must not outlive it).
    script, marker = tmp_path / "train.py", tmp_path / "marker.txt"
    script.write_text(_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(marker)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 0, result.stderr
    scores, timeouts, pid = result.stdout.strip().rsplit(" ", 2)
    assert (scores, timeouts) == ("[0.0, 1.0]", "1")
    assert marker.read_text() == "ran\n"
    deadline = time.monotonic() + 30
    while not _exited(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _exited(int(pid))


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
    trl_kwargs = {"prompts": ["p"] * 4, "completion_ids": [[1]] * 4, "trainer_state": None, "log_extra": print}
    assert accuracy_reward(conversational, answer=golds, **trl_kwargs) == expected


def test_accuracy_reward_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        accuracy_reward([r"\boxed{1}", r"\boxed{2}"], answer=["1"])


_RAMBLE = "Let me count again: first 3, then 7, then 11, then 18"  # cut off mid-thought; gold is 18


def test_truncated_completion_gets_no_final_number_fallback():
    golds = ["18", "18", "18"]
    completions = [_RAMBLE, r"So \boxed{18}. Let me double-check: 3, 7, 11, 1", _RAMBLE]
    completion_ids = [[1] * 8, [1] * 8, [1] * 7]  # cut off, cut off, finished below the limit
    assert accuracy_reward(completions, answer=golds, completion_ids=completion_ids, max_completion_length=8) == [
        0.0,  # the last number of a cut-off ramble is not an answer
        1.0,  # a complete \boxed{} written before the cut still is
        1.0,  # a finished completion keeps the fallback
    ]
    assert is_correct(_RAMBLE, "18", truncated=True) is False
    assert is_correct(_RAMBLE, "18") is True


def test_truncation_limit_comes_from_the_calling_trainer():
    class Trainer:  # TRL's GRPOTrainer passes its bound `_log_metric` as `log_metric`
        max_completion_length = 8

        def _log_metric(self, name, value):
            pass

    kwargs = {"answer": ["18", "18"], "completion_ids": [[1] * 8, [1] * 7]}
    assert accuracy_reward([_RAMBLE, _RAMBLE], log_metric=Trainer()._log_metric, **kwargs) == [0.0, 1.0]
    assert accuracy_reward([_RAMBLE, _RAMBLE], **kwargs) == [1.0, 1.0]  # limit unknown: nothing is truncated


def test_trl_passes_what_the_truncation_rule_reads():
    from trl import GRPOTrainer

    assert 'reward_kwargs["log_metric"] = self._log_metric' in inspect.getsource(GRPOTrainer._calculate_rewards)
    assert "completion_ids=completion_ids_list" in inspect.getsource(GRPOTrainer._calculate_rewards)
    assert "self.max_completion_length = args.max_completion_length" in inspect.getsource(GRPOTrainer.__init__)


def test_completion_ids_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 completions but 1 completion_ids"):
        accuracy_reward([r"\boxed{1}", r"\boxed{2}"], answer=["1", "2"], completion_ids=[[1]], max_completion_length=4)


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


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 + 4 = 7\n\nAnswer: 7", "7"),
        ("**Answer:** 42.", "42"),
        ("The answer is: 7\nthen 9 more", "7"),  # a number written after the stated answer is not it
        ("Final answer: 12\nAnswer: 13", "13"),  # the last stated answer
        ("so 5 + 3 = 8", None),  # a last number is not a stated answer
        ("the answer is 12", None),  # no colon: not an answer line
        ("Answer:\n", None),
        ("\\boxed{5}\nAnswer: 6", "5"),  # the box, as the authors read it, wins
    ],
)
def test_stated_answer_reads_only_a_box_or_an_answer_line(text, expected):
    from tandem_grpo.data import stated_answer

    assert stated_answer(text) == expected


def test_stated_accuracy_reward_never_reads_the_last_number():
    """The default reader scores a last number; the stated reader only an answer the completion states, so a
    co-author writing past the answer does not change the reward."""
    from tandem_grpo.rewards import stated_accuracy_reward

    completions = ["5 + 3 = 8", "Answer: 8\n\nThen 2 + 2 = 4", "Answer: 9", "\\boxed{8}"]
    assert accuracy_reward(completions, "8") == [1.0, 0.0, 0.0, 1.0]
    assert stated_accuracy_reward(completions, "8") == [0.0, 1.0, 0.0, 1.0]


def test_a_truncated_completion_states_only_lines_the_cut_did_not_reach():
    from tandem_grpo.rewards import stated_accuracy_reward

    completions = ["Answer: 8\nmore", "2 + 6 = 8\nAnswer: 8"]  # the second was cut inside its answer line
    cap = dict(completion_ids=[[1] * 4, [1] * 4], max_completion_length=4)
    assert stated_accuracy_reward(completions, "8", **cap) == [1.0, 0.0]
    assert stated_accuracy_reward(completions, "8") == [1.0, 1.0]
