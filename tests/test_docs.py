"""The documentation site: `mkdocs build --strict` passes, the guide pages are in the navigation and render, and the
API pages show the package's docstrings.

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
# The guide pages (the README's "everything else"), each with the title it must render.
GUIDE_PAGES = {
    "method.md": "The method",
    "training.md": "Training",
    "evaluation.md": "Evaluation: the paper's four measurements",
    "reproducing.md": "Reproducing the paper",
    "troubleshooting.md": "Troubleshooting",
    "compatibility.md": "Install and compatibility",
    "speed.md": "Speed",
}

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
    ("api/evaluation/stats/index.html", "tandem_grpo.evaluation.stats.pass_at_k"),
    ("api/vllm/index.html", "tandem_grpo.vllm._compat.check_vllm"),
    ("api/vllm/processor_v1/index.html", "tandem_grpo.vllm.processor_v1.TandemLogitsProcessor"),
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


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_guide_pages_are_in_the_nav_and_linked_from_home() -> None:
    import yaml

    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    home = (DOCS / "index.md").read_text()
    guide = sorted(path.name for path in DOCS.glob("*.md") if path.name != "index.md")
    assert guide == sorted(GUIDE_PAGES), "a guide page was added or removed: update GUIDE_PAGES"
    for name in guide:
        assert name in nav, f"docs/{name} is not in mkdocs.yml's nav"
        assert f"]({name})" in home, f"docs/index.md does not link docs/{name}"
    assert "github.com/tandem-grpo/tandem-grpo#" not in home, "docs/index.md points to README anchors, not pages"


@pytest.mark.parametrize("name", sorted(GUIDE_PAGES))
def test_guide_pages_render(site: Path, name: str) -> None:
    """Each guide page renders its title, and each of its markdown tables renders as a table with every row."""
    source = (DOCS / name).read_text()
    rendered = (site / Path(name).stem / "index.html").read_text()
    assert GUIDE_PAGES[name] in html.unescape(re.sub(r"<[^>]+>", "", rendered))
    # A markdown table is a block of lines that start and end with "|": a header, a separator, then its rows.
    source_rows = [len(block.splitlines()) - 1 for block in re.findall(r"(?m)(?:^\|.*\|$\n?)+", source)]
    rendered_rows = [len(re.findall(r"<tr>", table)) for table in re.findall(r"(?s)<table>.*?</table>", rendered)]
    assert rendered_rows == source_rows, f"{name}: table rows {source_rows} in markdown, {rendered_rows} rendered"
