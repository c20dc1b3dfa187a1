"""The version shims of ``tandem_grpo._compat`` against the installed TRL and transformers.

CI runs this module in both of its environments (marker ``versions``): with vLLM (the transformers vLLM pins) and
without it (the newest transformers the package's range allows). Each test fails when the upstream fact its shim
relies on changes.
"""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import pytest
import transformers
from conftest import build_tiny_model, build_tiny_tokenizer, tiny_prompts, tiny_tandem_config
from packaging.version import Version

from tandem_grpo import _compat
from tandem_grpo._compat import TESTED_TRL, TRL_DEPRECATED_CALLS, cache_kwarg, check_trl_version

pytestmark = pytest.mark.versions

ROOT = Path(__file__).resolve().parents[1]
NEW_TRANSFORMERS = Version(transformers.__version__) >= Version("5.24.0")


def test_cache_kwarg_is_the_name_the_installed_forward_takes():
    import torch
    from peft import LoraConfig, get_peft_model

    model = build_tiny_model(0)
    assert cache_kwarg(model) == ("cache" if NEW_TRANSFORMERS else "past_key_values")
    lora = get_peft_model(build_tiny_model(0), LoraConfig(r=2, target_modules=["q_proj"]))
    assert cache_kwarg(lora) == cache_kwarg(model), "PEFT's forward passes the cache on to the base model's"
    ids = torch.tensor([[2, 3, 4]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the name chosen must not be a deprecated one
        out = model(input_ids=ids, use_cache=True, **{cache_kwarg(model): transformers.DynamicCache()})
        lora(input_ids=ids, use_cache=True, **{cache_kwarg(lora): transformers.DynamicCache()})
    assert out.logits.shape == (1, 3, model.config.vocab_size)


def test_a_few_tandem_steps_raise_no_future_warning(tmp_path):
    """A FutureWarning at every step (``past_key_values`` from our decode loop, TRL's gradient-checkpointing calls)
    fails here on transformers >= 5.24; TRL's reference rollouts, tandem rollouts, loss and optimizer step all run."""
    from tandem_grpo import TandemGRPOTrainer

    tok = build_tiny_tokenizer()
    folders = []
    for name, seed in (("senior", 0), ("junior", 1)):
        build_tiny_model(seed).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        folders.append(str(tmp_path / name))
    # Built outside: on transformers >= 5.23 TRL's GRPOConfig default `gradient_checkpointing=True` warns once, when
    # a config is built (TRL's warning, not a per-step one).
    args = tiny_tandem_config(tmp_path / "out", max_steps=2, beta=0.02, junior_model_name_or_path=folders[1])
    assert args.gradient_checkpointing, "TRL's default: its per-step calls must be exercised"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        trainer = TandemGRPOTrainer(
            model=folders[0],
            reward_funcs=lambda completions, **kwargs: [float(len(c)) for c in completions],
            args=args,
            train_dataset=tiny_prompts(),
            processing_class=tok,
        )
        trainer.train()
    assert trainer.state.global_step == 2
    assert any("tandem/senior_token_fraction" in row for row in trainer.state.log_history), "tandem rollouts ran"


def test_trl_still_calls_the_deprecated_checkpointing_names():
    """``silence_trl_deprecations`` exists for these calls: when TRL stops making them, delete the filter."""
    from trl.models import utils

    assert "model.is_gradient_checkpointing" in inspect.getsource(utils.disable_gradient_checkpointing)
    assert "unwrapped_model.is_gradient_checkpointing" in inspect.getsource(utils._unwrap_model_for_generation)
    if not hasattr(transformers.PreTrainedModel, "activation_checkpointing_enable"):
        return
    model = build_tiny_model(0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.is_gradient_checkpointing  # noqa: B018
        model.gradient_checkpointing_disable()
    messages = [str(w.message) for w in seen if w.category is FutureWarning]
    assert len(messages) == 2 and all(re.match(TRL_DEPRECATED_CALLS, m, re.I) for m in messages), messages


def test_untested_trl_is_refused_at_construction_with_the_range(monkeypatch, tmp_path):
    check_trl_version("1.16.0")
    check_trl_version("1.16.9")
    for version in ("1.17.0", "1.17.0.dev0", "1.15.2", "2.0.0"):
        with pytest.raises(RuntimeError, match=r"trl>=1\.16\.0,<1\.17.*pip install 'trl>=1\.16\.0,<1\.17'"):
            check_trl_version(version)
    monkeypatch.setenv(_compat.UNTESTED_TRL_VARIABLE, "1")
    check_trl_version("1.17.0")
    monkeypatch.delenv(_compat.UNTESTED_TRL_VARIABLE)

    import importlib.metadata

    from tandem_grpo import TandemGRPOTrainer

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.17.0" if name == "trl" else real(name))
    with pytest.raises(RuntimeError, match=r"^TandemGRPOTrainer: trl 1\.17\.0 is installed"):
        TandemGRPOTrainer(model="unused", args=tiny_tandem_config(tmp_path / "out"))


def test_pyproject_pins_the_tested_trl_range():
    pins = re.findall(r'^\s*"(trl[^"]*)",$', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert pins == ["trl" + ",".join(TESTED_TRL)]
