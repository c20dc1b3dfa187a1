"""The junior: vocabulary checks and loading (frozen, on the senior's device and dtype)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .models import resolve_model_path


def logits_width(config) -> int:
    return int(config.get_text_config().vocab_size)


def check_same_vocabulary(senior_tokenizer, junior_tokenizer, senior_width: int, junior_width: int) -> None:
    """Raise unless senior and junior share one vocabulary: same logits width and the same token string per id.

    Raises:
        ValueError: naming the two widths, or the first differing ids with both token strings, and the fix.
    """
    fix = "Pick a junior trained with the senior's tokenizer (e.g. a smaller model of the same family)."
    if senior_width != junior_width:
        raise ValueError(
            f"Senior and junior vocabularies differ in size: the senior's logits have {senior_width} entries, the "
            f"junior's {junior_width}. Tandem generation mixes the two distributions token by token. {fix}"
        )
    senior_vocab, junior_vocab = senior_tokenizer.get_vocab(), junior_tokenizer.get_vocab()
    senior_by_id = {i: t for t, i in senior_vocab.items()}
    junior_by_id = {i: t for t, i in junior_vocab.items()}
    differing = [
        i for i in sorted(set(senior_by_id) | set(junior_by_id)) if senior_by_id.get(i) != junior_by_id.get(i)
    ]
    if differing:
        examples = ", ".join(f"id {i}: {senior_by_id.get(i)!r} vs {junior_by_id.get(i)!r}" for i in differing[:5])
        raise ValueError(
            f"Senior and junior tokenizers map {len(differing)} ids to different tokens ({examples}; senior first). "
            f"{fix}"
        )


def check_junior_vocabulary(senior_tokenizer, senior_width: int, junior_name_or_path: str) -> str:
    """Check a junior by its tokenizer and config alone (cheap: no weights loaded); return its resolved path."""
    path = resolve_model_path(junior_name_or_path)
    junior_tokenizer = AutoTokenizer.from_pretrained(path)
    junior_width = logits_width(AutoConfig.from_pretrained(path))
    check_same_vocabulary(senior_tokenizer, junior_tokenizer, senior_width, junior_width)
    return path


def load_frozen(path: str, dtype: torch.dtype, device: torch.device | str) -> PreTrainedModel:
    """Load a causal LM in eval mode with gradients off, in ``dtype`` on ``device``."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return freeze(model)


def freeze(model: PreTrainedModel) -> PreTrainedModel:
    model.eval()
    model.requires_grad_(False)
    return model
