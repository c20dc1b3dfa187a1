"""``TandemForCausalLM``: a senior and a frozen junior inside one vLLM engine, each its own registered vLLM class
under the prefix ``senior`` or ``junior`` (own attention layers, own paged KV cache). Every step runs both on the same
tokens: ``forward`` returns both hidden states side by side (``[num_tokens, H_s + H_j]``), ``compute_logits`` returns
the senior's logits and hands the junior's to the logits processor (``tandem_grpo.vllm._slot``). The first
``load_weights`` loads the senior, then the junior (from ``tandem_junior_path``, or a copy of the senior); every later
load goes into the senior alone (``junior.`` names are refused), best through
[`reload_senior`][tandem_grpo.vllm.model.TandemForCausalLM.reload_senior]. Configured through ``hf_overrides``
([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs]). In detail: docs/api/vllm/model.md.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from ._slot import put_junior_logits

SENIOR_PREFIX = "senior"
JUNIOR_PREFIX = "junior"
JUNIOR_COMPILE_TAG = "tandem_junior"
"""vLLM's compile tag of the junior's decoder (the senior's is vLLM's default, ``"backbone"``)."""


@contextlib.contextmanager
def _junior_context(junior_vllm_config) -> Iterator[None]:
    """The junior's config as vLLM's current one, and the junior's compile tag (vLLM 0.31-0.33:
    ``vllm.config.set_current_vllm_config``, ``vllm.compilation.backends.set_model_tag``)."""
    from vllm.compilation.backends import set_model_tag
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(junior_vllm_config), set_model_tag(JUNIOR_COMPILE_TAG):
        yield


def _local_checkpoint_dir(name_or_path: str) -> str:
    if os.path.isdir(name_or_path):
        return name_or_path
    from huggingface_hub import snapshot_download

    return snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.model"])


def iter_checkpoint(name_or_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from a Hugging Face checkpoint folder (``*.safetensors``, else ``*.bin``).

    Raises:
        FileNotFoundError: the folder holds neither format.
    """
    folder = _local_checkpoint_dir(name_or_path)
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if files:
        from safetensors import safe_open

        for file in files:
            with safe_open(file, framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    yield key, handle.get_tensor(key)
        return
    files = sorted(glob.glob(os.path.join(folder, "*.bin")))
    if not files:
        raise FileNotFoundError(f"No *.safetensors or *.bin weights in {folder} (junior model).")
    for file in files:
        yield from torch.load(file, map_location="cpu", weights_only=True, mmap=True).items()


class TandemForCausalLM(nn.Module):
    """Senior + frozen junior causal LMs in one vLLM model (module docstring).

    The junior's logits width may differ from the senior's (embedding padding): the logits processor cuts both to the
    tokenizer's ids ([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs] has checked the tokenizers and widths).

    Args:
        vllm_config: the engine's config; ``model_config.hf_config`` carries the ``tandem_*`` overrides.
        prefix: the weight-name prefix vLLM gives this module (normally ``""``).

    Raises:
        ValueError: ``tandem_architectures`` is missing (the engine was not built with
            [`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs]).
    """

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.utils import maybe_prefix

        model_config = vllm_config.model_config
        hf_config = model_config.hf_config
        load_format = str(getattr(getattr(vllm_config, "load_config", None), "load_format", "auto"))
        if load_format.lower().endswith("dummy"):
            # The junior is loaded (or copied from the senior) by the initial `load_weights`, which a dummy load
            # never calls: the first weight sync would be taken for it and the junior left random or half-copied.
            raise ValueError(
                f"The tandem engine cannot start with load_format={load_format!r}: the junior is loaded by the "
                "engine's initial weight load, which a dummy load skips. Use the default load format ('auto')."
            )
        architectures = list(getattr(hf_config, "tandem_architectures", None) or [])
        if not architectures:
            raise ValueError(
                "TandemForCausalLM needs `hf_overrides['tandem_architectures']` (the senior's own architectures); "
                "build the engine with tandem_grpo.vllm.engine.engine_kwargs()."
            )
        senior_cls, _ = ModelRegistry.resolve_model_cls(architectures, model_config)
        self.senior = senior_cls(vllm_config=vllm_config, prefix=maybe_prefix(prefix, SENIOR_PREFIX))

        self.junior_path: str | None = getattr(hf_config, "tandem_junior_path", None) or None
        junior_vllm_config = vllm_config
        junior_cls = senior_cls
        if self.junior_path is not None:
            from transformers import AutoConfig

            junior_hf_config = AutoConfig.from_pretrained(
                _local_checkpoint_dir(self.junior_path), trust_remote_code=model_config.trust_remote_code
            )
            junior_vllm_config = vllm_config.with_hf_config(junior_hf_config)
            if hasattr(junior_vllm_config.model_config, "hf_text_config"):
                junior_vllm_config.model_config.hf_text_config = junior_hf_config.get_text_config()
            junior_cls, _ = ModelRegistry.resolve_model_cls(
                list(junior_hf_config.architectures or architectures), junior_vllm_config.model_config
            )
        # Built as vLLM builds a speculative draft model next to the target (vllm/v1/spec_decode/draft_model.py,
        # model_loader/utils.py initialize_model): under its own config as the current one and a compile tag of its
        # own. vLLM's compile wrapper keys the compile caches by the *current* config (compilation/wrapper.py), so
        # under the senior's a junior of another size loads the senior's compiled artifact (seen: a crash in the
        # junior's first forward); and with VLLM_COMPILE each decoder's pieces are cached under
        # <cache dir>/rank_i_j/<tag>/, keyed by (shape range, piece index, compiler) only, so two decoders under
        # the default tag ("backbone") share one cache (vllm-project/vllm #28759).
        with _junior_context(junior_vllm_config):
            self.junior = junior_cls(vllm_config=junior_vllm_config, prefix=maybe_prefix(prefix, JUNIOR_PREFIX))
        self.senior_hidden_size = int(hf_config.get_text_config().hidden_size)
        # "senior" or "junior": run that model alone (set_solo); None: both, as training needs.
        self.solo: str | None = None
        self._model_config = model_config
        self._initial_load_done = False
        # Senior parameter names (vLLM's) the initial load filled, and those every later load filled since the last
        # `sync_coverage` (weight syncs, whatever their path).
        self._senior_names: set[str] = set()
        self._synced_names: set[str] = set()
        for param in self.junior.parameters():
            param.requires_grad_(False)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.senior.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Run both models on the same tokens; return ``[num_tokens, H_s + H_j]`` hidden states.

        Raises:
            NotImplementedError: ``inputs_embeds`` or pipeline-parallel ``intermediate_tensors`` (unsupported).
        """
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise NotImplementedError("TandemForCausalLM takes token ids only (no prompt embeds, no pipeline stages).")
        if self.solo is not None:  # one model's hidden states [num_tokens, H]
            return getattr(self, self.solo)(input_ids, positions)
        senior_hidden = self.senior(input_ids, positions)
        junior_hidden = self.junior(input_ids, positions)
        return torch.cat([senior_hidden, junior_hidden], dim=-1)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Senior logits ``[n, V_s]`` (returned) and junior logits ``[n, V_j]`` (published for the logits
        processor, which cuts both to the tokenizer's ids). In solo mode the one model's logits are both."""
        if self.solo is not None:
            logits = getattr(self, self.solo).compute_logits(hidden_states)
            # A copy: vLLM scales the returned logits by the temperature in place, and the processor scales the
            # junior's itself; one shared tensor would be scaled twice.
            put_junior_logits(logits.clone())
            return logits
        senior_hidden = hidden_states[..., : self.senior_hidden_size]
        junior_hidden = hidden_states[..., self.senior_hidden_size :]
        put_junior_logits(self.junior.compute_logits(junior_hidden))
        return self.senior.compute_logits(senior_hidden)

    def set_solo(self, model: str | None) -> bool:
        """Run only ``"senior"`` or only ``"junior"`` from the next step on (``None``: both). For requests that one
        model writes alone (junior probability 0 or 1) the other's forward is wasted work; the evaluation's solo
        samples and the alternating protocol's steps are such requests. Returns whether the mode changed: the
        caller must then reset the prefix cache, since blocks computed in one mode lack the other model's keys and
        values. Not for training rollouts, whose log-prob records need both models.

        Raises:
            ValueError: another value.
        """
        if model not in (None, "senior", "junior"):
            raise ValueError(f"solo must be None, 'senior' or 'junior', not {model!r}.")
        changed = model != self.solo
        self.solo = model
        return changed

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load weights; see the module docstring for the routing. Returns the loaded parameter names (prefixed).

        Raises:
            ValueError: a ``junior.``-prefixed name after the initial load (the junior is frozen).
        """
        names = set(self.senior.load_weights(self._senior_weights(weights)))
        loaded = {f"{SENIOR_PREFIX}.{name}" for name in names}
        if self._initial_load_done:
            self._synced_names |= names
            return loaded
        self._initial_load_done = True
        self._senior_names = names
        if self.junior_path is not None:
            junior_loaded = self.junior.load_weights(iter_checkpoint(self.junior_path))
        else:
            junior_loaded = self._copy_senior_into_junior()
        return loaded | {f"{JUNIOR_PREFIX}.{name}" for name in junior_loaded}

    def reload_senior(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load checkpoint-format senior weights (HF names) into the running engine; the junior is untouched.

        vLLM's in-place reload lifecycle on ``self.senior`` (module docstring): each senior layer is rebuilt in
        checkpoint format, filled as soon as all of its weights have arrived, then processed for its kernel; layers
        that receive no weight keep their current tensors. Weights may arrive one tensor at a time (they are
        buffered per layer until the layer is complete). Returns the loaded names (prefixed).

        Raises:
            ValueError: a ``junior.``-prefixed name.
        """
        return reload_in_place(self.senior, self._model_config, self.load_weights, weights)

    def _senior_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if name.startswith(f"{JUNIOR_PREFIX}."):
                if self._initial_load_done:
                    raise ValueError(f"Refusing to load {name!r}: the junior model is frozen.")
                continue
            yield name.removeprefix(f"{SENIOR_PREFIX}."), tensor

    def sync_coverage(self) -> list[str]:
        """The senior parameters (vLLM's names, e.g. ``model.layers.0.self_attn.qkv_proj.weight``) that the initial
        load filled and no load since the last call did, sorted; the record then starts afresh. Called after a weight
        sync: a name listed here kept its old value (vLLM only logs a warning for a layer that received nothing). A
        fused parameter counts as filled when any of its parts arrived."""
        missing = sorted(self._senior_names - self._synced_names)
        self._synced_names = set()
        return missing

    def reload_junior(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load checkpoint-format weights (HF names, no prefix) into the running engine's junior, through the same
        in-place reload lifecycle as [`reload_senior`][tandem_grpo.vllm.model.TandemForCausalLM.reload_senior]
        (a backend that packs weights for its kernels after loading, as vLLM's CPU backend does, would otherwise
        keep computing with the old ones). Tandem training never calls it (the junior is frozen); it is for
        controls that move the junior on purpose, such as the study's live junior. Returns the loaded names
        (unprefixed)."""
        return reload_in_place(self.junior, self._model_config, self.junior.load_weights, weights)

    @torch.no_grad()
    def _copy_senior_into_junior(self) -> set[str]:
        """Self-pairing at the initial load: copy the senior's freshly loaded parameters into the junior, before
        vLLM processes either for its kernels (after that, copying parameters does not reach a packed kernel: use
        ``reload_junior``). Returns the junior's parameter names."""
        # Same class and config (no junior path), so the parameter names and (vLLM-packed) shapes match one to one.
        senior_params = dict(self.senior.named_parameters())
        names = set()
        for name, param in self.junior.named_parameters():
            param.data.copy_(senior_params[name].data)
            names.add(name)
        return names


def reload_in_place(module, model_config, load_weights, weights: Iterable[tuple[str, torch.Tensor]]):
    """``load_weights(weights)`` inside vLLM's in-place reload lifecycle on ``module`` (module docstring): each layer
    is rebuilt in checkpoint format, filled once all of its weights have arrived, then processed for its kernel, so a
    backend that repacks weights after loading (vLLM's CPU backend) takes checkpoint-format tensors. Returns what
    ``load_weights`` returns."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    initialize_layerwise_reload(module)
    try:
        return load_weights(weights)
    finally:
        finalize_layerwise_reload(module, model_config)
        repack_tied_layers(module)


def repack_tied_layers(module) -> int:
    """Re-run the kernel processing of every layer of ``module`` that computes from a packed copy of a weight it
    shares with another layer; returns how many were repacked.

    vLLM's CPU backend packs each unquantized GEMM weight into a oneDNN handle at load (``layer.cpu_linear``), the
    output head too. A head tied to the input embedding (SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B) receives no weight of
    its own in a reload, so vLLM's layerwise reload (vLLM 0.31-0.34) refills the shared tensor through the embedding
    and keeps the head's old handle: the engine would sample from the new body with the old head (measured: logprobs
    off by up to 2.9 nats after a perturbed embedding, against 3e-5 once repacked; ``tests/test_vllm.py``). GPU
    layers compute from the weight itself and carry no ``cpu_linear``, so nothing is done there.
    """
    import torch

    sharing: dict[int, list] = {}
    for layer in module.modules():
        weight = getattr(layer, "weight", None)
        # 2-D GEMM weights only: vLLM's other CPU packings (conv, MoE experts) rewrite the weight and cannot rerun.
        packed = hasattr(layer, "cpu_linear") and hasattr(layer, "quant_method")
        if isinstance(weight, torch.Tensor) and weight.ndim == 2 and packed:
            sharing.setdefault(id(weight), []).append(layer)
    tied = [layer for layers in sharing.values() if len(layers) > 1 for layer in layers]
    for layer in tied:
        layer.quant_method.process_weights_after_loading(layer)
    return len(tied)
