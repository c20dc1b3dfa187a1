"""What a tandem engine holds, read from the engine itself: its models' log-probabilities on a probe sequence, and
the senior parameters a weight sync did not reach.

The trainer ([`tandem_grpo.engine_check`][tandem_grpo.engine_check]) and ``tandem-grpo check``
([`tandem_grpo.vllm.check_command`][tandem_grpo.vllm.check_command]) compare these with the trainer's own models.
Each function takes the engine as a colocated ``vllm.LLM`` or a
[`TandemVLLMClient`][tandem_grpo.vllm.client.TandemVLLMClient] (server mode).

A probe is one request with vLLM's ``prompt_logprobs``: log-probabilities of the raw logits (temperature 1, no
penalties, no truncation, no logits processor), for every probe token after the first. The junior is read by
running the engine's junior alone for that request
([`TandemForCausalLM.set_solo`][tandem_grpo.vllm.model.TandemForCausalLM.set_solo], the worker RPC
``tandem_set_solo``), with the prefix cache reset around it; the senior with both models running, as in training.
One prefill of the probe's length: the cost of one short prompt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

SENIOR_ONLY = object()
"""``which`` for an engine that holds the senior alone (TRL's engine, senior-only rollouts): no solo switch."""


def _is_client(engine) -> bool:
    return hasattr(engine, "base_url") and hasattr(engine, "session")


def _rpc(engine, method: str, *args) -> list:
    if _is_client(engine):
        return engine._rpc(method, *args)
    return engine.collective_rpc(method, args=args)


def _reset_prefix_cache(engine) -> None:
    engine.reset_prefix_cache()


@contextlib.contextmanager
def _solo(engine, which) -> Iterator[None]:
    """The engine runs ``which`` alone inside the block (nothing changes for the senior or a senior-only engine)."""
    if which != "junior":
        yield
        return
    _rpc(engine, "tandem_set_solo", "junior")
    _reset_prefix_cache(engine)  # blocks computed with both models lack nothing, but the junior's alone would
    try:
        yield
    finally:
        _rpc(engine, "tandem_set_solo", "")
        _reset_prefix_cache(engine)


def probe_logprobs(engine, ids: Sequence[int], which="senior") -> list[float]:
    """The engine's log-probability of ``ids[t]`` after ``ids[:t]``, for ``t = 1 .. len(ids) - 1``, from the raw
    logits of the ``which`` model (``"senior"``, ``"junior"``, or ``SENIOR_ONLY`` for a plain engine).

    Args:
        engine: a colocated ``vllm.LLM`` or a ``TandemVLLMClient``.
        ids: the probe's token ids (at least two).
        which: the model to read.

    Raises:
        RuntimeError: the engine returned no prompt log-probs.
    """
    ids = [int(i) for i in ids]
    with _solo(engine, which):
        entries = _served_prompt_logprobs(engine, ids) if _is_client(engine) else _local_prompt_logprobs(engine, ids)
    if entries is None or len(entries) != len(ids):
        raise RuntimeError(f"The vLLM engine returned no prompt log-probs for the {len(ids)}-token probe.")
    return [float(entry[token]) for entry, token in zip(entries[1:], ids[1:], strict=True)]


def _local_prompt_logprobs(llm, ids: list[int]) -> list[dict[int, float] | None]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    out = llm.generate([{"prompt_token_ids": ids}], sampling_params=params, use_tqdm=False)[0]
    if out.prompt_logprobs is None:
        return None
    return [None if entry is None else {t: lp.logprob for t, lp in entry.items()} for entry in out.prompt_logprobs]


def _served_prompt_logprobs(client, ids: list[int]) -> list[dict[int, float] | None]:
    payload = {"model": client.model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    choice = client._post(f"{client.base_url}/v1/completions", json=payload)["choices"][0]
    entries = choice.get("prompt_logprobs")
    if entries is None:
        return None
    return [
        None if entry is None else {int(str(t).rpartition(":")[2]): float(v["logprob"]) for t, v in entry.items()}
        for entry in entries
    ]


def sync_coverage(engine) -> list[str]:
    """The senior parameters no weight load reached since the last call (vLLM's names, sorted;
    [`TandemForCausalLM.sync_coverage`][tandem_grpo.vllm.model.TandemForCausalLM.sync_coverage]), from every
    worker."""
    missing: set[str] = set()
    for names in _rpc(engine, "tandem_sync_coverage"):
        missing.update(names or [])
    return sorted(missing)


def uncovered(model, loaded: set[str]) -> list[str]:
    """The parameters of a plain vLLM model (senior-only engine) that a reload returning ``loaded`` did not fill,
    sorted."""
    return sorted({name for name, _ in model.named_parameters()} - set(loaded))
