"""The argument parser of the example scripts (``examples/train_math.py``, ``examples/reproduce_paper.py``).

Follows TRL's own scripts (``trl/scripts/grpo.py`` parses ``ScriptArguments``, ``GRPOConfig`` and ``ModelConfig``
with ``TrlParser``); only the error handling differs.
"""

from __future__ import annotations

from trl import TrlParser


class ScriptParser(TrlParser):
    """TRL's ``TrlParser`` (one flag per dataclass field, ``--config`` YAML files) with argparse's usage errors.

    Three differences, all about errors: flags are never abbreviated (``allow_abbrev=False``); a bad flag prints one
    ``<prog>: error: ... (see --help)`` line and exits with status 2 (argparse would print the whole usage first,
    200+ lines for a ``GRPOConfig``); and an unknown flag is such an error (``unrecognized arguments: --lr 1``),
    where ``HfArgumentParser`` raises a ``ValueError`` about arguments "not used by the HfArgumentParser".
    """

    def __init__(self, *args, **kwargs) -> None:
        # Without this, argparse takes any unambiguous prefix (--learning for --learning_rate) and calls a short one
        # such as --lr "ambiguous"; a misspelled or shortened flag is refused as unrecognized instead.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """Print ``<prog>: error: <message> (see --help)`` and exit with status 2 (``SystemExit``)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_args_into_dataclasses(self, args=None, return_remaining_strings: bool = False, **kwargs):
        """``HfArgumentParser.parse_args_into_dataclasses``; leftover strings are returned only when asked for,
        otherwise they are a usage error (:meth:`error`, exit status 2)."""
        *parsed, remaining = super().parse_args_into_dataclasses(args, return_remaining_strings=True, **kwargs)
        if return_remaining_strings:
            return (*parsed, remaining)
        if remaining:
            self.error(f"unrecognized arguments: {' '.join(remaining)}")
        return tuple(parsed)
