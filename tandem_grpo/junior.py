"""The junior: vocabulary checks, loading, independent frozen copies, the check that a junior computes what it
should (frozen, on the senior's device and dtype), and the trainer's choice of its junior."""

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
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .distributed import broadcast_weights
from .models import resolve_model_path


def logits_width(config) -> int:
    return int(config.get_text_config().vocab_size)


def check_same_vocabulary(senior_tokenizer, junior_tokenizer, senior_width: int, junior_width: int) -> None:
    """Raise unless senior and junior share one vocabulary: the same token string for every id, and logits that
    cover every id. Widths may differ by embedding padding (logits are cut to the tokenizer's length,
    [`BoundaryTables.from_tokenizer`][tandem_grpo.handoff.BoundaryTables.from_tokenizer]). Used by every entry point.

    Args:
        senior_tokenizer: the senior's tokenizer.
        junior_tokenizer: the junior's tokenizer.
        senior_width: the senior's logits width (config ``vocab_size``).
        junior_width: the junior's logits width (config ``vocab_size``).

    Raises:
        ValueError: the tokenizers map ids to different tokens (the message names the sizes, the first five
            differing ids and the fix), or a width is smaller than the tokenizer's length.
    """
    fix = "Pick a junior trained with the senior's tokenizer (e.g. a smaller model of the same family)."
    senior_by_id = {i: t for t, i in senior_tokenizer.get_vocab().items()}
    junior_by_id = {i: t for t, i in junior_tokenizer.get_vocab().items()}
    differing = [
        i for i in sorted(set(senior_by_id) | set(junior_by_id)) if senior_by_id.get(i) != junior_by_id.get(i)
    ]
    if differing:
        examples = ", ".join(f"id {i}: {_token(senior_by_id, i)} vs {_token(junior_by_id, i)}" for i in differing[:5])
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
    """Bytes a model's weights take once loaded in ``dtype``, without loading them: the safetensors parameter count
    (local headers or hub metadata) times the element size; a ``*.bin``/``*.pt``-only folder by file size.

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
    # 8-byte little-endian header length, then a JSON header of tensor shapes.
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
    """Raise unless ``copies`` copies of a junior's weights fit in the free memory of ``device`` (pure, so it is
    tested without the hardware).

    Args:
        name: the junior's name or path, for the message.
        weight_bytes: the junior's weights in bytes, in its load dtype
            ([`junior_weight_bytes`][tandem_grpo.junior.junior_weight_bytes]).
        free_bytes: the device's free memory in bytes ([`free_memory_bytes`][tandem_grpo.junior.free_memory_bytes]).
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
    """A frozen copy of ``model`` that shares neither code nor storage with it: a fresh module from a copy of the
    config, weights copied in. Not ``copy.deepcopy``: TRL's ``forward`` closures would keep the live weights. A PEFT
    model is copied with its adapter.

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


def probe_ids(vocab_size: int) -> list[int]:
    """The probe sequence: ``PROBE_LENGTH`` fixed token ids below ``vocab_size``."""
    return [(k * 7919 + 11) % max(vocab_size, 1) for k in range(PROBE_LENGTH)]


@torch.no_grad()
def probe_logits(
    model,
    vocab_size: int,
    context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ids: list[int] | None = None,
) -> torch.Tensor:
    """Float32 logits ``[1, L, V]`` of ``model`` in eval mode on ``ids`` (default: the ``PROBE_LENGTH`` ids of
    ``probe_ids(vocab_size)``), inside ``context`` (e.g. ``senior.disable_adapter``); the train/eval mode is
    restored."""
    device = next(model.parameters()).device
    ids = torch.tensor(probe_ids(vocab_size) if ids is None else ids, device=device)
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


# ------------------------------------------------------------------ the trainer's junior
def senior_vocabulary(model, processing_class) -> tuple[PreTrainedTokenizerBase, int]:
    """The senior's tokenizer and logits width, from its tokenizer and config alone (no weights loaded).

    Args:
        model: the senior, a model or a name or path.
        processing_class: the trainer's ``processing_class``, or ``None`` to load the senior's tokenizer.
    """
    from trl.trainer.utils import get_config_model_id

    source = model if isinstance(model, str) else get_config_model_id(model.config)
    tokenizer = processing_class or AutoTokenizer.from_pretrained(source)
    return tokenizer, logits_width(AutoConfig.from_pretrained(source) if isinstance(model, str) else model.config)


def choose_junior(trainer, junior_path: str | None) -> tuple[PreTrainedModel | None, str | None]:
    """The frozen junior of a trainer that co-generates with the transformers loop, and how the senior runs it.
    The self-pairing paths are in docs/method.md, "The self-paired junior".

    Args:
        trainer: a ``TandemGRPOTrainer`` after ``GRPOTrainer.__init__``.
        junior_path: the resolved ``junior_model_name_or_path``, or ``None`` for self-pairing.

    Returns:
        ``(junior, context)``: the prepared junior (``None`` with ``"disable_adapter"``) and ``context``.

    Raises:
        ValueError: a named junior does not fit the device's free memory.
        RuntimeError: the copy's logits on a probe sequence differ from the senior's.
    """
    from accelerate.utils import is_peft_model
    from trl.trainer.utils import get_config_model_id

    if junior_path is not None:
        return prepare_frozen(trainer, load_like_senior(trainer, junior_path)), None
    if is_zero3(trainer):
        # No rank holds the whole senior: reload it. No probe: a partitioned forward is a collective.
        source = resolve_model_path(get_config_model_id(trainer.model.config))
        return prepare_frozen(trainer, load_like_senior(trainer, source)), None
    width = logits_width(trainer.model.config)
    initial = probe_logits(trainer.model, width)
    if is_peft_model(trainer.model) and same_function(
        initial, probe_logits(trainer.model, width, trainer.model.disable_adapter)
    ):
        # A fresh adapter is the identity: the base with it disabled is the initial senior.
        return None, "disable_adapter"
    if trainer.ref_model is not None and not trainer.args.sync_ref_model and not trainer.is_fsdp_enabled:
        # Not under FSDP: with cpu_ram_efficient_loading ranks > 0 hold zeros, so ranks could pick different juniors.
        if same_function(initial, probe_logits(trainer.accelerator.unwrap_model(trainer.ref_model), width)):
            return trainer.ref_model, None
    junior = frozen_copy(trainer.accelerator.unwrap_model(trainer.model))
    if not same_function(initial, probe_logits(junior, width)):
        raise RuntimeError(
            "The self-paired junior does not compute the senior's initial function (probe logits differ). "
            "Set junior_model_name_or_path to the senior's initial checkpoint."
        )
    return prepare_frozen(trainer, junior), None


def junior_as_reference(trainer, junior_path: str | None):
    """The reference model of the ``kl_to_junior`` ablation: ``junior_path`` loaded like the senior; else TRL's
    reference when it is ``None`` (a PEFT senior: TRL disables the adapter), under ZeRO-3, or the initial senior;
    else a frozen copy of the senior."""
    if junior_path is not None:
        return prepare_frozen(trainer, load_like_senior(trainer, junior_path), fused_head=True)
    if trainer.ref_model is None or is_zero3(trainer):
        return trainer.ref_model
    width = logits_width(trainer.model.config)
    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    if same_function(probe_logits(trainer.model, width), probe_logits(reference, width)):
        return trainer.ref_model
    return prepare_frozen(trainer, frozen_copy(trainer.accelerator.unwrap_model(trainer.model)), fused_head=True)


def load_like_senior(trainer, path: str) -> PreTrainedModel:
    """Load ``path`` frozen, in the senior's dtype and on its device, after checking that it fits there.

    Raises:
        ValueError: the weights do not fit in the device's free memory
            ([`check_junior_fits`][tandem_grpo.junior.check_junior_fits]).
    """
    device = trainer.accelerator.device
    weight_bytes, free_bytes = junior_weight_bytes(path, trainer.model.dtype), free_memory_bytes(device)
    if weight_bytes is not None and free_bytes is not None:
        # Processes share CPU memory; ZeRO-3 loads shards only under zero.Init (zero3_init_flag).
        copies = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
        sharded = is_zero3(trainer) and trainer.accelerator.state.deepspeed_plugin.zero3_init_flag
        shards = trainer.accelerator.num_processes if sharded else 1
        check_junior_fits(path, weight_bytes, free_bytes, device, copies / shards)
    return load_frozen(path, dtype=trainer.model.dtype, device=device)


def prepare_frozen(trainer, model, fused_head: bool = False):
    """``model`` prepared for the trainer's accelerator as TRL prepares its reference model (DeepSpeed, FSDP with
    rank 0's weights broadcast first, or plain); ``fused_head`` adds TRL's fused LM head (for a reference model)."""
    from trl.models import prepare_deepspeed, prepare_fsdp
    from trl.trainer.utils import add_fused_lm_head

    if fused_head:
        add_fused_lm_head(
            model, temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32
        )
    if trainer.is_deepspeed_enabled:
        return prepare_deepspeed(model, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        # Rank 0's weights on every rank before sharding (zeros elsewhere under cpu_ram_efficient_loading).
        broadcast_weights(model)
        return prepare_fsdp(model, trainer.accelerator)
    return trainer.accelerator.prepare_model(model, evaluation_mode=True)


def is_zero3(trainer) -> bool:
    """Whether a transformers ``Trainer`` runs under DeepSpeed ZeRO-3."""
    return trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3
