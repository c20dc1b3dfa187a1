"""Peak memory of a LoRA tandem run against a full-weights tandem run, measured in one invocation.

    python bench/bench_lora_memory.py                # SmolLM2-135M-Instruct, 2 steps each

Each arm trains ``--steps`` tandem GRPO steps (self-paired junior, p = 0.5) in a fresh process of its own, so one
arm's allocations cannot hide the other's, and reports its peak resident memory (``ru_maxrss``) and where its junior
came from. With LoRA the self-paired junior is the base with the adapter disabled (no second copy of the weights);
the full-weights arm holds a frozen copy of the senior plus Adam's two moments.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ARM = r"""
import json, resource, sys
from peft import LoraConfig
from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
from tandem_grpo.data import arithmetic_word_problems
from tandem_grpo.models import resolve_model_path
from tandem_grpo.rewards import accuracy_reward

model, arm, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
args = TandemGRPOConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=8, num_generations=4,
                        max_completion_length=32, learning_rate=1e-5, report_to=[], save_strategy="no",
                        logging_steps=1, junior_probability=0.5)
lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
peft_config = lora if arm == "lora" else None
trainer = TandemGRPOTrainer(model=resolve_model_path(model), reward_funcs=[accuracy_reward], args=args,
                            train_dataset=arithmetic_word_problems(64, seed=0), peft_config=peft_config)
junior = "base with the adapter disabled" if trainer._junior_context == "disable_adapter" else "frozen copy"
trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
trainer.train()
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
print("RESULT " + json.dumps({"arm": arm, "peak_mib": peak_mib, "junior": junior, "trainable": trainable}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--output_dir", default="outputs/bench-lora-memory")
    args = parser.parse_args()
    results = {}
    for arm in ("full", "lora"):
        proc = subprocess.run(
            [sys.executable, "-c", ARM, args.model, arm, str(args.steps), f"{args.output_dir}/{arm}"],
            capture_output=True,
            text=True,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"{arm} arm failed:\n{proc.stderr[-3000:]}")
        results[arm] = json.loads(lines[-1].removeprefix("RESULT "))
        r = results[arm]
        line = f"{arm:>4}: peak {r['peak_mib']:.0f} MiB, {r['trainable']:,} trainable parameters"
        print(f"{line}, junior: {r['junior']}", flush=True)
    print(f"ratio LoRA / full peak memory: {results['lora']['peak_mib'] / results['full']['peak_mib']:.2f}")


if __name__ == "__main__":
    main()
