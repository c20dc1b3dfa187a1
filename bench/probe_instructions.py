"""How often does the base model state its answer under each instruction? (Why the main job asks for one-line
answers, and the study's answer-line lever: GRPO needs some completions with a reward to learn from.)

    python bench/probe_instructions.py                       # SmolLM2-135M-Instruct, 8 problems x 4 samples, 64 tokens
    python bench/probe_instructions.py --task chain2 --max_new_tokens 128 --num_problems 16 --samples 8 \
        --temperature 0.7 --top_p 0.8 --top_k 20             # the cpu-paper study's task and rollout decoding

For each instruction of ``tandem_grpo.data.INSTRUCTIONS`` (or ``--instructions``) it samples ``--samples``
completions per built-in problem of ``--task`` and prints the share with a ``\\boxed{}`` answer (``format_reward``),
with a stated answer (a box or an ``Answer:`` line, ``stated_answer``), correct by the default reader
(``accuracy_reward``, with its truncation rule) and by the stated answer only (``stated_accuracy_reward``), and the
share that reach the token cap.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem_grpo.data import BUILTIN_TASKS, INSTRUCTIONS, builtin_problems, stated_answer
from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
from tandem_grpo.rewards import accuracy_reward, format_reward, stated_accuracy_reward


def probe(model, tokenizer, instruction: str, args: argparse.Namespace) -> dict[str, float]:
    problems = builtin_problems(args.task, args.num_problems, seed=args.problem_seed, instruction=instruction)
    texts, golds = [], []
    for prompt, answer in zip(problems["prompt"], problems["answer"], strict=True):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        texts += [text] * args.samples
        golds += [answer] * args.samples
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=args.max_new_tokens, do_sample=True,
                             temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    ids = []
    for row in out[:, batch.input_ids.shape[1] :].tolist():
        row = [t for t in row if t != tokenizer.pad_token_id]
        ids.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    completions = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    cap = dict(completion_ids=ids, max_completion_length=args.max_new_tokens)
    n = len(completions)
    return {"boxed": sum(format_reward(completions)) / n,
            "stated": sum(stated_answer(c) is not None for c in completions) / n,
            "correct": sum(accuracy_reward(completions, golds, **cap)) / n,
            "stated_correct": sum(stated_accuracy_reward(completions, golds, **cap)) / n,
            "at_cap": sum(len(row) >= args.max_new_tokens for row in ids) / n}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", default=SMOLLM2_ID)
    parser.add_argument("--num_problems", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="Completions per problem.")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--problem_seed", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", default="two_operand", choices=list(BUILTIN_TASKS))
    parser.add_argument("--instructions", nargs="+", default=list(INSTRUCTIONS), choices=list(INSTRUCTIONS))
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--top_k", type=int, default=0, help="0: no top-k.")
    args = parser.parse_args()
    for name in ("num_problems", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: must be >= 1.")
    torch.manual_seed(args.seed)
    path = resolve_model_path(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(f"{args.task}: {args.num_problems} problems x {args.samples} samples, {args.max_new_tokens} new tokens, "
          f"temperature {args.temperature:g}, top-p {args.top_p:g}, top-k {args.top_k}")  # fmt: skip
    for name in args.instructions:
        start = time.perf_counter()
        r = probe(model, tokenizer, INSTRUCTIONS[name], args)
        print(f"{name:>13}: boxed {r['boxed']:.0%}, stated {r['stated']:.0%}, correct {r['correct']:.0%} (last "
              f"number) / {r['stated_correct']:.0%} (stated only), at the token cap {r['at_cap']:.0%} "
              f"({time.perf_counter() - start:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
