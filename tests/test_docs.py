"""The documentation site: `mkdocs build --strict` passes and the API pages show the package's docstrings.

The expected texts are read from the docstrings themselves (parsed statically with griffe, the parser mkdocstrings
uses), so the test follows docstring edits but fails when a page renders empty or misses an object.
"""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest


def _missing(*modules: str) -> list[str]:
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package is missing
            found = False
        if not found:
            missing.append(module)
    return missing


_MISSING = _missing("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "griffe")
if _MISSING:
    pytest.skip(
        f"docs tooling not installed ({', '.join(_MISSING)}); install it with: pip install -e '.[docs]'",
        allow_module_level=True,
    )

import griffe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Public modules deliberately without a page of their own.
NOT_ON_A_PAGE = {
    "tandem_grpo.cli": "the console script; its subcommands are tandem_grpo.evaluation.cli and tandem_grpo.vllm.serve",
    "tandem_grpo.config": "TandemGRPOConfig is on the tandem_grpo page",
    "tandem_grpo.trainer": "TandemGRPOTrainer is on the tandem_grpo page",
}

# (page, object path): the object's docstring must be rendered on that page.
KEY_OBJECTS = [
    ("api/tandem_grpo/index.html", "tandem_grpo.config.TandemGRPOConfig"),
    ("api/tandem_grpo/index.html", "tandem_grpo.trainer.TandemGRPOTrainer"),
    ("api/tandem_grpo/index.html", "tandem_grpo.handoff.HandoffRule"),
    ("api/tandem_grpo/index.html", "tandem_grpo.sampling.SamplingSettings"),
    ("api/handoff/index.html", "tandem_grpo.handoff.HandoffRule"),
    ("api/handoff/index.html", "tandem_grpo.handoff.mixture_logprobs"),
    ("api/sampling/index.html", "tandem_grpo.sampling.SamplingSettings"),
    ("api/generation/index.html", "tandem_grpo.generation.tandem_generate"),
    ("api/data/index.html", "tandem_grpo.data.load_math_dataset"),
    ("api/rewards/index.html", "tandem_grpo.rewards.accuracy_reward"),
    ("api/evaluation/runner/index.html", "tandem_grpo.evaluation.runner.evaluate"),
    ("api/evaluation/metrics/index.html", "tandem_grpo.evaluation.metrics.pass_at_k"),
    ("api/vllm/index.html", "tandem_grpo.vllm._compat.check_vllm"),
    ("api/vllm/processor/index.html", "tandem_grpo.vllm.processor.TandemLogitsProcessor"),
]


def _normalize(text: str) -> str:
    """Text as a reader sees it: cross-references ``[text][target]`` shown as their text, markup characters dropped,
    whitespace collapsed."""
    text = re.sub(r"\[([^\]]+)\]\[[\w.]*\]", r"\1", text)
    return " ".join(re.sub(r"[`*]", "", text).split())


def _page_text(page_html: str) -> str:
    body = re.sub(r"(?s)<(script|style|head)\b.*?</\1>", " ", page_html)
    return _normalize(html.unescape(re.sub(r"<[^>]+>", "", body)))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    warnings = "\n".join(line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{warnings or result.stderr[-5000:]}"
    return site_dir


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    return griffe.load(
        "tandem_grpo",
        search_paths=[str(ROOT)],
        docstring_parser="google",
        docstring_options={"warn_missing_types": False},
    )


def _expected_texts(obj: griffe.Object) -> list[str]:
    """The summary line of ``obj``'s docstring and the description of each documented parameter/attribute."""
    assert obj.docstring is not None, f"{obj.path} has no docstring"
    texts = [obj.docstring.value.split("\n\n")[0]]
    for section in obj.docstring.parsed:
        if section.kind.value in ("parameters", "attributes"):
            texts += [item.description for item in section.value if item.description]
    return [_normalize(text) for text in texts]


def test_build_writes_every_page(site: Path) -> None:
    pages = sorted(path.relative_to(DOCS).with_suffix("") for path in DOCS.rglob("*.md"))
    assert pages, "docs/ holds no page"
    for page in pages:
        out = site / (page.parent if page.name == "index" else page) / "index.html"
        assert out.is_file(), f"docs/{page}.md was not rendered to {out}"


def test_api_pages_are_not_empty(site: Path, package: griffe.Module) -> None:
    """Every `::: object` directive renders an API block holding at least the object's docstring summary."""
    for source in sorted((DOCS / "api").rglob("*.md")):
        targets = re.findall(r"^::: ([\w.]+)", source.read_text(), flags=re.M)
        if not targets:
            continue
        page = source.relative_to(DOCS).with_suffix("")
        out = site / (page.parent if page.name == "index" else page) / "index.html"
        rendered = out.read_text()
        assert "doc-object" in rendered, f"{out} renders no API object"
        text = _page_text(rendered)
        for target in targets:
            obj = package if target == "tandem_grpo" else package.get_member(target.removeprefix("tandem_grpo."))
            summary = _expected_texts(obj)[0]
            assert summary in text, f"{out} lacks the docstring of {target}: {summary!r}"


def test_every_public_module_has_a_page(package: griffe.Module) -> None:
    directives = "\n".join(path.read_text() for path in DOCS.rglob("*.md"))
    documented = set(re.findall(r"^::: ([\w.]+)", directives, flags=re.M))

    def modules(module: griffe.Module):
        yield module
        for name, member in module.modules.items():
            if not name.startswith("_"):
                yield from modules(member)

    missing = [m.path for m in modules(package) if m.path not in documented and m.path not in NOT_ON_A_PAGE]
    assert not missing, f"public modules without an API page: {missing}"


@pytest.mark.parametrize(("page", "path"), KEY_OBJECTS, ids=[f"{p.split('/index')[0]}:{o}" for p, o in KEY_OBJECTS])
def test_docstrings_are_rendered(site: Path, package: griffe.Module, page: str, path: str) -> None:
    obj = package.get_member(path.removeprefix("tandem_grpo."))
    text = _page_text((site / page).read_text())
    assert obj.name in text
    for expected in _expected_texts(obj):
        assert expected in text, f"{page} lacks this docstring text of {path}: {expected!r}"


def test_config_fields_are_documented(site: Path) -> None:
    text = _page_text((site / "api/tandem_grpo/index.html").read_text())
    for field in (
        "handoff_granularity",
        "junior_probability",
        "max_gap_tokens",
        "junior_model_name_or_path",
        "junior_token_loss_weight",
        "kl_to_junior",
        "tandem_eval_rollouts",
    ):
        assert field in text, f"TandemGRPOConfig.{field} is missing from the tandem_grpo page"
