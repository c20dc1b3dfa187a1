"""The ``tandem-grpo`` console script: ``tandem-grpo evaluate ...``, ``tandem-grpo vllm-serve ...`` and
``tandem-grpo check ...``."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

STARTUP_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError, ImportError)
"""What bad settings raise before any long work starts (OSError covers FileNotFoundError and ConnectionError)."""


@contextlib.contextmanager
def usage_errors(prog: str) -> Iterator[None]:
    """Turn a bad setting raised inside the block into one ``<prog>: error: ...`` line on stderr and exit status 2,
    as argparse does for a bad flag, instead of a traceback. Use it around parsing, data loading and model set-up,
    not around training: a fault in the middle of a run keeps its traceback.

    Raises:
        SystemExit: with code 2, after printing the message, for any of :data:`STARTUP_ERRORS`.
    """
    try:
        yield
    except STARTUP_ERRORS as err:
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from err


COMMANDS = {
    "evaluate": ("tandem_grpo.evaluation.cli", "Measure solo pass@k, handoff robustness, drift and legibility."),
    "vllm-serve": ("tandem_grpo.vllm.serve", "Start a vLLM server hosting the senior and the junior (server mode)."),
    "check": ("tandem_grpo.vllm.check_command", "Check the tandem engine against transformers on this machine."),
}


def _usage() -> str:
    lines = ["usage: tandem-grpo <command> [options]", "", "commands:"]
    lines += [f"  {name:<12} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run `tandem-grpo <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(__version__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"tandem-grpo: unknown command {command!r}.\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
