"""The loss terms of ``handoff_mode="whole_unit"``: the senior's ``log p_s(B)`` at handoffs (paper section 3).

The terms ([`senior_token_terms`][tandem_grpo.handoff.senior_token_terms]; docs/method.md, "The two handoff rules")
go into every per-token log-prob TRL computes (current, old, reference), from the backbone's hidden states at the
handoff positions only (a forward hook; full logits never materialized).
[`TandemGRPOTrainer`][tandem_grpo.trainer.TandemGRPOTrainer] builds a
[`WholeUnitTerms`][tandem_grpo.whole_unit.WholeUnitTerms] only under that rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from accelerate.utils import is_peft_model

from .handoff import BoundaryTables, boundary_logprobs, senior_token_terms, unit_start_ids
from .models import resolve_model_path

COEF_KEY = "tandem_boundary_coef"
"""Key of the ``[B, T]`` long coefficients in TRL's batch: -1 where the senior takes a unit over, +1 where it hands
one to the junior, 0 elsewhere."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                     "logits_scaling")  # fmt: skip

ZERO3_MESSAGE = (
    "handoff_mode='whole_unit' is not supported under DeepSpeed ZeRO-3 (its log p_s(B) terms read the LM head outside "
    "the model's forward): use handoff_mode='after_boundary' (the default), ZeRO-2 or FSDP2."
)


def check_whole_unit_supported(model, args) -> None:
    """Refuse what the ``log p_s(B)`` terms would miss: they apply the LM head and the temperature themselves.

    Args:
        model: the senior, a model or a name or path (its config is read, no weights).
        args: the ``TandemGRPOConfig``.

    Raises:
        ValueError: the model transforms its logits (soft-capping, scaling), or DeepSpeed ZeRO-3 is configured.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model_path(model)) if isinstance(model, str) else model.config
    text = config.get_text_config()
    transforms = [name for name in _LOGIT_TRANSFORMS if getattr(text, name, None) not in (None, 1.0)]
    if transforms:
        raise ValueError(
            f"handoff_mode='whole_unit' does not support models that transform their logits ({', '.join(transforms)} "
            f"in {type(config).__name__}): use handoff_mode='after_boundary' (the default)."
        )
    deepspeed = getattr(args, "hf_deepspeed_config", None)
    if deepspeed is not None and deepspeed.is_zero3():
        raise ValueError(ZERO3_MESSAGE)


def pad_columns(values: torch.Tensor, width: int) -> torch.Tensor:
    """``values`` [B, T] right-padded with zeros to ``width`` columns (unchanged when it has that many or more)."""
    if values.shape[1] >= width:
        return values
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def causal_lm(model):
    """The causal LM that carries TRL's fused head: the base model of a PEFT wrapper, else the model."""
    return model.get_base_model() if is_peft_model(model) else model


class WholeUnitTerms:
    """The ``log p_s(B)`` terms of one trainer: the coefficients carried with its batches, and their log-probs.

    Args:
        tables: the trainer's boundary tables.
        args: the ``TandemGRPOConfig`` (its ``handoff_rule`` and ``cast_lm_head_to_fp32``).
        temperature: TRL's scoring temperature.
        unwrap_model: ``accelerator.unwrap_model``.
        zero3: DeepSpeed ZeRO-3 is on (known only once the trainer is built).

    Raises:
        ValueError: ``zero3``.
    """

    def __init__(self, tables: BoundaryTables, args, temperature: float, unwrap_model: Callable, zero3: bool = False):
        if zero3:
            raise ValueError(ZERO3_MESSAGE)
        self.tables, self.rule, self.temperature = tables, args.handoff_rule, temperature
        self.cast_lm_head_to_fp32, self.unwrap_model = args.cast_lm_head_to_fp32, unwrap_model
        # Coefficients ([B, T] long) of the batch being scored at generation, and of the batch in the loss.
        self.scoring_coef: torch.Tensor | None = None
        self.loss_coef: torch.Tensor | None = None

    def carry(self, rollout, device: torch.device) -> None:
        """Keep a rollout's coefficients, on ``device``, for the scoring of its batch. Carried even when all 0: then
        every process runs the same LM-head computation (a collective under FSDP2) whether or not its batch holds a
        handoff."""
        self.scoring_coef = rollout.tensor("boundary_coef").to(device)

    def generate_and_score(self, generate_and_score: Callable[[dict], dict], inputs) -> dict:
        """Run TRL's ``_generate_and_score_completions`` and add the coefficients to its output under ``COEF_KEY``
        (a ``[B, T]`` tensor travels with the batch through TRL's shuffle and split into the loss)."""
        self.scoring_coef = None
        try:
            output = generate_and_score(inputs)
            if self.scoring_coef is not None:
                output[COEF_KEY] = pad_columns(self.scoring_coef, output["completion_ids"].shape[1])
            return output
        finally:
            self.scoring_coef = None

    @contextlib.contextmanager
    def in_loss(self, inputs):
        """The loss's batch (``inputs``) supplies the coefficients while the block runs."""
        self.loss_coef = inputs.get(COEF_KEY)
        try:
            yield
        finally:
            self.loss_coef = None

    def per_token_logps(
        self, score: Callable[[], tuple], model, input_ids: torch.Tensor, logits_to_keep: int, in_loss: bool
    ) -> tuple:
        """TRL's ``_get_per_token_logps_and_entropies`` result (``score()``) with the terms added to its log-probs.

        Raises:
            RuntimeError: the coefficients, or the rows the hook saw, do not fit what TRL scored.
        """
        coef = self.loss_coef if in_loss else self.scoring_coef
        if coef is None:
            return score()
        # TRL pads completions to `pad_to_multiple_of`: the padding columns carry no term.
        coef = pad_columns(coef, logits_to_keep)
        if tuple(coef.shape) != (input_ids.shape[0], logits_to_keep):
            raise RuntimeError(
                f"The log p_s(B) coefficients have shape {tuple(coef.shape)} but TRL scores "
                f"{(input_ids.shape[0], logits_to_keep)} completion positions: the batch and its coefficients "
                "were split differently (a TRL change TandemGRPOTrainer does not follow)."
            )
        with self._hidden_states(model, logits_to_keep) as hidden:
            logps, *rest = score()
        return (self._with_terms(model, logps, hidden, coef, input_ids[:, -logits_to_keep:]), *rest)

    @contextlib.contextmanager
    def _hidden_states(self, model, positions: int):
        """Collect the backbone's last hidden states at the ``positions`` that predict completion tokens (one
        ``[b, positions, H]`` tensor per chunk TRL scores), through a forward hook on the backbone TRL's fused LM
        head calls (``model.base_model``; TRL's head reads ``last_hidden_state[:, :-1]``)."""
        captured: list[torch.Tensor] = []

        def keep(module, args, output):
            states = output[0] if isinstance(output, tuple) else output.last_hidden_state
            captured.append(states[:, -positions - 1 : -1])

        handle = causal_lm(self.unwrap_model(model)).base_model.register_forward_hook(keep)
        try:
            yield captured
        finally:
            handle.remove()

    def _with_terms(
        self, model, logps: torch.Tensor, hidden: list[torch.Tensor], coef: torch.Tensor, completion_ids: torch.Tensor
    ) -> torch.Tensor:
        """``logps`` [B, T] with the senior's exact terms where ``coef != 0``: ``log p_s(x) - log p_s(B)`` where the
        senior took a unit over (-1), ``log p_s(B)`` where it handed one to the junior (+1).

        The whole term at those positions comes from one set of logits: the LM head applied to the hidden states of
        those positions alone, at TRL's temperature, in the head's dtype (float32 with ``cast_lm_head_to_fp32``),
        normalized in float32 over every logits column as TRL's own log-probs are."""
        rows_seen = sum(h.shape[0] for h in hidden)
        if rows_seen != logps.shape[0]:
            raise RuntimeError(
                f"The backbone hook saw {rows_seen} rows in {len(hidden)} forward passes while TRL scored "
                f"{logps.shape[0]}: the log p_s(B) terms cannot be placed (a TRL change TandemGRPOTrainer does not "
                "follow)."
            )
        head = causal_lm(self.unwrap_model(model)).get_output_embeddings()
        weight, bias = head.weight, head.bias
        if hasattr(weight, "full_tensor"):  # FSDP2 DTensor, gathered as TRL's fused head does
            weight = weight.full_tensor()
            bias = bias.full_tensor() if bias is not None else None
        states = torch.cat(hidden, dim=0)  # [B, T, H], position t predicting completion token t
        rows, cols = coef.nonzero(as_tuple=True)
        picked = states[rows, cols].to(weight.device)
        if self.cast_lm_head_to_fp32:
            with torch.autocast(picked.device.type, enabled=False):
                logits = torch.nn.functional.linear(
                    picked.float(), weight.float(), None if bias is None else bias.float()
                )
        else:
            logits = torch.nn.functional.linear(picked.to(weight.dtype), weight, bias)
        logprobs = torch.log_softmax(logits.float() / self.temperature, dim=-1)  # [N, W]
        ids = torch.zeros(logprobs.shape[-1], dtype=torch.bool, device=logprobs.device)
        ids[: self.tables.vocab_size] = unit_start_ids(self.tables, self.rule).to(logprobs.device)
        token_lp = logprobs.gather(1, completion_ids[rows, cols].to(logprobs.device).unsqueeze(1)).squeeze(1)
        terms, _ = senior_token_terms(
            token_lp,
            boundary_logprobs(logprobs, ids),
            (coef[rows, cols] != 1).long(),  # at +1 the token is the junior's: log p_s(B) alone
            coef[rows, cols],
        )
        return logps.index_put((rows, cols), terms.to(logps.dtype).to(logps.device))
