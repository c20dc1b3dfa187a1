"""The report reads results.json of every version: the smoothed drift and pooled legibility of earlier results (no
longer produced) and the drift with its null and the moved-back share of current ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tandem_grpo.evaluation.report import plot_drift, plot_legibility, write_report

FIXTURE = Path(__file__).parent / "fixtures" / "study" / "seed-1" / "tandem" / "results.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _interval(value: float) -> dict:
    return {"value": value, "ci_low": value - 0.01, "ci_high": value + 0.01, "confidence": 0.95, "ci_method": "",
            "num_problems": 3}  # fmt: skip


def _drift_with_null(value: float) -> dict:
    part = {"kl_nats": _interval(value), "null_kl_nats": _interval(0.01), "excess_nats": _interval(value - 0.01)}
    return part | {"num_tokens": 10, "by_position": {"prefix_tokens": 8, "first": part, "rest": part}}


@pytest.fixture
def results() -> dict:
    return json.loads(FIXTURE.read_text())


def test_earlier_results_with_the_smoothed_drift_and_pooled_legibility_still_plot(results, tmp_path):
    old = copy.deepcopy(results)
    entry = next(iter(old["checkpoints"].values()))
    assert "junior_cross_entropy_pooled" in entry["legibility"]  # the fixture was written with the pooled figures
    part = {"kl_to_base_nats": 0.2, "num_tokens": 5, "base_num_tokens": 5}
    entry["drift"] = {"kl_to_base_nats": 0.3, "num_tokens": 10, "by_position": {"prefix_tokens": 8, "first": part,
                                                                                  "rest": part}}  # fmt: skip
    entry["drift_reversal"] = {"top_n": 2, "fraction_moved_back": 0.5, "num_moved_back": 1, "token_ids": [3, 4],
                               "grpo_shift": [0.4, -0.2], "tandem_shift": [0.1, -0.3]}  # fmt: skip
    old["grpo"] = {"path": "grpo", "drift": {"kl_to_base_nats": 0.4, "num_tokens": 10}}
    for plot in (plot_drift, plot_legibility):
        assert plot(old, tmp_path / f"{plot.__name__}.png").read_bytes()[:8] == PNG_MAGIC
    paths = write_report(old, tmp_path / "report", [])
    assert json.loads(Path(paths["results"]).read_text())["checkpoints"]


def test_current_results_plot_the_drift_with_its_null_and_the_moved_back_share(results, tmp_path):
    entry = next(iter(results["checkpoints"].values()))
    entry["drift_with_null"] = _drift_with_null(0.3)
    entry["moved_back"] = {"fraction_moved_back": _interval(0.7), "null_fraction": _interval(0.5),
                           "excess": _interval(0.2), "num_selected": 20}  # fmt: skip
    results["grpo"] = {"path": "grpo", "drift_with_null": _drift_with_null(0.5)}
    assert plot_drift(results, tmp_path / "drift.png").read_bytes()[:8] == PNG_MAGIC
