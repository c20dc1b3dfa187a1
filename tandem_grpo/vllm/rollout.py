"""Deprecated: renamed [`tandem_grpo.vllm.trl_generation`][tandem_grpo.vllm.trl_generation] (the TRL generation
subclasses; ``generate_tandem`` is now ``tandem_generate_vllm``); this module goes in the next release."""

from .._compat import moved_names

_NEW = "tandem_grpo.vllm.trl_generation"
__getattr__ = moved_names(
    __name__,
    {
        "SeniorVLLMGeneration": _NEW,
        "TandemVLLMGeneration": _NEW,
        "serve_command": _NEW,
        "use_tandem_vllm": _NEW,
        "generate_tandem": f"{_NEW}:tandem_generate_vllm",
    },
)
