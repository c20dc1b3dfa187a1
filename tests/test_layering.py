"""The package's import structure, read from the source with ``ast`` (no model, no vLLM, nothing imported):
``tandem_grpo/vllm/`` is the lower layer, which the trainer and the evaluation build on, so no module under it
imports ``tandem_grpo.evaluation`` or ``tandem_grpo.trainer`` (function-level imports included); and no two modules
of the package import each other at module level, through any chain.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tandem_grpo"
UPPER_LAYERS = ("tandem_grpo.evaluation", "tandem_grpo.trainer")


def module_names(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file of the package under ``root``."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """``(imported module, line, at module level)`` of every import of the package's modules in ``path``; a
    statement is at module level unless it sits in a function (``if``/``try``/``TYPE_CHECKING`` blocks and class
    bodies run on import). ``from X import y`` imports ``X.y`` where that is a module, else ``X``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in modules else base, child.lineno, top))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, True)
    return [(m, line, top) for m, line, top in found if m == PACKAGE or m.startswith(PACKAGE + ".")]


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def layer_violations(root: Path) -> list[str]:
    """``"file:line imports module"`` for every import (any level) of an upper layer from ``tandem_grpo/vllm/``."""
    modules = module_names(root)
    return list(
        dict.fromkeys(
            f"{path.relative_to(root)}:{line} imports {target}"
            for name, path in modules.items()
            if name == "tandem_grpo.vllm" or name.startswith("tandem_grpo.vllm.")
            for target, line, _ in imports(name, path, modules)
            if any(target == upper or target.startswith(upper + ".") for upper in UPPER_LAYERS)
        )
    )


def module_level_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules it imports at module level}``; a module's imports of itself do not count."""
    modules = module_names(root)
    return {
        name: {target for target, _, top in imports(name, path, modules) if top and target != name}
        for name, path in modules.items()
    }


def test_vllm_imports_neither_the_evaluation_nor_the_trainer():
    found = layer_violations(ROOT)
    assert not found, "tandem_grpo/vllm/ is the lower layer, but " + "; ".join(found)


def test_no_import_cycle_between_the_package_modules():
    found = cycle(module_level_graph(ROOT))
    assert found is None, "module-level import cycle: " + " -> ".join(found)


def test_the_evaluation_imports_without_vllm():
    """vLLM is optional: with it missing, the evaluation and its backend factory import, and only building a vLLM
    backend fails, with an ImportError."""
    code = """
import sys, types
sys.modules["vllm"] = None  # as if vLLM were not installed: importing it raises ImportError
import torch
from tandem_grpo.evaluation import create_backend
model = types.SimpleNamespace(name_or_path="unused", dtype=torch.float32)
try:
    create_backend("vllm", model, types.SimpleNamespace(pad_token_id=0), max_model_len=8)
except ImportError:
    pass
else:
    raise AssertionError("create_backend('vllm') built a backend without vLLM")
"""
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, cwd=ROOT)


@pytest.fixture
def copy_of_package(tmp_path: Path) -> Path:
    for path in module_names(ROOT).values():
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


def test_the_checks_see_a_function_level_upward_import_and_a_cycle(copy_of_package: Path):
    violations, graph = layer_violations(copy_of_package), module_level_graph(copy_of_package)
    engine = copy_of_package / "tandem_grpo" / "vllm" / "engine.py"
    engine.write_text(engine.read_text() + "\n\ndef f():\n    from ..evaluation.runner import evaluate\n")
    line = len(engine.read_text().splitlines())
    added = set(layer_violations(copy_of_package)) - set(violations)
    assert added == {f"tandem_grpo/vllm/engine.py:{line} imports tandem_grpo.evaluation.runner"}
    assert module_level_graph(copy_of_package) == graph  # a function-level import is no module-level edge
    handoff = copy_of_package / "tandem_grpo" / "handoff.py"
    handoff.write_text(handoff.read_text() + "\nfrom .sampling import SamplingSettings  # noqa\n")
    sampling = copy_of_package / "tandem_grpo" / "sampling.py"
    sampling.write_text(sampling.read_text() + "\nfrom .handoff import HandoffRule  # noqa\n")
    found = cycle(module_level_graph(copy_of_package))
    assert found is not None and found[0] == found[-1]
    assert {"tandem_grpo.handoff", "tandem_grpo.sampling"} <= set(found)
