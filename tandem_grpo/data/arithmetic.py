"""A built-in set of easy two-operand arithmetic word problems: no download, the same problems for the same seed."""

from __future__ import annotations

import random
from collections.abc import Callable

import datasets

from .instructions import INSTRUCTION

__all__ = ["BUILTIN_TASKS", "arithmetic_chains", "arithmetic_word_problems", "builtin_problems", "builtin_split"]

_NAMES: tuple[tuple[str, str], ...] = (
    ("Mia", "she"), ("Liam", "he"), ("Emma", "she"), ("Noah", "he"), ("Olivia", "she"), ("Lucas", "he"),
    ("Ava", "she"), ("Ethan", "he"), ("Sofia", "she"), ("Leo", "he"), ("Zoe", "she"), ("Omar", "he"),
)  # fmt: skip
_OBJECTS: tuple[str, ...] = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "balloons", "shells",
                             "stamps", "oranges", "toy cars", "crayons")  # fmt: skip

# Each template uses {a} and {b} once each (the two operands, in that order) and may use {name},
# {friend}, {pron} (she/he), {Pron} (She/He) and {objs} (a plural noun).
_ARITHMETIC_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": (
        "{name} has {a} {objs} and buys {b} more. How many {objs} does {pron} have now?",
        "{name} picked {a} {objs} in the morning and {b} {objs} in the afternoon. "
        "How many {objs} did {pron} pick in total?",
        "There are {a} {objs} in a basket. {name} puts {b} more {objs} in the basket. "
        "How many {objs} are in the basket now?",
        "{name} has {a} {objs}. {friend} gives {name} {b} more {objs}. How many {objs} does {name} have now?",
    ),
    "-": (
        "{name} has {a} {objs} and gives {b} of them to {friend}. How many {objs} does {name} have left?",
        "{name} had {a} {objs}. {Pron} lost {b} of them. How many {objs} does {pron} have now?",
        "There were {a} {objs} on the table. {name} took {b} of them away. How many {objs} are left on the table?",
        "{name} wants to collect {a} {objs}. {Pron} already has {b}. How many more {objs} does {pron} need?",
    ),
    "*": (
        "{name} has {a} boxes. Each box holds {b} {objs}. How many {objs} does {name} have in total?",
        "{name} buys {a} packs of {objs}. Each pack has {b} {objs}. How many {objs} did {pron} buy?",
        "There are {a} bags with {b} {objs} in each bag. How many {objs} are there in all?",
        "{name} gives {a} friends {b} {objs} each. How many {objs} does {pron} give away?",
    ),
}


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "+":
        return rng.randint(2, 20), rng.randint(2, 20)
    if op == "-":
        a = rng.randint(5, 30)
        return a, rng.randint(1, a - 1)
    return rng.randint(2, 9), rng.randint(2, 9)


def arithmetic_word_problems(
    num_problems: int = 1000, seed: int = 0, instruction: str = INSTRUCTION
) -> datasets.Dataset:
    """A built-in set of easy two-operand arithmetic word problems (no download).

    Each problem applies one of ``+``, ``-``, ``*`` to two small whole numbers (sums of 2..20 and 2..20,
    differences from 5..30 with a positive result, products of 2..9 and 2..9) in a varied template with
    names and objects, e.g. "Mia has 12 apples and buys 7 more. How many apples does she have now?".
    Easy enough for a ~135M-parameter instruct model to solve some of the time.

    Args:
        num_problems: number of problems (>= 1, default 1000).
        seed: random seed; the same seed always gives the same problems, in the same order.
        instruction: appended to each question (default [`INSTRUCTION`][tandem_grpo.data.INSTRUCTION]; the main
            job uses [`ONE_LINE_INSTRUCTION`][tandem_grpo.data.ONE_LINE_INSTRUCTION]).

    Returns:
        A ``datasets.Dataset`` with columns ``prompt`` and ``answer`` (as
        [`load_math_dataset`][tandem_grpo.data.load_math_dataset]).

    Raises:
        ValueError: if ``num_problems`` < 1.
    """
    if isinstance(num_problems, bool) or not isinstance(num_problems, int) or num_problems < 1:
        raise ValueError(f"num_problems must be a positive integer, got {num_problems!r}.")
    rng = random.Random(seed)
    ops = tuple(_ARITHMETIC_TEMPLATES)
    prompts, answers = [], []
    for _ in range(num_problems):
        op = rng.choice(ops)
        template = rng.choice(_ARITHMETIC_TEMPLATES[op])
        a, b = _operands(rng, op)
        (name, pron), (friend, _) = rng.sample(_NAMES, 2)
        question = template.format(
            a=a, b=b, name=name, friend=friend, pron=pron, Pron=pron.capitalize(), objs=rng.choice(_OBJECTS)
        )
        result = a + b if op == "+" else a - b if op == "-" else a * b
        prompts.append([{"role": "user", "content": question + instruction}])
        answers.append(str(result))
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": answers})


# Multi-step problems: a starting amount, then ``num_steps - 1`` changes, then the question. Each change uses
# {b} once and may use {pron}, {Pron}, {friend}, {objs}; the solution is one equation per change.
_CHAIN_STARTS: tuple[str, ...] = (
    "{name} has {a} {objs}.",
    "{name} starts the day with {a} {objs}.",
    "There are {a} {objs} in {name}'s bag.",
)
_CHAIN_CHANGES: dict[str, tuple[str, ...]] = {
    "+": ("{Pron} buys {b} more.", "{friend} gives {pron_obj} {b} more.", "{Pron} finds {b} more."),
    "-": ("{Pron} gives {b} to {friend}.", "{Pron} loses {b} of them.", "{Pron} eats {b} of them."),
}
_CHAIN_FOOD = ("cookies", "oranges", "apples")


def arithmetic_chains(
    num_problems: int = 1000,
    num_steps: int = 3,
    seed: int = 0,
    instruction: str = INSTRUCTION,
    *,
    max_amount: int = 60,
    max_change: int = 20,
) -> datasets.Dataset:
    """Built-in multi-step arithmetic word problems (no download): a starting amount, then ``num_steps - 1``
    additions or subtractions, each in its own sentence, e.g. "Mia has 12 apples. She buys 7 more. She gives 5 to
    Liam. How many apples does she have now?" (12 + 7 = 19, 19 - 5 = 14).

    The solution has one equation per change, which is what a step of the paper's handoff protocol (steps split on
    blank lines) can hold when the instruction asks for one step per paragraph
    (for instance the one of `bench/pilot_task.py`).

    Args:
        num_problems: number of problems (>= 1, default 1000).
        num_steps: numbers in the chain, the start included (>= 2, default 3).
        seed: random seed; the same seed always gives the same problems, in the same order.
        instruction: appended to each question (default [`INSTRUCTION`][tandem_grpo.data.INSTRUCTION]).
        max_amount: largest amount at any point, the answer included (>= 10, default 60); the start is at most
            half of it.
        max_change: largest number added or subtracted (>= 1, default 20).

    Returns:
        A ``datasets.Dataset`` with columns ``prompt`` and ``answer`` (as
        [`load_math_dataset`][tandem_grpo.data.load_math_dataset]). Every amount is between 1 and ``max_amount``;
        every change between 1 and ``max_change``.

    Raises:
        ValueError: if ``num_problems`` < 1, ``num_steps`` < 2, ``max_amount`` < 10 or ``max_change`` < 1.
    """
    checks = (("num_problems", num_problems, 1), ("num_steps", num_steps, 2), ("max_amount", max_amount, 10),
              ("max_change", max_change, 1))  # fmt: skip
    for name, value, least in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")
    rng = random.Random(seed)
    prompts, answers = [], []
    for _ in range(num_problems):
        (name, pron), (friend, _) = rng.sample(_NAMES, 2)
        objs = rng.choice(_OBJECTS)
        fill = {"name": name, "friend": friend, "pron": pron, "Pron": pron.capitalize(), "objs": objs,
                "pron_obj": "her" if pron == "she" else "him"}  # fmt: skip
        amount = rng.randint(3, max_amount // 2)
        sentences = [rng.choice(_CHAIN_STARTS).format(a=amount, **fill)]
        for _ in range(num_steps - 1):
            op = "-" if amount >= max_amount else "+" if amount < 2 else rng.choice("+-")
            high = min(max_change, max_amount - amount) if op == "+" else min(max_change, amount - 1)
            b = rng.randint(1, high)
            changes = [c for c in _CHAIN_CHANGES[op] if "eats" not in c or objs in _CHAIN_FOOD]
            sentences.append(rng.choice(changes).format(b=b, **fill))
            amount = amount + b if op == "+" else amount - b
        sentences.append(f"How many {objs} does {name} have now?")
        prompts.append([{"role": "user", "content": " ".join(sentences) + instruction}])
        answers.append(str(amount))
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": answers})


BUILTIN_TASKS: dict[str, Callable[..., datasets.Dataset]] = {
    "two_operand": arithmetic_word_problems,
    "chain2": lambda num_problems, seed, instruction: arithmetic_chains(num_problems, 2, seed, instruction),
    "chain2_small": lambda num_problems, seed, instruction: arithmetic_chains(
        num_problems, 2, seed, instruction, max_amount=20, max_change=9
    ),
    "chain3_small": lambda num_problems, seed, instruction: arithmetic_chains(
        num_problems, 3, seed, instruction, max_amount=20, max_change=9
    ),
}
"""The built-in problem families by name, each ``(num_problems, seed, instruction) -> Dataset``: ``two_operand``
([`arithmetic_word_problems`][tandem_grpo.data.arithmetic_word_problems]); ``chain2`` (a start and one change, amounts
up to 60, changes up to 20); ``chain2_small`` and ``chain3_small`` (one or two changes, amounts up to 20, changes up to
9) ([`arithmetic_chains`][tandem_grpo.data.arithmetic_chains]). ``bench/pilot_task.py`` measures the base model on
each."""


def builtin_problems(task: str, num_problems: int, seed: int = 0, instruction: str = INSTRUCTION) -> datasets.Dataset:
    """``num_problems`` problems of the built-in family ``task`` ([`BUILTIN_TASKS`][tandem_grpo.data.BUILTIN_TASKS]).

    Raises:
        ValueError: an unknown ``task`` (naming the families), or a bad ``num_problems``.
    """
    if task not in BUILTIN_TASKS:
        raise ValueError(f"Unknown built-in task {task!r}; choose one of {', '.join(BUILTIN_TASKS)}.")
    return BUILTIN_TASKS[task](num_problems, seed, instruction)


def builtin_split(
    task: str,
    num_train: int,
    num_held_out: int,
    seed: int = 0,
    instruction: str = INSTRUCTION,
    held_out_after: int | None = None,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Training problems and held-out problems of the built-in family ``task``, from one generator stream.

    The held-out problems are the stream's next ones after its first ``held_out_after`` (default ``num_train``) that
    occur neither among those nor earlier in the held-out set, up to ``num_held_out`` (the small operand ranges repeat
    problems, so the stream is drawn generously). The first ``min(num_train, held_out_after)`` problems of the stream
    train (with the default, the same rows as ``builtin_problems(task, num_train, seed, instruction)``); a
    ``num_train`` beyond ``held_out_after`` continues with the stream's problems after the held-out ones, skipping any
    that is held out. So a longer training (``num_train`` 180, ``held_out_after`` 60) keeps the held-out problems of a
    shorter one (``num_train`` 60) and its first 60 training problems.

    Returns:
        ``(train, held_out)``, both in this package's two-column format (``prompt``, ``answer``); ``held_out`` may be
        shorter than ``num_held_out`` when the family has too few distinct problems.

    Raises:
        ValueError: as [`builtin_problems`][tandem_grpo.data.builtin_problems], ``num_held_out < 0`` or
            ``held_out_after < 1``.
    """
    if num_held_out < 0:
        raise ValueError(f"num_held_out={num_held_out!r} must be >= 0.")
    after = num_train if held_out_after is None else held_out_after
    if after < 1:
        raise ValueError(f"held_out_after={held_out_after!r} must be >= 1.")
    extra = max(0, num_train - after)
    stream = builtin_problems(task, after + 4 * num_held_out + 64 + 2 * extra, seed=seed, instruction=instruction)
    contents = [prompt[0]["content"] for prompt in stream["prompt"]]
    seen = set(contents[: min(num_train, after)])
    keep: list[int] = []
    index = after
    while index < len(contents) and len(keep) < num_held_out:
        if contents[index] not in seen:
            seen.add(contents[index])
            keep.append(index)
        index += 1
    held_out = {contents[i] for i in keep}
    later = [i for i in range(index, len(contents)) if contents[i] not in held_out][:extra]
    if len(later) < extra:
        raise ValueError(f"the {task!r} stream ran out of training problems after the held-out ones "
                         f"({len(later)} of {extra}): lower num_train.")  # fmt: skip
    return stream.select([*range(min(num_train, after)), *later]), stream.select(keep)
