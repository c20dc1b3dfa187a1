"""Solo generation behind a small interface, so a vLLM backend can be added next to the transformers one.

A backend turns token-id prompts into sampled completions for one model. Everything else in the evaluation
(scoring, step schedules, reports) only sees token-id lists, so a backend needs nothing but :meth:`generate`.
Tandem (word-handoff) generation and teacher-forced scoring always run on transformers models
(:func:`tandem_grpo.generation.tandem_generate`), whatever the backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

BACKENDS = ("transformers",)
PLANNED_BACKENDS = ("vllm",)


@dataclass(frozen=True)
class GenerationSettings:
    """How completions are sampled (the meaning and defaults of TRL ``GRPOConfig`` sampling fields).

    Attributes:
        max_new_tokens: completion length cap in tokens (default 256).
        temperature: softmax temperature, ``> 0`` (default 1.0; evaluation samples, it never decodes greedily).
        top_p: nucleus mass in (0, 1] (default 1.0 = off). top_k: 0 = off (default).
        seed: base seed; each generation call derives its own from it and a tag.

    Raises:
        ValueError: a value outside its range, naming the field.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be >= 1.")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r} must be > 0 (evaluation samples k completions).")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1].")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be >= 0 (0 turns it off).")

    def to_dict(self) -> dict:
        return asdict(self)


def derive_seed(base: int, *parts: object) -> int:
    """A 63-bit seed from ``base`` and a tag (e.g. model name, schedule, batch index), stable across runs."""
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFFFFFFFFFFFFFF


def cut_at_eos(ids: Sequence[int], eos_token_ids: Sequence[int], limit: int | None = None) -> list[int]:
    """``ids`` up to and including the first EOS, and at most ``limit`` tokens."""
    out = []
    eos = set(eos_token_ids)
    for t in ids[: limit if limit is not None else len(ids)]:
        out.append(int(t))
        if t in eos:
            break
    return out


class GenerationBackend:
    """Interface: sample completions for token-id prompts with one model.

    Attributes:
        name: backend name. eos_token_ids: ids that end a completion. pad_token_id: filler id.
    """

    name: str = ""
    eos_token_ids: list[int]
    pad_token_id: int

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: GenerationSettings,
        *,
        max_new_tokens: Sequence[int] | None = None,
        seed: int = 0,
        desc: str = "generate",
    ) -> list[list[int]]:
        """Sample one completion per prompt.

        Args:
            prompts: token-id lists (chat template already applied), any lengths.
            settings: sampling settings; ``settings.max_new_tokens`` caps every completion.
            max_new_tokens: optional per-prompt caps (each ``<= settings.max_new_tokens``).
            seed: seed for this call. desc: progress-bar label.

        Returns:
            One completion per prompt: token ids up to and including the first EOS (absent when the cap was hit).
        """
        raise NotImplementedError


class TransformersBackend(GenerationBackend):
    """Batched ``model.generate`` sampling with left padding (CPU or one GPU).

    Each batch of ``batch_size`` prompts runs under its own seed (``derive_seed(seed, batch_index)``) inside
    ``torch.random.fork_rng``, so the caller's global RNG state is left untouched and a rerun with the same
    settings and batch size draws the same completions.

    Args:
        model: a loaded causal LM (evaluation mode is set here). tokenizer: its tokenizer.
        batch_size: prompts per ``generate`` call (default 16).
        eos_token_ids: defaults to the model's generation config EOS ids, else the tokenizer's.
        show_progress: draw a tqdm bar per call.
    """

    name = "transformers"

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 16,
        eos_token_ids: Sequence[int] | None = None,
        show_progress: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1.")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else default_eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_ids[0])
        self.show_progress = show_progress

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: GenerationSettings,
        *,
        max_new_tokens: Sequence[int] | None = None,
        seed: int = 0,
        desc: str = "generate",
    ) -> list[list[int]]:
        from tqdm.auto import tqdm

        caps = list(max_new_tokens) if max_new_tokens is not None else [settings.max_new_tokens] * len(prompts)
        if len(caps) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(caps)} max_new_tokens values.")
        out: list[list[int]] = []
        bar = tqdm(total=len(prompts), desc=desc, unit="seq", disable=not self.show_progress, leave=False)
        for b, start in enumerate(range(0, len(prompts), self.batch_size)):
            batch = [list(p) for p in prompts[start : start + self.batch_size]]
            batch_caps = caps[start : start + self.batch_size]
            width = max(len(p) for p in batch)
            input_ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in batch], dtype=torch.long)
            attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], dtype=torch.long)
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(derive_seed(seed, b))
                generated = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention_mask.to(self.device),
                    do_sample=True,
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    top_k=settings.top_k,
                    max_new_tokens=max(batch_caps),
                    eos_token_id=self.eos_token_ids,
                    pad_token_id=self.pad_token_id,
                )
            completions = generated[:, width:].tolist()
            out.extend(cut_at_eos(c, self.eos_token_ids, cap) for c, cap in zip(completions, batch_caps, strict=True))
            bar.update(len(batch))
        bar.close()
        return out


def default_eos_ids(model, tokenizer) -> list[int]:
    """EOS ids from the model's generation config (an int or a list), else the tokenizer's ``eos_token_id``."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("The model has no EOS token id (neither its generation config nor its tokenizer has one).")
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def check_backend_name(name: str) -> None:
    """Raise ``ValueError`` for a backend name this version cannot run, listing the ones it can."""
    if name in BACKENDS:
        return
    if name in PLANNED_BACKENDS:
        raise ValueError(
            f"backend={name!r} is not implemented in the evaluation suite yet; use --backend transformers."
        )
    raise ValueError(f"Unknown backend {name!r}; choose one of {list(BACKENDS)}.")


def create_backend(name: str, model, tokenizer, **kwargs) -> GenerationBackend:
    """The backend called ``name`` for a loaded ``model`` (kwargs go to its constructor).

    Raises:
        ValueError: an unknown or not yet implemented backend name (see :func:`check_backend_name`).
    """
    check_backend_name(name)
    return TransformersBackend(model, tokenizer, **kwargs)
