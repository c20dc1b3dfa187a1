"""The evaluation's generation backends by name (``tandem-grpo evaluate --backend``):
[`create_backend`][tandem_grpo.evaluation.backends.create_backend] builds a
[`TransformersBackend`][tandem_grpo.backends.TransformersBackend] or, on an in-process tandem vLLM engine, a
[`VLLMBackend`][tandem_grpo.vllm.evaluation.VLLMBackend]; both implement
[`GenerationBackend`][tandem_grpo.backends.GenerationBackend] ([`tandem_grpo.backends`][tandem_grpo.backends]), the
only generation the rest of the evaluation sees. Teacher-forced scoring (legibility) runs on the transformers models
whatever the backend.

The names of [`tandem_grpo.backends`][tandem_grpo.backends] are importable from here too.
"""

from __future__ import annotations

from ..backends import (  # noqa: F401
    GenerationBackend,
    StopInCompletion,
    TransformersBackend,
    cut_at_eos,
    cut_at_stop,
    left_pad,
    per_prompt_caps,
    stop_length,
    strip_eos,
)

__all__ = ["BACKENDS", "check_backend_name", "create_backend"]

BACKENDS = ("transformers", "vllm")
"""The backend names of ``tandem-grpo evaluate --backend``."""


def check_backend_name(name: str) -> None:
    """Raise ``ValueError`` for a backend name this version cannot run, listing the ones it can
    ([`BACKENDS`][tandem_grpo.evaluation.backends.BACKENDS])."""
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
    """The backend ``name`` of [`BACKENDS`][tandem_grpo.evaluation.backends.BACKENDS] for a loaded ``model``:
    [`TransformersBackend`][tandem_grpo.backends.TransformersBackend], or
    [`vllm_backend`][tandem_grpo.vllm.evaluation.vllm_backend] (the process's shared tandem vLLM engine, every prompt
    of a call at once). Each takes the keyword arguments it uses.

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
        ValueError: an unknown backend name (see
            [`check_backend_name`][tandem_grpo.evaluation.backends.check_backend_name]), or the backend refuses its
            arguments (no EOS id; ``"vllm"`` without ``max_model_len``, or with a junior of another vocabulary).
        ImportError: ``"vllm"`` without vLLM, or with one too old.
    """
    check_backend_name(name)
    if name == "transformers":
        return TransformersBackend(
            model, tokenizer, junior=junior, show_progress=show_progress, batch_size=batch_size, **kwargs
        )
    from ..vllm.evaluation import vllm_backend  # vLLM is optional: imported only for this backend

    return vllm_backend(model, tokenizer, junior=junior, show_progress=show_progress, max_model_len=max_model_len,
                        concurrent=concurrent, seed=seed, **kwargs)  # fmt: skip
