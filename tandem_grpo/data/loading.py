"""Loading math datasets (a JSON / JSON Lines file, a folder, an offline mirror, the Hugging Face Hub) as TRL-ready
conversational prompts with a gold answer column.

[`load_math_dataset`][tandem_grpo.data.load_math_dataset] returns a ``datasets.Dataset`` with exactly two columns:

* ``prompt``: a conversation ``[{"role": "user", "content": question + INSTRUCTION}]``, the format
  that TRL's ``GRPOTrainer`` renders with the tokenizer's chat template;
* ``answer``: the gold answer as a string (``"72"``, ``"27"``, ``"\\frac{\\pi}{2}"``). TRL passes
  it to the reward functions as the ``answer`` keyword (see [`tandem_grpo.rewards`][tandem_grpo.rewards]).

The row formats it accepts, detected from the fields of each row, are
[`ROW_FORMATS`][tandem_grpo.data.loading.ROW_FORMATS], one example row each.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from ..models import hub_reachable
from .answers import _format_number, _normalize_gold_string, gsm8k_gold, last_boxed
from .instructions import INSTRUCTION

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "HubDataset",
    "ROW_FORMATS",
    "ROW_FORMAT_HELP",
    "load_math_dataset",
    "to_example",
]

QUESTION_FIELDS: tuple[str, ...] = ("problem", "question", "input")
"""Fields that may hold the question, tried in this order."""

ROW_FORMATS: dict[str, dict[str, Any]] = {
    "plain": {"question": "What is 2 + 3?", "answer": "5"},
    "GSM8K (gold after `#### `, commas stripped)": {
        "question": "Mia has 12 apples and buys 7 more. How many apples does she have?",
        "answer": "She has 12 + 7 = 19 apples.\n#### 19",
    },
    "MATH, MATH-500, AIME (LaTeX answers)": {"problem": "Simplify $\\frac{6}{8}$.", "answer": "\\frac{3}{4}"},
    "Minerva Math (gold: the solution's last `\\boxed{}`)": {
        "problem": "A car travels 60 km in 1.5 hours. What is its speed in km/h?",
        "solution": "Speed is distance over time: $60 / 1.5 = \\boxed{40}$.",
    },
    "AMC (numeric answer, 27.0 read as 27)": {"problem": "What is $3^3$?", "answer": 27.0},
    "MultiArith (or `question` and `final_ans`, its hub copy)": {
        "input": "Sam had 5 pens and lost 2. How many are left?",
        "target": 3,
    },
}
"""The row formats of a ``.jsonl`` / ``.json`` file, one example row each (``docs/training.md`` prints them): the
question is the first non-empty string of ``problem``, ``question``, ``input``; the gold answer is ``answer`` (a
GSM8K solution ending in ``#### <answer>``, a string or a number), else ``target`` or ``final_ans``, else the last
``\\boxed{}`` of ``solution``. Other fields are ignored."""

ROW_FORMAT_HELP = (
    'a .jsonl file holds one JSON object a line, such as {"question": "What is 2 + 3?", "answer": "5"}: the question '
    "in 'question', 'problem' or 'input', the gold in 'answer' (GSM8K's '... #### 5' too), 'target', 'final_ans', or "
    "a 'solution' with \\boxed{5} (one example row per format: docs/training.md, tandem_grpo.data.ROW_FORMATS)"
)
"""What the command lines' ``--help`` say about the accepted rows."""

_ROW_EXAMPLE = (
    'A row reads e.g. {"question": "What is 2 + 3?", "answer": "5"}; one example row per format: docs/training.md '
    "(tandem_grpo.data.ROW_FORMATS)."
)

_HUB_DEFAULT_CONFIGS = {"openai/gsm8k": "main", "gsm8k": "main"}


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
    # datasets gives every row the union of all rows' fields, None where a row lacks one: list only those present.
    fields = ", ".join(repr(k) for k, v in row.items() if v is not None) or "none"
    return ValueError(f"{source}: row {index + 1} {problem} (fields found: {fields}). {fix}")


def _gold_from_row(row: Mapping[str, Any], index: int, source: str) -> str:
    fix = (
        "Accepted gold fields: 'answer' (a plain answer, or a GSM8K solution ending in '#### <answer>'), "
        "'target' or 'final_ans' (MultiArith), or a 'solution' containing \\boxed{<answer>} (MATH/Minerva). "
        f"Add one of these to the row or remove the row. {_ROW_EXAMPLE}"
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
    for field in ("target", "final_ans"):  # MultiArith as in MAWPS, and as on the hub (ChilleD/MultiArith)
        value = row.get(field)
        if _present(value):
            return _normalize_gold_string(value) if isinstance(value, str) else _format_number(value)
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


def to_example(row: Mapping[str, Any], index: int, source: str, instruction: str = INSTRUCTION) -> dict[str, Any]:
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
        instruction: appended to the question (default [`INSTRUCTION`][tandem_grpo.data.INSTRUCTION]).

    Returns:
        ``{"prompt": [{"role": "user", "content": question + instruction}], "answer": gold}``.

    Raises:
        ValueError: when the row is not a mapping, has no question, or has no gold answer; the message
            names ``source``, the row number (``index + 1``), the missing field and the accepted field names.
    """
    if not isinstance(row, Mapping):
        raise ValueError(
            f"{source}: row {index + 1} is a {type(row).__name__}, not a JSON object. "
            f"Each row must be a JSON object. {_ROW_EXAMPLE}"
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
            f"Put the question in a non-empty string field named 'question', 'problem' or 'input'. {_ROW_EXAMPLE}",
        )
    gold = _gold_from_row(row, index, source)
    return {
        "prompt": [{"role": "user", "content": question.strip() + instruction}],
        "answer": gold,
    }


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubDataset:
    """Where a short dataset name lives on the Hugging Face Hub.

    Attributes:
        repo_id: the hub dataset id, e.g. ``"openai/gsm8k"``.
        config: the dataset config (``name`` argument of ``datasets.load_dataset``), or None.
        splits: the splits the set has, as named on the hub.
    """

    repo_id: str
    config: str | None = None
    splits: tuple[str, ...] = ("test",)


DATASETS: dict[str, HubDataset] = {
    "gsm8k": HubDataset("openai/gsm8k", "main", ("train", "test")),
    "math500": HubDataset("HuggingFaceH4/MATH-500"),
    "minerva_math": HubDataset("math-ai/minervamath"),
    "aime24": HubDataset("math-ai/aime24"),
    "amc23": HubDataset("math-ai/amc23"),
    "multiarith": HubDataset("ChilleD/MultiArith", None, ("train", "test")),
}
"""Short names accepted by [`load_math_dataset`][tandem_grpo.data.load_math_dataset] and
``tandem-grpo evaluate --dataset``, with their hub sets."""

DATA_DIR_ENV = "TANDEM_GRPO_DATA_DIR"
"""Environment variable naming an offline mirror: a folder holding ``<short name>/<split>.jsonl`` files."""


def _hub_unreachable_fast() -> bool:
    """True when the hub's host does not resolve and ``HF_HUB_OFFLINE`` is unset: ``datasets`` would retry
    for tens of seconds before failing. (With ``HF_HUB_OFFLINE=1`` ``datasets`` reads its own cache: it is asked.)"""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    return not hub_reachable()


def _json_file_error(path: Path, err: Exception) -> ValueError:
    """Say where a JSON / JSON Lines file is broken; runs only after ``datasets`` failed to read it."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return ValueError(f"{path}: the dataset is empty (no rows). Pass a file with at least one row.")
    if path.suffix.lower() == ".jsonl" or "\n{" in text.strip():
        lines = text.splitlines()
        while lines and not lines[-1].strip():
            lines.pop()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                return ValueError(f"{path}: line {number} is blank. A .jsonl file needs one JSON object per line.")
            try:
                json.loads(line)
            except json.JSONDecodeError as bad:
                return ValueError(
                    f"{path}: row {number} is not valid JSON ({bad.msg} at column {bad.colno}). "
                    "A .jsonl file needs one JSON object per line."
                )
    else:
        try:
            json.loads(text)
        except json.JSONDecodeError as bad:
            return ValueError(f"{path}: not valid JSON ({bad.msg} at line {bad.lineno}, column {bad.colno}).")
    return ValueError(
        f"{path}: datasets.load_dataset('json') could not read it ({type(err).__name__}: {err}). Each row must be a "
        "JSON object, and a field must hold the same kind of value in every row."
    )


def _read_json_file(path: Path, split: str) -> datasets.Dataset:
    """Read a ``.jsonl`` / ``.json`` file with ``datasets``' JSON builder (cached as ``datasets`` caches).

    A ``.json`` file may hold a list of rows, JSON Lines, or an object mapping ``split`` (or ``"data"``) to a list.
    """
    if path.suffix.lower() not in (".jsonl", ".json"):
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; pass a .jsonl or .json file.")
    try:
        loaded = datasets.load_dataset("json", data_files=str(path), split="train")
        if path.suffix.lower() == ".json" and loaded.num_rows == 1:
            # An object at the top level arrives as one row whose columns are its keys.
            field = next((f for f in (split, "data") if isinstance(loaded[0].get(f), list)), None)
            if field is not None:
                loaded = datasets.load_dataset("json", data_files=str(path), field=field, split="train")
            elif split not in loaded.column_names and all(isinstance(v, list) for v in loaded[0].values()):
                raise ValueError(
                    f"{path}: a .json file must hold a list of row objects, or an object mapping the split "
                    f"({split!r}) or 'data' to such a list; found an object with keys {sorted(loaded.column_names)}."
                )
    except ValueError as err:
        if str(err).startswith(str(path)):
            raise
        raise _json_file_error(path, err) from err
    except Exception as err:  # datasets wraps reader failures in DatasetGenerationError and friends
        raise _json_file_error(path, err) from err
    return loaded


def _split_file(folder: Path, split: str, label: str) -> Path:
    for suffix in (".jsonl", ".json"):
        candidate = folder / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    available = sorted({p.stem for p in folder.glob("*.json*") if p.suffix in (".json", ".jsonl")})
    hint = ""
    if len(available) == 1:
        hint = f' Pass split="{available[0]}" (--dataset_train_split / --split on the command lines).'
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


def _load_hub(repo_id: str, config: str | None, split: str, offline_fix: str) -> datasets.Dataset:
    label = repo_id if config is None else f"{repo_id}:{config}"
    if _hub_unreachable_fast():
        raise ConnectionError(
            f"Could not load {label!r} (split {split!r}): the Hugging Face Hub cannot be reached from this machine. "
            f"{offline_fix}"
        )
    try:
        loaded = datasets.load_dataset(repo_id, config, split=split)
    except (ConnectionError, OSError) as err:
        raise ConnectionError(
            f"Could not load {label!r} (split {split!r}) from the Hugging Face Hub: the hub could not be "
            f"reached ({type(err).__name__}: {err}). {offline_fix}"
        ) from err
    except Exception as err:
        raise RuntimeError(
            f"Could not load {label!r} (split {split!r}) with datasets.load_dataset: no such dataset, config or "
            f"split, or the hub refused ({type(err).__name__}: {err}). {offline_fix}"
        ) from err
    if not isinstance(loaded, datasets.Dataset):
        raise RuntimeError(f"datasets.load_dataset({repo_id!r}, split={split!r}) returned a {type(loaded).__name__}.")
    return loaded


def _mirror_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or None
    return None if chosen is None else Path(chosen).expanduser()


def _load_short_name(name: str, split: str, data_dir: str | os.PathLike[str] | None) -> tuple[str, datasets.Dataset]:
    hub = DATASETS[name]
    mirror = _mirror_dir(data_dir)
    if mirror is not None and (mirror / name).is_dir():
        file = _split_file(mirror / name, split, f"Dataset {name!r} in the mirror {mirror}")
        return str(file), _read_json_file(file, split)
    if split not in hub.splits:
        raise ValueError(
            f"Dataset {name!r} has no {split!r} split (it has: {', '.join(hub.splits)}). Pass split={hub.splits[0]!r}."
        )
    if mirror is None:
        looked = f"No offline mirror is set (${DATA_DIR_ENV}). "
    elif not mirror.is_dir():
        looked = f"The mirror folder {mirror} does not exist. "
    else:
        looked = f"The mirror {mirror} has no {name}/ folder. "
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    cache = "" if offline else ", set HF_HUB_OFFLINE=1 to use datasets' cache"
    fix = (
        f"{looked}Offline, set {DATA_DIR_ENV} to a folder holding {name}/{split}.jsonl{cache}, or pass the path of "
        "a local .jsonl file."
    )
    return f"{hub.repo_id} ({split})", _load_hub(hub.repo_id, hub.config, split, fix)


def _resolve(
    source: str | os.PathLike[str], split: str, data_dir: str | os.PathLike[str] | None
) -> tuple[str, datasets.Dataset]:
    path = Path(source).expanduser()
    label = str(source)
    if path.is_file():
        return str(path), _read_json_file(path, split)
    if path.is_dir():
        file = _split_file(path, split, str(path))
        return str(file), _read_json_file(file, split)
    name = label.strip().lower()
    if name in DATASETS:
        return _load_short_name(name, split, data_dir)
    if _looks_like_path(label):
        raise FileNotFoundError(f"{label}: no such file or folder. Pass an existing .jsonl/.json file or folder.")
    repo_id, _, config = label.partition(":")
    fix = (
        "Pass a local .jsonl file instead (one JSON object a line), a folder holding <split>.jsonl, or one of the "
        f"short names {', '.join(DATASETS)} (offline: with ${DATA_DIR_ENV} naming a mirror folder)."
    )
    return label, _load_hub(repo_id, config or _HUB_DEFAULT_CONFIGS.get(repo_id), split, fix)


def _line_of_row(path: Path, index: int) -> int | None:
    """1-based line number of the ``index``-th non-blank line of a JSON Lines file (datasets skips blank lines)."""
    with path.open(encoding="utf-8") as handle:
        seen = -1
        for number, line in enumerate(handle, start=1):
            seen += bool(line.strip())
            if seen == index:
                return number
    return None


def _convert(rows: datasets.Dataset, source: str, limit: int | None, instruction: str) -> datasets.Dataset:
    count = rows.num_rows if limit is None else min(limit, rows.num_rows)
    examples = []
    for index in range(count):
        try:
            examples.append(to_example(rows[index], index, source, instruction))
        except ValueError as err:
            line = _line_of_row(Path(source), index) if source.endswith(".jsonl") and Path(source).is_file() else None
            if line is None or line == index + 1:
                raise
            located = str(err).replace(f"row {index + 1} ", f"row {index + 1} (line {line}) ", 1)
            raise ValueError(located) from err
    if not examples:
        raise ValueError(f"{source}: the dataset is empty (no rows). Pass a file with at least one row.")
    return datasets.Dataset.from_dict(
        {"prompt": [e["prompt"] for e in examples], "answer": [e["answer"] for e in examples]}
    )


def load_math_dataset(
    source: str | os.PathLike[str],
    split: str = "train",
    limit: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    instruction: str = INSTRUCTION,
) -> datasets.Dataset:
    """Load a math dataset as TRL conversational prompts with gold answers.

    ``source`` is resolved in this order:

    1. an existing ``.jsonl`` / ``.json`` file, read with ``datasets.load_dataset("json", ...)`` (a ``.json``
       file may hold a list of rows, JSON Lines, or an object mapping ``split`` or ``"data"`` to a list);
    2. an existing folder containing ``<split>.jsonl`` (or ``<split>.json``);
    3. a short name from [`DATASETS`][tandem_grpo.data.DATASETS] (which gives each one's hub set and splits): read
       from the offline mirror ``<data_dir>/<name>/<split>.jsonl`` when ``data_dir`` (or ``TANDEM_GRPO_DATA_DIR``)
       names a folder that holds ``<name>/``, else from the hub with ``datasets.load_dataset``, cached as
       ``datasets`` caches. No path is ever guessed: without a mirror setting, short names come from the hub;
    4. otherwise a Hugging Face Hub dataset id (``openai/gsm8k``; ``id:config`` selects a config,
       ``openai/gsm8k`` defaults to ``main``).

    All selected rows are converted and validated (see [`to_example`][tandem_grpo.data.to_example]) before the
    dataset is built, so a bad row fails here rather than in the middle of training. Extra columns are dropped.

    Args:
        source: file, folder, short name or hub id (see above).
        split: split name for folders, short names and the hub (default ``"train"``).
        limit: keep only the first ``limit`` rows (None: all); rows past the limit are not validated.
        data_dir: offline mirror folder for short names (default: ``$TANDEM_GRPO_DATA_DIR``, else none).
        instruction: appended to every question (default [`INSTRUCTION`][tandem_grpo.data.INSTRUCTION]).

    Returns:
        A ``datasets.Dataset`` with exactly the columns ``prompt`` (list of one user message) and
        ``answer`` (gold answer string).

    Raises:
        ValueError: a row without question or gold answer (the message names the source, row number and field),
            invalid JSON (with the row), an empty dataset, a split the short name does not have, or ``limit`` < 1.
        FileNotFoundError: a path that does not exist, or a split missing from a folder or the mirror.
        ConnectionError: the hub cannot be reached; the message names the offline settings.
        RuntimeError: the hub dataset could not be loaded for another reason (no such id, config or split).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}.")
    label, rows = _resolve(source, split, data_dir)
    return _convert(rows, label, limit, instruction)
