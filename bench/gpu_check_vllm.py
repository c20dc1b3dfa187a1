"""The tandem engine on vLLM's Model Runner V2, on a GPU with vLLM installed: one part per call, so that
``bench/gpu_check.sh`` can give each its own timeout.

Parts (``--part``):

- ``compiled``: a tandem engine built as TRL's colocate mode builds it (in process, compiled, CUDA graphs), async
  scheduling as vLLM's default has it (on); tandem rollouts whose engine authorship must equal the rule's replay
  ([`Rollout.from_engine`][tandem_grpo.rollout.Rollout.from_engine] raises otherwise).
- ``async``: the same, eager, with ``async_scheduling=True`` stated, two rules and two sampling settings in one batch.
- ``sleep``: sleep mode as TRL 1.16 drives it: ``sleep(level=2)``, weights woken, the senior reloaded with changed
  weights, KV cache woken, rollouts, sleep again; the junior's parameters must come back unchanged (kept by
  ``sleep_preserve_parameter_names=["junior.*"]``) and the senior's must be the new ones.

Models: two random tiny Llamas and a word-level tokenizer (``tests/conftest.py``), written to ``--workdir``; no
model hub. Prints one JSON line per part; exits non-zero on a failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _models(workdir: Path) -> tuple[str, str]:
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


def _engine_model(llm):
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


def _checksum(module) -> float:
    import torch

    with torch.no_grad():
        return float(sum(p.double().sum() for p in module.parameters()))


def _rollouts(llm, rules, sampling, count: int = 16):
    from tandem_grpo.vllm.engine import generate_with_llm

    prompts = [[2 + k % 20, 3 + k % 7] for k in range(count)]
    rollout = generate_with_llm(llm, prompts, list(range(count)), rules, sampling, max_tokens=40)
    return sum(len(ids) for ids in rollout.completion_ids), rollout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("compiled", "async", "sleep"), required=True)
    parser.add_argument("--workdir", default="outputs/gpu-check/vllm")
    args = parser.parse_args(argv)

    from tandem_grpo.handoff import HandoffRule
    from tandem_grpo.sampling import SamplingSettings
    from tandem_grpo.vllm._compat import model_runner
    from tandem_grpo.vllm.engine import build_llm

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    senior, junior = _models(workdir)
    start = time.time()
    options = {"gpu_memory_utilization": 0.3, "max_model_len": 256, "dtype": "float32"}
    if args.part == "compiled":
        options["enforce_eager"] = False
    elif args.part == "async":
        options.update(enforce_eager=True, async_scheduling=True)
    else:
        options.update(enforce_eager=True, enable_sleep_mode=True, sleep_preserve_parameter_names=["junior.*"])
    runner = model_runner({**options, "distributed_executor_backend": "external_launcher"})
    if runner != "v2":
        print(json.dumps({"part": args.part, "ok": False, "error": f"vLLM would run Model Runner {runner}"}))
        return 1
    llm = build_llm(senior, junior, **options)
    rule = HandoffRule("word", 0.5, 4)
    plain = SamplingSettings(temperature=0.9)
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    result = {"part": args.part, "runner": runner, "async_scheduling": scheduler.async_scheduling}
    if args.part == "async":
        whole = HandoffRule("word", 0.5, 4, "whole_unit")
        tokens, _ = _rollouts(llm, [rule, whole] * 8, SamplingSettings(temperature=1.2, top_k=12, top_p=0.9))
        result["tokens"] = tokens
    elif args.part == "compiled":
        result["tokens"], _ = _rollouts(llm, rule, plain)
    else:
        model = _engine_model(llm)
        junior_before, senior_before = _checksum(model.junior), _checksum(model.senior)
        llm.sleep(level=2)
        llm.wake_up(tags=["weights"])
        from tandem_grpo.vllm.model import iter_checkpoint

        changed = [(name, tensor * 1.01) for name, tensor in iter_checkpoint(senior)]
        model.reload_senior(iter(changed))
        llm.reset_prefix_cache()
        llm.wake_up(tags=["kv_cache"])
        result["tokens"], _ = _rollouts(llm, rule, plain)
        llm.sleep(level=2)
        llm.wake_up()
        junior_after, senior_after = _checksum(model.junior), _checksum(model.senior)
        result.update(junior_kept=junior_after == junior_before, senior_changed=senior_after != senior_before)
        if not (result["junior_kept"] and result["senior_changed"]):
            result["ok"] = False
            print(json.dumps(result))
            return 1
    result.update(ok=True, seconds=round(time.time() - start, 1))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
