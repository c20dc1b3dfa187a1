"""Run-time guards: a reward function's output is checked where it is returned, and a non-finite loss, log-prob or
set of weights stops the run with a message that says where it happened and what to try, before the fault spreads
(TRL reads rewards without checking them; transformers logs a NaN loss as 0, ``logging_nan_inf_filter``, and the
optimizer would write NaN weights).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "NON_FINITE_ADVICE",
    "check_reward_output",
    "checked_reward_func",
    "require_finite_logprobs",
    "require_finite_loss",
    "require_finite_weights",
]

NON_FINITE_ADVICE = (
    "Try a lower learning_rate, max_grad_norm=1.0, bf16 instead of fp16 (or fp32), and check that every reward "
    "function returns finite numbers."
)


def check_reward_output(output: Any, name: str, expected: int) -> list[float | None]:
    """Validate what a reward function returned, before TRL reads it.

    Args:
        output: the returned value. A list or tuple (or a 1-D tensor / array) of ``expected`` entries, each a real
            number or ``None`` (TRL's "does not apply to this completion"; NaN means the same).
        name: the reward function's name, for the message.
        expected: the number of completions it was called on.

    Returns:
        The entries as a list (tensors and arrays converted).

    Raises:
        TypeError: ``output`` is not a sequence, or an entry is neither a real number nor None (names the row).
        ValueError: the length differs from ``expected``, or an entry is ``inf`` / ``-inf`` (names the row).
    """
    if hasattr(output, "tolist") and not isinstance(output, (list, tuple)):
        output = output.tolist()
    if not isinstance(output, (list, tuple)):
        raise TypeError(
            f"Reward function {name!r} returned {type(output).__name__} {_short(output)}; it must return a list of "
            f"{expected} numbers, one per completion (None where it does not apply)."
        )
    if len(output) != expected:
        raise ValueError(
            f"Reward function {name!r} returned {len(output)} values for {expected} completions; it must return one "
            "number per completion (None where it does not apply)."
        )
    for row, value in enumerate(output):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"Reward function {name!r} returned {type(value).__name__} {_short(value)} for completion {row}; "
                "each value must be a real number, or None where the function does not apply."
            )
        if math.isinf(value):
            raise ValueError(
                f"Reward function {name!r} returned {value} for completion {row}: an infinite reward makes every "
                "advantage of its group NaN. Return a finite number, or None where the function does not apply."
            )
    return list(output)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def checked_reward_func(func: Callable) -> Callable:
    """Wrap a reward function (sync or async, TRL's calling convention) so that its output is validated by
    [`check_reward_output`][tandem_grpo.guards.check_reward_output] and an exception it raises names it. TRL's name
    for it is kept.

    Reward models (``nn.Module``) and model ids (``str``) are returned unchanged.
    """
    from trl.trainer.utils import get_callable_name, is_async_callable  # not at import: the vLLM worker needs no TRL

    if isinstance(func, (str, torch.nn.Module)) or not callable(func):
        return func
    name = get_callable_name(func)

    def note(err: BaseException, completions: Any) -> None:
        if hasattr(err, "add_note"):  # Python >= 3.11
            err.add_note(f"(raised by reward function {name!r} on a batch of {len(completions or [])} completions)")

    if is_async_callable(func):

        async def checked_async(*args, completions=None, **kwargs):
            try:
                output = await func(*args, completions=completions, **kwargs)
            except Exception as err:
                note(err, completions)
                raise
            return check_reward_output(output, name, len(completions))

        wrapper = checked_async
    else:

        def checked(*args, completions=None, **kwargs):
            try:
                output = func(*args, completions=completions, **kwargs)
            except Exception as err:
                note(err, completions)
                raise
            return check_reward_output(output, name, len(completions))

        wrapper = checked
    functools.update_wrapper(wrapper, func, assigned=("__module__", "__qualname__", "__doc__"), updated=())
    wrapper.__name__ = name
    wrapper.__wrapped__ = func
    return wrapper


def require_finite_logprobs(logprobs: torch.Tensor, model: str) -> None:
    """Raise when a model's normalized log-probabilities hold NaN (its logits held NaN or ``+inf``).

    Args:
        logprobs: float ``[B, V]``, the output of a log-softmax (``-inf`` entries are allowed: tokens with
            probability 0).
        model: ``"senior"`` or ``"junior"``, for the message.

    Raises:
        FloatingPointError: naming the model and what to try.
    """
    if bool(torch.isnan(logprobs).any()):
        rows = torch.isnan(logprobs).any(dim=-1).nonzero().flatten().tolist()
        frozen = "" if model == "senior" else " The junior is frozen: check its checkpoint and dtype (fp16 overflows)."
        raise FloatingPointError(
            f"The {model}'s logits are not finite (NaN or +inf) in rows {rows[:8]} of this generation step, so no "
            f"token can be drawn.{frozen} {NON_FINITE_ADVICE}"
        )


def require_finite_loss(trainer, loss: torch.Tensor) -> None:
    """Stop before the optimizer applies NaN gradients: transformers would log the loss as 0 through
    ``logging_nan_inf_filter`` and the next rollout would crash on NaN weights. Gathered, so every rank stops.

    Raises:
        FloatingPointError: some rank's loss is not finite, naming the optimizer step and the ranks.
    """
    losses = trainer.accelerator.gather(loss.detach().float().reshape(1))
    if not bool(torch.isfinite(losses).all()):
        ranks = (~torch.isfinite(losses)).nonzero().flatten().tolist()
        raise FloatingPointError(
            f"Optimizer step {trainer.state.global_step + 1}: the senior's loss is {losses[ranks[0]].item()} (rank "
            f"{ranks}). Training stopped before the optimizer step, so the weights and the last checkpoint are "
            f"unchanged. {NON_FINITE_ADVICE}"
        )


def require_finite_weights(trainer) -> None:
    """Refuse to write a checkpoint of non-finite weights over the last good one (checked on every rank).

    Raises:
        FloatingPointError: some rank's senior holds NaN or inf.
    """
    local = all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters() if p.numel())
    flags = trainer.accelerator.gather(torch.tensor([float(local)], device=trainer.accelerator.device))
    if not bool(flags.all()):
        raise FloatingPointError(
            f"Optimizer step {trainer.state.global_step}: the senior's weights hold NaN or inf; not writing a "
            f"checkpoint over the last good one. {NON_FINITE_ADVICE}"
        )
