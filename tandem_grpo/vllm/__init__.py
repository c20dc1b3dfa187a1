"""Tandem co-generation inside one vLLM engine (TRL colocate and server modes).

Modules: [`model`][tandem_grpo.vllm.model] (``TandemForCausalLM``: senior + frozen junior, own KV caches),
[`processor_v1`][tandem_grpo.vllm.processor_v1] and [`processor_v2`][tandem_grpo.vllm.processor_v2] (the logits
processors of vLLM's Model Runner V1 and V2), [`mixing`][tandem_grpo.vllm.mixing] (the step both run),
[`side_records`][tandem_grpo.vllm.side_records] and [`request_args`][tandem_grpo.vllm.request_args] (what they keep
and read per request), [`worker`][tandem_grpo.vllm.worker] (RPCs),
[`plugin`][tandem_grpo.vllm.plugin] (registration through the ``vllm.general_plugins`` entry point),
[`engine`][tandem_grpo.vllm.engine] (engine arguments, rollout assembly),
[`trl_generation`][tandem_grpo.vllm.trl_generation] (TRL's ``VLLMGeneration`` subclasses, the trainer's side),
[`evaluation`][tandem_grpo.vllm.evaluation] (the evaluation's engine and backend, ``--backend vllm``),
[`client`][tandem_grpo.vllm.client], [`serve`][tandem_grpo.vllm.serve] and
[`server_token`][tandem_grpo.vllm.server_token] (server mode). Nothing here imports vLLM
until it is used.

The trainer and the evaluation both build on this package, and nothing here imports either
(``tests/test_layering.py``).
"""

from ._compat import MIN_VLLM_VERSION, check_vllm

__all__ = ["MIN_VLLM_VERSION", "check_vllm"]
