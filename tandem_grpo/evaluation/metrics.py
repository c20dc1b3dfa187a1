"""Deprecated: the names of this module moved, and it goes in the next release.

Shared statistics (``pass_at_k``, ``bootstrap_mean``, ``Estimate``, ...) are in
[`stats`][tandem_grpo.evaluation.stats], solo capability (``capability``, ``pass_at_k_curve``, ...) in
[`solo`][tandem_grpo.evaluation.solo], legibility (``legibility``, ``token_cross_entropy``, ...) in
[`junior_legibility`][tandem_grpo.evaluation.junior_legibility]. The smoothed whole-vocabulary drift
(``marginal_kl``, ``marginal_kl_by_position``, ``drift_reversal``, ``smoothed_distribution``, ``token_counts``,
``kl_divergence``) and the pooled legibility sums (``masked_token_cross_entropy``, ``masked_overlap``) were
removed; [`drift`][tandem_grpo.evaluation.drift] and the per-CoT legibility replace them.
"""

from .._compat import moved_names

__all__: list[str] = []

_STATS = "tandem_grpo.evaluation.stats"
_SOLO = "tandem_grpo.evaluation.solo"
_LEGIBILITY = "tandem_grpo.evaluation.junior_legibility"
__getattr__ = moved_names(
    __name__,
    {
        "Estimate": _STATS,
        "bootstrap_mean": _STATS,
        "pass_at_k": _STATS,
        "macro_bootstrap_mean": _STATS,
        "per_problem_pass_at_k": _STATS,
        "DEFAULT_CURVE_MAX_K": _SOLO,
        "capability": _SOLO,
        "capability_by_benchmark": _SOLO,
        "pass_at_k_curve": _SOLO,
        "per_problem_accuracy": _SOLO,
        "legibility": _LEGIBILITY,
        "token_cross_entropy": _LEGIBILITY,
        "token_overlap": _LEGIBILITY,
        "pad_batch": _LEGIBILITY,
        "completion_logits": _LEGIBILITY,
        "DEFAULT_DRIFT_PREFIX_TOKENS": "tandem_grpo.evaluation.drift",
    },
)
