"""training_curves.png: one panel per logged curve, laid out as a grid (not one long row)."""

from __future__ import annotations

import struct

import pytest

from tandem_grpo.plotting import COLUMNS, CURVES, plot_training_curves

pytest.importorskip("matplotlib")


def _png_size(path) -> tuple[int, int]:
    # A PNG starts with an 8-byte signature, then the IHDR chunk: length, type, width, height (big-endian).
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def _history(keys, steps: int = 3) -> list[dict]:
    return [{"step": s, **{k: 0.1 * s for k in keys}} for s in range(1, steps + 1)]


@pytest.mark.parametrize(
    ("curves", "size"),
    [
        (6, (3 * 384, 2 * 336)),  # the main job's six curves: two rows of three
        (len(CURVES), (3 * 384, 3 * 336)),  # with beta > 0 the KL panel makes a third row
        (2, (2 * 384, 336)),  # fewer than a row: no empty columns
    ],
)
def test_curves_are_a_grid_of_at_most_three_columns(tmp_path, curves, size):
    assert COLUMNS == 3
    keys = [key for key, _ in CURVES[:curves]]
    path = plot_training_curves(_history(keys), tmp_path / "sub" / "training_curves.png")
    assert path == tmp_path / "sub" / "training_curves.png"
    assert _png_size(path) == size, "3.2 x 2.8 inch panels at 120 dpi"


def test_nothing_logged_writes_nothing(tmp_path):
    assert plot_training_curves([{"step": 1, "train_runtime": 3.0}], tmp_path / "c.png") is None
    assert not (tmp_path / "c.png").exists()


def _panels(log_history, reward_weights=None) -> dict:
    from tandem_grpo.plotting import _figure

    fig = _figure(log_history, reward_weights or {})
    fig.canvas.draw()
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def test_a_short_run_gets_integer_step_ticks():
    panels = _panels(_history([key for key, _ in CURVES[:6]], steps=2))
    for title, ax in panels.items():
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks and all(float(t).is_integer() for t in ticks), (title, ticks)


def test_the_panel_of_a_reward_weighted_0_says_so():
    from tandem_grpo.plotting import UNWEIGHTED_NOTE

    keys = ["reward", "rewards/accuracy_reward/mean", "rewards/format_reward/mean"]
    panels = _panels(_history(keys), {"accuracy_reward": 1.0, "format_reward": 0.0})
    texts = {title: [t.get_text() for t in ax.texts] for title, ax in panels.items()}
    assert texts == {"team reward (mean)": [], "accuracy reward": [], "format reward": [UNWEIGHTED_NOTE]}
    assert not _panels(_history(keys))["format reward"].texts  # weights not given: nothing is claimed
