"""examples/train_math.py as a process: a LoRA run (TRL's --use_peft flags) trains and saves an adapter."""

from __future__ import annotations

import json
import subprocess
import sys
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
               "--num_problems", "8", "--output_dir", str(out), "--log_completions", "false"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["peft_type"] == "LORA"
    assert not (out / "model.safetensors").exists(), "a LoRA run saves the adapter, not the full weights"
    history = json.loads((out / "log_history.json").read_text())
    step = next(h for h in history if "tandem/senior_token_fraction" in h)
    assert 0.0 < step["tandem/senior_token_fraction"] < 1.0, "the junior (the base, adapter disabled) wrote tokens"
