"""The Model Runner V2 tandem logits processor driven as MRV2's ``Sampler`` drives it (no engine, no GPU).

A small stand-in of the runner (``_Runner``) does what ``vllm/v1/worker/gpu/model_runner.py`` and
``vllm/v1/worker/gpu/states.py`` do around the sampler (vLLM 0.32): slots taken from a LIFO free list and recycled
with no remove hook, ``add_request`` then ``apply_staged_writes`` every step, rows in a new order every step, the
sampled token written into ``all_token_ids``/``total_len`` on the device only (what makes async scheduling work), a
preempted request re-added with its outputs in its prefill. vLLM's own ``LogitsProcRequestState`` and
``LogitsContext`` carry the state; the buffers inside are stand-ins with the same fields (``.gpu``, ``.np``), since
``StagedWriteTensor``/``UvaBackedTensor`` need Triton or UVA. The references are the transformers decode loop's
distribution ([`next_token_logprobs`][tandem_grpo.generation.next_token_logprobs]) and the rule's replay
([`replay_authorship`][tandem_grpo.handoff.replay_authorship]).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import skip_without_vllm

skip_without_vllm()

from vllm import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState  # noqa: E402

from tandem_grpo.generation import next_token_logprobs  # noqa: E402
from tandem_grpo.handoff import (  # noqa: E402
    BoundaryTables,
    HandoffRule,
    advance,
    boundary_mask,
    handoff_rows,
    init_state,
    replay_authorship,
)
from tandem_grpo.sampling import SamplingSettings  # noqa: E402
from tandem_grpo.vllm._slot import put_junior_logits  # noqa: E402
from tandem_grpo.vllm.engine import request_fields  # noqa: E402
from tandem_grpo.vllm.processor_v2 import TandemLogitsProcessorV2  # noqa: E402
from tandem_grpo.vllm.request_args import tandem_extra_args  # noqa: E402
from tandem_grpo.vllm.side_records import pop_records  # noqa: E402

pytestmark = pytest.mark.vllm

MAX_REQS, MAX_LEN = 6, 64


class _Buffer:
    """``StagedWriteTensor``/``UvaBackedTensor`` as a processor reads them: ``.gpu`` (and ``.np``, the host copy)."""

    def __init__(self, *shape: int) -> None:
        self.gpu = torch.zeros(*shape, dtype=torch.int32)
        self.np = self.gpu.numpy()  # shares memory: the host and "device" copies agree after each write


class _Runner:
    """What MRV2's model runner does around ``Sampler`` for the processor (module docstring)."""

    def __init__(self, processor_factory, tables: BoundaryTables, generator: torch.Generator) -> None:
        self.tokens = _Buffer(MAX_REQS, MAX_LEN)
        self.prompt_len, self.prefill_len, self.total_len = _Buffer(MAX_REQS), _Buffer(MAX_REQS), _Buffer(MAX_REQS)
        self.req_states = LogitsProcRequestState(
            device=torch.device("cpu"),
            max_num_reqs=MAX_REQS,
            vocab_size=tables.vocab_size,
            all_token_ids=self.tokens,
            prompt_len=self.prompt_len,
            prefill_len=self.prefill_len,
            total_len=self.total_len,
        )
        self.processor = processor_factory(self.req_states)
        self.free = list(range(MAX_REQS))
        self.slot: dict[str, int] = {}
        self.generator = generator
        self.staged_calls = 0

    def add(self, req_id: str, prompt: list[int], outputs: list[int], params: SamplingParams) -> None:
        slot = self.free.pop()  # RequestState.add_request: LIFO free list, so slots come back at once
        self.slot[req_id] = slot
        tokens = prompt + outputs
        self.prompt_len.np[slot] = len(prompt)
        self.prefill_len.np[slot] = len(tokens)
        self.total_len.np[slot] = len(tokens)
        self.tokens.np[slot, : len(tokens)] = tokens
        self.processor.add_request(slot, params)

    def remove(self, req_id: str) -> None:
        self.free.append(self.slot.pop(req_id))  # finished or preempted: the processor is not told

    def history(self, req_id: str) -> tuple[list[int], list[int]]:
        slot = self.slot[req_id]
        prompt, total = int(self.prompt_len.np[slot]), int(self.total_len.np[slot])
        return self.tokens.np[slot, :prompt].tolist(), self.tokens.np[slot, prompt:total].tolist()

    def step(self, order: list[str], senior: torch.Tensor, junior: torch.Tensor, *, extra_rows: int = 0):
        """One sampler call over the requests ``order`` (logits rows in that order); returns the processed logits."""
        self.processor.apply_staged_writes()  # model_runner.add_requests calls it every step
        slots = np.array([self.slot[r] for r in order], dtype=np.int32)
        index = torch.from_numpy(slots)
        expanded = index.repeat_interleave(1 + extra_rows)
        total = self.total_len.gpu[index]
        ctx = LogitsContext(
            expanded_idx_mapping=expanded,
            idx_mapping=index,
            idx_mapping_np=slots,
            expanded_local_pos=torch.zeros_like(expanded),
            input_ids=self.tokens.gpu[index, (total - 1).long()],
            pos=total - 1,
            seq_lens_upper_bound_np=self.total_len.np[slots].copy(),
        )
        put_junior_logits(junior)
        return self.processor.apply(senior.clone(), ctx)

    def commit(self, order: list[str], tokens: torch.Tensor) -> None:
        """``post_update``: each sampled token written after the request's history, on the device."""
        index = torch.tensor([self.slot[r] for r in order])
        self.tokens.gpu[index, self.total_len.gpu[index].long()] = tokens.int()
        self.total_len.gpu[index] += 1


def _processor(tables: BoundaryTables, speculative_config=None):
    hf_config = SimpleNamespace(architectures=["TandemForCausalLM"])
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config), speculative_config=speculative_config)

    def build(req_states):
        processor = TandemLogitsProcessorV2(config, req_states)
        for width in range(tables.vocab_size, tables.vocab_size + 8):  # what it builds from the engine's tokenizer
            processor._tables[width] = tables
        return processor

    return build


def _tandem_params(seed: int, uid: str, rule: HandoffRule, sampling: SamplingSettings) -> SamplingParams:
    """The request ``sampling_params`` sends: ``request_fields`` plus the tandem extra args."""
    fields = request_fields(sampling, 64)
    return SamplingParams(**fields, extra_args=tandem_extra_args(seed, uid, rule, sampling))


def _vllm_penalties(logits: torch.Tensor, prompt: list[int], outputs: list[int], repetition: float) -> torch.Tensor:
    """What MRV2's ``PenaltiesState`` does to the senior's row before the custom processors (repetition only)."""
    seen = torch.zeros(logits.shape[-1], dtype=torch.bool)
    seen[prompt + outputs] = True
    scale = torch.where(seen, torch.tensor(repetition), torch.tensor(1.0))
    return logits * torch.where(logits > 0, 1.0 / scale, scale)


SETTINGS = [  # one per request: temperature alone; truncation; a repetition penalty (the junior's is the processor's)
    SamplingSettings(temperature=0.7),
    SamplingSettings(temperature=1.3, top_k=9, top_p=0.85, min_p=0.05),
    SamplingSettings(temperature=0.9, repetition_penalty=1.4),
]


@pytest.mark.parametrize(
    "rules",
    [
        (HandoffRule("word", 0.5, 3), HandoffRule("sentence", 0.4, 4)),
        (HandoffRule("word", 0.5, 3, "whole_unit"), HandoffRule("token", 0.5, 2, "whole_unit")),
    ],
    ids=["after_boundary", "whole_unit"],
)
def test_v2_processor_samples_the_transformers_distribution_and_records_the_replayed_authors(tiny_tokenizer, rules):
    """Rows reordered every step, slots recycled (a request finishes, a new one takes its slot with the old state
    still in it), a request preempted and re-added with its outputs in its prefill, a plain request in the batch, two
    rules at once: every tandem row is the transformers loop's distribution at the replayed state, the plain row is
    untouched, and the authors, corrections and handovers popped at the end are the rule's and the definitions'."""
    vocab = len(tiny_tokenizer)
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, vocab, [1])
    generator = torch.Generator().manual_seed(0)
    runner = _Runner(_processor(tables), tables, generator)
    mode = rules[0].mode
    requests = {}  # uid -> (seed, rule, sampling)
    counter = iter(range(100))

    def admit(prompt: list[int]) -> str:
        k = next(counter)
        uid = f"v2-{mode}-{k}"
        requests[uid] = (100 + k, rules[k % 2], SETTINGS[k % 3])
        runner.add(uid, prompt, [], _tandem_params(100 + k, uid, rules[k % 2], SETTINGS[k % 3]))
        return uid

    live = [admit([2, 3]), admit([4]), admit([5, 6, 7])]
    runner.add("plain", [2], [], SamplingParams(temperature=0.8))
    expected_records: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    finished: dict[str, list[int]] = {}
    preempted: tuple[str, list[int], list[int]] | None = None
    switching_seen = 0
    preempted_slots: dict[str, int] = {}
    resumed_slots: list[tuple[int, int]] = []  # (slot on return, slot before)
    for step in range(14):
        if step == 4:  # a request finishes; its slot is reused at once for a new one (no remove hook)
            done = live.pop(0)
            finished[done] = runner.history(done)[1]
            runner.remove(done)
            live.append(admit([3, 12]))
        if step in (6, 10):  # preemption: the request leaves the runner ...
            gone = live.pop(0)
            preempted = (gone, *runner.history(gone))
            preempted_slots[gone] = runner.slot[gone]
            runner.remove(gone)
        if step == 7:  # a new request takes the preempted one's slot
            live.append(admit([6]))
        if step in (8, 11):  # ... and comes back, its outputs in its prefill: in another slot, then in its own
            gone, prompt, outputs = preempted
            seed, rule, sampling = requests[gone]
            runner.add(gone, prompt, outputs, _tandem_params(seed, gone, rule, sampling))
            resumed_slots.append((runner.slot[gone], preempted_slots[gone]))
            live.append(gone)
        order = [*live, "plain"]
        perm = torch.randperm(len(order), generator=generator).tolist()
        order = [order[i] for i in perm]
        senior_raw = 3 * torch.randn(len(order), vocab + 2, generator=generator)
        junior_raw = 3 * torch.randn(len(order), vocab + 4, generator=generator)
        given = senior_raw.clone()  # what reaches the custom processors: the senior after vLLM's penalties
        for row, uid in enumerate(order):
            if uid in requests and requests[uid][2].repetition_penalty != 1.0:
                prompt, outputs = runner.history(uid)
                given[row] = _vllm_penalties(senior_raw[row], prompt, outputs, requests[uid][2].repetition_penalty)
        out = runner.step(order, given, junior_raw)

        tokens = []
        for row, uid in enumerate(order):
            if uid == "plain":
                torch.testing.assert_close(out[row], given[row])
                tokens.append(int(torch.multinomial(torch.softmax(out[row], -1), 1, generator=generator)))
                continue
            seed, rule, sampling = requests[uid]
            prompt, outputs = runner.history(uid)
            state = init_state(torch.tensor([seed]), rule)
            for token in outputs:
                state, _, _ = advance(state, torch.tensor([token]), tables, rule)
            history = torch.tensor([prompt + outputs])
            want = next_token_logprobs(senior_raw[row : row + 1], junior_raw[row : row + 1], state, tables, rule,
                                       sampling, history)  # fmt: skip
            torch.testing.assert_close(out[row, :vocab], want[0], atol=1e-5, rtol=1e-5)
            assert bool(torch.isinf(out[row, vocab:]).all())
            # The records' definitions (tandem_grpo.vllm.side_records): log Z, the untruncated mixture's mass on
            # what the truncation kept, plus under "whole_unit" -log p_j(B) where the junior may hand over.
            untruncated = dataclasses.replace(sampling, top_k=0, top_p=1.0, min_p=0.0)
            full = next_token_logprobs(senior_raw[row : row + 1], junior_raw[row : row + 1], state, tables, rule,
                                       untruncated, history)[0]  # fmt: skip
            kept = torch.logsumexp(full[torch.isfinite(want[0])], 0).item()
            # log M: the senior's logits are 2 columns wider than the tokenizer, and the trainer normalizes over all.
            scaled = given[row] / sampling.temperature
            inside = (torch.logsumexp(scaled[:vocab], 0) - torch.logsumexp(scaled, 0)).item()
            expected_records[uid][len(outputs)] = (kept + inside, math.nan)
            if rule.mode == "whole_unit":
                temperature = sampling.temperature
                penalized = given[row : row + 1, :vocab]
                junior_in = junior_raw[row : row + 1, :vocab]
                if sampling.repetition_penalty != 1.0:
                    junior_in = _vllm_penalties(junior_in[0], prompt, outputs, sampling.repetition_penalty)[None]
                senior_lp = torch.log_softmax(penalized / temperature, -1)[0]
                junior_lp = torch.log_softmax(junior_in / temperature, -1)[0]
                b = boundary_mask(state, tables, rule)
                switching = bool(handoff_rows(state, b)[0])
                switching_seen += switching
                to_senior = int(state.next_owner[0]) == 1
                c = -torch.logsumexp(junior_lp[b[0]], 0).item() if switching and to_senior else inside
                h = torch.logsumexp(senior_lp[b[0]], 0).item() + inside if switching and not to_senior else math.nan
                expected_records[uid][len(outputs)] = (c + kept, h)
            tokens.append(int(torch.multinomial(torch.softmax(want[0], -1), 1, generator=generator)))
        runner.commit(order, torch.tensor(tokens))

    for uid in live:
        finished[uid] = runner.history(uid)[1]
    records = pop_records(list(finished))
    for uid, outputs in finished.items():
        seed, rule, _ = requests[uid]
        authors, _ = replay_authorship(torch.tensor([outputs]), torch.tensor([seed]), tables, rule)
        assert records[uid]["authors"] == authors[0, :-1].tolist(), uid  # the last token is never advanced over
        for position, (c, h) in expected_records[uid].items():
            corrections = records[uid]["corrections"]  # a record ends where nothing more was written: 0 past it
            got = corrections[position] if position < len(corrections) else 0.0
            assert got == pytest.approx(c, abs=1e-5), (uid, position)
            if math.isnan(h) and position >= len(records[uid]["handovers"]):
                continue
            got = records[uid]["handovers"][position]
            assert (got is None and math.isnan(h)) or got == pytest.approx(h, abs=1e-5), (uid, position)
    assert pop_records(list(finished)) == {uid: None for uid in finished}
    assert sum(len(o) for o in finished.values()) > 30 and len(finished) == 5
    assert [new != old for new, old in resumed_slots] == [True, False]  # both ways back were taken
    if mode == "whole_unit":
        assert switching_seen > 0, "the steps must reach handoffs within B"


def test_expanded_rows_and_speculative_engines_are_refused(tiny_tokenizer):
    """Speculative decoding gives a request several logits rows: refused when the engine is built and, should a
    batch of them reach the processor anyway, in ``apply``."""
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(tiny_tokenizer), [1])
    runner = _Runner(_processor(tables), tables, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="does not support speculative decoding"):
        _processor(tables, speculative_config=SimpleNamespace(method="ngram"))(runner.req_states)
    runner.add("spec", [2, 3], [], _tandem_params(1, "spec", HandoffRule(), SamplingSettings()))
    vocab = tables.vocab_size
    with pytest.raises(RuntimeError, match="one row per request \\(no speculative decoding\\)"):
        runner.step(["spec"], torch.randn(3, vocab), torch.randn(3, vocab), extra_rows=2)
    runner.step(["spec"], torch.randn(1, vocab), torch.randn(1, vocab))  # one row: fine
    pop_records(["spec"])


def test_v2_requests_come_at_temperature_one():
    """vLLM applies the request's temperature after the V2 processor: a tandem request must be sent at 1 with its
    temperature in the extra args (the form request_fields and tandem_extra_args build)."""
    rule = HandoffRule()
    good = _tandem_params(0, "t", rule, SamplingSettings(temperature=0.6))
    assert good.temperature == 1.0 and good.extra_args["tandem_temperature"] == 0.6
    TandemLogitsProcessorV2.validate_params(good)
    TandemLogitsProcessorV2.validate_params(SamplingParams(temperature=0.6))  # not a tandem request: not ours
    older = {k: v for k, v in tandem_extra_args(0, "t", rule).items() if k != "tandem_temperature"}
    with pytest.raises(ValueError, match="sent at temperature 1.*tandem_temperature"):
        TandemLogitsProcessorV2.validate_params(SamplingParams(temperature=0.6, extra_args=older))
    with pytest.raises(ValueError, match="scaled by the logits processor: send SamplingParams\\(temperature=1.0\\)"):
        TandemLogitsProcessorV2.validate_params(SamplingParams(temperature=0.6, extra_args=good.extra_args))
    with pytest.raises(ValueError, match="must sample"):
        TandemLogitsProcessorV2.validate_params(
            SamplingParams(extra_args={**good.extra_args, "tandem_temperature": 0.0})
        )


PROCESSOR_FILES = tuple(f"tandem_grpo/vllm/{name}.py" for name in ("processor_v2", "mixing", "side_records"))
_SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")


def _count_apply(runner: _Runner, order: list[str], vocab: int, monkeypatch) -> tuple[int, int]:
    """(host syncs, Python lines executed) during one sampler call of the processor (``apply`` alone)."""
    import sys

    runner.processor.apply_staged_writes()
    senior, junior = torch.randn(len(order), vocab), torch.randn(len(order), vocab)
    syncs, lines = [0], [0]
    for name in _SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            syncs[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def tracer(frame, event, arg):
        if event == "line" and frame.f_code.co_filename.endswith(PROCESSOR_FILES):
            lines[0] += 1
        return tracer

    apply = runner.processor.apply
    sys.settrace(tracer)
    try:
        runner.processor.apply = lambda logits, ctx: apply(logits, ctx)
        runner.step(order, senior, junior)
    finally:
        sys.settrace(None)
        monkeypatch.undo()
    return syncs[0], lines[0]


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
def test_a_v2_step_has_no_host_sync_and_no_per_request_loop(tiny_tokenizer, monkeypatch, mode):
    """A plain step reads nothing back from the device (async scheduling can run ahead) and runs as many lines of
    the processor for 2 requests as for 5, with rows in another order each time."""
    tables = BoundaryTables.from_tokenizer(tiny_tokenizer, len(tiny_tokenizer), [1])
    vocab = tables.vocab_size
    counts = {}
    for size in (2, 5):
        generator = torch.Generator().manual_seed(size)
        runner = _Runner(_processor(tables), tables, generator)
        uids = [f"sync-{mode}-{size}-{k}" for k in range(size)]
        settings = SamplingSettings(temperature=0.8, top_p=0.9)
        for k, uid in enumerate(uids):
            runner.add(uid, [2, 3], [], _tandem_params(k, uid, HandoffRule("word", 0.5, 4, mode), settings))
        for _ in range(3):
            out = runner.step(uids, torch.randn(size, vocab, generator=generator), torch.randn(size, vocab))
            runner.commit(uids, torch.multinomial(out.softmax(-1), 1, generator=generator).squeeze(1))
        counts[size] = _count_apply(runner, uids[::-1], vocab, monkeypatch)
        pop_records(uids)
    assert counts[2][0] == counts[5][0] == 0, counts
    assert counts[2][1] == counts[5][1] > 0, counts
