"""The tandem logits processor driven directly (no engine): mixture, state tracking, corrections, penalties.

Needs the ``vllm`` package (for its ``BatchUpdate``/``SamplingParams`` types) but no model: a tiny tokenizer and
random logits, so it runs in seconds. The reference is :mod:`tandem_grpo.handoff` applied step by step.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import skip_without_vllm

skip_without_vllm()

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from tandem_grpo.handoff import (  # noqa: E402
    BoundaryTables,
    HandoffRule,
    advance,
    boundary_mask,
    init_state,
    mixture_logprobs,
)
from tandem_grpo.vllm._slot import put_junior_logits  # noqa: E402
from tandem_grpo.vllm.processor import TandemLogitsProcessor, pop_records, tandem_extra_args  # noqa: E402

pytestmark = pytest.mark.vllm


def _processor(tables: BoundaryTables) -> TandemLogitsProcessor:
    hf_config = SimpleNamespace(architectures=["TandemForCausalLM"])
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config))
    processor = TandemLogitsProcessor(config, torch.device("cpu"), False)
    processor._tables = (tables, tables)  # what the processor would build from the engine's tokenizer
    return processor


def _penalize(logits, prompt, outputs, repetition):
    from vllm._custom_ops import apply_repetition_penalties_torch

    logits = logits.clone().unsqueeze(0)
    vocab = logits.shape[-1]
    prompt_mask = torch.zeros(1, vocab, dtype=torch.bool)
    prompt_mask[0, prompt] = True
    output_mask = torch.zeros(1, vocab, dtype=torch.bool)
    if outputs:
        output_mask[0, outputs] = True
    apply_repetition_penalties_torch(logits, prompt_mask, output_mask, torch.tensor([repetition]))
    return logits[0]


@pytest.mark.parametrize("granularity", ["word", "sentence", "token"])
def test_processor_follows_the_handoff_rule(tiny_tokenizer, granularity):
    vocab = len(tiny_tokenizer)
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, vocab, [1])
    processor = _processor(tables)
    rule = HandoffRule(granularity, 0.5, 3)
    temperature, repetition = 0.7, 1.3
    seeds = [11, 12, 13]
    uids = [f"u-{granularity}-{s}" for s in seeds]
    prompts = [[2, 3], [4], [5, 6, 7]]
    outputs: list[list[int]] = [[], [], []]
    params = [
        SamplingParams(
            temperature=temperature, repetition_penalty=repetition, extra_args=tandem_extra_args(s, u, rule)
        )
        for s, u in zip(seeds, uids, strict=True)
    ]
    plain = SamplingParams(temperature=temperature)  # a non-tandem request in the same batch
    processor.update_state(
        BatchUpdate(
            batch_size=4,
            removed=[],
            added=[(0, params[0], prompts[0], outputs[0]), (1, plain, [2], []), (2, params[1], prompts[1], outputs[1]),
                   (3, params[2], prompts[2], outputs[2])],
            moved=[],
        )
    )  # fmt: skip
    rows = {0: 0, 2: 1, 3: 2}  # batch row -> request
    state = init_state(torch.tensor(seeds), rule)
    authors: list[list[int]] = [[], [], []]
    generator = torch.Generator().manual_seed(0)
    for step in range(10):
        if step == 5:  # rows 0 and 3 swap places in the persistent batch
            processor.update_state(
                BatchUpdate(batch_size=4, removed=[], added=[], moved=[(0, 3, MoveDirectionality.SWAP)])
            )
            rows = {3: 0, 2: 1, 0: 2}
        senior_raw = 3 * torch.randn(4, vocab, generator=generator)
        junior_raw = 3 * torch.randn(4, vocab, generator=generator)
        given = senior_raw.clone()  # vLLM hands over the senior's logits after its penalties and temperature
        for row, k in rows.items():
            given[row] = _penalize(senior_raw[row], prompts[k], outputs[k], repetition)
        given /= temperature
        put_junior_logits(junior_raw)
        out = processor.apply(given.clone())

        order = [rows_k for rows_k in sorted(rows, key=rows.get)]
        senior_lp = torch.log_softmax(given[order], dim=-1)
        junior_pen = torch.stack(
            [_penalize(junior_raw[r], prompts[rows[r]], outputs[rows[r]], repetition) for r in order]
        )
        junior_lp = torch.log_softmax(junior_pen / temperature, dim=-1)
        expected = mixture_logprobs(senior_lp, junior_lp, state, boundary_mask(state, tables, rule))
        torch.testing.assert_close(out[order], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[1], given[1])  # the plain request is untouched

        tokens = torch.multinomial(torch.softmax(expected, dim=-1), 1, generator=generator).squeeze(1)
        new_state, author, _ = advance(state, tokens, tables, rule)
        for k, (tok, a) in enumerate(zip(tokens.tolist(), author.tolist(), strict=True)):
            outputs[k].append(tok)
            authors[k].append(a)
            if a == 1:  # the senior's own log-prob = vLLM's (mixture) log-prob + the processor's correction
                record = processor.rows[order[k]].record
                senior_own = senior_lp[k, tok].item()
                assert senior_own == pytest.approx(expected[k, tok].item() + record.corrections[step], abs=1e-4)
        state = new_state

    records = pop_records(uids)
    for k, uid in enumerate(uids):
        assert records[uid]["authors"] == authors[k][:-1]  # the last token is never advanced over
        assert len(records[uid]["corrections"]) == 10
    assert pop_records(uids) == {uid: None for uid in uids}


def test_processor_resumes_a_preempted_request(tiny_tokenizer):
    """A request vLLM preempts and re-adds with its outputs folded into the prompt keeps its coin stream."""
    vocab = len(tiny_tokenizer)
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, vocab, [1])
    processor = _processor(tables)
    rule = HandoffRule("word", 0.5, 2)
    params = SamplingParams(extra_args=tandem_extra_args(7, "resume", rule))
    prompt, outputs = [2, 3], []
    processor.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params, prompt, outputs)], moved=[]))
    state = init_state(torch.tensor([7]), rule)
    generator = torch.Generator().manual_seed(1)
    tokens_so_far = []
    for step in range(8):
        if step == 4:
            processor.update_state(BatchUpdate(batch_size=0, removed=[0], added=[], moved=[]))
            outputs = []
            resumed_prompt = prompt + tokens_so_far
            processor.update_state(
                BatchUpdate(batch_size=1, removed=[], added=[(0, params, resumed_prompt, outputs)], moved=[])
            )
        put_junior_logits(torch.randn(1, vocab, generator=generator))
        out = processor.apply(torch.randn(1, vocab, generator=generator))
        assert int(processor.rows[0].record.unit_index) == int(state.unit_index[0])
        token = torch.multinomial(torch.softmax(out, dim=-1), 1, generator=generator).squeeze(1)
        state, _, _ = advance(state, token, tables, rule)
        tokens_so_far.append(int(token))
        outputs.append(int(token))
    assert len(pop_records(["resume"])["resume"]["authors"]) == 7
