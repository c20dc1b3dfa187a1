"""The trainer's engine check without vLLM: the transformers decode loop against the loss, the figure, what
``engine_check`` does past the tolerance, and the comparison itself (tiny models; the vLLM engine's checks are
``tests/test_vllm_engine_check.py``)."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import build_tiny_tokenizer, tiny_prompts, tiny_tandem_config

import tandem_grpo.generation
from tandem_grpo import TandemGRPOTrainer
from tandem_grpo.engine_check import ENGINE_CHECK_TOLERANCES, METRICS, disagreement

MEAN, MAX = METRICS


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _trainer(tmp_path, tiny_model_dirs, **overrides) -> TandemGRPOTrainer:
    args = tiny_tandem_config(tmp_path / "out", **{"max_steps": 2, **overrides})
    return TandemGRPOTrainer(model=tiny_model_dirs[0], reward_funcs=reward, args=args, train_dataset=tiny_prompts(8),
                             processing_class=build_tiny_tokenizer())  # fmt: skip


def _figures(trainer) -> list[tuple[float, float]]:
    return [(e[MEAN], e[MAX]) for e in trainer.state.log_history if "loss" in e and MEAN in e]


@pytest.mark.parametrize(
    "options", [{}, {"handoff_mode": "whole_unit", "top_k": 5, "top_p": 0.9, "temperature": 0.8}],
    ids=["after_boundary", "whole_unit-truncated"],
)  # fmt: skip
def test_the_decode_loop_agrees_with_the_loss_every_step(tmp_path, tiny_model_dirs, options):
    trainer = _trainer(tmp_path, tiny_model_dirs, engine_check="raise", **options)
    trainer.train()
    figures = _figures(trainer)
    assert len(figures) == 2
    for mean, top in figures:
        assert mean < 1e-5 and top < 1e-4, figures


@pytest.fixture
def off_by_half(monkeypatch):
    """The rollout's senior log-probs 0.5 nats above what the model computes: an engine that is not the model."""
    original = tandem_grpo.generation._senior_term
    monkeypatch.setattr(tandem_grpo.generation, "_senior_term", lambda *args: original(*args) + 0.5)


def test_a_wrong_engine_warns_once_and_is_logged_every_step(tmp_path, tiny_model_dirs, off_by_half, caplog):
    trainer = _trainer(tmp_path, tiny_model_dirs)
    with caplog.at_level(logging.WARNING, logger="tandem_grpo.engine_check"):
        trainer.train()
    for mean, top in _figures(trainer):
        assert mean == pytest.approx(0.5, abs=1e-4) and top == pytest.approx(0.5, abs=1e-4)
    warnings = [r.getMessage() for r in caplog.records if r.name == "tandem_grpo.engine_check"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("Optimizer step 1: the rollout engine's log-probabilities of the senior's tokens")
    assert "Likely causes" in warnings[0] and "tandem-grpo check" in warnings[0]


def test_a_wrong_engine_stops_a_strict_run_before_the_optimizer_step(tmp_path, tiny_model_dirs, off_by_half):
    trainer = _trainer(tmp_path, tiny_model_dirs, engine_check="raise")
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with pytest.raises(RuntimeError, match=r"Optimizer step 1: .*mean 0\.5.*Stopped before the optimizer step"):
        trainer.train()
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


def test_off_skips_the_figure(tmp_path, tiny_model_dirs, off_by_half):
    trainer = _trainer(tmp_path, tiny_model_dirs, engine_check="off", max_steps=1)
    trainer.train()
    assert not _figures(trainer)


def test_penalties_turn_the_figure_off_and_say_so(tmp_path, tiny_model_dirs, caplog):
    with caplog.at_level(logging.INFO, logger="tandem_grpo.engine_check"):
        trainer = _trainer(tmp_path, tiny_model_dirs, repetition_penalty=1.2, max_steps=1)
    assert "repetition_penalty change the sampling distribution" in caplog.text
    trainer.train()
    assert not _figures(trainer)


def test_disagreement_and_the_tolerances():
    assert disagreement([0.0, -1.0, float("nan")], [0.0, -1.5, -2.0], 0.3) == (0.25, 0.5, True)
    assert not disagreement([0.0, -1.0], [0.0, -1.5], 0.2)[2]  # mean 0.25 > 0.2
    assert not disagreement([0.0] * 1000 + [-1.0], [0.0] * 1001, 1e-3)[2]  # one token 1 nat off: max > 100x
    assert disagreement([], [], 1e-4) == (0.0, 0.0, True)
    assert ENGINE_CHECK_TOLERANCES[torch.float32] < ENGINE_CHECK_TOLERANCES[torch.bfloat16]


def test_active_dropout_names_each_kind_and_its_fix():
    from tandem_grpo.engine_check import active_dropout

    assert active_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0))) == ""
    named = active_dropout(torch.nn.Sequential(torch.nn.Dropout(0.05), torch.nn.Dropout(0.1)))
    assert named == "Dropout p=0.05, 0.1: set disable_dropout=True"
    attention = torch.nn.Module()
    attention.attention_dropout = 0.1
    assert active_dropout(attention) == "attention_dropout=0.1: load the model with attention_dropout=0.0"


def test_dropout_turns_the_figure_off_and_says_how_to_turn_it_back_on(tmp_path, tiny_model_dirs, caplog):
    """Dropout is on in the loss (the model trains) and off in the rollout: a strict run would stop on noise."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[0], attention_dropout=0.3)
    args = tiny_tandem_config(tmp_path / "out", max_steps=1, engine_check="raise")
    with caplog.at_level(logging.WARNING, logger="tandem_grpo.engine_check"):
        trainer = TandemGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=tiny_prompts(8),
                                    processing_class=build_tiny_tokenizer())  # fmt: skip
    assert "dropout is on in training" in caplog.text and "attention_dropout=0.3" in caplog.text
    trainer.train()  # does not raise
    assert not _figures(trainer)


def test_a_rollout_without_log_probs_says_the_figure_is_not_computed(tmp_path, tiny_model_dirs, caplog):
    """GRPO rollouts from TRL's own transformers generation carry no log-probs: said once, not silently skipped."""
    trainer = _trainer(tmp_path, tiny_model_dirs, junior_probability=0.0, max_steps=2)
    with caplog.at_level(logging.WARNING, logger="tandem_grpo.engine_check"):
        trainer.train()
    said = [r.getMessage() for r in caplog.records if "carries no log-probs" in r.getMessage()]
    assert len(said) == 1 and not _figures(trainer)


class _Accelerator:
    is_main_process = True


def test_a_server_failure_of_any_kind_reaches_every_process_as_one_error():
    """A refused request or a timeout on the main process must be raised on every process (after the broadcast),
    not only where it happened: the other processes would wait forever in the next collective."""
    from types import SimpleNamespace

    from tandem_grpo.engine_check import EngineCheck

    check = object.__new__(EngineCheck)
    check.generation = SimpleNamespace(mode="server", vllm_client="client")
    check.trainer = SimpleNamespace(accelerator=_Accelerator())

    def refused(engine):
        raise PermissionError("401 Unauthorized")

    with pytest.raises(RuntimeError, match="PermissionError: 401 Unauthorized"):
        check.on_main(refused)


@pytest.mark.parametrize("partitioned", ["zero3", "fsdp", None])
def test_the_juniors_start_up_reference_is_skipped_where_no_rank_holds_the_model(monkeypatch, partitioned):
    from types import SimpleNamespace

    import tandem_grpo.engine_check as engine_check
    from tandem_grpo.engine_check import EngineCheck

    check = object.__new__(EngineCheck)
    check.mode, check.figure_off, check.ids = "warn", None, [1, 2, 3]
    check.generation = SimpleNamespace(mode="colocate", llm="engine", generate_tandem=None)
    check.tandem = True
    check.trainer = SimpleNamespace(args=SimpleNamespace(junior_model_name_or_path=None), model="model",
                                    is_fsdp_enabled=partitioned == "fsdp")  # fmt: skip
    monkeypatch.setattr(engine_check, "is_zero3", lambda trainer: partitioned == "zero3")
    monkeypatch.setattr(engine_check, "reference_logprobs", lambda model, ids: [-1.0, -2.0])
    seen = []
    check._first_junior_probe = lambda engine, reference: seen.append((engine, reference))
    check.start()
    assert seen == [("engine", None if partitioned else [-1.0, -2.0])]


@pytest.mark.parametrize(("extra", "off"), [({}, False), ({"top_p": 0.9}, True), ({"top_k": 20}, True)])
def test_truncation_in_generation_kwargs_turns_the_senior_only_vllm_figure_off(extra, off):
    """TRL's vLLM engine applies generation_kwargs over the trainer's sampling settings; its log-probs are those of
    the truncated distribution, which the loss does not compute."""
    from types import SimpleNamespace

    from tandem_grpo.engine_check import EngineCheck

    check = object.__new__(EngineCheck)
    check.generation, check.tandem = object(), False  # TRL's engine: senior-only rollouts
    check.trainer = SimpleNamespace(args=SimpleNamespace(generation_kwargs=extra), repetition_penalty=1.0, top_k=0,
                                    top_p=1.0, min_p=None, model=torch.nn.Linear(2, 2))  # fmt: skip
    reason = check._why_not_exact()
    assert (reason is not None and "truncated distribution" in reason) if off else reason is None
