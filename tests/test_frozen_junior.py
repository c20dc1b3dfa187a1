"""The junior is frozen on every transformers path: after the senior trains, the junior still computes the initial
function (or the named junior's), compared by logits on a fixed input, never by state dicts.

0.1.0 shipped a default path whose junior was a ``deepcopy`` of the senior after TRL had replaced its ``forward`` with
a closure: same parameters, the *live* senior's logits. Every test here would have failed on it.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import build_tiny_tokenizer
from datasets import Dataset
from transformers import AutoModelForCausalLM

from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer

LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
FIXED_INPUT = torch.tensor([[2, 10, 3, 11, 21, 4, 12, 24, 5]])


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _logits(model, context=contextlib.nullcontext) -> torch.Tensor:
    was_training = model.training
    model.eval()
    with torch.no_grad(), context():
        out = model(input_ids=FIXED_INPUT.to(next(model.parameters()).device)).logits.float().cpu()
    model.train(was_training)
    return out


def _junior_logits(trainer) -> torch.Tensor:
    if trainer._junior_context == "disable_adapter":
        return _logits(trainer.model, trainer.model.disable_adapter)
    junior = trainer.ref_model if trainer.args.kl_to_junior else trainer.junior
    return _logits(trainer.accelerator.unwrap_model(junior))


def _train(tmp_path, model, steps: int = 2, peft_config=None, **overrides) -> TandemGRPOTrainer:
    args = TandemGRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=10,
        max_steps=steps,
        learning_rate=5e-2,
        report_to=[],
        save_strategy="no",
        seed=5,
        **overrides,
    )
    trainer = TandemGRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab c", "d e", "f.\ng", "h"] * 4}),
        processing_class=build_tiny_tokenizer(),
        peft_config=peft_config,
    )
    return trainer


def _assert_frozen(trainer, expected: torch.Tensor, initial_senior: torch.Tensor) -> None:
    """The junior still computes ``expected`` after training; the senior moved away from ``initial_senior``."""
    assert trainer.state.global_step >= 2, "the senior really trained"
    torch.testing.assert_close(_junior_logits(trainer), expected, atol=1e-5, rtol=0)
    senior_now = _logits(trainer.model)
    assert (senior_now - initial_senior).abs().max() > 1e-2, "the senior's logits moved"


def _initial(path: str) -> torch.Tensor:
    return _logits(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="default-self-pairing"),
        pytest.param({"beta": 0.1}, id="beta-reuses-reference"),
        pytest.param(
            {"beta": 0.1, "sync_ref_model": True, "ref_model_sync_steps": 1, "ref_model_mixup_alpha": 0.5},
            id="beta-with-sync-ref-model",
        ),
        pytest.param({"cast_lm_head_to_fp32": True}, id="lm-head-cast-to-fp32"),
    ],
)
def test_self_paired_junior_keeps_the_initial_function(tmp_path, tiny_model_dirs, overrides):
    initial = _initial(tiny_model_dirs[0])
    trainer = _train(tmp_path, tiny_model_dirs[0], **overrides)
    torch.testing.assert_close(_junior_logits(trainer), initial, atol=1e-5, rtol=0)
    trainer.train()
    _assert_frozen(trainer, initial, initial)
    if overrides.get("sync_ref_model"):
        assert trainer.junior is not trainer.ref_model, "a synced reference model cannot be the junior"


def test_self_paired_junior_of_a_modified_senior_instance_is_that_instance(tmp_path, tiny_model_dirs):
    """beta > 0 with a senior changed after loading: TRL's reference (reloaded from the path) is not the initial
    senior, so the junior is a copy of the instance instead."""
    senior = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[0], dtype=torch.float32)
    with torch.no_grad():
        senior.lm_head.weight.mul_(0.5)
    initial = _logits(senior)
    trainer = _train(tmp_path, senior, beta=0.1)
    assert trainer.junior is not trainer.ref_model
    trainer.train()
    _assert_frozen(trainer, initial, initial)


def test_kl_to_junior_reference_of_a_modified_senior_instance_is_that_instance(tmp_path, tiny_model_dirs):
    senior = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[0], dtype=torch.float32)
    with torch.no_grad():
        senior.lm_head.weight.mul_(0.5)
    initial = _logits(senior)
    trainer = _train(tmp_path, senior, kl_to_junior=True, beta=0.5)
    trainer.train()
    _assert_frozen(trainer, initial, initial)


def test_named_junior_keeps_its_own_function(tmp_path, tiny_model_dirs):
    trainer = _train(tmp_path, tiny_model_dirs[0], junior_model_name_or_path=tiny_model_dirs[1])
    trainer.train()
    _assert_frozen(trainer, _initial(tiny_model_dirs[1]), _initial(tiny_model_dirs[0]))


@pytest.mark.parametrize("junior", ["self", "named"])
def test_kl_to_junior_reference_stays_the_junior(tmp_path, tiny_model_dirs, junior):
    path = tiny_model_dirs[1] if junior == "named" else None
    trainer = _train(tmp_path, tiny_model_dirs[0], kl_to_junior=True, beta=0.5, junior_model_name_or_path=path)
    trainer.train()
    _assert_frozen(trainer, _initial(path or tiny_model_dirs[0]), _initial(tiny_model_dirs[0]))


def test_peft_senior_with_a_fresh_adapter_pairs_with_its_base(tmp_path, tiny_model_dirs):
    peft = pytest.importorskip("peft")
    initial = _initial(tiny_model_dirs[0])
    config = peft.LoraConfig(r=4, target_modules=LORA_TARGETS, init_lora_weights=True)
    trainer = _train(tmp_path, tiny_model_dirs[0], peft_config=config)
    assert trainer.junior is None and trainer._junior_context == "disable_adapter", "no second copy of the weights"
    trainer.train()
    _assert_frozen(trainer, initial, initial)


def test_peft_senior_with_a_trained_adapter_pairs_with_its_initial_state(tmp_path, tiny_model_dirs):
    """Re-training a senior that already carries a trained adapter: the junior is the senior as it was at the start
    (base + that adapter), not the bare base."""
    peft = pytest.importorskip("peft")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[0], dtype=torch.float32)
    senior = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=LORA_TARGETS))
    with torch.no_grad():  # stands in for an adapter trained earlier
        for name, param in senior.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    initial = _logits(senior)
    bare_base = _initial(tiny_model_dirs[0])
    assert (initial - bare_base).abs().max() > 1e-2, "the adapter changes the model"
    trainer = _train(tmp_path, senior)
    assert trainer._junior_context is None and trainer.junior is not None
    trainer.train()
    _assert_frozen(trainer, initial, initial)
