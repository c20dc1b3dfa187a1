"""Client side of server mode: TRL's ``VLLMClient`` (TRL 1.16) plus tandem requests
([`generate_tandem`][tandem_grpo.vllm.client.TandemVLLMClient.generate_tandem]), a tandem check, a weight path
without CUDA (safetensors files the server loads in one reload of the senior: trainer and server must share a
filesystem), a ``ConnectionError`` naming the command that starts the server, and the server's token: with
``TANDEM_GRPO_SERVER_TOKEN`` set, ``Authorization: Bearer <token>`` on every request of its session (TRL's own
included; a 401 raises a ``PermissionError`` naming the variable,
[`tandem_grpo.vllm.server_token`][tandem_grpo.vllm.server_token]): docs/api/vllm/client.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import torch
from trl.generation.vllm_client import VLLMClient, parse_logprobs

from ..handoff import HandoffRule
from ..sampling import SamplingSettings
from .engine import merge_records, new_uids, request_fields
from .request_args import tandem_extra_args
from .server_token import TOKEN_ENV, server_token

logger = logging.getLogger(__name__)

_FILE_CHUNK_BYTES = 1 << 30


class TandemVLLMClient(VLLMClient):
    """``VLLMClient`` for a tandem server (module docstring).

    Args:
        *args: ``VLLMClient``'s positional arguments.
        start_hint: the command that starts the expected server, quoted in connection errors (default: the
            ``tandem-grpo vllm-serve`` command line).
        **kwargs: ``VLLMClient``'s keyword arguments (``base_url`` or ``host``/``server_port``, ``group_port``,
            ``connection_timeout``).

    Raises:
        ConnectionError: no server answered within ``connection_timeout`` seconds.
        PermissionError: the server refused the request (401): ``TANDEM_GRPO_SERVER_TOKEN`` is unset here or differs
            from the server's (raised by any request, the first one at construction).
        ValueError: ``TANDEM_GRPO_SERVER_TOKEN`` holds a character a header cannot carry.
    """

    def __init__(self, *args, start_hint: str | None = None, **kwargs) -> None:
        self.start_hint = start_hint or "tandem-grpo vllm-serve --model <senior> [--junior-model <junior>]"
        self._file_transport = False
        self._tandem_info: dict | None = None
        self._token = server_token()
        super().__init__(*args, **kwargs)

    @property
    def session(self):
        """TRL's ``requests.Session``, which every request of the client goes through."""
        return self._session

    @session.setter
    def session(self, session) -> None:
        # VLLMClient.__init__ creates the session and sends its first guarded request (/v1/models) before returning,
        # so the token goes on here, when the session is assigned, not after __init__.
        if self._token is not None:
            session.headers["Authorization"] = f"Bearer {self._token}"
        session.hooks["response"].append(self._refused)
        self._session = session

    def _refused(self, response, *args, **kwargs):
        """A ``requests`` response hook: a 401 becomes a ``PermissionError`` that says which token to set."""
        if response.status_code != 401:
            return response
        if self._token is None:
            cause = f"it requires a token and {TOKEN_ENV} is unset in the trainer's environment"
        else:
            cause = f"the token in {TOKEN_ENV} differs from the one the server was started with"
        raise PermissionError(
            f"The vLLM server at {self.base_url} refused {response.request.method} {response.request.path_url} "
            f"(401): {cause}. Set {TOKEN_ENV} to the server's token in the trainer's environment (docs: Training, "
            "Server mode)."
        )

    def check_server(self, total_timeout: float = 0.0, retry_interval: float = 2.0):
        try:
            return super().check_server(total_timeout, retry_interval)
        except OSError as exc:  # requests' ConnectionError and the builtin one are both OSErrors
            raise ConnectionError(
                f"No tandem vLLM server is reachable at {self.base_url} (waited {total_timeout:.0f} s). Start one "
                f"with:\n\n    {self.start_hint}\n\nThe server listens on 127.0.0.1 unless started with --host; on "
                f"another machine, start it with --host 0.0.0.0 (or its address) and {TOKEN_ENV} set on both sides."
            ) from exc

    # --- tandem RPCs ----------------------------------------------------------------------------------------------

    def _rpc(self, method: str, *args: str) -> list:
        response = self.session.post(
            f"{self.base_url}/collective_rpc", json={"method": method, "args": [str(a) for a in args]}
        )
        if response.status_code == 404:
            raise RuntimeError(
                f"The vLLM server at {self.base_url} has no /collective_rpc endpoint (it needs "
                f"VLLM_SERVER_DEV_MODE=1). Start it with `{self.start_hint}`."
            )
        if response.status_code != 200:
            raise RuntimeError(
                f"The vLLM server at {self.base_url} failed `{method}` ({response.status_code}: "
                f"{response.text[:300]}). Is it a tandem server? Start one with `{self.start_hint}`."
            )
        return response.json()["results"]

    def check_tandem(self) -> dict:
        """The server's tandem settings
        ([`TandemWorkerExtension.tandem_info`][tandem_grpo.vllm.worker.TandemWorkerExtension.tandem_info]), cached.

        Raises:
            RuntimeError: the server is not a tandem server (plain ``vllm serve``/``trl vllm-serve``).
        """
        if self._tandem_info is None:
            info = self._rpc("tandem_info")[0]
            if not isinstance(info, dict) or not info.get("is_tandem"):
                raise RuntimeError(
                    f"The vLLM server at {self.base_url} does not host a tandem model. Start one with "
                    f"`{self.start_hint}`."
                )
            self._tandem_info = info
        return self._tandem_info

    def generate_tandem(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        rule: HandoffRule,
        sampling: SamplingSettings | None = None,
        *,
        max_tokens: int = 256,
        generation_kwargs: Mapping[str, object] | None = None,
        max_concurrent_requests: int = 64,
    ) -> tuple[list[list[int]], list[list[float]] | None, list[dict | None]]:
        """Tandem completions, one per ``(prompt, seed)``.

        Args:
            prompts: token-id prompts.
            seeds: one coin-stream seed per prompt.
            rule: the handoff rule.
            sampling: the sampling settings (default ``SamplingSettings()``).
            max_tokens: completion length cap (default 256); see
                [`request_fields`][tandem_grpo.vllm.engine.request_fields].
            generation_kwargs: more ``SamplingParams`` fields; see
                [`request_fields`][tandem_grpo.vllm.engine.request_fields].
            max_concurrent_requests: requests in flight (default 64).

        Raises:
            ValueError: as many seeds as prompts are needed; see also
                [`request_fields`][tandem_grpo.vllm.engine.request_fields].

        Returns:
            ``(completion_ids, mixture_logprobs, records)``: token ids, vLLM's ``log P`` per token (``NaN`` where
            missing), and the processor's record per completion; assemble them with
            [`Rollout.from_engine`][tandem_grpo.rollout.Rollout.from_engine].
        """
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds: pass one seed per completion.")
        if not prompts:
            return [], [], []
        sampling = sampling or SamplingSettings()
        uids = new_uids(len(prompts))
        base = {
            "model": self.model,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **request_fields(sampling, max_tokens, generation_kwargs),
        }

        def send(i: int) -> dict:
            xargs = tandem_extra_args(seeds[i], uids[i], rule, sampling)
            payload = {**base, "prompt": list(prompts[i]), "vllm_xargs": xargs}
            return self._post(f"{self.base_url}/v1/completions", json=payload)["choices"][0]

        with ThreadPoolExecutor(max_workers=min(max_concurrent_requests, len(prompts))) as executor:
            choices = list(executor.map(send, range(len(prompts))))
        completion_ids = [list(choice["token_ids"]) for choice in choices]
        logprobs, _ = parse_logprobs([choice.get("logprobs") for choice in choices])
        mixture = None
        if logprobs is not None:
            mixture = [[math.nan if lp[0] is None else float(lp[0]) for lp in seq] for seq in logprobs]
        records = merge_records(self._rpc("tandem_pop_records", json.dumps(uids)), uids)
        return completion_ids, mixture, records

    # --- weights --------------------------------------------------------------------------------------------------

    def init_communicator(self, device: torch.device | str | int = 0):
        """TRL's NCCL weight-transfer group on CUDA; elsewhere, select the file path (module docstring)."""
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type == "cuda":
            return super().init_communicator(device)
        self.check_tandem()
        self._file_transport = True
        logger.warning(
            "Trainer device is %s: senior weights reach the vLLM server through files in %s (trainer and server "
            "must share that filesystem).",
            device,
            tempfile.gettempdir(),
        )

    def update_named_params(self, metadata, named_params):
        if not self._file_transport:
            return super().update_named_params(metadata, named_params)
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="tandem-grpo-weights-") as folder:
            # Every file is written before the server loads any: it must load them all in ONE reload of the senior.
            # A reload per file would rebuild a layer whose weights straddle two files (e.g. q_proj in one and k_proj
            # in the next, both packed into qkv_proj) from the first file alone, leaving uninitialized memory in the
            # rest of the layer; the next reload repeats that for the other part.
            paths: list[str] = []
            chunk: dict[str, torch.Tensor] = {}
            size = 0
            for name, tensor in named_params:
                chunk[name] = tensor.detach().to("cpu").contiguous()
                size += chunk[name].numel() * chunk[name].element_size()
                if size >= _FILE_CHUNK_BYTES:
                    paths.append(self._write_file(save_file, chunk, os.path.join(folder, f"{len(paths)}.safetensors")))
                    chunk, size = {}, 0
            if chunk:
                paths.append(self._write_file(save_file, chunk, os.path.join(folder, f"{len(paths)}.safetensors")))
            if paths:
                self._rpc("tandem_load_weights", json.dumps(paths))

    @staticmethod
    def _write_file(save_file, chunk: dict, path: str) -> str:
        save_file(chunk, path)
        os.chmod(path, 0o644)
        return path

    def close_communicator(self):
        if not self._file_transport:
            super().close_communicator()
