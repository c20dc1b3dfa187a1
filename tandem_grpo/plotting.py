"""PNG curves of a training run, read from a Trainer's ``state.log_history``."""

from __future__ import annotations

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


def plot_training_curves(log_history: list[dict], path: str | Path) -> Path | None:
    """Write one panel per logged curve of [`CURVES`][tandem_grpo.plotting.CURVES] (x axis: optimizer step) to
    ``path``, as a grid of up to [`COLUMNS`][tandem_grpo.plotting.COLUMNS] panels per row; ``None`` if no curve
    was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
