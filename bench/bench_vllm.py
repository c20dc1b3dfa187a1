"""Tandem vs solo vLLM: generation time and engine memory on the same batch, then a GRPO step each, in one run.

    python bench/bench_vllm.py                       # SmolLM2-135M-Instruct, 64 sequences x 256 tokens
    python bench/bench_vllm.py --skip-train          # generation only
    python bench/bench_vllm.py --sequences 16 --tokens 64 --train-completion-length 32   # quick look

Each measurement runs in its own fresh process (one vLLM engine per process, as in training), one after the other,
so they do not compete with each other. Wall time and process CPU time are both reported: on a machine shared with
other jobs the wall time of one run can be inflated by their load, the CPU time much less.

Generation: the same prompts, ``ignore_eos`` so both engines produce exactly
``sequences x tokens`` tokens, temperature 1, after a short warm-up. The tandem engine is self-paired (junior = the
senior's weights) with the paper's rule (word units, junior probability 0.5, 32-token cap). Training: one warm-up
step, then the timed steps, of ``TandemGRPOTrainer`` vs TRL's ``GRPOTrainer`` with vLLM in colocate mode and the
same config (the tandem trainer is built inside ``tandem_grpo.vllm.trl_generation.use_tandem_vllm``).

On a CPU the engines run float32 and eager (vLLM's bf16 matmuls take a slow path on CPUs without AVX-512 BF16,
and inductor compilation takes minutes); on a GPU they run the model's dtype with vLLM's defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTIONS = [f"What is {a} * {b}?" for a, b in [(51, 99), (12, 34), (7, 86), (23, 45), (68, 19), (31, 77), (9, 58)]]


def _engine_settings(args) -> dict:
    import torch

    settings = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": 1024, "seed": 0}
    if not torch.cuda.is_available():
        settings.update(dtype="float32", enforce_eager=True)
    return settings


def _prompts(path: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    out = []
    for i in range(count):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def _memory(llm, path: str, tandem: bool) -> dict:
    import glob

    import torch
    from safetensors import safe_open

    vllm_config = llm.llm_engine.vllm_config
    dtype_bytes = torch.empty((), dtype=vllm_config.model_config.dtype).element_size()
    # Counted from the checkpoint: on a CPU vLLM moves linear weights into oneDNN handles, out of the parameters.
    numel = 0
    for file in glob.glob(os.path.join(path, "*.safetensors")):
        with safe_open(file, "pt") as handle:
            numel += sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())
    weights = numel * dtype_bytes * (2 if tandem else 1)
    hf = vllm_config.model_config.hf_config
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * dtype_bytes * (2 if tandem else 1)
    cache = vllm_config.cache_config
    capacity = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
    out = {
        "weights_mib": weights / 2**20,
        "kv_bytes_per_token": per_token,
        "kv_cache_tokens": capacity,
        "kv_cache_mib": capacity * per_token / 2**20,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if torch.cuda.is_available():
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def child_generation(kind: str, args) -> dict:
    from tandem_grpo.handoff import HandoffRule
    from tandem_grpo.models import resolve_model_path
    from tandem_grpo.vllm.engine import build_llm, generate_with_llm, new_uids, sampling_params

    path = resolve_model_path(args.model)
    settings = _engine_settings(args)
    start = time.perf_counter()
    if kind == "tandem":
        llm = build_llm(path, **settings)
    else:  # the same in-process engine as build_llm (and TRL's colocate mode), without the tandem arguments
        from trl.trainer.utils import ensure_master_addr_port
        from vllm import LLM

        for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(name, value)
        ensure_master_addr_port()
        in_process = {"distributed_executor_backend": "external_launcher", "logprobs_mode": "processed_logprobs"}
        llm = LLM(model=path, **in_process, **settings)
    startup = time.perf_counter() - start
    prompts = _prompts(path, args.sequences)
    rule = HandoffRule("word", 0.5, 32)

    def run(batch: list[list[int]], tokens: int) -> tuple[float, float, int]:
        length = {"max_tokens": tokens, "generation_kwargs": {"ignore_eos": True}}
        seeds = list(range(len(batch)))
        begin, cpu_begin = time.perf_counter(), time.process_time()
        if kind == "tandem":
            rollout = generate_with_llm(llm, batch, seeds, rule, **length)
            produced = sum(map(len, rollout.completion_ids))
        else:
            params = sampling_params(None, seeds, new_uids(len(batch)), None, **length)
            outs = llm.generate([{"prompt_token_ids": p} for p in batch], sampling_params=params, use_tqdm=False)
            produced = sum(len(o.outputs[0].token_ids) for o in outs)
        return time.perf_counter() - begin, time.process_time() - cpu_begin, produced

    run(prompts[:4], 8)  # warm-up
    seconds, cpu_seconds, produced = run(prompts, args.tokens)
    return {
        "kind": kind,
        "startup_s": startup,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "tokens": produced,
        **_memory(llm, path, kind == "tandem"),
    }


def child_train(kind: str, args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from tandem_grpo.config import TandemGRPOConfig
    from tandem_grpo.models import resolve_model_path

    path = resolve_model_path(args.model)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS * 8])

    def reward_len(completions, **kwargs):
        return [-abs(len(c[0]["content"]) - 40) / 40 for c in completions]

    config = dict(
        output_dir=os.path.join(args.workdir, f"train-{kind}"),
        max_steps=1 + args.train_steps,
        per_device_train_batch_size=args.train_batch,
        num_generations=args.train_generations,
        max_completion_length=args.train_completion_length,
        learning_rate=1e-6,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        bf16=torch.cuda.is_available(),
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_max_model_length=1024,
        seed=0,
    )
    llm_kwargs = {k: v for k, v in _engine_settings(args).items() if k in ("dtype", "enforce_eager")}
    dtype = torch.float32 if not torch.cuda.is_available() else "auto"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.cpu_times, self._begin = [], [], None

        def on_step_begin(self, *a, **k):
            self._begin = (time.perf_counter(), time.process_time())

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self._begin[0])
            self.cpu_times.append(time.process_time() - self._begin[1])

    timer = StepTimer()
    if kind == "tandem":
        from tandem_grpo.trainer import TandemGRPOTrainer
        from tandem_grpo.vllm.trl_generation import use_tandem_vllm

        args_obj = TandemGRPOConfig(**config, junior_probability=0.5, handoff_granularity="word")
        with use_tandem_vllm(args_obj, **llm_kwargs):
            trainer = TandemGRPOTrainer(
                model=model,
                reward_funcs=reward_len,
                args=args_obj,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=[timer],
            )
    else:
        import trl.generation.vllm_generation as trl_vllm
        from trl import GRPOConfig, GRPOTrainer

        original = trl_vllm.LLM

        def llm_with_settings(*a, **k):  # the same engine settings as the tandem run
            return original(*a, **{**k, **llm_kwargs})

        def sync_by_reload(self):
            # TRL's per-tensor `load_weights` cannot update vLLM's CPU backend (it repacks linear weights into oneDNN
            # handles); vLLM's in-place reload can, and reload_in_place also repacks a tied output head. The tandem
            # trainer syncs the same way (on the senior alone).
            from tandem_grpo.vllm.model import reload_in_place

            engine = self.llm.llm_engine
            model = engine.model_executor.driver_worker.model_runner.model
            weights = ((n, t.detach().clone()) for n, t in self._iter_named_params())
            reload_in_place(model, engine.model_config, model.load_weights, weights)
            self.llm.reset_prefix_cache()

        trl_vllm.LLM = llm_with_settings
        if not torch.cuda.is_available():
            trl_vllm.VLLMGeneration.sync_weights = sync_by_reload
        args_obj = GRPOConfig(**config)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_len,
            args=args_obj,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
    trainer.train()
    timed, cpu_timed = timer.times[1:], timer.cpu_times[1:]
    return {
        "kind": kind,
        "step_s": sum(timed) / len(timed),
        "step_cpu_s": sum(cpu_timed) / len(cpu_timed),
        "steps": timer.times,
    }


def _run_child(mode: str, kind: str, argv: list[str]) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", f"{mode}:{kind}", *argv]
    proc = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{mode}:{kind} failed with exit code {proc.returncode}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM memory fraction (default: 0.35 on a CPU, where it is a share of RAM; 0.3 on a GPU)",
    )
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--train-steps", type=int, default=2, help="timed steps after one warm-up step")
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-generations", type=int, default=8)
    parser.add_argument("--train-completion-length", type=int, default=64)
    parser.add_argument("--workdir", default="/tmp/tandem-grpo-bench")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gpu_memory_utilization is None:
        import torch

        # The tandem engine keeps two KV caches, so a budget holds half the tokens; on a CPU 0.2 of RAM is too little
        # for 64 x 256 tokens and the tandem engine then preempts and recomputes (2.28x instead of 1.99x, 2026-11-30).
        args.gpu_memory_utilization = 0.3 if torch.cuda.is_available() else 0.35
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--child")]
    forwarded += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]

    if args.child:
        mode, kind = args.child.split(":")
        result = child_generation(kind, args) if mode == "gen" else child_train(kind, args)
        print(json.dumps(result), flush=True)
        return

    print(f"model={args.model} sequences={args.sequences} tokens={args.tokens}", flush=True)
    gen = {kind: _run_child("gen", kind, forwarded) for kind in ("solo", "tandem")}
    for kind, r in gen.items():
        print(
            f"{kind:>6}: {r['seconds']:8.1f} s wall, {r['cpu_seconds']:8.1f} s CPU for {r['tokens']} tokens "
            f"({r['tokens'] / r['seconds']:7.1f} tok/s); "
            f"start-up {r['startup_s']:.0f} s; weights {r['weights_mib']:.0f} MiB; KV cache {r['kv_cache_mib']:.0f} "
            f"MiB = {r['kv_cache_tokens']} tokens x {r['kv_bytes_per_token']} B; peak RSS {r['peak_rss_mib']:.0f} MiB"
            + (f"; CUDA peak {r['cuda_peak_mib']:.0f} MiB" if "cuda_peak_mib" in r else ""),
            flush=True,
        )
    print(
        f"generation time ratio tandem/solo: {gen['tandem']['seconds'] / gen['solo']['seconds']:.2f}x wall, "
        f"{gen['tandem']['cpu_seconds'] / gen['solo']['cpu_seconds']:.2f}x CPU time",
        flush=True,
    )
    if args.skip_train:
        return
    train = {kind: _run_child("train", kind, forwarded) for kind in ("vanilla", "tandem")}
    for kind, r in train.items():
        steps = [round(t, 1) for t in r["steps"]]
        print(f"{kind:>7} GRPO step: {r['step_s']:.1f} s wall, {r['step_cpu_s']:.1f} s CPU (all: {steps})", flush=True)
    t, v = train["tandem"], train["vanilla"]
    print(
        f"training step ratio tandem/vanilla: {t['step_s'] / v['step_s']:.2f}x wall, "
        f"{t['step_cpu_s'] / v['step_cpu_s']:.2f}x CPU time"
    )


if __name__ == "__main__":
    main()
