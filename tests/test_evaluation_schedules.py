"""The handoff schedules produce the authorship they promise; the transformers backend samples as documented."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tandem_grpo.backends import (
    GenerationBackend,
    StopInCompletion,
    TransformersBackend,
    create_backend,
    cut_at_stop,
    stop_length,
)
from tandem_grpo.evaluation.schedules import (
    alternating_schedule,
    handover_token_index,
    step_schedule,
    training_rule_schedule,
)
from tandem_grpo.handoff import BoundaryTables, HandoffRule, replay_authorship
from tandem_grpo.sampling import SamplingSettings, default_eos_token_ids, derive_seed

EOS = 2  # SmolLM2's <|im_end|>


def tiny_llama(seed: int, vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        pad_token_id=EOS,
        eos_token_id=EOS,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def senior(tok):
    return tiny_llama(0, len(tok))


@pytest.fixture(scope="module")
def junior(tok):
    return tiny_llama(1, len(tok))


class ScriptedBackend(GenerationBackend):
    """A continuation model that always writes the same tokens, and records what it was asked."""

    name = "scripted"

    def __init__(self, continuation: list[int]):
        self.continuation = continuation
        self.eos_token_ids = [EOS]
        self.pad_token_id = EOS
        self.calls: list[tuple[list[list[int]], list[int]]] = []

    def generate(self, prompts, sampling, *, max_new_tokens, seed=0, desc=""):
        self.calls.append(([list(p) for p in prompts], list(max_new_tokens)))
        return [list(self.continuation) for _ in prompts]


def _steps(prompts, drafts, num_steps: int, backend, tok, cap: int, first: str = "senior"):
    """``step_schedule`` with plain sampling and a length cap of ``cap`` tokens."""
    return step_schedule(
        prompts, drafts, num_steps, first=first, continuation=backend, tokenizer=tok, sampling=SamplingSettings(),
        max_new_tokens=cap,
    )  # fmt: skip


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def prefix_len(tok, ids: list[int], text: str) -> int:
    """Number of leading tokens of ``ids`` that decode to exactly ``text`` (tokens in context may merge)."""
    matches = [n for n in range(len(ids) + 1) if tok.decode(ids[:n]) == text]
    assert matches, f"no prefix of the draft decodes to {text!r}"
    return matches[-1]


def test_senior_first_hands_over_after_s_steps(tok):
    prompts = [encode(tok, "Q1?"), encode(tok, "Question two?")]
    drafts = [encode(tok, "Step one.\nStep two.\nStep three.") + [EOS], encode(tok, "Only.\nTwo.") + [EOS]]
    cont = encode(tok, " the junior writes this") + [EOS]
    backend = ScriptedBackend(cont)
    cap = 40
    out = _steps(prompts, drafts, 1, backend, tok, cap, first="senior")

    assert out.name == "senior_first_s1" and out.handed_over == [True, True]
    n0, n1 = prefix_len(tok, drafts[0], "Step one.\n"), prefix_len(tok, drafts[1], "Only.\n")
    for row, n in ((0, n0), (1, n1)):
        assert out.completion_ids[row][:n] == drafts[row][:n]  # the senior's own tokens, not re-tokenized text
        assert out.completion_ids[row][n:] == cont
        assert out.authorship[row] == [1] * n + [0] * len(cont)
    # The junior continued from prompt + prefix, with the rest of the length budget.
    ((asked, caps),) = backend.calls
    assert asked == [prompts[0] + drafts[0][:n0], prompts[1] + drafts[1][:n1]]
    assert caps == [40 - n0, 40 - n1]
    assert out.senior_token_fraction() == pytest.approx((n0 + n1) / sum(len(c) for c in out.completion_ids))


def test_more_steps_than_the_completion_has_keeps_the_first_completion(tok):
    drafts = [encode(tok, "Step one.\nStep two.\nStep three.") + [EOS], encode(tok, "Only.\nTwo.") + [EOS], [EOS]]
    backend = ScriptedBackend(encode(tok, " more") + [EOS])
    cap = 40
    out = _steps([[5]] * 3, drafts, 2, backend, tok, cap, first="senior")
    # Row 0 has 3 steps: handed over after 2. Row 1 has exactly 2 and row 2 none: their drafts stand, all senior.
    assert out.handed_over == [True, False, False]
    assert out.exhausted_fraction() == pytest.approx(2 / 3)
    assert out.completion_ids[1:] == drafts[1:]
    assert out.authorship[1] == [1] * len(drafts[1]) and out.authorship[2] == [1]
    assert len(backend.calls[0][0]) == 1  # only row 0 was continued
    n = prefix_len(tok, drafts[0], "Step one.\nStep two.\n")
    assert out.completion_ids[0] == drafts[0][:n] + backend.continuation
    assert out.authorship[0] == [1] * n + [0] * 2


def test_junior_first_mirror_and_budget(tok):
    draft = encode(tok, "First step here.\n\nSecond step here.") + [EOS]
    long_cont = encode(tok, " word" * 30)  # longer than the budget left, no EOS
    backend = ScriptedBackend(long_cont)
    cap = 12
    out = _steps([[7]], [draft], 1, backend, tok, cap, first="junior")
    n = prefix_len(tok, draft, "First step here.\n\n")
    assert out.completion_ids[0][:n] == draft[:n]
    assert out.authorship[0] == [0] * n + [1] * (12 - n)  # junior prefix, senior continuation cut at the cap
    assert len(out.completion_ids[0]) == 12
    assert out.name == "junior_first_s1"
    with pytest.raises(ValueError, match="first="):
        _steps([[7]], [draft], 1, backend, tok, cap, first="both")
    with pytest.raises(ValueError, match="num_steps"):
        _steps([[7]], [draft], 0, backend, tok, cap, first="senior")


def test_handover_cut_lands_in_the_separator(tok):
    # SmolLM2 merges ".\n\n " into tokens such as "ĊĊĠ": the cut is the last token boundary inside the blank line,
    # so the whole first step stays with the first model and the second model writes all of the next word.
    ids = encode(tok, "a.\n\n  b c")
    text = tok.decode(ids)
    n = handover_token_index(ids, tok, text.index("\n"), text.index("b"))
    prefix = tok.decode(ids[:n])
    assert prefix.startswith("a.\n") and "b" not in prefix
    # A step glued to its separator inside one token can only be cut after that token.
    ids2 = encode(tok, "x\ny")
    assert tok.decode(ids2[: handover_token_index(ids2, tok, 1, 2)]) == "x\n"


def test_step_schedule_with_the_transformers_backend(tok, junior):
    backend = TransformersBackend(junior, tok, batch_size=2, show_progress=False)
    drafts = [encode(tok, "One.\nTwo.\nThree.") + [EOS]] * 3
    prompts = [encode(tok, "Solve: 1+1"), encode(tok, "Solve this: 2+2"), encode(tok, "3")]
    cap = 10
    out = _steps(prompts, drafts, 1, backend, tok, cap, first="senior")
    n = prefix_len(tok, drafts[0], "One.\n")
    for ids, authors in zip(out.completion_ids, out.authorship, strict=True):
        assert ids[:n] == drafts[0][:n]
        assert authors == [1] * n + [0] * (len(ids) - n)
        assert n < len(ids) <= 10
        assert EOS not in ids[:-1]  # cut at the first EOS


def test_word_schedule_authorship_follows_the_rule(tok, senior, junior):
    prompts = [encode(tok, "Tell me a story."), encode(tok, "Hi"), encode(tok, "What is 2 + 3?")]
    cap = 20
    rule = HandoffRule("word", 0.5)
    backend = TransformersBackend(senior, tok, batch_size=2, eos_token_ids=[EOS], show_progress=False, junior=junior)
    out = training_rule_schedule(backend, prompts, SamplingSettings(), rule, max_new_tokens=cap, seed=7)
    assert out.name == "word_p0.5" and out.settings["backend"] == "transformers"
    with pytest.raises(ValueError, match="no junior"):
        TransformersBackend(senior, tok, eos_token_ids=[EOS]).tandem(
            prompts, SamplingSettings(), rule, max_new_tokens=4
        )
    tables = BoundaryTables.from_tokenizer(tok, len(tok), [EOS])
    all_authors = []
    for row, (ids, authors) in enumerate(zip(out.completion_ids, out.authorship, strict=True)):
        assert len(ids) == len(authors) > 0
        seeds = torch.tensor([derive_seed(7, "coin", row)])
        replayed, _ = replay_authorship(torch.tensor([ids]), seeds, tables, rule)
        assert authors == replayed[0].tolist()  # who wrote each token is what the rule's coins decided
        all_authors += authors
    assert 0 < sum(all_authors) < len(all_authors)  # both models wrote some of it


@pytest.mark.parametrize(("p", "author"), [(0.0, 1), (1.0, 0)])
def test_word_schedule_extremes(tok, senior, junior, p, author):
    backend = TransformersBackend(senior, tok, eos_token_ids=[EOS], show_progress=False, junior=junior)
    out = training_rule_schedule(backend, [encode(tok, "Hello there")], SamplingSettings(), HandoffRule("word", p),
                                max_new_tokens=8)  # fmt: skip
    assert set(out.authorship[0]) == {author}


def test_transformers_backend_seeding_caps_and_rng(tok, senior):
    backend = TransformersBackend(senior, tok, batch_size=2, eos_token_ids=[EOS], show_progress=False)
    prompts = [encode(tok, "a b c"), encode(tok, "hello"), encode(tok, "x")]
    state = torch.get_rng_state()
    first = backend.generate(prompts, SamplingSettings(), seed=3, max_new_tokens=[6, 2, 4])
    assert torch.equal(state, torch.get_rng_state())  # the caller's RNG is untouched
    assert first == backend.generate(prompts, SamplingSettings(), seed=3, max_new_tokens=[6, 2, 4])  # reproducible
    assert [len(c) <= cap for c, cap in zip(first, [6, 2, 4], strict=True)] == [True] * 3
    assert all(EOS not in c[:-1] for c in first)
    assert first != backend.generate(prompts, SamplingSettings(), seed=4, max_new_tokens=[6, 2, 4])


def test_backend_names(tok, senior):
    assert isinstance(create_backend("transformers", senior, tok, show_progress=False), TransformersBackend)
    with pytest.raises(ValueError, match="Unknown backend 'tgi'"):
        create_backend("tgi", senior, tok)
    with pytest.raises(ValueError, match="max_model_len"):  # refused before any engine (or vLLM) is started
        create_backend("vllm", senior, tok)


def test_backend_ends_completions_at_trainings_eos_ids(tok, senior):
    # TRL's rule (what the trainer and the vLLM engine use): the tokenizer's EOS and every generation-config EOS.
    original, senior.generation_config.eos_token_id = senior.generation_config.eos_token_id, 7
    try:
        backend = TransformersBackend(senior, tok, show_progress=False)
        assert backend.eos_token_ids == default_eos_token_ids(tok, senior.generation_config) == [EOS, 7]
    finally:
        senior.generation_config.eos_token_id = original


class StepBackend(GenerationBackend):
    """Writes one scripted step per call and row ("<label> step.\\n\\n"), and after ``steps`` calls an answer with EOS;
    records the prompts and caps it was asked with. A step ends at the stop string, as the backends' contract says."""

    name = "steps"

    def __init__(self, tok, label: str, steps: int):
        self.tok, self.label, self.steps = tok, label, steps
        self.eos_token_ids = [EOS]
        self.pad_token_id = EOS
        self.calls: list[tuple[list[list[int]], list[int], tuple]] = []

    def generate(self, prompts, sampling, *, max_new_tokens, seed=0, desc="", stop=()):
        self.calls.append(([list(p) for p in prompts], list(max_new_tokens), tuple(stop)))
        if len(self.calls) > self.steps:
            ids = encode(self.tok, f"{self.label} answer.") + [EOS]
        else:
            ids = encode(self.tok, f"{self.label} step.\n\n")
        return [ids[:cap] for cap in max_new_tokens]


def _alternate(prompts, senior, junior, tok, budget: int, max_rounds: int = 150):
    return alternating_schedule(
        prompts, senior, junior, tok, SamplingSettings(), max_new_tokens=budget, max_rounds=max_rounds
    )


def test_alternating_protocol_takes_turns_one_step_each(tok):
    """The paper's protocol: the senior writes step 1, then the models alternate one step each on the shared history,
    until a turn ends without the step separator (here the senior's EOS after its third step)."""
    prompt = encode(tok, "Q?")
    senior, junior = StepBackend(tok, "S", steps=3), StepBackend(tok, "J", steps=10)
    out = _alternate([prompt], senior, junior, tok, budget=200)

    step_s, step_j = encode(tok, "S step.\n\n"), encode(tok, "J step.\n\n")
    answer = encode(tok, "S answer.") + [EOS]
    expected = (step_s + step_j) * 3 + answer
    assert out.name == "alternating" and out.completion_ids == [expected]
    assert out.authorship == [([1] * len(step_s) + [0] * len(step_j)) * 3 + [1] * len(answer)]
    assert out.turns == [7] and out.handed_over == [True] and out.settings["unfinished_rows"] == 0
    # Each model continued the whole shared history, with what was left of the one budget, and was told the stop.
    asked, caps, stop = junior.calls[0]
    assert asked == [prompt + step_s] and caps == [200 - len(step_s)] and stop == ("\n\n",)
    asked, caps, _ = senior.calls[1]
    assert asked == [prompt + step_s + step_j] and caps == [200 - len(step_s) - len(step_j)]


def test_alternating_protocol_shares_one_budget_and_caps_rounds(tok):
    prompts = [encode(tok, "Q?"), encode(tok, "Another question?")]
    step_s = encode(tok, "S step.\n\n")
    # The budget ends inside the junior's first step: both rows stop there, the junior's part cut to what was left.
    budget = len(step_s) + 2
    out = _alternate(prompts, StepBackend(tok, "S", 9), StepBackend(tok, "J", 9), tok, budget=budget)
    assert all(len(ids) == budget for ids in out.completion_ids)
    assert out.authorship == [[1] * len(step_s) + [0, 0]] * 2 and out.turns == [2, 2]
    # Neither model ever ends: the round cap (one senior and one junior step per round) stops the protocol.
    out = _alternate(prompts, StepBackend(tok, "S", 99), StepBackend(tok, "J", 99), tok, budget=10_000, max_rounds=2)
    assert out.turns == [4, 4] and out.settings["unfinished_rows"] == 2
    # The senior answering in its first step hands nothing over.
    out = _alternate(prompts, StepBackend(tok, "S", 0), StepBackend(tok, "J", 9), tok, budget=100)
    assert out.handed_over == [False, False] and all(a == [1] * len(a) for a in out.authorship)


def test_stop_length_finds_the_token_that_completes_the_separator(tok):
    ids = encode(tok, "One.\n\nTwo.\n\nThree")
    n = stop_length(ids, tok, ("\n\n",))
    assert tok.decode(ids[:n]).endswith("\n\n") and "\n\n" not in tok.decode(ids[: n - 1])
    assert tok.decode(cut_at_stop(ids, tok, ("\n\n",))) == "One.\n\n"
    assert stop_length(encode(tok, "No blank line.\nAt all."), tok, ("\n\n",)) is None


def test_stop_criterion_looks_at_the_generated_tokens_only(tok):
    """A turn's prompt ends with the previous step's blank line: a first token "\n" is no new step separator (vLLM
    and the authors check the generated text only); transformers' own stop strings would stop there."""
    from transformers import StopStringCriteria

    prompt = encode(tok, "Step one.\n\n")
    criterion = StopInCompletion(tok, ("\n\n",), prompt_width=len(prompt))

    def rows(*texts: str) -> torch.Tensor:
        return torch.tensor([prompt + encode(tok, t) for t in texts])

    assert criterion(rows("\n"), None).tolist() == [False]
    assert criterion(rows("Step two."), None).tolist() == [False]
    assert criterion(rows("Step two.\n\n"), None).tolist() == [True]
    # Why the package has its own criterion: upstream's matches across the prompt boundary. If this fails, upstream
    # changed and StopInCompletion may no longer be needed.
    assert StopStringCriteria(tok, ["\n\n"])(rows("\n"), None).tolist() == [True]


def test_alternating_protocol_with_smollm2(smollm2_path, tok):
    """On the real model through the transformers backend: the senior starts, authors alternate, every handed-over
    turn ends with the blank line that ends a step, and the completion stays within the budget."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    backend = TransformersBackend(model, tok, batch_size=8, show_progress=False)
    question = "Natalia sold 48 clips in April and half as many in May. How many clips did she sell in total?"
    text = tok.apply_chat_template(
        [{"role": "user", "content": question + " Think step by step, one step per paragraph."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompts = [encode(tok, text)] * 4
    budget = 120
    out = alternating_schedule(
        prompts, backend, backend, tok, SamplingSettings(temperature=0.7, top_p=0.8, top_k=20), max_new_tokens=budget
    )
    assert sum(out.handed_over) >= 1, "SmolLM2 wrote no blank line in 4 samples: the prompt no longer tests handoffs"
    # The backend itself: a completion that meets the separator ends right after it (no padding or EOS after it).
    steps = backend.generate(prompts, SamplingSettings(), max_new_tokens=budget, stop=("\n\n",), seed=1)
    texts = [tok.decode(ids, skip_special_tokens=False) for ids in steps]
    assert any("\n\n" in t for t in texts)
    assert all(t.endswith("\n\n") for t in texts if "\n\n" in t), texts
    for ids, authors in zip(out.completion_ids, out.authorship, strict=True):
        assert len(ids) <= budget and authors[0] == 1
        runs = [list(g) for _, g in itertools.groupby(range(len(ids)), key=lambda i: authors[i])]
        for run in runs[:-1]:  # every turn but the last ended at a step separator, then the other model wrote
            assert tok.decode(ids[run[0] : run[-1] + 1]).endswith("\n\n")
            assert "\n\n" not in tok.decode(ids[run[0] : run[-1]])
