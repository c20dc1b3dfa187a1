"""The shared token that guards every route of ``tandem-grpo vllm-serve``, and where the server may listen without one.

What is exposed: the server is vLLM's own OpenAI server run with ``VLLM_SERVER_DEV_MODE=1`` (TRL's client needs the
dev routes). vLLM's ``--api-key`` guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (vLLM's
``AuthenticationMiddleware``); ``/init_weight_transfer_engine``, ``/update_weights``, ``/collective_rpc`` (any
worker method, including ``tandem_load_weights``, which loads safetensors files named by the caller), ``/pause``,
``/sleep``, ``/reset_prefix_cache`` and the rest answer anyone who reaches the port, so anyone on the network could
overwrite the senior being trained.

The token: the environment variable ``TANDEM_GRPO_SERVER_TOKEN`` (:data:`TOKEN_ENV`), read by the server and by
the trainer's client ([`TandemVLLMClient`][tandem_grpo.vllm.client.TandemVLLMClient]), which sends it as
``Authorization: Bearer <token>`` on every request. An environment variable, not a flag or a config field: it stays
out of the process list, of the ``Starting:`` line, of ``training_args.bin`` and of the trackers that log a
config, and ``accelerate launch`` and job schedulers pass it on unchanged.

- Server: [`ServerTokenMiddleware`][tandem_grpo.vllm.server_token.ServerTokenMiddleware], installed through vLLM's
  public ``--middleware`` hook, refuses (401) every HTTP request and WebSocket without the token, on every route
  but ``GET /health`` (an empty 200 or 503 that load balancers and TRL's ``check_server`` poll without headers).
- Where the server listens (:func:`check_exposure`): ``127.0.0.1`` unless ``--host`` says otherwise. Without a
  token it may listen on a loopback address only; elsewhere it is refused unless ``--allow_unauthenticated`` is
  given, and then warned about. A refusal, not a warning, because a warning scrolls past in vLLM's start-up log
  while the open routes rewrite the weights of a run; the flag keeps trusted private networks one word away.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os

TOKEN_ENV = "TANDEM_GRPO_SERVER_TOKEN"
"""The environment variable that holds the shared token, on the server's machine and the trainer's."""

MIDDLEWARE = "tandem_grpo.vllm.server_token.ServerTokenMiddleware"
"""The import path passed to vLLM's ``--middleware``."""

OPEN_PATHS = frozenset({"/health"})
"""Paths answered without the token (``GET`` and ``HEAD`` only)."""

_HOW = (
    f"Set {TOKEN_ENV} to the same secret in the server's and the trainer's environment (for instance "
    f"`export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')` once, before both)."
)


def server_token() -> str | None:
    """The token in ``TANDEM_GRPO_SERVER_TOKEN``, or ``None`` when it is unset or empty.

    Raises:
        ValueError: the token holds a character an HTTP header cannot carry as typed (space, control, non-ASCII).
    """
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        return None
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ValueError(
            f"{TOKEN_ENV} holds a space, a control or a non-ASCII character, which an `Authorization` header cannot "
            "carry as typed. Use printable ASCII without spaces, e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`."
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only; other names count as
    reachable from elsewhere (they are not resolved)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(
    host: str, port: int, token: str | None, allow_unauthenticated: bool, extra_args: list[str]
) -> str | None:
    """Check where a server would listen and how it is guarded; return a warning to print, or ``None``.

    Args:
        host: the address the server binds (``--host``).
        port: its port, for the messages.
        token: :func:`server_token`.
        allow_unauthenticated: ``--allow_unauthenticated``: serve on a non-loopback address without a token.
        extra_args: the flags forwarded to ``vllm serve`` (``--api-key`` is looked for).

    Raises:
        ValueError: a non-loopback ``host`` without a token or ``--allow_unauthenticated``; or vLLM's own
            ``--api-key`` flag, or a ``VLLM_API_KEY`` other than the token (vLLM would then ask the trainer for a
            key it does not send).
    """
    api_key_flag = any(arg.split("=", 1)[0] in ("--api-key", "--api_key") for arg in extra_args)
    vllm_key = os.environ.get("VLLM_API_KEY") or None  # vLLM ignores an empty one
    if api_key_flag or (vllm_key is not None and vllm_key != token):
        raise ValueError(
            "vLLM's --api-key (or VLLM_API_KEY) guards only the /v1-style routes and the trainer does not send it; "
            f"{TOKEN_ENV} guards every route. Drop --api-key and unset VLLM_API_KEY (or set it to the same value). "
            + _HOW
        )
    if token is not None or is_loopback(host):
        return None
    where = f"on {host}:{port} without a token"
    risk = (
        "anyone who can reach that port can overwrite the senior being trained (/update_weights, /collective_rpc) "
        "or pause the server."
    )
    if not allow_unauthenticated:
        raise ValueError(
            f"Refusing to serve {where}: {risk} {_HOW} Or serve on 127.0.0.1 (the default), or pass "
            "--allow_unauthenticated on a network you trust."
        )
    return f"WARNING: serving {where} (--allow_unauthenticated): {risk} {_HOW}"


def bearer_matches(authorization: str | None, digest: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` with ``sha256(token) == digest``; compared
    in constant time."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not value:
        return False
    return hmac.compare_digest(hashlib.sha256(value.strip().encode()).digest(), digest)


class ServerTokenMiddleware:
    """Pure ASGI middleware: every HTTP request and WebSocket must carry ``Authorization: Bearer <token>``, the token
    read from ``TANDEM_GRPO_SERVER_TOKEN`` in the server's process; ``GET``/``HEAD`` on :data:`OPEN_PATHS` pass.

    A refused HTTP request gets 401 with a JSON body naming the variable (never the token); a refused WebSocket is
    closed before it is accepted (code 1008, which the server answers with HTTP 403).

    Args:
        app: the ASGI app to guard (vLLM's FastAPI app; vLLM's ``--middleware`` passes only this).

    Raises:
        RuntimeError: no token in the environment: the server would run open while its command asked for a guard.
    """

    def __init__(self, app) -> None:
        self.app = app
        token = server_token()
        if token is None:
            raise RuntimeError(
                f"{MIDDLEWARE} guards the server with {TOKEN_ENV}, which is unset or empty in the server's "
                "environment. " + _HOW
            )
        self._digest = hashlib.sha256(token.encode()).digest()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers

        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        open_path = scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and path in OPEN_PATHS
        if open_path or bearer_matches(Headers(scope=scope).get("authorization"), self._digest):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        from starlette.responses import JSONResponse

        message = (
            f"Unauthorized: this tandem-grpo server requires `Authorization: Bearer <{TOKEN_ENV}>` on every route "
            f"but /health. Set {TOKEN_ENV} in the client's environment to the server's token."
        )
        response = JSONResponse({"error": message}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
