"""The one place where tandem-grpo adapts to the TRL and transformers versions it runs on.

- TRL: [`TandemGRPOTrainer`][tandem_grpo.TandemGRPOTrainer] overrides private methods of ``trl.GRPOTrainer``
  (``_generate``, ``_generate_single_turn``, ``_generate_and_score_completions``, ``_compute_loss``,
  ``_get_per_token_logps_and_entropies``), so it runs only on the TRL minor series it was tested with
  (``TESTED_TRL``, the same range as ``pyproject.toml``); [`check_trl_version`][tandem_grpo._compat.check_trl_version]
  refuses any other at construction. ``tests/test_trainer.py::test_overridden_trl_internals_have_the_expected_shape``
  is the checklist for adopting the next TRL minor.
- transformers 5.24 renamed the ``past_key_values`` argument of model forwards to ``cache`` (the old name warns on
  every call): [`cache_kwarg`][tandem_grpo._compat.cache_kwarg] picks the name a model's forward declares.
- transformers 5.23 renamed ``gradient_checkpointing_*`` to ``activation_checkpointing_*``; TRL 1.16 still calls
  the old names around every rollout: [`silence_trl_deprecations`][tandem_grpo._compat.silence_trl_deprecations].

``tests/test_compat.py`` fails when any of these upstream facts changes.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
import re
import warnings

import torch

__all__ = ["TESTED_TRL", "cache_kwarg", "check_trl_version", "silence_trl_deprecations"]

TESTED_TRL = (">=1.16.0", "<1.17")
"""The TRL range the trainer is tested with; ``pyproject.toml`` pins the same range (a test checks they agree)."""

UNTESTED_TRL_VARIABLE = "TANDEM_GRPO_ALLOW_UNTESTED_TRL"
"""Set to 1 to construct the trainer on a TRL outside ``TESTED_TRL`` (to adopt a new TRL minor: see the README)."""


def _release(version: str) -> tuple[int, ...]:
    """``"1.17.0.dev0"`` -> ``(1, 17, 0)``: the leading digits of the first three fields."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        match = re.match(r"\d+", piece)
        parts.append(int(match.group()) if match else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def trl_range_text() -> str:
    return ",".join(TESTED_TRL)


def trl_is_tested(version: str) -> bool:
    low, high = (_release(bound.lstrip("<>=")) for bound in TESTED_TRL)
    return low <= _release(version) < high


def check_trl_version(version: str | None = None) -> None:
    """Refuse a TRL outside the tested range, with one line that names the range and the fix.

    Called when a [`TandemGRPOTrainer`][tandem_grpo.TandemGRPOTrainer] is built, so that an untested TRL fails there
    and not with an ``AttributeError`` inside a training step. ``TANDEM_GRPO_ALLOW_UNTESTED_TRL=1`` skips the check.

    Raises:
        RuntimeError: the installed TRL is outside ``TESTED_TRL``.
    """
    if version is None:
        version = importlib.metadata.version("trl")
    if trl_is_tested(version) or os.environ.get(UNTESTED_TRL_VARIABLE, "").strip() in ("1", "true", "yes"):
        return
    raise RuntimeError(
        f"TandemGRPOTrainer: trl {version} is installed, but tandem-grpo overrides private GRPOTrainer methods and is "
        f"tested with trl{trl_range_text()} only. Install it with `pip install 'trl{trl_range_text()}'` (or set "
        f"{UNTESTED_TRL_VARIABLE}=1 to try this TRL at your own risk)."
    )


def _innermost(model: torch.nn.Module) -> torch.nn.Module:
    """The model class whose forward finally runs: through DeepSpeed/DDP/FSDP1 wrappers (``.module``) and PEFT
    (``get_base_model()``)."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
            continue
        if callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
    return model


@functools.lru_cache(maxsize=64)
def _declared_cache_kwarg(cls: type) -> str:
    forward = getattr(cls, "forward", None)  # a plain callable wrapper has none: the old name works everywhere
    try:
        params = inspect.signature(forward).parameters  # follows `deprecate_kwarg`'s functools.wraps
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword under which ``model``'s forward takes its KV cache: ``"cache"`` where the model class declares it
    (transformers >= 5.24, whose forwards warn on ``past_key_values``), else ``"past_key_values"``."""
    return _declared_cache_kwarg(type(_innermost(model)))


TRL_DEPRECATED_CALLS = (
    r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated"
)
"""The transformers (>= 5.23) deprecation messages that TRL 1.16 triggers around every rollout."""


def silence_trl_deprecations() -> None:
    """Ignore the ``TRL_DEPRECATED_CALLS`` FutureWarnings, which TRL 1.16's ``disable_gradient_checkpointing`` and
    ``unwrap_model_for_generation`` trigger at every step and a user cannot act on (TRL's to fix).

    One ``"ignore"`` filter, added once per process and never removed (changing filters every step would reset the
    "shown once" registries); filters added later take precedence. No-op on transformers < 5.23.
    """
    from transformers import PreTrainedModel

    if not hasattr(PreTrainedModel, "activation_checkpointing_enable"):
        return
    for action, message, category, *_ in warnings.filters:
        if (
            action == "ignore"
            and category is FutureWarning
            and getattr(message, "pattern", None) == TRL_DEPRECATED_CALLS
        ):
            return
    warnings.filterwarnings("ignore", message=TRL_DEPRECATED_CALLS, category=FutureWarning)
