"""Tandem co-generation inside one vLLM engine (TRL colocate and server modes).

Modules: ``model`` (``TandemForCausalLM``: senior + frozen junior, own KV caches), ``processor`` (the v1 logits
processor that mixes them with :mod:`tandem_grpo.handoff`), ``worker`` (RPCs), ``plugin`` (registration through the
``vllm.general_plugins`` entry point), ``engine`` (engine arguments, rollout assembly), ``rollout`` (TRL
integration), ``client`` and ``serve`` (server mode). Nothing here imports vLLM until it is used.
"""

from ._compat import MIN_VLLM_VERSION, check_vllm

__all__ = ["MIN_VLLM_VERSION", "check_vllm"]
