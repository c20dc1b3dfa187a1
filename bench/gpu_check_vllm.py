"""The tiny models ``bench/gpu_check.sh`` runs ``tandem-grpo check`` on: two random Llamas with a word-level
tokenizer (``tests/conftest.py``, head size 32), written to ``--workdir`` (``senior/`` and ``junior/``) unless there;
prints the two folders, one per line. No model hub.

The vLLM parts of the GPU check are ``tandem-grpo check`` itself
([`tandem_grpo.vllm.check_command`][tandem_grpo.vllm.check_command]): compiled with CUDA graphs, async scheduling,
sleep level 2, each against transformers with a named junior, and the 0.40B bf16 model of ``bench/gpu_check.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_models(workdir: Path) -> tuple[str, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    paths = []
    for name, seed in (("senior", 0), ("junior", 1)):
        folder = workdir / name
        if not (folder / "config.json").exists():
            build_tiny_model(seed, head_dim=32).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        paths.append(str(folder))
    return paths[0], paths[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="outputs/gpu-check/vllm")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print("\n".join(write_models(workdir)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
