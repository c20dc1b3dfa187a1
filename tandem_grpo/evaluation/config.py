"""[`EvaluationConfig`][tandem_grpo.evaluation.config.EvaluationConfig]: the settings of one
[`evaluate`][tandem_grpo.evaluation.runner.evaluate] run (the ``tandem-grpo evaluate`` flags), their presets and
their validation."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from ..backends import BACKENDS, check_backend_name
from ..data import INSTRUCTIONS, ROW_FORMAT_HELP
from ..handoff import HandoffRule
from ..sampling import SAMPLING_FIELDS, SamplingSettings
from .drift import DEFAULT_DRIFT_PREFIX_TOKENS
from .schedules import MAX_ROUNDS
from .solo import DEFAULT_CURVE_MAX_K

MEASUREMENTS = ("handoff", "drift", "legibility")
SCHEDULES = ("alternating", "word", "steps")
"""The handoff schedules of ``--schedules``: the paper's protocol
([`alternating_schedule`][tandem_grpo.evaluation.schedules.alternating_schedule]), the training rule
([`training_rule_schedule`][tandem_grpo.evaluation.schedules.training_rule_schedule]) and the step grid
([`step_schedule`][tandem_grpo.evaluation.schedules.step_schedule])."""
_DTYPE_NAMES = ("float32", "bfloat16", "float16")

PAPER_DECODING: dict[str, float | int] = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
"""The paper authors' evaluation decoding (CSSLab/Tandem-RLVR ``eval/config.py``): the default sampling of every
evaluation, and of ``--preset paper``."""

PRESETS: dict[str, dict[str, float | int]] = {
    "paper": {
        **PAPER_DECODING,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "k": 8,
        "max_new_tokens": 3000,
        "max_rounds": 150,
    },
}
"""The presets of ``--preset``: name to the fields they set (sampling fields by their
[`SamplingSettings`][tandem_grpo.sampling.SamplingSettings] names, the rest by their
[`EvaluationConfig`][tandem_grpo.evaluation.config.EvaluationConfig] names), each sourced in ``PRESET_SOURCES``.

``paper`` leaves min-p and repetition penalty at vLLM's off values, as the authors do. Not adopted, having no field
here: their 4096-token engine context (``eval/common.py`` ``response_budget``), their vLLM seeds,
``enable_thinking=False`` and their default benchmarks (``--dataset`` stays the user's choice)."""

PRESET_SOURCES = {
    "paper": "CSSLab/Tandem-RLVR eval/config.py (TEMPERATURE, TOP_P, TOP_K, MAX_TOKENS), eval/solo.py and "
    "eval/handoff.py (--n 8, MAX_ROUNDS 150)",
}


class EvaluationError(ValueError):
    """A problem with the evaluation's inputs; the message names the argument, the value and the fix."""


ANSWER_READERS = ("final", "stated")
"""How the evaluation reads a completion's answer (``--answer``): as ``accuracy_reward`` does (``final``) or as
``stated_accuracy_reward`` does (``stated``)."""


def _arg(default=dataclasses.MISSING, help: str = "", **kwargs):  # noqa: A002 - argparse's name
    """A dataclass field whose ``help`` metadata is what ``tandem-grpo evaluate --help`` prints for it."""
    if isinstance(default, (list, tuple)):
        value = list(default)
        return field(default_factory=lambda: list(value), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass
class EvaluationConfig:
    """Everything an evaluation run depends on (all of it is written to ``results.json``).

    Each field is one ``tandem-grpo evaluate`` flag of the same name, documented by its ``help`` metadata (which
    ``--help`` prints with the default). Defaults are the paper's where it has one: ``sampling`` is its evaluation
    decoding ([`PAPER_DECODING`][tandem_grpo.evaluation.config.PAPER_DECODING]: temperature 0.7, top-p 0.8, top-k 20,
    not ``SamplingSettings()``'s plain sampling at temperature 1). ``sampling`` and ``handoff`` are the
    [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings] and
    [`HandoffRule`][tandem_grpo.handoff.HandoffRule] training uses (flags ``--temperature`` ...,
    ``--junior_probability``, ``--handoff_mode``, ``--handoff_granularity``, ``--max_gap_tokens``).

    Attributes:
        dataset: one source (a string) or several (a list), each a benchmark of its own in ``by_benchmark`` and the
            ``macro`` average; [`datasets`][tandem_grpo.evaluation.config.EvaluationConfig.datasets] gives the list.
        limit: the first ``limit`` problems of each dataset (the authors truncate the concatenation,
            ``eval/common.py`` ``load_problems``; here every benchmark keeps problems).
        preset: ``None`` or a name of [`PRESETS`][tandem_grpo.evaluation.config.PRESETS], applied by
            [`apply_preset`][tandem_grpo.evaluation.config.EvaluationConfig.apply_preset].

    Invalid values raise [`EvaluationError`][tandem_grpo.evaluation.config.EvaluationError] from
    [`validate`][tandem_grpo.evaluation.config.EvaluationConfig.validate], which
    [`evaluate`][tandem_grpo.evaluation.runner.evaluate] calls first, not from the constructor.
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
                                    f"benchmarks). Files: {ROW_FORMAT_HELP}.", metavar="PATH_OR_NAME")  # fmt: skip
    split: str = _arg("test", "Dataset split.")
    instruction: str = _arg("step_by_step", "What each question asks for: step_by_step, one_line, steps or "
                            "answer_line (use the one the checkpoints were trained with; "
                            "tandem_grpo.data.INSTRUCTIONS).")  # fmt: skip
    answer: str = _arg("final", "How a completion's answer is read: final (its last \\boxed{}, else its last "
                       "number: accuracy_reward's reader) or stated (only a \\boxed{} or an 'Answer:' line: "
                       "stated_accuracy_reward's). Use the training reward's.",
                       choices=list(ANSWER_READERS))  # fmt: skip
    limit: int | None = _arg(None, "Evaluate the first N problems of each dataset (default: all of the split).")
    k: int = _arg(4, "Completions sampled per problem (n of the pass@k estimator).")
    pass_at: list[int] | None = _arg(None, "k values of pass@k, each <= --k (default: 1, 2, 4, ... and --k).")
    pass_at_k_curve_max: int = _arg(DEFAULT_CURVE_MAX_K, "Largest k of the pass@k curve (every k from 1 to "
                                    "min(this, --k)); raise --k to reach it.")  # fmt: skip
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(**PAPER_DECODING))
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
        """Set the fields of ``preset`` ([`PRESETS`][tandem_grpo.evaluation.config.PRESETS]) that were not given;
        [`validate`][tandem_grpo.evaluation.config.EvaluationConfig.validate] calls it first.

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
            return getattr(self.sampling, name) if name in SAMPLING_FIELDS else getattr(self, name)

        if given is None:
            defaults = dataclasses.asdict(SamplingSettings(**PAPER_DECODING))  # the default sampling
            defaults |= {f.name: f.default for f in dataclasses.fields(self) if f.name in values}
            given = {name for name in values if current(name) != defaults[name]}
        applied = {name: value for name, value in values.items() if name not in given}
        kept = {name: current(name) for name in values if name in given}
        sampling = {name: value for name, value in applied.items() if name in SAMPLING_FIELDS}
        if sampling:
            self.sampling = dataclasses.replace(self.sampling, **sampling)
        for name, value in applied.items():
            if name not in SAMPLING_FIELDS:
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
        [`EvaluationError`][tandem_grpo.evaluation.config.EvaluationError] naming it."""
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
        if self.answer not in ANSWER_READERS:
            raise EvaluationError(f"--answer {self.answer!r}: choose one of {', '.join(ANSWER_READERS)}.")
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
