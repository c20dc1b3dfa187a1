"""The study's cost levers, measured one at a time (issue 29): run each alone on the machine.

    python bench/levers.py engine --dtype float32  --kv_gib 6 --prompts 400   # vLLM-CPU decode rate, solo requests
    python bench/levers.py engine --dtype bfloat16 --kv_gib 6 --prompts 400
    python bench/levers.py prompt                                               # prompt tokens with/without system
    python bench/levers.py train --mode full --dtype float32 --steps 3          # GRPO step time, colocated vLLM
    python bench/levers.py train --mode lora --dtype float32 --steps 3

``engine``: one in-process tandem engine (``tandem_grpo.vllm.engine.build_llm``) as the evaluation builds it, solo
requests (junior probability 0) of the study's task (chain2, steps instruction), the paper's evaluation sampling
(temperature 0.7, top-p 0.8, top-k 20), 256 new tokens, every prompt in one ``generate`` call so vLLM batches up to
``--max_num_seqs``; prints generated tokens per second and the engine's KV capacity. ``train``: a few GRPO steps
(``junior_probability=0``) of the cpu-paper shape; the median of the steps after the first. Each line printed is one
JSON record, appended to ``--out`` as well.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def cpu_name() -> str:
    import torch

    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch capability {torch.backends.cpu.get_cpu_capability()}"


def prompts(count: int, system: bool) -> list[list[int]]:
    from transformers import AutoTokenizer

    from tandem_grpo.data import STEPS_INSTRUCTION, builtin_problems
    from tandem_grpo.models import SMOLLM2_ID, resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(SMOLLM2_ID))
    rows = builtin_problems("chain2", count, seed=7, instruction=STEPS_INSTRUCTION)
    out = []
    for prompt in rows["prompt"]:
        messages = ([] if system else [{"role": "system", "content": ""}]) + list(prompt)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def engine(args) -> dict:
    from tandem_grpo.handoff import HandoffRule
    from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
    from tandem_grpo.sampling import SamplingSettings
    from tandem_grpo.vllm.engine import build_llm, generate_with_llm

    path = resolve_model_path(SMOLLM2_ID)
    llm = build_llm(path, dtype=args.dtype, enforce_eager=True, max_model_len=512, seed=0,
                    kv_cache_memory_bytes=int(args.kv_gib * 2**30), max_num_seqs=args.max_num_seqs)  # fmt: skip
    cache = llm.llm_engine.vllm_config.cache_config
    capacity = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
    ids = prompts(args.prompts, system=True)
    rule = HandoffRule(junior_probability=0.0)
    sampling = SamplingSettings(temperature=0.7, top_p=0.8, top_k=20)
    if args.solo:  # the evaluation's solo mode: the senior runs alone (TandemForCausalLM.set_solo)
        llm.llm_engine.model_executor.driver_worker.model_runner.model.set_solo("senior")
    generate_with_llm(llm, ids[:8], list(range(8)), rule, sampling, max_tokens=16)  # warm-up
    started = time.perf_counter()
    rollout = generate_with_llm(llm, ids, list(range(len(ids))), rule, sampling, max_tokens=args.max_tokens)
    seconds = time.perf_counter() - started
    tokens = sum(len(c) for c in rollout.completion_ids)
    return {"lever": "engine", "dtype": args.dtype, "kv_gib": args.kv_gib, "kv_capacity_tokens": capacity,
            "max_num_seqs": args.max_num_seqs, "solo_mode": args.solo, "prompts": len(ids),
            "max_tokens": args.max_tokens, "tokens": tokens, "seconds": round(seconds, 1),
            "tokens_per_s": round(tokens / seconds, 1)}  # fmt: skip


def hf(args) -> dict:
    """The transformers backend's batched ``generate`` on the same requests."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem_grpo.backends import TransformersBackend
    from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
    from tandem_grpo.sampling import SamplingSettings

    path = resolve_model_path(SMOLLM2_ID)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    backend = TransformersBackend(model, AutoTokenizer.from_pretrained(path), batch_size=args.max_num_seqs,
                                  show_progress=False)  # fmt: skip
    ids = prompts(args.prompts, system=True)
    sampling = SamplingSettings(temperature=0.7, top_p=0.8, top_k=20)
    started = time.perf_counter()
    out = backend.generate(ids, sampling, max_new_tokens=args.max_tokens, seed=0)
    seconds = time.perf_counter() - started
    tokens = sum(len(c) for c in out)
    return {"lever": "hf", "dtype": args.dtype, "batch_size": args.max_num_seqs, "prompts": len(ids),
            "max_tokens": args.max_tokens, "tokens": tokens, "seconds": round(seconds, 1),
            "tokens_per_s": round(tokens / seconds, 1)}  # fmt: skip


def prompt_lengths(args) -> dict:
    with_system = prompts(50, system=True)
    without = prompts(50, system=False)
    return {"lever": "prompt", "mean_tokens_default_system": statistics.mean(map(len, with_system)),
            "mean_tokens_empty_system": statistics.mean(map(len, without))}  # fmt: skip


def train(args) -> dict:
    import torch

    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
    from tandem_grpo.data import STEPS_INSTRUCTION, builtin_problems
    from tandem_grpo.models import SMOLLM2_ID, resolve_model_path
    from tandem_grpo.rewards import accuracy_reward, format_reward
    from tandem_grpo.vllm.trl_generation import use_tandem_vllm

    torch.set_num_threads(os.cpu_count())
    config = TandemGRPOConfig(
        output_dir="/tmp/levers-train", per_device_train_batch_size=8, gradient_accumulation_steps=2,
        num_generations=8, max_completion_length=128, max_steps=args.steps, learning_rate=2e-5,
        temperature=0.6, reward_weights=[1.0, 0.0], junior_probability=0.0, logging_steps=1, save_strategy="no",
        report_to="none", use_vllm=args.vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=0.35,
        gradient_checkpointing=False, bf16=args.dtype == "bfloat16", use_cpu=True, seed=1,
    )  # fmt: skip
    config.model_init_kwargs = {"dtype": args.dtype}
    peft_config = None
    if args.mode == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    dataset = builtin_problems("chain2", 64, seed=3, instruction=STEPS_INSTRUCTION)
    import contextlib

    context = use_tandem_vllm(config, dtype=args.dtype, enforce_eager=True) if args.vllm else contextlib.nullcontext()
    with context:
        trainer = TandemGRPOTrainer(
            model=resolve_model_path(SMOLLM2_ID), reward_funcs=[accuracy_reward, format_reward], args=config,
            train_dataset=dataset, peft_config=peft_config,
        )  # fmt: skip
    times = []

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    trainer.add_callback(Clock())
    trainer.train()
    return {"lever": "train", "mode": args.mode, "dtype": args.dtype, "vllm": args.vllm,
            "step_seconds": [round(t, 1) for t in times],
            "median_after_first": round(statistics.median(times[1:] or times), 1)}  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lever", choices=["engine", "hf", "prompt", "train"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--kv_gib", type=float, default=6.0)
    parser.add_argument("--max_num_seqs", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--max_tokens", type=int, default=256)
    parser.add_argument("--solo", action="store_true", help="engine: the senior runs alone")
    parser.add_argument("--mode", default="full", choices=["full", "lora"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--vllm", type=lambda s: s.lower() in ("1", "true", "yes"), default=True)
    parser.add_argument("--out", default="results/levers/levers.jsonl")
    args = parser.parse_args(argv)
    record = {"prompt": prompt_lengths, "engine": engine, "hf": hf, "train": train}[args.lever](args)
    record["cpu"] = cpu_name()
    record["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    line = json.dumps(record)
    print(line, flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as handle:
        handle.write(line + "\n")


if __name__ == "__main__":
    main()
