"""examples/train_math.py as a process: a LoRA run (TRL's --use_peft flags) trains and saves an adapter; Ctrl-C ends a
run with one line saying how to resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import child_env

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train_math.py"


@pytest.mark.integration
def test_train_math_with_lora_saves_an_adapter_and_pairs_with_the_base(tmp_path, smollm2_path):
    out = tmp_path / "out"
    command = [sys.executable, str(TRAIN), "--model_name_or_path", smollm2_path, "--use_peft", "--lora_r", "4",
               "--lora_target_modules", "all-linear", "--max_steps", "1", "--per_device_train_batch_size", "4",
               "--gradient_accumulation_steps", "1", "--num_generations", "4", "--max_completion_length", "8",
               "--num_problems", "8", "--output_dir", str(out), "--log_completions", "false",
               "--held_out_problems", "3", "--held_out_samples", "2"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # The senior alone before and after, on the PEFT model: 3 problems x 2 samples, paired, reported in one line.
    held_out = json.loads((out / "held_out.json").read_text())
    assert (held_out["problems"], held_out["samples_per_problem"]) == (3, 2)
    assert held_out["difference"]["num_problems"] == 3
    assert "The senior alone on 3 held-out problems x 2:" in result.stdout
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["peft_type"] == "LORA"
    assert not (out / "model.safetensors").exists(), "a LoRA run saves the adapter, not the full weights"
    history = json.loads((out / "log_history.json").read_text())
    step = next(h for h in history if "tandem/senior_token_fraction" in h)
    assert 0.0 < step["tandem/senior_token_fraction"] < 1.0, "the junior (the base, adapter disabled) wrote tokens"


@pytest.mark.integration
def test_ctrl_c_ends_train_math_with_one_line_naming_the_resume_flag(tmp_path, smollm2_path):
    out = tmp_path / "out"
    command = [sys.executable, str(TRAIN), "--model_name_or_path", smollm2_path, "--max_steps", "50",
               "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--num_generations", "4",
               "--max_completion_length", "4", "--num_problems", "200", "--output_dir", str(out),
               "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "1",
               "--held_out_problems", "0"]  # fmt: skip
    # Ctrl-C as in a terminal: a child started from a shell script or `nohup` would otherwise ignore SIGINT.
    proc = subprocess.Popen(command, cwd=tmp_path, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (out / "checkpoint-1" / "trainer_state.json").is_file():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint-1 within 600 s"
            time.sleep(0.5)
        time.sleep(1)  # into a later step (or save): the line names whichever checkpoint is complete
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert lines[-1].startswith("train_math.py: interrupted (Ctrl-C) after optimizer step "), lines[-1]
    assert f"To continue from {out}/checkpoint-" in lines[-1] and "--resume_from_checkpoint true" in lines[-1]
