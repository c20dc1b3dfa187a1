"""How often does the base model finish with a ``\\boxed{}`` answer under each instruction? (Why the main job asks
for one-line answers: GRPO needs some completions with a reward to learn from.)

    python bench/probe_instructions.py                       # SmolLM2-135M-Instruct, 8 problems x 4 samples, 64 tokens
    python bench/probe_instructions.py --max_new_tokens 128 --num_problems 16

For each instruction of ``tandem_grpo.data.INSTRUCTIONS`` it samples ``--samples`` completions per built-in arithmetic
problem (temperature 1, as GRPO's rollouts) and prints the share with a ``\\boxed{}`` answer (``format_reward``), the
share correct (``accuracy_reward``, with its truncation rule) and the share that reach the token cap.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem_grpo.data import INSTRUCTIONS, arithmetic_word_problems
from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
from tandem_grpo.rewards import accuracy_reward, format_reward


def probe(model, tokenizer, instruction: str, args: argparse.Namespace) -> dict[str, float]:
    problems = arithmetic_word_problems(args.num_problems, seed=args.problem_seed, instruction=instruction)
    texts, golds = [], []
    for prompt, answer in zip(problems["prompt"], problems["answer"], strict=True):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        texts += [text] * args.samples
        golds += [answer] * args.samples
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=args.max_new_tokens, do_sample=True, temperature=1.0, top_p=1.0,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    ids = []
    for row in out[:, batch.input_ids.shape[1] :].tolist():
        row = [t for t in row if t != tokenizer.pad_token_id]
        ids.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    completions = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    accuracy = accuracy_reward(completions, golds, completion_ids=ids, max_completion_length=args.max_new_tokens)
    n = len(completions)
    return {"boxed": sum(format_reward(completions)) / n, "correct": sum(accuracy) / n,
            "at_cap": sum(len(row) >= args.max_new_tokens for row in ids) / n}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", default=SMOLLM2_ID)
    parser.add_argument("--num_problems", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="Completions per problem.")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--problem_seed", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in ("num_problems", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: must be >= 1.")
    torch.manual_seed(args.seed)
    path = resolve_model_path(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(f"{args.num_problems} problems x {args.samples} samples, {args.max_new_tokens} new tokens, temperature 1")
    for name, instruction in INSTRUCTIONS.items():
        start = time.perf_counter()
        r = probe(model, tokenizer, instruction, args)
        print(f"{name:>13}: boxed {r['boxed']:.0%}, correct {r['correct']:.0%}, at the token cap {r['at_cap']:.0%} "
              f"({time.perf_counter() - start:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
