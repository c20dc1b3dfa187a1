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
