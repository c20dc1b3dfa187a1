"""``evaluate``: the paper's four measurements for one or more senior checkpoints, written to a results folder.

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166), section 5.

1. Solo capability (5.1): k sampled completions per problem for every checkpoint (and the junior, as a
   reference); unbiased pass@k and mean accuracy with bootstrap intervals
   ([`metrics`][tandem_grpo.evaluation.metrics]).
2. Handoff robustness (5.2): each checkpoint paired with the frozen junior under (a) the training rule
   ([`word_handoff_schedule`][tandem_grpo.evaluation.schedules.word_handoff_schedule]) and (b) step schedules,
   senior-first and junior-first, over a grid of step counts
   ([`step_schedule`][tandem_grpo.evaluation.schedules.step_schedule]); pass@k per schedule.
3. Drift (5.3): KL(checkpoint || base) of marginal token distributions of the solo completions; with a GRPO
   checkpoint, the share of GRPO's most-shifted tokens each checkpoint moves back toward the base.
4. Legibility (5.4): the junior's per-token cross-entropy on each checkpoint's solo completions and the per-token
   overlap of the two models' next-token distributions.

Every model that appears in several roles (e.g. the junior is also the base, or is itself evaluated) is loaded
once and sampled once: its solo completions are reused everywhere, so e.g. ``KL(base || base)`` is exactly 0.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..handoff import HandoffRule
from ..sampling import SamplingSettings
from .backends import check_backend_name, create_backend, derive_seed
from .metrics import DEFAULT_KL_SMOOTHING, capability, drift_reversal, legibility, marginal_kl, token_counts
from .report import RESULTS_FILE, SampleView, write_report
from .schedules import ScheduleOutput, step_schedule, word_handoff_schedule

logger = logging.getLogger(__name__)

MEASUREMENTS = ("handoff", "drift", "legibility")


class EvaluationError(ValueError):
    """A problem with the evaluation's inputs; the message names the argument, the value and the fix."""


@dataclass
class EvaluationConfig:
    """Everything an evaluation run depends on (all of it is written to ``results.json``).

    Attributes:
        checkpoints: senior checkpoints (local folders or hub ids, resolved by
            [`resolve_model_path`][tandem_grpo.models.resolve_model_path]), at least one.
        junior: the frozen junior; defaults to ``base``. At least one of ``junior`` and ``base`` is required.
        base: the pre-RL model drift is measured against; defaults to ``junior``.
        grpo_checkpoint: a vanilla-GRPO senior for the drift-reversal measurement (optional).
        dataset: passed to [`load_math_dataset`][tandem_grpo.data.load_math_dataset] (default ``"gsm8k"``).
        split: passed to [`load_math_dataset`][tandem_grpo.data.load_math_dataset] (default ``"test"``).
        limit: passed to [`load_math_dataset`][tandem_grpo.data.load_math_dataset] (default ``None``: all rows).
        k: completions sampled per problem (default 4).
        pass_at: the k values of pass@k, each ``<= k`` (default: 1, 2, 4, ... up to and including ``k``).
        sampling: sampling settings ([`SamplingSettings`][tandem_grpo.sampling.SamplingSettings], the ones training
            uses).
        max_new_tokens: completion length cap in tokens (default 256).
        junior_probability: of the schedule-(a) handoff rule (default 0.5, the paper's).
        handoff_granularity: of the schedule-(a) handoff rule (default ``"word"``, the paper's).
        max_gap_tokens: of the schedule-(a) handoff rule (default 32, the paper's).
        step_grid: step counts ``s`` of the step schedules (default 1, 2, 3).
        measurements: which of ``"handoff"``, ``"drift"``, ``"legibility"`` to run (solo always runs; default all).
        backend: solo-generation backend (``"transformers"``).
        batch_size: sequences per generation call (default 16).
        score_batch_size: sequences per teacher-forced forward pass (default 4).
        device: ``"cpu"``, ``"cuda"``, or ``None`` (CUDA when available).
        dtype: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"``.
        num_threads: CPU threads for torch during the run (restored afterwards); ``None`` keeps torch's default.
            On a CPU shared with other jobs, 1 can be several times faster than oversubscribed OpenMP threads.
        drift_top_n: N of the drift reversal (default 500, the paper's).
        kl_smoothing: additive pseudo-count (see
            [`DEFAULT_KL_SMOOTHING`][tandem_grpo.evaluation.metrics.DEFAULT_KL_SMOOTHING], the default).
        confidence: confidence level of the bootstrap intervals (default 0.95).
        num_html_samples: problems shown per checkpoint in ``samples.html`` (default 6).
        output_dir: results folder (default ``"evaluation_results"``).
        show_progress: tqdm bars (default ``True``).
        seed: base seed of every draw (default 0).
    """

    checkpoints: Sequence[str]
    junior: str | None = None
    base: str | None = None
    grpo_checkpoint: str | None = None
    dataset: str = "gsm8k"
    split: str = "test"
    limit: int | None = None
    k: int = 4
    pass_at: Sequence[int] | None = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    max_new_tokens: int = 256
    junior_probability: float = 0.5
    handoff_granularity: str = "word"
    max_gap_tokens: int = 32
    step_grid: Sequence[int] = (1, 2, 3)
    measurements: Sequence[str] = MEASUREMENTS
    backend: str = "transformers"
    batch_size: int = 16
    score_batch_size: int = 4
    device: str | None = None
    dtype: str = "float32"
    num_threads: int | None = None
    drift_top_n: int = 500
    kl_smoothing: float = DEFAULT_KL_SMOOTHING
    confidence: float = 0.95
    num_html_samples: int = 6
    output_dir: str = "evaluation_results"
    show_progress: bool = True
    seed: int = 0

    def resolved_pass_at(self) -> list[int]:
        if self.pass_at:
            return sorted({int(x) for x in self.pass_at})
        ks, k = [], 1
        while k < self.k:
            ks.append(k)
            k *= 2
        return ks + [self.k]

    def handoff_rule(self) -> HandoffRule:
        return HandoffRule.from_config(self)

    def validate(self) -> None:
        """Check every argument that needs no model or data; raise
        [`EvaluationError`][tandem_grpo.evaluation.runner.EvaluationError] naming it."""
        if not self.checkpoints:
            raise EvaluationError("No checkpoints to evaluate: pass at least one with --checkpoints PATH_OR_ID.")
        if self.junior is None and self.base is None:
            raise EvaluationError(
                "Neither --junior nor --base was given: pass --junior (the frozen junior, usually the model the "
                "seniors started from before RL); --base defaults to it."
            )
        if self.k < 1:
            raise EvaluationError(f"--k {self.k}: the number of samples per problem must be >= 1.")
        if self.max_new_tokens < 1:
            raise EvaluationError(f"--max_new_tokens {self.max_new_tokens}: must be >= 1.")
        for kk in self.resolved_pass_at():
            if kk < 1:
                raise EvaluationError(f"--pass_at {kk}: pass@k needs k >= 1.")
            if kk > self.k:
                raise EvaluationError(
                    f"--pass_at {kk} is larger than the number of samples per problem (--k {self.k}): the unbiased "
                    f"pass@k estimator needs at least k samples. Raise --k to {kk} or drop {kk} from --pass_at."
                )
        if self.limit is not None and self.limit < 1:
            raise EvaluationError(f"--limit {self.limit}: must be >= 1 (or omitted for the whole split).")
        bad_steps = [s for s in self.step_grid if s < 1]
        if bad_steps:
            raise EvaluationError(
                f"--step_grid {list(self.step_grid)}: step counts must be >= 1 (s=0 is the other model alone, "
                "reported as its solo score)."
            )
        unknown = [m for m in self.measurements if m not in MEASUREMENTS]
        if unknown:
            raise EvaluationError(f"Unknown measurement(s) {unknown}; choose from {list(MEASUREMENTS)}.")
        try:
            check_backend_name(self.backend)
            self.handoff_rule()
        except ValueError as err:
            raise EvaluationError(str(err)) from err
        if self.num_threads is not None and self.num_threads < 1:
            raise EvaluationError(f"--num_threads {self.num_threads}: must be >= 1 (or omitted for torch's default).")
        for name in ("batch_size", "score_batch_size", "drift_top_n"):
            if getattr(self, name) < 1:
                raise EvaluationError(f"--{name} {getattr(self, name)}: must be >= 1.")
        if self.num_html_samples < 0:
            raise EvaluationError(f"--num_html_samples {self.num_html_samples}: must be >= 0.")
        if not self.kl_smoothing > 0:
            raise EvaluationError(f"--kl_smoothing {self.kl_smoothing}: must be > 0 (a zero count makes KL infinite).")
        if not 0 < self.confidence < 1:
            raise EvaluationError(f"--confidence {self.confidence}: must be in (0, 1), e.g. 0.95.")
        if self.dtype not in _DTYPES:
            raise EvaluationError(f"--dtype {self.dtype!r}: choose one of {list(_DTYPES)}.")
        if self.device not in (None, "cpu") and not str(self.device).startswith("cuda"):
            raise EvaluationError(f"--device {self.device!r}: use 'cpu' or 'cuda' (or omit it for auto).")
        if self.device is not None and str(self.device).startswith("cuda") and not torch.cuda.is_available():
            raise EvaluationError(f"--device {self.device}: CUDA is not available on this machine; use --device cpu.")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["checkpoints"] = list(self.checkpoints)
        d["step_grid"] = list(self.step_grid)
        d["measurements"] = list(self.measurements)
        d["pass_at"] = self.resolved_pass_at()
        return d


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Model:
    """One distinct model (by resolved path), whatever roles it plays."""

    path: str
    resolved: str
    model: object = None
    backend: object = None
    solo: list[list[int]] | None = None
    solo_correct: list[bool] | None = None


def _load_problems(config: EvaluationConfig) -> tuple[list, list[str]]:
    from ..data import load_math_dataset

    try:
        dataset = load_math_dataset(config.dataset, split=config.split, limit=config.limit)
    except (ValueError, OSError, RuntimeError) as err:
        raise EvaluationError(
            f"--dataset {config.dataset!r} (split {config.split!r}) could not be loaded: {err}"
        ) from err
    if len(dataset) == 0:
        raise EvaluationError(f"--dataset {config.dataset!r} (split {config.split!r}) is empty: nothing to evaluate.")
    return list(dataset["prompt"]), [str(a) for a in dataset["answer"]]


def _check_vocabularies(models: dict[str, _Model], junior_path: str) -> object:
    """Tokenizer and config of every model against the junior's, before any weights load; returns a tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    from ..junior import check_same_vocabulary, logits_width

    tokenizers, widths = {}, {}
    for key, m in models.items():
        try:
            tokenizers[key] = AutoTokenizer.from_pretrained(m.resolved)
            widths[key] = logits_width(AutoConfig.from_pretrained(m.resolved))
        except (OSError, ValueError) as err:
            raise EvaluationError(f"Cannot read the tokenizer/config of {m.path!r} ({m.resolved}): {err}") from err
    for key, m in models.items():
        if key == junior_path:
            continue
        try:
            check_same_vocabulary(tokenizers[key], tokenizers[junior_path], widths[key], widths[junior_path])
        except ValueError as err:
            raise EvaluationError(
                f"Checkpoint {m.path!r} and junior {models[junior_path].path!r} have different vocabularies: {err}"
            ) from err
    return tokenizers


def _render_prompts(tokenizer, prompts: list) -> list[list[int]]:
    """Chat-template each conversation (with the assistant header) and tokenize it without extra specials."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _score(tokenizer, completions: list[list[int]], golds_per_row: list[str], max_new_tokens: int) -> list[bool]:
    from ..rewards import is_correct

    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    # The training reward's rule: a completion cut off at the length cap only scores with a complete \boxed{}.
    return [
        is_correct(t, g, truncated=len(ids) >= max_new_tokens)
        for t, g, ids in zip(texts, golds_per_row, completions, strict=True)
    ]


def _by_problem(values: list, k: int) -> list[list]:
    return [values[i : i + k] for i in range(0, len(values), k)]


def _display_names(paths: Sequence[str]) -> list[str]:
    """Unique, readable names: the argument as given, suffixed ``#2`` etc. on repeats."""
    names, seen = [], {}
    for p in paths:
        seen[p] = seen.get(p, 0) + 1
        names.append(p if seen[p] == 1 else f"{p}#{seen[p]}")
    return names


def evaluate(config: EvaluationConfig) -> dict:
    """Run the evaluation described by ``config`` and write its report; returns the ``results.json`` content.

    Inputs are checked before any model weights load: arguments
    ([`EvaluationConfig.validate`][tandem_grpo.evaluation.runner.EvaluationConfig.validate]), the dataset (loaded and
    non-empty), and every checkpoint's tokenizer and logits width against the junior's.

    Outputs in ``config.output_dir``: ``results.json`` (every number, the settings, timings), ``pass_at_k.png``,
    ``drift.png``, ``cross_entropy.png``, ``samples.html`` (authorship view) and ``samples.jsonl`` (every
    completion with its verdict and authorship).

    Args:
        config: the run's settings.

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


def _evaluate(config: EvaluationConfig) -> dict:
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    from ..authorship import authorship_spans
    from ..models import resolve_model_path

    timing: dict[str, float] = {}
    started = time.perf_counter()
    out_dir = Path(config.output_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EvaluationError(f"--output_dir {config.output_dir!r} cannot be created: {err}") from err

    prompts, golds = _load_problems(config)
    measurements = set(config.measurements)
    junior_arg = config.junior or config.base
    base_arg = config.base or config.junior

    resolved: dict[str, str] = {}

    def resolve(path: str) -> str:
        if path not in resolved:
            try:
                resolved[path] = resolve_model_path(path)
            except OSError as err:
                raise EvaluationError(f"Model {path!r} cannot be found: {err}") from err
        return resolved[path]

    models: dict[str, _Model] = {}

    def register(path: str) -> str:
        key = resolve(path)
        models.setdefault(key, _Model(path=path, resolved=key))
        return key

    names = _display_names(list(config.checkpoints))
    senior_keys = [register(p) for p in config.checkpoints]
    junior_key = register(junior_arg)
    base_key = register(base_arg) if "drift" in measurements else None
    grpo_key = register(config.grpo_checkpoint) if config.grpo_checkpoint and "drift" in measurements else None
    tokenizers = _check_vocabularies(models, junior_key)
    tokenizer = tokenizers[senior_keys[0]]
    timing["checks"] = time.perf_counter() - started

    # Prompts use the first checkpoint's chat template (all share one vocabulary; tandem training renders the
    # prompt once for both models, as here).
    prompt_ids = _render_prompts(tokenizer, prompts)
    rows = [p for p in prompt_ids for _ in range(config.k)]
    gold_rows = [g for g in golds for _ in range(config.k)]

    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t = time.perf_counter()
    for m in models.values():
        try:
            m.model = AutoModelForCausalLM.from_pretrained(m.resolved, dtype=_DTYPES[config.dtype]).to(device)
        except (OSError, ValueError) as err:
            raise EvaluationError(f"Cannot load model {m.path!r} from {m.resolved}: {err}") from err
        m.model.eval().requires_grad_(False)
        m.backend = create_backend(
            config.backend,
            m.model,
            tokenizers[m.resolved],
            batch_size=config.batch_size,
            show_progress=config.show_progress,
        )
    timing["load_models"] = time.perf_counter() - t
    eos_ids = models[junior_key].backend.eos_token_ids
    pad_id = models[junior_key].backend.pad_token_id
    sampling, max_new_tokens = config.sampling, config.max_new_tokens

    # 1. Solo samples: every distinct model once (the junior's drafts start the junior-first schedules).
    t = time.perf_counter()
    needs_solo = list(dict.fromkeys(senior_keys + [junior_key] + [k for k in (base_key, grpo_key) if k]))
    for key in needs_solo:
        m = models[key]
        m.solo = m.backend.generate(
            rows,
            sampling,
            max_new_tokens=max_new_tokens,
            seed=derive_seed(config.seed, "solo", m.path),
            desc=f"solo {Path(m.path).name}",
        )
        m.solo_correct = _score(tokenizer, m.solo, gold_rows, max_new_tokens)
    timing["solo_generation_and_scoring"] = time.perf_counter() - t

    ks = config.resolved_pass_at()

    def cap(correct: list[bool]) -> dict:
        return capability(_by_problem(correct, config.k), ks, seed=config.seed, confidence=config.confidence)

    results: dict = {
        "paper": "Tandem Reinforcement Learning with Verifiable Rewards (arXiv 2606.28166), section 5",
        "settings": config.to_dict()
        | {
            "resolved_paths": {p: resolve(p) for p in resolved},
            "junior": junior_arg,
            "base": base_arg,
            "device": str(device),
            "torch_threads": torch.get_num_threads(),
            "num_problems": len(prompts),
            "chat_template_from": config.checkpoints[0],
            "versions": _versions(),
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "checkpoints": {},
        "junior": {"path": junior_arg, "solo": cap(models[junior_key].solo_correct)},
    }
    results["junior"]["solo"]["mean_completion_tokens"] = _mean_len(models[junior_key].solo)
    records: list[dict] = []
    html_samples: list[SampleView] = []
    for key in needs_solo:
        m = models[key]
        author = 1 if key in senior_keys else 0
        records += _records(
            m.path, "solo", m.solo, [[author] * len(c) for c in m.solo], m.solo_correct, tokenizer, config.k
        )

    # 2. Handoff schedules.
    t = time.perf_counter()
    rule = config.handoff_rule()
    junior = models[junior_key]
    schedule_outputs: dict[str, list[ScheduleOutput]] = {}
    for name, key in zip(names, senior_keys, strict=True):
        senior = models[key]
        entry = {"path": senior.path, "solo": cap(senior.solo_correct)}
        entry["solo"]["mean_completion_tokens"] = _mean_len(senior.solo)
        results["checkpoints"][name] = entry
        if "handoff" not in measurements:
            continue
        outputs = []
        with tqdm(total=len(rows), desc=f"tandem {rule.granularity} p={rule.junior_probability:g} {name}",
                  unit="seq", disable=not config.show_progress) as bar:  # fmt: skip
            outputs.append(
                word_handoff_schedule(
                    senior.model,
                    junior.model,
                    tokenizer,
                    rows,
                    sampling,
                    rule,
                    max_new_tokens=max_new_tokens,
                    eos_token_ids=eos_ids,
                    pad_token_id=pad_id,
                    batch_size=config.batch_size,
                    seed=derive_seed(config.seed, "word", senior.path),
                    progress=bar,
                )
            )
        for s in config.step_grid:
            for first, lead, other in (("senior", senior, junior), ("junior", junior, senior)):
                outputs.append(
                    step_schedule(
                        rows,
                        lead.solo,
                        s,
                        first=first,
                        continuation=other.backend,
                        tokenizer=tokenizer,
                        sampling=sampling,
                        max_new_tokens=max_new_tokens,
                        seed=derive_seed(config.seed, senior.path),
                        desc=f"{first}_first_s{s} {name}",
                    )  # fmt: skip
                )
        entry["handoff"] = {}
        for out in outputs:
            correct = _score(tokenizer, out.completion_ids, gold_rows, max_new_tokens)
            entry["handoff"][out.name] = cap(correct) | {
                "senior_token_fraction": out.senior_token_fraction(),
                "exhausted_fraction": out.exhausted_fraction(),
                "mean_completion_tokens": _mean_len(out.completion_ids),
                "schedule": out.settings,
            }
            records += _records(name, out.name, out.completion_ids, out.authorship, correct, tokenizer, config.k)
        schedule_outputs[name] = outputs
    timing["handoff_schedules"] = time.perf_counter() - t

    # 3. Drift.
    t = time.perf_counter()
    if "drift" in measurements:
        vocab = int(junior.model.get_output_embeddings().weight.shape[0])
        base_counts = token_counts(models[base_key].solo, vocab)
        grpo_counts = token_counts(models[grpo_key].solo, vocab) if grpo_key else None
        results["base"] = {"path": base_arg, "num_tokens": int(base_counts.sum())}
        if grpo_key:
            results["grpo"] = {
                "path": config.grpo_checkpoint,
                "solo": cap(models[grpo_key].solo_correct),
                "drift": {
                    "kl_to_base_nats": marginal_kl(grpo_counts, base_counts, config.kl_smoothing),
                    "num_tokens": int(grpo_counts.sum()),
                },
            }
        for name, key in zip(names, senior_keys, strict=True):
            counts = token_counts(models[key].solo, vocab)
            entry = results["checkpoints"][name]
            entry["drift"] = {
                "kl_to_base_nats": marginal_kl(counts, base_counts, config.kl_smoothing),
                "num_tokens": int(counts.sum()),
                "smoothing": config.kl_smoothing,
                "definition": "KL(checkpoint || base) of smoothed marginal completion-token distributions, nats",
            }
            if grpo_key and key != grpo_key:
                entry["drift_reversal"] = drift_reversal(
                    base_counts, grpo_counts, counts, top_n=config.drift_top_n, smoothing=config.kl_smoothing
                ) | {"grpo_checkpoint": config.grpo_checkpoint}
    timing["drift"] = time.perf_counter() - t

    # 4. Legibility.
    t = time.perf_counter()
    if "legibility" in measurements:
        done: dict[str, dict] = {}
        for name, key in zip(names, senior_keys, strict=True):
            if key not in done:
                with tqdm(
                    total=len(rows), desc=f"legibility {name}", unit="seq", disable=not config.show_progress
                ) as bar:
                    done[key] = legibility(
                        models[key].model, junior.model, rows, models[key].solo, pad_id, config.score_batch_size, bar
                    )
            results["checkpoints"][name]["legibility"] = dict(done[key])
        if junior_key not in done:
            with tqdm(
                total=len(rows), desc="legibility junior (self)", unit="seq", disable=not config.show_progress
            ) as bar:
                done[junior_key] = legibility(
                    None, junior.model, rows, junior.solo, pad_id, config.score_batch_size, bar
                )
        results["junior"]["legibility_self"] = {
            "junior_cross_entropy": done[junior_key]["junior_cross_entropy"],
            "num_tokens": done[junior_key]["num_tokens"],
        }
    timing["legibility"] = time.perf_counter() - t

    # Authorship view: the training rule's samples first, then one senior-first and one junior-first schedule.
    by_row = {(r["checkpoint"], r["schedule"], r["problem"], r["sample"]): r for r in records}
    n_show = min(config.num_html_samples, len(prompts))
    for name, outputs in schedule_outputs.items():
        picks = [(outputs[0], n_show)] + [(o, min(2, n_show)) for o in outputs[1:3]]
        for out, count in picks:
            for problem in range(count):
                row = problem * config.k
                html_samples.append(
                    SampleView(
                        checkpoint=name,
                        schedule=out.name,
                        problem=prompts[problem][-1]["content"],
                        gold=golds[problem],
                        correct=by_row[(name, out.name, problem, 0)]["correct"],
                        spans=authorship_spans(out.completion_ids[row], out.authorship[row], tokenizer),
                    )
                )

    with (out_dir / "samples.jsonl").open("w", encoding="utf-8") as handle:
        for r in records:
            handle.write(json.dumps(r) + "\n")
    timing["total"] = time.perf_counter() - started
    results["timing_seconds"] = timing
    results["outputs"] = {}
    write_report(results, out_dir, html_samples)
    logger.info("Wrote %s", out_dir / RESULTS_FILE)
    return results


def _mean_len(completions: list[list[int]]) -> float:
    return sum(len(c) for c in completions) / len(completions) if completions else float("nan")


def _records(checkpoint, schedule, completions, authorship, correct, tokenizer, k) -> list[dict]:
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return [
        {
            "checkpoint": checkpoint,
            "schedule": schedule,
            "problem": i // k,
            "sample": i % k,
            "correct": bool(ok),
            "num_tokens": len(ids),
            "senior_tokens": int(sum(a)),
            "text": text,
            "authorship": list(a),
        }
        for i, (ids, a, ok, text) in enumerate(zip(completions, authorship, correct, texts, strict=True))
    ]


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
