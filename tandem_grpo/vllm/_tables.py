"""The boundary tables of a tandem engine's tokenizer, as both logits processors build them (no vLLM import: the V1
and the V2 processor modules each import this, and neither imports the other)."""

from __future__ import annotations

import torch

from ..handoff import BoundaryTables


def engine_boundary_tables(
    model_config, cache: dict[int, tuple[BoundaryTables, BoundaryTables]], vocab_size: int, device: torch.device
) -> tuple[BoundaryTables, BoundaryTables]:
    """Boundary tables for senior logits ``vocab_size`` wide, on ``device`` and on the CPU, built once per width into
    ``cache``.

    Args:
        model_config: the engine's ``ModelConfig``: its tokenizer, and the EOS ids
            ([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs] put ``tandem_eos_token_ids`` in its hf_config;
            without them, [`engine_eos_token_ids`][tandem_grpo.vllm.engine.engine_eos_token_ids]).
        cache: ``{width: (tables on device, tables on the CPU)}``, filled here.
        vocab_size: the senior logits' width.
        device: where the first table of the pair lives.
    """
    if vocab_size not in cache:
        from transformers import AutoTokenizer

        cfg = model_config
        tokenizer = AutoTokenizer.from_pretrained(
            cfg.tokenizer, revision=cfg.tokenizer_revision, trust_remote_code=cfg.trust_remote_code
        )
        eos = getattr(cfg.hf_config, "tandem_eos_token_ids", None)
        if eos is None:
            from .engine import engine_eos_token_ids

            eos = engine_eos_token_ids(cfg.model, cfg.trust_remote_code)
        tables = BoundaryTables.from_tokenizer(tokenizer, vocab_size, list(eos))
        cache[vocab_size] = (tables.to(device), tables)
    return cache[vocab_size]
