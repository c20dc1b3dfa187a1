"""Generation behind a small interface: a backend turns token-id prompts into one model's sampled completions
([`generate`][tandem_grpo.backends.GenerationBackend.generate]) or co-generates with a junior
([`tandem`][tandem_grpo.backends.GenerationBackend.tandem]); whoever samples through it sees token ids only.

Two backends implement it, one per generation stack: [`TransformersBackend`][tandem_grpo.backends.TransformersBackend]
here (batched ``model.generate`` and [`tandem_generate`][tandem_grpo.generation.tandem_generate]), and
[`VLLMBackend`][tandem_grpo.vllm.evaluation.VLLMBackend] on an in-process tandem vLLM engine;
[`create_backend`][tandem_grpo.backends.create_backend] builds either by name (``tandem-grpo evaluate --backend``).
The cuts every backend applies (EOS, stop strings, per-prompt caps) are here too, so that both cut alike.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from .handoff import BoundaryTables, HandoffRule
from .rollout import Rollout
from .sampling import SamplingSettings, default_eos_token_ids, derive_seed

__all__ = ["BACKENDS", "GenerationBackend", "StopInCompletion", "TransformersBackend", "check_backend_name",
           "create_backend", "cut_at_eos", "cut_at_stop", "left_pad", "per_prompt_caps", "stop_length",
           "strip_eos"]  # fmt: skip


def cut_at_eos(ids: Sequence[int], eos_token_ids: Sequence[int], limit: int | None = None) -> list[int]:
    """``ids`` up to and including the first EOS, and at most ``limit`` tokens."""
    out = []
    eos = set(eos_token_ids)
    for t in ids[: limit if limit is not None else len(ids)]:
        out.append(int(t))
        if t in eos:
            break
    return out


def strip_eos(ids: Sequence[int], eos_token_ids: Collection[int]) -> list[int]:
    """``ids`` without its trailing run of EOS ids."""
    n = len(ids)
    while n > 0 and int(ids[n - 1]) in eos_token_ids:
        n -= 1
    return list(ids[:n])


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id prompts as one left-padded batch, as ``generate`` and ``tandem_generate`` take it: long
    ``(input_ids, attention_mask)`` ``[B, P]``, ``P`` the longest prompt, padded with ``pad_token_id`` (mask 0)."""
    width = max(len(p) for p in prompts)
    input_ids = [[pad_token_id] * (width - len(p)) + list(p) for p in prompts]
    attention_mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(input_ids, dtype=torch.long), torch.tensor(attention_mask, dtype=torch.long)


def stop_length(ids: Sequence[int], tokenizer, stop: Sequence[str]) -> int | None:
    """The number of leading tokens of ``ids`` whose text first contains one of ``stop``, or ``None`` if it never does.

    The text of ``n`` tokens is ``tokenizer.decode(ids[:n])`` (special tokens kept, no clean-up); containing a stop
    string only becomes true as ``n`` grows, so the shortest such ``n`` is found by bisection. A token that carries
    the stop string and more (``".\n\n"``) is kept whole, as vLLM's ``include_stop_str_in_output`` keeps it.
    """

    def found(n: int) -> bool:
        text = tokenizer.decode(list(ids[:n]), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return any(s in text for s in stop)

    if not stop or not found(len(ids)):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if found(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class StopInCompletion(StoppingCriteria):
    """A transformers stopping criterion: a row is done once the text of its *generated* tokens contains a stop string,
    as in vLLM (transformers' ``stop_strings`` also match inside the prompt).

    Args:
        tokenizer: decodes the generated tokens (special tokens kept, no clean-up).
        prompt_width: the batch's (left-padded) prompt length; generated tokens start there.
        window: generated tokens decoded per check (default: 16, or 4 per character of the longest stop string).
    """

    def __init__(self, tokenizer, stop: Sequence[str], prompt_width: int, window: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.prompt_width = int(prompt_width)
        self.window = window or max(16, 4 * max((len(s) for s in self.stop), default=1))

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        tails = input_ids[:, self.prompt_width :][:, -self.window :].tolist()
        decode = self.tokenizer.decode
        done = [
            any(s in decode(t, skip_special_tokens=False, clean_up_tokenization_spaces=False) for s in self.stop)
            for t in tails
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def cut_at_stop(ids: Sequence[int], tokenizer, stop: Sequence[str]) -> list[int]:
    """``ids`` up to and including the token that completes the first stop string (all of ``ids`` without one)."""
    n = stop_length(ids, tokenizer, stop)
    return list(ids[: len(ids) if n is None else n])


def per_prompt_caps(prompts: Sequence, max_new_tokens: int | Sequence[int]) -> list[int]:
    """The length cap of each prompt from ``generate``'s ``max_new_tokens`` (one for all, or one per prompt)."""
    caps = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(caps) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(caps)} max_new_tokens values.")
    return caps


class GenerationBackend:
    """Interface: sample completions for token-id prompts with one model.

    Attributes:
        name: backend name.
        eos_token_ids: ids that end a completion.
        pad_token_id: filler id.
        tokenizer: decodes completions for ``stop`` strings (``None``: no ``stop`` strings).
    """

    name: str = ""
    eos_token_ids: list[int]
    pad_token_id: int
    tokenizer = None

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingSettings,
        *,
        max_new_tokens: int | Sequence[int],
        seed: int = 0,
        desc: str = "generate",
        stop: Sequence[str] = (),
    ) -> list[list[int]]:
        """Sample one completion per prompt.

        Args:
            prompts: token-id lists (chat template already applied), any lengths.
            max_new_tokens: the completion length cap, one for all prompts or one per prompt.
            seed: seed for this call.
            stop: strings that end a completion, kept in it (vLLM's ``stop`` with ``include_stop_str_in_output``);
                the cut is [`cut_at_stop`][tandem_grpo.backends.cut_at_stop] on every backend.

        Returns:
            One completion per prompt: token ids up to and including the first EOS or the token that completes a
            stop string (neither when the cap was hit).

        Raises:
            ValueError: not one cap per prompt, or ``stop`` strings and no ``tokenizer``.
        """
        caps = per_prompt_caps(prompts, max_new_tokens)
        if stop and self.tokenizer is None:
            raise ValueError(f"stop strings need the backend's tokenizer: build {type(self).__name__}(tokenizer=...).")
        raw = self._sample(prompts, sampling, caps, seed, desc, stop) if prompts else []
        cut = [cut_at_eos(c, self.eos_token_ids, cap) for c, cap in zip(raw, caps, strict=True)]
        return [cut_at_stop(c, self.tokenizer, stop) for c in cut]

    def _sample(self, prompts, sampling: SamplingSettings, caps: list[int], seed: int, desc: str, stop) -> list:
        """One completion per prompt (a non-empty list), to be cut by ``generate``; ``caps``: one per prompt."""
        raise NotImplementedError

    def tandem(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingSettings,
        rule: HandoffRule,
        *,
        max_new_tokens: int,
        seed: int = 0,
        desc: str = "tandem",
    ) -> Rollout:
        """Co-generate one completion per prompt with this backend's model as the senior and the run's junior, under
        the training handoff ``rule`` (the coin stream of row ``i`` is seeded ``derive_seed(seed, "coin", i)``).

        Returns:
            The [`Rollout`][tandem_grpo.rollout.Rollout]: ids up to and including the first EOS, authorship, unit
            starts and ``seeds``.
        """
        empty = Rollout([], [], [], [], [])
        return self._tandem(prompts, sampling, rule, max_new_tokens, seed, desc) if prompts else empty

    def _tandem(self, prompts, sampling: SamplingSettings, rule: HandoffRule, cap: int, seed: int, desc: str):
        """``tandem`` of a non-empty list of prompts."""
        raise NotImplementedError


class TransformersBackend(GenerationBackend):
    """Batched ``model.generate`` sampling with left padding (CPU or one GPU). Each batch runs under its own seed
    (``derive_seed(seed, batch_index)``) inside ``torch.random.fork_rng``: the caller's RNG is untouched and a rerun
    with the same batch size draws the same completions.

    Args:
        model: a loaded causal LM (evaluation mode is set here).
        batch_size: prompts per ``generate`` call.
        eos_token_ids: default: training's ([`default_eos_token_ids`][tandem_grpo.sampling.default_eos_token_ids],
            TRL's rule).
        junior: the junior model [`tandem`][tandem_grpo.backends.TransformersBackend.tandem] co-generates
            with (also settable as the ``junior`` attribute).

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
        junior=None,
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
        self.junior = junior
        self._tables: BoundaryTables | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _batches(self, prompts: Sequence[Sequence[int]], desc: str):
        """``(index, start, input_ids, attention_mask)`` of each left-padded batch of ``batch_size`` prompts, under a
        progress bar labelled ``desc``."""
        from tqdm.auto import tqdm

        with tqdm(total=len(prompts), desc=desc, unit="seq", disable=not self.show_progress, leave=False) as bar:
            for b, start in enumerate(range(0, len(prompts), self.batch_size)):
                batch = prompts[start : start + self.batch_size]
                yield b, start, *left_pad(batch, self.pad_token_id)
                bar.update(len(batch))

    @torch.no_grad()
    def _sample(self, prompts, sampling: SamplingSettings, caps: list[int], seed: int, desc: str, stop) -> list:
        out: list[list[int]] = []
        for b, start, input_ids, attention_mask in self._batches(prompts, desc):
            batch_caps = caps[start : start + self.batch_size]
            width = input_ids.shape[1]
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
                    # A row that meets a stop string is padded from there on; cut_at_stop drops the padding.
                    stopping_criteria=StoppingCriteriaList(
                        [StopInCompletion(self.tokenizer, stop, width)] if stop else []
                    ),
                )
            out.extend(generated[:, width:].tolist())
        return out

    @torch.no_grad()
    def _tandem(self, prompts, sampling: SamplingSettings, rule: HandoffRule, cap: int, seed: int, desc: str):
        """[`tandem_generate`][tandem_grpo.generation.tandem_generate] over batches of ``batch_size`` prompts with
        ``junior``; batch ``b``'s token draws use a generator seeded ``derive_seed(seed, "tokens", b)``.

        Raises:
            ValueError: no ``junior``.
        """
        from .generation import tandem_generate

        if self.junior is None:
            raise ValueError("This TransformersBackend has no junior: build it with junior=<the junior model>.")
        if self._tables is None:  # built once: from_tokenizer decodes the whole vocabulary
            vocab = self.model.config.get_text_config().vocab_size
            self._tables = BoundaryTables.from_tokenizer(self.tokenizer, vocab, self.eos_token_ids)
        parts = []
        for b, start, input_ids, attention_mask in self._batches(prompts, desc):
            coins = [derive_seed(seed, "coin", start + i) for i in range(len(input_ids))]
            generator = torch.Generator(device=self.device).manual_seed(derive_seed(seed, "tokens", b))
            parts.append(
                tandem_generate(
                    self.model,
                    self.junior,
                    input_ids.to(self.device),
                    attention_mask.to(self.device),
                    rule=rule,
                    tables=self._tables,
                    sampling=sampling,
                    max_new_tokens=cap,
                    eos_token_ids=self.eos_token_ids,
                    pad_token_id=self.pad_token_id,
                    seeds=torch.tensor(coins, dtype=torch.long, device=self.device),
                    generator=generator,
                )  # fmt: skip
            )
        return Rollout.concatenate(parts)


BACKENDS = ("transformers", "vllm")
"""The backend names of ``tandem-grpo evaluate --backend``."""


def check_backend_name(name: str) -> None:
    """Raise ``ValueError`` for a backend name this version cannot run, listing the ones it can
    ([`BACKENDS`][tandem_grpo.backends.BACKENDS])."""
    if name not in BACKENDS:
        raise ValueError(f"Unknown backend {name!r}; choose one of {list(BACKENDS)}.")


def create_backend(
    name: str,
    model,
    tokenizer,
    *,
    junior=None,
    show_progress: bool = True,
    batch_size: int = 16,
    max_model_len: int | None = None,
    concurrent: int = 0,
    seed: int = 0,
    **kwargs,
) -> GenerationBackend:
    """The backend ``name`` of [`BACKENDS`][tandem_grpo.backends.BACKENDS] for a loaded ``model``:
    [`TransformersBackend`][tandem_grpo.backends.TransformersBackend], or
    [`vllm_backend`][tandem_grpo.vllm.evaluation.vllm_backend] (the process's shared tandem vLLM engine, every prompt
    of a call at once). Each takes the keyword arguments it uses; teacher-forced scoring (legibility) runs on the
    transformers models whatever the backend.

    Args:
        model: the loaded causal LM to sample (``"vllm"``: the engine loads the folder it was loaded from,
            ``model.name_or_path``, in its dtype).
        tokenizer: ``model``'s tokenizer.
        junior: the run's loaded junior, the partner of tandem co-generation (default ``None``: no tandem on
            ``"transformers"``; ``model`` itself on ``"vllm"``).
        show_progress: draw progress bars.
        batch_size: prompts per transformers ``generate`` call (``"transformers"`` only).
        max_model_len: longest prompt plus completion, in tokens: the vLLM engine's (required for ``"vllm"``).
        concurrent: completions the run asks for at once, which size the vLLM engine's KV cache on a CPU (``0``:
            vLLM's own size; ``"vllm"`` only).
        seed: the vLLM engine's seed.
        **kwargs: further arguments of the backend (``eos_token_ids`` of ``TransformersBackend``).

    Raises:
        ValueError: an unknown backend name ([`check_backend_name`][tandem_grpo.backends.check_backend_name]), or the
            backend refuses its arguments (no EOS id; ``"vllm"`` without ``max_model_len``, or with a junior of
            another vocabulary).
        ImportError: ``"vllm"`` without vLLM, or with one too old.
    """
    check_backend_name(name)
    if name == "transformers":
        return TransformersBackend(
            model, tokenizer, junior=junior, show_progress=show_progress, batch_size=batch_size, **kwargs
        )
    from .vllm.evaluation import vllm_backend  # vLLM is optional: imported only for this backend

    return vllm_backend(model, tokenizer, junior=junior, show_progress=show_progress, max_model_len=max_model_len,
                        concurrent=concurrent, seed=seed, **kwargs)  # fmt: skip
