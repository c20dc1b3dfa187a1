"""The senior's held-out solo accuracy before and after training, for a training script: sample the in-memory model
alone on held-out problems ([`solo_verdicts`][tandem_grpo.evaluation.held_out.solo_verdicts]) once before
``trainer.train()`` and once after, then pair the two problem by problem
([`paired_accuracy_difference`][tandem_grpo.evaluation.solo.paired_accuracy_difference]).

A rising training reward can be the team's (the junior writes part of every tandem completion); this says whether
the senior solves more on its own. It is the reproduction study's held-out check (``examples/reproduce_paper.py
--pilot``) at a size that fits beside a short run: the same scoring rule as the training reward, the transformers
decode loop instead of a vLLM engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends import TransformersBackend
from ..sampling import SamplingSettings
from .inputs import render_prompts, score
from .stats import by_problem


def solo_verdicts(
    model,
    tokenizer,
    prompts: Sequence[list[dict]],
    answers: Sequence[str],
    *,
    k: int,
    sampling: SamplingSettings,
    max_new_tokens: int,
    seed: int = 0,
    batch_size: int = 32,
    stated: bool = False,
    desc: str = "held-out solo",
) -> list[list[bool]]:
    """Sample ``model`` alone ``k`` times on each conversation of ``prompts`` and score each completion against its
    problem's gold answer by the training reward's rule ([`score`][tandem_grpo.evaluation.inputs.score]).

    Args:
        model: a causal LM (a PEFT model too); left in evaluation mode (the trainer sets training mode each step).
        prompts: conversations as this package's datasets hold them (``[{"role": "user", "content": ...}]``),
            rendered with ``tokenizer``'s chat template.
        answers: the gold answer of each problem.
        k: samples per problem, ``>= 1``.
        sampling: the decoding (e.g. ``SamplingSettings.from_config(training_args)``, the rollouts').
        max_new_tokens: the completion cap; a completion cut there scores only with a complete ``\\boxed{}``.
        seed: the sampling seed; the same seed before and after training draws common random numbers, which
            narrows the paired interval.
        batch_size: completions per ``generate`` call.
        stated: score the stated answer only (``\\boxed{}`` or an ``Answer:`` line), as
            [`stated_accuracy_reward`][tandem_grpo.rewards.stated_accuracy_reward] does.

    Returns:
        ``[P][k]`` verdicts, problems in the order given.

    Raises:
        ValueError: ``k < 1``, no problems, or ``prompts`` and ``answers`` of different lengths.
    """
    if k < 1:
        raise ValueError(f"k={k!r}: at least one sample per problem.")
    if not prompts or len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts and {len(answers)} answers: give one gold answer per problem.")
    rendered = render_prompts(tokenizer, list(prompts))
    backend = TransformersBackend(model, tokenizer, batch_size=batch_size)
    completions = backend.generate([p for p in rendered for _ in range(k)], sampling, max_new_tokens=max_new_tokens,
                                   seed=seed, desc=desc)  # fmt: skip
    golds = [str(a) for a in answers for _ in range(k)]
    return by_problem(score(tokenizer, completions, golds, max_new_tokens, stated), k)
