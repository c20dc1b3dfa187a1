"""vLLM plugin entry point: registers [`TandemForCausalLM`][tandem_grpo.vllm.model.TandemForCausalLM] in every vLLM
process (vLLM runs ``vllm.general_plugins`` entry points in each process it spawns; docs/api/vllm/plugin.md).
Declared in pyproject.toml as:

    [project.entry-points."vllm.general_plugins"]
    tandem_grpo = "tandem_grpo.vllm.plugin:register"
"""

from __future__ import annotations

from ._compat import ARCHITECTURE, MODEL_FQCN


def register() -> None:
    """Register ``TandemForCausalLM`` lazily (by module path, so vLLM imports it only when an engine uses it).

    Idempotent; a no-op when it is already registered. Engines select the class with
    ``hf_overrides={"architectures": ["TandemForCausalLM"], ...}``
    (see [`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs]).
    """
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_FQCN)
