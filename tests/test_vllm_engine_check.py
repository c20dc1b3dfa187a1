"""The trainer's engine check with a real vLLM engine (colocate, tiny models; skipped without vLLM).

Each training runs in its own process (one vLLM engine per process, as in real runs), one or two steps of 4 prompts x
4 completions. The deliberate breakages are the bugs the check exists for:

- the stale tied output head of vLLM's CPU backend (commit 7346ea0), reintroduced by turning
  ``tandem_grpo.vllm.model.repack_tied_layers`` into a no-op, with a senior whose embedding the first sync moves (the
  model given in memory differs from its checkpoint; the junior is that checkpoint): the figure flags step 1;
- a weight sync that leaves a parameter out (``_iter_named_params`` filtered);
- a self-paired trainer given a model changed in memory (the engine's junior is the checkpoint on disk), in colocate
  and in server mode.

Server mode runs against one ``tandem-grpo vllm-serve`` on the tiny model, which ``tandem-grpo check --server`` also
checks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import build_tiny_tokenizer, child_env, skip_without_vllm, tandem_server

skip_without_vllm()

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

SCRIPT = r"""
import json, sys
import torch
from conftest import tiny_prompts, tiny_tandem_config
from transformers import AutoModelForCausalLM

from tandem_grpo import TandemGRPOTrainer
from tandem_grpo.vllm.trl_generation import use_tandem_vllm

path, output_dir, breakage, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
if breakage in ("moved", "stale_head", "modified_model"):
    with torch.no_grad():  # the model in memory is not its checkpoint: the first sync moves the (tied) embedding
        model.get_input_embeddings().weight.mul_(1.5)
if breakage == "stale_head":
    import tandem_grpo.vllm.model as engine_model

    engine_model.repack_tied_layers = lambda module: 0  # the bug fixed in 7346ea0
if breakage == "drop_param":
    from tandem_grpo.vllm.trl_generation import TandemVLLMGeneration

    original = TandemVLLMGeneration._iter_named_params
    TandemVLLMGeneration._iter_named_params = lambda self: (
        (n, t) for n, t in original(self) if n != "model.layers.0.mlp.down_proj.weight")
if options.pop("peft", False):
    from peft import LoraConfig
    peft = {"peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)}
else:
    peft = {}


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


args = tiny_tandem_config(output_dir, **{
    "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.1, "vllm_max_model_length": 128,
    "use_cpu": True, "bf16": False, "vllm_importance_sampling_correction": False, "vllm_server_timeout": 60, **options,
})
result = {}
try:
    with use_tandem_vllm(args, dtype="float32", enforce_eager=True):
        trainer = TandemGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=tiny_prompts(16),
                                    **peft)
    result["built"] = True
    trainer.train()
    result["log_history"] = trainer.state.log_history
except RuntimeError as err:
    result["error"] = str(err)
print("RESULT " + json.dumps(result), flush=True)
"""


def _save(tmp_path_factory, padded: bool) -> str:
    from tiny_architectures import vllm_shaped

    folder = tmp_path_factory.mktemp("tied-llama")
    vllm_shaped("llama", 0, tied=True, padded=padded).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tied_llama(tmp_path_factory) -> str:
    """A tiny Llama whose output head is tied to its embedding, padded past the tokenizer (the tandem engine cuts
    its logits to the tokenizer's ids; the trainer normalizes over every column: the check must account for both)."""
    return _save(tmp_path_factory, padded=True)


@pytest.fixture(scope="module")
def unpadded_llama(tmp_path_factory) -> str:
    """The same without padding, for TRL's plain engine (which samples every column)."""
    return _save(tmp_path_factory, padded=False)


def _train(tmp_path, model: str, breakage: str = "none", **options) -> tuple[dict, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), model, str(tmp_path / "out"), breakage, json.dumps(options)],
        capture_output=True, text=True, timeout=900, env=child_env(),
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("RESULT ")), proc.stderr


def _figures(result: dict) -> list[tuple[float, float]]:
    assert "log_history" in result, result
    history = result["log_history"]
    return [(e["tandem/engine_logp_diff/mean"], e["tandem/engine_logp_diff/max"]) for e in history if "loss" in e]


@pytest.mark.parametrize(
    ("breakage", "options"),
    [
        ("moved", {"junior_probability": 0.5, "top_k": 8, "top_p": 0.9, "temperature": 0.8, "junior": True}),
        ("none", {"junior_probability": 0.5, "handoff_mode": "whole_unit", "top_k": 8, "peft": True}),
        ("none", {"junior_probability": 0.0}),
    ],
    ids=["tandem-truncated", "whole-unit-lora", "grpo-only"],
)
def test_the_engine_agrees_with_the_trainer_every_step(tmp_path, tied_llama, unpadded_llama, breakage, options):
    """Healthy engines under ``engine_check="raise"``: two steps run, and each logs the figure, far below float32's
    tolerance: tandem rollouts truncated by top-k/top-p (the processor adds the kept mass back) after a first sync
    that moves the tied embedding (the positive control of the stale-head tests), the ``whole_unit`` terms with a
    LoRA senior (the engine gets the merged weights, the trainer scores with the adapter), GRPO-only rollouts from
    TRL's engine (no truncation)."""
    if options.pop("junior", False):
        options["junior_model_name_or_path"] = tied_llama
    model = tied_llama if options["junior_probability"] > 0 else unpadded_llama
    result, _ = _train(tmp_path, model, breakage, max_steps=2, engine_check="raise", **options)
    figures = _figures(result)
    assert len(figures) == 2, result
    for mean, top in figures:
        assert mean < 1e-5 and top < 1e-4, figures


def test_a_stale_tied_head_warns_on_the_first_step(tmp_path, tied_llama):
    """The default: one warning naming the causes, the figure logged, training goes on."""
    result, stderr = _train(tmp_path, tied_llama, "stale_head", max_steps=1, junior_model_name_or_path=tied_llama,
                            junior_probability=0.5)  # fmt: skip
    ((mean, top),) = _figures(result)
    assert mean > 1e-3, (mean, top)
    assert "Optimizer step 1: the rollout engine's log-probabilities" in stderr
    assert "tied to the embedding" in stderr and "tandem-grpo check" in stderr


def test_a_stale_tied_head_stops_a_strict_run_before_the_optimizer_step(tmp_path, tied_llama):
    result, _ = _train(tmp_path, tied_llama, "stale_head", max_steps=1, junior_model_name_or_path=tied_llama,
                       junior_probability=0.5, engine_check="raise")  # fmt: skip
    assert "Optimizer step 1: the rollout engine's log-probabilities" in result["error"], result
    assert "before the optimizer step" in result["error"]


def test_a_sync_that_misses_a_parameter_is_refused(tmp_path, tied_llama):
    result, _ = _train(tmp_path, tied_llama, "drop_param", max_steps=1, junior_probability=0.5)
    assert "reached no value for 1 senior parameter(s)" in result["error"], result
    assert "model.layers.0.mlp.down_proj.weight" in result["error"]


def test_a_self_paired_junior_that_is_not_the_model_is_refused_at_start(tmp_path, tied_llama):
    """The model given to the trainer was changed in memory; the engine loads the checkpoint on disk, so its junior
    is not the trainer's initial senior: refused while the trainer is built."""
    result, _ = _train(tmp_path, tied_llama, "modified_model", max_steps=1, junior_probability=0.5)
    assert "built" not in result and "junior does not compute the senior's initial function" in result["error"]


def test_server_mode_checks_the_servers_engine(tmp_path, tmp_path_factory, tied_llama):
    """One server: ``tandem-grpo check --server`` passes on it; a self-paired trainer syncs and reports the figure
    under ``engine_check="raise"``; a trainer whose model is not the server's ``--model`` is refused at start-up."""
    flags = ["--gpu_memory_utilization", "0.1", "--max_model_len", "128", "--dtype", "float32", "--enforce_eager"]
    with tandem_server(["--model", tied_llama, *flags], tmp_path_factory.mktemp("server") / "server.log") as url:
        check = subprocess.run(
            [sys.executable, "-m", "tandem_grpo.cli", "check", "--model", tied_llama, "--server", url, "--sequences",
             "4", "--tokens", "16"], capture_output=True, text=True, timeout=900, env=child_env(),
        )  # fmt: skip
        assert check.returncode == 0, (check.stdout, check.stderr[-4000:])
        server = {"vllm_mode": "server", "vllm_server_base_url": url, "junior_probability": 0.5, "top_k": 8}
        result, _ = _train(tmp_path / "sound", tied_llama, max_steps=1, engine_check="raise", **server)
        ((mean, top),) = _figures(result)
        assert mean < 1e-5 and top < 1e-4, (mean, top)
        result, _ = _train(tmp_path / "modified", tied_llama, "modified_model", max_steps=1, **server)
        assert "built" not in result and "junior does not compute the senior's initial function" in result["error"]


def test_a_dummy_load_is_refused_before_anything_is_built():
    """``load_format="dummy"`` never runs the initial load that loads the junior: refused where the model is built."""
    from types import SimpleNamespace

    from tandem_grpo.vllm.model import TandemForCausalLM

    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace()),
                             load_config=SimpleNamespace(load_format="dummy"))  # fmt: skip
    with pytest.raises(ValueError, match="cannot start with load_format='dummy'.*default load format"):
        TandemForCausalLM(vllm_config=config)
