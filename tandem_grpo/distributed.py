"""Several processes without a GPU: make accelerate count them under DeepSpeed and FSDP.

Without a GPU, accelerate (1.15) picks no communication backend for the ranks ``accelerate launch`` starts with a
DeepSpeed or FSDP config: under DeepSpeed each rank's ``Accelerator`` sees one process, and FSDP is never turned on
(docs/api/distributed.md gives what fails). [`cpu_process_state`][tandem_grpo.distributed.cpu_process_state]
creates the process state first, with the gloo backend and, for FSDP, labelled as device-type processes (the device
stays the CPU); the trainer must then keep it: ``accelerator_config={"use_configured_state": True}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

_TRUE = ("1", "true", "yes")


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "false").lower() in _TRUE


def needs_cpu_process_state(
    environ: Mapping[str, str] | None = None, has_accelerator: bool | None = None
) -> str | None:
    """Which launch needs [`cpu_process_state`][tandem_grpo.distributed.cpu_process_state]: ``"deepspeed"``,
    ``"fsdp"``, or ``None`` for none.

    ``None`` unless several processes were launched (``WORLD_SIZE > 1``) under DeepSpeed or FSDP on a machine
    without an accelerator, and ``ACCELERATE_USE_CPU`` is not set (an explicit request for plain CPU DDP).

    Args:
        environ: the environment to read (default ``os.environ``).
        has_accelerator: whether torch sees a GPU or another accelerator (default: asks torch).
    """
    environ = os.environ if environ is None else environ
    if has_accelerator is None:
        has_accelerator = _has_accelerator()
    if has_accelerator or _flag(environ, "ACCELERATE_USE_CPU") or int(environ.get("WORLD_SIZE", "1")) < 2:
        return None
    if _flag(environ, "ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    if _flag(environ, "ACCELERATE_USE_FSDP"):
        return "fsdp"
    return None


def cpu_process_state() -> dict[str, Any]:
    """Set up accelerate's process state for DeepSpeed or FSDP processes without a GPU; return the config fields
    that make the trainer use it.

    Call it before the ``TandemGRPOConfig`` (any ``TrainingArguments``) is built, and pass what it returns to it::

        config = TandemGRPOConfig(output_dir="out", **cpu_process_state())

    Where nothing needs it (a GPU, a single process, DDP, ``ACCELERATE_USE_CPU=true``) it does nothing. Otherwise
    it creates ``accelerate.PartialState(backend="gloo")`` and, under FSDP, labels it ``MULTI_GPU`` (the device
    stays ``cpu``); the module docstring says why.

    Returns:
        Config fields to pass to ``TandemGRPOConfig`` (``accelerator_config``), or ``{}``.

    Raises:
        RuntimeError: the process state was already created without the gloo backend (a ``TrainingArguments`` or
            ``Accelerator`` built before this call).
    """
    launch = needs_cpu_process_state()
    if launch is None:
        return {}
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    if PartialState._shared_state and PartialState().backend != "gloo":
        raise RuntimeError(
            "cpu_process_state() must run before any TrainingArguments / TandemGRPOConfig / Accelerator is built: "
            f"the process state already exists with backend {PartialState().backend!r}."
        )
    state = PartialState(backend="gloo")
    if launch == "fsdp":
        # AcceleratorState enables FSDP only for device-type processes (accelerate/state.py).
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU
    if state.num_processes != int(os.environ["WORLD_SIZE"]):
        raise RuntimeError(f"The gloo process group has {state.num_processes} of {os.environ['WORLD_SIZE']} ranks.")
    return {"accelerator_config": {"use_configured_state": True}}


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


@torch.no_grad()
def broadcast_weights(model: torch.nn.Module, src: int = 0) -> None:
    """Overwrite every parameter and persistent buffer of ``model`` with process ``src``'s, in place.

    A collective: every process of the default group must call it, with the same architecture. Under FSDP a frozen
    model must be broadcast before it is sharded: with ``fsdp_cpu_ram_efficient_loading`` (TRL's FSDP configs),
    transformers loads the weights on local rank 0 only and fills them with zeros elsewhere, and TRL's
    ``prepare_fsdp`` shards whatever each rank holds (accelerate broadcasts the trained model's weights, not those of
    the models TRL prepares). Without a process group, or with one process, it does nothing.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if torch.distributed.get_world_size() < 2:
        return
    for tensor in model.state_dict(keep_vars=True).values():
        torch.distributed.broadcast(tensor.data, src=src)
