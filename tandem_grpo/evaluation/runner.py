"""[`evaluate`][tandem_grpo.evaluation.runner.evaluate]: the paper's measurements (arXiv 2606.28166, section 5)
for one or more senior checkpoints, written to a results folder. The runner only orchestrates (each distinct model
loaded and sampled once; docs/api/evaluation/runner.md).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..backends import create_backend
from ..models import loaded_weights
from ..sampling import derive_seed
from .config import _DTYPES, MEASUREMENTS, PRESETS, SCHEDULES, EvaluationConfig, EvaluationError
from .drift import drift, moved_back
from .hacks import hack_detectors
from .inputs import check_senior_slot, check_vocabularies, load_problems, render_prompts
from .inputs import score as _score  # one name for the verdicts of every measurement (tests replace it)
from .junior_legibility import legibility, legibility_block, paired_difference
from .report import RESULTS_FILE, attach_per_completion, authorship_views, sample_records, write_report
from .schedules import (
    TRAINING_RULE_SCHEDULE,
    ScheduleOutput,
    alternating_schedule,
    authorship_shares,
    step_schedule,
    training_rule_schedule,
)
from .solo import capability, capability_by_benchmark, pass_at_k_curve
from .stats import by_problem

__all__ = ["MEASUREMENTS", "PRESETS", "SCHEDULES", "EvaluationConfig", "EvaluationError", "evaluate"]

logger = logging.getLogger(__name__)


@dataclass
class _Model:
    """One distinct model (by resolved path), whatever roles it plays."""

    path: str
    resolved: str
    model: object = None
    backend: object = None
    solo: list[list[int]] | None = None
    solo_correct: list[bool] | None = None


def _display_names(paths: Sequence[str]) -> list[str]:
    """Unique, readable names: the argument as given, suffixed ``#2`` etc. on repeats."""
    names, seen = [], {}
    for p in paths:
        seen[p] = seen.get(p, 0) + 1
        names.append(p if seen[p] == 1 else f"{p}#{seen[p]}")
    return names


def evaluate(config: EvaluationConfig) -> dict:
    """Run the evaluation described by ``config`` and write its report; returns the ``results.json`` content.

    Arguments, datasets and every checkpoint's vocabulary are checked before any weights load
    ([`inputs`][tandem_grpo.evaluation.inputs]). Solo capability always runs, then the measurements of
    ``config.measurements`` in order. Writes ``results.json``, ``samples.jsonl``, ``samples.html`` and the plots of
    [`write_report`][tandem_grpo.evaluation.report.write_report] to ``config.output_dir``.

    Raises:
        EvaluationError: a bad argument, an empty or unreadable dataset, mismatched vocabularies, or a checkpoint
            that cannot be found or loaded.
    """
    config.validate()
    threads = torch.get_num_threads()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    try:
        return _evaluate(config)
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Run:
    """What the measurements of one run share: settings, problems, the loaded models and their roles, the rows.

    ``rows`` holds each rendered prompt ``k`` times (problem-major), ``gold_rows`` its gold answer; every
    completion list of the run is aligned with them. ``benchmarks`` names each problem's benchmark (its
    ``--dataset`` string); the problems of all benchmarks share the rows, one benchmark after the other.
    ``records`` collects the ``samples.jsonl`` lines.
    """

    config: EvaluationConfig
    prompts: list
    golds: list[str]
    benchmarks: list[str]
    resolved: dict[str, str]
    models: dict[str, _Model]
    names: list[str]
    senior_keys: list[str]
    junior_key: str
    base_key: str | None
    grpo_key: str | None
    tokenizer: object
    rows: list[list[int]]
    gold_rows: list[str]
    device: torch.device
    timing: dict[str, float]
    records: list[dict] = field(default_factory=list)

    @property
    def junior(self) -> _Model:
        return self.models[self.junior_key]

    def seniors(self) -> list[tuple[str, _Model]]:
        """``(display name, model)`` of every checkpoint, in the order given."""
        return [(name, self.models[key]) for name, key in zip(self.names, self.senior_keys, strict=True)]

    def solo_keys(self) -> list[str]:
        """Every distinct model that needs solo samples (the junior's drafts start the junior-first schedules)."""
        junior = [self.junior_key] if self.config.junior_solo else []
        extra = [key for key in (self.base_key, self.grpo_key) if key]
        return list(dict.fromkeys(self.senior_keys + junior + extra))

    def score(self, completions: list[list[int]]) -> list[bool]:
        return _score(self.tokenizer, completions, self.gold_rows, self.config.max_new_tokens,
                      self.config.answer == "stated")  # fmt: skip

    def capability(self, correct: list[bool]) -> dict:
        """pass@k and accuracy pooled over every problem, ``by_benchmark`` and their ``macro`` average
        ([`solo`][tandem_grpo.evaluation.solo])."""
        c = self.config
        grouped, ks = by_problem(correct, c.k), c.resolved_pass_at()
        pooled = capability(grouped, ks, seed=c.seed, confidence=c.confidence)
        return pooled | capability_by_benchmark(grouped, self.benchmarks, ks, seed=c.seed, confidence=c.confidence)

    def solo_block(self, m: _Model) -> dict:
        """A model's solo results: pass@k and accuracy, mean length, the pass@k curve with coverage, and the
        reward-hacking detectors ([`hack_detectors`][tandem_grpo.evaluation.hacks.hack_detectors])."""
        c = self.config
        curve = pass_at_k_curve(
            by_problem(m.solo_correct, c.k), c.pass_at_k_curve_max, seed=c.seed, confidence=c.confidence
        )
        texts = self.tokenizer.batch_decode(m.solo, skip_special_tokens=True)
        hacks = hack_detectors(
            by_problem(m.solo, c.k), by_problem(texts, c.k), c.max_new_tokens, m.backend.eos_token_ids,
            confidence=c.confidence, seed=c.seed,
        )  # fmt: skip
        return self.capability(m.solo_correct) | {
            "mean_completion_tokens": _mean_len(m.solo),
            "pass_at_k_curve": curve,
            "hacks": hacks,
        }

    def add_records(self, checkpoint: str, schedule: str, completions, authorship, correct) -> None:
        self.records += sample_records(
            checkpoint, schedule, completions, authorship, correct, self.tokenizer, self.config.k, self.benchmarks
        )

    def progress(self, desc: str):
        from tqdm.auto import tqdm

        return tqdm(total=len(self.rows), desc=desc, unit="seq", disable=not self.config.show_progress)


def _evaluate(config: EvaluationConfig) -> dict:
    started = time.perf_counter()
    out_dir = Path(config.output_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EvaluationError(f"--output_dir {config.output_dir!r} cannot be created: {err}") from err
    run = _prepare(config, started)
    results = _measure_solo(run)
    measurements = set(config.measurements)
    schedule_outputs = _timed(run, "handoff_schedules", _measure_handoff, results, "handoff" in measurements)
    _timed(run, "drift", _measure_drift, results, "drift" in measurements)
    _timed(run, "legibility", _measure_legibility, results, "legibility" in measurements)
    html_samples = authorship_views(schedule_outputs or {}, run.records, run.prompts, run.golds, run.tokenizer,
                                    config.k, config.num_html_samples)  # fmt: skip
    with (out_dir / "samples.jsonl").open("w", encoding="utf-8") as handle:
        for r in run.records:
            handle.write(json.dumps(r) + "\n")
    run.timing["total"] = time.perf_counter() - started
    results["timing_seconds"] = run.timing
    write_report(results, out_dir, html_samples)
    logger.info("Wrote %s", out_dir / RESULTS_FILE)
    return results


def _timed(run: _Run, name: str, measure, results: dict, enabled: bool):
    """Run ``measure(run, results)`` when ``enabled``; its time (0 when skipped) goes to ``timing[name]``."""
    t = time.perf_counter()
    out = measure(run, results) if enabled else None
    run.timing[name] = time.perf_counter() - t
    return out


def _prepare(config: EvaluationConfig, started: float) -> _Run:
    """Load the problems, resolve every model once, check vocabularies (all before any weights), then load them."""
    from transformers import AutoModelForCausalLM

    from ..models import resolve_model_path

    timing: dict[str, float] = {}
    prompts, golds, benchmarks = load_problems(config)
    drift = "drift" in config.measurements
    resolved: dict[str, str] = {}
    models: dict[str, _Model] = {}

    def register(path: str) -> str:
        if path not in resolved:
            try:
                resolved[path] = resolve_model_path(path)
            except OSError as err:
                raise EvaluationError(f"Model {path!r} cannot be found: {err}") from err
        key = resolved[path]
        models.setdefault(key, _Model(path=path, resolved=key))
        return key

    senior_keys = [register(p) for p in config.checkpoints]
    junior_key = register(config.junior or config.base)
    base_key = register(config.base or config.junior) if drift else None
    grpo_key = register(config.grpo_checkpoint) if config.grpo_checkpoint and drift else None
    tokenizers = check_vocabularies(models, junior_key)
    tokenizer = tokenizers[senior_keys[0]]
    if config.backend == "vllm":
        # Every model but the junior goes into the senior slot (the junior too when it is also a checkpoint).
        check_senior_slot([models[k] for k in models if k != junior_key or k in senior_keys])
    timing["checks"] = time.perf_counter() - started

    # Prompts use the first checkpoint's chat template (all share one vocabulary; tandem training renders the
    # prompt once for both models, as here).
    prompt_ids = render_prompts(tokenizer, prompts)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t = time.perf_counter()
    for m in models.values():
        try:
            m.model = AutoModelForCausalLM.from_pretrained(m.resolved, dtype=_DTYPES[config.dtype]).to(device)
        except (OSError, ValueError) as err:
            raise EvaluationError(f"Cannot load model {m.path!r} from {m.resolved}: {err}") from err
        m.model.eval().requires_grad_(False)
    junior = models[junior_key].model  # tandem schedules co-generate each model with the run's junior
    for key, m in models.items():
        try:
            m.backend = create_backend(config.backend, m.model, tokenizers[key], junior=junior,
                                       batch_size=config.batch_size, show_progress=config.show_progress,
                                       max_model_len=max(len(p) for p in prompt_ids) + config.max_new_tokens,
                                       concurrent=len(prompt_ids) * config.k, seed=config.seed)  # fmt: skip
        except (ImportError, ValueError) as err:
            raise EvaluationError(f"--backend {config.backend}: {err}") from err
    timing["load_models"] = time.perf_counter() - t
    return _Run(config=config, prompts=prompts, golds=golds, benchmarks=benchmarks, resolved=resolved, models=models,
                names=_display_names(list(config.checkpoints)), senior_keys=senior_keys, junior_key=junior_key,
                base_key=base_key, grpo_key=grpo_key, tokenizer=tokenizer,
                rows=[p for p in prompt_ids for _ in range(config.k)],
                gold_rows=[g for g in golds for _ in range(config.k)], device=device, timing=timing)  # fmt: skip


def _measure_solo(run: _Run) -> dict:
    """Measurement 1, solo capability: sample every distinct model once and score it; returns the results skeleton
    (settings, the junior's and each checkpoint's ``"solo"`` block)."""
    config = run.config
    t = time.perf_counter()
    for key in run.solo_keys():
        m = run.models[key]
        seed = derive_seed(config.seed, "solo", m.path)
        m.solo = m.backend.generate(run.rows, config.sampling, max_new_tokens=config.max_new_tokens, seed=seed,
                                    desc=f"solo {Path(m.path).name}")  # fmt: skip
        m.solo_correct = run.score(m.solo)
    run.timing["solo_generation_and_scoring"] = time.perf_counter() - t

    junior_arg, base_arg = config.junior or config.base, config.base or config.junior
    results: dict = {
        "paper": "Tandem Reinforcement Learning with Verifiable Rewards (arXiv 2606.28166), section 5",
        "settings": config.to_dict()
        | {
            "resolved_paths": dict(run.resolved),
            "weights": {path: loaded_weights(path) for path in run.resolved},  # hub commit, GGUF copy or folder
            "junior": junior_arg,
            "base": base_arg,
            "device": str(run.device),
            "torch_threads": torch.get_num_threads(),
            "num_problems": len(run.prompts),
            "num_problems_by_benchmark": {b: run.benchmarks.count(b) for b in dict.fromkeys(run.benchmarks)},
            "chat_template_from": config.checkpoints[0],
            "versions": _versions(),
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "checkpoints": {name: {"path": m.path, "solo": run.solo_block(m)} for name, m in run.seniors()},
        "junior": {"path": junior_arg} | ({"solo": run.solo_block(run.junior)} if run.junior.solo else {}),
    }
    for key in run.solo_keys():
        m = run.models[key]
        author = 1 if key in run.senior_keys else 0
        run.add_records(m.path, "solo", m.solo, [[author] * len(c) for c in m.solo], m.solo_correct)
    return results


def _measure_handoff(run: _Run, results: dict) -> dict[str, list[ScheduleOutput]]:
    """Measurement 2, handoff robustness: each checkpoint with the junior under the schedules of
    ``config.schedules``: the alternating protocol, the training rule and the step schedules (both orders, every
    ``s`` of the grid); returns each checkpoint's schedule outputs."""
    config, tokenizer, junior = run.config, run.tokenizer, run.junior
    rule = config.handoff
    schedule_outputs: dict[str, list[ScheduleOutput]] = {}
    for name, senior in run.seniors():
        outputs = []
        cap = config.max_new_tokens
        if "alternating" in config.schedules:
            outputs.append(alternating_schedule(
                run.rows, senior.backend, junior.backend, tokenizer, config.sampling, max_new_tokens=cap,
                max_rounds=config.max_rounds, seed=derive_seed(config.seed, "alternating", senior.path),
                desc=f"alternating {name}"))  # fmt: skip
        if TRAINING_RULE_SCHEDULE in config.schedules:
            outputs.append(training_rule_schedule(
                senior.backend, run.rows, config.sampling, rule, max_new_tokens=cap,
                seed=derive_seed(config.seed, TRAINING_RULE_SCHEDULE, senior.path),
                desc=f"tandem {rule.granularity} p={rule.junior_probability:g} {name}"))  # fmt: skip
        for s in config.step_grid if "steps" in config.schedules else []:
            for first, lead, other in (("senior", senior, junior), ("junior", junior, senior)):
                outputs.append(step_schedule(
                    run.rows, lead.solo, s, first=first, continuation=other.backend, tokenizer=tokenizer,
                    sampling=config.sampling, max_new_tokens=cap, seed=derive_seed(config.seed, senior.path),
                    desc=f"{first}_first_s{s} {name}"))  # fmt: skip
        handoff = results["checkpoints"][name]["handoff"] = {}
        for out in outputs:
            correct = run.score(out.completion_ids)
            handoff[out.name] = (
                run.capability(correct)
                | authorship_shares(out, config.k, confidence=config.confidence, seed=config.seed)
                | {
                    "senior_token_fraction": out.senior_token_fraction(),
                    "exhausted_fraction": out.exhausted_fraction(),
                    "mean_completion_tokens": _mean_len(out.completion_ids),
                    "schedule": out.settings,
                }
            )
            if out.turns is not None:
                handoff[out.name]["mean_turns"] = sum(out.turns) / len(out.turns) if out.turns else float("nan")
            run.add_records(name, out.name, out.completion_ids, out.authorship, correct)
        schedule_outputs[name] = outputs
    return schedule_outputs


def _measure_drift(run: _Run, results: dict) -> None:
    """Measurement 3: each checkpoint's (and the GRPO checkpoint's) drift from the base with its null (``k >= 2``)
    and, with a GRPO checkpoint, the share of its most-shifted tokens moved back (``k >= 4``)."""
    c = run.config
    base = run.models[run.base_key]
    grpo = run.models[run.grpo_key] if run.grpo_key else None
    vocab = int(run.junior.model.get_output_embeddings().weight.shape[0])
    stats = {"confidence": c.confidence, "seed": c.seed}

    def drift_entry(m: _Model) -> dict:
        if c.k < 2:  # the estimator compares disjoint halves of each problem's samples
            return {}
        return {"drift_with_null": drift(by_problem(m.solo, c.k), by_problem(base.solo, c.k),
                                         prefix_tokens=c.drift_prefix_tokens, **stats)}  # fmt: skip

    results["base"] = {"path": c.base or c.junior, "num_tokens": sum(len(ids) for ids in base.solo)}
    if grpo:
        results["grpo"] = {"path": c.grpo_checkpoint, "solo": run.solo_block(grpo)} | drift_entry(grpo)
    for name, m in run.seniors():
        entry = results["checkpoints"][name]
        entry.update(drift_entry(m))
        if grpo and m is not grpo and c.k >= 4:
            entry["moved_back"] = moved_back(
                by_problem(base.solo, c.k), by_problem(grpo.solo, c.k), by_problem(m.solo, c.k), vocab,
                top_n=c.drift_top_n, **stats,
            ) | {"grpo_checkpoint": c.grpo_checkpoint}  # fmt: skip


def _measure_legibility(run: _Run, results: dict) -> None:
    """Measurement 4: the junior's cross-entropy on each checkpoint's solo completions and the two models' overlap
    (each distinct model scored once), summarized by
    [`legibility_block`][tandem_grpo.evaluation.junior_legibility.legibility_block]; with the junior's own samples,
    its reference (``junior.legibility_self``) and each checkpoint's paired difference from it."""
    c, junior = run.config, run.junior
    stats = {"confidence": c.confidence, "seed": c.seed}
    done: dict[str, dict] = {}

    def score(key: str, senior, desc: str) -> dict:
        if key not in done:
            with run.progress(desc) as bar:
                done[key] = legibility(senior, junior.model, run.rows, run.models[key].solo,
                                       junior.backend.pad_token_id, c.score_batch_size, bar,
                                       eos_token_ids=junior.backend.eos_token_ids)  # fmt: skip
        return done[key]

    def block(out: dict) -> dict:
        return legibility_block(out, run.benchmarks, c.k, **stats)

    outputs = {name: score(m.resolved, m.model, f"legibility {name}") for name, m in run.seniors()}
    for name, m in run.seniors():  # per completion in samples.jsonl: a later report can pair them across runs
        attach_per_completion(run.records, m.path, outputs[name]["per_completion"])
        results["checkpoints"][name]["legibility"] = block(outputs[name])
    if run.junior.solo is None:  # the junior's own reference lives in another run (EvaluationConfig.junior_solo)
        return
    own = score(run.junior_key, None, "legibility junior (self)")
    attach_per_completion(run.records, run.junior.path, own["per_completion"])
    own_ce = by_problem(own["per_completion"]["junior_cross_entropy"], c.k)
    for name, out in outputs.items():
        # How much harder (> 0) the junior finds the checkpoint's text than its own, problems resampled together.
        ce = by_problem(out["per_completion"]["junior_cross_entropy"], c.k)
        results["checkpoints"][name]["legibility"]["minus_junior_self"] = {
            "junior_cross_entropy": paired_difference(ce, own_ce, **stats)
        }
    # No senior: no overlap (a junior that is also a checkpoint keeps its cached overlap with itself, 1).
    results["junior"]["legibility_self"] = block(own)


def _mean_len(completions: list[list[int]]) -> float:
    return sum(len(c) for c in completions) / len(completions) if completions else float("nan")


def _versions() -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        from importlib.metadata import version

        out["trl"] = version("trl")
        out["tandem-grpo"] = version("tandem-grpo")
    except Exception:  # a source checkout without an installed distribution has no version metadata
        pass
    return out
