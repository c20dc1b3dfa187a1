"""``tandem-grpo check`` on tiny random models (skipped without vLLM): it passes for Llama-, Qwen2- and
Qwen3-shaped models with tied and untied output heads, and fails, naming the checks, on an engine whose tied head a
reload leaves stale (the bug fixed in 7346ea0, reintroduced) and whose weight sync also writes into the junior.

Each passing run is a real process (``python -m tandem_grpo.cli check``), as a user runs it; the failing one runs
in this process so that the engine can be broken.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import build_tiny_tokenizer, child_env, skip_without_vllm

skip_without_vllm()

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "128", "--gpu-memory-utilization", "0.1",
         "--sequences", "4", "--tokens", "16"]  # fmt: skip


def _save(tmp_path_factory, family: str, tied: bool, seed: int = 0) -> str:
    from tiny_architectures import vllm_shaped

    folder = tmp_path_factory.mktemp(f"{family}-{'tied' if tied else 'untied'}")
    vllm_shaped(family, seed, tied).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def _lines(text: str) -> dict[str, dict]:
    # Libraries write to stdout too (DeepSpeed's accelerator line where installed): a check's line is a JSON object.
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return {line["check"]: line for line in map(json.loads, lines)}


@pytest.mark.parametrize(
    ("family", "tied"), [("llama", True), ("qwen2", False), ("qwen3", True)], ids=["llama-tied", "qwen2", "qwen3-tied"]
)
def test_check_passes_on_a_sound_engine(tmp_path_factory, family, tied):
    model = _save(tmp_path_factory, family, tied)
    junior = _save(tmp_path_factory, family, not tied, seed=1)  # a named junior, with the other kind of head
    proc = subprocess.run(
        [sys.executable, "-m", "tandem_grpo.cli", "check", "--model", model, "--junior-model", junior, *FLAGS],
        capture_output=True, text=True, timeout=900, env=child_env(),
    )  # fmt: skip
    lines = _lines(proc.stdout)
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-4000:])
    assert set(lines) >= {"engine", "junior_start", "senior_start", "sync", "senior_after_sync", "rollouts",
                          "junior_after_sync", "speed", "summary"}  # fmt: skip
    assert all(line["ok"] for line in lines.values()), lines
    assert lines["senior_after_sync"]["perturbation_moved"] > 100 * lines["senior_after_sync"]["tolerance"]
    assert lines["rollouts"]["senior_tokens"] > 0 and lines["speed"]["tandem_tokens_per_s"] > 0


def test_check_fails_on_a_broken_engine(tmp_path_factory, monkeypatch, capfd):
    # capfd, not capsys: vLLM (0.31) silences C libraries by the file descriptor of sys.stdout, which capsys lacks
    import tandem_grpo.vllm.model as engine_model
    from tandem_grpo.vllm.check_command import main

    model = _save(tmp_path_factory, "llama", tied=True)
    monkeypatch.setattr(engine_model, "repack_tied_layers", lambda module: 0)  # the stale tied head of 7346ea0
    reload_senior = engine_model.TandemForCausalLM.reload_senior

    def reaches_the_junior(self, weights):  # a sync that also writes into the frozen junior
        weights = list(weights)
        self.reload_junior([(name, tensor * 1.1) for name, tensor in weights])
        return reload_senior(self, weights)

    monkeypatch.setattr(engine_model.TandemForCausalLM, "reload_senior", reaches_the_junior)
    assert main(["--model", model, *FLAGS]) == 1
    lines = _lines(capfd.readouterr().out)
    assert lines["summary"]["failed"] == ["senior_after_sync", "rollouts", "junior_after_sync"], lines
    assert lines["engine"]["ok"] and lines["sync"]["ok"] and lines["senior_start"]["ok"]
    assert "stale" in lines["senior_after_sync"]["cause"] and lines["senior_after_sync"]["max"] > 1e-2


def test_flags_take_underscores_as_vllm_serves_do():
    from tandem_grpo.vllm.check_command import _parser

    args = _parser().parse_args(["--model", "m", "--junior_model", "j", "--gpu_memory_utilization", "0.5",
                                 "--max-model-len", "64", "--enforce_eager"])  # fmt: skip
    assert (args.junior_model, args.gpu_memory_utilization, args.max_model_len) == ("j", 0.5, 64)
    assert args.enforce_eager
