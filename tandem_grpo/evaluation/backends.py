"""Solo generation behind a small interface, so a vLLM backend can be added next to the transformers one.

A backend turns token-id prompts into sampled completions for one model. Everything else in the evaluation
(scoring, step schedules, reports) only sees token-id lists, so a backend needs nothing but
[`generate`][tandem_grpo.evaluation.backends.GenerationBackend.generate]. Tandem (word-handoff) generation and
teacher-forced scoring always run on transformers models ([`tandem_generate`][tandem_grpo.generation.tandem_generate]),
whatever the backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from ..sampling import SamplingSettings, default_eos_token_ids

BACKENDS = ("transformers",)
PLANNED_BACKENDS = ("vllm",)


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
        name: backend name.
        eos_token_ids: ids that end a completion.
        pad_token_id: filler id.
    """

    name: str = ""
    eos_token_ids: list[int]
    pad_token_id: int

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingSettings,
        *,
        max_new_tokens: int | Sequence[int],
        seed: int = 0,
        desc: str = "generate",
    ) -> list[list[int]]:
        """Sample one completion per prompt.

        Args:
            prompts: token-id lists (chat template already applied), any lengths.
            sampling: sampling settings (the ones training uses;
                [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings]).
            max_new_tokens: the completion length cap, one for all prompts or one per prompt.
            seed: seed for this call.
            desc: progress-bar label.

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
        model: a loaded causal LM (evaluation mode is set here).
        tokenizer: its tokenizer.
        batch_size: prompts per ``generate`` call (default 16).
        eos_token_ids: default: training's ([`default_eos_token_ids`][tandem_grpo.sampling.default_eos_token_ids],
            TRL's rule).
        show_progress: draw a tqdm bar per call.

    Raises:
        ValueError: ``batch_size < 1``, or no EOS id (none given, and neither the tokenizer nor the generation
            config has one).
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
        if eos_token_ids is None:
            eos_token_ids = default_eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        if not eos_token_ids:
            raise ValueError(
                "The model has no EOS token id (neither its generation config nor its tokenizer has one)."
            )
        self.eos_token_ids = [int(i) for i in eos_token_ids]
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
        sampling: SamplingSettings,
        *,
        max_new_tokens: int | Sequence[int],
        seed: int = 0,
        desc: str = "generate",
    ) -> list[list[int]]:
        from tqdm.auto import tqdm

        caps = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
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
                    # transformers truncates in the order of the tandem mixture (top-k, top-p, min-p).
                    do_sample=True,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,
                    min_p=sampling.min_p or None,
                    repetition_penalty=sampling.repetition_penalty,
                    max_new_tokens=max(batch_caps),
                    eos_token_id=self.eos_token_ids,
                    pad_token_id=self.pad_token_id,
                )
            completions = generated[:, width:].tolist()
            out.extend(cut_at_eos(c, self.eos_token_ids, cap) for c, cap in zip(completions, batch_caps, strict=True))
            bar.update(len(batch))
        bar.close()
        return out


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
        ValueError: an unknown or not yet implemented backend name (see
            [`check_backend_name`][tandem_grpo.evaluation.backends.check_backend_name]).
    """
    check_backend_name(name)
    return TransformersBackend(model, tokenizer, **kwargs)
