"""What every backend must agree on when it samples a tandem completion: the sampling settings, the truncation of
the mixture, the EOS ids and the seeds. The transformers loop, the vLLM logits processor, the vLLM client and the
evaluation suite all take them from here. ``temperature`` and ``repetition_penalty`` act on each model's logits
before mixing; ``top_k``, ``top_p``, ``min_p`` truncate the mixture (docs/method.md, "Sampling"). The settings a
trainer's ``generation_kwargs`` ask for are read here too
([`sampling_from_generation_kwargs`][tandem_grpo.sampling.sampling_from_generation_kwargs]).
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from dataclasses import dataclass

import torch


def derive_seed(base: int, *parts: object) -> int:
    """A 63-bit seed from a base seed and a stream's coordinates: BLAKE2b (8 bytes) of ``repr((int(base), *parts))``,
    so nearby coordinates give unrelated seeds. The package's one seed function (training and evaluation).

    Args:
        base: the run's seed (any int).
        *parts: the stream's coordinates, e.g. ``("coin", row)`` or a model path and a batch index; ints, strings
            and tuples of them.

    Returns:
        An int in ``[0, 2**63)``; coin seeds keep its low 31 bits.
    """
    # numpy/torch integers repr differently from ints.
    parts = tuple(int(p) if isinstance(p, numbers.Integral) and not isinstance(p, bool) else p for p in parts)
    text = repr((int(base), *parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


_STREAMS = ("coins", "tokens")
_MODES = ("train", "eval")
COIN_SEED_MASK = 0x7FFFFFFF
"""Coin seeds keep the low 31 bits of a seed: a non-negative int32 on every backend."""


def rollout_seed(
    run_seed: int,
    stream: str,
    mode: str,
    global_step: int,
    process_index: int,
    call_index: int,
    position: int = 0,
) -> int:
    """The seed of one random stream of a rollout, a pure function of its coordinates (so a resumed run draws what
    the uninterrupted run drew).

    Args:
        run_seed: ``TrainingArguments.seed``.
        stream: ``"coins"`` (a completion's handoff coins) or ``"tokens"`` (a generation call's token draws).
        mode: ``"train"`` or ``"eval"``.
        global_step: optimizer steps completed when the rollout is generated.
        process_index: the accelerate process (rank).
        call_index: the generation call within the step and mode.
        position: the completion's row in this process's generation batch (default ``0``, the token stream).

    Returns:
        [`derive_seed`][tandem_grpo.sampling.derive_seed] of ``(run_seed, "rollout", *coordinates)``, in
        ``[0, 2**63)``.

    Raises:
        ValueError: an unknown ``stream`` or ``mode``.
    """
    if stream not in _STREAMS or mode not in _MODES:
        raise ValueError(f"stream must be one of {_STREAMS} and mode one of {_MODES}; got {stream!r}, {mode!r}.")
    coordinates = (stream, mode, int(global_step), int(process_index), int(call_index), int(position))
    return derive_seed(run_seed, "rollout", *coordinates)


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling settings with the names, meanings and defaults of TRL's ``GRPOConfig``; ``None`` ``top_k``/``min_p``
    is stored as 0.

    Attributes:
        temperature: softmax temperature of each model, ``> 0`` (default 1.0; tandem rollouts always sample).
        top_p: nucleus mass in (0, 1] kept of the mixture (default 1.0 = off).
        top_k: most likely mixture tokens kept, ``>= 0`` (default 0 = off).
        min_p: drop mixture tokens below ``min_p`` times the most likely one's probability, in [0, 1] (default 0.0
            = off).
        repetition_penalty: ``> 0`` (default 1.0 = off), applied to each model's logits.

    Raises:
        ValueError: a value outside its range; the message starts with ``field=value``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.top_k is None:
            object.__setattr__(self, "top_k", 0)
        if self.min_p is None:
            object.__setattr__(self, "min_p", 0.0)
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r} must be > 0: tandem rollouts sample, never greedily.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1] (1 turns it off).")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0 turns it off).")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p={self.min_p!r} must be in [0, 1] (0 turns it off).")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r} must be > 0 (1 turns it off).")

    @classmethod
    def from_config(cls, config) -> SamplingSettings:
        """The settings of any object with TRL's five sampling attributes (``GRPOConfig``, ``GRPOTrainer``, ...);
        ``ValueError`` as the constructor."""
        return cls(**{name: getattr(config, name) for name in SAMPLING_FIELDS})

    def truncate(self, logprobs: torch.Tensor) -> torch.Tensor:
        """[`truncate_logprobs`][tandem_grpo.sampling.truncate_logprobs] with these settings, ``[B, V]``."""
        return truncate_logprobs(logprobs, self.top_k, self.top_p, self.min_p)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingSettings))
"""The names of the [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings] fields (TRL's ``GRPOConfig`` names)."""


def _per_row(value: float | int | torch.Tensor, rows: int, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.broadcast_to(torch.as_tensor(value, device=like.device).to(dtype), (rows,))


def _is_number(value) -> bool:
    return not isinstance(value, torch.Tensor)


def _on(value, active) -> bool:
    """Whether a setting acts on some row (a Python number: no sync; a per-row tensor: one sync)."""
    if _is_number(value):
        return bool(active(value))
    return bool(active(value).any())


def truncate_logprobs(
    logprobs: torch.Tensor,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """Truncate each row with top-k, then top-p, then min-p, as transformers' ``TopKLogitsWarper``,
    ``TopPLogitsWarper``, ``MinPLogitsWarper`` (top-k keeps ties; the most likely token always stays). The one
    truncation of the tandem mixture, in every backend.

    Args:
        logprobs: float ``[B, V]`` log-probabilities (``-inf`` where a token is impossible).
        top_k: int, or long ``[B]`` per row; 0 (default) = off.
        top_p: float, or float ``[B]`` per row; 1.0 (default) = off.
        min_p: float, or float ``[B]`` per row; 0.0 (default) = off.

    Returns:
        float ``[B, V]``: normalized log-probabilities of the truncated distribution, ``-inf`` on dropped tokens.
    """
    return torch.log_softmax(_masked(logprobs, top_k, top_p, min_p), dim=-1)


def truncate_with_kept_mass(
    logprobs: torch.Tensor,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[`truncate_logprobs`][tandem_grpo.sampling.truncate_logprobs] and ``log Z``, float ``[B]``: the log of the
    mass ``logprobs`` (normalized) puts on the tokens the truncation keeps; ``None`` when no setting is on (``Z = 1``).
    A kept token's truncated log-probability plus ``log Z`` is its log-probability over the whole vocabulary."""
    masked = _masked(logprobs, top_k, top_p, min_p)
    kept = None if masked is logprobs else torch.logsumexp(masked, dim=-1)
    return torch.log_softmax(masked, dim=-1), kept


def vocabulary_mass(scaled: torch.Tensor, width: int) -> torch.Tensor | None:
    """``log M``, float ``[g]``: the log of the mass the senior's distribution over all ``W`` columns of its scaled
    logits ``[g, W]`` puts on the first ``width`` ids; ``None`` where ``W == width`` (no padding: ``M = 1``). One
    ``logsumexp`` over each row, on padded checkpoints only."""
    if scaled.shape[-1] <= width:
        return None
    return torch.logsumexp(scaled[:, :width], dim=-1) - torch.logsumexp(scaled, dim=-1)


def _masked(logprobs: torch.Tensor, top_k, top_p, min_p) -> torch.Tensor:
    """``logprobs`` with ``-inf`` on the tokens the truncation drops, not renormalized (``logprobs`` itself, the same
    object, when no setting is on)."""
    rows, width = logprobs.shape
    out = logprobs
    if _on(top_k, lambda k: (k > 0) & (k < width)):
        k = _per_row(top_k, rows, out, torch.long)
        use_k = (k > 0) & (k < width)
        largest = out.topk(int(top_k) if _is_number(top_k) else int(k[use_k].max()), dim=-1).values
        kth = largest.gather(1, (k.clamp(1, largest.shape[-1]) - 1).unsqueeze(1))
        out = out.masked_fill(use_k.unsqueeze(1) & (out < kth), float("-inf"))
    if _on(top_p, lambda p: p < 1.0):
        p = _per_row(top_p, rows, out, out.dtype)
        use_p = p < 1.0
        ascending, order = out.sort(dim=-1)
        mass_below = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = mass_below <= (1.0 - p).unsqueeze(1)
        drop[:, -1] = False
        drop = drop.scatter(1, order, drop)
        out = out.masked_fill(use_p.unsqueeze(1) & drop, float("-inf"))
    if _on(min_p, lambda m: m > 0.0):
        m = _per_row(min_p, rows, out, out.dtype)
        use_m = m > 0.0
        threshold = out.amax(dim=-1, keepdim=True) + torch.log(m.clamp(min=1e-30)).unsqueeze(1)
        out = out.masked_fill(use_m.unsqueeze(1) & (out < threshold), float("-inf"))
    return out


def default_eos_token_ids(tokenizer, generation_config=None) -> list[int]:
    """EOS ids as TRL's ``GRPOTrainer`` builds ``self.eos_token_ids`` (trl 1.16, ``grpo_trainer.py``): the
    generation config's EOS ids, with the tokenizer's ``eos_token_id`` first when missing. Used by every backend.

    Args:
        tokenizer: has ``eos_token_id`` (may be ``None``).
        generation_config: a ``GenerationConfig`` or ``None``.

    Returns:
        The ids, possibly empty (neither source has one).
    """
    ids = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return [int(i) for i in ids]


# --------------------------------------------------------------- settings from `generate`'s keyword arguments

# Keys of `generate` that change nothing at these values (None: `GenerationConfig`'s "unset").
_INERT = {
    "num_beams": (1,), "num_beam_groups": (1,), "num_return_sequences": (1,), "diversity_penalty": (0.0,),
    "no_repeat_ngram_size": (0,), "encoder_no_repeat_ngram_size": (0,), "typical_p": (1.0,),
    "epsilon_cutoff": (0.0,), "eta_cutoff": (0.0,), "min_new_tokens": (0,), "min_length": (0,),
    "renormalize_logits": (False,), "remove_invalid_values": (False,), "token_healing": (False,),
    "output_attentions": (False,), "output_hidden_states": (False,), "output_scores": (False,),
    "output_logits": (False,), "return_dict_in_generate": (False,), "low_memory": (False,),
    "do_sample": (True,), "use_cache": (True,), "cache_implementation": ("dynamic",),
}  # fmt: skip
# Beam-search settings, inert without beams; and settings about compiling `generate`, which the loop does not use.
_INERT_ALWAYS = ("length_penalty", "early_stopping", "disable_compile", "compile_config", "pad_token_id",
                 "bos_token_id")  # fmt: skip
_WHY = {
    "num_beams": "beam search keeps several hypotheses per completion, while a tandem rollout draws one token at a "
    "time from the two models' mixture",
    "num_beam_groups": "beam search is not a tandem rollout",
    "diversity_penalty": "beam search is not a tandem rollout",
    "num_return_sequences": "GRPOTrainer already repeats each prompt num_generations times",
    "do_sample": "tandem rollouts always sample (a low temperature comes close to greedy)",
    "use_cache": "the loop always decodes with each model's cache",
    "cache_implementation": "the loop builds each model's dynamic cache as generate does by default (set "
    "GRPOConfig.cache_implementation=None)",
}


def _refusal(key: str, value, eos_token_ids: list[int], scoring_temperature: float | None) -> str | None:
    """Why co-generation cannot honour ``generate``'s ``key=value``; ``None`` when it can."""
    if key == "temperature" and None not in (value, scoring_temperature) and value != scoring_temperature:
        return (
            f"the loss scores the senior's log-probabilities at temperature={scoring_temperature} and the exact "
            "tandem gradient needs the rollouts drawn at that temperature (set GRPOConfig.temperature instead)"
        )
    if key == "eos_token_id" and value is not None:
        ids = [value] if isinstance(value, int) else list(value)
        if set(ids) != set(eos_token_ids):
            return f"co-generation ends completions at the trainer's EOS ids {sorted(eos_token_ids)}"
        return None
    if key in SAMPLING_FIELDS or key == "max_new_tokens" or key in _INERT_ALWAYS or value is None:
        return None
    if value in _INERT.get(key, ()):
        return None
    return _WHY.get(
        key, "co-generation honours only temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens"
    )


def sampling_from_generation_kwargs(
    generation_kwargs: dict, eos_token_ids: list[int], scoring_temperature: float | None = None
) -> tuple[SamplingSettings, int | None]:
    """The sampling settings and completion cap co-generation takes from ``generate``'s keyword arguments
    (``GRPOTrainer.generation_kwargs``). Honoured: the five [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings]
    fields and ``max_new_tokens``; accepted: the trainer's ``eos_token_id``, ``pad_token_id``, ``bos_token_id``, the
    compile switches, beam settings without beams, and any key at its "off" value or ``None``.

    Args:
        generation_kwargs: the keyword arguments.
        eos_token_ids: the EOS ids co-generation stops at (the trainer's).
        scoring_temperature: the temperature the loss scores log-probabilities at (``GRPOConfig.temperature``); a
            sampling ``temperature`` that differs is refused, since the exact tandem gradient needs both equal.

    Returns:
        ``(settings, max_new_tokens)``; ``max_new_tokens`` is ``None`` when not given.

    Raises:
        ValueError: the first key co-generation cannot honour (beam search, greedy decoding, several sequences per
            prompt, a static cache, other EOS ids, another temperature, other processors), naming it, why and the fix.
    """
    sampling, cap = {}, None
    for key, value in generation_kwargs.items():
        why = _refusal(key, value, eos_token_ids, scoring_temperature)
        if why is not None:
            raise ValueError(
                f"generation_kwargs[{key!r}]={value!r} cannot be honoured by tandem co-generation: {why}. Remove "
                f"{key!r} from GRPOConfig.generation_kwargs, or keep it with senior-only rollouts "
                "(junior_probability=0 or kl_to_junior=True)."
            )
        if key in SAMPLING_FIELDS and value is not None:
            sampling[key] = value
        elif key == "max_new_tokens" and value is not None:
            cap = int(value)
    try:
        return SamplingSettings(**sampling), cap
    except ValueError as err:
        raise ValueError(f"generation_kwargs: {err}") from err
