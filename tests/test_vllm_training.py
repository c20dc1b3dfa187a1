"""Server mode and real training steps with vLLM (SmolLM2-135M-Instruct; skipped without vLLM).

- A tandem server (``tandem-grpo vllm-serve``) started by the test on a free loopback port, with a distinct junior
  (the senior with every ``mlp.down_proj`` scaled by 0.6, saved to a temporary folder): the junior is loaded from
  its path, the senior's log-probs on senior tokens (including junior-to-senior handoffs, where the mixture's
  log-prob differs) match transformers, a weight sync reaches the senior only, then two GRPO steps run through it.
- Two GRPO steps in colocate mode, tandem and senior-only (KL-to-junior, whose weight sync is checked).

The trainings run in a subprocess each (a vLLM engine per process, as in real runs). Slow on a CPU (minutes).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import child_env, free_port, skip_without_vllm, tandem_server

skip_without_vllm()

from tandem_grpo.handoff import HandoffRule  # noqa: E402
from tandem_grpo.models import resolve_model_path  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CPU = not torch.cuda.is_available()
ENGINE_FLAGS = ["--gpu_memory_utilization", "0.2", "--max_model_len", "512"] + (
    ["--dtype", "float32", "--enforce_eager"] if CPU else []
)

TRAIN_SCRIPT = r"""
import json, sys
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem_grpo.config import TandemGRPOConfig
from tandem_grpo.models import resolve_model_path
from tandem_grpo.trainer import TandemGRPOTrainer
from tandem_grpo.vllm.trl_generation import SeniorVLLMGeneration, TandemVLLMGeneration, use_tandem_vllm

mode, output_dir, base_url, arm, junior = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] or None
cpu = not torch.cuda.is_available()
path = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
pairs = [(3, 4), (12, 30), (7, 8), (21, 5), (9, 9), (40, 2), (6, 13), (11, 11)]
dataset = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)} for a, b in pairs]
)


def correct(completions, answer, **kwargs):
    return [float(ans in c[0]["content"]) for c, ans in zip(completions, answer)]


def brief(completions, **kwargs):
    return [-len(c[0]["content"]) / 100 for c in completions]


args = TandemGRPOConfig(
    output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=4,
    max_completion_length=12, learning_rate=1e-5, logging_steps=1, report_to=[], save_strategy="no", seed=0,
    use_vllm=True, vllm_mode=mode, vllm_gpu_memory_utilization=0.2, vllm_max_model_length=512,
    vllm_server_base_url=base_url if mode == "server" else None, vllm_server_timeout=60,
    junior_probability=0.5, handoff_granularity="word", use_cpu=cpu, junior_model_name_or_path=junior,
    **({"kl_to_junior": True, "beta": 1e-3} if arm == "kl_to_junior" else {}),
)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32 if cpu else "auto")
with use_tandem_vllm(args, **({"dtype": "float32", "enforce_eager": True} if cpu else {})):
    trainer = TandemGRPOTrainer(
        model=model, reward_funcs=[correct, brief], args=args, train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(path),
    )
if arm == "tandem":
    assert isinstance(trainer.vllm_generation, TandemVLLMGeneration), type(trainer.vllm_generation)
    assert trainer.junior is None, "with vLLM the junior lives in the engine; no copy on the training process"
else:  # senior-only rollouts: TRL's engine (no junior inside); the KL reference junior is on the training process
    assert type(trainer.vllm_generation) is SeniorVLLMGeneration, type(trainer.vllm_generation)
    assert trainer.ref_model is not None  # the KL reference: the junior (the initial senior)
trainer.train()
result = {"log_history": trainer.state.log_history}
if arm != "tandem":
    # The weight sync reaches the engine: scale one layer, sync, and the engine's first-token log-probs move to
    # the trained model's.
    from vllm import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = tokenizer.apply_chat_template(dataset[0]["prompt"], add_generation_prompt=True, tokenize=False)
    params = SamplingParams(max_tokens=1, temperature=1.0, logprobs=5)

    def engine_top():
        out = trainer.vllm_generation.llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        return {k: v.logprob for k, v in out.logprobs[0].items()}

    before = engine_top()
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight.mul_(1.5)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        reference = torch.log_softmax(model(ids).logits[0, -1].float(), -1)
    trainer.vllm_generation.sync_weights()
    after = engine_top()
    result["engine_moved"] = max(abs(after[k] - before[k]) for k in set(after) & set(before))
    result["engine_vs_model"] = max(abs(after[k] - reference[k].item()) for k in after)
print("RESULT " + json.dumps(result), flush=True)
"""


def _train(tmp_path, mode: str, base_url: str = "", arm: str = "tandem", junior: str = "") -> dict:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(tmp_path / "out"), base_url, arm, junior],
        capture_output=True,
        text=True,
        timeout=1500,
        env=child_env(),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def _check_two_steps(history: list[dict]) -> None:
    steps = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    for entry in steps:
        assert math.isfinite(entry["loss"])
        assert 0.0 < entry["tandem/senior_token_fraction"] < 1.0
        assert entry["tandem/handoffs_per_completion"] > 0


@pytest.fixture(scope="module")
def junior_path(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(MODEL)
    folder = tmp_path_factory.mktemp("junior")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "mlp.down_proj" in name:
                param.mul_(0.6)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(path).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def server(junior_path, tmp_path_factory):
    args = ["--model", MODEL, "--junior-model", junior_path, *ENGINE_FLAGS]
    with tandem_server(args, tmp_path_factory.mktemp("server") / "server.log", timeout_s=900) as url:
        yield url


@pytest.fixture(scope="module")
def prompt_ids():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 51 * 99?"}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_server_rollouts_use_the_junior_and_return_the_seniors_terms(server, junior_path, prompt_ids):
    """Over the server, under both handoff rules: the rollout's senior log-probs are the senior's exact score terms
    (``handoff.senior_token_terms``), recomputed here from the senior's own logits."""
    from transformers import AutoModelForCausalLM

    from tandem_grpo.handoff import boundary_logprobs, replay, unit_start_ids
    from tandem_grpo.rollout import Rollout
    from tandem_grpo.vllm.client import TandemVLLMClient
    from tandem_grpo.vllm.engine import boundary_tables

    client = TandemVLLMClient(base_url=server, connection_timeout=10)
    info = client.check_tandem()
    assert info["junior_path"] == junior_path
    tables = boundary_tables(resolve_model_path(MODEL), info["vocab_size"], tuple(info["eos_token_ids"]))
    senior = AutoModelForCausalLM.from_pretrained(resolve_model_path(MODEL), dtype=torch.float32).eval()
    for mode in ("after_boundary", "whole_unit"):
        rule = HandoffRule("word", 0.5, 32, mode)
        seeds = list(range(6))
        ids, mixture, records = client.generate_tandem([prompt_ids] * 6, seeds, rule, max_tokens=16)
        rollout = Rollout.from_engine(ids, mixture, records, seeds, rule, tables)
        handoffs = 0
        for row, (completion, authors, own) in enumerate(
            zip(rollout.completion_ids, rollout.authorship, rollout.senior_logprobs, strict=True)
        ):
            with torch.no_grad():
                logits = senior(torch.tensor([prompt_ids + completion])).logits[0, len(prompt_ids) - 1 : -1]
            logprobs = torch.log_softmax(logits[:, : tables.vocab_size].float(), -1)
            reference = logprobs.gather(1, torch.tensor(completion)[:, None])[:, 0]
            coef = replay(torch.tensor([completion]), torch.tensor([seeds[row]]), tables, rule).boundary_coef[0]
            b_lp = boundary_logprobs(logprobs, unit_start_ids(tables, rule)) if mode == "whole_unit" else None
            for t, author in enumerate(authors):
                c = int(coef[t])
                handoffs += c != 0
                if author == 0 and c == 0:
                    assert math.isnan(own[t])
                    continue
                expected = (reference[t].item() if author == 1 else 0.0) + (c * b_lp[t].item() if c else 0.0)
                assert abs(own[t] - expected) < 0.02, (mode, t, own[t], expected)
        if mode == "whole_unit":
            assert handoffs > 0  # positions where the terms carry log p_s(B)
        else:
            assert handoffs == 0


def test_server_weight_sync_reaches_the_senior_only(server, prompt_ids):
    from safetensors import safe_open

    from tandem_grpo.sampling import SamplingSettings
    from tandem_grpo.vllm.client import TandemVLLMClient
    from tandem_grpo.vllm.engine import new_uids, request_fields
    from tandem_grpo.vllm.request_args import tandem_extra_args

    client = TandemVLLMClient(base_url=server, connection_timeout=10)
    client.init_communicator(device="cpu" if CPU else 0)
    fields = request_fields(SamplingSettings(), max_tokens=1, generation_kwargs={"logprobs": 10})

    def first_token_logprobs(junior: bool) -> dict:
        payload = {"model": client.model, "prompt": prompt_ids, **fields}
        if junior:  # junior_probability 1: the mixture is the junior's distribution
            payload["vllm_xargs"] = tandem_extra_args(0, new_uids(1)[0], HandoffRule("word", 1.0, 32))
        choice = client._post(f"{server}/v1/completions", json=payload)["choices"][0]
        return choice["logprobs"]["top_logprobs"][0]

    def diff(a, b):
        return max(abs(a[k] - b[k]) for k in set(a) & set(b))

    with safe_open(os.path.join(resolve_model_path(MODEL), "model.safetensors"), "pt") as handle:
        name = "model.layers.29.mlp.down_proj.weight"
        original = handle.get_tensor(name)
    before = first_token_logprobs(False), first_token_logprobs(True)
    metadata = [(name, "float32", list(original.shape))]
    try:
        client.update_named_params(metadata, iter([(name, original * 1.5)]))
        client.reset_prefix_cache()
        after = first_token_logprobs(False), first_token_logprobs(True)
        assert diff(before[0], after[0]) > 1e-2  # senior changed
        assert diff(before[1], after[1]) < 1e-4  # junior unchanged
    finally:
        client.update_named_params(metadata, iter([(name, original)]))
        client.reset_prefix_cache()
    assert diff(before[0], first_token_logprobs(False)) < 1e-4


def test_two_training_steps_in_server_mode(server, junior_path, tmp_path):
    # The server's junior is junior_path: the trainer names it (a trainer that does not is refused at start-up).
    _check_two_steps(_train(tmp_path, "server", server, junior=junior_path)["log_history"])


def test_two_training_steps_in_colocate_mode(tmp_path):
    _check_two_steps(_train(tmp_path, "colocate")["log_history"])


def test_senior_only_rollouts_in_colocate_mode_sync_weights(tmp_path):
    """The KL-to-junior arm (senior-only rollouts) on TRL's colocated engine: two steps run (the second after a
    weight sync, which TRL's per-tensor load broke on vLLM's CPU backend), the KL term toward the junior is logged,
    and a sync moves the engine's log-probs to the trained model's."""
    result = _train(tmp_path, "colocate", arm="kl_to_junior")
    steps = [entry for entry in result["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    for entry in steps:
        assert math.isfinite(entry["loss"])
        assert entry["tandem/senior_token_fraction"] == 1.0
        assert math.isfinite(entry["kl"]) and entry["kl"] >= 0
    # The engine's log-probs move by far more than they differ from the trained model's (a float32 engine matches
    # transformers to about 1e-2, as in the server test).
    assert result["engine_moved"] > 0.1, result
    assert result["engine_vs_model"] < 0.02, result


def test_unreachable_server_names_the_command(tmp_path):
    from tandem_grpo.vllm.client import TandemVLLMClient

    with pytest.raises(ConnectionError, match="tandem-grpo vllm-serve --model"):
        TandemVLLMClient(base_url=f"http://127.0.0.1:{free_port()}", connection_timeout=0)
