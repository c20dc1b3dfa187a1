"""Faults that say what happened: reward outputs, junior positions that cannot poison the loss, non-finite losses,
logits and weights (tiny random models, fast)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from conftest import build_tiny_tokenizer, tiny_prompts, tiny_tandem_config
from trl import GRPOTrainer

from tandem_grpo import TandemGRPOTrainer
from tandem_grpo.guards import check_reward_output, checked_reward_func


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _trainer(tmp_path, model_dir, reward=length_reward, **overrides) -> TandemGRPOTrainer:
    return TandemGRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=tiny_tandem_config(tmp_path / "out", **overrides),
        train_dataset=tiny_prompts(),
        processing_class=build_tiny_tokenizer(),
    )


def _rollout(trainer):
    trainer.model.train()
    return trainer._generate_and_score_completions([{"prompt": "ab c"}] * 4)


# ------------------------------------------------------------------ rewards


def one_float(completions, **kwargs):
    return 1.0


def too_few(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def has_inf(completions, **kwargs):
    return [1.0, math.inf] + [0.0] * (len(completions) - 2)


def has_text(completions, **kwargs):
    return ["1"] * len(completions)


def raises(completions, **kwargs):
    raise KeyError("answer")


@pytest.mark.parametrize(
    ("reward", "error", "message"),
    [
        (one_float, TypeError, r"'one_float' returned float 1\.0; it must return a list of 4 numbers"),
        (too_few, ValueError, r"'too_few' returned 3 values for 4 completions"),
        (has_inf, ValueError, r"'has_inf' returned inf for completion 1"),
        (has_text, TypeError, r"'has_text' returned str '1' for completion 0"),
    ],
)
def test_bad_reward_output_names_the_function_and_what_it_returned(tmp_path, tiny_model_dirs, reward, error, message):
    trainer = _trainer(tmp_path, tiny_model_dirs[0], reward=[length_reward, reward])
    assert trainer.reward_func_names == ["length_reward", reward.__name__]  # TRL's names survive the wrapper
    with pytest.raises(error, match=message):
        _rollout(trainer)


def test_a_raising_reward_says_which_function_raised(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0], reward=raises)
    with pytest.raises(KeyError) as info:
        _rollout(trainer)
    if hasattr(info.value, "__notes__"):
        assert "reward function 'raises' on a batch of 4 completions" in info.value.__notes__[0]


def test_none_and_nan_mean_does_not_apply_as_in_trl():
    assert check_reward_output([None, 1, 2.5], "r", 3) == [None, 1, 2.5]
    out = check_reward_output(torch.tensor([float("nan"), 1.0]), "r", 2)
    assert math.isnan(out[0]) and out[1] == 1.0
    with pytest.raises(TypeError, match="bool"):
        check_reward_output([True], "r", 1)


def test_async_reward_functions_stay_async_and_are_checked():
    async def async_reward(completions, **kwargs):
        return 2.0

    wrapped = checked_reward_func(async_reward)
    from trl.trainer.utils import is_async_callable

    assert is_async_callable(wrapped) and wrapped.__name__ == "async_reward"
    with pytest.raises(TypeError, match="'async_reward' returned float 2.0"):
        asyncio.run(wrapped(prompts=["p"], completions=["c"]))


# ------------------------------------------------------- junior positions in the loss

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def _loss_and_grad(trainer, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return loss.detach(), grad.clone()


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_junior_positions_contribute_exactly_zero_whatever_their_values(tmp_path, tiny_model_dirs, loss_type):
    trainer = _trainer(tmp_path, tiny_model_dirs[0], loss_type=loss_type, beta=0.1, epsilon=10.0)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this test does not run
    inputs = _rollout(trainer)
    junior = inputs["completion_mask"].bool() & (inputs["tool_mask"] < 1)
    assert junior.any() and inputs["advantages"].abs().sum() > 0
    torch.manual_seed(0)
    inputs["old_per_token_logps"] = -torch.rand(inputs["completion_ids"].shape)
    base_loss, base_grad = _loss_and_grad(trainer, inputs)
    assert torch.isfinite(base_loss)

    poisoned = dict(inputs)
    poisoned["old_per_token_logps"] = inputs["old_per_token_logps"] + 100.0 * junior
    poisoned["ref_per_token_logps"] = torch.where(junior, float("-inf"), inputs["ref_per_token_logps"])
    loss, grad = _loss_and_grad(trainer, poisoned)
    assert torch.equal(loss, base_loss), f"{loss_type}: junior positions changed the loss"
    torch.testing.assert_close(grad, base_grad)

    # The fault this guards against: TRL's own loss, which multiplies by the mask, turns the same batch into NaN.
    trl_loss = GRPOTrainer._compute_loss(trainer, trainer.model, poisoned)
    assert not torch.isfinite(trl_loss)


# ------------------------------------------------------- non-finite values stop the run


def test_nan_senior_logits_are_reported_at_the_rollout_naming_the_senior(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0])
    with torch.no_grad():
        trainer.model.model.embed_tokens.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"Optimizer step 1, rollout: The senior's logits are not finite"):
        _rollout(trainer)


def test_nan_junior_logits_are_reported_naming_the_junior(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0], junior_model_name_or_path=tiny_model_dirs[1])
    with torch.no_grad():
        trainer.junior.model.embed_tokens.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"The junior's logits are not finite.*junior is frozen"):
        _rollout(trainer)


def _corrupt_old_logps_of_senior_tokens(trainer):
    """Fault injection: old log-probs of -1e30 at the senior's own tokens (finite, but the ratio overflows)."""
    original = trainer._generate_and_score_completions

    def corrupted(inputs):
        out = original(inputs)
        senior = out["completion_mask"].bool() & (out["tool_mask"] == 1)
        old = out.get("old_per_token_logps")
        old = torch.zeros(senior.shape) if old is None else old
        out["old_per_token_logps"] = torch.where(senior, torch.tensor(-1e30), old)
        out["advantages"] = -out["advantages"].abs() - 1.0  # negative: -min(inf * A, clip * A) is +inf
        return out

    trainer._generate_and_score_completions = corrupted


def test_a_non_finite_loss_stops_training_before_the_optimizer_step(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0], max_steps=2)
    _corrupt_old_logps_of_senior_tokens(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(FloatingPointError, match=r"Optimizer step 1: the senior's loss is inf.*weights .* unchanged"):
        trainer.train()
    for old, new in zip(before, trainer.model.parameters(), strict=True):
        assert torch.equal(old, new.detach()), "the optimizer must not have applied non-finite gradients"
    assert not [h for h in trainer.state.log_history if "loss" in h], "no loss may be logged (as 0 or otherwise)"


def test_nan_logits_in_the_loss_forward_are_reported_before_the_loss(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0])

    def nan_when_training(module, args, output):
        # Rollouts run without grad: only the loss forward gets NaN hidden states, hence NaN logits.
        return torch.full_like(output, float("nan")) if torch.is_grad_enabled() else output

    trainer.model.model.embed_tokens.register_forward_hook(nan_when_training)
    with pytest.raises(FloatingPointError, match=r"Optimizer step 1, loss: the senior's log-probabilities .* NaN"):
        trainer.train()


def test_no_checkpoint_is_written_from_non_finite_weights(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0])
    trainer.state.global_step = 3
    with torch.no_grad():
        next(trainer.model.parameters())[0].fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="not writing a checkpoint"):
        trainer._save_checkpoint(trainer.model, None)
    assert not (tmp_path / "out" / "checkpoint-3").exists()


def slow_math_reward(completions, **kwargs):
    from tandem_grpo.rewards import is_correct

    # One answer per batch whose verification never finishes within its limit (the example).
    first = is_correct("\\boxed{(9999!)^{9999}}", "5", verify_timeout=0.5)
    return [float(first)] + [0.0] * (len(completions) - 1)


def test_verification_timeouts_are_counted_in_the_logs(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0], reward=slow_math_reward, max_steps=2)
    trainer.train()
    logged = [h["rewards/verify_timeouts"] for h in trainer.state.log_history if "rewards/verify_timeouts" in h]
    assert logged == [1.0, 1.0]


def test_verification_timeouts_are_not_logged_without_a_math_verify_reward(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs[0], max_steps=1)  # length_reward: no answer is verified
    trainer.train()
    assert trainer.state.log_history and not [h for h in trainer.state.log_history if "rewards/verify_timeouts" in h]
