"""Tandem co-generation on the transformers path: one batched decode loop, one forward pass of each model per step
(or one over both for a LoRA senior with its base as junior), tokens drawn from the mixture of
[`tandem_grpo.handoff`][tandem_grpo.handoff].
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
)

from ._compat import _innermost, cache_kwarg
from .handoff import (
    BoundaryTables,
    HandoffRule,
    HandoffState,
    HandoffTrace,
    advance,
    boundary_coefficients,
    boundary_mask,
    init_state,
    mixture_logprobs,
)
from .rollout import Rollout
from .sampling import SamplingSettings


def _per_model_steps(sampling: SamplingSettings) -> LogitsProcessorList:
    # transformers' own processors, so that a self-paired tandem samples exactly like ``model.generate``.
    steps = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        steps.append(RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty))
    if sampling.temperature != 1.0:
        steps.append(TemperatureLogitsWarper(sampling.temperature))
    return steps


def next_token_logprobs(
    senior_logits: torch.Tensor,
    junior_logits: torch.Tensor,
    state: HandoffState,
    tables: BoundaryTables,
    rule: HandoffRule,
    sampling: SamplingSettings,
    history: torch.Tensor,
) -> torch.Tensor:
    """The distribution [`tandem_generate`][tandem_grpo.generation.tandem_generate] draws the next token from: logits
    cut to ``V``, per-model penalty and temperature, [`mixture_logprobs`][tandem_grpo.handoff.mixture_logprobs], then
    [`truncate_logprobs`][tandem_grpo.sampling.truncate_logprobs].

    Args:
        senior_logits: float ``[B, V_s]``, the senior's logits, ``V_s >= V``.
        junior_logits: float ``[B, V_j]``, the junior's logits, ``V_j >= V``.
        state: the rule state before this position.
        tables: the boundary tables; their ``vocab_size`` is ``V``.
        rule: the handoff rule.
        sampling: the sampling settings.
        history: long ``[B, L]``, prompt and completion so far (only the repetition penalty reads it).

    Returns:
        float ``[B, V]``: normalized log-probabilities, ``-inf`` where the token cannot be drawn.
    """
    width = tables.vocab_size
    steps = _per_model_steps(sampling)
    senior_lp = torch.log_softmax(steps(history, senior_logits[:, :width]), dim=-1)
    junior_lp = torch.log_softmax(steps(history, junior_logits[:, :width]), dim=-1)
    return sampling.truncate(mixture_logprobs(senior_lp, junior_lp, state, boundary_mask(state, tables, rule)))


def _all_done_reducer(device: torch.device) -> Callable[[bool], bool]:
    """``done -> every process is done``: one all-reduce (SUM of not-done flags) per call, as transformers'
    ``_has_unfinished_sequences`` under ``synced_gpus``; the local flag alone without a multi-process group."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return bool
    if torch.distributed.get_world_size() < 2:
        return bool

    def all_done(done: bool) -> bool:
        flag = torch.tensor(0.0 if done else 1.0, device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.SUM)
        return flag.item() == 0.0

    return all_done


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


def _stepper(model: PreTrainedModel) -> Callable[..., torch.Tensor]:
    """``(ids, attention_mask, position_ids) -> float [B, V]`` last-position logits, extending the model's own cache
    ([`ModelCall`][tandem_grpo.generation.ModelCall])."""
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


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(ids [B, S], attention_mask [B, L], position_ids [B, S]) -> (senior logits [B, V_s], junior logits [B, V_j])``
at the last position, each model reading and extending its own KV cache."""


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


@torch.no_grad()
def tandem_generate(
    senior: PreTrainedModel,
    junior: PreTrainedModel | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    rule: HandoffRule,
    tables: BoundaryTables | None = None,
    tokenizer=None,
    sampling: SamplingSettings | None = None,
    max_new_tokens: int = 256,
    eos_token_ids: list[int] | None = None,
    pad_token_id: int | None = None,
    seeds: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    junior_context: Callable[[], contextlib.AbstractContextManager] | None = None,
    synced: bool = False,
) -> Rollout:
    """Co-generate completions with a senior and a junior (paper section 3).

    Args:
        senior: causal LM sharing one tokenizer with ``junior``; only read. Logits width ``V_s`` is cut to the
            ``V`` ids of ``tables``.
        junior: causal LM, likewise (width ``V_j``). ``None``: the base of a PEFT ``senior``: one pass over ``2B``
            rows where [`mixed_adapter_batches`][tandem_grpo.generation.mixed_adapter_batches], else two passes,
            the second under ``senior.disable_adapter``.
        input_ids: long ``[B, P]`` left-padded prompts, on the models' device.
        attention_mask: long ``[B, P]``, the mask of ``input_ids``.
        rule: the handoff rule ([`tandem_grpo.handoff`][tandem_grpo.handoff]).
        tables: boundary tables; default
            [`BoundaryTables.from_tokenizer`][tandem_grpo.handoff.BoundaryTables.from_tokenizer] for
            ``min(len(tokenizer), V_s, V_j)`` ids.
        tokenizer: the shared tokenizer; needed when ``tables``, ``eos_token_ids`` or ``pad_token_id`` is omitted.
        sampling: per-model and mixture sampling settings (default: plain sampling at temperature 1).
        max_new_tokens: completion length cap, in tokens.
        eos_token_ids: default: the tokenizer's EOS id.
        pad_token_id: default: the tokenizer's pad id.
        seeds: long ``[B]`` coin-stream seeds (default ``0..B-1``).
        generator: drives the token draws.
        junior_context: entered around every junior forward of the two-pass loop (e.g. ``senior.disable_adapter``).
        synced: step in lockstep with the default ``torch.distributed`` group (as ``generate``'s ``synced_gpus``): a
            done process runs forwards on pad tokens until every process is done, one all-reduce per step. Needed
            when a forward is a collective (ZeRO-3, FSDP); ignored without a group of more than one process.

    Returns:
        A [`Rollout`][tandem_grpo.rollout.Rollout]: completions up to and including the first EOS (at most
        ``max_new_tokens``), authorship, unit starts, ``log p_s(B)`` coefficients and ``seeds``; no log-probs.

    Raises:
        ValueError: a model's logits are narrower than the ``V`` ids of ``tables``, or neither ``tables`` nor
            ``tokenizer`` is given (nor ``eos_token_ids`` and ``pad_token_id``), or ``junior`` is ``None`` and
            ``senior`` is not a PEFT model, or a model is a PEFT prompt-learning model
            ([`check_co_generation_model`][tandem_grpo.generation.check_co_generation_model]).
    """
    sampling = sampling or SamplingSettings()
    device = input_ids.device
    batch = input_ids.shape[0]
    if eos_token_ids is None or pad_token_id is None:
        if tokenizer is None:
            raise ValueError("Pass `eos_token_ids` and `pad_token_id`, or a `tokenizer` to take them from.")
        eos_token_ids = eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id]
        pad_token_id = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
    if tables is None and tokenizer is None:
        raise ValueError("Pass boundary `tables` or a `tokenizer` to build them from.")
    seeds = torch.arange(batch, device=device) if seeds is None else seeds.to(device)
    for model in (senior, junior):
        check_co_generation_model(model)
    with contextlib.ExitStack() as stack:
        if junior is not None:
            forward = _two_models(senior, junior, junior_context or contextlib.nullcontext)
        elif mixed_adapter_batches(senior):
            forward = stack.enter_context(_senior_and_base(senior, batch))
        elif hasattr(senior, "disable_adapter"):
            forward = _two_models(senior, senior, senior.disable_adapter)
        else:
            raise ValueError(
                "`junior=None` means the base of a PEFT senior, but the senior is not a PEFT model: pass the junior "
                "model, or wrap the senior with `peft.get_peft_model` to use its base as the junior."
            )
        return _decode(forward, input_ids, attention_mask, rule, tables, tokenizer, sampling, max_new_tokens,
                       eos_token_ids, pad_token_id, seeds, generator, synced)  # fmt: skip


def _decode(
    forward: Forward,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rule: HandoffRule,
    tables: BoundaryTables | None,
    tokenizer,
    sampling: SamplingSettings,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    seeds: torch.Tensor,
    generator: torch.Generator | None,
    synced: bool,
) -> Rollout:
    device = input_ids.device
    batch = input_ids.shape[0]
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    senior_logits, junior_logits = forward(input_ids, attention_mask, position_ids)
    widths = {"senior": senior_logits.shape[-1], "junior": junior_logits.shape[-1]}
    if tables is None:
        tables = BoundaryTables.from_tokenizer(tokenizer, min(widths.values()), eos_token_ids)
    tables = tables.to(device)
    narrow = {name: width for name, width in widths.items() if width < tables.vocab_size}
    if narrow:
        raise ValueError(
            f"The boundary tables cover {tables.vocab_size} token ids but the logits of {narrow} are narrower: "
            "both models must score every id of the shared tokenizer. Build the tables with "
            "BoundaryTables.from_tokenizer(tokenizer, <narrowest logits width>, eos_token_ids)."
        )
    next_position = position_ids[:, -1:] + 1

    state = init_state(seeds, rule)
    history = input_ids  # only the repetition penalty reads it
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, authors, starts, coefs, alive = [], [], [], [], []
    all_done = _all_done_reducer(device) if synced else bool
    done = max_new_tokens <= 0
    pad_ids = torch.full((batch, 1), pad_token_id, dtype=torch.long, device=device)  # a done process's input
    while True:  # exactly one `all_done` per pass: under `synced` every process makes the same calls
        step_ids = pad_ids
        if not done:
            mixed = next_token_logprobs(senior_logits, junior_logits, state, tables, rule, sampling, history)
            token = torch.multinomial(torch.softmax(mixed, dim=-1), 1, generator=generator).squeeze(1)
            token = torch.where(finished, pad_token_id, token)
            before = state
            state, author, start = advance(state, token, tables, rule)
            tokens.append(token)
            authors.append(author)
            starts.append(start)
            coefs.append(boundary_coefficients(before, author, start, tables, rule))
            alive.append(~finished)
            finished = finished | tables.is_eos[token]
            done = bool(finished.all()) or len(tokens) >= max_new_tokens
            step_ids = token.unsqueeze(1)
            history = torch.cat([history, step_ids], dim=1) if sampling.repetition_penalty != 1.0 else history
        if all_done(done):
            break
        # A process already done only keeps a collective forward in step with the others: pad tokens, output dropped.
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, 1)], dim=1)
        senior_logits, junior_logits = forward(step_ids, attention_mask, next_position)
        next_position = next_position + 1

    seed_list = seeds.tolist()
    if not tokens:
        return Rollout([[] for _ in range(batch)], [[] for _ in range(batch)], [[] for _ in range(batch)],
                       [[] for _ in range(batch)], seed_list)  # fmt: skip
    lengths = torch.stack(alive, dim=1).sum(dim=1).tolist()
    ids = [row[:n] for row, n in zip(torch.stack(tokens, dim=1).tolist(), lengths, strict=True)]
    trace = HandoffTrace(torch.stack(authors, dim=1), torch.stack(starts, dim=1), torch.stack(coefs, dim=1))
    return Rollout.from_trace(ids, trace, seed_list)
