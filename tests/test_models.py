"""`resolve_model_path` error paths (no download, no model load)."""

from __future__ import annotations

import pytest

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
