"""Deprecated: merged into [`junior_legibility`][tandem_grpo.evaluation.junior_legibility]; this module goes in the
next release."""

from .._compat import moved_names

__getattr__ = moved_names(
    __name__,
    {
        name: "tandem_grpo.evaluation.junior_legibility"
        for name in ("Grouped", "cot_mean", "paired_difference", "benchmark_means", "macro_average", "macro_mean")
    },
)
