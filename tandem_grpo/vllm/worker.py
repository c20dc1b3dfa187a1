"""Worker extension of tandem engines: the RPCs the client calls through ``collective_rpc`` (in every worker process;
``worker_extension_cls`` of the engine, docs/api/vllm/worker.md). Over HTTP, arguments arrive as strings, so list
arguments are JSON-encoded.
"""

from __future__ import annotations

import json

from ._compat import ARCHITECTURE


def _decode_list(value) -> list:
    return json.loads(value) if isinstance(value, str) else list(value)


class TandemWorkerExtension:
    """Methods added to vLLM's worker (``self`` is the worker: ``self.model_runner``, ``self.vllm_config``)."""

    def tandem_pop_records(self, uids) -> dict:
        """Remove and return the logits processor's side records of ``uids`` (a list or a JSON list string).

        Returns:
            ``{uid: {"authors": [int], "corrections": [float], "handovers": [float | None]} | None}`` (see
            [`pop_records`][tandem_grpo.vllm.side_records.pop_records]).
        """
        from .side_records import pop_records

        return pop_records([str(uid) for uid in _decode_list(uids)])

    def tandem_info(self) -> dict:
        """Settings of this engine that a client needs to rebuild authorship: architecture, original
        architectures, junior path, EOS ids, vocabulary size."""
        model_config = self.vllm_config.model_config
        hf_config = model_config.hf_config
        return {
            "architecture": (getattr(hf_config, "architectures", None) or [None])[0],
            "is_tandem": ARCHITECTURE in (getattr(hf_config, "architectures", None) or []),
            "tandem_architectures": list(getattr(hf_config, "tandem_architectures", None) or []),
            "junior_path": getattr(hf_config, "tandem_junior_path", None),
            "eos_token_ids": list(getattr(hf_config, "tandem_eos_token_ids", None) or []),
            "vocab_size": int(model_config.get_vocab_size()),
            "model": model_config.model,
        }

    def tandem_load_weights(self, paths) -> int:
        """Load safetensors files of senior weights (HF names) into the senior; return the tensor count.

        The weight path for trainers without CUDA (no NCCL weight-transfer engine): the client writes the files on a
        filesystem the server shares, then calls this with their paths (a JSON list, or one path). All files go through
        ONE [`TandemForCausalLM.reload_senior`][tandem_grpo.vllm.model.TandemForCausalLM.reload_senior] call (the
        junior is never touched): the reload rebuilds each layer from the weights it receives, so a layer whose weights
        were split over two separate reloads would keep uninitialized memory where the other part belongs. Files are
        read one at
        a time.
        """
        from safetensors.torch import load_file

        text = str(paths)
        files = _decode_list(text) if text.lstrip().startswith("[") else [text]
        device = str(getattr(self, "device", "cpu"))
        count = 0

        def tensors():
            nonlocal count
            for file in files:
                for item in load_file(str(file), device=device).items():
                    count += 1
                    yield item

        self.model_runner.model.reload_senior(tensors())
        return count

    def tandem_reload_senior(self, weights) -> int:
        """In-process only (colocate): load ``(name, tensor)`` pairs into the senior with
        [`TandemForCausalLM.reload_senior`][tandem_grpo.vllm.model.TandemForCausalLM.reload_senior]; return how many
        parameters were loaded."""
        return len(self.model_runner.model.reload_senior(weights))

    def tandem_sync_coverage(self) -> list[str]:
        """The senior parameters no weight load has filled since the last call
        ([`TandemForCausalLM.sync_coverage`][tandem_grpo.vllm.model.TandemForCausalLM.sync_coverage])."""
        return self.model_runner.model.sync_coverage()

    def tandem_set_solo(self, model) -> bool:
        """Run only ``"senior"`` or ``"junior"`` from the next step on (``""`` or ``None``: both); whether the mode
        changed ([`TandemForCausalLM.set_solo`][tandem_grpo.vllm.model.TandemForCausalLM.set_solo]: reset the
        prefix cache after a change)."""
        return self.model_runner.model.set_solo(str(model) if model else None)
