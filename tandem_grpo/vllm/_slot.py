"""Hand-off of the junior's logits from the model's ``compute_logits`` to the logits processor.

Both run in the same vLLM worker process, one right after the other, inside one engine step: the V1 model runner
calls ``model.compute_logits(hidden_states[logits_indices])`` and then the sampler, which calls the logits
processors on the returned (senior) logits, whose rows are in the same order. A module global is the simplest
channel that needs no change to vLLM.
"""

from __future__ import annotations

import torch

_junior_logits: torch.Tensor | None = None


def put_junior_logits(logits: torch.Tensor) -> None:
    """Publish the junior's logits ``[num_sampled_rows, V]`` of the current step."""
    global _junior_logits
    _junior_logits = logits


def take_junior_logits() -> torch.Tensor | None:
    """Return and clear the junior's logits of the current step (``None`` if none were published)."""
    global _junior_logits
    logits, _junior_logits = _junior_logits, None
    return logits
