"""What the engine check costs a training step, as a share of the step, measured inside one run.

    python bench/engine_check_cost.py                          # vLLM colocate (CPU: float32, eager), 3 steps
    python bench/engine_check_cost.py --backend transformers   # the transformers decode loop

The main job's settings (``examples/train_math.py``): SmolLM2-135M-Instruct, built-in two-step chain problems, 2
prompts x 8 completions of up to 128 tokens, temperature 0.7, top-k 20, top-p 0.8, word handoffs at
``--junior_probability`` (default 0.5), ``engine_check="warn"``. Every piece of the check is timed where it runs,
in the same process and the same steps as the training it checks:

- ``start``: the junior's probe at start-up (once; reported, not counted per step);
- ``after_sync``: sync coverage and the junior's probe after each weight sync (vLLM);
- ``at_loss``: the comparison at the first loss after each generation;
- ``kept_mass``: the tandem processor's ``logsumexp`` over each truncated row (vLLM; timed inside
  ``truncate_with_kept_mass``, minus the truncation itself, which sampling needs anyway);
- ``senior_term``: the transformers loop's gather of the senior's term per drawn token.

Prints one JSON line per step (TRL's ``step_time``, the check's seconds, their ratio) and a summary with the share
over the steps after the first (the first holds the engine's warm-up) and the machine. Ratios, not times, are what
it is for: they hold when other processes share the CPU, times do not.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

TIMES: dict[str, float] = defaultdict(float)


def _timed(name: str, func):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            TIMES[name] += time.perf_counter() - start

    return wrapper


def _instrument() -> None:
    import torch

    import tandem_grpo.generation as generation
    import tandem_grpo.sampling as sampling
    import tandem_grpo.vllm.mixing as mixing
    from tandem_grpo.engine_check import EngineCheck

    EngineCheck.start = _timed("start", EngineCheck.start)
    EngineCheck.after_sync = _timed("after_sync", EngineCheck.after_sync)
    EngineCheck.at_loss = _timed("at_loss", EngineCheck.at_loss)
    generation._senior_term = _timed("senior_term", generation._senior_term)

    def truncate_with_kept_mass(logprobs, top_k=0, top_p=1.0, min_p=0.0):
        masked = sampling._masked(logprobs, top_k, top_p, min_p)
        start = time.perf_counter()
        kept = None if masked is logprobs else torch.logsumexp(masked, dim=-1)
        TIMES["kept_mass"] += time.perf_counter() - start
        return torch.log_softmax(masked, dim=-1), kept

    mixing.truncate_with_kept_mass = truncate_with_kept_mass  # both runners' processors mix through vllm.mixing


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("vllm", "transformers"), default="vllm")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--junior_probability", type=float, default=0.5)
    parser.add_argument("--output_dir", default="outputs/engine-check-cost")
    args = parser.parse_args(argv)
    _instrument()

    import torch

    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
    from tandem_grpo.data import INSTRUCTIONS, builtin_split
    from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
    from tandem_grpo.rewards import accuracy_reward

    use_vllm = args.backend == "vllm"
    config = TandemGRPOConfig(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=16, num_generations=8,
        max_completion_length=128, temperature=0.7, top_k=20, top_p=0.8, learning_rate=2e-5, logging_steps=1,
        report_to=[], save_strategy="no", seed=0, junior_probability=args.junior_probability, use_vllm=use_vllm,
        vllm_mode="colocate", vllm_gpu_memory_utilization=0.2, vllm_max_model_length=512,
        vllm_importance_sampling_correction=False, use_cpu=not torch.cuda.is_available(),
    )  # fmt: skip
    train, _ = builtin_split("chain2", 64, 0, seed=0, instruction=INSTRUCTIONS["steps"])
    path = resolve_model_path(SMOLLM2_ID)
    options = {"dtype": "float32", "enforce_eager": True} if use_vllm and not torch.cuda.is_available() else {}
    build = lambda: TandemGRPOTrainer(model=path, reward_funcs=[accuracy_reward], args=config, train_dataset=train)  # noqa: E731
    if use_vllm:
        from tandem_grpo.vllm.trl_generation import use_tandem_vllm

        with use_tandem_vllm(config, **options):
            trainer = build()
    else:
        trainer = build()
    start_seconds = TIMES.pop("start", 0.0)
    per_step = []

    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def on_step_end(self, *_, **__):
            per_step.append(dict(TIMES))
            TIMES.clear()

    trainer.add_callback(StepTimes())
    trainer.train()
    # The run's whole log history beside the lines below: the figures as training logged them.
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    Path(args.output_dir, "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    steps = [entry for entry in trainer.state.log_history if "step_time" in entry]
    ratios = []
    for entry, times in zip(steps, per_step, strict=False):
        check = sum(times.values())
        ratios.append(check / entry["step_time"])
        print(json.dumps({"step": entry["step"], "step_seconds": round(entry["step_time"], 2),
                          "check_seconds": round(check, 4), "ratio": round(ratios[-1], 5),
                          "parts": {k: round(v, 4) for k, v in times.items()},
                          "engine_logp_diff_mean": entry.get("tandem/engine_logp_diff/mean"),
                          "engine_logp_diff_max": entry.get("tandem/engine_logp_diff/max")}), flush=True)  # fmt: skip
    later = ratios[1:] or ratios
    print(json.dumps({"summary": True, "backend": args.backend, "steps": len(ratios),
                      "check_share_of_step": round(sum(later) / max(len(later), 1), 5),
                      "max_share": round(max(later, default=0.0), 5), "start_seconds": round(start_seconds, 3),
                      "cpu": _cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(),
                      "threads": torch.get_num_threads()}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
