"""Interrupts lose nothing: Ctrl-C (SIGINT) during a step and SIGTERM during a checkpoint write leave the last
complete checkpoint loadable, and ``train(resume_from_checkpoint=True)`` continues from it.

Each case runs a child process that trains a tiny random Llama with ``save_steps=1``, waits until the child says it
is inside the step (or the save) to interrupt, sends the signal, then resumes in a fresh child. A run takes about
20 s, mostly imports.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import child_env
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, TrainerState
from transformers.trainer_utils import get_last_checkpoint

from tandem_grpo import TandemGRPOTrainer
from tandem_grpo.checkpointing import (
    JIT_INCOMPLETE_MARKER,
    ResumeFromCompleteCheckpoint,
    is_complete_checkpoint,
    last_complete_checkpoint,
)

MAX_STEPS = 4
START_TIMEOUT_S = 240  # imports, model loading and the steps before the interrupt, on a loaded 2-core machine
EXIT_TIMEOUT_S = 60

CHILD = r"""
import json, signal, sys, time
from pathlib import Path

# Ctrl-C as in a terminal: a Python started with SIGINT ignored (`cmd &` in a script, nohup) keeps ignoring it.
signal.signal(signal.SIGINT, signal.default_int_handler)

from conftest import build_tiny_tokenizer
from datasets import Dataset
from safetensors.torch import save_file
from transformers import TrainerCallback

from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
from tandem_grpo.checkpointing import ResumeFromCompleteCheckpoint

mode, model_dir, out_dir, record, hold, settings = sys.argv[1:]
record, hold, settings = Path(record), int(hold), json.loads(settings)
Base = TandemGRPOTrainer
if not issubclass(Base, ResumeFromCompleteCheckpoint):  # until the trainer lists the mixin itself
    Base = type("Base", (ResumeFromCompleteCheckpoint, TandemGRPOTrainer), {})


def hold_here(what):
    (record / "held").write_text(what)  # the test interrupts once it sees this
    time.sleep(settings.get("hold_s", 600))


class Trainer(Base):
    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if mode == "save" and _internal_call and self.state.global_step == hold:
            hold_here(f"checkpoint-{hold}: weights written, optimizer and trainer state not yet")


def reward(completions, trainer_state, **kwargs):
    if mode == "step" and trainer_state.global_step == hold:
        hold_here(f"step {hold + 1}: scoring the rollouts")
    return [float(len(c)) for c in completions]


class Record(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(record / "begin.safetensors"))
        self.begin, self.steps = state.global_step, []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        summary = {"begin": self.begin, "steps": self.steps, "end": state.global_step}
        (record / "summary.json").write_text(json.dumps(summary))


args = TandemGRPOConfig(
    output_dir=out_dir, per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
    save_strategy="steps", save_steps=1, logging_steps=1, report_to=[], learning_rate=1e-2, seed=3,
    disable_tqdm=True, **settings.get("config", {}),
)
trainer = Trainer(
    model=model_dir, reward_funcs=reward, args=args, processing_class=build_tiny_tokenizer(), callbacks=[Record()],
    train_dataset=Dataset.from_dict({"prompt": ["ab c", "d e", "f.\ng", "h"] * 4}),
)
trainer.train(resume_from_checkpoint=True if mode == "resume" else None)
"""


def _start(tmp_path: Path, name: str, mode: str, model_dir: str, hold: int = 0, **settings):
    """Start the child in ``mode``; return it with its record folder and log file."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    record = tmp_path / name
    record.mkdir()
    settings.setdefault("config", {}).setdefault("max_steps", MAX_STEPS)
    argv = [sys.executable, str(script), mode, model_dir, str(tmp_path / "out"), str(record), str(hold)]
    log = record / "log.txt"
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            [*argv, json.dumps(settings)], stdout=handle, stderr=subprocess.STDOUT, env=child_env()
        )
    return proc, record, log


def _tail(log: Path) -> str:
    return log.read_text()[-4000:]


def _wait(proc, log: Path, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the child did not exit within {timeout_s:.0f} s:\n{_tail(log)}")


def _interrupt(tmp_path, model_dir, mode: str, sig: signal.Signals, hold: int, **settings) -> tuple[int, Path]:
    """Run the child until it holds inside step ``hold + 1`` (mode "step") or inside the save of checkpoint-``hold``
    (mode "save"), send ``sig``; return its exit code and log."""
    proc, record, log = _start(tmp_path, f"{mode}-{sig.name}", mode, model_dir, hold, **settings)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (record / "held").exists():
            if proc.poll() is not None:
                pytest.fail(f"the child exited ({proc.returncode}) before it reached the interrupt:\n{_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"the child did not reach the interrupt within {START_TIMEOUT_S} s:\n{_tail(log)}")
            time.sleep(0.2)
        proc.send_signal(sig)
        return _wait(proc, log, EXIT_TIMEOUT_S), log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _loadable(checkpoint: Path, step: int) -> dict[str, torch.Tensor]:
    """Check that ``checkpoint`` is complete and loads; return its weights."""
    assert is_complete_checkpoint(checkpoint)
    assert TrainerState.load_from_json(str(checkpoint / "trainer_state.json")).global_step == step
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        assert (checkpoint / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _resume(tmp_path, model_dir, from_step: int, weights: dict[str, torch.Tensor], **settings) -> None:
    """A fresh child resumes with ``resume_from_checkpoint=True``: from checkpoint-``from_step``, to MAX_STEPS."""
    proc, record, log = _start(tmp_path, "resume", "resume", model_dir, **settings)
    assert _wait(proc, log, START_TIMEOUT_S) == 0, _tail(log)
    summary = json.loads((record / "summary.json").read_text())
    assert summary["begin"] == from_step, "the resumed run starts at the checkpoint's step, not at 0"
    assert summary["steps"] == list(range(from_step + 1, MAX_STEPS + 1))
    assert summary["end"] == MAX_STEPS
    begin = load_file(str(record / "begin.safetensors"))
    assert begin.keys() == weights.keys()
    for key, value in weights.items():
        assert torch.equal(begin[key], value), f"{key}: the resumed run did not start from the checkpoint's weights"
    out = tmp_path / "out"
    assert last_complete_checkpoint(out) == str(out / f"checkpoint-{MAX_STEPS}")
    _loadable(out / f"checkpoint-{MAX_STEPS}", MAX_STEPS)


# ------------------------------------------------------------------ fast


def test_trainer_resumes_from_the_last_complete_checkpoint():
    assert issubclass(TandemGRPOTrainer, ResumeFromCompleteCheckpoint), (
        "TandemGRPOTrainer must list ResumeFromCompleteCheckpoint before GRPOTrainer (tandem_grpo/checkpointing.py)"
    )


def test_last_complete_checkpoint_skips_incomplete_ones(tmp_path):
    def checkpoint(step: int, state: str | None, jit_marker: bool = False) -> Path:
        path = tmp_path / f"checkpoint-{step}"
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"")
        if state is not None:
            (path / "trainer_state.json").write_text(state)
        if jit_marker:
            (path / JIT_INCOMPLETE_MARKER).write_text("in progress")
        return path

    assert last_complete_checkpoint(tmp_path / "missing") is None
    checkpoint(1, None)
    assert last_complete_checkpoint(tmp_path) is None
    for step in (2, 9):
        checkpoint(step, f'{{"global_step": {step}}}')
    checkpoint(10, None)  # killed before the trainer state: what transformers' own resume picks
    checkpoint(11, '{"global_st')  # killed while writing it
    checkpoint(12, '{"global_step": 12}', jit_marker=True)  # a JIT checkpoint written over a complete one, cut
    (tmp_path / "checkpoint-13").write_text("a file, not a folder")
    (tmp_path / "tmp-checkpoint-14").mkdir()
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-12")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-9")
    (tmp_path / "checkpoint-12" / JIT_INCOMPLETE_MARKER).unlink()
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-12"), "by step number, not by name"


# ------------------------------------------------------- child processes


def test_ctrl_c_during_a_step_keeps_the_last_checkpoint_and_resume_continues(tmp_path, tiny_model_dirs):
    hold = 2
    code, log = _interrupt(tmp_path, tiny_model_dirs[0], "step", signal.SIGINT, hold)
    # Python re-raises SIGINT when a KeyboardInterrupt ends the program: the child died of Ctrl-C, in the step.
    assert code == -signal.SIGINT, _tail(log)
    assert "KeyboardInterrupt" in log.read_text()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in range(1, hold + 1)]
    assert last_complete_checkpoint(out) == get_last_checkpoint(str(out)) == str(out / f"checkpoint-{hold}")
    weights = _loadable(out / f"checkpoint-{hold}", hold)
    _resume(tmp_path, tiny_model_dirs[0], hold, weights)


def test_sigterm_during_a_checkpoint_write_resumes_from_the_previous_one(tmp_path, tiny_model_dirs):
    # save_total_limit=1: checkpoint-1 is deleted once checkpoint-2 is complete, and checkpoint-2 must survive
    # the interrupted write of checkpoint-3 (transformers rotates only after a checkpoint is complete).
    hold, config = 3, {"save_total_limit": 1}
    code, log = _interrupt(tmp_path, tiny_model_dirs[0], "save", signal.SIGTERM, hold, config=config)
    assert code == -signal.SIGTERM, _tail(log)  # killed by the default action, mid-write
    out = tmp_path / "out"
    half = out / f"checkpoint-{hold}"
    assert (half / "model.safetensors").is_file() and not (half / "trainer_state.json").exists(), "not mid-write"
    assert get_last_checkpoint(str(out)) == str(half), "transformers' own choice: the half-written checkpoint"
    assert last_complete_checkpoint(out) == str(out / f"checkpoint-{hold - 1}")
    weights = _loadable(out / f"checkpoint-{hold - 1}", hold - 1)
    _resume(tmp_path, tiny_model_dirs[0], hold - 1, weights, config=config)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{MAX_STEPS}"]


def test_sigterm_with_jit_checkpointing_stops_cleanly_after_a_complete_checkpoint(tmp_path, tiny_model_dirs):
    # transformers' enable_jit_checkpoint=True turns SIGTERM (preemption) into a clean stop: 3 s after the signal it
    # asks for a checkpoint at the next step hook, saves it and ends training. The step holds 5 s, so the request
    # comes before that step's end.
    hold = 2
    config = {"enable_jit_checkpoint": True, "max_steps": MAX_STEPS + 2}
    code, log = _interrupt(tmp_path, tiny_model_dirs[0], "step", signal.SIGTERM, hold, hold_s=5, config=config)
    assert code == 0, _tail(log)
    summary = json.loads((tmp_path / f"step-{signal.SIGTERM.name}" / "summary.json").read_text())
    assert summary["steps"][-1] == summary["end"] == hold + 1, "training stopped after the interrupted step"
    out = tmp_path / "out"
    folders = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in folders] == [f"checkpoint-{s}" for s in range(1, hold + 2)]
    assert all(is_complete_checkpoint(p) for p in folders)
    _loadable(out / f"checkpoint-{hold + 1}", hold + 1)
