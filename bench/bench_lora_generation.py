"""LoRA tandem co-generation (senior = base + adapter, junior = base) against LoRA solo generation, timed in one run.

    python bench/bench_lora_generation.py            # SmolLM2-135M-Instruct, LoRA r=16 all-linear, 16 x 128 tokens

Three sides on the same prompts, each generating exactly ``--max_new_tokens`` tokens (EOS ignored), after one
warm-up call each, interleaved over ``--repeats``:

- ``solo``: ``model.generate`` of the LoRA senior alone;
- ``tandem 1-pass``: ``tandem_generate(senior, None, ...)``: one forward per step over the senior's and the junior's
  rows together, the adapter applied to the senior rows only (PEFT mixed-adapter batch), one KV cache;
- ``tandem 2-pass``: ``tandem_generate(senior, senior, junior_context=senior.disable_adapter)``: two forwards per
  step, one KV cache per model (what 0.1.0 ran).

Prints the median seconds and the ratios to solo (issue 12 target for 1-pass: at most 1.4x).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem_grpo.data import arithmetic_word_problems
from tandem_grpo.generation import tandem_generate
from tandem_grpo.handoff import BoundaryTables, HandoffRule
from tandem_grpo.models import SMOLLM2_ID, resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=SMOLLM2_ID)
    parser.add_argument("--num_sequences", type=int, default=16)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lora_r", type=int, default=16)
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    senior = get_peft_model(base, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear"))
    senior.eval()
    prompts = arithmetic_word_problems(args.num_sequences, seed=0)["prompt"]
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    tables = BoundaryTables.from_tokenizer(tokenizer, base.config.vocab_size, [])  # no EOS: every token is written
    common = dict(rule=HandoffRule("word", 0.5, 32), tables=tables, max_new_tokens=args.max_new_tokens,
                  eos_token_ids=[], pad_token_id=tokenizer.pad_token_id)  # fmt: skip

    def solo() -> None:
        out = senior.generate(**batch, do_sample=True, max_new_tokens=args.max_new_tokens,
                              min_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert out.shape[1] == batch.input_ids.shape[1] + args.max_new_tokens

    def one_pass() -> None:
        out = tandem_generate(senior, None, batch.input_ids, batch.attention_mask, **common,
                              generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert max(out.lengths) == args.max_new_tokens

    def two_pass() -> None:
        out = tandem_generate(senior, senior, batch.input_ids, batch.attention_mask, **common,
                              junior_context=senior.disable_adapter,
                              generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert max(out.lengths) == args.max_new_tokens

    sides = {"solo": solo, "tandem 1-pass": one_pass, "tandem 2-pass": two_pass}
    timings: dict[str, list[float]] = {name: [] for name in sides}
    with torch.no_grad():
        for fn in sides.values():  # warm-up
            fn()
        for _ in range(args.repeats):  # interleaved, so load changes hit every side alike
            for name, fn in sides.items():
                start = time.perf_counter()
                fn()
                timings[name].append(time.perf_counter() - start)
                print(f"repeat {len(timings[name])}/{args.repeats} {name:>13}: {timings[name][-1]:7.2f} s", flush=True)
    median = {name: statistics.median(t) for name, t in timings.items()}
    tokens = args.num_sequences * args.max_new_tokens
    print(f"model={args.model} lora_r={args.lora_r} sequences={args.num_sequences} "
          f"new_tokens={args.max_new_tokens} threads={torch.get_num_threads()} repeats={args.repeats}")  # fmt: skip
    for name, seconds in median.items():
        ratio = seconds / median["solo"]
        print(f"{name:>13}: {seconds:7.2f} s  ({tokens / seconds:6.1f} tokens/s)  {ratio:.2f}x solo")
    print(f"ratio tandem 1-pass / LoRA solo: {median['tandem 1-pass'] / median['solo']:.2f}x  (target <= 1.4x)")


if __name__ == "__main__":
    main()
