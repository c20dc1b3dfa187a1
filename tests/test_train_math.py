"""examples/train_math.py's own logic, in-process (fast): the default seed, the resume check made before any model
loads, and the one line a Ctrl-C prints instead of tracebacks. The script as a process: tests/test_examples.py,
tests/test_bad_inputs.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers.trainer_callback import ProgressCallback

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def train_math():
    spec = importlib.util.spec_from_file_location("train_math", ROOT / "examples" / "train_math.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_math"] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("train_math", None)


def _args(train_math, *argv: str):
    return train_math.build_parser().parse_args_and_config(list(argv))[1]


def _checkpoint(folder: Path, step: int, complete: bool = True) -> Path:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def test_the_default_seed_is_the_one_the_readme_measured(train_math):
    # The README's table of the main job is seed 0 (bench/main_job_seeds.py passes --seed); TRL's default is 42.
    assert _args(train_math).seed == 0
    assert _args(train_math, "--seed", "42").seed == 42


def test_the_main_job_trains_where_the_senior_learnt_and_the_config_keeps_the_papers_default(train_math):
    # The regime map's setting for the main job (results/map/map.md); TandemGRPOConfig itself keeps the paper's 0.5.
    from tandem_grpo import TandemGRPOConfig

    args = _args(train_math)
    assert (args.junior_probability, args.max_steps) == (0.1, 30)
    assert _args(train_math, "--junior_probability", "0.5").junior_probability == 0.5
    assert TandemGRPOConfig(output_dir="unused").junior_probability == 0.5


def _problems(folder: Path, name: str, numbers: range) -> Path:
    path = folder / name
    path.write_text("".join(json.dumps({"question": f"What is {n} + 1?", "answer": f"#### {n + 1}"}) + "\n"
                            for n in numbers))  # fmt: skip
    return path


def test_dataset_name_help_says_what_a_jsonl_row_holds(train_math):
    from tandem_grpo.data import ROW_FORMAT_HELP

    flat = " ".join(train_math.build_parser().format_help().split())
    assert " ".join(ROW_FORMAT_HELP.split()) in flat


def test_held_out_problems_never_come_from_the_training_rows(train_math, tmp_path):
    """Built-in problems are held out from the same stream; a dataset only with --held_out_split, refused when it is
    the training split or shares a question with it (a single .jsonl file has one split whatever the flag)."""
    parse = train_math.build_parser().parse_args_and_config
    script, training, _ = parse(["--num_problems", "20", "--held_out_problems", "5"])
    train, held_out = train_math.load_problems(script, training.seed)
    assert len(train) == 20 and len(held_out) == 5
    assert not {p[0]["content"] for p in held_out["prompt"]} & {p[0]["content"] for p in train["prompt"]}
    assert train_math.load_problems(parse(["--held_out_problems", "0"])[0], 0)[1] is None

    data = _problems(tmp_path, "train.jsonl", range(10))
    script = parse(["--dataset_name", str(data), "--held_out_problems", "3"])[0]
    assert train_math.load_problems(script, 0)[1] is None  # no --held_out_split: no check
    script = parse(["--dataset_name", str(data), "--held_out_problems", "3", "--held_out_split", "test"])[0]
    with pytest.raises(ValueError, match=r"--held_out_split test: 3 of its first 3 questions also occur"):
        train_math.load_problems(script, 0)
    script = parse(["--dataset_name", str(data), "--held_out_split", "train"])[0]
    with pytest.raises(ValueError, match="is the training split"):
        train_math.load_problems(script, 0)
    folder = tmp_path / "set"
    folder.mkdir()
    _problems(folder, "train.jsonl", range(10))
    _problems(folder, "test.jsonl", range(100, 110))
    script = parse(["--dataset_name", str(folder), "--held_out_problems", "4", "--held_out_split", "test"])[0]
    train, held_out = train_math.load_problems(script, 0)
    assert len(train) == 10 and list(held_out["answer"]) == ["101", "102", "103", "104"]
    script = parse(["--dataset_name", str(folder), "--held_out_split", "validation"])[0]
    with pytest.raises(ValueError, match="--held_out_split validation: .*leave out --held_out_split"):
        train_math.load_problems(script, 0)


def test_held_out_report_pairs_before_and_after_and_says_so(train_math, tmp_path):
    before = [[False, False], [True, False], [False, False]]
    after = [[True, True], [True, False], [False, True]]
    line = train_math.held_out_report(before, after, tmp_path, {"source": "gguf", "quantization": "Q4_1"})
    saved = json.loads((tmp_path / "held_out.json").read_text())
    assert saved["weights"] == {"source": "gguf", "quantization": "Q4_1"}  # which weights the base's name loaded
    assert (saved["before"], saved["after"]) == pytest.approx((1 / 6, 4 / 6))
    assert saved["difference"]["value"] == pytest.approx(0.5) and saved["difference"]["num_problems"] == 3
    assert saved["correct_per_problem"] == {"before": [0, 1, 0], "after": [2, 1, 1]}
    assert line.startswith("The senior alone on 3 held-out problems x 2: 16.7% before training, 66.7% after, +50.0")
    # The null: two halves of the pooled before and after samples (permutation_null of the counts).
    from tandem_grpo.evaluation.solo import permutation_null

    assert saved["null"] == permutation_null([0, 1, 0], [2, 1, 1], 2)
    assert f"sampling alone gives ±{100 * saved['null']['ci_high']:.1f}, p " in line


def test_resume_argument_is_checked_before_the_model_loads(train_math, tmp_path):
    out = tmp_path / "out"
    assert train_math.resume_argument(_args(train_math, "--output_dir", str(out))) is None
    true = _args(train_math, "--output_dir", str(out), "--resume_from_checkpoint", "True")
    with pytest.raises(ValueError, match=r"--resume_from_checkpoint true: --output_dir .*out holds no complete"):
        train_math.resume_argument(true)
    _checkpoint(out, 2, complete=False)  # what an interrupted save leaves: not enough to resume from
    with pytest.raises(ValueError, match="no complete checkpoint-N"):
        train_math.resume_argument(true)
    complete = _checkpoint(out, 1)
    assert train_math.resume_argument(true) is True  # the trainer picks checkpoint-1, skipping checkpoint-2
    path = _args(train_math, "--output_dir", str(out), "--resume_from_checkpoint", str(complete))
    assert train_math.resume_argument(path) == str(complete)
    half = _args(train_math, "--output_dir", str(out), "--resume_from_checkpoint", str(out / "checkpoint-2"))
    with pytest.raises(ValueError, match="checkpoint-2: is not a complete checkpoint folder"):
        train_math.resume_argument(half)
    missing = _args(train_math, "--output_dir", str(out), "--resume_from_checkpoint", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="nope: no such folder"):
        train_math.resume_argument(missing)


class _InterruptedTrainer:
    """Stands in for the trainer: ``train`` is interrupted by Ctrl-C at ``step``."""

    def __init__(self, args, step: int, main: bool = True):
        self.args, self.control = args, None
        self.state = SimpleNamespace(global_step=step, is_world_process_zero=main)
        self.accelerator = SimpleNamespace(is_main_process=main)
        self.bar = ProgressCallback()
        self.bar.training_bar = SimpleNamespace(close=lambda: setattr(self, "bar_closed", True))
        self.callback_handler = SimpleNamespace(callbacks=[self.bar])
        self.bar_closed = False
        self.resumed_from = "not called"

    def train(self, resume_from_checkpoint=None):
        self.resumed_from = resume_from_checkpoint
        raise KeyboardInterrupt


def _interrupt(train_math, capsys, args, step: int, main: bool = True) -> list[str]:
    trainer = _InterruptedTrainer(args, step, main)
    with pytest.raises(SystemExit) as exit_info:
        train_math.train(trainer, True)
    assert exit_info.value.code == 130, "128 + SIGINT, as a shell reports Ctrl-C"
    assert exit_info.value.__suppress_context__, "no KeyboardInterrupt traceback chained to the exit"
    assert trainer.resumed_from is True
    assert trainer.bar_closed == main, (
        "the progress bar (main process only) is closed first, so that tqdm does not redraw it after the line"
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_ctrl_c_prints_one_line_saying_how_to_resume(train_math, tmp_path, capsys):
    out = tmp_path / "out"
    args = _args(train_math, "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2")
    _checkpoint(out, 2)
    _checkpoint(out, 4, complete=False)  # the save the Ctrl-C cut short
    lines = _interrupt(train_math, capsys, args, step=4)
    assert len(lines) == 1, lines
    assert lines[0].startswith("train_math.py: interrupted (Ctrl-C) after optimizer step 4 of 30. ")
    assert (
        f"continue from {out / 'checkpoint-2'}, rerun the same command with --resume_from_checkpoint true"
        in (lines[0])
    )
    assert _interrupt(train_math, capsys, args, step=4, main=False) == [], "one line, from the main process only"


def test_ctrl_c_without_checkpoints_says_so(train_math, tmp_path, capsys):
    (line,) = _interrupt(train_math, capsys, _args(train_math, "--output_dir", str(tmp_path)), step=3)
    assert "step 3 of 30; nothing to resume from" in line and "--save_strategy steps --save_steps N" in line
    args = _args(train_math, "--output_dir", str(tmp_path / "out"), "--save_strategy", "steps", "--save_steps", "5")
    (line,) = _interrupt(train_math, capsys, args, step=3)
    assert "no checkpoint was complete yet" in line and "--resume_from_checkpoint" not in line
