"""Math datasets as TRL-ready conversational prompts with a gold answer column.

Every loader here returns a :class:`datasets.Dataset` with exactly two columns:

* ``prompt``: a conversation ``[{"role": "user", "content": question + INSTRUCTION}]``, the format
  that TRL's ``GRPOTrainer`` renders with the tokenizer's chat template;
* ``answer``: the gold answer as a string (``"72"``, ``"27"``, ``"\\frac{\\pi}{2}"``). TRL passes
  it to the reward functions as the ``answer`` keyword (see :mod:`tandem_grpo.rewards`).

Supported row formats (detected from the fields of each row):

* GSM8K: ``question`` and ``answer`` whose gold follows ``#### `` at the end (commas stripped);
* MATH / MATH-500 / AIME: ``problem`` (or ``question``) and ``answer``;
* Minerva Math: ``problem`` and ``solution``; the gold is the last ``\\boxed{...}`` of the solution;
* AMC: ``problem`` and a numeric ``answer`` such as ``27.0`` (written ``"27"``);
* MultiArith: ``input`` and an integer ``target``.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import datasets

__all__ = [
    "INSTRUCTION",
    "SHARED_DATASETS",
    "arithmetic_word_problems",
    "default_data_dir",
    "gsm8k_gold",
    "last_boxed",
    "load_math_dataset",
    "to_example",
]

INSTRUCTION = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."
"""Appended to every question: asks for step-by-step reasoning and a final answer in ``\\boxed{}``."""

SHARED_DATASETS: tuple[str, ...] = ("gsm8k", "math500", "minerva_math", "aime24", "amc23", "multiarith")
"""Short names of the sets under the shared data folder (``<data dir>/<name>/<split>.jsonl``)."""

DATA_DIR_ENV = "TANDEM_GRPO_DATA_DIR"

QUESTION_FIELDS: tuple[str, ...] = ("problem", "question", "input")
"""Fields that may hold the question, tried in this order."""

_HUB_DEFAULT_CONFIGS = {"openai/gsm8k": "main", "gsm8k": "main"}
_BOX_COMMANDS = ("\\boxed", "\\fbox")


# --------------------------------------------------------------------------------------------------
# Gold-answer helpers (also used by tandem_grpo.rewards)
# --------------------------------------------------------------------------------------------------


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index`` (escaped ``\\{``/``\\}`` ignored), or None."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # skip escaped characters such as \{ and \}
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _boxed_candidates(text: str) -> list[tuple[int, str]]:
    """All complete ``\\boxed``/``\\fbox`` contents as ``(start, content)``, in order of appearance."""
    found = []
    for command in _BOX_COMMANDS:
        for match in re.finditer(re.escape(command) + r"(?![A-Za-z])", text):
            i = match.end()
            while i < len(text) and text[i] in " \t":
                i += 1
            if i < len(text) and text[i] == "{":
                close = _matching_brace(text, i)
                if close is not None:
                    found.append((match.start(), text[i + 1 : close]))
            elif i > match.end():
                # The brace-less form "\boxed 5": a single token.
                token = re.match(r"[^\s$]+", text[i:])
                if token:
                    found.append((match.start(), token.group(0)))
    return sorted(found)


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``, stripped.

    Nested braces are handled (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``), as is the brace-less
    ``\\boxed 5``. A box whose closing brace is missing (a truncated generation) is ignored.

    Returns:
        The content (possibly ``""`` for an empty ``\\boxed{}``), or None when there is no complete box.
    """
    if not isinstance(text, str):
        return None
    candidates = _boxed_candidates(text)
    if not candidates:
        return None
    return candidates[-1][1].strip()


def gsm8k_gold(answer_text: str) -> str:
    """The gold answer of a GSM8K ``answer`` field: the text after the last ``#### ``, commas removed.

    Example: ``"... so she has 1,080 cents.\\n#### 1,080"`` gives ``"1080"``.

    Raises:
        ValueError: when there is no ``####`` marker or nothing after it.
    """
    if not isinstance(answer_text, str) or "####" not in answer_text:
        raise ValueError(
            "GSM8K answer has no '#### <answer>' line at the end; got "
            f"{str(answer_text)[-80:]!r}. GSM8K-style rows end their 'answer' field with '#### <number>'."
        )
    gold = answer_text.rsplit("####", 1)[1].strip()
    gold = gold.replace(",", "").strip()
    if gold.startswith("$"):
        gold = gold[1:].strip()
    gold = gold.rstrip(".").strip()
    if not gold:
        raise ValueError("GSM8K answer has nothing after its '####' marker.")
    return gold


def _format_number(value: int | float) -> str:
    """``27.0`` -> ``"27"``, ``2.5`` -> ``"2.5"``, ``7`` -> ``"7"``."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        if value.is_integer():
            return str(int(value))
        return repr(value)
    return str(value)


def _normalize_gold_string(text: str) -> str:
    """Strip whitespace; write integral numbers without leading zeros or ``.0`` (``"025"`` -> ``"25"``)."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return str(int(text))
    if re.fullmatch(r"-?\d+\.0+", text):
        return str(int(float(text)))
    return text


# --------------------------------------------------------------------------------------------------
# Row conversion
# --------------------------------------------------------------------------------------------------


def _present(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int)


def _row_error(source: str, index: int, row: Mapping[str, Any], problem: str, fix: str) -> ValueError:
    fields = ", ".join(repr(k) for k in row) or "none"
    return ValueError(f"{source}: row {index + 1} {problem} (fields found: {fields}). {fix}")


def _gold_from_row(row: Mapping[str, Any], index: int, source: str) -> str:
    fix = (
        "Accepted gold fields: 'answer' (a plain answer, or a GSM8K solution ending in '#### <answer>'), "
        "'target' (MultiArith), or a 'solution' containing \\boxed{<answer>} (MATH/Minerva). "
        "Add one of these to the row or remove the row."
    )
    answer = row.get("answer")
    if _present(answer):
        if isinstance(answer, str):
            if "####" in answer:
                try:
                    return gsm8k_gold(answer)
                except ValueError as err:
                    raise _row_error(source, index, row, f"has an unusable GSM8K 'answer': {err}", fix) from err
            return _normalize_gold_string(answer)
        return _format_number(answer)
    target = row.get("target")
    if _present(target):
        return _normalize_gold_string(target) if isinstance(target, str) else _format_number(target)
    solution = row.get("solution")
    if _present(solution) and isinstance(solution, str):
        boxed = last_boxed(solution)
        if boxed:
            return boxed
        raise _row_error(
            source, index, row, "has no gold answer: its 'solution' field contains no non-empty \\boxed{...}", fix
        )
    if answer is not None and not _present(answer):
        problem = f"has no gold answer: the 'answer' field is empty or not a string/number ({answer!r})"
    else:
        problem = "has no gold answer: missing field 'answer' (or 'target', or 'solution' with \\boxed{})"
    raise _row_error(source, index, row, problem, fix)


def to_example(row: Mapping[str, Any], index: int, source: str) -> dict[str, Any]:
    """Convert one raw dataset row into a TRL conversational example.

    The row format is detected from its fields: the question is the first non-empty string among
    ``problem``, ``question``, ``input``; the gold answer comes from ``answer`` (GSM8K ``#### <n>`` suffix
    parsed, numbers such as ``27.0`` written ``"27"``), else ``target``, else the last ``\\boxed{...}`` in
    ``solution``.

    Args:
        row: the raw row (a mapping of field name to value).
        index: 0-based position of the row in its source (for a JSONL file, its 0-based line index).
            Errors report it 1-based, i.e. as the line number of a JSONL file.
        source: where the row comes from (a path or dataset name), used in error messages.

    Returns:
        ``{"prompt": [{"role": "user", "content": question + INSTRUCTION}], "answer": gold}``.

    Raises:
        ValueError: when the row is not a mapping, has no question, or has no gold answer; the message
            names ``source``, the row number (``index + 1``), the missing field and the accepted field names.
    """
    if not isinstance(row, Mapping):
        raise ValueError(
            f"{source}: row {index + 1} is a {type(row).__name__}, not a JSON object. "
            'Each row must be an object such as {"question": ..., "answer": ...}.'
        )
    question = next(
        (row[f] for f in QUESTION_FIELDS if isinstance(row.get(f), str) and row[f].strip()),
        None,
    )
    if question is None:
        raise _row_error(
            source,
            index,
            row,
            "has no question: missing field 'question' (or 'problem', or 'input'), or it is empty",
            "Put the question text in a non-empty string field named 'question', 'problem' or 'input'.",
        )
    gold = _gold_from_row(row, index, source)
    return {
        "prompt": [{"role": "user", "content": question.strip() + INSTRUCTION}],
        "answer": gold,
    }


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def _data_dir_candidates() -> list[Path]:
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return [Path(env).expanduser()]
    repo_root = Path(__file__).resolve().parents[1]
    candidates = [Path.cwd().parent / "shared" / "data", repo_root.parent / "shared" / "data"]
    unique: list[Path] = []
    for candidate in candidates:
        if candidate.resolve() not in [u.resolve() for u in unique]:
            unique.append(candidate)
    return unique


def default_data_dir() -> Path | None:
    """The shared data folder: ``$TANDEM_GRPO_DATA_DIR`` if set, else the first existing of
    ``<cwd>/../shared/data`` and ``<repo>/../shared/data``; None when none exists."""
    for candidate in _data_dir_candidates():
        if candidate.is_dir():
            return candidate
    return None


def _read_jsonl(path: Path, limit: int | None) -> list[tuple[int, Any]]:
    """``(0-based line index, parsed row)`` for each non-blank line, stopping after ``limit`` rows."""
    rows: list[tuple[int, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for line_index, line in enumerate(handle):
            if not line.strip():
                continue
            try:
                rows.append((line_index, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}: row {line_index + 1} is not valid JSON ({err.msg} at column {err.colno}). "
                    "A .jsonl file needs one JSON object per line."
                ) from err
            if limit is not None and len(rows) >= limit:
                break
    return rows


def _read_json(path: Path, split: str, limit: int | None) -> list[tuple[int, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # JSON Lines saved with a .json suffix (e.g. Dataset.to_json)
            return _read_jsonl(path, limit)
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}).") from err
    if isinstance(data, Mapping):
        if isinstance(data.get(split), list):
            data = data[split]
        elif isinstance(data.get("data"), list):
            data = data["data"]
        else:
            raise ValueError(
                f"{path}: a .json file must hold a list of row objects, or an object mapping the split "
                f"({split!r}) or 'data' to such a list; found an object with keys {sorted(data)[:10]}."
            )
    if not isinstance(data, list):
        raise ValueError(f"{path}: a .json file must hold a list of row objects, found {type(data).__name__}.")
    rows = list(enumerate(data))
    return rows if limit is None else rows[:limit]


def _read_file(path: Path, split: str, limit: int | None) -> list[tuple[int, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path, limit)
    if suffix == ".json":
        return _read_json(path, split, limit)
    raise ValueError(f"{path}: unsupported file type {path.suffix!r}; pass a .jsonl or .json file.")


def _split_file(folder: Path, split: str, label: str) -> Path:
    for suffix in (".jsonl", ".json"):
        candidate = folder / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    available = sorted({p.stem for p in folder.glob("*.json*") if p.suffix in (".json", ".jsonl")})
    hint = f' Pass split="{available[0]}".' if len(available) == 1 else ""
    raise FileNotFoundError(
        f"{label} has no {split!r} split: {folder / (split + '.jsonl')} does not exist "
        f"(available splits: {', '.join(available) or 'none'}).{hint}"
    )


def _looks_like_path(source: str) -> bool:
    return (
        source.lower().endswith((".jsonl", ".json"))
        or source.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or os.path.isabs(source)
    )


def _load_hub_rows(source: str, split: str, limit: int | None) -> list[tuple[int, Any]]:
    repo_id, _, config = source.partition(":")
    config = config or _HUB_DEFAULT_CONFIGS.get(repo_id)
    fix = (
        "Pass a local .jsonl file instead (one JSON object a line), a folder holding <split>.jsonl, or one of "
        f"the shared names {', '.join(SHARED_DATASETS)} (looked up in ${DATA_DIR_ENV} or ../shared/data)."
    )
    try:
        loaded = datasets.load_dataset(repo_id, config, split=split)
    except (ConnectionError, TimeoutError) as err:
        raise ConnectionError(
            f"Could not load {source!r} (split {split!r}) from the Hugging Face Hub: the hub could not be "
            f"reached ({type(err).__name__}: {err}). {fix}"
        ) from err
    except Exception as err:
        raise RuntimeError(
            f"Could not load {source!r} (split {split!r}) with datasets.load_dataset: the hub could not be "
            f"reached or has no such dataset/split ({type(err).__name__}: {err}). {fix}"
        ) from err
    if not isinstance(loaded, datasets.Dataset):
        raise RuntimeError(f"datasets.load_dataset({repo_id!r}, split={split!r}) returned a {type(loaded).__name__}.")
    if limit is not None and limit < len(loaded):
        loaded = loaded.select(range(limit))
    return list(enumerate(loaded))


def _resolve_rows(source: str | os.PathLike[str], split: str, limit: int | None) -> tuple[str, list[tuple[int, Any]]]:
    path = Path(source).expanduser()
    label = str(source)
    if path.is_file():
        return str(path), _read_file(path, split, limit)
    if path.is_dir():
        file = _split_file(path, split, str(path))
        return str(file), _read_file(file, split, limit)

    name = str(source).strip().lower()
    if name in SHARED_DATASETS:
        searched = _data_dir_candidates()
        for data_dir in searched:
            if (data_dir / name).is_dir():
                file = _split_file(data_dir / name, split, f"Shared dataset {name!r}")
                return str(file), _read_file(file, split, limit)
        raise FileNotFoundError(
            f"Shared dataset {name!r} not found: looked for {name}/ in "
            f"{', '.join(str(d) for d in searched)}. Set ${DATA_DIR_ENV} to the folder holding "
            f"{name}/<split>.jsonl, or pass the path of a .jsonl file."
        )
    if _looks_like_path(label):
        raise FileNotFoundError(f"{label}: no such file or folder. Pass an existing .jsonl/.json file or folder.")
    return label, _load_hub_rows(label, split, limit)


def _convert(rows: Iterable[tuple[int, Any]], source: str) -> datasets.Dataset:
    examples = [to_example(row, index, source) for index, row in rows]
    if not examples:
        raise ValueError(f"{source}: the dataset is empty (no rows). Pass a file with at least one row.")
    return datasets.Dataset.from_dict(
        {"prompt": [e["prompt"] for e in examples], "answer": [e["answer"] for e in examples]}
    )


def load_math_dataset(
    source: str | os.PathLike[str], split: str = "train", limit: int | None = None
) -> datasets.Dataset:
    """Load a math dataset as TRL conversational prompts with gold answers.

    ``source`` is resolved in this order:

    1. an existing ``.jsonl`` / ``.json`` file (a ``.json`` file may hold a list of rows, an object
       mapping ``split`` to a list, or JSON Lines);
    2. an existing folder containing ``<split>.jsonl`` (or ``<split>.json``);
    3. a shared short name (``gsm8k``, ``math500``, ``minerva_math``, ``aime24``, ``amc23``,
       ``multiarith``), read from ``<data dir>/<name>/<split>.jsonl`` where the data dir is
       ``$TANDEM_GRPO_DATA_DIR`` if set, else ``../shared/data`` next to the working directory or next to
       the repository. Only ``gsm8k`` has a ``train`` split; the others need ``split="test"``;
    4. otherwise a Hugging Face Hub dataset id (``openai/gsm8k``; ``id:config`` selects a config,
       ``openai/gsm8k`` defaults to ``main``) loaded with :func:`datasets.load_dataset`.

    All selected rows are converted and validated (see :func:`to_example`) before the dataset is built,
    so a bad row fails here rather than in the middle of training. Extra columns are dropped.

    Args:
        source: file, folder, shared name or hub id (see above).
        split: split name for folders, shared names and the hub (default ``"train"``).
        limit: keep only the first ``limit`` rows (None: all). Rows past the limit are not read.

    Returns:
        A :class:`datasets.Dataset` with exactly the columns ``prompt`` (list of one user message) and
        ``answer`` (gold answer string).

    Raises:
        ValueError: a row without question or gold answer (message names the source, row number and
            field), invalid JSON, an empty dataset, or ``limit`` < 1.
        FileNotFoundError: a path that does not exist, a missing split, or a shared set not found.
        ConnectionError: the hub could not be reached (pass a local ``.jsonl`` path instead).
        RuntimeError: the hub dataset could not be loaded for another reason.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}.")
    label, rows = _resolve_rows(source, split, limit)
    return _convert(rows, label)


# --------------------------------------------------------------------------------------------------
# Built-in arithmetic word problems
# --------------------------------------------------------------------------------------------------

_NAMES: tuple[tuple[str, str], ...] = (
    ("Mia", "she"),
    ("Liam", "he"),
    ("Emma", "she"),
    ("Noah", "he"),
    ("Olivia", "she"),
    ("Lucas", "he"),
    ("Ava", "she"),
    ("Ethan", "he"),
    ("Sofia", "she"),
    ("Leo", "he"),
    ("Zoe", "she"),
    ("Omar", "he"),
)
_OBJECTS: tuple[str, ...] = (
    "apples",
    "marbles",
    "stickers",
    "pencils",
    "cookies",
    "books",
    "balloons",
    "shells",
    "stamps",
    "oranges",
    "toy cars",
    "crayons",
)

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


def arithmetic_word_problems(num_problems: int = 1000, seed: int = 0) -> datasets.Dataset:
    """A built-in set of easy two-operand arithmetic word problems (no download).

    Each problem applies one of ``+``, ``-``, ``*`` to two small whole numbers (sums of 2..20 and 2..20,
    differences from 5..30 with a positive result, products of 2..9 and 2..9) in a varied template with
    names and objects, e.g. "Mia has 12 apples and buys 7 more. How many apples does she have now?".
    Easy enough for a ~135M-parameter instruct model to solve some of the time.

    Args:
        num_problems: number of problems (>= 1, default 1000).
        seed: random seed; the same seed always gives the same problems, in the same order.

    Returns:
        A :class:`datasets.Dataset` with columns ``prompt`` and ``answer`` (as :func:`load_math_dataset`).

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
        prompts.append([{"role": "user", "content": question + INSTRUCTION}])
        answers.append(str(result))
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": answers})
