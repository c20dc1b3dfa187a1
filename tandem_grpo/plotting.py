"""PNG curves of a training run, read from a Trainer's ``state.log_history``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

CURVES = (
    ("reward", "team reward (mean)"),
    ("rewards/accuracy_reward/mean", "accuracy reward"),
    ("rewards/format_reward/mean", "format reward"),
    ("tandem/senior_token_fraction", "senior token fraction"),
    ("tandem/handoffs_per_completion", "handoffs per completion"),
    ("loss", "loss"),
    ("kl", "KL to reference"),
)


COLUMNS = 3
"""Panels per row of the grid: 3.2 x 2.8 inches each at 120 dpi, so six curves make a 1152 x 672 PNG (two rows)."""

UNWEIGHTED_NOTE = "weight 0: logged,\nnot in the training reward"
"""Written across the panel of a reward whose ``reward_weights`` entry is 0 (its curve is often a flat 0)."""


def plot_training_curves(
    log_history: list[dict], path: str | Path, reward_weights: Mapping[str, float] | None = None
) -> Path | None:
    """Write one panel per logged curve of [`CURVES`][tandem_grpo.plotting.CURVES] (x axis: optimizer step, integer
    ticks) to ``path``, as a grid of up to [`COLUMNS`][tandem_grpo.plotting.COLUMNS] panels per row; ``None`` if no
    curve was logged.

    Args:
        log_history: a Trainer's ``state.log_history``.
        path: the PNG to write (its folder is created).
        reward_weights: reward function name to its weight in the training reward, e.g.
            ``dict(zip(trainer.reward_func_names, trainer.reward_weights.tolist()))``; the panel of a reward weighted
            0 says so ([`UNWEIGHTED_NOTE`][tandem_grpo.plotting.UNWEIGHTED_NOTE]). Default: none marked.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = _figure(log_history, reward_weights or {})
    if fig is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _figure(log_history: list[dict], reward_weights: Mapping[str, float]):
    """The grid of panels as a matplotlib figure, or ``None`` if no curve of ``CURVES`` was logged."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    present = [(key, title) for key, title in CURVES if any(key in h for h in log_history)]
    if not present:
        return None
    # One long row of six or seven panels (2304 px wide) reads badly; a grid keeps each panel's aspect.
    columns = min(COLUMNS, len(present))
    rows = -(-len(present) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(present) :]:
        ax.set_visible(False)  # the empty cells of the last row
    for ax, (key, title) in zip(axes.flat, present, strict=False):
        points = [(h["step"], h[key]) for h in log_history if h.get(key) is not None and "step" in h]
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a 2-step run: 1 and 2, not 1.0, 1.2, ...
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        name = key.split("/")[1] if key.startswith("rewards/") else None
        if name is not None and reward_weights.get(name) == 0:
            ax.text(0.5, 0.5, UNWEIGHTED_NOTE, transform=ax.transAxes, ha="center", va="center", fontsize=8,
                    color="0.35", bbox={"facecolor": "white", "edgecolor": "0.7", "alpha": 0.9})  # fmt: skip
    fig.tight_layout()
    return fig
