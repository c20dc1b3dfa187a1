"""The one rollout type: completions with who wrote each token and the senior's score coefficients.

Every way of co-generating returns a [`Rollout`][tandem_grpo.rollout.Rollout]: the transformers decode loop
([`tandem_generate`][tandem_grpo.generation.tandem_generate]) and the tandem vLLM engine, in process
([`generate_with_llm`][tandem_grpo.vllm.engine.generate_with_llm]) or behind a server
([`Rollout.from_engine`][tandem_grpo.rollout.Rollout.from_engine]). The trainer and the evaluation read the handoff
record from it; nothing rebuilds it afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from .handoff import BoundaryTables, HandoffRule, HandoffTrace, replay

__all__ = ["Rollout"]


@dataclass
class Rollout:
    """``B`` completions; every per-token field is a list of ``B`` lists, each of its completion's length ``T_i``.

    Attributes:
        completion_ids: token ids, EOS included when generated (nothing after it).
        authorship: 1 where the senior wrote the token, 0 where the junior did (the authorship mask).
        unit_starts: the token began a new unit.
        boundary_coef: in {-1, 0, 1}, see [`boundary_coefficients`][tandem_grpo.handoff.boundary_coefficients].
        seeds: the ``B`` coin-stream seeds the completions were drawn with.
        senior_logprobs: the senior's exact score term of each token at the sampling temperature, over the whole
            vocabulary (no truncation: what the trainer's loss recomputes;
            [`senior_token_terms`][tandem_grpo.handoff.senior_token_terms]), ``NaN`` on junior tokens without one;
            from the vLLM engine and the transformers loop.
        mixture_logprobs: ``log P`` of each token under the (truncated) mixture, where the generator returned it
            (the vLLM engine; ``None`` otherwise).

    Raises:
        ValueError: fields of different lengths (``B`` or any ``T_i``).
    """

    completion_ids: list[list[int]]
    authorship: list[list[int]]
    unit_starts: list[list[bool]]
    boundary_coef: list[list[int]]
    seeds: list[int]
    senior_logprobs: list[list[float]] | None = None
    mixture_logprobs: list[list[float]] | None = None

    def __post_init__(self) -> None:
        lengths = [len(ids) for ids in self.completion_ids]
        if len(self.seeds) != len(lengths):
            raise ValueError(f"Rollout: {len(lengths)} completions but {len(self.seeds)} seeds.")
        for field in fields(self):
            values = getattr(self, field.name)
            if field.name in ("completion_ids", "seeds") or values is None:
                continue
            if [len(row) for row in values] != lengths:
                raise ValueError(f"Rollout: `{field.name}` does not have one value per token of each completion.")

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def lengths(self) -> list[int]:
        """Tokens of each completion."""
        return [len(ids) for ids in self.completion_ids]

    def select(self, part: slice | Sequence[int]) -> Rollout:
        """The rollout restricted to the completions in ``part`` (a slice or indices)."""

        def take(values):
            if values is None:
                return None
            return values[part] if isinstance(part, slice) else [values[i] for i in part]

        return Rollout(**{field.name: take(getattr(self, field.name)) for field in fields(self)})

    def tensor(self, name: str, pad: float = 0, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Field ``name`` as one right-padded ``[B, max T_i]`` tensor (``pad`` after each completion's end; long for
        ids, authorship and coefficients, bool for unit starts, float for log-probs unless ``dtype`` says)."""
        values = getattr(self, name)
        if values is None:
            raise ValueError(f"This rollout has no `{name}`: its generator does not compute them.")
        default = {"unit_starts": torch.bool, "senior_logprobs": torch.float32, "mixture_logprobs": torch.float32}
        dtype = dtype or default.get(name, torch.long)
        width = max(self.lengths, default=0)
        out = torch.full((len(values), width), pad, dtype=dtype)
        for row, row_values in enumerate(values):
            if row_values:
                out[row, : len(row_values)] = torch.tensor(row_values, dtype=dtype)
        return out

    def completion_mask(self) -> torch.Tensor:
        """long ``[B, max T_i]``: 1 on each completion's tokens, 0 after its end."""
        lengths = torch.tensor(self.lengths, dtype=torch.long)
        return (torch.arange(max(self.lengths, default=0)).unsqueeze(0) < lengths.unsqueeze(1)).long()

    def senior_token_share(self) -> float:
        """Share of all tokens the senior wrote (1.0 for an empty rollout)."""
        tokens = sum(self.lengths)
        return sum(map(sum, self.authorship)) / tokens if tokens else 1.0

    @classmethod
    def concatenate(cls, parts: Sequence[Rollout]) -> Rollout:
        """One rollout of the completions of ``parts``, in order (e.g. the batches of one call). A field missing from
        any part is missing from the result."""

        def joined(name: str):
            values = [getattr(part, name) for part in parts]
            return None if any(v is None for v in values) else [row for v in values for row in v]

        return cls(**{field.name: joined(field.name) for field in fields(cls)})

    @classmethod
    def from_trace(
        cls,
        completion_ids: Sequence[Sequence[int]],
        trace: HandoffTrace,
        seeds: Sequence[int],
        **extra,
    ) -> Rollout:
        """A rollout from ``[B, T]`` trace tensors, each row cut to its completion's length; ``extra`` fills
        ``senior_logprobs`` / ``mixture_logprobs``."""
        ids = [list(map(int, row)) for row in completion_ids]

        def rows(tensor: torch.Tensor, kind) -> list[list]:
            return [list(map(kind, row[: len(i)])) for row, i in zip(tensor.tolist(), ids, strict=True)]

        return cls(ids, rows(trace.authorship, int), rows(trace.unit_starts, bool), rows(trace.boundary_coef, int),
                   [int(s) for s in seeds], **extra)  # fmt: skip

    @classmethod
    def replay(
        cls,
        completion_ids: Sequence[Sequence[int]],
        seeds: Sequence[int],
        rule: HandoffRule | Sequence[HandoffRule],
        tables: BoundaryTables,
        **extra,
    ) -> Rollout:
        """The rollout of completions drawn elsewhere (e.g. a vLLM server), rebuilt from tokens and coin seeds by
        [`replay`][tandem_grpo.handoff.replay]; one rule, or one per completion; ``extra`` as in
        [`from_trace`][tandem_grpo.rollout.Rollout.from_trace].

        Raises:
            ValueError: as many seeds (and rules, when a list) as completions are needed.
        """
        count = len(completion_ids)
        rules = [rule] * count if isinstance(rule, HandoffRule) else list(rule)
        if len(rules) != count or len(seeds) != count:
            raise ValueError(f"{count} completions but {len(seeds)} seeds and {len(rules)} rules: pass one each.")
        ids = [list(map(int, row)) for row in completion_ids]
        per_token = {
            "authorship": [[] for _ in ids],
            "unit_starts": [[] for _ in ids],
            "boundary_coef": [[] for _ in ids],
        }
        for current in dict.fromkeys(rules):
            members = [i for i, r in enumerate(rules) if r == current]
            width = max((len(ids[i]) for i in members), default=0)
            padded = torch.zeros(len(members), width, dtype=torch.long)
            for row, i in enumerate(members):
                padded[row, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
            trace = replay(padded, torch.tensor([int(seeds[i]) for i in members]), tables, current)
            part = cls.from_trace([ids[i] for i in members], trace, [seeds[i] for i in members])
            for row, i in enumerate(members):
                for name, values in per_token.items():
                    values[i] = getattr(part, name)[row]
        return cls(ids, per_token["authorship"], per_token["unit_starts"], per_token["boundary_coef"],
                   [int(s) for s in seeds], **extra)  # fmt: skip

    @classmethod
    def from_engine(
        cls,
        completion_ids: Sequence[Sequence[int]],
        mixture_logprobs: list[list[float]] | None,
        records: Sequence[dict | None],
        seeds: Sequence[int],
        rule: HandoffRule | Sequence[HandoffRule],
        tables: BoundaryTables,
    ) -> Rollout:
        """The rollout of what the tandem vLLM engine returned: the record replayed
        ([`replay`][tandem_grpo.rollout.Rollout.replay]) and checked against the engine's authorship, and the senior's
        score terms from vLLM's ``log P`` and the processor's record
        ([`tandem_grpo.vllm.processor_v1`][tandem_grpo.vllm.processor_v1]).

        Args:
            completion_ids: token ids per completion, from vLLM.
            mixture_logprobs: vLLM's ``log P`` of each token per completion, or ``None``.
            records: the processor's record per completion (``tandem_pop_records``: ``authors``, ``corrections``,
                ``handovers``).
            seeds: the coin-stream seeds, as sent.
            rule: the handoff rule, as sent: one, or one per completion.
            tables: the engine's boundary tables ([`boundary_tables`][tandem_grpo.vllm.engine.boundary_tables]).

        Raises:
            RuntimeError: a record is missing or shorter than its completion less one token, or the engine's
                authorship disagrees with the replay (the engine and the client disagree on seeds, rule or boundary
                tables).
        """
        rollout = cls.replay(completion_ids, seeds, rule, tables, mixture_logprobs=mixture_logprobs)
        senior_logprobs = None if mixture_logprobs is None else []
        for i, record in enumerate(records):
            if record is None:
                raise RuntimeError(f"The tandem engine kept no record for completion {i}: was it a tandem request?")
            # The engine advances over every token but the last (the request ends before it sees that one).
            engine_authors = list(record["authors"])
            if len(engine_authors) < len(rollout.authorship[i]) - 1 or (
                engine_authors != rollout.authorship[i][: len(engine_authors)]
            ):
                raise RuntimeError(
                    f"Completion {i}: the engine's authorship differs from the replay of seed {seeds[i]}; the engine "
                    "and the client disagree on the handoff rule, seeds or boundary tables."
                )
            if senior_logprobs is not None:
                corrections, handovers = record["corrections"], record.get("handovers", [])
                senior_logprobs.append(
                    [
                        lp + (corrections[t] if t < len(corrections) else 0.0)
                        if author == 1
                        else (handovers[t] if t < len(handovers) and handovers[t] is not None else math.nan)
                        for t, (lp, author) in enumerate(zip(mixture_logprobs[i], rollout.authorship[i], strict=True))
                    ]
                )
        rollout.senior_logprobs = senior_logprobs
        return rollout
