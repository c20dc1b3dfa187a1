"""Evaluation suite of Tandem RL (arXiv 2606.28166, section 5), as a library
([`evaluate`][tandem_grpo.evaluation.runner.evaluate]) and the ``tandem-grpo evaluate`` command
([`cli.main`][tandem_grpo.evaluation.cli.main]).

One module per measurement, each with its estimator, interval and null: [`solo`][tandem_grpo.evaluation.solo],
[`support`][tandem_grpo.evaluation.support],
[`schedules`][tandem_grpo.evaluation.schedules] (handoff robustness), [`drift`][tandem_grpo.evaluation.drift],
[`junior_legibility`][tandem_grpo.evaluation.junior_legibility] and [`hacks`][tandem_grpo.evaluation.hacks]; shared
statistics in [`stats`][tandem_grpo.evaluation.stats], and [`runner`][tandem_grpo.evaluation.runner] orchestrates.
"""

from ..backends import GenerationBackend, TransformersBackend, create_backend
from .config import EvaluationConfig, EvaluationError
from .junior_legibility import legibility
from .runner import evaluate
from .schedules import ScheduleOutput, alternating_schedule, step_schedule, training_rule_schedule
from .solo import capability, pass_at_k_curve
from .stats import bootstrap_mean, pass_at_k
from .steps import handover_region, prefix_end, split_steps, step_spans

__all__ = ["EvaluationConfig", "EvaluationError", "GenerationBackend", "ScheduleOutput", "TransformersBackend",
           "alternating_schedule", "bootstrap_mean", "capability", "create_backend", "evaluate", "handover_region",
           "legibility", "pass_at_k", "pass_at_k_curve", "prefix_end", "split_steps", "step_schedule", "step_spans",
           "training_rule_schedule"]  # fmt: skip
