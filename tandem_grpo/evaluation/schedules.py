"""Handoff-robustness schedules (paper section 5.2), the senior paired with the frozen junior at inference: the
training rule ([`training_rule_schedule`][tandem_grpo.evaluation.schedules.training_rule_schedule]), one model's
first ``s`` steps continued by the other ([`step_schedule`][tandem_grpo.evaluation.schedules.step_schedule]) and the
paper's alternating protocol ([`alternating_schedule`][tandem_grpo.evaluation.schedules.alternating_schedule]); each
returns per-token authorship (1 = senior, 0 = junior) and is scored as solo capability
(docs/api/evaluation/schedules.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..backends import GenerationBackend, cut_at_eos, stop_length, strip_eos
from ..handoff import JUNIOR, SENIOR, HandoffRule
from ..sampling import SamplingSettings, derive_seed
from .stats import bootstrap_mean, by_problem
from .steps import handover_region


@dataclass
class ScheduleOutput:
    """Completions of one schedule, one per prompt row.

    Attributes:
        name: e.g. ``"word_p0.5"``, ``"senior_first_s2"``.
        completion_ids: token ids of each completion, cut after EOS.
        authorship: same shapes as ``completion_ids``; 1 = senior wrote the token, 0 = junior.
        handed_over: for step schedules, whether the row was continued by the second model (``False``: the first
            model's completion had ``s`` steps or fewer and stands unchanged); for the alternating schedule, whether
            the junior wrote any of it; ``None`` for the training rule.
        settings: what produced the completions (for ``results.json``).
        turns: for the alternating schedule, the number of turns (steps) of each row; ``None`` otherwise.
    """

    name: str
    completion_ids: list[list[int]]
    authorship: list[list[int]]
    handed_over: list[bool] | None = None
    settings: dict = field(default_factory=dict)
    turns: list[int] | None = None

    def senior_token_fraction(self) -> float:
        """Share of all completion tokens written by the senior (NaN without tokens)."""
        total = sum(len(a) for a in self.authorship)
        return sum(sum(a) for a in self.authorship) / total if total else float("nan")

    def exhausted_fraction(self) -> float | None:
        """Share of rows where the schedule named more steps than the first completion had (no handover)."""
        if self.handed_over is None:
            return None
        return 1.0 - sum(self.handed_over) / len(self.handed_over) if self.handed_over else float("nan")


TRAINING_RULE_SCHEDULE = "word"
"""The ``--schedules`` value of [`training_rule_schedule`][tandem_grpo.evaluation.schedules.training_rule_schedule],
whatever the rule's granularity. Named after the paper's word units; kept, with ``results.json``'s ``"kind":
"word_handoff"``, because command lines and committed results carry it."""


def training_rule_schedule_name(rule: HandoffRule) -> str:
    """The results key of the training-rule schedule: ``"<granularity>_p<junior_probability>"``, e.g.
    ``"word_p0.5"``."""
    return f"{rule.granularity}_p{rule.junior_probability:g}"


@torch.no_grad()
def training_rule_schedule(
    backend: GenerationBackend,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingSettings,
    rule: HandoffRule,
    *,
    max_new_tokens: int,
    seed: int = 0,
    desc: str = "tandem",
) -> ScheduleOutput:
    """Schedule (a): one [`tandem`][tandem_grpo.backends.GenerationBackend.tandem] call of the senior's
    ``backend`` with the run's junior under the training ``rule`` (paper section 3), one completion per prompt row.
    Returns its [`ScheduleOutput`][tandem_grpo.evaluation.schedules.ScheduleOutput] with the recorded authorship."""
    rollout = backend.tandem(prompts, sampling, rule, max_new_tokens=max_new_tokens, seed=seed, desc=desc)
    # "word_handoff": a serialized value, committed results.json files carry it.
    settings = {"kind": "word_handoff", "granularity": rule.granularity, "junior_probability": rule.junior_probability,
                "max_gap_tokens": rule.max_gap_tokens, "backend": backend.name}  # fmt: skip
    name = training_rule_schedule_name(rule)
    return ScheduleOutput(name, rollout.completion_ids, rollout.authorship, settings=settings)


def handover_token_index(ids: Sequence[int], tokenizer, start: int, end: int) -> int:
    """The number ``0 < n <= len(ids)`` of leading tokens of ``ids`` (a completion without EOS) that the first
    model keeps before the separator region ``[start, end]`` of
    [`handover_region`][tandem_grpo.evaluation.steps.handover_region] (character offsets).

    Token boundaries are the decoded lengths ``len(decode(ids[:n]))`` (special tokens kept, no clean-up). The cut is
    the last boundary inside the region, so the second model writes all of the next step, its first word included;
    when one token spans the whole region, the first boundary at or after ``end``, so step ``s`` is never split.
    """

    def decode(n: int) -> str:
        return tokenizer.decode(list(ids[:n]), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def boundary(n: int) -> int:
        return len(decode(n))

    full = decode(len(ids))

    def clean(n: int) -> bool:
        # A prefix that ends inside a multi-byte character decodes to U+FFFD, which is no real boundary.
        return full.startswith(decode(n))

    # Decoded length grows with n (up to a transient U+FFFD mid-character): bisect for the last n <= end.
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if boundary(mid) <= end:
            lo = mid
        else:
            hi = mid - 1
    n = lo
    while n > 0 and not clean(n):
        n -= 1
    if n > 0 and boundary(n) >= start:
        return n
    n = lo + 1
    while n < len(ids) and not (boundary(n) >= end and clean(n)):
        n += 1
    return n


def schedule_name(first: str, num_steps: int) -> str:
    """``"senior_first_s<k>"`` or ``"junior_first_s<k>"``."""
    return f"{first}_first_s{num_steps}"


def step_schedule(
    prompts: Sequence[Sequence[int]],
    first_completions: Sequence[Sequence[int]],
    num_steps: int,
    *,
    first: str,
    continuation: GenerationBackend,
    tokenizer,
    sampling: SamplingSettings,
    max_new_tokens: int,
    seed: int = 0,
    desc: str | None = None,
) -> ScheduleOutput:
    """Schedule (b): the first model's first ``num_steps`` reasoning steps, then the other model to the end.

    Each row's first completion (e.g. the solo sample, so every ``s`` of a grid is paired) keeps its tokens up to the
    separator after step ``num_steps`` verbatim
    ([`handover_token_index`][tandem_grpo.evaluation.schedules.handover_token_index]); ``continuation`` samples
    from ``prompt + prefix`` with the rest of the ``max_new_tokens`` budget. A row with ``num_steps`` steps or fewer
    (nothing to hand over) stands unchanged, ``handed_over`` ``False``.

    Args:
        prompts: token-id prompts, one per row.
        first_completions: the first model's completions, one per row.
        num_steps: ``s >= 1``.
        first: ``"senior"`` or ``"junior"`` (who wrote ``first_completions``).
        continuation: backend of the other model.
        max_new_tokens: the length cap of the whole completion.
        seed: continuation seed (derived per schedule).

    Returns:
        [`ScheduleOutput`][tandem_grpo.evaluation.schedules.ScheduleOutput] named by
        [`schedule_name`][tandem_grpo.evaluation.schedules.schedule_name]; authorship is the first author on the prefix
        and the other on the continuation.

    Raises:
        ValueError: ``first`` not ``"senior"``/``"junior"``, ``num_steps < 1``, or rows that do not match.
    """
    if first not in ("senior", "junior"):
        raise ValueError(f"first={first!r} must be 'senior' or 'junior'.")
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps!r} must be >= 1; s=0 is the second model alone (its solo score).")
    if len(prompts) != len(first_completions):
        raise ValueError(f"{len(prompts)} prompts but {len(first_completions)} first completions.")
    first_author, second_author = (SENIOR, JUNIOR) if first == "senior" else (JUNIOR, SENIOR)
    prefixes: list[list[int] | None] = []
    for ids in first_completions:
        body = strip_eos(ids, set(continuation.eos_token_ids))
        text = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        region = handover_region(text, num_steps)
        prefixes.append(None if region is None else body[: handover_token_index(body, tokenizer, *region)])

    rows = [i for i, p in enumerate(prefixes) if p is not None]
    caps = [max_new_tokens - len(prefixes[i]) for i in rows]
    cont_prompts = [list(prompts[i]) + prefixes[i] for i in rows]
    name = schedule_name(first, num_steps)
    continued = (
        continuation.generate(
            cont_prompts,
            sampling,
            max_new_tokens=[max(1, c) for c in caps],
            seed=derive_seed(seed, name),
            desc=desc or name,
        )
        if rows
        else []
    )
    completion_ids = [list(c) for c in first_completions]
    authorship = [[first_author] * len(c) for c in first_completions]
    for i, cont, cap in zip(rows, continued, caps, strict=True):
        cont = cut_at_eos(cont, continuation.eos_token_ids, cap)
        completion_ids[i] = prefixes[i] + cont
        authorship[i] = [first_author] * len(prefixes[i]) + [second_author] * len(cont)
    return ScheduleOutput(
        name=name,
        completion_ids=completion_ids,
        authorship=authorship,
        handed_over=[p is not None for p in prefixes],
        settings={"kind": "steps", "first": first, "num_steps": num_steps},
    )


ALTERNATING = "alternating"
"""The name of the paper's handoff protocol in ``results.json``."""

STEP_STOP = ("\n\n",)
"""What ends a reasoning step in the alternating protocol: a blank line (the authors' ``stop=["\\n\\n"]``)."""

MAX_ROUNDS = 150
"""Rounds (one senior turn and one junior turn each) before the alternating protocol gives up on a row; the
authors' ``MAX_ROUNDS``."""


def alternating_schedule(
    prompts: Sequence[Sequence[int]],
    senior: GenerationBackend,
    junior: GenerationBackend,
    tokenizer,
    sampling: SamplingSettings,
    *,
    max_new_tokens: int,
    stop: Sequence[str] = STEP_STOP,
    max_rounds: int = MAX_ROUNDS,
    seed: int = 0,
    desc: str | None = None,
) -> ScheduleOutput:
    """Schedule (c), the paper's handoff protocol (the authors' ``eval/handoff.py``, CSSLab/Tandem-RLVR): senior
    first, then one reasoning step each, in turn.

    Each turn samples from the prompt plus everything written so far until a ``stop`` string (kept), within what is
    left of the one ``max_new_tokens`` budget; a row ends when the budget is spent or a turn ends without the stop
    string (EOS: the model has answered). Rows still open after ``max_rounds`` rounds (one senior and one junior turn
    each) are counted in ``settings["unfinished_rows"]``. Two deliberate departures from the authors: the tokens
    written so far pass on as they are (they re-tokenize text), so authorship is exact per token; and any EOS id ends
    the row (their loop passes the turn on when vLLM stops at another stop token, e.g. Qwen's ``<|endoftext|>``).

    Args:
        prompts: token-id prompts (chat template applied), one completion each (repeat rows for k samples).
        tokenizer: the shared tokenizer (finds stop strings).
        seed: each turn's draws use ``derive_seed(seed, "alternating", round, author)``.
        desc: progress-bar label prefix.

    Returns:
        [`ScheduleOutput`][tandem_grpo.evaluation.schedules.ScheduleOutput] named ``"alternating"``, with authorship
        per token, ``handed_over`` (the junior wrote something) and ``turns`` per row.

    Raises:
        ValueError: ``max_new_tokens < 1``, ``max_rounds < 1`` or no stop string.
    """
    if max_new_tokens < 1 or max_rounds < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} and max_rounds={max_rounds} must be >= 1.")
    if not stop or not all(stop):
        raise ValueError(f"stop={list(stop)!r}: the protocol needs a non-empty string that ends a step.")
    n = len(prompts)
    ids: list[list[int]] = [[] for _ in range(n)]
    authors: list[list[int]] = [[] for _ in range(n)]
    turn = [SENIOR] * n
    turns = [0] * n
    done = [False] * n
    for round_ in range(max_rounds):
        if all(done):
            break
        for author, backend in ((SENIOR, senior), (JUNIOR, junior)):
            active = [i for i in range(n) if not done[i] and turn[i] == author]
            if not active:
                continue
            caps = [max_new_tokens - len(ids[i]) for i in active]
            segments = backend.generate(
                [list(prompts[i]) + ids[i] for i in active],
                sampling,
                max_new_tokens=caps,
                seed=derive_seed(seed, ALTERNATING, round_, author),
                desc=f"{desc or ALTERNATING} round {round_ + 1} {'senior' if author == SENIOR else 'junior'}",
                stop=stop,
            )
            for i, segment, cap in zip(active, segments, caps, strict=True):
                segment = list(segment[:cap])
                ids[i] += segment
                authors[i] += [author] * len(segment)
                turns[i] += 1
                at_stop = bool(segment) and stop_length(segment, tokenizer, stop) == len(segment)
                if len(ids[i]) >= max_new_tokens or not at_stop:
                    done[i] = True
                else:
                    turn[i] = 1 - author
    return ScheduleOutput(
        name=ALTERNATING,
        completion_ids=ids,
        authorship=authors,
        handed_over=[JUNIOR in a for a in authors],
        turns=turns,
        settings={
            "kind": ALTERNATING,
            "first": "senior",
            "stop": list(stop),
            "max_rounds": max_rounds,
            "budget_tokens": max_new_tokens,
            "unfinished_rows": sum(not d for d in done),
        },
    )


def authorship_shares(out: ScheduleOutput, k: int, *, confidence: float = 0.95, seed: int = 0) -> dict:
    """Who wrote a schedule's ``P * k`` completions (problem-major), with bootstrap intervals over problems.

    Returns:
        ``{"senior_share": ..., "handed_over_share": ...}``, each an interval dict or ``None`` when no problem has a
        value: per problem, the senior's share of its tokens (problems without tokens left out), and the share of
        its rows that changed hands (``out.handed_over`` where the schedule has it, else both models wrote in the
        row); then the mean over problems.
    """
    rows_handed = out.handed_over or [0 in a and 1 in a for a in out.authorship]
    per_problem_share, per_problem_handed = [], []
    for rows, handed in zip(by_problem(out.authorship, k), by_problem(rows_handed, k), strict=True):
        tokens = sum(len(a) for a in rows)
        if tokens:
            per_problem_share.append(sum(sum(a) for a in rows) / tokens)
        per_problem_handed.append(sum(map(bool, handed)) / len(handed))

    def estimate(values: list[float]) -> dict | None:
        return bootstrap_mean(values, confidence, seed=seed).to_dict() if values else None

    return {"senior_share": estimate(per_problem_share), "handed_over_share": estimate(per_problem_handed)}
