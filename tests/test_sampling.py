"""The shared sampling settings, the one truncation of the mixture, and the EOS rule (fast, no model)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tandem_grpo.sampling import SamplingSettings, default_eos_token_ids, truncate_logprobs


def _transformers_truncation(logprobs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """transformers' warpers in the order ``generate`` applies them: top-k, top-p, min-p."""
    steps = LogitsProcessorList()
    if top_k:
        steps.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        steps.append(TopPLogitsWarper(top_p))
    if min_p:
        steps.append(MinPLogitsWarper(min_p))
    return torch.log_softmax(steps(torch.zeros(1, 1, dtype=torch.long), logprobs), dim=-1)


def _kept(logprobs: torch.Tensor) -> list[list[int]]:
    return [torch.isfinite(row).nonzero().squeeze(1).tolist() for row in logprobs]


def test_top_p_comes_before_min_p():
    """The order matters: after min-p the mass is renormalized and top-p would cut the second token."""
    probs = torch.tensor([[0.45, 0.35, 0.05, 0.05, 0.05, 0.05]])
    out = truncate_logprobs(probs.log(), top_p=0.5, min_p=0.5)
    assert _kept(out) == [[0, 1]]
    torch.testing.assert_close(out.exp()[0, :2], torch.tensor([0.45, 0.35]) / 0.8)
    min_p_first = truncate_logprobs(truncate_logprobs(probs.log(), min_p=0.5), top_p=0.5)
    assert _kept(min_p_first) == [[0]]


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"), [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.1), (12, 0.85, 0.05)]
)
def test_truncation_matches_transformers_warpers(top_k, top_p, min_p):
    generator = torch.Generator().manual_seed(0)
    logprobs = torch.log_softmax(2.5 * torch.randn(64, 40, generator=generator, dtype=torch.float64), dim=-1)
    out = truncate_logprobs(logprobs, top_k, top_p, min_p)
    expected = _transformers_truncation(logprobs, top_k, top_p, min_p)
    assert _kept(out) == _kept(expected)
    torch.testing.assert_close(out, expected)
    if top_p < 1.0 and min_p > 0.0:  # the data tells the orders apart, so a swapped order fails this test
        swapped = truncate_logprobs(truncate_logprobs(logprobs, top_k, min_p=min_p), top_p=top_p)
        assert _kept(swapped) != _kept(expected)


def test_per_row_settings_equal_one_call_per_row():
    generator = torch.Generator().manual_seed(1)
    logprobs = torch.log_softmax(2.0 * torch.randn(4, 30, generator=generator), dim=-1)
    settings = [(0, 1.0, 0.0), (3, 1.0, 0.0), (0, 0.7, 0.2), (10, 0.9, 0.05)]
    out = truncate_logprobs(
        logprobs,
        torch.tensor([k for k, _, _ in settings]),
        torch.tensor([p for _, p, _ in settings]),
        torch.tensor([m for _, _, m in settings]),
    )
    for row, (k, p, m) in enumerate(settings):
        torch.testing.assert_close(out[row : row + 1], truncate_logprobs(logprobs[row : row + 1], k, p, m))
    assert len(_kept(out[1:2])[0]) == 3 and len(_kept(out[0:1])[0]) == 30


def test_impossible_tokens_stay_impossible_and_one_token_always_survives():
    logprobs = torch.tensor([[0.0, float("-inf"), -50.0, -60.0]])
    out = truncate_logprobs(logprobs, top_k=3, top_p=1e-6, min_p=1.0)
    assert _kept(out) == [[0]] and out[0, 0].item() == 0.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 0.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1), ("min_p", 1.5), ("repetition_penalty", 0)],
)
def test_settings_reject_values_out_of_range(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        SamplingSettings(**{field: value})


def test_settings_read_trl_fields():
    trl_like = SimpleNamespace(temperature=0.7, top_p=0.9, top_k=None, min_p=None, repetition_penalty=1.1)
    settings = SamplingSettings.from_config(trl_like)
    assert settings == SamplingSettings(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.1)
    from trl import GRPOConfig

    defaults = SamplingSettings.from_config(GRPOConfig(output_dir="unused", bf16=False))
    assert defaults == SamplingSettings()  # TRL's defaults are these defaults


def test_eos_ids_follow_trls_rule():
    tokenizer = SimpleNamespace(eos_token_id=2)
    assert default_eos_token_ids(tokenizer, SimpleNamespace(eos_token_id=[7, 2])) == [7, 2]
    assert default_eos_token_ids(tokenizer, SimpleNamespace(eos_token_id=7)) == [2, 7]
    assert default_eos_token_ids(tokenizer, SimpleNamespace(eos_token_id=None)) == [2]
    assert default_eos_token_ids(SimpleNamespace(eos_token_id=None), None) == []
    assert default_eos_token_ids(tokenizer) == [2]
