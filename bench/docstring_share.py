"""The share of the package's non-blank lines that are documentation (issue 42's target: at most 28%).

A non-blank line of ``tandem_grpo/**/*.py`` counts as documentation when

- every token on it (Python's ``tokenize``, leaving out ``NL``, ``NEWLINE``, ``INDENT`` and ``DEDENT``) is a
  ``COMMENT``, or
- it lies inside a docstring: a string-literal expression statement that is the first statement of a module, a
  class or a (async) function (``ast``), from its first line to its last.

Everything else that is not blank is code, lines inside any other string literal included. The share is
documentation lines / non-blank lines, per module and in total. Usage::

    python bench/docstring_share.py                    # the working tree's tandem_grpo/
    python bench/docstring_share.py /tmp/old/tandem_grpo
    python bench/docstring_share.py --rev 9acf2a6      # a commit's tandem_grpo/, read with git show
    python bench/docstring_share.py --total            # the total line only
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def comment_lines(source: str) -> set[int]:
    kinds: dict[int, set[int]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in _LAYOUT:
            continue
        for line in range(token.start[0], token.end[0] + 1):
            kinds.setdefault(line, set()).add(token.type)
    return {line for line, types in kinds.items() if types == {tokenize.COMMENT}}


def count(source: str) -> tuple[int, int]:
    """(documentation lines, non-blank lines) of one module's source."""
    non_blank = {number for number, line in enumerate(source.splitlines(), 1) if line.strip()}
    documentation = (docstring_lines(ast.parse(source)) | comment_lines(source)) & non_blank
    return len(documentation), len(non_blank)


def sources_on_disk(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root.parent)): path.read_text(encoding="utf-8") for path in root.rglob("*.py")}


def sources_at(rev: str) -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout

    names = git("ls-tree", "-r", "--name-only", rev, "--", "tandem_grpo").split()
    return {name: git("show", f"{rev}:{name}") for name in names if name.endswith(".py")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parents[1] / "tandem_grpo")
    parser.add_argument("--rev", help="read tandem_grpo/ at this git revision instead of from disk")
    parser.add_argument("--total", action="store_true", help="print the total line only")
    args = parser.parse_args()

    sources = sources_at(args.rev) if args.rev else sources_on_disk(args.root)
    rows = sorted(((name, *count(text)) for name, text in sources.items()), key=lambda row: -row[1] / max(row[2], 1))
    documentation = sum(row[1] for row in rows)
    non_blank = sum(row[2] for row in rows)
    if not args.total:
        print(f"{'module':<44} {'doc':>5} {'lines':>6} {'share':>6}")
        for name, doc, lines in rows:
            print(f"{name:<44} {doc:>5} {lines:>6} {doc / max(lines, 1):>6.1%}")
    print(f"{'total':<44} {documentation:>5} {non_blank:>6} {documentation / non_blank:>6.1%}")


if __name__ == "__main__":
    main()
