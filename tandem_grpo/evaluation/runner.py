"""``evaluate``: the paper's four measurements for one or more senior checkpoints, written to a results folder.

Paper: "Tandem Reinforcement Learning with Verifiable Rewards" (arXiv 2606.28166), section 5.

1. Solo capability (5.1): k sampled completions per problem for every checkpoint (and the junior, as a
   reference); unbiased pass@k and mean accuracy with bootstrap intervals
   ([`metrics`][tandem_grpo.evaluation.metrics]), and beyond the paper the pass@k curve up to k = 32 with coverage
   (share of problems solved at least once).
2. Handoff robustness (5.2): each checkpoint paired with the frozen junior under (a) the paper's protocol, senior
   first, then one reasoning step each in one budget
   ([`alternating_schedule`][tandem_grpo.evaluation.schedules.alternating_schedule]), (b) the training rule
   ([`word_handoff_schedule`][tandem_grpo.evaluation.schedules.word_handoff_schedule]) and (c) step schedules,
   senior-first and junior-first, over a grid of step counts
   ([`step_schedule`][tandem_grpo.evaluation.schedules.step_schedule]); pass@k per schedule, with the senior's share
   of the tokens and the share of rows that changed hands.
3. Drift (5.3): KL(checkpoint || base) of marginal token distributions of the solo completions, whole and split
   into the first 8 completion tokens and the rest; with a GRPO checkpoint, the share of GRPO's most-shifted
   tokens each checkpoint moves back toward the base.
4. Legibility (5.4): the junior's per-token cross-entropy on each checkpoint's solo completions and the per-token
   overlap of the two models' next-token distributions, averaged as the paper's authors do (per completion without
   EOS, then over completions), with intervals over problems, an even/odd-samples null and the paired difference
   from the junior on its own samples ([`legibility_intervals`][tandem_grpo.evaluation.legibility_intervals]).

Every model that appears in several roles (e.g. the junior is also the base, or is itself evaluated) is loaded
once and sampled once: its solo completions are reused everywhere, so e.g. ``KL(base || base)`` is exactly 0.

Several benchmarks (``--dataset gsm8k math500``) run together: their problems share every measurement's rows, and
each pass@k / accuracy block and each legibility block adds ``by_benchmark`` (the figures of each benchmark alone)
and ``macro`` (the plain mean over benchmarks, the headline of the paper's authors, CSSLab/Tandem-RLVR
``eval/common.py``) next to the pooled figures over all problems. ``--preset paper`` sets the authors' decoding
([`PRESETS`][tandem_grpo.evaluation.runner.PRESETS]).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..data import INSTRUCTIONS
from ..handoff import HandoffRule
from ..sampling import SamplingSettings
from .backends import BACKENDS, VLLMBackend, check_backend_name, create_backend, derive_seed, shared_engine
from .drift import drift as drift_with_null
from .drift import moved_back
from .hacks import hack_detectors
from .legibility_intervals import benchmark_means, cot_mean, macro_average, macro_mean, paired_difference
from .metrics import (
    DEFAULT_CURVE_MAX_K,
    DEFAULT_DRIFT_PREFIX_TOKENS,
    DEFAULT_KL_SMOOTHING,
    bootstrap_mean,
    capability,
    capability_by_benchmark,
    drift_reversal,
    legibility,
    marginal_kl,
    marginal_kl_by_position,
    pass_at_k_curve,
    token_counts,
)
from .report import RESULTS_FILE, SampleView, write_report
from .schedules import (
    MAX_ROUNDS,
    ScheduleOutput,
    alternating_schedule,
    step_schedule,
    word_handoff_schedule,
)

logger = logging.getLogger(__name__)

MEASUREMENTS = ("handoff", "drift", "legibility")
SCHEDULES = ("alternating", "word", "steps")
"""The handoff schedules of ``--schedules``: the paper's protocol
([`alternating_schedule`][tandem_grpo.evaluation.schedules.alternating_schedule]), the training rule
([`word_handoff_schedule`][tandem_grpo.evaluation.schedules.word_handoff_schedule]) and the step grid
([`step_schedule`][tandem_grpo.evaluation.schedules.step_schedule])."""
_DTYPE_NAMES = ("float32", "bfloat16", "float16")

PRESETS: dict[str, dict[str, float | int]] = {
    "paper": {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "k": 8,
        "max_new_tokens": 3000,
        "max_rounds": 150,
    },
}
"""The evaluation presets of ``--preset``: name to the fields they set (sampling fields by their
[`SamplingSettings`][tandem_grpo.sampling.SamplingSettings] names, the rest by their
[`EvaluationConfig`][tandem_grpo.evaluation.runner.EvaluationConfig] names).

``paper`` is the paper authors' evaluation (CSSLab/Tandem-RLVR): ``eval/config.py`` fixes temperature 0.7, top-p 0.8,
top-k 20 and a response budget of 3000 tokens (``MAX_TOKENS``); their sampling calls leave min-p and the repetition
penalty at vLLM's off values (0 and 1); ``eval/solo.py`` and ``eval/handoff.py`` draw ``--n 8`` samples per problem
(pass@1, 2, 4, 8, which ``k = 8`` gives by default) and cap the handoff protocol at 150 rounds. Not adopted, having
no field here: their 4096-token engine context, which shortens the 3000-token budget on prompts longer than 1088
tokens (``eval/common.py`` ``response_budget``); their seeds (17 for solo, ``1000 * problem + sample`` per handoff
chain), which are vLLM's and would not reproduce their draws here; ``enable_thinking=False`` in the chat template
(inert for their instruct junior); and their default benchmarks (AIME 2024-2026, AMC 2023-2025), of which only
``aime24`` and ``amc23`` ship as short names: ``--dataset`` stays the user's choice."""

PRESET_SOURCES = {
    "paper": "CSSLab/Tandem-RLVR eval/config.py (TEMPERATURE, TOP_P, TOP_K, MAX_TOKENS), eval/solo.py and "
    "eval/handoff.py (--n 8, MAX_ROUNDS 150)",
}
_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingSettings))


class EvaluationError(ValueError):
    """A problem with the evaluation's inputs; the message names the argument, the value and the fix."""


def _arg(default=dataclasses.MISSING, help: str = "", **kwargs):  # noqa: A002 - argparse's name
    """A dataclass field whose ``help`` metadata is what ``tandem-grpo evaluate --help`` prints for it."""
    if isinstance(default, (list, tuple)):
        value = list(default)
        return field(default_factory=lambda: list(value), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass
class EvaluationConfig:
    """Everything an evaluation run depends on (all of it is written to ``results.json``).

    Each field is one ``tandem-grpo evaluate`` flag of the same name; its ``help`` metadata (printed by ``--help``
    with the default) is its documentation. The defaults are the paper's where it has one (the handoff rule's:
    junior probability 0.5, the authors' ``"after_boundary"`` mode, word units, a 32-token cap; ``drift_top_n``
    500).

    Attributes:
        checkpoints: senior checkpoints (local folders or hub ids, resolved by
            [`resolve_model_path`][tandem_grpo.models.resolve_model_path]), at least one.
        junior: the frozen junior (default: ``base``); at least one of ``junior`` and ``base`` is required.
        base: the pre-RL model drift is measured against (default: ``junior``).
        sampling: sampling settings ([`SamplingSettings`][tandem_grpo.sampling.SamplingSettings], the ones
            training uses; the command line sets its fields with ``--temperature`` etc.).
        handoff: the handoff rule of the word (training-rule) schedule
            ([`HandoffRule`][tandem_grpo.handoff.HandoffRule], the rule training uses; the command line sets it with
            the training config's flags ``--junior_probability``, ``--handoff_mode``, ``--handoff_granularity`` and
            ``--max_gap_tokens``).
        pass_at: k values of pass@k, each ``<= k`` (default: 1, 2, 4, ... up to and including ``k``).
        pass_at_k_curve_max: the pass@k curve covers every k from 1 to ``min(pass_at_k_curve_max, k)``
            (default 32); see [`pass_at_k_curve`][tandem_grpo.evaluation.metrics.pass_at_k_curve].
        drift_prefix_tokens: drift is also reported separately for the first this-many completion tokens and the
            rest (default 8); see [`marginal_kl_by_position`][tandem_grpo.evaluation.metrics.marginal_kl_by_position].
        num_threads: CPU threads for torch during the run (restored afterwards); ``None`` keeps torch's default.
            On a CPU shared with other jobs, 1 can be several times faster than oversubscribed OpenMP threads.
        dataset: one dataset (a string: a jsonl path or a short name) or several (a list; on the command line
            ``--dataset gsm8k math500``), each a benchmark of its own in ``by_benchmark`` and the ``macro``
            average; [`datasets`][tandem_grpo.evaluation.runner.EvaluationConfig.datasets] gives the list. The
            attribute keeps what was given (a string stays a string); ``results.json`` records the list.
        limit: the first ``limit`` problems of each dataset, not of their concatenation (the authors truncate the
            concatenated list, ``eval/common.py`` ``load_problems``, so a small limit there evaluates the first
            benchmark only). Per benchmark, every benchmark keeps problems and the macro average stays an average
            over all of them.
        preset: ``None`` (default) or a name from [`PRESETS`][tandem_grpo.evaluation.runner.PRESETS] (``"paper"``:
            the authors' temperature 0.7, top-p 0.8, top-k 20, 8 samples, 3000 new tokens, 150 rounds), applied by
            [`apply_preset`][tandem_grpo.evaluation.runner.EvaluationConfig.apply_preset] before validation.
            Precedence: a flag given on the command line wins over the preset; from Python, a field whose value
            differs from its default counts as given and wins, a field left at its default takes the preset's value
            (call ``apply_preset(given=...)`` first to keep a value that equals the default).

    Invalid values raise [`EvaluationError`][tandem_grpo.evaluation.runner.EvaluationError] from
    [`validate`][tandem_grpo.evaluation.runner.EvaluationConfig.validate] (which
    [`evaluate`][tandem_grpo.evaluation.runner.evaluate] calls first), not from the constructor.
    """

    checkpoints: list[str] = _arg(help="Senior checkpoints to evaluate (local folders or hub ids); at least one is "
                                  "required.", metavar="PATH_OR_ID")  # fmt: skip
    junior: str | None = _arg(None, "Frozen junior (default: --base; one of the two is required).")
    base: str | None = _arg(None, "Pre-RL model drift is measured against (default: --junior).")
    grpo_checkpoint: str | None = _arg(
        None, "Vanilla-GRPO senior, for the drift-reversal measurement (default: none)."
    )
    dataset: str | list[str] = _arg(["gsm8k"], "One or more datasets, each a jsonl path or a short name: gsm8k, "
                                    "math500, minerva_math, aime24, amc23, multiarith. With several, results add "
                                    "each benchmark's figures and their macro average (plain mean over "
                                    "benchmarks).", metavar="PATH_OR_NAME")  # fmt: skip
    split: str = _arg("test", "Dataset split.")
    instruction: str = _arg("step_by_step", "What each question asks for: step_by_step, one_line or steps (use the "
                            "one the checkpoints were trained with; tandem_grpo.data.INSTRUCTIONS).")  # fmt: skip
    limit: int | None = _arg(None, "Evaluate the first N problems of each dataset (default: all of the split).")
    k: int = _arg(4, "Completions sampled per problem (n of the pass@k estimator).")
    pass_at: list[int] | None = _arg(None, "k values of pass@k, each <= --k (default: 1, 2, 4, ... and --k).")
    pass_at_k_curve_max: int = _arg(DEFAULT_CURVE_MAX_K, "Largest k of the pass@k curve (every k from 1 to "
                                    "min(this, --k)); raise --k to reach it.")  # fmt: skip
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    max_new_tokens: int = _arg(256, "Completion length cap in tokens.")
    handoff: HandoffRule = field(default_factory=HandoffRule)
    schedules: list[str] = _arg(list(SCHEDULES), "Handoff schedules to run: alternating (the paper's protocol: senior "
                                "first, then one reasoning step each), word (the training rule), steps (s steps of "
                                "one model, then the other).")  # fmt: skip
    max_rounds: int = _arg(MAX_ROUNDS, "Round cap of the alternating protocol (one senior and one junior step each; "
                           "the authors' 150).")  # fmt: skip
    step_grid: list[int] = _arg([1, 2, 3], "Step counts s of the step schedules (s steps, then the other model).")
    measurements: list[str] = _arg(list(MEASUREMENTS), f"Which of {', '.join(MEASUREMENTS)} to run (solo always "
                                   "runs).")  # fmt: skip
    junior_solo: bool = _arg(True, "Sample the junior alone (its solo block and its own legibility reference); "
                             "off when another run holds them (the reproduction study's pieces).")  # fmt: skip
    backend: str = _arg("transformers", f"Generation backend, one of {', '.join(BACKENDS)}: transformers generate "
                        "and tandem_generate, or one tandem vLLM engine (unseeded on a CPU).")  # fmt: skip
    batch_size: int = _arg(16, "Sequences per generation call.")
    score_batch_size: int = _arg(4, "Sequences per teacher-forced scoring pass.")
    device: str | None = _arg(None, "cpu or cuda (default: cuda when available).")
    dtype: str = _arg("float32", f"Model weights dtype: {', '.join(_DTYPE_NAMES)}.")
    num_threads: int | None = _arg(None, "Torch CPU threads during the run (default: torch's; 1 on a busy shared "
                                   "CPU).")  # fmt: skip
    drift_top_n: int = _arg(500, "N of the drift reversal: GRPO's N most-shifted tokens.")
    drift_prefix_tokens: int = _arg(DEFAULT_DRIFT_PREFIX_TOKENS, "Drift is also reported for the first N "
                                    "completion tokens and for the rest.")  # fmt: skip
    kl_smoothing: float = _arg(DEFAULT_KL_SMOOTHING, "Additive pseudo-count per vocabulary entry of the marginal "
                               "token distributions.")  # fmt: skip
    confidence: float = _arg(0.95, "Confidence level of the bootstrap intervals.")
    num_html_samples: int = _arg(6, "Problems shown per checkpoint in samples.html.")
    output_dir: str = _arg("evaluation_results", "Results folder.")
    show_progress: bool = _arg(True, "Progress bars (default: on; --no_progress hides them).")
    seed: int = _arg(0, "Base seed of every draw.")
    preset: str | None = _arg(None, f"Evaluation preset ({', '.join(PRESETS)}). paper: the paper authors' "
                              "temperature 0.7, top_p 0.8, top_k 20, k 8, max_new_tokens 3000, max_rounds 150; "
                              "flags given explicitly win over it.")  # fmt: skip

    def datasets(self) -> list[str]:
        """``dataset`` as a list of sources (a single string or path becomes a list of one); benchmark names in
        ``results.json`` are these strings."""
        if self.dataset is None:
            return []
        if isinstance(self.dataset, (str, os.PathLike)):
            return [os.fspath(self.dataset)]
        return [os.fspath(d) if isinstance(d, os.PathLike) else d for d in self.dataset]

    def apply_preset(self, given: Collection[str] | None = None) -> dict | None:
        """Set the fields of ``preset`` ([`PRESETS`][tandem_grpo.evaluation.runner.PRESETS]) that were not given;
        [`validate`][tandem_grpo.evaluation.runner.EvaluationConfig.validate] calls it first.

        Args:
            given: names of the fields the user set explicitly (the command line passes its flags); they keep
                their values. ``None`` (from Python): the fields whose value differs from the default count as
                given.

        Returns:
            ``None`` without a preset, else the record written to ``results.json`` (``settings.preset_settings``):
            ``{"name", "source", "applied": {field: value}, "given": {field: value kept}}``. A second call
            returns the first record and changes nothing.

        Raises:
            EvaluationError: an unknown preset, naming the presets.
        """
        if self.preset is None:
            return None
        if self.preset not in PRESETS:
            raise EvaluationError(f"--preset {self.preset!r}: no such preset; choose one of: {', '.join(PRESETS)}.")
        record = getattr(self, "_preset_record", None)
        if record is not None and record["name"] == self.preset:
            return record
        values = PRESETS[self.preset]

        def current(name: str):
            return getattr(self.sampling, name) if name in _SAMPLING_FIELDS else getattr(self, name)

        if given is None:
            defaults = {f.name: f.default for f in dataclasses.fields(SamplingSettings)}
            defaults |= {f.name: f.default for f in dataclasses.fields(self) if f.name in values}
            given = {name for name in values if current(name) != defaults[name]}
        applied = {name: value for name, value in values.items() if name not in given}
        kept = {name: current(name) for name in values if name in given}
        sampling = {name: value for name, value in applied.items() if name in _SAMPLING_FIELDS}
        if sampling:
            self.sampling = dataclasses.replace(self.sampling, **sampling)
        for name, value in applied.items():
            if name not in _SAMPLING_FIELDS:
                setattr(self, name, value)
        record = {"name": self.preset, "source": PRESET_SOURCES[self.preset], "applied": applied, "given": kept}
        self._preset_record = record
        return record

    def resolved_pass_at(self) -> list[int]:
        if self.pass_at:
            return sorted({int(x) for x in self.pass_at})
        ks, k = [], 1
        while k < self.k:
            ks.append(k)
            k *= 2
        return ks + [self.k]

    def validate(self) -> None:
        """Check every argument that needs no model or data (after applying ``preset``); raise
        [`EvaluationError`][tandem_grpo.evaluation.runner.EvaluationError] naming it."""
        self.apply_preset()
        sources = self.datasets()
        if not sources or any(not isinstance(d, str) or not d.strip() for d in sources):
            raise EvaluationError(f"--dataset {self.dataset!r}: give one or more datasets (paths or short names).")
        repeated = list(dict.fromkeys(d for d in sources if sources.count(d) > 1))
        if repeated:
            raise EvaluationError(
                f"--dataset lists {', '.join(repeated)} more than once: each benchmark counts once in the macro "
                "average."
            )
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
        if "steps" in self.schedules and not self.step_grid:
            raise EvaluationError(
                "--schedules includes steps but --step_grid is empty: give step counts (e.g. --step_grid 1 2 3) or "
                "drop steps from --schedules."
            )
        bad_steps = [s for s in self.step_grid if s < 1]
        if bad_steps:
            raise EvaluationError(
                f"--step_grid {list(self.step_grid)}: step counts must be >= 1 (s=0 is the other model alone, "
                "reported as its solo score)."
            )
        if self.instruction not in INSTRUCTIONS:
            raise EvaluationError(f"--instruction {self.instruction!r}: choose one of {', '.join(INSTRUCTIONS)}.")
        unknown = [m for m in self.schedules if m not in SCHEDULES]
        if unknown or not self.schedules:
            raise EvaluationError(f"--schedules {list(self.schedules)}: choose one or more of {list(SCHEDULES)}.")
        if self.max_rounds < 1:
            raise EvaluationError(f"--max_rounds {self.max_rounds}: must be >= 1.")
        unknown = [m for m in self.measurements if m not in MEASUREMENTS]
        if unknown:
            raise EvaluationError(f"Unknown measurement(s) {unknown}; choose from {list(MEASUREMENTS)}.")
        try:
            check_backend_name(self.backend)
        except ValueError as err:
            raise EvaluationError(str(err)) from err
        if not isinstance(self.handoff, HandoffRule):
            raise EvaluationError(f"handoff={self.handoff!r}: pass a tandem_grpo.handoff.HandoffRule.")
        if self.num_threads is not None and self.num_threads < 1:
            raise EvaluationError(f"--num_threads {self.num_threads}: must be >= 1 (or omitted for torch's default).")
        for name in ("batch_size", "score_batch_size", "drift_top_n", "pass_at_k_curve_max", "drift_prefix_tokens"):
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
        d["schedules"] = list(self.schedules)
        d["measurements"] = list(self.measurements)
        d["pass_at"] = self.resolved_pass_at()
        d["dataset"] = self.datasets()
        d["preset_settings"] = getattr(self, "_preset_record", None) if self.preset is not None else None
        return d


_DTYPES = {name: getattr(torch, name) for name in _DTYPE_NAMES}


@dataclass
class _Model:
    """One distinct model (by resolved path), whatever roles it plays."""

    path: str
    resolved: str
    model: object = None
    backend: object = None
    solo: list[list[int]] | None = None
    solo_correct: list[bool] | None = None


def _load_problems(config: EvaluationConfig) -> tuple[list, list[str], list[str]]:
    """Every dataset of ``config.dataset`` in order, the first ``config.limit`` problems of each; returns the
    prompts, the gold answers and each problem's benchmark name (its ``--dataset`` string), aligned."""
    from ..data import load_math_dataset

    prompts, golds, benchmarks = [], [], []
    sources = config.datasets()
    for source in sources:
        where = f"--dataset {source!r}" if len(sources) == 1 else f"--dataset {source!r} (of {', '.join(sources)})"
        try:
            dataset = load_math_dataset(source, split=config.split, limit=config.limit,
                                        instruction=INSTRUCTIONS[config.instruction])  # fmt: skip
        except (ValueError, OSError, RuntimeError) as err:
            raise EvaluationError(f"{where} (split {config.split!r}) could not be loaded: {err}") from err
        if len(dataset) == 0:
            raise EvaluationError(f"{where} (split {config.split!r}) is empty: nothing to evaluate.")
        prompts += list(dataset["prompt"])
        golds += [str(a) for a in dataset["answer"]]
        benchmarks += [source] * len(dataset)
    return prompts, golds, benchmarks


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


def _check_senior_slot(models: list[_Model]) -> None:
    """``--backend vllm`` swaps every non-junior model into one engine's senior slot: their shapes must match."""
    from transformers import AutoConfig

    def shape(m: _Model) -> tuple:
        text = AutoConfig.from_pretrained(m.resolved).get_text_config()
        names = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads")
        return (type(text).__name__, *(getattr(text, n, None) for n in names))

    first = shape(models[0])
    for m in models[1:]:
        if shape(m) != first:
            raise EvaluationError(
                f"--backend vllm loads every checkpoint into one engine's senior slot, but {m.path!r} has another "
                f"architecture or size than {models[0].path!r} ({shape(m)} vs {first}); use --backend transformers."
            )


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

    Measurements run in order, each in its own function: solo capability (always), then those of
    ``config.measurements``: handoff robustness, drift, legibility.

    Outputs in ``config.output_dir``: ``results.json`` (every number, the settings, timings), ``pass_at_k.png``,
    ``pass_at_k_curve.png`` (solo pass@k for k = 1 .. ``min(pass_at_k_curve_max, k)`` with coverage),
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
        return _score(self.tokenizer, completions, self.gold_rows, self.config.max_new_tokens)

    def capability(self, correct: list[bool]) -> dict:
        """pass@k and accuracy pooled over every problem
        ([`capability`][tandem_grpo.evaluation.metrics.capability]), plus ``by_benchmark`` and their ``macro``
        average ([`capability_by_benchmark`][tandem_grpo.evaluation.metrics.capability_by_benchmark])."""
        c = self.config
        grouped, ks = _by_problem(correct, c.k), c.resolved_pass_at()
        pooled = capability(grouped, ks, seed=c.seed, confidence=c.confidence)
        return pooled | capability_by_benchmark(grouped, self.benchmarks, ks, seed=c.seed, confidence=c.confidence)

    def benchmark_names(self) -> list[str]:
        """The run's benchmarks, in ``--dataset`` order."""
        return list(dict.fromkeys(self.benchmarks))

    def solo_block(self, m: _Model) -> dict:
        """A model's solo results: pass@k and accuracy, mean length, the pass@k curve with coverage, and the
        reward-hacking detectors ([`hack_detectors`][tandem_grpo.evaluation.hacks.hack_detectors])."""
        c = self.config
        curve = pass_at_k_curve(
            _by_problem(m.solo_correct, c.k), c.pass_at_k_curve_max, seed=c.seed, confidence=c.confidence
        )
        texts = self.tokenizer.batch_decode(m.solo, skip_special_tokens=True)
        hacks = hack_detectors(
            _by_problem(m.solo, c.k), _by_problem(texts, c.k), c.max_new_tokens, m.backend.eos_token_ids,
            confidence=c.confidence, seed=c.seed,
        )  # fmt: skip
        return self.capability(m.solo_correct) | {
            "mean_completion_tokens": _mean_len(m.solo),
            "pass_at_k_curve": curve,
            "hacks": hacks,
        }

    def add_records(self, checkpoint: str, schedule: str, completions, authorship, correct) -> None:
        self.records += _records(
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
    html_samples = _authorship_views(run, schedule_outputs or {})
    with (out_dir / "samples.jsonl").open("w", encoding="utf-8") as handle:
        for r in run.records:
            handle.write(json.dumps(r) + "\n")
    run.timing["total"] = time.perf_counter() - started
    results["timing_seconds"] = run.timing
    results["outputs"] = {}
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
    prompts, golds, benchmarks = _load_problems(config)
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
    tokenizers = _check_vocabularies(models, junior_key)
    tokenizer = tokenizers[senior_keys[0]]
    if config.backend == "vllm":
        # Every model but the junior goes into the senior slot (the junior too when it is also a checkpoint).
        _check_senior_slot([models[k] for k in models if k != junior_key or k in senior_keys])
    timing["checks"] = time.perf_counter() - started

    # Prompts use the first checkpoint's chat template (all share one vocabulary; tandem training renders the
    # prompt once for both models, as here).
    prompt_ids = _render_prompts(tokenizer, prompts)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t = time.perf_counter()
    for m in models.values():
        try:
            m.model = AutoModelForCausalLM.from_pretrained(m.resolved, dtype=_DTYPES[config.dtype]).to(device)
        except (OSError, ValueError) as err:
            raise EvaluationError(f"Cannot load model {m.path!r} from {m.resolved}: {err}") from err
        m.model.eval().requires_grad_(False)
        if config.backend == "transformers":
            m.backend = create_backend(
                config.backend,
                m.model,
                tokenizers[m.resolved],
                batch_size=config.batch_size,
                show_progress=config.show_progress,
            )
    if config.backend == "transformers":
        for m in models.values():  # the word schedule co-generates each model with the run's junior
            m.backend.junior = models[junior_key].model
    if config.backend == "vllm":
        max_model_len = max(len(p) for p in prompt_ids) + config.max_new_tokens
        try:
            engine = shared_engine(models[senior_keys[0]].resolved, models[junior_key].resolved, dtype=config.dtype,
                                   max_model_len=max_model_len, seed=config.seed,
                                   concurrent=len(prompt_ids) * config.k)  # fmt: skip
        except (ImportError, ValueError) as err:
            raise EvaluationError(f"--backend vllm: {err}") from err
        for key, m in models.items():
            m.backend = VLLMBackend(engine, m.resolved, is_junior=key == junior_key,
                                    pad_token_id=tokenizers[key].pad_token_id, tokenizer=tokenizers[key])  # fmt: skip
    timing["load_models"] = time.perf_counter() - t
    return _Run(
        config=config,
        prompts=prompts,
        golds=golds,
        benchmarks=benchmarks,
        resolved=resolved,
        models=models,
        names=_display_names(list(config.checkpoints)),
        senior_keys=senior_keys,
        junior_key=junior_key,
        base_key=base_key,
        grpo_key=grpo_key,
        tokenizer=tokenizer,
        rows=[p for p in prompt_ids for _ in range(config.k)],
        gold_rows=[g for g in golds for _ in range(config.k)],
        device=device,
        timing=timing,
    )


def _measure_solo(run: _Run) -> dict:
    """Measurement 1, solo capability: sample every distinct model once and score it; returns the results skeleton
    (settings, the junior's and each checkpoint's ``"solo"`` block)."""
    config = run.config
    t = time.perf_counter()
    for key in run.solo_keys():
        m = run.models[key]
        m.solo = m.backend.generate(
            run.rows,
            config.sampling,
            max_new_tokens=config.max_new_tokens,
            seed=derive_seed(config.seed, "solo", m.path),
            desc=f"solo {Path(m.path).name}",
        )
        m.solo_correct = run.score(m.solo)
    run.timing["solo_generation_and_scoring"] = time.perf_counter() - t

    junior_arg, base_arg = config.junior or config.base, config.base or config.junior
    results: dict = {
        "paper": "Tandem Reinforcement Learning with Verifiable Rewards (arXiv 2606.28166), section 5",
        "settings": config.to_dict()
        | {
            "resolved_paths": dict(run.resolved),
            "junior": junior_arg,
            "base": base_arg,
            "device": str(run.device),
            "torch_threads": torch.get_num_threads(),
            "num_problems": len(run.prompts),
            "num_problems_by_benchmark": {b: run.benchmarks.count(b) for b in run.benchmark_names()},
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
        if "alternating" in config.schedules:
            outputs.append(
                alternating_schedule(
                    run.rows,
                    senior.backend,
                    junior.backend,
                    tokenizer,
                    config.sampling,
                    max_new_tokens=config.max_new_tokens,
                    max_rounds=config.max_rounds,
                    seed=derive_seed(config.seed, "alternating", senior.path),
                    desc=f"alternating {name}",
                )
            )
        if "word" in config.schedules:
            outputs.append(
                word_handoff_schedule(
                    senior.backend,
                    run.rows,
                    config.sampling,
                    rule,
                    max_new_tokens=config.max_new_tokens,
                    seed=derive_seed(config.seed, "word", senior.path),
                    desc=f"tandem {rule.granularity} p={rule.junior_probability:g} {name}",
                )
            )
        for s in config.step_grid if "steps" in config.schedules else []:
            for first, lead, other in (("senior", senior, junior), ("junior", junior, senior)):
                outputs.append(
                    step_schedule(
                        run.rows,
                        lead.solo,
                        s,
                        first=first,
                        continuation=other.backend,
                        tokenizer=tokenizer,
                        sampling=config.sampling,
                        max_new_tokens=config.max_new_tokens,
                        seed=derive_seed(config.seed, senior.path),
                        desc=f"{first}_first_s{s} {name}",
                    )
                )
        handoff = results["checkpoints"][name]["handoff"] = {}
        for out in outputs:
            correct = run.score(out.completion_ids)
            handoff[out.name] = (
                run.capability(correct)
                | _authorship_shares(run, out)
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


def _authorship_shares(run: _Run, out: ScheduleOutput) -> dict:
    """Who wrote a schedule's completions, with intervals over problems: ``senior_share`` (per problem, the senior's
    share of its tokens, problems without any token left out; then the mean over problems) and ``handed_over_share``
    (per problem, the share of its rows that changed hands: the schedule's own ``handed_over`` where it has one,
    else both models wrote in the row); ``None`` where no problem has a value."""
    c = run.config
    rows_handed = out.handed_over or [0 in a and 1 in a for a in out.authorship]
    per_problem_share, per_problem_handed = [], []
    for rows, handed in zip(_by_problem(out.authorship, c.k), _by_problem(rows_handed, c.k), strict=True):
        tokens = sum(len(a) for a in rows)
        if tokens:
            per_problem_share.append(sum(sum(a) for a in rows) / tokens)
        per_problem_handed.append(sum(map(bool, handed)) / len(handed))

    def estimate(values: list[float]) -> dict | None:
        return bootstrap_mean(values, c.confidence, seed=c.seed).to_dict() if values else None

    return {"senior_share": estimate(per_problem_share), "handed_over_share": estimate(per_problem_handed)}


def _measure_drift(run: _Run, results: dict) -> None:
    """Measurement 3, drift: KL(model || base) of the solo completions' marginal token distributions, whole and
    split by completion position, and (with a GRPO checkpoint) the drift reversal of each checkpoint."""
    config = run.config
    vocab = int(run.junior.model.get_output_embeddings().weight.shape[0])
    base = run.models[run.base_key]
    grpo = run.models[run.grpo_key] if run.grpo_key else None
    base_counts = token_counts(base.solo, vocab)
    grpo_counts = token_counts(grpo.solo, vocab) if grpo else None

    def drift(m: _Model, counts: torch.Tensor) -> dict:
        return {
            "kl_to_base_nats": marginal_kl(counts, base_counts, config.kl_smoothing),
            "num_tokens": int(counts.sum()),
            "by_position": marginal_kl_by_position(
                m.solo, base.solo, vocab, prefix_tokens=config.drift_prefix_tokens, smoothing=config.kl_smoothing
            ),
        }

    results["base"] = {"path": config.base or config.junior, "num_tokens": int(base_counts.sum())}
    if grpo:
        results["grpo"] = {
            "path": config.grpo_checkpoint,
            "solo": run.solo_block(grpo),
            "drift": drift(grpo, grpo_counts),
        }
    for name, m in run.seniors():
        counts = token_counts(m.solo, vocab)
        entry = results["checkpoints"][name]
        entry["drift"] = drift(m, counts) | {
            "smoothing": config.kl_smoothing,
            "definition": "KL(checkpoint || base) of smoothed marginal completion-token distributions, nats",
        }
        # The estimators with nulls and paired intervals (evaluation.drift): drift needs 2 samples per problem,
        # moved-back 4. The smoothed whole-vocabulary figures above stay for comparison with earlier results.
        if config.k >= 2:
            entry["drift_with_null"] = drift_with_null(
                _by_problem(m.solo, config.k), _by_problem(base.solo, config.k),
                prefix_tokens=config.drift_prefix_tokens, confidence=config.confidence, seed=config.seed,
            )  # fmt: skip
        if grpo and m is not grpo and config.k >= 4:
            entry["moved_back"] = moved_back(
                _by_problem(base.solo, config.k), _by_problem(grpo.solo, config.k), _by_problem(m.solo, config.k),
                vocab, top_n=config.drift_top_n, confidence=config.confidence, seed=config.seed,
            ) | {"grpo_checkpoint": config.grpo_checkpoint}  # fmt: skip
        if grpo and m is not grpo:
            entry["drift_reversal"] = drift_reversal(
                base_counts, grpo_counts, counts, top_n=config.drift_top_n, smoothing=config.kl_smoothing
            ) | {"grpo_checkpoint": config.grpo_checkpoint}


def _measure_legibility(run: _Run, results: dict) -> None:
    """Measurement 4, legibility: the junior's cross-entropy on each checkpoint's solo completions and the two
    models' overlap (each distinct model scored once), and the junior on its own completions as the reference.

    The figures are averaged as the paper's authors do (per chain of thought without EOS, then over chains of
    thought; [`legibility`][tandem_grpo.evaluation.metrics.legibility]); each comes with an interval over problems
    and an even/odd-samples null ([`cot_mean`][tandem_grpo.evaluation.legibility_intervals.cot_mean]), and each
    checkpoint's cross-entropy with its paired difference from the junior's on its own samples
    ([`paired_difference`][tandem_grpo.evaluation.legibility_intervals.paired_difference])."""
    config, junior = run.config, run.junior
    pad_id, eos_ids = junior.backend.pad_token_id, junior.backend.eos_token_ids
    stats = {"confidence": config.confidence, "seed": config.seed}
    done: dict[str, dict] = {}

    def score(key: str, senior, desc: str) -> dict:
        if key not in done:
            with run.progress(desc) as bar:
                solo = run.models[key].solo
                done[key] = legibility(senior, junior.model, run.rows, solo, pad_id, config.score_batch_size, bar,
                                       eos_token_ids=eos_ids)  # fmt: skip
        return done[key]

    def per_problem(out: dict, metric: str) -> list[list] | None:
        values = out["per_completion"][metric]
        return None if values is None else _by_problem(values, config.k)

    def block(out: dict) -> dict:
        entry = dict(out)
        names = run.benchmark_names()
        by_benchmark: dict[str, dict] = {b: {} for b in names}
        for metric in ("junior_cross_entropy", "overlap"):
            grouped = per_problem(out, metric)
            # Over every CoT of the run: with several benchmarks a pooled figure, so each benchmark also gets its own.
            entry[f"{metric}_with_null"] = None if grouped is None else cot_mean(grouped, **stats)
            means = dict.fromkeys(names) if grouped is None else benchmark_means(grouped, run.benchmarks)
            for b in names:
                by_benchmark[b][metric] = means[b]
                if grouped is not None and len(names) > 1:
                    rows = [g for g, name in zip(grouped, run.benchmarks, strict=True) if name == b]
                    by_benchmark[b][f"{metric}_with_null"] = cot_mean(rows, **stats)
        entry["with_null_pooled_over_benchmarks"] = len(names) > 1
        # The authors' headline: each benchmark's mean over its CoTs, then the plain mean over benchmarks (with one
        # benchmark, its figure).
        entry["by_benchmark"] = by_benchmark
        entry["macro"] = {
            m: macro_average({b: v[m] for b, v in by_benchmark.items()}) for m in ("junior_cross_entropy", "overlap")
        } | {"benchmarks": names}
        for metric in ("junior_cross_entropy", "overlap"):
            grouped = per_problem(out, metric)
            # The headline's interval and null: problems resampled within each benchmark.
            entry["macro"][f"{metric}_with_null"] = (
                None if grouped is None else macro_mean(grouped, run.benchmarks, **stats)
            )
        return entry

    outputs = {name: score(m.resolved, m.model, f"legibility {name}") for name, m in run.seniors()}
    for name, m in run.seniors():  # per completion in samples.jsonl: a later report can pair them across runs
        _attach(run.records, m.path, outputs[name]["per_completion"])
    if run.junior.solo is None:  # the junior's own reference lives in another run (EvaluationConfig.junior_solo)
        for name, out in outputs.items():
            results["checkpoints"][name]["legibility"] = block(out)
        return
    own = score(run.junior_key, None, "legibility junior (self)")
    _attach(run.records, run.junior.path, own["per_completion"])
    own_ce = per_problem(own, "junior_cross_entropy")
    for name, out in outputs.items():
        entry = results["checkpoints"][name]["legibility"] = block(out)
        # How much harder (> 0) the junior finds the checkpoint's text than its own, problems resampled together.
        entry["minus_junior_self"] = {
            "junior_cross_entropy": paired_difference(per_problem(out, "junior_cross_entropy"), own_ce, **stats)
        }
    own_block = block(own)
    # The junior scored on its own samples has no senior: no overlap (when the junior is also a checkpoint, its
    # cached score carries the overlap of the model with itself, 1).
    results["junior"]["legibility_self"] = own_block


def _authorship_views(run: _Run, schedule_outputs: dict[str, list[ScheduleOutput]]) -> list[SampleView]:
    """The samples of ``samples.html``: per checkpoint, the first schedule's first problems (the alternating
    protocol by default), then two problems of each of the next two schedules."""
    from ..authorship import authorship_spans

    config = run.config
    by_row = {(r["checkpoint"], r["schedule"], r["problem"], r["sample"]): r for r in run.records}
    n_show = min(config.num_html_samples, len(run.prompts))
    views = []
    for name, outputs in schedule_outputs.items():
        picks = [(outputs[0], n_show)] + [(o, min(2, n_show)) for o in outputs[1:3]]
        for out, count in picks:
            for problem in range(count):
                row = problem * config.k
                views.append(
                    SampleView(
                        checkpoint=name,
                        schedule=out.name,
                        problem=run.prompts[problem][-1]["content"],
                        gold=run.golds[problem],
                        correct=by_row[(name, out.name, problem, 0)]["correct"],
                        spans=authorship_spans(out.completion_ids[row], out.authorship[row], run.tokenizer),
                    )
                )
    return views


def _attach(records: list[dict], checkpoint: str, per_completion: dict) -> None:
    """Write each solo completion's legibility values (``per_completion``, aligned with the rows) into its record."""
    solo = [r for r in records if r["schedule"] == "solo" and r["checkpoint"] == checkpoint]
    for metric in ("junior_cross_entropy", "overlap"):
        values = per_completion.get(metric)
        if values is not None:
            for record, value in zip(solo, values, strict=True):
                record[metric] = value


def _mean_len(completions: list[list[int]]) -> float:
    return sum(len(c) for c in completions) / len(completions) if completions else float("nan")


def _records(checkpoint, schedule, completions, authorship, correct, tokenizer, k, benchmarks) -> list[dict]:
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return [
        {
            "checkpoint": checkpoint,
            "schedule": schedule,
            "benchmark": benchmarks[i // k],
            "problem": i // k,
            "sample": i % k,
            "correct": bool(ok),
            "num_tokens": len(ids),
            "senior_tokens": int(sum(a)),
            "text": text,
            "ids": [int(t) for t in ids],
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
