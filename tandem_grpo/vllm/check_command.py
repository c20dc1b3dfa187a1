"""``tandem-grpo check``: prove the tandem engine on this machine, with this model, before training.

    tandem-grpo check --model HuggingFaceTB/SmolLM2-135M-Instruct            # colocated engine, as TRL builds it
    tandem-grpo check --model M --junior-model J --dtype bfloat16 --sleep     # a named junior, sleep level 2
    tandem-grpo check --model M --server http://127.0.0.1:8000                # a running `tandem-grpo vllm-serve`

It builds the tandem engine as training would (colocated in this process, or a server's), then compares it with
transformers' copy of the same models at the dtype's tolerance
([`ENGINE_CHECK_TOLERANCES`][tandem_grpo.engine_check.ENGINE_CHECK_TOLERANCES]), through the numbers training
depends on. One JSON line per check, in this order:

- ``engine``: the engine started (model runner, async scheduling, dtype, vLLM version).
- ``junior_start``, ``senior_start``: each model's log-probs on a probe sequence
  ([`tandem_grpo.vllm.checks`][tandem_grpo.vllm.checks]) against transformers'.
- ``sync``: every senior weight perturbed (``x (1 + 0.05 N(0, 1))``, seeded) and synced as training syncs it
  (colocate: [`reload_senior`][tandem_grpo.vllm.model.TandemForCausalLM.reload_senior]; server: the client's weight
  path); every senior parameter of the engine must have been reached.
- ``senior_after_sync``: the probe against the perturbed model.
- ``rollouts``: tandem rollouts with truncation (temperature 0.7, top-k 20, top-p 0.8, word handoffs at p 0.5);
  each senior token's log-prob from the engine against transformers' score of it: the figure training logs as
  ``tandem/engine_logp_diff``.
- ``junior_after_sync``: the junior's probe unchanged.
- ``sleep`` (``--sleep``, colocate): sleep level 2, wake, sync again; senior and junior probes as above.
- ``speed``: decode tokens/s of the senior alone and of the tandem (both models), same requests, and their ratio.

The last line is ``{"check": "summary", "ok": ..., "failed": [...]}``. Exit status 0 when every check passed, 1
otherwise (each failure names its likely causes), 2 for bad arguments. In server mode the server's senior is
restored to the model's weights at the end; checks that need this process's engine (``sleep``) are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

CAUSES = {
    "junior_start": "the engine loaded another junior (a server started with another --model or --junior-model), "
    "or its dtype or kernels compute another function than transformers'",
    "senior_start": "the engine's checkpoint differs from --model, or its kernels compute another function",
    "sync": "a weight the sync does not reach (the names listed): a parameter the engine has and the checkpoint's "
    "names do not map to",
    "senior_after_sync": "a weight the sync did not reach, or a packed kernel copy a reload left stale (vLLM's CPU "
    "backend and a tied output head)",
    "rollouts": "the engine samples from other weights than it was synced with, or its logits processor drops the "
    "kept-mass record",
    "junior_after_sync": "the weight sync or a sleep/wake cycle reached the frozen junior",
    "sleep": "sleep level 2 lost the junior (sleep_preserve_parameter_names) or the re-sync after waking",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem-grpo check", description=__doc__.split("\n\n")[0])

    def add(flag: str, **kwargs) -> None:  # a flag of several words also takes underscores, as vllm-serve's do
        parser.add_argument(*dict.fromkeys((flag, "--" + flag[2:].replace("-", "_"))), **kwargs)

    add("--model", required=True, help="The senior: a folder or hub id.")
    add("--junior-model", default=None, help="The junior; default: self-pairing.")
    add("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
        help="Engine and transformers dtype (auto: bfloat16 on CUDA, else float32).")  # fmt: skip
    add("--server", default=None, help="URL of a running `tandem-grpo vllm-serve` (server mode).")
    add("--sleep", action="store_true", help="Colocate with sleep mode; check a sleep/wake cycle.")
    add("--async-scheduling", action="store_true", help="Ask for async scheduling (V2 runner).")
    add("--enforce-eager", action="store_true", help="No compilation (faster start on a CPU).")
    add("--gpu-memory-utilization", type=float, default=0.3)
    add("--max-model-len", type=int, default=512)
    add("--sequences", type=int, default=8, help="Rollouts and speed requests (default 8).")
    add("--tokens", type=int, default=32, help="Tokens per rollout and speed request (default 32).")
    add("--tolerance", type=float, default=None, help="Mean |Δ| in nats; default: by dtype.")
    add("--seed", type=int, default=0)
    return parser


class _Report:
    """Prints one JSON line per check and remembers the failures."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, check: str, ok: bool, **fields) -> bool:
        line = {"check": check, "ok": bool(ok), **fields}
        if not ok and check != "summary":
            self.failed.append(check)
            line.setdefault("cause", CAUSES.get(check, ""))
        print(json.dumps(line), flush=True)
        return ok

    def compare(self, check: str, engine, reference, tolerance: float, **fields) -> bool:
        from ..engine_check import disagreement

        mean, top, ok = disagreement(engine, reference, tolerance)
        return self(check, ok, mean=round(mean, 9), max=round(top, 9), tolerance=tolerance, **fields)


def main(argv: list[str] | None = None) -> int:
    import torch

    from ..cli import usage_errors

    args = _parser().parse_args(argv)
    report = _Report()
    with usage_errors("tandem-grpo check"):
        models, engine = _set_up(args, report)
    if engine is None:
        return 1
    tolerance = args.tolerance or models.tolerance
    checks = _Checks(args, models, engine, report, tolerance)
    try:
        checks.run()
    finally:
        checks.close()
    report("summary", not report.failed, failed=report.failed, torch=torch.__version__)
    return 0 if not report.failed else 1


class _Models:
    """transformers' copies of the senior and junior, and the probe."""

    def __init__(self, args) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..engine_check import tolerance_for
        from ..junior import probe_ids
        from ..models import resolve_model_path

        self.path = resolve_model_path(args.model)
        self.junior_path = resolve_model_path(args.junior_model) if args.junior_model else None
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        auto = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.dtype = auto if args.dtype == "auto" else getattr(torch, args.dtype)
        self.tolerance = tolerance_for(self.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.senior = AutoModelForCausalLM.from_pretrained(self.path, dtype=self.dtype).to(self.device).eval()
        self.original = {k: v.detach().clone() for k, v in self.senior.state_dict().items()}
        self.ids = probe_ids(len(self.tokenizer))

    def junior_reference(self) -> list[float]:
        from transformers import AutoModelForCausalLM

        from ..engine_check import reference_logprobs

        if self.junior_path is None:
            return reference_logprobs(self.senior, self.ids)
        junior = AutoModelForCausalLM.from_pretrained(self.junior_path, dtype=self.dtype).to(self.device).eval()
        try:
            return reference_logprobs(junior, self.ids)
        finally:
            del junior

    def perturb(self, seed: int) -> None:
        import torch

        generator = torch.Generator(device="cpu").manual_seed(seed)
        with torch.no_grad():
            for param in self.senior.parameters():
                noise = torch.randn(param.shape, generator=generator).to(param.device, param.dtype)
                param.mul_(1 + 0.05 * noise)

    def restore(self) -> None:
        self.senior.load_state_dict(self.original)


def _set_up(args, report: _Report):
    """transformers' models and the engine (a colocated ``vllm.LLM`` or a client); ``(models, None)`` when the
    engine did not start."""
    from ._compat import check_vllm

    version = check_vllm()
    models = _Models(args)
    start = time.perf_counter()
    try:
        if args.server:
            from .client import TandemVLLMClient

            engine = TandemVLLMClient(base_url=args.server, connection_timeout=30)
            info = engine.check_tandem()
            fields = {"mode": "server", "junior_path": info.get("junior_path")}
        else:
            from .engine import build_llm

            options = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": args.max_model_len,
                       "dtype": str(models.dtype)[6:], "enforce_eager": args.enforce_eager}  # fmt: skip
            if args.async_scheduling:
                options["async_scheduling"] = True
            if args.sleep:
                options.update(enable_sleep_mode=True, sleep_preserve_parameter_names=["junior.*"])
            engine = build_llm(models.path, models.junior_path, **options)
            scheduler = engine.llm_engine.vllm_config.scheduler_config
            fields = {"mode": "colocate", "async_scheduling": bool(scheduler.async_scheduling)}
    except (RuntimeError, ConnectionError) as err:
        report("engine", False, error=str(err).splitlines()[0], cause="the engine did not start (message above)")
        return models, None
    from ._compat import model_runner

    report("engine", True, vllm=version, runner=model_runner({}), dtype=str(models.dtype), seconds=round(
        time.perf_counter() - start, 1), **fields)  # fmt: skip
    return models, engine


class _Checks:
    def __init__(self, args, models: _Models, engine, report: _Report, tolerance: float) -> None:
        self.args, self.models, self.engine, self.report, self.tolerance = args, models, engine, report, tolerance
        self.server = bool(args.server)
        self.junior_initial: list[float] | None = None

    def probe(self, which: str) -> list[float]:
        from .checks import probe_logprobs

        return probe_logprobs(self.engine, self.models.ids, which)

    def senior_reference(self) -> list[float]:
        from ..engine_check import reference_logprobs

        return reference_logprobs(self.models.senior, self.models.ids)

    def run(self) -> None:
        report, tolerance = self.report, self.tolerance
        self.junior_initial = self.probe("junior")
        report.compare("junior_start", self.junior_initial, self.models.junior_reference(), tolerance)
        report.compare("senior_start", self.probe("senior"), self.senior_reference(), tolerance)
        before = self.senior_reference()
        self.models.perturb(self.args.seed)
        missing = self.sync()
        report("sync", not missing, missing=missing[:20], missing_count=len(missing))
        after = self.senior_reference()
        from ..engine_check import disagreement

        moved = disagreement(before, after, tolerance)[0]
        report.compare("senior_after_sync", self.probe("senior"), after, tolerance, perturbation_moved=round(moved, 4))
        self.rollouts()
        report.compare("junior_after_sync", self.probe("junior"), self.junior_initial, tolerance)
        if self.args.sleep and not self.server:
            self.sleep_cycle(after)
        self.speed()

    def sync(self) -> list[str]:
        """Push transformers' senior into the engine as training does; the senior parameters it did not reach."""
        from .checks import sync_coverage

        weights = [(name, tensor.detach().clone()) for name, tensor in self.models.senior.named_parameters()]
        if self.server:
            client = self.engine
            if not getattr(client, "_checked_communicator", False):
                client.init_communicator(device=self.models.device if self.models.device == "cpu" else 0)
                client._checked_communicator = True
            metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in weights]
            client.update_named_params(metadata, iter(weights))
        else:
            self.engine.llm_engine.model_executor.driver_worker.model_runner.model.reload_senior(iter(weights))
        self.engine.reset_prefix_cache()
        return sync_coverage(self.engine)

    def rollouts(self) -> None:
        import torch

        from ..handoff import HandoffRule
        from ..rollout import Rollout
        from ..sampling import SamplingSettings
        from .engine import boundary_tables, generate_with_llm

        rule, sampling = HandoffRule("word", 0.5, 32), SamplingSettings(temperature=0.7, top_k=20, top_p=0.8)
        count, models = self.args.sequences, self.models
        prompts = [[int(i) for i in models.ids[: 2 + k % 4]] for k in range(count)]
        seeds = list(range(count))
        if self.server:
            out = self.engine.generate_tandem(prompts, seeds, rule, sampling, max_tokens=self.args.tokens)
            info = self.engine.check_tandem()
            tables = boundary_tables(models.path, int(info["vocab_size"]), tuple(map(int, info["eos_token_ids"])))
            rollout = Rollout.from_engine(*out, seeds, rule, tables)
        else:
            rollout = generate_with_llm(self.engine, prompts, seeds, rule, sampling, max_tokens=self.args.tokens)
        engine, reference = [], []
        for prompt, ids, authors, terms in zip(prompts, rollout.completion_ids, rollout.authorship,
                                               rollout.senior_logprobs, strict=True):  # fmt: skip
            if not ids:
                continue
            with torch.no_grad():
                logits = models.senior(torch.tensor([prompt + ids], device=models.device)).logits[0]
            scored = torch.log_softmax(logits[len(prompt) - 1 : -1].float() / sampling.temperature, dim=-1)
            own = scored.gather(1, torch.tensor(ids, device=scored.device).unsqueeze(1))[:, 0].tolist()
            engine += [t for t, a in zip(terms, authors, strict=True) if a == 1]
            reference += [o for o, a in zip(own, authors, strict=True) if a == 1]
        self.report.compare("rollouts", engine, reference, self.tolerance, senior_tokens=len(engine))

    def sleep_cycle(self, senior_reference: list[float]) -> None:
        llm = self.engine
        llm.sleep(level=2)
        llm.wake_up(tags=["weights"])
        self.sync()
        llm.wake_up(tags=["kv_cache"])
        from ..engine_check import disagreement

        senior = disagreement(self.probe("senior"), senior_reference, self.tolerance)
        junior = disagreement(self.probe("junior"), self.junior_initial, self.tolerance)
        self.report("sleep", senior[2] and junior[2], senior_max=round(senior[1], 9), junior_max=round(junior[1], 9))

    def speed(self) -> None:
        """Decode tokens/s of the senior alone (solo mode, plain requests) and of the tandem (both models, word
        handoffs at p 0.5), same prompts and lengths (EOS ignored), each timed after a warm-up round."""
        from ..handoff import HandoffRule
        from ..sampling import SamplingSettings
        from .checks import _rpc
        from .engine import generate_with_llm, new_uids, sampling_params

        if self.server:
            self.report("speed", True, skipped="server mode: time the server's own throughput")
            return
        count, tokens, llm = self.args.sequences, self.args.tokens, self.engine
        prompts = [[int(i) for i in self.models.ids[: 2 + k % 4]] for k in range(count)]
        sampling, extra = SamplingSettings(temperature=0.7), {"ignore_eos": True}
        rates = {}
        try:
            for name in ("solo", "tandem") * 2:  # the first round warms both paths up; the second is timed
                _rpc(llm, "tandem_set_solo", "senior" if name == "solo" else "")
                llm.reset_prefix_cache()
                start = time.perf_counter()
                if name == "solo":
                    params = sampling_params(sampling, list(range(count)), new_uids(count), None, max_tokens=tokens,
                                             generation_kwargs=extra)  # fmt: skip
                    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
                    written = sum(len(out.outputs[0].token_ids) for out in outputs)
                else:
                    rollout = generate_with_llm(llm, prompts, list(range(count)), HandoffRule("word", 0.5, 32),
                                                sampling, max_tokens=tokens, generation_kwargs=extra)  # fmt: skip
                    written = sum(rollout.lengths)
                rates[name] = written / (time.perf_counter() - start)
        finally:
            _rpc(llm, "tandem_set_solo", "")
            llm.reset_prefix_cache()
        self.report("speed", True, solo_tokens_per_s=round(rates["solo"], 1), tandem_tokens_per_s=round(
            rates["tandem"], 1), tandem_over_solo=round(rates["tandem"] / rates["solo"], 3), sequences=count,
            tokens=tokens)  # fmt: skip

    def close(self) -> None:
        """Server mode: give the server's senior the model's weights back."""
        if self.server:
            self.models.restore()
            self.sync()


if __name__ == "__main__":
    sys.exit(main())
