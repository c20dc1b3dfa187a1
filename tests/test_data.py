"""Tests for tandem_grpo.data (answers, loading, arithmetic): real shared files, row validation, the built-in set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import pytest
from conftest import SHARED_DATA as DATA_DIR

from tandem_grpo import data
from tandem_grpo.data import (
    INSTRUCTION,
    arithmetic,
    arithmetic_word_problems,
    gsm8k_gold,
    last_boxed,
    load_math_dataset,
    loading,
    to_example,
)

needs_data = pytest.mark.skipif(
    not (DATA_DIR / "gsm8k" / "train.jsonl").is_file(),
    reason=f"math data mirror not found at {DATA_DIR} (set TANDEM_GRPO_DATA_DIR)",
)


def _raw_rows(relative: str) -> list[dict]:
    with (DATA_DIR / relative).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _question(example: dict) -> str:
    (message,) = example["prompt"]
    assert message["role"] == "user"
    assert message["content"].endswith(INSTRUCTION)
    return message["content"][: -len(INSTRUCTION)]


# --------------------------------------------------------------------------------------------------
# Real shared data
# --------------------------------------------------------------------------------------------------


@needs_data
def test_gsm8k_train_file_loads_with_gold_of_first_row():
    ds = load_math_dataset(DATA_DIR / "gsm8k" / "train.jsonl")
    assert ds.column_names == ["prompt", "answer"]
    assert len(ds) == 7473
    assert ds[0]["answer"] == "72"
    assert _question(ds[0]).startswith("Natalia sold clips to 48 of her friends in April")
    assert ds[1]["answer"] == "10"


@needs_data
def test_gsm8k_gold_strips_thousands_commas():
    raw = _raw_rows("gsm8k/train.jsonl")
    ds = load_math_dataset(DATA_DIR / "gsm8k" / "train.jsonl")
    with_commas = [i for i, r in enumerate(raw) if "," in r["answer"].rsplit("####", 1)[1]]
    assert with_commas, "expected some GSM8K golds written with thousands separators"
    assert raw[345]["answer"].endswith("#### 1,080")
    assert ds[345]["answer"] == "1080"
    for i in with_commas:
        assert ds[i]["answer"] == raw[i]["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    assert not any("," in a for a in ds["answer"])


@needs_data
def test_short_name_uses_env_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_GRPO_DATA_DIR", str(DATA_DIR))
    monkeypatch.chdir(tmp_path)
    ds = load_math_dataset("gsm8k", split="test")
    assert len(ds) == 1319
    assert ds[0]["answer"] == "18"
    assert _question(ds[0]).startswith("Janet")


def test_short_name_without_mirror_goes_to_the_hub_never_a_guessed_path(monkeypatch, tmp_path):
    calls = []

    def hub(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_dict({"question": ["q"], "final_ans": ["7"]})

    monkeypatch.delenv("TANDEM_GRPO_DATA_DIR", raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda: True)
    monkeypatch.setattr(loading.datasets, "load_dataset", hub)
    # A folder laid out like the mirror beside the working directory must not be picked up.
    (tmp_path / "work").mkdir()
    (tmp_path / "shared" / "data" / "multiarith").mkdir(parents=True)
    _write_jsonl(tmp_path / "shared" / "data" / "multiarith" / "test.jsonl", [{"input": "x", "target": 1}])
    monkeypatch.chdir(tmp_path / "work")
    ds = load_math_dataset("MultiArith", split="test")
    assert ds["answer"] == ["7"]
    assert calls == [(("ChilleD/MultiArith", None), {"split": "test"})]


@pytest.mark.parametrize("name", sorted(data.DATASETS))
def test_every_short_name_maps_to_a_hub_set_with_its_config_and_split(monkeypatch, name):
    calls = []
    monkeypatch.delenv("TANDEM_GRPO_DATA_DIR", raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda: True)
    monkeypatch.setattr(
        loading.datasets,
        "load_dataset",
        lambda *a, **k: calls.append((a, k)) or datasets.Dataset.from_dict({"problem": ["p"], "answer": ["1"]}),
    )
    hub = data.DATASETS[name]
    load_math_dataset(name, split="test")
    assert calls == [((hub.repo_id, hub.config), {"split": "test"})]
    if "train" not in hub.splits:
        with pytest.raises(ValueError, match=rf"{name!r} has no 'train' split.*split='test'"):
            load_math_dataset(name)


def test_hub_unreachable_without_mirror_fails_fast_naming_the_offline_settings(monkeypatch):
    monkeypatch.delenv("TANDEM_GRPO_DATA_DIR", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda: False)
    monkeypatch.setattr(loading.datasets, "load_dataset", lambda *a, **k: pytest.fail("must not wait for the hub"))
    with pytest.raises(ConnectionError) as info:
        load_math_dataset("gsm8k", split="test")
    message = str(info.value)
    assert "'openai/gsm8k:main'" in message and "TANDEM_GRPO_DATA_DIR" in message and "HF_HUB_OFFLINE=1" in message


@needs_data
def test_data_dir_argument_overrides_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_GRPO_DATA_DIR", str(tmp_path))
    ds = load_math_dataset("AIME24", split="test", data_dir=DATA_DIR)
    assert len(ds) == 30
    assert ds[0]["answer"] == "204"


def test_mirror_without_the_set_names_the_mirror_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_GRPO_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(loading, "hub_reachable", lambda: False)
    with pytest.raises(ConnectionError, match=rf"mirror {re.escape(str(tmp_path))} has no gsm8k/ folder"):
        load_math_dataset("gsm8k")


@needs_data
def test_folder_source_reads_split_file():
    ds = load_math_dataset(DATA_DIR / "gsm8k", split="test", limit=3)
    assert len(ds) == 3
    assert ds["answer"] == [r["answer"].rsplit("#### ", 1)[1] for r in _raw_rows("gsm8k/test.jsonl")[:3]]


@needs_data
def test_missing_split_names_available_splits(monkeypatch):
    monkeypatch.setenv("TANDEM_GRPO_DATA_DIR", str(DATA_DIR))
    with pytest.raises(FileNotFoundError, match=r"'train'.*available splits: test"):
        load_math_dataset("math500")  # default split is train; math500 only has test


@needs_data
def test_math500_uses_answer_field():
    ds = load_math_dataset(DATA_DIR / "math500" / "test.jsonl")
    assert len(ds) == 500
    assert ds[0]["answer"] == r"\left( 3, \frac{\pi}{2} \right)"
    assert ds[2]["answer"] == r"\frac{14}{3}"
    assert _question(ds[0]).startswith("Convert the point $(0,3)$")
    assert ds.column_names == ["prompt", "answer"]  # subject, level, unique_id, solution dropped


@needs_data
def test_minerva_gold_is_last_boxed_with_nested_braces():
    ds = load_math_dataset(DATA_DIR / "minerva_math" / "test.jsonl")
    assert len(ds) == 272
    assert ds[0]["answer"] == "1.6"
    assert ds[1]["answer"] == "4.5e33"
    assert ds[30]["answer"] == r"\sqrt{4 \pi G \rho_{0} r_{0}^{2}}"
    assert ds[25]["answer"] == r"\frac{a M^{1 / 3}}{G M^{2 / 3}+b}"
    assert ds[12]["answer"] == (r"\frac{2 \pi c^{2} R^{2}}{\lambda^{5}\left[e^{h c /(\lambda k T)}-1\right] d^{2}}")


@needs_data
def test_aime24_answers_and_leading_zeros():
    raw = _raw_rows("aime24/test.jsonl")
    ds = load_math_dataset(DATA_DIR / "aime24" / "test.jsonl")
    assert ds["answer"][:3] == ["204", "113", "371"]
    assert raw[7]["answer"] == "025"
    assert ds[7]["answer"] == "25"
    assert _question(ds[0]) == raw[0]["problem"]


@needs_data
def test_amc23_float_answers_become_integer_strings():
    raw = _raw_rows("amc23/test.jsonl")
    ds = load_math_dataset(DATA_DIR / "amc23" / "test.jsonl")
    assert raw[0]["answer"] == 27.0
    assert ds[0]["answer"] == "27"
    assert ds[3]["answer"] == "3159"
    assert [float(a) for a in ds["answer"]] == [float(r["answer"]) for r in raw]
    assert not any(a.endswith(".0") for a in ds["answer"])


@needs_data
def test_multiarith_input_and_integer_target():
    ds = load_math_dataset(DATA_DIR / "multiarith" / "test.jsonl")
    assert len(ds) == len(_raw_rows("multiarith/test.jsonl"))
    assert ds[0]["answer"] == "39"
    assert ds[1]["answer"] == "8"
    assert _question(ds[1]).startswith("A pet store had 13 siamese cats")


# --------------------------------------------------------------------------------------------------
# Row formats and errors
# --------------------------------------------------------------------------------------------------


def test_to_example_detects_each_format():
    gsm = to_example({"question": " Q? ", "answer": "work\n#### 1,234"}, 0, "s")
    assert gsm == {"prompt": [{"role": "user", "content": "Q?" + INSTRUCTION}], "answer": "1234"}
    assert to_example({"problem": "P", "answer": r"\frac{1}{2}"}, 0, "s")["answer"] == r"\frac{1}{2}"
    boxed = to_example({"problem": "P", "solution": r"so \boxed{2} then \boxed{\frac{a}{b}}."}, 0, "s")
    assert boxed["answer"] == r"\frac{a}{b}"
    assert to_example({"input": "I", "target": 7}, 0, "s")["answer"] == "7"
    assert to_example({"problem": "P", "answer": 2.5}, 0, "s")["answer"] == "2.5"
    assert to_example({"problem": "P", "answer": 27.0}, 0, "s")["answer"] == "27"


def test_to_example_error_names_source_row_and_field():
    with pytest.raises(ValueError, match=r"src\.jsonl: row 5 has no question.*'question'"):
        to_example({"answer": "3"}, 4, "src.jsonl")
    with pytest.raises(ValueError, match=r"row 1 has no gold answer.*'answer'"):
        to_example({"question": "Q"}, 0, "src")
    with pytest.raises(ValueError, match=r"row 2 .*\\boxed"):
        to_example({"problem": "P", "solution": "no box here"}, 1, "src")
    with pytest.raises(ValueError, match="row 1 is a list"):
        to_example(["Q", "3"], 0, "src")


def test_the_documented_row_formats_load_and_a_wrong_row_names_the_expected_fields(tmp_path):
    """docs/training.md prints one example row per accepted format (ROW_FORMATS); each loads with its gold, both
    command lines' --help say what a row holds, and a row with a misnamed question field is refused with an example."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    section = page[page.index("## Your own problems: the `.jsonl` rows") :]
    documented = re.findall(r"^\| (.+?) \| `(\{.*\})` \|$", section[: section.index("\n## ")], flags=re.M)
    assert [(name, json.loads(row)) for name, row in documented] == list(data.ROW_FORMATS.items())
    path = _write_jsonl(tmp_path / "my.jsonl", list(data.ROW_FORMATS.values()))
    assert load_math_dataset(path)["answer"] == ["5", "19", r"\frac{3}{4}", "40", "27", "3"]
    _write_jsonl(path, [{"question": "What is 1 + 1?", "answer": "2"}, {"query": "What is 2 + 3?", "answer": "5"}])
    with pytest.raises(ValueError) as info:
        load_math_dataset(path)
    assert "row 2 has no question" in str(info.value) and "fields found: 'answer', 'query'" in str(info.value)
    assert "'question', 'problem' or 'input'" in str(info.value)
    assert 'A row reads e.g. {"question": "What is 2 + 3?", "answer": "5"}' in str(info.value)
    from tandem_grpo.evaluation.cli import build_parser

    flat = " ".join(build_parser().format_help().split())
    assert " ".join(data.ROW_FORMAT_HELP.split()) in flat


def test_file_row_missing_question_reports_line_number(tmp_path):
    path = _write_jsonl(
        tmp_path / "bad.jsonl",
        [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}, {"answer": "#### 6"}],
    )
    with pytest.raises(ValueError) as info:
        load_math_dataset(path)
    message = str(info.value)
    assert str(path) in message
    assert "row 3" in message
    assert "'question'" in message and "'problem'" in message  # says which fields are accepted


def test_row_errors_name_the_line_when_blank_lines_shift_rows(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({"question": "a", "answer": "#### 1"}) + "\n\n" + json.dumps({"question": "b"}) + "\n",
        encoding="utf-8",
    )
    expected = r"row 2 \(line 3\) has no gold answer: missing field 'answer'.*found: 'question'\)"
    with pytest.raises(ValueError, match=expected):
        load_math_dataset(path)


def test_invalid_json_line_is_reported(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "a", "answer": "#### 1"}\n{"question": \n', encoding="utf-8")
    with pytest.raises(ValueError, match="row 2 is not valid JSON"):
        load_math_dataset(path)


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_file_is_an_error(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        load_math_dataset(path)


def test_extra_columns_dropped_and_limit(tmp_path):
    rows = [{"id": i, "problem": f"What is {i}+1?", "answer": str(i + 1), "level": 1} for i in range(10)]
    path = _write_jsonl(tmp_path / "rows.jsonl", rows)
    ds = load_math_dataset(path, limit=4)
    assert ds.column_names == ["prompt", "answer"]
    assert ds["answer"] == ["1", "2", "3", "4"]
    with pytest.raises(ValueError, match="limit"):
        load_math_dataset(path, limit=0)


def test_limit_stops_before_a_later_bad_row(tmp_path):
    path = _write_jsonl(tmp_path / "rows.jsonl", [{"question": "a", "answer": "1"}, {"question": "b"}])
    assert load_math_dataset(path, limit=1)["answer"] == ["1"]
    with pytest.raises(ValueError, match="row 2"):
        load_math_dataset(path)


def test_json_list_and_json_lines_files(tmp_path):
    rows = [{"problem": "p1", "answer": "1"}, {"problem": "p2", "answer": "2"}]
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(rows), encoding="utf-8")
    assert load_math_dataset(listed)["answer"] == ["1", "2"]
    by_split = tmp_path / "splits.json"
    by_split.write_text(json.dumps({"test": rows[:1], "train": rows}), encoding="utf-8")
    assert load_math_dataset(by_split, split="test")["answer"] == ["1"]
    lines = tmp_path / "lines.json"
    datasets.Dataset.from_list(rows).to_json(lines)  # writes JSON Lines
    assert load_math_dataset(lines)["answer"] == ["1", "2"]


def test_missing_local_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_math_dataset(str(tmp_path / "nope.jsonl"))


def test_hub_failure_says_hub_unreachable_and_suggests_local_file(monkeypatch):
    calls = []

    def unreachable(*args, **kwargs):
        calls.append((args, kwargs))
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setattr(loading, "hub_reachable", lambda: True)
    monkeypatch.setattr(loading.datasets, "load_dataset", unreachable)
    with pytest.raises(ConnectionError) as info:
        load_math_dataset("openai/gsm8k")
    assert "hub could not be reached" in str(info.value)
    assert ".jsonl" in str(info.value)
    assert calls == [(("openai/gsm8k", "main"), {"split": "train"})]


def test_hub_dataset_rows_are_converted(monkeypatch):
    fake = datasets.Dataset.from_dict(
        {"question": ["q1", "q2", "q3"], "answer": ["x\n#### 1,234", "#### 5", "#### 6"], "extra": [1, 2, 3]}
    )
    monkeypatch.setattr(loading, "hub_reachable", lambda: True)
    monkeypatch.setattr(loading.datasets, "load_dataset", lambda *a, **k: fake)
    ds = load_math_dataset("someone/math", split="test", limit=2)
    assert ds.column_names == ["prompt", "answer"]
    assert ds["answer"] == ["1234", "5"]


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def test_last_boxed():
    assert last_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert last_boxed(r"\fbox{x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{ {a}{b} }") == "{a}{b}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert last_boxed(r"\boxed 5$") == "5"
    assert last_boxed(r"\boxed{3} then \boxed{4") == "3"  # truncated box ignored
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{}") == ""
    assert last_boxed(r"\boxedx{3}") is None


def test_gsm8k_gold():
    assert gsm8k_gold("steps\n#### 1,234") == "1234"
    assert gsm8k_gold("#### -7") == "-7"
    with pytest.raises(ValueError, match="####"):
        gsm8k_gold("no marker 12")
    with pytest.raises(ValueError, match="nothing after"):
        gsm8k_gold("steps ####  ")


# --------------------------------------------------------------------------------------------------
# Built-in arithmetic word problems
# --------------------------------------------------------------------------------------------------


def _template_regex(template: str) -> re.Pattern:
    pattern = re.escape(template)
    for placeholder in ("name", "friend", "pron", "Pron", "objs"):
        pattern = pattern.replace(re.escape("{" + placeholder + "}"), r"[A-Za-z ]+?")
    pattern = pattern.replace(re.escape("{a}"), r"(?P<a>\d+)").replace(re.escape("{b}"), r"(?P<b>\d+)")
    return re.compile(pattern)


def test_arithmetic_problems_are_deterministic_per_seed():
    first = arithmetic_word_problems(50, seed=3)
    again = arithmetic_word_problems(50, seed=3)
    other = arithmetic_word_problems(50, seed=4)
    assert first.to_list() == again.to_list()
    assert first["prompt"] != other["prompt"]
    assert first.column_names == ["prompt", "answer"]
    assert len(first) == 50
    questions = [_question(e) for e in first]
    assert len(set(questions)) > 40  # varied, not one repeated problem


def test_arithmetic_gold_answers_are_right():
    templates = [(op, _template_regex(t)) for op, ts in arithmetic._ARITHMETIC_TEMPLATES.items() for t in ts]
    ds = arithmetic_word_problems(300, seed=11)
    ops_seen = set()
    for example in ds:
        question = _question(example)
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        assert len(numbers) == 2 and all(n <= 30 for n in numbers), question
        matches = [(op, m) for op, regex in templates if (m := regex.fullmatch(question))]
        assert len(matches) == 1, question
        op, match = matches[0]
        a, b = int(match["a"]), int(match["b"])
        expected = {"+": a + b, "-": a - b, "*": a * b}[op]
        assert example["answer"] == str(expected), question
        assert expected >= 0
        ops_seen.add(op)
    assert ops_seen == {"+", "-", "*"}


def test_arithmetic_example_from_the_docs_reads_naturally():
    ds = arithmetic_word_problems(200, seed=0)
    pattern = re.compile(r"(\w+) has (\d+) ([a-z ]+) and buys (\d+) more\. How many \3 does (she|he) have now\?")
    hits = [(m, e["answer"]) for e in ds if (m := pattern.fullmatch(_question(e)))]
    assert hits
    for match, answer in hits:
        assert int(answer) == int(match[2]) + int(match[4])


def _replay_chain(question: str) -> int:
    """The answer of a chain problem computed from its text alone: the start, then each change's verb."""
    sentences = question.split(". ")
    amount = int(re.search(r"\d+", sentences[0])[0])
    for sentence in sentences[1:-1]:
        b = int(re.search(r"\d+", sentence)[0])
        amount += b if re.search(r"buys|finds|gives (her|him)", sentence) else -b
    return amount


@pytest.mark.parametrize(("task", "changes", "largest", "change"), [("chain2", 1, 60, 20), ("chain3_small", 2, 20, 9)])
def test_chain_problems_answers_and_ranges(task, changes, largest, change):
    """Every chain problem's gold answer is what its sentences compute, every amount stays in range, and the same seed
    gives the same problems."""
    ds = data.builtin_problems(task, 300, seed=5)
    assert ds.to_list() == data.builtin_problems(task, 300, seed=5).to_list()
    ops = set()
    for example in ds:
        question = _question(example)
        assert question.endswith("have now?") and len(question.split(". ")) == changes + 2, question
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        assert all(1 <= n <= change for n in numbers[1:]) and 1 <= numbers[0] <= largest // 2, question
        assert example["answer"] == str(_replay_chain(question)), question
        assert 1 <= int(example["answer"]) <= largest
        ops |= {"+" if re.search(r"buys|finds|gives (her|him)", s) else "-" for s in question.split(". ")[1:-1]}
    assert ops == {"+", "-"}
    with pytest.raises(ValueError, match="Unknown built-in task 'chain9'.*two_operand"):
        data.builtin_problems("chain9", 3)
    with pytest.raises(ValueError, match="num_steps"):
        data.arithmetic_chains(3, num_steps=1)


@pytest.mark.parametrize("task", ["chain2", "chain2_small"])
def test_builtin_split_trains_on_the_same_problems_and_holds_out_others(task):
    """The training half is builtin_problems' (the main job trains on the same rows with or without a held-out set);
    no held-out problem occurs in training or twice (the stream repeats a few: 14 in 2,000 of chain2_small)."""
    train, held_out = data.builtin_split(task, 1000, 1000, seed=3)
    assert train.to_list() == data.builtin_problems(task, 1000, seed=3).to_list()
    questions = [_question(row) for row in held_out]
    assert len(questions) == 1000 == len(set(questions))
    assert not set(questions) & {_question(row) for row in train}
    assert all(row["answer"] == str(_replay_chain(_question(row))) for row in held_out)
    assert len(data.builtin_split(task, 200, 0, seed=3)[1]) == 0
    with pytest.raises(ValueError, match="num_held_out=-1"):
        data.builtin_split(task, 10, -1)


def test_builtin_split_held_out_after_keeps_a_shorter_studys_held_out_problems():
    """A 90-step study (180 problems) evaluated on the 30-step study's held-out problems (60 problems): the same
    held-out rows, the same first 60 training rows, and no held-out problem among the 120 added ones."""
    short_train, short_held = data.builtin_split("chain2", 60, 100, seed=0)
    train, held = data.builtin_split("chain2", 180, 100, seed=0, held_out_after=60)
    assert held.to_list() == short_held.to_list()
    assert len(train) == 180 and train.select(range(60)).to_list() == short_train.to_list()
    assert not {_question(row) for row in train} & {_question(row) for row in held}
    # Without held_out_after the 180 problems would have trained on some of those held-out ones.
    assert {_question(row) for row in data.builtin_split("chain2", 180, 100, seed=0)[0]} & {
        _question(row) for row in held
    }
    with pytest.raises(ValueError, match="held_out_after=0"):
        data.builtin_split("chain2", 10, 10, held_out_after=0)


def test_arithmetic_rejects_non_positive_size():
    with pytest.raises(ValueError, match="num_problems"):
        arithmetic_word_problems(0)


def test_instruction_is_appended_once_by_every_loader(tmp_path):
    """The main job asks for one-line answers; GSM8K-style files keep step-by-step unless told otherwise."""
    built_in = arithmetic_word_problems(5, seed=1, instruction=data.ONE_LINE_INSTRUCTION)
    default = arithmetic_word_problems(5, seed=1)
    for short, long in zip(built_in["prompt"], default["prompt"], strict=True):
        assert short[0]["content"].endswith(data.ONE_LINE_INSTRUCTION)
        assert short[0]["content"].removesuffix(data.ONE_LINE_INSTRUCTION) == long[0]["content"].removesuffix(
            data.INSTRUCTION
        )
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "What is 2 + 3?", "answer": "5"}\n')
    row = load_math_dataset(str(path), instruction=data.INSTRUCTIONS["one_line"])[0]
    assert row["prompt"][0]["content"] == "What is 2 + 3?" + data.ONE_LINE_INSTRUCTION
    assert load_math_dataset(str(path))[0]["prompt"][0]["content"] == "What is 2 + 3?" + data.INSTRUCTION
