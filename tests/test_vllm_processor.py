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

from tandem_grpo.generation import next_token_logprobs  # noqa: E402
from tandem_grpo.handoff import (  # noqa: E402
    BoundaryTables,
    HandoffRule,
    HandoffState,
    advance,
    boundary_mask,
    handoff_rows,
    init_state,
    mixture_logprobs,
)
from tandem_grpo.sampling import SamplingSettings, truncate_logprobs  # noqa: E402
from tandem_grpo.vllm._slot import put_junior_logits  # noqa: E402
from tandem_grpo.vllm.processor_v1 import TandemLogitsProcessor  # noqa: E402
from tandem_grpo.vllm.request_args import TEMPERATURE_KEY, tandem_extra_args  # noqa: E402
from tandem_grpo.vllm.side_records import STATE_FIELDS, Record, pack_state, pop_records, unpack_state  # noqa: E402

pytestmark = pytest.mark.vllm


def _processor(tables: BoundaryTables) -> TandemLogitsProcessor:
    hf_config = SimpleNamespace(architectures=["TandemForCausalLM"])
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config))
    processor = TandemLogitsProcessor(config, torch.device("cpu"), False)
    for width in range(tables.vocab_size, tables.vocab_size + 8):  # what it would build from the engine's tokenizer
        processor._tables[width] = tables
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


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
@pytest.mark.parametrize("granularity", ["word", "sentence", "token"])
def test_processor_follows_the_handoff_rule(tiny_tokenizer, granularity, mode):
    vocab = len(tiny_tokenizer)
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, vocab, [1])
    processor = _processor(tables)
    rule = HandoffRule(granularity, 0.5, 3, mode)
    temperature, repetition = 0.7, 1.3
    seeds = [11, 12, 13]
    uids = [f"u-{granularity}-{mode}-{s}" for s in seeds]
    prompts = [[2, 3], [4], [5, 6, 7]]
    outputs: list[list[int]] = [[], [], []]
    # The older request form: no tandem_temperature, the temperature in SamplingParams (vLLM applies it to the senior).
    params = [
        SamplingParams(
            temperature=temperature,
            repetition_penalty=repetition,
            extra_args={k: v for k, v in tandem_extra_args(s, u, rule).items() if k != TEMPERATURE_KEY},
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
    handoffs = 0
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
            record = processor.record(order[k])
            if mode == "whole_unit":  # the records against their definition (module docstring)
                b = boundary_mask(state, tables, rule)[k]
                switching = bool(handoff_rows(state, boundary_mask(state, tables, rule))[k])
                to_senior = int(state.next_owner[k]) == 1
                want_c = -torch.logsumexp(junior_lp[k][b], 0).item() if switching and to_senior else 0.0
                want_h = torch.logsumexp(senior_lp[k][b], 0).item() if switching and not to_senior else None
                assert record.corrections[step] == pytest.approx(want_c, abs=1e-5)
                got_h = record.handovers[step]
                assert (want_h is None and got_h != got_h) or got_h == pytest.approx(want_h, abs=1e-5)
                handoffs += int(switching)
            elif a == 1:  # the senior's own log-prob = vLLM's (mixture) log-prob + the processor's correction
                senior_own = senior_lp[k, tok].item()
                assert senior_own == pytest.approx(expected[k, tok].item() + record.corrections[step], abs=1e-4)
        state = new_state

    records = pop_records(uids)
    for k, uid in enumerate(uids):
        assert records[uid]["authors"] == authors[k][:-1]  # the last token is never advanced over
        assert len(records[uid]["corrections"]) == 10
    assert pop_records(uids) == {uid: None for uid in uids}
    if mode == "whole_unit" and granularity == "word":
        assert handoffs > 0, "the steps must reach handoffs within B"


def test_state_layout_round_trips_between_state_tensor_and_record():
    """One layout (STATE_FIELDS) for the processor's state tensor, the HandoffState it unpacks to and a record."""
    state = HandoffState(
        owner=torch.tensor([1, 0]),
        next_owner=torch.tensor([0, 1]),
        unit_length=torch.tensor([3, 7]),
        unit_index=torch.tensor([2, 9]),
        unit_ended=torch.tensor([True, False]),
        seeds=torch.tensor([11, 12]),
    )
    packed = pack_state(state)
    assert packed.dtype == torch.long and packed.shape == (2, len(STATE_FIELDS))
    back = unpack_state(packed, state.seeds)
    for name in (*STATE_FIELDS, "seeds"):
        assert torch.equal(getattr(back, name), getattr(state, name)), name
    record = Record(uid="u", seed=12, rule=HandoffRule("word"), prompt_len=1, owner=1, next_owner=1)
    record.set_state_row(packed[1].tolist())
    assert (record.owner, record.next_owner, record.unit_length, record.unit_index) == (0, 1, 7, 9)
    assert record.unit_ended is False and record.state_row() == packed[1].tolist()


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
        assert processor.record(0).unit_index == int(state.unit_index[0])
        token = torch.multinomial(torch.softmax(out, dim=-1), 1, generator=generator).squeeze(1)
        state, _, _ = advance(state, token, tables, rule)
        tokens_so_far.append(int(token))
        outputs.append(int(token))
    assert len(pop_records(["resume"])["resume"]["authors"]) == 7


def test_processor_mixes_and_truncates_like_the_transformers_loop(tiny_model_dirs, tiny_tokenizer):
    """Same logits and state in, same distribution out: the processor (junior logits 3 columns wider, padding that
    copies real word starts) and :func:`tandem_grpo.generation.next_token_logprobs` (what ``tandem_generate`` draws
    from), at word granularity with a junior that differs from the senior and temperature, top-k, top-p and min-p all
    set (the request form ``request_fields`` sends: temperature 1, the real one in the extra args)."""
    from transformers import AutoModelForCausalLM

    senior, junior = (AutoModelForCausalLM.from_pretrained(path).eval() for path in tiny_model_dirs)
    vocab = len(tiny_tokenizer)
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, vocab, [1])
    processor = _processor(tables)
    rule = HandoffRule("word", 0.5, 32)
    sampling = SamplingSettings(temperature=1.5, top_k=12, top_p=0.8, min_p=0.1)
    seeds = [21, 22, 23, 24]
    prompts = [tiny_tokenizer(text).input_ids for text in ("ab c", "d e", "f.\ng", "h")]
    outputs: list[list[int]] = [[] for _ in seeds]
    params = [
        SamplingParams(temperature=1.0, extra_args=tandem_extra_args(s, f"mix-{s}", rule, sampling)) for s in seeds
    ]
    TandemLogitsProcessor.validate_params(params[0])
    added = [(k, params[k], prompts[k], outputs[k]) for k in range(len(seeds))]
    processor.update_state(BatchUpdate(batch_size=len(seeds), removed=[], added=added, moved=[]))
    state = init_state(torch.tensor(seeds), rule)
    generator = torch.Generator().manual_seed(0)
    order_matters = 0

    def last_logits(model) -> torch.Tensor:
        with torch.no_grad():
            rows = [model(torch.tensor([p + o])).logits[:, -1] for p, o in zip(prompts, outputs, strict=True)]
        return torch.cat(rows)

    for _ in range(12):
        senior_logits, junior_logits = last_logits(senior), last_logits(junior)
        padded = torch.cat([junior_logits, junior_logits[:, 10:13]], dim=1)  # ids 25-27 copy " a", " b", " c"
        put_junior_logits(padded)
        out = processor.apply(senior_logits.clone())  # vLLM's temperature is 1: the processor applies the real one

        expected = next_token_logprobs(senior_logits, junior_logits, state, tables, rule, sampling, history=None)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        plain = SamplingSettings(temperature=sampling.temperature)
        untruncated = next_token_logprobs(senior_logits, junior_logits, state, tables, rule, plain, None)
        min_p_first = truncate_logprobs(truncate_logprobs(untruncated, min_p=sampling.min_p), 12, sampling.top_p)
        order_matters += int((torch.isfinite(min_p_first) != torch.isfinite(expected)).any())

        tokens = torch.multinomial(torch.softmax(expected, dim=-1), 1, generator=generator).squeeze(1)
        state, _, _ = advance(state, tokens, tables, rule)
        for k, token in enumerate(tokens.tolist()):
            outputs[k].append(token)
    assert order_matters > 0, "the steps must tell the truncation orders apart"
    assert int(state.unit_index.min()) > 1 and bool((state.owner == 0).any())  # real handoffs, to the junior too
    pop_records([f"mix-{s}" for s in seeds])


def test_padding_columns_of_the_senior_get_no_probability(tiny_tokenizer):
    vocab = len(tiny_tokenizer)
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, vocab, [1])
    processor = _processor(tables)
    params = SamplingParams(extra_args=tandem_extra_args(3, "padding", HandoffRule("word", 0.5, 32)))
    processor.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params, [2, 3], [])], moved=[]))
    senior = torch.randn(1, vocab + 5)
    senior[0, vocab:] = 100.0  # padding rows whose logits would win every draw
    put_junior_logits(torch.randn(1, vocab))
    out = processor.apply(senior)
    assert bool(torch.isinf(out[0, vocab:]).all()) and bool(torch.isfinite(out[0, :vocab]).all())
    torch.testing.assert_close(out[0, :vocab].exp().sum(), torch.tensor(1.0))
    pop_records(["padding"])


def test_async_scheduling_placeholder_is_refused(tiny_tokenizer):
    """vLLM's async scheduling appends -1 for a token not sampled yet: the state would lag one token behind."""
    vocab = len(tiny_tokenizer)
    processor = _processor(BoundaryTables.from_tokenizer(tiny_tokenizer, vocab, [1]))
    params = SamplingParams(extra_args=tandem_extra_args(5, "async", HandoffRule("word", 0.5, 32)))
    outputs: list[int] = []
    processor.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params, [2, 3], outputs)], moved=[]))
    put_junior_logits(torch.randn(1, vocab))
    processor.apply(torch.randn(1, vocab))
    outputs.append(-1)
    put_junior_logits(torch.randn(1, vocab))
    with pytest.raises(RuntimeError, match="async scheduling is on.*async_scheduling=False"):
        processor.apply(torch.randn(1, vocab))
    assert processor.record(0).position == 0  # nothing was advanced over the placeholder
    pop_records(["async"])


def test_tandem_requests_keep_vllms_own_truncation_off():
    extra = tandem_extra_args(0, "truncation", HandoffRule(), SamplingSettings(top_k=5, top_p=0.9, min_p=0.1))
    TandemLogitsProcessor.validate_params(SamplingParams(extra_args=extra))
    for field in ({"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}):
        with pytest.raises(ValueError, match="truncate the mixture in the logits processor"):
            TandemLogitsProcessor.validate_params(SamplingParams(**field, extra_args=extra))
    with pytest.raises(ValueError, match="top_p=1.5"):
        TandemLogitsProcessor.validate_params(SamplingParams(extra_args={**extra, "tandem_top_p": 1.5}))


def _steady_batch(tables: BoundaryTables, rows: int, mode: str):
    """A processor with ``rows`` tandem requests after a few steps, each with one new token to advance over."""
    vocab = tables.vocab_size
    processor = _processor(tables)
    rule = HandoffRule("word", 0.5, 4, mode)
    outputs: list[list[int]] = [[] for _ in range(rows)]
    uids = [f"steady-{mode}-{rows}-{k}" for k in range(rows)]
    added = [
        (k, SamplingParams(extra_args=tandem_extra_args(k, uids[k], rule, SamplingSettings(0.8))), [2, 3], outputs[k])
        for k in range(rows)
    ]
    processor.update_state(BatchUpdate(batch_size=rows, removed=[], added=added, moved=[]))
    generator = torch.Generator().manual_seed(rows)

    def step() -> None:
        put_junior_logits(torch.randn(rows, vocab, generator=generator))
        out = processor.apply(torch.randn(rows, vocab, generator=generator))
        for k, token in enumerate(torch.multinomial(out.softmax(-1), 1, generator=generator).squeeze(1).tolist()):
            outputs[k].append(token)

    for _ in range(4):
        step()
    put_junior_logits(torch.randn(rows, vocab, generator=generator))
    return processor, torch.randn(rows, vocab, generator=generator), uids


_SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")


def _count_apply(processor, logits, monkeypatch) -> tuple[int, int]:
    """(host syncs, Python lines executed) during one ``apply``."""
    import sys

    syncs = [0]
    for name in _SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            syncs[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    lines = [0]

    def tracer(frame, event, arg):
        if event == "line":
            lines[0] += 1
        return tracer

    sys.settrace(tracer)
    try:
        processor.apply(logits)
    finally:
        sys.settrace(None)
    monkeypatch.undo()
    return syncs[0], lines[0]


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_apply_has_no_host_sync_and_no_per_request_loop(tiny_tokenizer, monkeypatch, mode):
    """A plain step (batch unchanged, one new token per request) reads nothing back from the device, and the Python it
    runs does not grow with the number of requests."""
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(tiny_tokenizer), [1])
    counts = {}
    for rows in (3, 24):
        processor, logits, uids = _steady_batch(tables, rows, mode)
        counts[rows] = _count_apply(processor, logits, monkeypatch)
        pop_records(uids)
    assert counts[3][0] == counts[24][0] == 0, counts
    assert counts[3][1] == counts[24][1], counts

    # The counters see what they are meant to: a sync and a per-row loop.
    probe = torch.zeros(3)
    monkeypatch.setattr(TandemLogitsProcessor, "apply", lambda self, x: [bool(v > 0) for v in x.sum(-1)])
    syncs_3, lines_3 = _count_apply(processor, probe.unsqueeze(1).expand(3, 2), monkeypatch)
    assert syncs_3 == 3
    monkeypatch.setattr(TandemLogitsProcessor, "apply", lambda self, x: [bool(v > 0) for v in x.sum(-1)])
    assert _count_apply(processor, torch.zeros(5, 2), monkeypatch)[1] > lines_3
