"""The README's ten-line example, extracted from README.md (not a copy) and shrunk to one short step.

Used by ``tests/test_readme.py`` and by ``.ci/run``, which runs it with an installed wheel outside the source tree:
``python tests/readme_example.py README.md | <venv>/bin/python -``. Standard library only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SECTION = "## Usage: swap the trainer and its config"
# Only sizes change; each must occur exactly once in the block, so an edited README fails loudly here.
ONE_STEP = {"max_steps=5": "max_steps=1", "max_completion_length=64": "max_completion_length=16",
            "arithmetic_word_problems(1000,": "arithmetic_word_problems(8,"}  # fmt: skip
CHECK = '\nassert trainer.state.global_step == 1, trainer.state.global_step\nprint("README example: 1 step done")\n'


def ten_line_example(readme: str | Path) -> str:
    """The first ```python block after the README's usage heading."""
    text = Path(readme).read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    if match is None:
        raise ValueError(f"{readme}: no ```python block after {SECTION!r}")
    return match.group(1)


def one_step(code: str) -> str:
    """``code`` with the sizes of :data:`ONE_STEP` replaced, then a check that one optimizer step ran."""
    for old, new in ONE_STEP.items():
        if code.count(old) != 1:
            raise ValueError(f"the README example must contain {old!r} exactly once (found {code.count(old)})")
        code = code.replace(old, new)
    return code + CHECK


if __name__ == "__main__":
    sys.stdout.write(one_step(ten_line_example(sys.argv[1] if len(sys.argv) > 1 else "README.md")))
