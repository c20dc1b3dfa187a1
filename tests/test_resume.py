"""Exact resume (issue 12): a run resumed from a checkpoint draws the coins and tokens the uninterrupted run drew.

Tiny random models (tests/conftest.py); the three short training runs below take well under a minute on a CPU.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_tokenizer, tiny_prompts, tiny_tandem_config
from datasets import Dataset
from transformers import TrainerCallback

from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _dataset(n: int = 8) -> Dataset:
    return tiny_prompts(n)


def _config(output_dir, **overrides) -> TandemGRPOConfig:
    resumable = dict(per_device_eval_batch_size=4, max_steps=4, save_strategy="steps", save_steps=2,
                     tandem_eval_rollouts=True)  # fmt: skip
    return tiny_tandem_config(output_dir, **{**resumable, **overrides})


def _trainer(model_dir, output_dir, callbacks=None, **overrides) -> TandemGRPOTrainer:
    """A trainer that records, for every rollout, the step it was drawn at, its mode, coin seeds, tokens, authors."""
    evaluating = overrides.get("eval_strategy", "no") != "no"
    trainer = TandemGRPOTrainer(
        model=model_dir,
        reward_funcs=length_reward,
        args=_config(output_dir, **overrides),
        train_dataset=_dataset(),
        eval_dataset=_dataset(4) if evaluating else None,
        processing_class=build_tiny_tokenizer(),
        callbacks=callbacks,
    )
    trainer.rollouts = []
    generate = trainer._generate

    def recording_generate(prompts):
        out = generate(prompts)
        mode = "train" if trainer.model.training else "eval"
        trainer.rollouts.append(
            {
                "global_step": trainer.state.global_step,
                "mode": mode,
                "seeds": list(trainer._rollout.seeds),
                "completion_ids": [list(ids) for ids in out[1]],
                "authorship": [list(row) for row in trainer._rollout.authorship],
            }
        )
        return out

    trainer._generate = recording_generate
    return trainer


class StopAfterCheckpoint(TrainerCallback):
    """Stop training once the checkpoint of ``step`` has been written (as a preempted job would)."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def _train_rollouts(trainer, steps) -> list[dict]:
    """The training rollouts of the optimizer steps ``steps`` (1-based: step k is drawn at global_step k - 1)."""
    return [r for r in trainer.rollouts if r["mode"] == "train" and r["global_step"] + 1 in steps]


def _step_logs(trainer, steps) -> dict[int, dict]:
    return {e["step"]: e for e in trainer.state.log_history if "loss" in e and e["step"] in steps}


_LOGGED = ("loss", "reward", "tandem/senior_token_fraction", "tandem/junior_unit_fraction")


# Generation layouts: one rollout per optimizer step (TRL's default), and two (gradient accumulation 2, a rollout per
# micro-batch), where the call index within the step tells the two apart.
LAYOUTS = {
    "one_rollout_per_step": ({}, 1),
    "two_rollouts_per_step": ({"gradient_accumulation_steps": 2, "steps_per_generation": 1}, 2),
}


@pytest.fixture(scope="module")
def uninterrupted_runs(tmp_path_factory, tiny_model_dirs):
    runs = {}

    def run(layout: str) -> TandemGRPOTrainer:
        if layout not in runs:
            runs[layout] = _trainer(tiny_model_dirs[0], tmp_path_factory.mktemp("run_a"), **LAYOUTS[layout][0])
            runs[layout].train()
        return runs[layout]

    return run


@pytest.fixture
def uninterrupted(uninterrupted_runs):
    return uninterrupted_runs("one_rollout_per_step")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_resumed_run_draws_what_the_uninterrupted_run_drew(tmp_path, tiny_model_dirs, uninterrupted_runs, layout):
    overrides, per_step = LAYOUTS[layout]
    uninterrupted = uninterrupted_runs(layout)
    first = _trainer(tiny_model_dirs[0], tmp_path, callbacks=[StopAfterCheckpoint(2)], **overrides)
    first.train()
    assert first.state.global_step == 2 and (tmp_path / "checkpoint-2" / "trainer_state.json").is_file()
    resumed = _trainer(tiny_model_dirs[0], tmp_path, **overrides)  # a new trainer, the initial model, same arguments
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4

    # Steps 1-2 of the interrupted run are those of the uninterrupted run (same code path, same process history).
    assert _train_rollouts(first, {1, 2}) == _train_rollouts(uninterrupted, {1, 2})
    expected, got = _train_rollouts(uninterrupted, {3, 4}), _train_rollouts(resumed, {3, 4})
    assert len(expected) == len(got) == 2 * per_step, "rollouts per optimizer step"
    for want, have in zip(expected, got, strict=True):
        step = want["global_step"] + 1
        assert have["seeds"] == want["seeds"], f"step {step}: the resumed run's coin seeds differ"
        assert have["authorship"] == want["authorship"], f"step {step}: authorship differs"
        assert have["completion_ids"] == want["completion_ids"], f"step {step}: token draws differ"
    want_logs, have_logs = _step_logs(uninterrupted, {3, 4}), _step_logs(resumed, {3, 4})
    assert sorted(want_logs) == sorted(have_logs) == [3, 4]
    for step in (3, 4):
        for key in _LOGGED:
            assert have_logs[step][key] == pytest.approx(want_logs[step][key], rel=1e-5, abs=1e-7), (step, key)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_rollout_draws_fresh_coins(uninterrupted_runs, layout):
    rollouts = _train_rollouts(uninterrupted_runs(layout), {1, 2, 3, 4})
    seeds = [r["seeds"] for r in rollouts]
    assert len(seeds) == 4 * LAYOUTS[layout][1]
    assert all(len(set(s)) == len(s) for s in seeds), "distinct coin seeds within a generation batch"
    assert len({x for s in seeds for x in s}) == sum(map(len, seeds)), "no seed is reused by a later rollout or step"
    assert rollouts[0]["completion_ids"] != rollouts[1]["completion_ids"], "and other token draws"


def test_evaluation_between_steps_leaves_the_training_draws_unchanged(tmp_path, tiny_model_dirs, uninterrupted):
    evaluated = _trainer(tiny_model_dirs[0], tmp_path, eval_strategy="steps", eval_steps=1)
    metrics = evaluated.evaluate()  # before the first step as well
    assert 0.0 < metrics["eval_tandem/senior_token_fraction"] < 1.0, "evaluation co-generated"
    evaluated.train()
    assert sum(r["mode"] == "eval" for r in evaluated.rollouts) >= 5, "evaluated before and after every step"
    assert _train_rollouts(evaluated, {1, 2, 3, 4}) == _train_rollouts(uninterrupted, {1, 2, 3, 4})


def test_seed_derivation_separates_every_coordinate():
    from tandem_grpo.sampling import rollout_seed

    base = dict(run_seed=3, stream="coins", mode="train", global_step=1, process_index=0, call_index=0, position=0)
    seed = rollout_seed(**base)
    assert seed == rollout_seed(**base), "a pure function of its coordinates"
    assert 0 <= seed < 2**63
    for field, other in (
        ("run_seed", 4),
        ("stream", "tokens"),
        ("mode", "eval"),
        ("global_step", 2),
        ("process_index", 1),
        ("call_index", 1),
        ("position", 1),
    ):
        assert rollout_seed(**{**base, field: other}) != seed, field
    # Sums of coordinates do not collide (as `seed + step + position` would).
    assert rollout_seed(**{**base, "global_step": 2, "position": 0}) != rollout_seed(**{**base, "position": 1})
    # Processes of one step draw disjoint coins.
    coins = {
        rank: [rollout_seed(**{**base, "process_index": rank, "position": i}) & 0x7FFFFFFF for i in range(64)]
        for rank in (0, 1)
    }
    assert not set(coins[0]) & set(coins[1])
    # The run seed may be any int TrainingArguments accepts.
    assert rollout_seed(**{**base, "run_seed": -1}) != rollout_seed(**{**base, "run_seed": 1})


def test_rollout_seeds_keep_their_values():
    from tandem_grpo.sampling import rollout_seed

    # Pinned values: a change here changes the coins and tokens of every run, and a resumed run's draws.
    assert rollout_seed(3, "coins", "train", 1, 0, 0, 0) == 3199960327429049413
    assert rollout_seed(-1, "tokens", "eval", 7, 2, 1, 0) == 4504041647244404670


def test_token_draws_do_not_depend_on_earlier_calls(tmp_path, tiny_model_dirs):
    trainer = _trainer(tiny_model_dirs[0], tmp_path, save_strategy="no")
    trainer.model.train()
    prompts = [{"prompt": "ab c"}] * 4
    torch.manual_seed(0)
    first = trainer._generate_and_score_completions(prompts)["completion_ids"]
    trainer.state.global_step = 7  # a later step draws other tokens ...
    later = trainer._generate_and_score_completions(prompts)["completion_ids"]
    assert not torch.equal(first, later)
    trainer.state.global_step = 0  # ... and back at step 0 the first call of the step draws what it drew
    again = trainer._generate_and_score_completions(prompts)["completion_ids"]
    assert torch.equal(first, again)
