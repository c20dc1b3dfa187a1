"""The ``--backend vllm`` generation of an evaluation run: one in-process
[`TandemEngine`][tandem_grpo.vllm.evaluation.TandemEngine] and the
[`VLLMBackend`][tandem_grpo.vllm.evaluation.VLLMBackend] of each model, a
[`GenerationBackend`][tandem_grpo.backends.GenerationBackend] that the evaluation builds by name
([`create_backend`][tandem_grpo.backends.create_backend] calls
[`vllm_backend`][tandem_grpo.vllm.evaluation.vllm_backend]). Nothing here imports vLLM until an engine is built, nor
the evaluation ever."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ..backends import GenerationBackend
from ..handoff import HandoffRule
from ..rollout import Rollout
from ..sampling import SamplingSettings, derive_seed

VLLM_GPU_MEMORY_UTILIZATION = 0.3
"""Share of GPU memory the evaluation's vLLM engine may take (the transformers copies, used for scoring, share the
GPU); on a CPU the cache size comes from [`build_llm`][tandem_grpo.vllm.engine.build_llm]."""


class TandemEngine:
    """One in-process tandem vLLM engine for an evaluation run (built by
    [`build_llm`][tandem_grpo.vllm.engine.build_llm]): the run's junior, frozen, and a senior slot for one model at a
    time.

    [`load_senior`][tandem_grpo.vllm.evaluation.TandemEngine.load_senior] swaps another checkpoint of the same
    architecture into the senior slot (``reload_senior``, then a prefix-cache reset), as a training weight sync does;
    [`shared_engine`][tandem_grpo.vllm.evaluation.shared_engine] keeps one engine per process.

    Args:
        senior: local folder of the first senior (resolved path).
        junior: local folder of the frozen junior.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        max_model_len: longest prompt plus completion, in tokens.
        seed: the engine's seed (vLLM on a CPU takes no per-request seed, so draws are not reproducible).
        concurrent: completions asked for at once; on a CPU the KV cache holds ``min(concurrent, MAX_NUM_SEQS)`` of
            them (no preemption), at least ``CPU_KV_CACHE_BYTES`` and at most ``CPU_KV_CACHE_SHARE`` of memory.

    Raises:
        ImportError: vLLM is missing or too old.
        ValueError: the junior's vocabulary differs from the senior's.
    """

    def __init__(
        self, senior: str, junior: str, *, dtype: str, max_model_len: int, seed: int = 0, concurrent: int = 0
    ) -> None:
        from ..vllm.engine import build_llm, engine_info

        self.junior = junior
        self.dtype = dtype
        self.max_model_len = int(max_model_len)
        self.llm = build_llm(senior, junior, gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION, dtype=dtype,
                             max_model_len=self.max_model_len, enforce_eager=True, seed=seed,
                             **_cpu_kv_cache(senior, dtype, max_model_len, concurrent))  # fmt: skip
        self.senior = senior
        self.eos_token_ids = [int(i) for i in engine_info(self.llm)["eos_token_ids"]]

    def load_senior(self, path: str) -> None:
        """Put the checkpoint in folder ``path`` into the senior slot (no-op when it is there already)."""
        if path == self.senior:
            return
        from ..vllm.model import iter_checkpoint

        # One call: a layer split over two reloads is left incomplete.
        self._model().reload_senior(iter_checkpoint(path))
        self.llm.reset_prefix_cache()
        self.senior = path

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingSettings,
        rule,
        *,
        max_new_tokens: Sequence[int],
        seeds: Sequence[int],
        stop: Sequence[str] = (),
        progress: str | None = None,
    ):
        """Tandem completions of the current senior and the junior, one request per prompt.

        Args:
            sampling: the sampling settings (the mixture is truncated as in training).
            rule: the [`HandoffRule`][tandem_grpo.handoff.HandoffRule] (junior probability 0: the senior alone;
                1: the junior alone).
            max_new_tokens: length cap per prompt.
            seeds: coin-stream seed per prompt.
            stop: strings that end a request, kept in its output (``include_stop_str_in_output``).
            progress: label of the engine's progress bar (default ``None``: no bar).

        Returns:
            The [`Rollout`][tandem_grpo.rollout.Rollout] of
            [`generate_with_llm`][tandem_grpo.vllm.engine.generate_with_llm].
        """
        from ..vllm.engine import generate_with_llm

        # A model that writes alone runs alone (TandemForCausalLM.set_solo): half the forward passes.
        if self._model().set_solo(rule.sole_writer):
            self.llm.reset_prefix_cache()
        return generate_with_llm(
            self.llm, prompts, seeds, rule, sampling, max_tokens=list(max_new_tokens), stop=stop, progress=progress
        )

    def _model(self):
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model


CPU_KV_CACHE_SHARE = 0.4
"""Largest share of the machine's memory the evaluation engine's KV cache takes on a CPU."""

MAX_NUM_SEQS = 256
"""Completions vLLM decodes at once (its own default)."""


def _cpu_kv_cache(senior: str, dtype: str, max_model_len: int, concurrent: int) -> dict:
    """``build_llm`` arguments that size a CPU engine's KV cache for the batch (none on a GPU or without a batch)."""
    if torch.cuda.is_available() or concurrent < 1:
        return {}
    from .engine import CPU_KV_CACHE_BYTES, kv_cache_bytes

    wanted = kv_cache_bytes(senior, dtype, min(concurrent, MAX_NUM_SEQS) * max_model_len)
    limit = int(CPU_KV_CACHE_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {"kv_cache_memory_bytes": max(CPU_KV_CACHE_BYTES, min(wanted, limit)), "max_num_seqs": MAX_NUM_SEQS}


_ENGINE: TandemEngine | None = None


def shared_engine(
    senior: str,
    junior: str,
    *,
    dtype: str,
    max_model_len: int,
    seed: int = 0,
    concurrent: int = 0,
    load_senior: bool = True,
) -> TandemEngine:
    """The process's [`TandemEngine`][tandem_grpo.vllm.evaluation.TandemEngine], built on first use and reused
    while the junior and dtype match and its ``max_model_len`` suffices (vLLM does not free an in-process engine
    reliably, so one is kept); ``senior`` is loaded into its senior slot, on a reused engine only when
    ``load_senior`` (default ``True``; the junior's backend passes ``False``: it never samples from the slot, and
    the junior need not fit it)."""
    global _ENGINE
    if _ENGINE is None or (_ENGINE.junior, _ENGINE.dtype) != (junior, dtype) or _ENGINE.max_model_len < max_model_len:
        _ENGINE = None  # drop the old engine before building the next
        _ENGINE = TandemEngine(senior, junior, dtype=dtype, max_model_len=max_model_len, seed=seed,
                               concurrent=concurrent)  # fmt: skip
    if load_senior:
        _ENGINE.load_senior(senior)
    return _ENGINE


def close_shared_engine() -> None:
    """Drop the process's shared engine and free what vLLM holds in this process (its process group and memory),
    so that another in-process vLLM engine can start; the next
    [`shared_engine`][tandem_grpo.vllm.evaluation.shared_engine] call builds a new one. Uses vLLM's
    ``cleanup_dist_env_and_memory`` (vllm/distributed/parallel_state.py)."""
    global _ENGINE
    if _ENGINE is None:
        return
    _ENGINE = None
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


class VLLMBackend(GenerationBackend):
    """Solo sampling of one model through a [`TandemEngine`][tandem_grpo.vllm.evaluation.TandemEngine].

    The junior (``is_junior=True``) samples as a tandem request with junior probability 1; any other model is
    loaded into the senior slot and samples with junior probability 0. Both go through the logits processor's
    truncation (top-k, then top-p, then min-p, as in training and in transformers). Draws are not reproducible
    (vLLM's CPU sampler takes no per-request seed); the coin seeds are ``derive_seed(seed, "coin", row)``.

    Args:
        path: the model's folder (what [`load_senior`][tandem_grpo.vllm.evaluation.TandemEngine.load_senior]
            loads).
        is_junior: whether this model is the engine's junior.
        pad_token_id: filler id (default: the first EOS id).
        tokenizer: the model's tokenizer, needed for ``stop`` strings (default: none).
        show_progress: draw the engine's progress bars, labelled with each call's ``desc`` (default ``True``).
    """

    name = "vllm"

    def __init__(
        self,
        engine: TandemEngine,
        path: str,
        *,
        is_junior: bool,
        pad_token_id: int | None = None,
        tokenizer=None,
        show_progress: bool = True,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.path = path
        self.is_junior = is_junior
        self.eos_token_ids = list(engine.eos_token_ids)
        self.pad_token_id = int(pad_token_id if pad_token_id is not None else self.eos_token_ids[0])
        self.show_progress = show_progress

    def _sample(self, prompts, sampling: SamplingSettings, caps: list[int], seed: int, desc: str, stop) -> list:
        # The junior samples alone whatever sits in the senior slot; any other model is loaded into it first.
        rule = HandoffRule.alone("junior" if self.is_junior else "senior")
        return self._run(prompts, sampling, rule, caps, seed, desc, load=not self.is_junior, stop=stop).completion_ids

    def _tandem(self, prompts, sampling: SamplingSettings, rule: HandoffRule, cap: int, seed: int, desc: str):
        """Co-generate with this model in the senior slot (the junior's weights too, when it is evaluated as a
        checkpoint) and the engine's junior under ``rule``: the engine's
        [`Rollout`][tandem_grpo.rollout.Rollout]."""
        return self._run(prompts, sampling, rule, [cap] * len(prompts), seed, desc, load=True)

    def _run(self, prompts, sampling, rule, caps, seed, desc, *, load: bool, stop: Sequence[str] = ()) -> Rollout:
        """The engine's [`Rollout`][tandem_grpo.rollout.Rollout] of ``prompts`` under ``rule``, this model loaded
        into the senior slot first when ``load``, under a bar labelled ``desc``."""
        if load:
            self.engine.load_senior(self.path)
        seeds = [derive_seed(seed, "coin", i) for i in range(len(prompts))]
        progress = desc if self.show_progress else None
        return self.engine.generate(
            prompts, sampling, rule, max_new_tokens=caps, seeds=seeds, stop=stop, progress=progress
        )


def vllm_backend(
    model,
    tokenizer,
    *,
    junior=None,
    max_model_len: int | None = None,
    concurrent: int = 0,
    seed: int = 0,
    show_progress: bool = True,
) -> VLLMBackend:
    """The [`VLLMBackend`][tandem_grpo.vllm.evaluation.VLLMBackend] of a loaded transformers ``model`` on the
    process's [`shared_engine`][tandem_grpo.vllm.evaluation.shared_engine], which
    [`create_backend`][tandem_grpo.backends.create_backend] returns for ``"vllm"``. The engine is built
    (or reused) from the folders ``model`` and ``junior`` were loaded from (their ``name_or_path``) in ``model``'s
    dtype; ``model`` is the junior's backend when its folder is the junior's.

    Args:
        model: the causal LM to sample, loaded from a local folder.
        tokenizer: its tokenizer (padding id, ``stop`` strings).
        junior: the run's loaded junior (default ``None``: ``model`` itself).
        max_model_len: longest prompt plus completion, in tokens (required).
        concurrent: completions asked for at once (sizes the KV cache on a CPU; default 0: vLLM's own size).
        seed: the engine's seed (default 0).
        show_progress: draw the engine's progress bars (default ``True``).

    Raises:
        ValueError: no ``max_model_len``, or the junior's vocabulary differs from the senior's.
        ImportError: vLLM is missing or too old.
    """
    if max_model_len is None:
        raise ValueError("The vllm backend needs max_model_len (longest prompt plus completion) to size its engine.")
    path, junior_path = model.name_or_path, (model if junior is None else junior).name_or_path
    is_junior = path == junior_path
    engine = shared_engine(path, junior_path, dtype=str(model.dtype).removeprefix("torch."),
                           max_model_len=max_model_len, seed=seed, concurrent=concurrent,
                           load_senior=not is_junior)  # fmt: skip
    return VLLMBackend(engine, path, is_junior=is_junior, pad_token_id=tokenizer.pad_token_id, tokenizer=tokenizer,
                       show_progress=show_progress)  # fmt: skip
