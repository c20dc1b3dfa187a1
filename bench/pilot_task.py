"""Pilot of the reproduction study (issue 20): which task, instruction and completion length give
SmolLM2-135M-Instruct a pass@1 between 10% and 40%, with solutions of several blank-line-separated steps?

    python bench/pilot_task.py                                   # vLLM-CPU, about 1.5 h on 2 cores (alone)
    python bench/pilot_task.py --problems 40 --final_problems 0  # a quick look
    python bench/pilot_task.py --rollout_check chain2/steps --problems 40 --max_new_tokens 128 \
        --rollout_temperatures 0.6 0.7 1.0                       # the rollout temperature, at the training cap

A study whose base model cannot solve its task measures nothing (the old cpu-small study: 0 of 80), so this runs
before any training. For each candidate (a built-in problem family x an instruction) it samples ``--samples``
completions of the base model for ``--problems`` problems at the evaluation's sampling settings (the paper preset:
temperature 0.7, top-p 0.8, top-k 20) and reports, each with a percentile bootstrap interval over problems:

* pass@1 (mean accuracy) and pass@8, with the binary verifier (``tandem_grpo.rewards.is_correct``, a completion that
  hits the cap counts as wrong, as in training);
* steps: the number of non-empty blank-line-separated paragraphs of a completion (what the paper's alternating
  handoff protocol hands over), and the share of completions with at least two;
* the share with a ``\\boxed{}`` answer and the share that reach the token cap.

It then picks the candidate (rule below) and measures it again on ``--final_problems`` fresh problems (a different
problem seed, the study's held-out set), at the evaluation's sampling and at the rollout temperature 1.0.
Everything goes to ``--output_dir/pilot.json`` and one printed table.

``--rollout_check FAMILY/INSTRUCTION`` skips the candidates and measures that task at each of
``--rollout_temperatures`` with plain temperature sampling (no top-p/top-k: what the trainer scores), at the training
run's cap (``--max_new_tokens``), so the study's rollout temperature gives GRPO groups with some correct completion.
Those rows go to ``--output_dir/rollout.json``.

Choice rule: pass@1 in [10%, 40%] with its whole interval inside [5%, 50%], a median of at least 2 steps, a cap
rate under 10%; among those the one with the most numbers in the chain, then the pass@1 closest to 25%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tandem_grpo.data import BUILTIN_TASKS, INSTRUCTION, STEPS_INSTRUCTION
from tandem_grpo.evaluation.hacks import boxed_share
from tandem_grpo.evaluation.solo import capability
from tandem_grpo.evaluation.stats import bootstrap_mean
from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
from tandem_grpo.rewards import is_correct
from tandem_grpo.sampling import SamplingSettings

EVAL_SAMPLING = SamplingSettings(temperature=0.7, top_p=0.8, top_k=20)
ROLLOUT_SAMPLING = SamplingSettings(temperature=1.0)

# The "steps" candidate is the package's STEPS_INSTRUCTION; the example candidate (rejected: the model copies the
# example's answer) lives only here.
STEPS = STEPS_INSTRUCTION
STEPS_EXAMPLE = STEPS + " Example:\n\n3 + 4 = 7\n\n7 - 2 = 5\n\nSo the answer is \\boxed{5}."
INSTRUCTION_CANDIDATES = {"step_by_step": INSTRUCTION, "steps": STEPS, "steps_example": STEPS_EXAMPLE}
FAMILIES = BUILTIN_TASKS
CHAIN_LENGTH = {"two_operand": 2, "chain2": 2, "chain2_small": 2, "chain3_small": 3}


def count_steps(text: str) -> int:
    """Non-empty paragraphs when the text is split on blank lines (the alternating protocol's steps)."""
    return sum(1 for part in text.split("\n\n") if part.strip())


def measure(backend, tokenizer, family: str, instruction: str, args, *, seed: int, problems: int,
            sampling: SamplingSettings) -> dict:  # fmt: skip
    data = FAMILIES[family](problems, seed, INSTRUCTION_CANDIDATES[instruction])
    prompt_ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True) for p in data["prompt"]]
    prompt_ids = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompt_ids]
    flat = [p for p in prompt_ids for _ in range(args.samples)]
    start = time.perf_counter()
    label = f"{family}/{instruction}"
    ids = backend.generate(flat, sampling, max_new_tokens=args.max_new_tokens, seed=seed, desc=label)
    seconds = time.perf_counter() - start
    eos = set(backend.eos_token_ids)
    texts = [tokenizer.decode([t for t in row if t not in eos]) for row in ids]
    capped = [len(row) >= args.max_new_tokens and (not row or row[-1] not in eos) for row in ids]
    golds = [a for a in data["answer"] for _ in range(args.samples)]
    verdicts = [is_correct(t, gold, truncated=c) for t, c, gold in zip(texts, capped, golds, strict=True)]

    def per_problem(values):
        return [statistics.fmean(values[i * args.samples : (i + 1) * args.samples]) for i in range(problems)]

    correct = [verdicts[i * args.samples : (i + 1) * args.samples] for i in range(problems)]
    steps = [count_steps(t) for t in texts]
    cap = capability(correct, ks=(1, args.samples), seed=0)
    return {
        "family": family,
        "instruction": instruction,
        "chain_length": CHAIN_LENGTH[family],
        "problems": problems,
        "samples": args.samples,
        "problem_seed": seed,
        "sampling": sampling.__dict__,
        "max_new_tokens": args.max_new_tokens,
        "pass@1": cap["pass@1"],
        f"pass@{args.samples}": cap[f"pass@{args.samples}"],
        "median_steps": statistics.median(steps),
        "steps": bootstrap_mean(per_problem(steps)).to_dict(),
        "two_or_more_steps": bootstrap_mean(per_problem([s >= 2 for s in steps])).to_dict(),
        "boxed": bootstrap_mean(per_problem([boxed_share(t) > 0 or "\\boxed{" in t for t in texts])).to_dict(),
        "at_cap": bootstrap_mean(per_problem(capped)).to_dict(),
        "mean_tokens": statistics.fmean(len(r) for r in ids),
        "seconds": round(seconds, 1),
        "examples": [
            {
                "prompt": data["prompt"][i][0]["content"],
                "answer": data["answer"][i],
                "completion": texts[i * args.samples],
            }
            for i in range(2)
        ],  # fmt: skip
    }


def eligible(row: dict) -> bool:
    p = row["pass@1"]
    return (0.10 <= p["value"] <= 0.40 and p["ci_low"] >= 0.05 and p["ci_high"] <= 0.50 and row["median_steps"] >= 2
            and row["at_cap"]["value"] < 0.10)  # fmt: skip


def choose(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if eligible(r)]
    return min(ok, key=lambda r: (-r["chain_length"], abs(r["pass@1"]["value"] - 0.25))) if ok else None


def line(row: dict, samples: int) -> str:
    def est(e):
        return f"{e['value']:.1%} [{e['ci_low']:.1%}, {e['ci_high']:.1%}]"

    return (f"{row['family']:>11} {row['instruction']:>13} T={row['sampling']['temperature']}: "
            f"pass@1 {est(row['pass@1'])}  pass@{samples} {est(row[f'pass@{samples}'])}  "
            f"steps {row['steps']['value']:.1f} (median {row['median_steps']:g})  boxed {row['boxed']['value']:.0%}  "
            f"cap {row['at_cap']['value']:.0%}  {row['mean_tokens']:.0f} tok  {row['seconds']:.0f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", default=SMOLLM2_ID)
    parser.add_argument("--problems", type=int, default=50, help="Problems per candidate.")
    parser.add_argument("--final_problems", type=int, default=200, help="Held-out problems for the chosen one.")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--instructions", nargs="+", default=["steps", "steps_example"],
                        choices=list(INSTRUCTION_CANDIDATES))  # fmt: skip
    parser.add_argument("--output_dir", default="results/pilot")
    parser.add_argument("--rollout_check", metavar="FAMILY/INSTRUCTION",
                        help="Measure only this task at --rollout_temperatures (see above).")  # fmt: skip
    parser.add_argument("--rollout_temperatures", nargs="+", type=float, default=[1.0])
    args = parser.parse_args()
    if args.rollout_check is not None:
        family, _, instruction = args.rollout_check.partition("/")
        if family not in FAMILIES or instruction not in INSTRUCTION_CANDIDATES:
            parser.error(
                f"--rollout_check {args.rollout_check}: expected FAMILY/INSTRUCTION with FAMILY one of "
                f"{', '.join(FAMILIES)} and INSTRUCTION one of {', '.join(INSTRUCTION_CANDIDATES)}."
            )
    for name in ("problems", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: must be >= 1.")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    from transformers import AutoTokenizer

    from tandem_grpo.vllm.evaluation import VLLMBackend, shared_engine

    path = resolve_model_path(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = shared_engine(path, path, dtype="bfloat16", max_model_len=512 + args.max_new_tokens)
    backend = VLLMBackend(engine, path, is_junior=True, tokenizer=tokenizer)
    rows: list[dict] = []
    final: list[dict] = []
    chosen = None
    if args.rollout_check is not None:
        print(f"# {args.rollout_check}: {args.problems} problems x {args.samples}, cap {args.max_new_tokens} tokens")
        for temperature in args.rollout_temperatures:
            rows.append(measure(backend, tokenizer, family, instruction, args, seed=1, problems=args.problems,
                                sampling=SamplingSettings(temperature=temperature)))  # fmt: skip
            print(line(rows[-1], args.samples), flush=True)
            (out / "rollout.json").write_text(json.dumps({"model": args.model_name_or_path, "rows": rows}, indent=1))
        print(f"Wrote {out / 'rollout.json'}")
        return

    def write() -> None:  # after every row, so an interrupted pilot keeps what it measured
        picked = chosen and {k: chosen[k] for k in ("family", "instruction")}
        result = {"model": args.model_name_or_path, "backend": "vllm",
                  "rule": __doc__.split("Choice rule: ")[1].strip(), "candidates": rows, "chosen": picked,
                  "held_out": final}  # fmt: skip
        (out / "pilot.json").write_text(json.dumps(result, indent=1))

    for family in args.families:
        for instruction in args.instructions:
            rows.append(measure(backend, tokenizer, family, instruction, args, seed=1, problems=args.problems,
                                sampling=EVAL_SAMPLING))  # fmt: skip
            print(line(rows[-1], args.samples), flush=True)
            write()
    chosen = choose(rows)
    if chosen is None:
        print("No candidate meets the rule: the study cannot start on these tasks.")
    elif args.final_problems:
        print(f"Chosen: {chosen['family']} with {chosen['instruction']}; held-out problems (seed 2):")
        for sampling in (EVAL_SAMPLING, ROLLOUT_SAMPLING):
            final.append(measure(backend, tokenizer, chosen["family"], chosen["instruction"], args, seed=2,
                                 problems=args.final_problems, sampling=sampling))  # fmt: skip
            print(line(final[-1], args.samples), flush=True)
            write()
    write()
    print(f"Wrote {out / 'pilot.json'}")


if __name__ == "__main__":
    main()
