"""The junior inside a tandem vLLM engine is frozen: after the weight syncs of a trained senior it still computes the
initial model's function (or the named junior's), and the senior computes the trained one. Colocate and server
mode, self-pairing and a named junior; also the senior-only evaluation rollouts of the vLLM path.

The junior's logits live inside the engine, so they are read through what the engine returns. A tandem request at
``junior_probability=1`` has every unit written by the junior: its mixture is the junior's distribution (``P =
p_junior``), so vLLM's log P of each sampled token is the junior's log-prob. At ``junior_probability=0``, ``P =
p_senior``. Both are compared with a transformers recomputation on the same tokens by the model each should be.

Tolerance 1e-4 nats: the engine runs float32 like the reference (on a GPU it runs the checkpoint's dtype and this
test would need a looser bound), and what separates the two is only kernel numerics (oneDNN GEMMs, vLLM's paged
attention, another summation order), seen at <= 5e-6 on these models. A senior that moved, or a junior that
followed it, changes the same log-probs by more than 1e-2 (asserted in each test, so the check can tell them
apart).

Tiny Llamas, not SmolLM2: vLLM's CPU attention needs a head size >= 32, so conftest's tiny model (head size 8) is
widened here; an engine starts in about 15 s. Colocate runs in a subprocess per case (one in-process engine per
process, as in real runs); server mode trains in this process against a server it starts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import build_tiny_model, build_tiny_tokenizer, child_env, skip_without_vllm, tandem_server

skip_without_vllm()

pytestmark = [pytest.mark.vllm]

TOLERANCE = 1e-4  # nats; see the module docstring
MOVED = 1e-2  # nats; what a trained senior must differ by, on the measured tokens, for the check to mean anything
PROMPTS = [[2, 10, 3, 11], [4, 12, 24, 5], [6, 7, 13], [8, 9, 14, 21]]  # tiny-tokenizer ids (< 25)
COMPLETION_TOKENS = 8
REPEATS = 2  # completions per prompt and junior probability
CPU = not torch.cuda.is_available()

# Shared by the colocate script and the server test: training settings that move the tiny senior far (lr 5e-2).
TRAINING = dict(
    per_device_train_batch_size=4,
    per_device_eval_batch_size=4,
    num_generations=4,
    max_completion_length=10,
    max_steps=2,
    learning_rate=5e-2,
    report_to=[],
    save_strategy="no",
    seed=5,
    use_vllm=True,
    vllm_max_model_length=128,
    use_cpu=CPU,
)
TRAIN_PROMPTS = ["ab c", "d e", "f.\ng", "h"]

COLOCATE_SCRIPT = r"""
import json, sys
from datasets import Dataset
from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
from tandem_grpo.handoff import HandoffRule
from tandem_grpo.vllm.engine import generate_with_llm
from tandem_grpo.vllm.trl_generation import use_tandem_vllm
from conftest import build_tiny_tokenizer


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


if __name__ == "__main__":  # vLLM starts its engine with spawn
    senior, junior, output_dir, settings = sys.argv[1], sys.argv[2] or None, sys.argv[3], json.loads(sys.argv[4])
    args = TandemGRPOConfig(
        output_dir=output_dir, vllm_mode="colocate", junior_model_name_or_path=junior, **settings["training"]
    )
    dataset = Dataset.from_dict({"prompt": settings["train_prompts"] * 4})
    with use_tandem_vllm(args, **settings["llm_kwargs"]):
        trainer = TandemGRPOTrainer(
            model=senior, reward_funcs=length_reward, args=args, train_dataset=dataset,
            eval_dataset=Dataset.from_dict({"prompt": settings["train_prompts"]}),
            processing_class=build_tiny_tokenizer(),
        )
    llm = trainer.vllm_generation.llm
    tandem = llm.llm_engine.model_executor.driver_worker.model_runner.model

    def compiled(module):  # vLLM's @support_torch_compile state of the inner decoder (LlamaModel)
        inner = module.model
        if getattr(inner, "do_not_compile", True):
            return False
        return bool(inner.compiled or getattr(inner, "aot_compiled_fn", None) is not None)

    def measure():
        prompts, seeds, rules, probabilities = [], [], [], []
        for q in (1.0, 0.0):
            for prompt in settings["prompts"]:
                for _ in range(settings["repeats"]):
                    prompts.append(prompt)
                    seeds.append(len(seeds) + 11)
                    rules.append(HandoffRule("word", q, 32))
                    probabilities.append(q)
        rollout = generate_with_llm(llm, prompts, seeds, rules, max_tokens=settings["max_tokens"])
        return [
            {"q": q, "prompt": p, "ids": ids, "logprobs": lps, "authorship": authors}
            for q, p, ids, lps, authors in zip(
                probabilities, prompts, rollout.completion_ids, rollout.mixture_logprobs, rollout.authorship
            )
        ]

    out = {"initial": measure()}
    trainer.train()  # TRL's sync runs inside, before each step's rollouts
    trainer.vllm_generation.sync_weights()  # the last step's update, as the next rollout would push it
    out["trained"] = measure()
    trainer.model.save_pretrained(output_dir + "/trained")
    out["eval"] = trainer.evaluate()
    out["steps"] = trainer.state.global_step
    mode = llm.llm_engine.vllm_config.compilation_config.mode
    out["compilation"] = {"mode": getattr(mode, "name", str(mode)), "senior": compiled(tandem.senior),
                          "junior": compiled(tandem.junior),
                          "tags": [getattr(m.model, "_compile_tag", None) for m in (tandem.senior, tandem.junior)],
                          # the hidden size of the config each decoder's compile caches are keyed by
                          "keyed_hidden": [getattr(m.model, "vllm_config").model_config.hf_config.hidden_size
                                           for m in (tandem.senior, tandem.junior)]}
    print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for name, seed in (("senior", 0), ("junior", 1)):
        path = tmp_path_factory.mktemp(f"vllm-{name}")
        build_tiny_model(seed, head_dim=32).save_pretrained(path)
        build_tiny_tokenizer().save_pretrained(path)
        dirs[name] = str(path)
    return dirs


def _load(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _token_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    model.train(was_training)
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def _gap(samples: list[dict], model) -> float:
    """Largest |engine log P - ``model``'s log-prob| over every sampled token of ``samples``."""
    gaps = [
        (torch.tensor(s["logprobs"]) - _token_logprobs(model, s["prompt"], s["ids"])).abs().max().item()
        for s in samples
        if s["ids"]
    ]
    assert gaps, "no tokens were generated"
    return max(gaps)


def _assert_engine_computes(samples: list[dict], expected, unlike: list, what: str) -> None:
    """The engine's log P of ``samples`` is ``expected``'s log-prob (within TOLERANCE), and each model of ``unlike``
    differs from it there by more than MOVED (so the check tells those models apart)."""
    gap = _gap(samples, expected)
    assert gap < TOLERANCE, f"{what}: the engine's log-probs differ from the expected model's by {gap:.3g}"
    for model in unlike:
        assert _gap(samples, model) > MOVED, f"{what}: the measured tokens cannot tell the models apart"


def _check(phase: list[dict], junior, senior, other_seniors: list, phase_name: str) -> None:
    by_q = {q: [s for s in phase if s["q"] == q] for q in (1.0, 0.0)}
    assert all(a == 0 for s in by_q[1.0] for a in s["authorship"]), "junior_probability 1: the junior writes all"
    assert all(a == 1 for s in by_q[0.0] for a in s["authorship"]), "junior_probability 0: the senior writes all"
    # Self-paired, the initial senior IS the junior's model (the same object here), so it is left out.
    unlike_junior = [m for m in [senior, *other_seniors] if m is not junior]
    _assert_engine_computes(by_q[1.0], junior, unlike_junior, f"{phase_name} junior")
    _assert_engine_computes(by_q[0.0], senior, other_seniors, f"{phase_name} senior")


EAGER = {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 1 << 27}
"""The engine arguments of these tests (``tests/test_vllm_compiled.py`` drops ``enforce_eager``)."""


def _settings(llm_kwargs: dict = EAGER) -> str:
    return json.dumps(
        {
            "llm_kwargs": llm_kwargs,
            "training": TRAINING,
            "train_prompts": TRAIN_PROMPTS,
            "prompts": PROMPTS,
            "repeats": REPEATS,
            "max_tokens": COMPLETION_TOKENS,
        }
    )


def run_colocate(tmp_path, senior: str, junior: str | None, llm_kwargs: dict = EAGER, env: dict | None = None) -> dict:
    """Train the tiny ``senior`` in colocate mode in a subprocess (COLOCATE_SCRIPT) with the engine arguments
    ``llm_kwargs``; return its RESULT (the engine's log-probs before and after training, the evaluation, the
    compilation state). The trained senior is saved to ``tmp_path / "out" / "trained"``."""
    script = tmp_path / "colocate.py"
    script.write_text(COLOCATE_SCRIPT)
    command = [sys.executable, str(script), senior, junior or "", str(tmp_path / "out"), _settings(llm_kwargs)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800, env={**child_env(), **(env or {})})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-6000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["log"] = proc.stdout + proc.stderr  # vLLM logs to stdout
    assert result["steps"] == 2, "the senior really trained"
    return result


def check_colocate(tmp_path, result: dict, senior: str, junior: str | None) -> None:
    """Through the engine's log-probs of ``result``: the junior computes its initial function before and after
    training, the senior the initial then the trained one; evaluation rollouts are the senior's alone."""
    initial = _load(senior)
    junior_model = _load(junior) if junior else initial
    trained = _load(str(tmp_path / "out" / "trained"))
    _check(result["initial"], junior_model, initial, [], "initial")
    _check(result["trained"], junior_model, trained, [initial], "trained")

    # Evaluation rollouts are the senior's alone by default (TRL's own vLLM generate, no tandem request).
    assert result["eval"]["eval_tandem/senior_token_fraction"] == 1.0
    assert result["eval"]["eval_completions/mean_length"] > 0


@pytest.mark.parametrize("pairing", ["self", "named"])
def test_colocate_junior_stays_frozen_through_weight_syncs(tmp_path, tiny_dirs, pairing):
    junior = tiny_dirs["junior"] if pairing == "named" else None
    result = run_colocate(tmp_path, tiny_dirs["senior"], junior)
    assert result["compilation"]["mode"] == "NONE", "enforce_eager: no compilation"
    assert not result["compilation"]["senior"] and not result["compilation"]["junior"]
    check_colocate(tmp_path, result, tiny_dirs["senior"], junior)


@pytest.fixture(scope="module", params=["self", "named"])
def tiny_server(request, tiny_dirs, tmp_path_factory):
    """A tandem server for the tiny senior (self-paired, or with the named tiny junior); yields (url, junior)."""
    junior = tiny_dirs["junior"] if request.param == "named" else None
    args = ["--model", tiny_dirs["senior"], "--max_model_len", "128", "--gpu_memory_utilization", "0.2"]
    args += ["--junior-model", junior] if junior else []
    args += ["--dtype", "float32", "--enforce_eager"] if CPU else []
    with tandem_server(args, tmp_path_factory.mktemp("server") / "server.log") as url:
        yield url, junior


def _measure_server(client) -> list[dict]:
    from tandem_grpo.handoff import HandoffRule

    out = []
    prompts = [p for p in PROMPTS for _ in range(REPEATS)]
    for q in (1.0, 0.0):
        seeds = list(range(11, 11 + len(prompts)))
        ids, logprobs, records = client.generate_tandem(
            prompts, seeds, HandoffRule("word", q, 32), max_tokens=COMPLETION_TOKENS
        )
        # The engine's own record of the authors (every token but the last, which it never advanced over).
        out += [
            {"q": q, "prompt": p, "ids": i, "logprobs": lp, "authorship": r["authors"]}
            for p, i, lp, r in zip(prompts, ids, logprobs, records, strict=True)
        ]
    return out


def test_server_junior_stays_frozen_through_weight_syncs(tmp_path, tiny_dirs, tiny_server, monkeypatch):
    """Server mode: the trainer syncs through the client (files on a CPU, NCCL on CUDA) into the server's senior.

    On a CPU the weights travel as files of at most ~1 GiB; here of ~4 KiB, so that a sync spans many files and
    layers are split between them, as a >1 GiB model's are. (Loading each file in a reload of its own once left
    such layers half uninitialized: NaN log-probs after the first sync.)
    """
    from datasets import Dataset

    import tandem_grpo.vllm.client as client_module
    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer

    monkeypatch.setattr(client_module, "_FILE_CHUNK_BYTES", 4096)

    url, junior_path = tiny_server
    args = TandemGRPOConfig(
        output_dir=str(tmp_path / "out"),
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_server_timeout=60,
        junior_model_name_or_path=junior_path,
        **TRAINING,
    )
    trainer = TandemGRPOTrainer(
        model=tiny_dirs["senior"],
        reward_funcs=lambda completions, **kwargs: [float(len(c)) for c in completions],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS * 4}),
        eval_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS}),
        processing_class=build_tiny_tokenizer(),
    )
    client = trainer.vllm_generation.vllm_client
    initial_phase = _measure_server(client)
    trainer.train()
    trainer.vllm_generation.sync_weights()
    trained_phase = _measure_server(client)
    assert trainer.state.global_step == 2

    initial = _load(tiny_dirs["senior"])
    junior = _load(junior_path) if junior_path else initial
    _check(initial_phase, junior, initial, [], "initial")
    _check(trained_phase, junior, trainer.model, [initial], "trained")

    metrics = trainer.evaluate()
    assert metrics["eval_tandem/senior_token_fraction"] == 1.0
    assert metrics["eval_completions/mean_length"] > 0
