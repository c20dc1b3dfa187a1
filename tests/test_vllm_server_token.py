"""Who may use a ``tandem-grpo vllm-serve`` server (``tandem_grpo.vllm.server_token``).

- Where it listens, and what its command line carries (no engine): 127.0.0.1 by default, the token guard when
  ``TANDEM_GRPO_SERVER_TOKEN`` is set, a refusal on another address without a token.
- vLLM's own FastAPI app, built by vLLM's ``build_app`` from vLLM's own argument parser with the ``--middleware``
  our server passes, under Starlette's in-process test client (no socket, no engine): every route it has refuses a
  request without the token, but ``GET /health``.
- A real tiny tandem server on a loopback port (``vllm`` marker; an engine starts in about 15 s on a CPU): its weight
  routes refuse a request without the token, and a trainer with the token trains a step and syncs its senior into
  the server (checked against transformers).
"""

from __future__ import annotations

import secrets

import pytest
import torch
from conftest import build_tiny_model, build_tiny_tokenizer, skip_without_vllm, tandem_server

from tandem_grpo.vllm.server_token import MIDDLEWARE, TOKEN_ENV, check_exposure, is_loopback, server_token

CPU = not torch.cuda.is_available()
TOKEN = secrets.token_urlsafe(16)


@pytest.fixture(autouse=True)
def _no_token_from_the_shell(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def test_where_a_server_may_listen_without_a_token(monkeypatch):
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
        assert check_exposure(host, 8000, None, False, []) is None
    for host in ("0.0.0.0", "::", "10.1.2.3", "trainer-node"):  # a name is not resolved: it may be any interface
        assert not is_loopback(host), host
        with pytest.raises(ValueError, match=f"Refusing to serve on {host}:8000 without a token.*{TOKEN_ENV}.*"
                           "--allow_unauthenticated"):  # fmt: skip
            check_exposure(host, 8000, None, False, [])
        assert check_exposure(host, 8000, TOKEN, False, []) is None
        assert check_exposure(host, 8000, None, True, []).startswith(f"WARNING: serving on {host}:8000 without")
    # vLLM's --api-key guards /v1 only, and the trainer does not send it.
    for flags in (["--api-key", "k"], ["--api-key=k"], ["--api_key", "k"]):
        with pytest.raises(ValueError, match="--api-key.*guards only the /v1-style routes"):
            check_exposure("127.0.0.1", 8000, TOKEN, False, flags)
    monkeypatch.setenv("VLLM_API_KEY", "other")
    with pytest.raises(ValueError, match="VLLM_API_KEY"):
        check_exposure("127.0.0.1", 8000, TOKEN, False, [])
    monkeypatch.setenv("VLLM_API_KEY", TOKEN)  # the same secret: the trainer's token satisfies vLLM's check too
    assert check_exposure("127.0.0.1", 8000, TOKEN, False, []) is None


def test_the_token_comes_from_the_environment(monkeypatch):
    assert server_token() is None
    monkeypatch.setenv(TOKEN_ENV, "")
    assert server_token() is None
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert server_token() == TOKEN
    for bad in ("two words", "tab\there", "naïve"):
        monkeypatch.setenv(TOKEN_ENV, bad)
        with pytest.raises(ValueError, match=f"{TOKEN_ENV} holds a space, a control or a non-ASCII character"):
            server_token()


def _bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


# ----------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    model = build_tiny_model(0)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.vllm
def test_server_command_listens_on_loopback_and_carries_the_guard(monkeypatch, tiny_checkpoint, caplog):
    skip_without_vllm()
    from tandem_grpo.vllm.serve import server_command

    def flag(command, name):
        return command[command.index(name) + 1] if name in command else None

    command = server_command(["--model", tiny_checkpoint])
    assert flag(command, "--host") == "127.0.0.1"  # TRL's default is 0.0.0.0
    assert "--middleware" not in command  # no token: open, on loopback only
    with pytest.raises(ValueError, match="Refusing to serve on 0.0.0.0:8000 without a token"):
        server_command(["--model", "/nonexistent/model", "--host", "0.0.0.0"])  # before the model is looked up
    with caplog.at_level("WARNING", logger="tandem_grpo.vllm.serve"):
        command = server_command(["--model", tiny_checkpoint, "--host", "0.0.0.0", "--allow_unauthenticated"])
    assert flag(command, "--host") == "0.0.0.0" and "--middleware" not in command
    assert "WARNING: serving on 0.0.0.0:8000 without a token" in caplog.text
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    command = server_command(["--model", tiny_checkpoint, "--host", "0.0.0.0", "--port", "8011"])
    assert flag(command, "--host") == "0.0.0.0" and flag(command, "--middleware") == MIDDLEWARE
    assert TOKEN not in " ".join(command)  # the server's process reads it from its environment


# ----------------------------------------------------------------- vLLM's app, in process


@pytest.fixture(scope="module")
def vllm_app():
    """vLLM's FastAPI app as ``vllm serve`` builds it in dev mode with our ``--middleware``, and a test client."""
    skip_without_vllm()
    testclient = pytest.importorskip("starlette.testclient")
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_SERVER_DEV_MODE", "1")
    mp.setenv(TOKEN_ENV, TOKEN)
    try:
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", "--middleware", MIDDLEWARE])
        app = build_app(args, supported_tasks=("generate",))
        # Not entered as a context manager: vLLM's lifespan would start an engine. The middleware stack is built at
        # the first request, while the token is set.
        yield app, testclient.TestClient(app, raise_server_exceptions=False)
    finally:
        mp.undo()


@pytest.mark.vllm
def test_every_route_of_vllms_app_refuses_a_request_without_the_token(vllm_app):
    """Each route (dev-mode weight, RPC, pause and sleep routes, and the ``/v1`` ones) with each of its methods: no
    header, another token, another scheme are refused with 401 before vLLM runs anything; the token passes (vLLM's
    handler then answers, here without an engine). ``/health`` is open to ``GET``."""
    app, client = vllm_app
    calls = sorted({(m, r.path) for r in app.routes for m in getattr(r, "methods", None) or () if m != "HEAD"})
    paths = {path for _, path in calls}
    for weight_route in ("/init_weight_transfer_engine", "/update_weights", "/collective_rpc", "/pause", "/sleep"):
        assert weight_route in paths, weight_route  # dev mode is on: the routes a trainer needs exist
    assert len(calls) > 40
    refused = []
    for method, path in [*calls, ("POST", "/no_such_route")]:
        for headers in ({}, _bearer("wrong"), {"Authorization": f"Basic {TOKEN}"}, {"X-Api-Key": TOKEN}):
            refused.append(client.request(method, path, headers=headers).status_code == 401)
        if path == "/health" and method == "GET":
            assert refused[-4:] == [False] * 4
            continue
        assert refused[-4:] == [True] * 4, (method, path)
        response = client.request(method, path, headers=_bearer(TOKEN))
        assert response.status_code != 401, (method, path)
    body = client.post("/update_weights", json={}).json()["error"]
    assert TOKEN_ENV in body and TOKEN not in body
    from starlette.websockets import WebSocketDisconnect

    with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect("/v1/realtime"):
        pass
    assert closed.value.code == 1008


def test_the_middleware_refuses_to_run_open():
    """``--middleware`` with no token in the server's environment stops the server instead of serving open."""
    from tandem_grpo.vllm.server_token import ServerTokenMiddleware

    with pytest.raises(RuntimeError, match=f"{TOKEN_ENV}, which is unset or empty in the server's environment"):
        ServerTokenMiddleware(app=None)


# ----------------------------------------------------------------- a real server


@pytest.fixture(scope="module")
def tiny_senior(tmp_path_factory):
    path = tmp_path_factory.mktemp("vllm-senior")
    build_tiny_model(0, head_dim=32).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def guarded_server(tiny_senior, tmp_path_factory):
    skip_without_vllm()
    args = ["--model", tiny_senior, "--max_model_len", "128", "--gpu_memory_utilization", "0.2"]
    args += ["--dtype", "float32", "--enforce_eager"] if CPU else []
    log = tmp_path_factory.mktemp("server") / "server.log"
    with tandem_server(args, log, env={TOKEN_ENV: TOKEN}) as url:
        yield url


@pytest.mark.vllm
def test_a_real_servers_weight_routes_refuse_a_request_without_the_token(guarded_server, tiny_senior):
    import requests

    from tandem_grpo.vllm.client import TandemVLLMClient

    requests_sent = {
        "/init_weight_transfer_engine": {"init_info": {"master_address": "127.0.0.1", "master_port": 9,
                                                       "rank_offset": 1, "world_size": 2}},
        "/update_weights": {"update_info": {"names": ["lm_head.weight"], "dtype_names": ["float32"],
                                            "shapes": [[25, 16]], "packed": True}},
        "/collective_rpc": {"method": "tandem_load_weights", "args": ["[]"]},
        "/pause": {},
        "/v1/completions": {"model": tiny_senior, "prompt": [2, 3], "max_tokens": 1},
    }  # fmt: skip
    for path, payload in requests_sent.items():
        for headers in ({}, _bearer("wrong")):
            response = requests.post(f"{guarded_server}{path}", json=payload, headers=headers, timeout=30)
            assert response.status_code == 401, (path, response.status_code, response.text[:300])
    assert requests.get(f"{guarded_server}/health", timeout=30).status_code == 200
    assert requests.get(f"{guarded_server}/is_paused", headers=_bearer(TOKEN), timeout=30).json() == {
        "is_paused": False
    }  # /pause above did not reach the server

    with pytest.raises(PermissionError, match=f"refused GET /v1/models \\(401\\).*{TOKEN_ENV} is unset"):
        TandemVLLMClient(base_url=guarded_server, connection_timeout=10)


@pytest.mark.vllm
def test_a_trainer_with_the_token_trains_and_syncs_through_a_guarded_server(
    guarded_server, tiny_senior, tmp_path, monkeypatch
):
    """TRL's own client requests (``/v1/models``, ``/server_info``, ``/get_world_size``, ``/reset_prefix_cache``) and
    the tandem ones (``/v1/completions``, ``/collective_rpc``: records, the CPU weight load) all carry the token: one
    training step, then the synced senior in the server computes the trained model's log-probs (transformers), not
    the initial ones."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
    from tandem_grpo.handoff import HandoffRule

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    args = TandemGRPOConfig(
        output_dir=str(tmp_path / "out"), vllm_mode="server", vllm_server_base_url=guarded_server,
        vllm_server_timeout=60, use_vllm=True, vllm_max_model_length=128, use_cpu=CPU, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, max_steps=1, learning_rate=5e-2, report_to=[],
        save_strategy="no", seed=5,
    )  # fmt: skip
    trainer = TandemGRPOTrainer(
        model=tiny_senior,
        reward_funcs=lambda completions, **kwargs: [float(len(c)) for c in completions],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab c", "d e", "f.\ng", "h"] * 2}),
        processing_class=build_tiny_tokenizer(),
    )
    client = trainer.vllm_generation.vllm_client
    assert client.session.headers["Authorization"] == f"Bearer {TOKEN}"
    assert client.get_world_size() == 1 and client.get_server_info()  # TRL's own methods, dev routes
    trainer.train()
    trainer.vllm_generation.sync_weights()  # the step's update, as the next rollout would push it
    assert trainer.state.global_step == 1

    prompt = [2, 10, 3, 11]
    ids, logprobs, _ = client.generate_tandem([prompt] * 2, [11, 12], HandoffRule("word", 0.0, 32), max_tokens=6)

    def gap(model) -> float:
        model.eval()
        worst = 0.0
        for completion, engine in zip(ids, logprobs, strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
            own = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
            worst = max(worst, (torch.tensor(engine) - own).abs().max().item())
        return worst

    initial = AutoModelForCausalLM.from_pretrained(tiny_senior, dtype=torch.float32)
    assert gap(trainer.model) < 1e-4  # the engine's senior is the trained one
    assert gap(initial) > 1e-2  # and the step moved it far enough for that to mean something
