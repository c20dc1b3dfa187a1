"""examples/reproduce_paper.py and its library, tandem_grpo.evaluation.compare: the comparison table and report from
made-up evaluation results, the dry runs of both presets (the arms' configs differ exactly where the comparison says),
its usage errors, and one tiny end-to-end study (three arms, evaluation, report, resumed run)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED_DATA, child_env, save_tiny_llamas

from tandem_grpo.evaluation import compare
from tandem_grpo.evaluation.compare import ARMS

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
        assert (config.temperature, config.top_p, config.top_k) == (1.0, 1.0, 0)
    # One training set for every arm and seed; every seed's evaluation sees the same problems.
    assert len({c.dataset for c in plan.evaluation.values()}) == 1


def _solo(correct: list[int], n: int = 2) -> dict:
    return {"num_samples": n, "correct_per_problem": correct, "pass_at_k_curve": {"k": [1, n]}}


def _evaluation(shift: int = 0) -> dict:
    """Made-up evaluation results of three problems, k = 2: the blocks the comparison reads."""
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


def test_comparison_rows_and_table_from_evaluation_results():
    paths = {arm: f"ckpt/{arm}" for arm in ARMS}
    rows = compare.comparison_rows(_evaluation(), paths)
    assert [r["claim"] for r in rows] == ["solo capability"] * 3 + ["handoff robustness"] * 2 + ["drift"] * 4 + [
        "legibility"
    ] * 2 + ["pass@k curve"] * 2
    accuracy = next(r for r in rows if r["metric"] == "mean accuracy")
    assert accuracy["kind"] == "per_problem" and accuracy["arms"]["base"] == [0.0, 0.5, 1.0]
    assert accuracy["arms"]["tandem"] == [0.5, 0.5, 0.0]
    table = compare.comparison_table([rows], 0.95, seed=0)
    row = next(r for r in table if r["metric"] == "mean accuracy")
    assert row["arms"]["tandem"]["value"] == pytest.approx(1 / 3)
    assert row["differences"]["tandem - grpo"]["paired"] is True
    assert row["differences"]["tandem - grpo"]["value"] == pytest.approx(1 / 6)
    drift = next(r for r in table if r["metric"] == "KL(model || base), nats")
    assert drift["arms"]["base"] == {"value": 0.0, "ci_low": None, "ci_high": None}
    assert drift["differences"]["kl_to_junior - grpo"]["value"] == pytest.approx(0.2)
    moved = next(r for r in table if r["metric"].startswith("share of GRPO"))
    assert moved["arms"]["grpo"] is None and moved["differences"]["tandem - grpo"] is None
    # Pooled over two seeds: per-problem values averaged before the bootstrap, scalars averaged with their range.
    pooled = compare.comparison_table([rows, compare.comparison_rows(_evaluation(shift=1), paths)], 0.95, seed=0)
    accuracy = next(r for r in pooled if r["metric"] == "mean accuracy")
    assert accuracy["arms"]["grpo"]["value"] == pytest.approx((0.25 + 0.5 + 0.0) / 3)
    assert next(r for r in pooled if r["metric"] == "KL(model || base), nats")["seed_range"]["grpo"] == [0.1, 0.1]

    header, cells = compare.table_rows(table)
    assert header[2:6] == ["base", "GRPO", "tandem", "KL-to-junior"] and len(cells) == len(table)
    markdown = compare.markdown_table(table)
    assert markdown.count("\n") == len(table) + 1 and "KL(model \\|\\| base)" in markdown
    assert compare.html_table(table).count("<tr>") == len(table) + 1


def test_training_summary_splits_the_kl_term_from_the_policy_loss():
    history = [{"loss": 1.0, "kl": 2.0, "reward": 0.5}, {"loss": 3.0, "kl": 4.0, "reward": None}, {"train_runtime": 9}]
    summary = compare.training_summary(history, beta=0.5)
    assert summary["logged_steps"] == 2 and summary["mean_kl_term"] == pytest.approx(1.5)
    assert summary["mean_policy_loss"] == pytest.approx(0.5) and summary["mean_reward"] == 0.5
    assert summary["mean_senior_token_fraction"] is None and summary["train_runtime_seconds"] == 9
    with pytest.raises(ValueError, match="unknown arm 'ppo'"):
        compare.arm_config(None, "ppo", 1, Path("out"), 0.04)


def test_dry_run_cpu_small(study, tmp_path, capsys, no_model_loading):
    out = tmp_path / "study"
    study.main(["--preset", "cpu-small", "--dry_run", "--seeds", "1", "2", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    assert "Preset cpu-small" in printed and "Estimated time:" in printed
    assert printed.count("(to train)") == 6
    assert not out.exists(), "a dry run writes nothing"
    plan = study.build_plan(
        *study.parse_args(["--preset", "cpu-small", "--output_dir", str(out), "--seeds", "1", "2"])
    )
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
    assert {c.instruction for c in plan.evaluation.values()} == {"one_line"}
    assert plan.shared.max_steps * study.prompts_per_step(plan.shared) == len(plan.train_dataset)


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
    assert plan.evaluation[1].dataset == "gsm8k" and plan.evaluation[1].k == 8


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--kl_beta", "0"], "--kl_beta"),
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
        (["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag 1"),
    ],
)
def test_bad_flags_give_one_error_line(study, argv, expected, capsys, no_model_loading):
    with pytest.raises(SystemExit) as exit_info:
        study.main([*argv, "--dry_run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reproduce_paper.py: error:") and expected in err[0]


def test_eval_dataset_replaces_the_held_out_problems(study, no_model_loading, tmp_path):
    """With the built-in training set, --eval_dataset is what every seed's evaluation reads (nothing is held out)."""
    data = tmp_path / "eval.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "5"}\n')
    args, training = study.parse_args(["--preset", "cpu-small", "--eval_dataset", str(data), "--eval_limit", "1"])
    plan = study.build_plan(args, training)
    assert plan.eval_rows is None and plan.eval_source == str(data)
    assert all(config.dataset == str(data) for config in plan.evaluation.values())


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory, smollm2_tokenizer) -> str:
    """A tiny random Llama with the SmolLM2 tokenizer (and its chat template)."""
    return save_tiny_llamas(tmp_path_factory, smollm2_tokenizer, {"base": 0})["base"]


def test_tiny_study_end_to_end_and_resume(tiny_base, tmp_path):
    out = tmp_path / "study"
    command = [sys.executable, str(SCRIPT), "--model_name_or_path", tiny_base, "--output_dir", str(out),
               "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "2",
               "--max_completion_length", "8", "--eval_limit", "3", "--eval_k", "2", "--eval_step_grid", "1",
               "--eval_batch_size", "8", "--cpu_threads", "1", "--disable_tqdm", "true"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    for arm in ("grpo", "tandem", "kl_to_junior"):
        assert f"seed 1, {arm}" in result.stdout
        assert (out / "seed-1" / arm / "config.json").is_file()
        assert (out / "seed-1" / arm / "log_history.json").is_file()
    report = out / "report"
    for name in ("results.json", "report.md", "report.html", "command.txt", "seed-1/samples.html",
                 "seed-1/pass_at_k.png", "seed-1/pass_at_k_curve.png", "seed-1/drift.png"):  # fmt: skip
        assert (report / name).is_file(), name
    results = json.loads((report / "results.json").read_text())
    table = results["comparison"]["seeds"]["1"]
    assert {row["claim"] for row in table} == {
        "solo capability", "handoff robustness", "drift", "legibility", "pass@k curve"
    }  # fmt: skip
    solo = next(row for row in table if row["metric"] == "pass@1")
    assert set(solo["arms"]) == {"base", "grpo", "tandem", "kl_to_junior"}
    assert all(
        solo["arms"][a]["ci_low"] <= solo["arms"][a]["value"] <= solo["arms"][a]["ci_high"] for a in solo["arms"]
    )
    for key in ("tandem - grpo", "kl_to_junior - grpo"):
        assert solo["differences"][key]["paired"] is True and "ci_low" in solo["differences"][key]
    drift = next(row for row in table if row["claim"] == "drift")
    assert drift["arms"]["base"]["value"] == 0.0 and drift["differences"]["tandem - grpo"]["ci_low"] is None
    training = results["study"]["arms"]
    assert training["kl_to_junior"]["training"]["1"]["beta"] == 0.04
    assert training["kl_to_junior"]["training"]["1"]["mean_kl_term"] is not None
    assert training["grpo"]["training"]["1"]["mean_senior_token_fraction"] == 1.0
    assert training["tandem"]["training"]["1"]["mean_senior_token_fraction"] < 1.0
    assert "reproduce_paper.py" in (report / "command.txt").read_text()
    assert "trl" in results["study"]["versions"]

    # Rerun: every arm and the evaluation are found and skipped, and the report is rewritten.
    (report / "results.json").unlink()
    again = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.count("exists, skipped") == 4, again.stdout
    assert (report / "results.json").is_file()
