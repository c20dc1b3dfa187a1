"""Sleep mode in colocate with a tandem engine, at the level of what is sent and kept (no engine: vLLM's sleep is a
no-op on a CPU). TRL 1.16 puts the colocated engine to sleep at level 2 (weights discarded) and re-pushes the trained
weights; the junior must come back from vLLM's ``sleep_preserve_parameter_names`` and never from the weight sync."""

from __future__ import annotations

import dataclasses
from fnmatch import filter as fnmatch_filter  # what vLLM's worker matches the patterns with (gpu_worker.py)

import pytest
import torch
from conftest import skip_without_vllm

skip_without_vllm()

from tandem_grpo.vllm._compat import JUNIOR_SLEEP_PATTERN, check_sleep_preservation  # noqa: E402
from tandem_grpo.vllm.model import JUNIOR_PREFIX, SENIOR_PREFIX  # noqa: E402
from tandem_grpo.vllm.trl_generation import TandemVLLMGeneration  # noqa: E402

pytestmark = pytest.mark.vllm


def test_the_pattern_keeps_every_junior_parameter_and_no_senior_one():
    from conftest import build_tiny_model

    tandem = torch.nn.Module()
    setattr(tandem, SENIOR_PREFIX, build_tiny_model(0))
    setattr(tandem, JUNIOR_PREFIX, build_tiny_model(1))
    names = [name for name, _ in tandem.named_parameters()]
    kept = set(fnmatch_filter(names, JUNIOR_SLEEP_PATTERN))
    assert kept == {n for n in names if n.startswith(f"{JUNIOR_PREFIX}.")} and kept
    assert not any(n.startswith(f"{SENIOR_PREFIX}.") for n in kept)


def test_sleep_mode_is_allowed_where_vllm_can_keep_the_junior_and_refused_elsewhere(monkeypatch):
    check_sleep_preservation()  # the installed vLLM (0.32) has the option
    import vllm.engine.arg_utils as arg_utils

    older = dataclasses.make_dataclass("EngineArgs", [("model", str, "m"), ("enable_sleep_mode", bool, False)])
    monkeypatch.setattr(arg_utils, "EngineArgs", older)
    with pytest.raises(NotImplementedError, match="sleep_preserve_parameter_names.*Turn sleep mode off"):
        check_sleep_preservation()


class _Engine:
    """What the generation object reaches of a colocated engine: calls recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def _generation(monkeypatch, engine: _Engine, sleep: bool) -> TandemVLLMGeneration:
    generation = object.__new__(TandemVLLMGeneration)  # the state TRL's __init__ would set, without an engine
    generation.mode, generation.enable_sleep_mode, generation.llm = "colocate", sleep, engine
    generation.llm_kwargs = {"enforce_eager": True}
    generation._llm_weights_sleeping = sleep
    trained = {"model.embed_tokens.weight": torch.ones(2), "model.layers.0.mlp.up_proj.weight": torch.ones(3)}
    generation._iter_named_params = lambda: iter(trained.items())

    class _Model:
        def reload_senior(self, weights):
            names = [name for name, _ in weights]
            engine.calls.append(("reload_senior", tuple(names)))
            return set(names)

    generation.engine_model = lambda: _Model()
    generation._checks_due = False
    generation.sync_checks = lambda: engine.calls.append(("sync_checks",))  # the engine check after each sync
    return generation


def test_weight_sync_wakes_the_weights_first_and_sends_the_senior_only(monkeypatch):
    import trl.generation.vllm_generation as trl_vllm

    monkeypatch.setattr(trl_vllm, "empty_cache", lambda: None)
    engine = _Engine()
    generation = _generation(monkeypatch, engine, sleep=True)
    generation.sync_weights()
    assert engine.calls[0] == ("wake_up", ("weights",))  # vLLM restores the preserved junior here
    (sent,) = [c[1] for c in engine.calls if c[0] == "reload_senior"]
    assert sent and not any(name.startswith(f"{JUNIOR_PREFIX}.") for name in sent)
    assert generation._llm_weights_sleeping is False

    engine.calls.clear()
    generation.enable_sleep_mode = False
    generation.sync_weights()
    assert [c[0] for c in engine.calls] == ["reload_senior", "reset_prefix_cache"]  # no sleep calls without it


def test_a_sleeping_engine_is_resynced_woken_and_put_back_to_sleep_around_generation(monkeypatch):
    """As TRL's ``VLLMGeneration.generate`` does: weights re-pushed if level 2 discarded them, KV cache woken,
    generation, level 2 sleep again."""
    import trl.generation.vllm_generation as trl_vllm

    monkeypatch.setattr(trl_vllm, "empty_cache", lambda: None)
    engine = _Engine()
    generation = _generation(monkeypatch, engine, sleep=True)
    generation.sampling_settings = lambda: None
    generation._generate_colocate = lambda prompts, seeds, sampling: engine.calls.append(("generate",)) or "rollout"
    assert generation.generate_tandem([[1, 2]], 1, [7]) == "rollout"
    assert [c[0] for c in engine.calls] == [
        "wake_up", "reload_senior", "reset_prefix_cache", "wake_up", "sync_checks", "generate", "sleep",
    ]  # fmt: skip: the checks read the woken engine, after the sync and before the generation
    assert engine.calls[3] == ("wake_up", ("kv_cache",)) and engine.calls[-1] == ("sleep", 2)
    assert generation._llm_weights_sleeping is True


def test_the_colocated_engine_is_asked_to_keep_the_junior(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    generation = _generation(monkeypatch, _Engine(), sleep=True)
    trl_kwargs = {"model": "m", "enable_sleep_mode": True, "distributed_executor_backend": "external_launcher"}
    options = generation.engine_options(trl_kwargs, {"logits_processors": ["x"], "worker_extension_cls": "w"})
    assert options["sleep_preserve_parameter_names"] == [JUNIOR_SLEEP_PATTERN]
    assert options["logits_processors"] == ["tandem_grpo.vllm.processor_v2:TandemLogitsProcessorV2"]
    assert "async_scheduling" not in options and options["enforce_eager"] is True
    generation.llm_kwargs = {"sleep_preserve_parameter_names": ["senior.model.embed_tokens.*"]}
    options = generation.engine_options(trl_kwargs, {})
    assert options["sleep_preserve_parameter_names"] == ["senior.model.embed_tokens.*", JUNIOR_SLEEP_PATTERN]
    generation.llm_kwargs = {}
    options = generation.engine_options({**trl_kwargs, "enable_sleep_mode": False}, {})
    assert "sleep_preserve_parameter_names" not in options
