"""The tandem policy gradient is exact: on an enumerable toy, the expectation of the package's own per-token senior
terms (``handoff.replay`` + ``handoff.senior_token_terms``, what the trainer calls) times the reward equals autograd of
the exact expected reward, under both handoff rules.

The toy: a vocabulary of 4 (``x``, `` y`` (space-initial), ``.``, EOS), completions of at most 3 tokens, a senior
that is a table of logits indexed by (position, previous token) with gradients, a fixed random junior table, fixed
random rewards per completion. Every coin sequence is enumerated (a seed is found for each pattern of unit owners,
weighted by its exact probability) and every token sequence (EOS ends one), with the package's own state machine
(``init_state``, ``boundary_mask``, ``mixture_logprobs``, ``advance``). ``max_gap_tokens = 2`` is hit.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tandem_grpo.handoff import (
    BoundaryTables,
    HandoffRule,
    advance,
    boundary_logprobs,
    boundary_mask,
    draw_owners,
    init_state,
    mixture_logprobs,
    replay,
    senior_token_terms,
    unit_start_ids,
)

VOCAB = ["x", " y", ".", "<eos>"]
EOS = 3
LENGTH = 3

TABLES = BoundaryTables(
    starts_word=torch.tensor([False, True, False, True]),
    ends_sentence=torch.tensor([False, False, True, False]),
    is_eos=torch.tensor([False, False, False, True]),
    starts_space=torch.tensor([False, True, False, False]),
)


def _seeds_per_coin_pattern(junior_probability: float, units: int) -> dict[tuple[int, ...], int]:
    """A seed for every pattern of unit owners ``(owner of unit 0, ..., owner of unit units-1)``."""
    seeds = torch.arange(400_000)
    owners = torch.stack([draw_owners(seeds, torch.full_like(seeds, k), junior_probability) for k in range(units)], 1)
    found: dict[tuple[int, ...], int] = {}
    for pattern in itertools.product((0, 1), repeat=units):
        match = (owners == torch.tensor(pattern)).all(dim=1).nonzero()
        if len(match):
            found[pattern] = int(match[0])
    return found


def _pattern_probability(pattern: tuple[int, ...], junior_probability: float) -> float:
    juniors = sum(1 for owner in pattern if owner == 0)
    return junior_probability**juniors * (1 - junior_probability) ** (len(pattern) - juniors)


def _toy(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    senior = (torch.randn(LENGTH, len(VOCAB) + 1, len(VOCAB), generator=g) * 1.5).requires_grad_(True)
    junior = torch.randn(LENGTH, len(VOCAB) + 1, len(VOCAB), generator=g) * 1.5
    rewards = {}
    for length in range(1, LENGTH + 1):
        for seq in itertools.product(range(len(VOCAB)), repeat=length):
            rewards[seq] = float(torch.rand(1, generator=g))
    return senior, junior, rewards


def _logprobs(table: torch.Tensor, prefix: tuple[int, ...]) -> torch.Tensor:
    previous = prefix[-1] if prefix else len(VOCAB)
    return torch.log_softmax(table[len(prefix), previous], dim=-1).unsqueeze(0)


def _completions(rule: HandoffRule, seed: int, senior, junior):
    """Every completion of one coin pattern with its probability (a differentiable tensor), by the package's rule."""
    out = []

    def walk(prefix, state, probability):
        mixed = mixture_logprobs(
            _logprobs(senior, prefix), _logprobs(junior, prefix), state, boundary_mask(state, TABLES, rule)
        )[0]
        for token in range(len(VOCAB)):
            if mixed[token].item() == float("-inf"):
                continue
            seq = (*prefix, token)
            p = probability * mixed[token].exp()
            if token == EOS or len(seq) == LENGTH:
                out.append((seq, p))
            else:
                next_state, _, _ = advance(state, torch.tensor([token]), TABLES, rule)
                walk(seq, next_state, p)

    walk((), init_state(torch.tensor([seed]), rule), torch.tensor(1.0))
    return out


def _senior_terms(rule: HandoffRule, seq: tuple[int, ...], seed: int, senior) -> tuple[torch.Tensor, torch.Tensor]:
    """The package's per-token senior terms of one completion (as the trainer computes them)."""
    trace = replay(torch.tensor([seq]), torch.tensor([seed]), TABLES, rule)
    senior_lp = torch.cat([_logprobs(senior, seq[:t]) for t in range(len(seq))])  # [T, V]
    token_lp = senior_lp.gather(1, torch.tensor(seq).unsqueeze(1)).squeeze(1)
    if rule.mode == "whole_unit":
        b_lp = boundary_logprobs(senior_lp, unit_start_ids(TABLES, rule))
    else:
        b_lp = torch.zeros_like(token_lp)
    terms, mask = senior_token_terms(token_lp, b_lp, trace.authorship[0], trace.boundary_coef[0])
    naive = (token_lp * trace.authorship[0]).sum()  # tandem-grpo 0.1's term: log p_s(x) on the senior's tokens
    return terms.sum(), naive


def _gradients(rule: HandoffRule, toy_seed: int = 0):
    senior, junior, rewards = _toy(toy_seed)
    units = LENGTH + 1  # owners of units 0..LENGTH: the next owner is pre-drawn one unit ahead
    seeds = _seeds_per_coin_pattern(rule.junior_probability, units)
    expected_reward = torch.tensor(0.0)
    estimator = torch.tensor(0.0)
    naive = torch.tensor(0.0)
    total = 0.0
    for pattern, seed in seeds.items():
        weight = _pattern_probability(pattern, rule.junior_probability)
        total += weight
        for seq, probability in _completions(rule, seed, senior, junior):
            reward = rewards[seq]
            expected_reward = expected_reward + weight * probability * reward
            terms, naive_terms = _senior_terms(rule, seq, seed, senior)
            estimator = estimator + weight * probability.detach() * reward * terms
            naive = naive + weight * probability.detach() * reward * naive_terms
    assert abs(total - 1.0) < 1e-9, "every coin pattern must be enumerated"
    (exact,) = torch.autograd.grad(expected_reward, senior)
    (ours,) = torch.autograd.grad(estimator, senior, retain_graph=True)
    (old,) = torch.autograd.grad(naive, senior)
    return exact, ours, old


@pytest.mark.parametrize("mode", ["after_boundary", "whole_unit"])
@pytest.mark.parametrize("granularity", ["word", "sentence", "token"])
@pytest.mark.parametrize("junior_probability", [0.3, 0.5, 0.8])
def test_expected_senior_terms_are_the_exact_policy_gradient(mode, granularity, junior_probability):
    rule = HandoffRule(granularity, junior_probability, 2, mode)
    exact, ours, old = _gradients(rule)
    assert exact.abs().max() > 1e-2, "the toy must have a gradient to compare"
    torch.testing.assert_close(ours, exact, atol=1e-6, rtol=0)
    if mode == "after_boundary" or granularity == "token":
        # Authorship depends on the prefix and the coins only: the masked log p_s(x) is the score function.
        torch.testing.assert_close(old, exact, atol=1e-6, rtol=0)


@pytest.mark.parametrize("granularity", ["word", "sentence"])
def test_the_uncorrected_whole_unit_terms_are_biased(granularity):
    """The test above has power: without the log p_s(B) terms (0.1's estimator) the expectation is off."""
    exact, _, old = _gradients(HandoffRule(granularity, 0.5, 2, "whole_unit"))
    assert (old - exact).abs().max() > 1e-3  # the tolerance above is 1e-6


# ------------------------------------------------------------------ the trainer uses exactly these terms


PADDING = 3  # the senior's logits are wider than the tokenizer, as Qwen's checkpoints pad their embeddings


@pytest.fixture(scope="module")
def padded_senior(tmp_path_factory, tiny_tokenizer) -> str:
    from conftest import build_tiny_model, pad_vocabulary

    path = tmp_path_factory.mktemp("padded-senior")
    pad_vocabulary(build_tiny_model(0), PADDING).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


def _trainer_batch(tmp_path, senior: str, junior: str, loss_type: str, **overrides):
    """A whole_unit trainer and one generation batch of 8 completions of 4 different prompts (left padding), scored
    in 2 chunks of 4 (TRL's batch_size), padded to a multiple of 8 columns."""
    from conftest import build_tiny_tokenizer, tiny_prompts, tiny_tandem_config

    from tandem_grpo import TandemGRPOTrainer

    trainer = TandemGRPOTrainer(
        model=senior,
        reward_funcs=lambda completions, **kwargs: [float(len(c)) for c in completions],
        args=tiny_tandem_config(
            tmp_path / "out",
            **{
                "handoff_mode": "whole_unit",
                "junior_model_name_or_path": junior,
                "loss_type": loss_type,
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 2,
                "num_generations": 8,
                "max_completion_length": 13,
                "pad_to_multiple_of": 8,
                "temperature": 0.9,
                **overrides,
            },
        ),
        train_dataset=tiny_prompts(8),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.model.train()
    return trainer


def _rollout(trainer):
    batch = trainer._generate_and_score_completions([{"prompt": p} for p in ("ab c", "d e", "f.\ng", "h")] * 2)
    authorship = torch.zeros_like(batch["completion_ids"])
    for row, authors in enumerate(trainer._rollout.authorship):
        authorship[row, : len(authors)] = torch.tensor(authors)
    batch["advantages"] = torch.linspace(-1.5, 2.0, 8)  # fixed, non-zero advantages
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop
    return batch, authorship


def _plain_terms(model, batch, authorship, trainer):
    """The senior terms of a batch from a plain forward's full logits (not through the trainer's hook)."""
    completion_mask = batch["completion_mask"]
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], completion_mask], dim=1)
    width = batch["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1].float() / trainer.temperature
    logprobs = torch.log_softmax(logits, dim=-1)  # every logits column, as TRL normalizes
    token_lp = logprobs.gather(2, batch["completion_ids"].unsqueeze(2)).squeeze(2)
    ids_b = torch.zeros(logprobs.shape[-1], dtype=torch.bool)
    ids_b[: trainer._tables.vocab_size] = unit_start_ids(trainer._tables, trainer.args.handoff_rule)
    return senior_token_terms(token_lp, boundary_logprobs(logprobs, ids_b), authorship, batch["tandem_boundary_coef"])


@pytest.mark.parametrize("loss_type", ["bnpo", "dapo"])
def test_trainer_loss_gradient_is_built_from_the_senior_terms(tmp_path, padded_senior, tiny_model_dirs, loss_type):
    """On a real rollout batch, TRL's loss (through TandemGRPOTrainer) has the gradient of
    -sum(A_i * terms_it) / (number of positions whose term involves the senior), with the terms computed here from the
    full logits of a plain forward (not through the trainer's hidden-state hook)."""
    trainer = _trainer_batch(tmp_path, padded_senior, tiny_model_dirs[1], loss_type)
    batch, authorship = _rollout(trainer)
    assert batch["completion_ids"].shape[1] == 16, "padded to a multiple of 8"
    assert bool((batch["prompt_mask"] == 0).any()), "left-padded prompts"
    coef = batch["tandem_boundary_coef"]
    assert coef.shape == batch["completion_ids"].shape
    assert bool((coef == 1).any()) and bool((coef == -1).any()), "the batch must hold handoffs both ways"
    completion_mask = batch["completion_mask"]
    senior_mask = (authorship.bool() | (coef != 0)) & completion_mask.bool()
    assert torch.equal(batch["tool_mask"].bool() & completion_mask.bool(), senior_mask)
    assert int(batch["num_items_in_batch"]) == int(senior_mask.sum()), "handed-over tokens count in the normalizer"

    model = trainer.model
    model.zero_grad()
    trainer.compute_loss(model, batch).backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    terms, involved = _plain_terms(model, batch, authorship, trainer)
    assert torch.equal(involved & completion_mask.bool(), senior_mask)
    weights = senior_mask.float() * batch["advantages"].unsqueeze(1)
    # TRL's normalizers for one call on the whole generation batch (one accumulation step here): bnpo divides by the
    # batch's mask sum; dapo by num_items_in_batch (the same count) rescaled to one of steps_per_generation windows.
    denominator = senior_mask.sum() / (trainer.args.steps_per_generation if loss_type == "dapo" else 1)
    (-(terms * weights).sum() / denominator).backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys()
    for name in got:
        torch.testing.assert_close(got[name], expected[name], atol=2e-6, rtol=1e-4, msg=name)

    # And it is not the 0.1 gradient (log p_s(x) on the senior's tokens only): the comparison has power.
    model.zero_grad()
    old_mask = authorship.bool() & completion_mask.bool()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], completion_mask], dim=1)
    width = batch["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1].float() / trainer.temperature
    token_lp = torch.log_softmax(logits, dim=-1).gather(2, batch["completion_ids"].unsqueeze(2)).squeeze(2)
    (-(token_lp * old_mask * batch["advantages"].unsqueeze(1)).sum() / denominator).backward()
    old = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert max((old[n] - got[n]).abs().max().item() for n in got) > 1e-4


def test_old_and_reference_logprobs_carry_the_same_terms(tmp_path, padded_senior, tiny_model_dirs):
    """Importance ratios and the KL term compare like with like: the old (num_iterations > 1) and reference (beta > 0)
    log-probs TRL computes at generation (in chunks of 4 rows) carry the log p_s(B) terms of their own model."""
    trainer = _trainer_batch(tmp_path, padded_senior, tiny_model_dirs[1], "bnpo", beta=0.04, num_iterations=2)
    reference = trainer.ref_model
    assert reference is not None and reference is not trainer.model
    with torch.no_grad():  # a reference that differs from the senior, so that each side's terms are its own
        for weight in reference.parameters():
            weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * 0.05)
    batch, authorship = _rollout(trainer)
    with torch.no_grad():
        senior_terms, involved = _plain_terms(trainer.model, batch, authorship, trainer)
        reference_terms, _ = _plain_terms(reference, batch, authorship, trainer)
    keep = involved & batch["completion_mask"].bool()
    assert bool((batch["tandem_boundary_coef"][keep] != 0).any())
    assert (senior_terms[keep] - reference_terms[keep]).abs().max() > 1e-2
    torch.testing.assert_close(batch["old_per_token_logps"][keep], senior_terms[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch["ref_per_token_logps"][keep], reference_terms[keep], atol=1e-5, rtol=1e-5)
