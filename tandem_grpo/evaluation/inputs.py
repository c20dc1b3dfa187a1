"""The inputs of an evaluation run, checked before any weights load: the problems of every dataset, each model's
tokenizer and vocabulary against the junior's, the vLLM senior slot's shapes; and the prompts and verdicts every
measurement shares. Errors are [`EvaluationError`][tandem_grpo.evaluation.config.EvaluationError]s naming the
argument."""

from __future__ import annotations

from ..data import INSTRUCTIONS
from .config import EvaluationConfig, EvaluationError


def load_problems(config: EvaluationConfig) -> tuple[list, list[str], list[str]]:
    """Every dataset of ``config.dataset`` in order, the first ``config.limit`` problems of each; returns the
    prompts, the gold answers and each problem's benchmark name (its ``--dataset`` string), aligned."""
    from ..data import load_math_dataset

    prompts, golds, benchmarks = [], [], []
    sources = config.datasets()
    for source in sources:
        where = f"--dataset {source!r}" if len(sources) == 1 else f"--dataset {source!r} (of {', '.join(sources)})"
        try:
            dataset = load_math_dataset(source, split=config.split, limit=config.limit,
                                        instruction=INSTRUCTIONS[config.instruction])  # fmt: skip
        except (ValueError, OSError, RuntimeError) as err:
            raise EvaluationError(f"{where} (split {config.split!r}) could not be loaded: {err}") from err
        if len(dataset) == 0:
            raise EvaluationError(f"{where} (split {config.split!r}) is empty: nothing to evaluate.")
        prompts += list(dataset["prompt"])
        golds += [str(a) for a in dataset["answer"]]
        benchmarks += [source] * len(dataset)
    return prompts, golds, benchmarks


def check_vocabularies(models: dict, junior_path: str) -> dict:
    """Tokenizer and logits width of every model (``{key: m}`` with ``m.path``, ``m.resolved``) against the
    junior's; returns ``{key: tokenizer}``."""
    from transformers import AutoConfig, AutoTokenizer

    from ..junior import check_same_vocabulary, logits_width

    tokenizers, widths = {}, {}
    for key, m in models.items():
        try:
            tokenizers[key] = AutoTokenizer.from_pretrained(m.resolved)
            widths[key] = logits_width(AutoConfig.from_pretrained(m.resolved))
        except (OSError, ValueError) as err:
            raise EvaluationError(f"Cannot read the tokenizer/config of {m.path!r} ({m.resolved}): {err}") from err
    for key, m in models.items():
        if key == junior_path:
            continue
        try:
            check_same_vocabulary(tokenizers[key], tokenizers[junior_path], widths[key], widths[junior_path])
        except ValueError as err:
            raise EvaluationError(
                f"Checkpoint {m.path!r} and junior {models[junior_path].path!r} have different vocabularies: {err}"
            ) from err
    return tokenizers


def check_senior_slot(models: list) -> None:
    """``--backend vllm`` swaps every non-junior model into one engine's senior slot: their shapes must match."""
    from transformers import AutoConfig

    def shape(m) -> tuple:
        text = AutoConfig.from_pretrained(m.resolved).get_text_config()
        names = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads")
        return (type(text).__name__, *(getattr(text, n, None) for n in names))

    first = shape(models[0])
    for m in models[1:]:
        if shape(m) != first:
            raise EvaluationError(
                f"--backend vllm loads every checkpoint into one engine's senior slot, but {m.path!r} has another "
                f"architecture or size than {models[0].path!r} ({shape(m)} vs {first}); use --backend transformers."
            )


def render_prompts(tokenizer, prompts: list) -> list[list[int]]:
    """Chat-template each conversation (with the assistant header) and tokenize it without extra specials."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def score(
    tokenizer, completions: list[list[int]], golds_per_row: list[str], max_new_tokens: int, stated: bool = False
) -> list[bool]:
    """Each completion's verdict against its row's gold answer, by the training reward's rule
    ([`is_correct`][tandem_grpo.rewards.is_correct]; ``stated``: the stated answer only, ``--answer stated``)."""
    from ..rewards import is_correct

    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    # The training reward's rule: a completion cut off at the length cap only scores with a complete \boxed{}.
    return [
        is_correct(t, g, truncated=len(ids) >= max_new_tokens, stated=stated)
        for t, g, ids in zip(texts, golds_per_row, completions, strict=True)
    ]
