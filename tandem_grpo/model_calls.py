"""How co-generation calls its two models at each decode step: as ``generate`` calls one model
([`ModelCall`][tandem_grpo.model_calls.ModelCall]), one KV cache per model, and for a LoRA senior with its base as
junior one forward pass over both models' rows (the mixed-adapter batch). The decode loop itself is
[`tandem_generate`][tandem_grpo.generation.tandem_generate]; it sees only a
[`Forward`][tandem_grpo.model_calls.Forward].
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from ._compat import _innermost, cache_kwarg

_CACHE_NAMES = ("cache", "past_key_values", "cache_params")
"""The keywords under which forwards take and return their cache: ``cache`` (transformers >= 5.24),
``past_key_values``, ``cache_params`` (classes named after Mamba)."""


@dataclass(frozen=True)
class ModelCall:
    """How ``generate`` calls one model at every decode step, read from the model's class and config.

    Attributes:
        cache_name: the keyword of the cache (``cache``, ``past_key_values`` or ``cache_params``).
        cache_config: the decoder's text config for ``DynamicCache(config=...)`` (as ``generate``; hybrid models get
            their SSM states); ``None`` for a non-transformers callable (a bare ``DynamicCache()``).
        default_cache: ``False`` where ``generate`` builds no cache up front (``_supports_default_dynamic_cache``).
        flags: constant keyword arguments: ``use_cache=True``; ``logits_to_keep=1`` (or ``num_logits_to_keep``)
            where declared; ``output_router_logits=False`` for a Mixture-of-Experts config with the field (its
            load-balancing loss fails on one-token steps).
        attention_mask: whether the forward takes ``attention_mask``.
        position_ids: whether the forward takes ``position_ids``.
    """

    cache_name: str = "past_key_values"
    cache_config: object | None = None
    default_cache: bool = True
    flags: dict = field(default_factory=lambda: {"use_cache": True, "logits_to_keep": 1})
    attention_mask: bool = True
    position_ids: bool = True

    @classmethod
    def of(cls, model) -> ModelCall:
        """The call of ``model`` (through DeepSpeed/DDP/FSDP1 wrappers and PEFT); a callable that is not a
        transformers model gets the defaults, under the cache name `tandem_grpo._compat.cache_kwarg` picks."""
        inner = _innermost(model)
        config = getattr(inner, "config", None)
        try:
            params = inspect.signature(type(inner).forward).parameters
        except (AttributeError, TypeError, ValueError):
            params = None
        if config is None or params is None or not hasattr(config, "get_text_config"):
            return cls(cache_name=cache_kwarg(model))
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        text = config.get_text_config(decoder=True)
        flags = {"use_cache": True}
        for keep in ("logits_to_keep", "num_logits_to_keep"):
            if keep in params:
                flags[keep] = 1
                break
        if hasattr(text, "output_router_logits") and ("output_router_logits" in params or takes_any):
            flags["output_router_logits"] = False
        name = cache_kwarg(model)
        if name not in params and "cache_params" in params:
            name = "cache_params"
        default = getattr(type(inner), "_supports_default_dynamic_cache", None)
        return cls(
            cache_name=name,
            cache_config=text,
            default_cache=bool(default()) if callable(default) else True,
            flags=flags,
            attention_mask="attention_mask" in params,
            position_ids="position_ids" in params,
        )

    def new_cache(self):
        """A fresh cache for one generation call (``None`` where the model builds its own)."""
        if not self.default_cache:
            return None
        return DynamicCache() if self.cache_config is None else DynamicCache(config=self.cache_config)


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(ids [B, S], attention_mask [B, L], position_ids [B, S]) -> (senior logits [B, V_s], junior logits [B, V_j])``
at the last position, each model reading and extending its own KV cache."""


@contextlib.contextmanager
def co_generation_forward(
    senior: PreTrainedModel,
    junior: PreTrainedModel | None,
    rows: int,
    junior_context: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> Iterator[Forward]:
    """The [`Forward`][tandem_grpo.model_calls.Forward] of one generation call, with fresh KV caches.

    Args:
        senior: causal LM; only read.
        junior: causal LM. ``None``: the base of a PEFT ``senior``: one pass over ``2 * rows`` rows where
            [`mixed_adapter_batches`][tandem_grpo.model_calls.mixed_adapter_batches] (the senior in eval mode
            meanwhile, its mode restored on exit), else two passes, the second under ``senior.disable_adapter``.
        rows: ``B``, the rows of every call of the forward.
        junior_context: entered around every junior forward of two passes (default: nothing); ignored when
            ``junior`` is ``None``.

    Yields:
        The forward; valid only inside the ``with`` block.

    Raises:
        ValueError: a model is a PEFT prompt-learning model
            ([`check_co_generation_model`][tandem_grpo.model_calls.check_co_generation_model]), or ``junior`` is
            ``None`` and ``senior`` is not a PEFT model.
    """
    for model in (senior, junior):
        check_co_generation_model(model)
    if junior is not None:
        yield _two_models(senior, junior, junior_context or contextlib.nullcontext)
    elif mixed_adapter_batches(senior):
        with _senior_and_base(senior, rows) as forward:
            yield forward
    elif hasattr(senior, "disable_adapter"):
        yield _two_models(senior, senior, senior.disable_adapter)
    else:
        raise ValueError(
            "`junior=None` means the base of a PEFT senior, but the senior is not a PEFT model: pass the junior "
            "model, or wrap the senior with `peft.get_peft_model` to use its base as the junior."
        )


def _stepper(model: PreTrainedModel) -> Callable[..., torch.Tensor]:
    """``(ids, attention_mask, position_ids) -> float [B, V]`` last-position logits, extending the model's own cache
    ([`ModelCall`][tandem_grpo.model_calls.ModelCall])."""
    call = ModelCall.of(model)
    cache = [call.new_cache()]

    def step(ids, attention_mask, position_ids) -> torch.Tensor:
        inputs = {"input_ids": ids, call.cache_name: cache[0], **call.flags}
        if call.attention_mask:
            inputs["attention_mask"] = attention_mask
        if call.position_ids:
            inputs["position_ids"] = position_ids
        out = model(**inputs)
        # As generate's `_update_model_kwargs_for_generation`: the next call gets the cache the model returned.
        returned = next((getattr(out, n, None) for n in _CACHE_NAMES if getattr(out, n, None) is not None), None)
        if returned is not None:
            cache[0] = returned
        return out.logits[:, -1, :].float()

    return step


def _two_models(senior, junior, junior_context: Callable[[], contextlib.AbstractContextManager]) -> Forward:
    """Two forward passes per step, one KV cache per model."""
    senior_step, junior_step = _stepper(senior), _stepper(junior)

    def forward(ids, attention_mask, position_ids):
        senior_logits = senior_step(ids, attention_mask, position_ids)
        with junior_context():
            junior_logits = junior_step(ids, attention_mask, position_ids)
        return senior_logits, junior_logits

    return forward


@contextlib.contextmanager
def _senior_and_base(senior, rows: int) -> Iterator[Forward]:
    """One forward pass per step over ``2 * rows`` rows (senior's, then the junior's), one KV cache, eval mode: a
    hook zeroes ``lora_B``'s output on the junior's rows, so they compute the base exactly (PEFT ``lora/layer.py``:
    the update is ``lora_B(lora_A(dropout(x))) * scaling``). PEFT's mixed-adapter batch in effect, without its
    gather/scatter (speed: docs/speed.md, LoRA).
    """
    weight = next(senior.parameters())
    senior_rows = torch.cat([torch.ones(rows), torch.zeros(rows)]).to(weight.device, weight.dtype)

    def senior_rows_only(module, args, output):
        # Under autocast the output may be in another dtype than the weights: keep the output's.
        scale = senior_rows if output.dtype == senior_rows.dtype else senior_rows.to(output.dtype)
        return output * scale.view(-1, *([1] * (output.dim() - 1)))

    step = _stepper(senior)

    def forward(ids, attention_mask, position_ids):
        logits = step(*(torch.cat([x, x]) for x in (ids, attention_mask, position_ids)))
        return logits[:rows], logits[rows:]

    was_training = senior.training
    handles = [module.register_forward_hook(senior_rows_only) for module in _lora_b_modules(senior)]
    senior.eval()
    try:
        yield forward
    finally:
        for handle in handles:
            handle.remove()
        senior.train(was_training)


def _lora_b_modules(model) -> list[torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter
    return [
        layer.lora_B[adapter] for layer in model.modules() if isinstance(layer, LoraLayer) and adapter in layer.lora_B
    ]


def mixed_adapter_batches(model) -> bool:
    """Whether ``model`` can run as senior and, adapter disabled, as junior in one forward pass: PEFT LoRA with one
    active, unmerged adapter on linear and convolution layers only (no DoRA or other variant, no embeddings, no
    ``target_parameters``, no quantized layers)."""
    from accelerate.utils import is_peft_model

    if not is_peft_model(model) or len(model.active_adapters) != 1:
        return False
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import Linear, _ConvNd

    adapter = model.active_adapter
    layers = [layer for layer in model.modules() if isinstance(layer, LoraLayer)]
    return bool(_lora_b_modules(model)) and not any(
        layer.merged
        or adapter in layer.lora_variant
        or adapter in layer.lora_embedding_A
        or (adapter in layer.lora_A and adapter not in layer.lora_B)
        or (adapter in layer.lora_B and not isinstance(layer, (Linear, _ConvNd)))
        for layer in layers
    )


def check_co_generation_model(model) -> None:
    """Refuse a PEFT prompt-learning model (prompt/prefix/P-tuning: its forward prepends virtual tokens at every
    call, so only its own ``generate`` decodes it); ``None`` and any other model pass.

    Raises:
        ValueError: naming the PEFT method and the fix.
    """
    config = getattr(model, "active_peft_config", None)
    if config is not None and getattr(config, "is_prompt_learning", False):
        method = getattr(config.peft_type, "value", config.peft_type)
        raise ValueError(
            f"Tandem co-generation does not support PEFT prompt-learning models ({method}): their forward prepends "
            "virtual tokens at every call, which the step-by-step co-generation cannot decode. Use LoRA (or another "
            "adapter on weights), or senior-only rollouts (junior_probability=0 or kl_to_junior=True)."
        )
