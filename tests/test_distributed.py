"""Several processes: 2 real CPU processes (gloo) train TandemGRPOTrainer, plainly, under DeepSpeed ZeRO-2/3 and FSDP2.

Each test launches ``accelerate launch --config_file examples/accelerate_configs/<config> --num_processes 2`` on this
file; the ``__main__`` block below is the worker every rank runs. It trains a tiny random Llama for 2 steps and
writes, per rank, what the accelerator saw (number of processes, rank), the coin seeds it drew, the logged tandem
metrics and a hash of the senior's weights before and after training; the test compares the ranks' files.

On a machine without a GPU, accelerate counts the processes only when told they are CPU processes:
``ACCELERATE_USE_CPU=true`` for the plain (DDP) launch; under DeepSpeed and FSDP, where that variable turns them off,
the worker calls :func:`tandem_grpo.distributed.cpu_process_state` first, as ``examples/train_math.py`` does.
Otherwise each rank's Accelerator reports one process and a "2-process" run trains two copies that never exchange
data, passing for the wrong reason: the tests assert ``num_processes == 2`` as the trainer saw it, and that DeepSpeed
or FSDP really ran. Multi-process tests are marked ``distributed`` (each launch takes about 20-80 s on 2 shared CPU
cores).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "accelerate_configs"
LAUNCH_TIMEOUT_S = 240


def _has_deepspeed() -> bool:
    try:
        import deepspeed  # noqa: F401
    except Exception:  # noqa: BLE001 (a broken install raises other errors than ImportError)
        return False
    return True


needs_deepspeed = pytest.mark.skipif(
    not _has_deepspeed(), reason="deepspeed is not installed: `pip install -e '.[deepspeed]'` (deepspeed==0.19.8)"
)


def _launch(tmp_path: Path, config: str | Path, **worker) -> list[dict]:
    """Run the worker on 2 processes with accelerate config ``config`` (a file name in examples/accelerate_configs,
    or a path); return each rank's result, rank 0 first."""
    from conftest import build_tiny_model, build_tiny_tokenizer, child_env, free_port

    model_dir = tmp_path / "model"
    if not model_dir.exists():
        build_tiny_model(0).save_pretrained(model_dir)
        build_tiny_tokenizer().save_pretrained(model_dir)
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    spec = {"model": str(model_dir), "output_dir": str(tmp_path / "out"), "results": str(results), **worker}
    env = child_env()
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    config = CONFIGS / config
    if "distributed_type: MULTI_GPU" in config.read_text():
        env["ACCELERATE_USE_CPU"] = "true"  # DDP; DeepSpeed and FSDP: tandem_grpo.distributed.cpu_process_state
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--num_processes", "2", "--main_process_port", str(free_port()),
               __file__, json.dumps(spec)]  # fmt: skip
    start = time.time()
    # Its own process group, so that a launch that hangs is ended with every rank it started.
    proc = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        (tmp_path / "launch.log").write_bytes(stdout or b"")
        pytest.fail(f"{config.name}: no result in {LAUNCH_TIMEOUT_S} s (a rank waiting forever?)\n{_tail(stdout)}")
    (tmp_path / "launch.log").write_bytes(stdout or b"")
    output = _tail(stdout)
    files = sorted(results.glob("rank*.json"))
    assert len(files) == 2, f"{config.name}: exit {proc.returncode}, {len(files)} result files\n{output}"
    print(f"{config.name}: {time.time() - start:.0f} s (exit {proc.returncode})")
    return [json.loads(f.read_text()) for f in files]


def _tail(stdout: bytes | None, chars: int = 8000) -> str:
    return (stdout or b"").decode(errors="replace")[-chars:]


def _check_two_ranks_trained_together(ranks: list[dict], loaded_on_rank_0: bool = False) -> None:
    """``loaded_on_rank_0``: the senior's weights are on rank 0 only until the engine is prepared (FSDP's
    cpu_ram_efficient_loading: the other ranks hold zeros until accelerate broadcasts rank 0's)."""
    assert [r["process_index"] for r in ranks] == [0, 1]
    assert all(r["num_processes"] == 2 for r in ranks), [r["distributed_type"] for r in ranks]
    assert all(r["global_step"] == 2 for r in ranks)
    # Each rank co-generated its own share with a coin stream of its own.
    assert set(ranks[0]["seeds"]).isdisjoint(ranks[1]["seeds"])
    # The logged tandem metrics are gathered over both ranks: every rank logs the same numbers.
    assert ranks[0]["tandem"] == ranks[1]["tandem"]
    for row in ranks[0]["tandem"]:
        assert 0 < row["tandem/senior_token_fraction"] < 1, row
        assert 0 < row["tandem/junior_unit_fraction"] < 1, row
    # Gradients were synchronized: both ranks end with the same senior, and it moved.
    assert ranks[0]["senior_after"] == ranks[1]["senior_after"]
    assert loaded_on_rank_0 or ranks[0]["senior_before"] == ranks[1]["senior_before"]
    assert ranks[0]["senior_before"] != ranks[0]["senior_after"]


# ------------------------------------------------------------------ tests


@pytest.mark.distributed
def test_two_processes_train_one_senior(tmp_path):
    ranks = _launch(tmp_path, "multi_cpu.yaml")
    _check_two_ranks_trained_together(ranks)
    assert not any(r["synced"] for r in ranks)  # DDP forwards are local: no need to step together


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_two_processes_train_one_senior(tmp_path, stage):
    ranks = _launch(tmp_path, f"deepspeed_zero{stage}.yaml")
    _check_two_ranks_trained_together(ranks)
    assert all(r["zero_stage"] == stage and r["engine"] == "DeepSpeedEngine" for r in ranks), ranks
    assert all(r["synced"] == (stage == 3) for r in ranks)


@pytest.mark.distributed
def test_fsdp2_two_processes_train_one_senior(tmp_path):
    # TRL's fsdp2.yaml loads the weights on rank 0 only (fsdp_cpu_ram_efficient_loading): the other ranks hold zeros
    # until accelerate broadcasts the senior's. The junior copied from the senior must be the initial senior on
    # every rank too, not zeros on rank 1.
    ranks = _launch(tmp_path, "fsdp2.yaml")
    _check_two_ranks_trained_together(ranks, loaded_on_rank_0=True)
    assert all(r["distributed_type"] == "DistributedType.FSDP" and r["fsdp_version"] == 2 for r in ranks), ranks
    assert all(r["synced"] for r in ranks)  # every FSDP forward gathers shards: the ranks step together
    assert all(r["junior"].startswith("FSDP") for r in ranks), [r["junior"] for r in ranks]
    assert ranks[0]["junior_hash"] == ranks[1]["junior_hash"] == ranks[0]["senior_before"], ranks


def _tiny_qwen3(path: Path) -> Path:
    """A tiny random Qwen3 (another architecture and size than the tiny Llama senior) with the tiny tokenizer.

    (Qwen3, not Qwen2: transformers loads a Qwen2 folder's tokenizer as Qwen2Tokenizer, which adds
    ``<|endoftext|>``, so the vocabularies would differ.)"""
    import torch
    from conftest import TINY_VOCAB, build_tiny_tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(5)
    config = Qwen3Config(vocab_size=len(TINY_VOCAB), hidden_size=24, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=12, max_position_embeddings=512,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True)  # fmt: skip
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(40)  # tied to the head: sharp logits, as the tiny Llamas'
    model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return path


@needs_deepspeed
@pytest.mark.distributed
def test_zero3_junior_of_another_architecture(tmp_path):
    from transformers import AutoModelForCausalLM

    junior = _tiny_qwen3(tmp_path / "qwen3-junior")
    ranks = _launch(tmp_path, "deepspeed_zero3.yaml", args={"junior_model_name_or_path": str(junior)})
    _check_two_ranks_trained_together(ranks)
    assert all(r["zero_stage"] == 3 and r["junior"] == "DeepSpeedEngine" for r in ranks), ranks
    # Each rank held a partition of the Qwen3 junior; gathered, it is the checkpoint's, on both ranks.
    on_disk = weights_hash(AutoModelForCausalLM.from_pretrained(junior))
    assert ranks[0]["junior_hash"] == ranks[1]["junior_hash"] == on_disk


@needs_deepspeed
@pytest.mark.distributed
def test_train_math_under_deepspeed_zero2_trains_on_two_processes(tmp_path):
    """The README's command: `accelerate launch --config_file .../deepspeed_zero2.yaml examples/train_math.py`."""
    from conftest import build_tiny_model, build_tiny_tokenizer, child_env, free_port

    model = tmp_path / "model"
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # train_math's prompts are chats
    build_tiny_model(0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(CONFIGS / "deepspeed_zero2.yaml"), "--main_process_port", str(free_port()),
               str(REPO / "examples" / "train_math.py"), "--model_name_or_path", str(model), "--max_steps", "1",
               "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--num_generations", "4",
               "--max_completion_length", "8", "--num_problems", "16", "--log_completions", "false",
               "--log_level", "info", "--save_strategy", "steps", "--save_steps", "1",
               "--output_dir", str(out)]  # fmt: skip
    env = {**child_env(), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.time()
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    output = result.stdout + result.stderr
    (tmp_path / "launch.log").write_text(output)
    print(f"train_math.py under ZeRO-2: {time.time() - start:.0f} s (exit {result.returncode})")
    history = json.loads((out / "log_history.json").read_text())
    # 4 completions per process and step: 8 only when the 2 processes were counted (4 when each trained alone).
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in output, output[-6000:]
    # DeepSpeed's checkpoint holds one ZeRO optimizer partition per rank.
    partitions = sorted(p.name for p in (out / "checkpoint-1").glob("global_step1/*zero_pp_rank_*optim_states.pt"))
    assert len(partitions) == 2, (partitions, output[-6000:])
    assert 0 < history[0]["tandem/senior_token_fraction"] < 1, history
    assert result.returncode == 0, output[-6000:]


def test_cpu_process_state_is_needed_only_for_deepspeed_and_fsdp_without_a_gpu():
    from tandem_grpo.distributed import cpu_process_state, needs_cpu_process_state

    two = {"WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert needs_cpu_process_state({**two, "ACCELERATE_USE_DEEPSPEED": "true"}, has_accelerator=False) == "deepspeed"
    assert needs_cpu_process_state({**two, "ACCELERATE_USE_FSDP": "true"}, has_accelerator=False) == "fsdp"
    assert needs_cpu_process_state({**two, "ACCELERATE_USE_DEEPSPEED": "true"}, has_accelerator=True) is None
    assert needs_cpu_process_state({"ACCELERATE_USE_DEEPSPEED": "true"}, has_accelerator=False) is None  # 1 process
    assert needs_cpu_process_state(two, has_accelerator=False) is None  # DDP: ACCELERATE_USE_CPU does it
    cpu_ddp = {**two, "ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_CPU": "true"}
    assert needs_cpu_process_state(cpu_ddp, has_accelerator=False) is None
    assert cpu_process_state() == {}  # this process was not launched by accelerate


ZERO3_EVERY_FORWARD_GATHERS = {
    # ZeRO-3 keeps gathered parameters while they fit these limits: a tiny model is gathered once and its later
    # forwards need no other rank. At 0, every forward gathers its shards from every rank, as a large model's does.
    "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0,
                          "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0},
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": False},
    "fp16": {"enabled": False},
}  # fmt: skip


def _strict_zero3_config(tmp_path: Path) -> Path:
    ds_config = tmp_path / "zero3_every_forward_gathers.json"
    ds_config.write_text(json.dumps(ZERO3_EVERY_FORWARD_GATHERS))
    text = (CONFIGS / "deepspeed_zero3.yaml").read_text()
    text = text.replace("deepspeed_config:\n", f"deepspeed_config:\n  deepspeed_config_file: {ds_config}\n")
    # Settings a deepspeed_config_file replaces may not be in the accelerate config as well.
    replaced = ("  gradient_accumulation_steps", "  offload", "  zero_stage", "  zero3_save", "mixed_precision")
    kept = [line for line in text.splitlines() if not line.startswith(replaced)]
    path = tmp_path / "zero3_every_forward_gathers.yaml"
    path.write_text("\n".join(kept) + "\n")
    return path


@needs_deepspeed
@pytest.mark.distributed
def test_zero3_rank_that_finishes_first_keeps_stepping(tmp_path):
    # Rank 1 stops after 2 tokens, rank 0 may write 16. Every ZeRO-3 forward of the junior gathers its shards from
    # both ranks, so rank 1 keeps stepping (synced) until rank 0 is done. Unsynced (`unsynced=True` in the worker's
    # spec), rank 0's third junior forward waits for shards while rank 1 has moved on to other collectives: the run
    # dies in that forward ("Connection reset by peer" in DeepSpeed's parameter fetch on gloo) or hangs.
    ranks = _launch(tmp_path, _strict_zero3_config(tmp_path), max_completion_length=16,
                    max_completion_length_by_rank={"1": 2})  # fmt: skip
    assert max(ranks[1]["lengths"]) <= 2 < max(ranks[0]["lengths"]), [r["lengths"] for r in ranks]
    assert all(r["synced"] and r["zero_stage"] == 3 for r in ranks)
    _check_two_ranks_trained_together(ranks)


def test_synced_without_a_process_group_is_the_plain_loop(tiny_tokenizer):
    import torch
    from conftest import TINY_VOCAB, build_tiny_model

    from tandem_grpo.generation import tandem_generate
    from tandem_grpo.handoff import BoundaryTables, HandoffRule

    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(TINY_VOCAB), [1])
    tiny_tokenizer.padding_side = "left"
    ids, mask = tiny_tokenizer(["ab c", "d e"], return_tensors="pt", padding=True).values()
    outs = [
        tandem_generate(
            build_tiny_model(0),
            build_tiny_model(1),
            ids,
            mask,
            rule=HandoffRule("word", 0.5, 32),
            tables=tables,
            max_new_tokens=10,
            eos_token_ids=[1],
            pad_token_id=0,
            generator=torch.Generator().manual_seed(0),
            synced=synced,
        )
        for synced in (False, True)
    ]
    plain, synced = outs
    # senior_logprobs hold NaN where the junior wrote (and NaN != NaN): compared apart, NaN-aware and exactly.
    assert dataclasses.replace(plain, senior_logprobs=None) == dataclasses.replace(synced, senior_logprobs=None)
    assert plain.senior_logprobs is not None and len(plain.senior_logprobs) == len(synced.senior_logprobs) == 2
    for a, b in zip(plain.senior_logprobs, synced.senior_logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=0, equal_nan=True)


class _Collective:
    """A model whose every forward starts with an all-reduce, as a ZeRO-3 or FSDP forward gathers its shards."""

    def __init__(self, model):
        self.model, self.forwards = model, 0

    def __call__(self, **kwargs):
        import torch

        self.forwards += 1
        torch.distributed.all_reduce(torch.zeros(1))
        return self.model(**kwargs)


def _gloo_worker(rank: int, port: int, out_dir: str) -> None:
    """One of 2 gloo ranks: rank 0 stops after 2 tokens, rank 1 writes 16 (no EOS), with collective forwards;
    synced, then not."""
    from datetime import timedelta

    import torch
    from conftest import TINY_VOCAB, build_tiny_model, build_tiny_tokenizer

    from tandem_grpo.generation import tandem_generate
    from tandem_grpo.handoff import BoundaryTables, HandoffRule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=30))
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    eos, length = ([1], 2) if rank == 0 else ([], 16)
    tables = BoundaryTables.from_tokenizer(tokenizer, len(TINY_VOCAB), eos)
    ids, mask = tokenizer(["ab c", "d e", "f"], return_tensors="pt", padding=True).values()
    senior, junior = _Collective(build_tiny_model(0)), _Collective(build_tiny_model(1))

    def generate(models, synced: bool):
        return tandem_generate(*models, ids, mask, rule=HandoffRule("word", 0.5, 32), tables=tables,
                               max_new_tokens=length, eos_token_ids=eos, pad_token_id=0,
                               generator=torch.Generator().manual_seed(rank), synced=synced)  # fmt: skip

    results = {}
    for synced in (True, False):  # unsynced last: it leaves rank 1's process group broken
        result = results[str(synced)] = {}
        senior.forwards = junior.forwards = 0
        try:
            out = generate((senior, junior), synced)
            result.update(length=max(out.lengths), forwards=[senior.forwards, junior.forwards])
            alone = generate((senior.model, junior.model), False)  # the same draws with local forwards, unsynced
            result["same_as_alone"] = repr(out) == repr(alone)  # repr: NaN log-probs of junior tokens compare equal
        except Exception as err:  # noqa: BLE001 (reported to the test)
            result["error"] = f"{type(err).__name__}: {err}"
        if rank == 0 and not synced:
            time.sleep(5)  # stay up, done, while rank 1 waits in its next collective forward
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


@pytest.mark.distributed
def test_synced_generation_keeps_collective_forwards_in_step(tmp_path):
    import torch.multiprocessing as mp
    from conftest import free_port

    mp.start_processes(_gloo_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    synced, unsynced = (
        [json.loads((tmp_path / f"rank{r}.json").read_text())[k] for r in (0, 1)] for k in ("True", "False")
    )
    assert [r.get("length") for r in synced] == [2, 16], synced
    # Rank 0 kept running forwards (pad tokens, output dropped) until rank 1 was done: as many as rank 1 ran...
    assert synced[0]["forwards"] == synced[1]["forwards"] == [16, 16]
    # ... and what each rank generated is what it generates alone.
    assert synced[0]["same_as_alone"] and synced[1]["same_as_alone"]
    # Unsynced, rank 0 stops after its 2 tokens and rank 1's next collective forward waits for it in vain.
    assert unsynced[0].get("length") == 2 and "error" in unsynced[1], unsynced


# ------------------------------------------------------------------ worker


def _senior_hash(trainer) -> str:
    return weights_hash(trainer.accelerator.unwrap_model(trainer.model_wrapped), trainer._is_zero3())


def weights_hash(model, zero3: bool = False) -> str:
    """SHA-256 of every parameter's name and full value (float32): ZeRO-3 partitions are gathered, FSDP2 shards
    (DTensors) made whole; both are collectives that every rank runs."""
    model = getattr(model, "module", model)  # a DeepSpeed engine's model
    gather = None
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(model.parameters()))
    digest = hashlib.sha256()
    with gather or _null():
        for name, param in model.named_parameters():
            value = param.full_tensor() if hasattr(param, "full_tensor") else param
            digest.update(name.encode())
            digest.update(value.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _worker(spec: dict) -> None:
    from conftest import build_tiny_tokenizer
    from datasets import Dataset

    import tandem_grpo.trainer as trainer_module
    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer
    from tandem_grpo.distributed import cpu_process_state

    def length_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    extra = cpu_process_state()  # DeepSpeed and FSDP on CPU processes (nothing for DDP: ACCELERATE_USE_CPU is set)
    args = TandemGRPOConfig(
        output_dir=spec["output_dir"],
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=spec.get("max_completion_length", 12),
        max_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        learning_rate=1e-2,
        seed=3,
        bf16=False,
        **extra,
        **spec.get("args", {}),
    )
    trainer = TandemGRPOTrainer(
        model=spec["model"],
        reward_funcs=length_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab c", "d e", "f.\ng", "h"] * 8}),
        processing_class=build_tiny_tokenizer(),
    )
    rank = trainer.accelerator.process_index
    seeds, synced = [], []
    generate = trainer_module.tandem_generate

    lengths = []
    if str(rank) in spec.get("max_completion_length_by_rank", {}):
        trainer.max_completion_length = spec["max_completion_length_by_rank"][str(rank)]

    def recording_generate(*a, **kw):
        seeds.extend(kw["seeds"].tolist())
        synced.append(bool(kw.get("synced", False)))
        if spec.get("unsynced"):  # only to show what `synced` prevents: a rank waiting forever
            kw["synced"] = False
        out = generate(*a, **kw)
        lengths.append(max(out.lengths))
        return out

    trainer_module.tandem_generate = recording_generate
    before = _senior_hash(trainer)
    junior = weights_hash(trainer.junior, trainer._is_zero3()) if trainer.junior is not None else None
    trainer.train()
    result = {
        "process_index": rank,
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else None,
        "global_step": trainer.state.global_step,
        "engine": type(trainer.model_wrapped).__name__,
        "junior": type(trainer.junior).__name__,
        "junior_hash": junior,
        "fsdp_version": trainer.accelerator.state.fsdp_plugin.fsdp_version if trainer.is_fsdp_enabled else None,
        "seeds": seeds,
        "synced": any(synced),
        "lengths": lengths,
        "tandem": [
            {k: v for k, v in row.items() if k.startswith("tandem/")}
            for row in trainer.state.log_history
            if "tandem/senior_token_fraction" in row
        ],
        "senior_before": before,
        "senior_after": _senior_hash(trainer),
    }
    Path(spec["results"], f"rank{os.environ['RANK']}.json").write_text(json.dumps(result))
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _worker(json.loads(sys.argv[1]))
