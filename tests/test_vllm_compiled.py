"""The tandem engine compiled, as TRL's colocate mode builds it: ``vllm.LLM(...)`` without ``enforce_eager`` (trl
1.16 ``generation/vllm_generation.py``), so vLLM compiles each model's decoder (``LlamaModel``, decorated with
``@support_torch_compile``) with torch.compile.

Two ways compilation could run a wrong junior, one case each:

- self-pairing: the two decoders have the same structure, so vLLM's compile-cache keys (which hash the config, not
  the weights) are equal and the junior runs the artifact compiled for the senior. Correct only if the artifact reads
  the weights of the module it runs on: after training (senior moved, junior not) a junior that ran the senior's
  weights would follow the trained senior.
- a named junior of another size (wider, deeper): its own graph, shapes and cache keys. With vLLM's piecewise mode
  (GPUs) both decoders' pieces would share one cache folder and key (shape range, piece index, compiler) and the
  junior would load the senior's pieces (vllm-project/vllm #28759) unless it is built under a compile tag of its own
  (``TandemForCausalLM``); the test asserts the tags differ.

The checks are those of ``tests/test_vllm_frozen_junior.py``, through the engine's log-probs: the junior computes its
initial function before and after training, the senior the initial then the trained one.

What a CPU exercises: vLLM's CPU platform turns the default compilation mode (``VLLM_COMPILE``: piecewise graphs,
and CUDA graphs on a GPU) into ``DYNAMO_TRACE_ONCE`` with Inductor (vllm/platforms/cpu.py), with its AOT compile
cache (torch >= 2.10); the test asserts that both decoders really compiled. Piecewise splitting and CUDA graphs are
not exercised (docs/compatibility.md).

Slow: each engine compiles (about 3-4 min each on 2 busy cores). Each case starts from an empty vLLM cache folder
(``VLLM_CACHE_ROOT``), as CI's fresh machine does. Marked ``compiled`` (and ``vllm``: CI environment A runs it).
"""

from __future__ import annotations

import pytest
from conftest import build_tiny_model, build_tiny_tokenizer, skip_without_vllm

skip_without_vllm()

from test_vllm_frozen_junior import EAGER, check_colocate, run_colocate  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.compiled]

COMPILED = {key: value for key, value in EAGER.items() if key != "enforce_eager"}
"""What TRL's colocate mode passes about compilation: nothing (vLLM's default mode)."""


@pytest.fixture(scope="module")
def senior(tmp_path_factory) -> str:
    """The tiny senior of ``tests/test_vllm_frozen_junior.py`` (hidden 16, MLP 32, 2 layers, head size 32)."""
    path = tmp_path_factory.mktemp("vllm-senior")
    build_tiny_model(0, head_dim=32).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def wide_junior(tmp_path_factory) -> str:
    """A tiny Llama of another size than the senior (hidden 32, MLP 48, 3 layers; the senior: 16, 32, 2), same
    tokenizer."""
    import torch
    from transformers import LlamaForCausalLM

    config = build_tiny_model(0, head_dim=32).config
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 32, 48, 3
    torch.manual_seed(2)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # as sharp as build_tiny_model's
    path = tmp_path_factory.mktemp("vllm-wide-junior")
    model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


def _vllm_at_least(version: str) -> bool:
    import vllm
    from packaging.version import Version

    return Version(Version(vllm.__version__).base_version) >= Version(version)


@pytest.mark.parametrize("pairing", ["wide", "self"])
def test_compiled_colocate_junior_stays_frozen_through_weight_syncs(tmp_path, senior, wide_junior, pairing):
    import torch

    from tandem_grpo.vllm.model import JUNIOR_COMPILE_TAG

    junior = wide_junior if pairing == "wide" else None
    cache = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    result = run_colocate(tmp_path, senior, junior, COMPILED, env=cache)
    compilation = result["compilation"]
    expected_mode = "VLLM_COMPILE" if torch.cuda.is_available() else "DYNAMO_TRACE_ONCE"
    assert compilation["mode"] == expected_mode, compilation
    assert compilation["senior"] and compilation["junior"], f"both decoders compiled: {compilation}"
    if _vllm_at_least("0.32"):  # vLLM 0.31 records no tag on the module: its VllmBackend (VLLM_COMPILE only) reads it
        assert compilation["tags"] == ["backbone", JUNIOR_COMPILE_TAG], compilation
    # Each decoder's compile caches are keyed by its own config (a junior keyed by the senior's would load the
    # senior's compiled artifact).
    assert compilation["keyed_hidden"] == [16, 32 if pairing == "wide" else 16], compilation
    check_colocate(tmp_path, result, senior, junior)
