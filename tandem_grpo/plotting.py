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


def plot_training_curves(log_history: list[dict], path: str | Path) -> Path | None:
    """Write one panel per logged curve of [`CURVES`][tandem_grpo.plotting.CURVES] (x axis: optimizer step) to
    ``path``; ``None`` if empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [(key, title) for key, title in CURVES if any(key in h for h in log_history)]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(3.2 * len(present), 2.8), squeeze=False)
    for ax, (key, title) in zip(axes[0], present, strict=True):
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
