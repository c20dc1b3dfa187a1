"""The junior: vocabulary checks, loading, independent frozen copies, and the check that a junior computes what it
should (frozen, on the senior's device and dtype)."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .models import resolve_model_path


def logits_width(config) -> int:
    return int(config.get_text_config().vocab_size)


def check_same_vocabulary(senior_tokenizer, junior_tokenizer, senior_width: int, junior_width: int) -> None:
    """Raise unless senior and junior share one vocabulary: the same token string for every id, and logits that
    cover every id of that tokenizer.

    The logits widths (config ``vocab_size``) may differ: checkpoints of one family pad their embeddings to
    different sizes (Qwen2.5 0.5B has 151936 rows, 7B 152064, for 151665 tokens). Every backend cuts both models'
    logits to the tokenizer's length before mixing
    ([`BoundaryTables.from_tokenizer`][tandem_grpo.handoff.BoundaryTables.from_tokenizer]), so the padding rows are
    never sampled. The one check of every entry point (trainer, vLLM engine and server,
    evaluation).

    Args:
        senior_tokenizer: the senior's tokenizer.
        junior_tokenizer: the junior's tokenizer.
        senior_width: the senior's logits width (config ``vocab_size``).
        junior_width: the junior's logits width (config ``vocab_size``).

    Raises:
        ValueError: the tokenizers map ids to different tokens (naming both tokenizers' sizes when they differ, how
            many ids differ, the first five with both token strings, and the fix), or a width is smaller than the
            tokenizer's length.
    """
    fix = "Pick a junior trained with the senior's tokenizer (e.g. a smaller model of the same family)."
    senior_by_id = {i: t for t, i in senior_tokenizer.get_vocab().items()}
    junior_by_id = {i: t for t, i in junior_tokenizer.get_vocab().items()}
    differing = [
        i for i in sorted(set(senior_by_id) | set(junior_by_id)) if senior_by_id.get(i) != junior_by_id.get(i)
    ]
    if differing:
        examples = ", ".join(f"id {i}: {_token(senior_by_id, i)} vs {_token(junior_by_id, i)}" for i in differing[:5])
        # A size mismatch is the usual cause (another model family) and the clearest thing to report first.
        sizes = len(senior_by_id), len(junior_by_id)
        mismatch = (
            f"have different sizes (senior {sizes[0]} tokens, junior {sizes[1]}) and " if sizes[0] != sizes[1] else ""
        )
        raise ValueError(
            f"Senior and junior tokenizers {mismatch}map {len(differing)} ids to different tokens ({examples}; "
            f"senior first). Tandem generation mixes the two distributions token by token. {fix}"
        )
    size = len(senior_tokenizer)
    for name, width in (("senior", senior_width), ("junior", junior_width)):
        if width < size:
            raise ValueError(
                f"The {name}'s logits have {width} entries but the shared tokenizer has {size} tokens: ids "
                f"{width}..{size - 1} could not be scored by the {name}. Check that its config's vocab_size belongs "
                "to this tokenizer."
            )


def _token(by_id: dict[int, str], i: int) -> str:
    return repr(by_id[i]) if i in by_id else "none"


def check_junior_vocabulary(
    senior_tokenizer, senior_width: int, junior_name_or_path: str, trust_remote_code: bool = False
) -> str:
    """Check a junior by its tokenizer and config alone (cheap: no weights loaded); return its resolved path.

    Raises:
        ValueError: see [`check_same_vocabulary`][tandem_grpo.junior.check_same_vocabulary].
        OSError: the junior cannot be found.
    """
    path = resolve_model_path(junior_name_or_path)
    junior_tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    junior_width = logits_width(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
    check_same_vocabulary(senior_tokenizer, junior_tokenizer, senior_width, junior_width)
    return path


_GIB = 2**30


def junior_weight_bytes(name_or_path: str, dtype: torch.dtype) -> int | None:
    """Bytes a model's weights take once loaded in ``dtype``, found without loading them.

    The parameter count comes from the safetensors headers (a local folder's ``*.safetensors`` files, or the hub's
    metadata for a hub id), times ``dtype``'s element size. A folder with only ``*.bin`` / ``*.pt`` weights is
    counted by file size (their dtype is not known without loading them).

    Args:
        name_or_path: a model folder or hub id.
        dtype: the dtype the model will be loaded in (the senior's).

    Returns:
        The size in bytes, or ``None`` when it cannot be told (no weight files, hub metadata unavailable).
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    if os.path.isdir(name_or_path):
        folder = Path(name_or_path)
        counts = [_safetensors_parameter_count(f) for f in sorted(folder.glob("*.safetensors"))]
        if counts:
            return sum(counts) * itemsize
        files = [f for pattern in ("*.bin", "*.pt") for f in folder.glob(pattern)]
        return sum(f.stat().st_size for f in files) or None
    try:
        from huggingface_hub import get_safetensors_metadata

        return sum(get_safetensors_metadata(name_or_path).parameter_count.values()) * itemsize
    except Exception:  # noqa: BLE001 (no hub, no safetensors, gated: the size is unknown, not an error)
        return None


def _safetensors_parameter_count(path: Path) -> int:
    # A safetensors file starts with an 8-byte little-endian header length, then a JSON header of tensor shapes.
    with open(path, "rb") as handle:
        header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
    return sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")


def free_memory_bytes(device: torch.device | str) -> int | None:
    """Free memory of ``device`` in bytes: ``torch.cuda.mem_get_info`` on CUDA, the system's available memory
    (``psutil.virtual_memory().available``) on the CPU, ``None`` for other devices."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        import psutil  # an accelerate dependency

        return int(psutil.virtual_memory().available)
    return None


def check_junior_fits(
    name: str, weight_bytes: int, free_bytes: int, device: torch.device | str, copies: float = 1.0
) -> None:
    """Raise unless ``copies`` copies of a junior's weights fit in the free memory of ``device``.

    A pure function of its arguments, so that the check is tested without the hardware; the trainer passes
    [`junior_weight_bytes`][tandem_grpo.junior.junior_weight_bytes] and
    [`free_memory_bytes`][tandem_grpo.junior.free_memory_bytes].

    Args:
        name: the junior's name or path, for the message.
        weight_bytes: the junior's weights in bytes, in the dtype it will be loaded in.
        free_bytes: the device's free memory in bytes.
        device: the device the junior would be loaded on, for the message.
        copies: how many copies of the weights that free memory must hold: 1 for a GPU of its own; the processes of
            this machine for its CPU memory; divided by the number of shards under DeepSpeed ZeRO-3.

    Raises:
        ValueError: ``weight_bytes * copies > free_bytes``, naming the junior, both sizes in GiB and the fixes.
    """
    needed = weight_bytes * copies
    if needed <= free_bytes:
        return
    each = "" if copies == 1 else f" ({copies:g} x {weight_bytes / _GIB:.2f} GiB on this device)"
    raise ValueError(
        f"The junior `{name}` does not fit: its weights need {needed / _GIB:.2f} GiB{each} but {device} has "
        f"{free_bytes / _GIB:.2f} GiB free. Use a smaller junior, self-pairing (leave junior_model_name_or_path "
        "unset: a copy of the senior, or the base with the adapter disabled under LoRA), or vLLM server mode "
        "(use_vllm=True, vllm_mode='server': the server's GPUs hold the junior)."
    )


def load_frozen(path: str, dtype: torch.dtype, device: torch.device | str) -> PreTrainedModel:
    """Load a causal LM in eval mode with gradients off, in ``dtype`` on ``device``."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return freeze(model)


def freeze(model: PreTrainedModel) -> PreTrainedModel:
    model.eval()
    model.requires_grad_(False)
    return model


def frozen_copy(model) -> PreTrainedModel:
    """A frozen copy of ``model`` that shares neither code nor storage with it.

    A fresh module of the same class is built from a copy of the config, then the weights are copied into it
    (``load_state_dict`` copies values; nothing is aliased). ``copy.deepcopy`` is not safe here: TRL replaces
    ``forward`` (``add_fused_lm_head``) and ``lm_head.forward`` (``cast_lm_head_to_fp32``) with closures over the
    original module, and a deep copy keeps calling them, so the "copy" computes with the live weights.

    A PEFT model is copied as a PEFT model (same adapter config, adapter weights and base weights), so a senior
    that starts from an already trained adapter is copied with that adapter.

    Args:
        model: a ``transformers.PreTrainedModel`` or a ``peft.PeftModel`` (not wrapped by DeepSpeed/FSDP).

    Returns:
        The copy, in eval mode with gradients off, on ``model``'s device and in its dtype.
    """
    from accelerate.utils import is_peft_model

    if is_peft_model(model):
        from peft import get_peft_model

        base = _fresh_like(model.get_base_model())
        copied = get_peft_model(base, copy.deepcopy(model.peft_config[model.active_adapter]))
    else:
        copied = _fresh_like(model)
    missing, unexpected = copied.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [k for k in missing if k not in _tied_names(copied)]:
        raise RuntimeError(
            f"Could not copy {type(model).__name__} into a fresh module (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); set junior_model_name_or_path to the senior's initial checkpoint instead."
        )
    return freeze(copied)


def _fresh_like(model: PreTrainedModel) -> PreTrainedModel:
    parameter = next(model.parameters())
    fresh = type(model)._from_config(copy.deepcopy(model.config), dtype=parameter.dtype)
    return fresh.to(parameter.device)


def _tied_names(model) -> set[str]:
    # Tied parameters appear once in a state dict but under every name in `named_parameters(remove_duplicate=False)`.
    seen: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.setdefault(id(param), name)
    return tied


PROBE_LENGTH = 12
"""Number of token ids in the probe sequence [`probe_logits`][tandem_grpo.junior.probe_logits] feeds a model, whose
results [`same_function`][tandem_grpo.junior.same_function] compares (any ids below the vocab work)."""


@torch.no_grad()
def probe_logits(
    model, vocab_size: int, context: Callable[[], contextlib.AbstractContextManager] | None = None
) -> torch.Tensor:
    """Float32 logits ``[1, PROBE_LENGTH, V]`` of ``model`` in eval mode on a fixed token sequence.

    ``context`` is entered around the forward (e.g. ``senior.disable_adapter`` for a PEFT senior's base). The
    model's train/eval mode is restored afterwards.
    """
    device = next(model.parameters()).device
    ids = (torch.arange(PROBE_LENGTH, device=device) * 7919 + 11) % max(vocab_size, 1)
    was_training = model.training
    model.eval()
    try:
        with (context or contextlib.nullcontext)():
            return model(input_ids=ids.unsqueeze(0)).logits.float()
    finally:
        model.train(was_training)


def same_function(reference: torch.Tensor, logits: torch.Tensor, atol: float = 1e-4) -> bool:
    """Whether two probe results are the same function's (log-softmax within ``atol``; widths cut to the smaller)."""
    width = min(reference.shape[-1], logits.shape[-1])
    a = torch.log_softmax(reference[..., :width], dim=-1)
    b = torch.log_softmax(logits[..., :width], dim=-1)
    return bool(torch.allclose(a, b, atol=atol, rtol=0))
