"""Resume from the last *complete* checkpoint, past any that an interrupt left half-written: transformers (5.19) writes
``checkpoint-N`` in place, ``trainer_state.json`` last, and ``resume_from_checkpoint=True`` takes the
highest-numbered folder whatever it holds, so a save cut short fails the resume (``FileNotFoundError``; details:
docs/api/checkpointing.md).

:class:`ResumeFromCompleteCheckpoint` makes ``resume_from_checkpoint=True`` take the highest-numbered complete
checkpoint instead; an explicit path is used as given. Nothing is deleted: the resumed run writes the skipped folders
again, in place, when it reaches their steps (a folder that keeps transformers' JIT marker stays skipped).
"""

from __future__ import annotations

import json
import logging
import os
import re

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

# Written by transformers' JIT checkpointing (``enable_jit_checkpoint=True``) before it saves a checkpoint, possibly
# over a complete one, and removed once the save is done (transformers/trainer_jit_checkpoint.py).
JIT_INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"

_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")  # as get_last_checkpoint's


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Whether the Trainer finished writing the checkpoint folder ``path``.

    ``trainer_state.json`` is the last file ``_save_checkpoint`` writes and the one resuming reads first: it must
    parse (a write cut short leaves truncated JSON), and transformers' JIT-checkpoint marker must be absent.
    """
    if os.path.exists(os.path.join(path, JIT_INCOMPLETE_MARKER)):
        return False
    try:
        with open(os.path.join(path, TRAINER_STATE_NAME), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and "global_step" in state


def checkpoint_folders(folder: str | os.PathLike) -> list[str]:
    """The ``checkpoint-N`` folders in ``folder``, highest step first (none when ``folder`` does not exist)."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        match = _CHECKPOINT_NAME.match(name)
        if match and os.path.isdir(os.path.join(folder, name)):
            found.append((int(match.group(1)), os.path.join(folder, name)))
    return [path for _, path in sorted(found, reverse=True)]


def last_complete_checkpoint(folder: str | os.PathLike) -> str | None:
    """``transformers.trainer_utils.get_last_checkpoint`` that skips incomplete checkpoints: the path of the
    highest-numbered complete ``checkpoint-N`` in ``folder``, or None."""
    return next((path for path in checkpoint_folders(folder) if is_complete_checkpoint(path)), None)


class ResumeFromCompleteCheckpoint:
    """Trainer mixin (list it before the Trainer class): ``train(resume_from_checkpoint=True)`` resumes from the
    last complete checkpoint in ``args.output_dir``, skipping newer ones an interrupted save left incomplete."""

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint is True:
            folder = self.args.output_dir
            resume_from_checkpoint = last_complete_checkpoint(folder)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({folder})")  # transformers' words
            skipped = [p for p in checkpoint_folders(folder) if _step(p) > _step(resume_from_checkpoint)]
            if skipped:
                logger.warning(
                    "Resuming from %s: skipping %s, left incomplete by an interrupted save.",
                    resume_from_checkpoint,
                    ", ".join(skipped),
                )
        return super().train(resume_from_checkpoint, *args, **kwargs)


def _step(path: str) -> int:
    return int(_CHECKPOINT_NAME.match(os.path.basename(path)).group(1))
