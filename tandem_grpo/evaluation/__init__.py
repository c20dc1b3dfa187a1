"""Evaluation suite of Tandem RL (arXiv 2606.28166, section 5): solo capability, handoff robustness, distribution
drift and legibility to the junior, as a library and the ``tandem-grpo evaluate`` command.

The library entry point is [`evaluate`][tandem_grpo.evaluation.runner.evaluate]; the command is
[`tandem_grpo.evaluation.cli.main`][tandem_grpo.evaluation.cli.main].

Modules: [`metrics`][tandem_grpo.evaluation.metrics] (pass@k and its curve, bootstrap intervals, KL whole and
by position, drift reversal, cross-entropy, overlap), [`steps`][tandem_grpo.evaluation.steps] (reasoning-step
splitting), [`schedules`][tandem_grpo.evaluation.schedules] (handoff schedules, the paper's protocol first),
[`backends`][tandem_grpo.evaluation.backends] (solo generation), [`report`][tandem_grpo.evaluation.report]
(results.json, plots, HTML) and [`runner`][tandem_grpo.evaluation.runner] (the orchestration).
"""

from .backends import GenerationBackend, TransformersBackend, create_backend
from .metrics import (
    bootstrap_mean,
    capability,
    drift_reversal,
    legibility,
    marginal_kl,
    marginal_kl_by_position,
    pass_at_k,
    pass_at_k_curve,
    smoothed_distribution,
    token_counts,
)
from .runner import EvaluationConfig, EvaluationError, evaluate
from .schedules import ScheduleOutput, alternating_schedule, step_schedule, word_handoff_schedule
from .steps import handover_region, prefix_end, split_steps, step_spans

__all__ = [
    "EvaluationConfig",
    "EvaluationError",
    "GenerationBackend",
    "ScheduleOutput",
    "TransformersBackend",
    "alternating_schedule",
    "bootstrap_mean",
    "capability",
    "create_backend",
    "drift_reversal",
    "evaluate",
    "handover_region",
    "legibility",
    "marginal_kl",
    "marginal_kl_by_position",
    "pass_at_k",
    "pass_at_k_curve",
    "prefix_end",
    "smoothed_distribution",
    "split_steps",
    "step_schedule",
    "step_spans",
    "token_counts",
    "word_handoff_schedule",
]
