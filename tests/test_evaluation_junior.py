"""The evaluation suite co-generates with the ``--junior`` model: whatever checkpoint it pairs it with, however many
checkpoints one run evaluates, and also when the junior's path is one of the checkpoints (then one loaded module
plays both roles, and nothing may change it between them).

Checked by logits: every call that pairs a senior with the junior (``tandem_generate`` for the word-rule schedule,
the junior continuation of the senior-first step schedules, the legibility scoring) is intercepted, and the models
it received are run on a fixed input right there, before and after the call. Their logits must equal those of the
``--junior`` folder (and of the right checkpoint for the senior) loaded afresh, at 1e-5 in float32.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from conftest import save_tiny_llamas
from transformers import AutoModelForCausalLM

import tandem_grpo.evaluation.runner as runner
import tandem_grpo.generation as generation
from tandem_grpo.evaluation.cli import main

FIXED_INPUT = torch.tensor([[1, 9, 100, 2000, 30000, 45, 7, 812]])
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 4 * 2?", "8")]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, smollm2_tokenizer) -> dict[str, str]:
    """Three tiny random Llamas with SmolLM2's tokenizer and chat template: a junior and two checkpoints."""
    return save_tiny_llamas(tmp_path_factory, smollm2_tokenizer, {"junior": 0, "a": 1, "b": 2}, lm_head_scale=20)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "tiny.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS), encoding="utf-8")
    return str(path)


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=FIXED_INPUT.to(next(model.parameters()).device)).logits.float().cpu()


def _fresh(path: str) -> torch.Tensor:
    return _logits(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())


class _Pairings:
    """Intercepts the calls where a senior and the junior meet, recording ``(where, senior, junior)`` logits of the
    models passed, computed before and after each call (a call that changed a model would show up as well)."""

    def __init__(self, monkeypatch) -> None:
        self.records: list[tuple[str, torch.Tensor | None, torch.Tensor]] = []
        original_tandem = generation.tandem_generate
        tandem_signature = inspect.signature(original_tandem)

        def tandem_generate(*args, **kwargs):
            bound = tandem_signature.bind(*args, **kwargs).arguments
            return self._around("tandem_generate", bound["senior"], bound["junior"], original_tandem, args, kwargs)

        # The word-rule schedule imports tandem_generate when it runs (or at module level): replace both names.
        monkeypatch.setattr(generation, "tandem_generate", tandem_generate)
        import tandem_grpo.evaluation.schedules as schedules

        if hasattr(schedules, "tandem_generate"):
            monkeypatch.setattr(schedules, "tandem_generate", tandem_generate)

        original_step = runner.step_schedule

        def step_schedule(*args, **kwargs):
            if kwargs["first"] == "senior":  # the junior continues the senior's first steps
                return self._around("senior_first", None, kwargs["continuation"].model, original_step, args, kwargs)
            return original_step(*args, **kwargs)

        monkeypatch.setattr(runner, "step_schedule", step_schedule)

        original_legibility = runner.legibility
        legibility_signature = inspect.signature(original_legibility)

        def legibility(*args, **kwargs):
            bound = legibility_signature.bind(*args, **kwargs).arguments
            return self._around("legibility", bound["senior"], bound["junior"], original_legibility, args, kwargs)

        monkeypatch.setattr(runner, "legibility", legibility)

    def _around(self, where, senior, junior, function, args, kwargs):
        self._record(where, senior, junior)
        out = function(*args, **kwargs)
        self._record(where, senior, junior)
        return out

    def _record(self, where, senior, junior) -> None:
        self.records.append((where, None if senior is None else _logits(senior), _logits(junior)))


def _run(tmp_path, checkpoints: list[str], junior: str, dataset: str) -> dict:
    args = ["--checkpoints", *checkpoints, "--junior", junior, "--dataset", dataset, "--k", "2"]
    args += ["--max_new_tokens", "6", "--step_grid", "1", "--skip", "drift", "--batch_size", "4"]
    args += ["--output_dir", str(tmp_path / "results"), "--no_progress", "--num_html_samples", "1", "--seed", "3"]
    assert main(args) == 0
    return json.loads((tmp_path / "results" / "results.json").read_text())


@pytest.mark.parametrize(
    "checkpoints,junior",
    [
        pytest.param(["a"], "junior", id="one-checkpoint"),
        pytest.param(["a", "b"], "junior", id="two-checkpoints"),
        # The junior's folder is also a checkpoint, evaluated first: the module it shares with the junior role has
        # been a senior (and generated) before it serves as the junior for the next checkpoint.
        pytest.param(["junior", "a", "b"], "junior", id="junior-is-also-a-checkpoint"),
    ],
)
def test_evaluation_pairs_every_checkpoint_with_the_junior_model(
    tmp_path, monkeypatch, model_dirs, dataset, checkpoints, junior
):
    expected_junior = _fresh(model_dirs[junior])
    seniors = {name: _fresh(model_dirs[name]) for name in checkpoints}
    for name, logits in seniors.items():
        if name != junior:
            assert (logits - expected_junior).abs().max() > 1e-2, "the test models must really differ"

    pairings = _Pairings(monkeypatch)
    results = _run(tmp_path, [model_dirs[name] for name in checkpoints], model_dirs[junior], dataset)
    assert results["settings"]["junior"] == model_dirs[junior]

    seen: dict[str, set[str]] = {"tandem_generate": set(), "senior_first": set(), "legibility": set()}
    for where, senior, junior_logits in pairings.records:
        torch.testing.assert_close(junior_logits, expected_junior, atol=1e-5, rtol=0, msg=f"{where}: junior")
        if senior is None:
            continue
        matches = [name for name, logits in seniors.items() if torch.allclose(senior, logits, atol=1e-5, rtol=0)]
        assert len(matches) == 1, f"{where}: the senior is none of the checkpoints (or several)"
        seen[where].add(matches[0])
    # Every checkpoint was co-generated with (word rule) and scored against the junior, so each was checked.
    assert seen["tandem_generate"] == set(checkpoints)
    assert seen["legibility"] == set(checkpoints)
    assert sum(where == "senior_first" for where, _, _ in pairings.records) == 2 * len(checkpoints)
