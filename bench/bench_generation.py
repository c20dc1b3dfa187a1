"""Co-generation vs plain ``model.generate`` of the same model on the same batch, timed in one run.

    python bench/bench_generation.py                 # SmolLM2-135M-Instruct, 16 sequences, 128 new tokens

Both sides generate exactly ``--max_new_tokens`` tokens (EOS is ignored) from the same prompts, after one
warm-up call each; the junior is a second copy of the same model (self-pairing). Prints each side's median
seconds over ``--repeats`` and the ratio (issue target: at most 2.2x; two forward passes per token is the floor).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
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
    parser.add_argument("--granularity", default="word")
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    senior = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    junior = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    result = time_generation(
        senior, junior, tokenizer, num_sequences=args.num_sequences, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats, granularity=args.granularity,
    )  # fmt: skip
    print(f"model={args.model} sequences={args.num_sequences} new_tokens={args.max_new_tokens} "
          f"threads={torch.get_num_threads()} repeats={args.repeats}")  # fmt: skip
    print_result(result)


def time_generation(
    senior, junior, tokenizer, *, num_sequences: int = 16, max_new_tokens: int = 128, repeats: int = 3,
    granularity: str = "word",
) -> dict[str, float]:  # fmt: skip
    """Median seconds of ``senior.generate`` and of co-generation with ``junior`` on the same batch, on the senior's
    device (both models there already); one warm-up call each, then ``repeats`` interleaved timings.

    Returns ``{"solo_s", "tandem_s", "ratio", "tokens"}``."""
    device = senior.device
    prompts = arithmetic_word_problems(num_sequences, seed=0)["prompt"]
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    batch = batch.to(device)
    width = senior.config.vocab_size
    tables = BoundaryTables.from_tokenizer(tokenizer, width, [])  # no EOS: both sides write every token
    rule = HandoffRule(granularity, 0.5, 32)

    def solo() -> None:
        out = senior.generate(**batch, do_sample=True, max_new_tokens=max_new_tokens,
                              min_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert out.shape[1] == batch.input_ids.shape[1] + max_new_tokens

    def tandem() -> None:
        out = tandem_generate(
            senior, junior, batch.input_ids, batch.attention_mask, rule=rule, tables=tables,
            max_new_tokens=max_new_tokens, eos_token_ids=[], pad_token_id=tokenizer.pad_token_id,
            generator=torch.Generator(device=device).manual_seed(0),
        )  # fmt: skip
        assert max(out.lengths) == max_new_tokens

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    timings: dict[str, list[float]] = {"solo": [], "tandem": []}
    with torch.no_grad():
        solo(), tandem()  # warm-up
        for _ in range(repeats):  # interleaved, so load changes hit both sides alike
            for name, fn in (("solo", solo), ("tandem", tandem)):
                sync()
                start = time.perf_counter()
                fn()
                sync()
                timings[name].append(time.perf_counter() - start)
                print(f"repeat {len(timings[name])}/{repeats} {name:>6}: {timings[name][-1]:7.2f} s", flush=True)
    solo_s, tandem_s = statistics.median(timings["solo"]), statistics.median(timings["tandem"])
    return {
        "solo_s": solo_s,
        "tandem_s": tandem_s,
        "ratio": tandem_s / solo_s,
        "tokens": num_sequences * max_new_tokens,
    }


def print_result(result: dict[str, float]) -> None:
    solo_s, tandem_s, tokens = result["solo_s"], result["tandem_s"], result["tokens"]
    print(f"solo   model.generate : {solo_s:7.2f} s  ({tokens / solo_s:6.1f} tokens/s)")
    print(f"tandem co-generation  : {tandem_s:7.2f} s  ({tokens / tandem_s:6.1f} tokens/s)")
    print(f"ratio tandem/solo     : {result['ratio']:.2f}x  (target <= 2.2x)")


if __name__ == "__main__":
    main()
