"""Turning an authorship mask into something a person can read: spans of text and who wrote them."""

from __future__ import annotations

import html
from itertools import groupby

from .handoff import SENIOR

JUNIOR_OPEN, JUNIOR_CLOSE = "⟦", "⟧"


def authorship_spans(token_ids: list[int], authorship: list[int], tokenizer) -> list[tuple[str, int]]:
    """Merge runs of tokens by the same author into ``(text, author)`` spans (author 1 senior, 0 junior).

    A run is decoded as a whole so multi-byte characters split across tokens come out whole; special tokens
    (EOS, padding) are dropped.

    Raises:
        ValueError: ``token_ids`` and ``authorship`` differ in length.
    """
    if len(token_ids) != len(authorship):
        raise ValueError(f"{len(token_ids)} token ids but {len(authorship)} authorship entries.")
    spans = []
    position = 0
    for author, run in groupby(authorship):
        n = len(list(run))
        text = tokenizer.decode(token_ids[position : position + n], skip_special_tokens=True)
        position += n
        if text:
            spans.append((text, int(author)))
    return spans


def mark_junior_text(spans: list[tuple[str, int]]) -> str:
    """Plain text with the junior's spans in ⟦…⟧, for logs and the trainer's completions table."""
    return "".join(text if author == SENIOR else f"{JUNIOR_OPEN}{text}{JUNIOR_CLOSE}" for text, author in spans)


def spans_to_html(spans: list[tuple[str, int]]) -> str:
    """An HTML fragment: senior text in blue, junior text in orange (CSS classes ``senior`` and ``junior``)."""
    return "".join(
        f'<span class="{"senior" if author == SENIOR else "junior"}">{html.escape(text)}</span>'
        for text, author in spans
    )


def authorship_counts(authorship: list[list[int]], unit_starts: list[list[bool]]) -> list[int]:
    """``[senior tokens, tokens, junior units, units, handoffs, completions]`` summed over a batch's rows (author 1
    senior, 0 junior; a handoff is a change of author between neighbouring tokens)."""
    senior = junior_units = units = handoffs = tokens = 0
    for row, starts in zip(authorship, unit_starts, strict=True):
        tokens += len(row)
        senior += sum(row)
        units += sum(starts[: len(row)])
        junior_units += sum(1 for a, s in zip(row, starts, strict=False) if s and a == 0)
        handoffs += sum(1 for a, b in zip(row, row[1:], strict=False) if a != b)
    return [senior, tokens, junior_units, units, handoffs, len(authorship)]


def log_authorship(trainer, completion_ids: list[list[int]], authorship: list[list[int]], unit_starts) -> None:
    """Append a batch's ``tandem/senior_token_fraction``, ``tandem/junior_unit_fraction`` and
    ``tandem/handoffs_per_completion`` (summed over processes) to ``trainer``'s TRL metrics, and with
    ``log_completions`` the completions table's ``authorship`` column (the junior's words in ⟦…⟧)."""
    import torch

    mode = "train" if trainer.model.training else "eval"
    stats = torch.tensor(authorship_counts(authorship, unit_starts), dtype=torch.float64,
                         device=trainer.accelerator.device)  # fmt: skip
    senior, tokens, junior_units, units, handoffs, count = (
        trainer.accelerator.gather(stats).view(-1, 6).sum(0).tolist()
    )
    trainer._metrics[mode]["tandem/senior_token_fraction"].append(senior / max(tokens, 1))
    trainer._metrics[mode]["tandem/junior_unit_fraction"].append(junior_units / max(units, 1))
    trainer._metrics[mode]["tandem/handoffs_per_completion"].append(handoffs / max(count, 1))
    if trainer.log_completions:
        marked = [
            mark_junior_text(authorship_spans(ids, row, trainer.processing_class))
            for ids, row in zip(completion_ids, authorship, strict=True)
        ]
        trainer._log_completion_extra("authorship", marked)
