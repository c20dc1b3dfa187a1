"""The quickstart notebook runs top to bottom (real SmolLM2, two tandem GRPO steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "tandem_grpo_quickstart.ipynb"


@pytest.mark.integration
def test_quickstart_notebook_executes(tmp_path, smollm2_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "senior wrote" in outputs and "senior token fraction per step" in outputs
    html = [o for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert html and 'class="junior"' in html[0]["data"]["text/html"], "the authorship view shows junior words"
    assert (tmp_path / "tandem-notebook" / "training_curves.png").is_file()
