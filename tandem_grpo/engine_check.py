"""The trainer checks the engine its rollouts come from, every step, on by default (``engine_check="warn"``).

Rollouts are drawn by one copy of the model (a vLLM engine, or the transformers decode loop) and scored by another
(the trainer's loss). Nothing else notices when the two differ: a weight the sync never reached, a packed kernel
copy a reload left stale (vLLM's CPU backend and a tied output head, before 0.4), a server on another checkpoint.
Three checks, each one exact comparison of numbers both sides already have:

1. **Agreement, every step.** At the first loss call after each generation the trainer's weights are still those the
   rollout was drawn with (the sync comes before the generation, the optimizer step after the loss). For every token
   the loss keeps whose rollout log-probability is known (TRL's ``sampling_per_token_logps``), ``|rollout - loss|``
   is logged as ``tandem/engine_logp_diff/mean`` and ``/max`` (nats, over every process). The rollout's value is the
   senior's score term over the whole vocabulary, the quantity the loss recomputes: the tandem engine's processor
   adds back ``log Z``, the mass its top-k/top-p/min-p kept (one ``logsumexp`` per row where truncation is on;
   [`tandem_grpo.vllm.side_records`][tandem_grpo.vllm.side_records]), and the transformers loop keeps the senior's
   own log-probability of each token it draws. Senior-only rollouts from TRL's vLLM engine carry vLLM's log-probs of
   the truncated distribution, comparable only without truncation. Penalties (repetition, frequency, presence) change
   the sampling distribution and not the loss's, and dropout the loss's and not the rollout's, so with either the
   figure is not computed (a warning says so at start-up).
2. **The junior** (tandem vLLM engine, colocate or server): at start-up, the engine's junior on a probe sequence
   ([`tandem_grpo.vllm.checks`][tandem_grpo.vllm.checks]) against the trainer's model as built (self-pairing: the
   junior is that model); after every weight sync, against its own values at start-up. One prefill of 12 tokens.
3. **Sync coverage** (vLLM colocate and tandem server): after every weight sync, every senior parameter the engine's
   initial load filled must have been filled again.

Past the tolerance, figure 1 warns once (``"warn"``) or raises ``RuntimeError`` before the optimizer step
(``"raise"``); checks 2 and 3 raise under both, since they find a wrong model, not numerical noise.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from .junior import is_zero3, probe_ids, probe_logits

logger = logging.getLogger(__name__)

ENGINE_CHECK_TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
"""Default ``engine_check_tolerance`` by the coarser dtype of the engine and the trainer (mean ``|Δ|`` in nats; a
single token may differ by 100 times it). float32: measured engine and loss agree to about 1e-6 (mean) on vLLM's CPU
backend and the transformers loop (``bench/engine_check_cost.py``). bfloat16 and float16: provisional, not measured
here (no GPU; vLLM's CPU backend was run in float32 only); published bf16 rollout-vs-trainer gaps are 1e-3 to 1e-2
nats per token on average."""
MAX_FACTOR = 100.0
DOCS = "https://github.com/tandem-grpo/tandem-grpo/blob/main/docs/troubleshooting.md#the-engine-check"
CAUSES = (
    "a weight the sync did not reach (a LoRA `modules_to_save`, a parameter name the engine maps elsewhere), a "
    "packed kernel copy a reload left stale (vLLM's CPU backend repacks some weights, such as an output head tied to "
    "the embedding), an engine in another dtype or quantization than the trainer, a vLLM server started on another "
    "`--model`, or logits the engine transforms and the trainer does not"
)
METRICS = ("tandem/engine_logp_diff/mean", "tandem/engine_logp_diff/max")


def tolerance_for(dtype: torch.dtype) -> float:
    """The default tolerance of ``dtype`` (float32's for a dtype without one)."""
    return ENGINE_CHECK_TOLERANCES.get(dtype, ENGINE_CHECK_TOLERANCES[torch.float32])


def disagreement(a, b, tolerance: float) -> tuple[float, float, bool]:
    """``(mean, max, within)`` of ``|a - b|`` over the positions where both are finite (``within``: mean at most
    ``tolerance`` and max at most ``MAX_FACTOR * tolerance``; true for no position)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    diff = (a - b).abs()[torch.isfinite(a) & torch.isfinite(b)]
    if not diff.numel():
        return 0.0, 0.0, True
    mean, top = diff.mean().item(), diff.max().item()
    return mean, top, mean <= tolerance and top <= MAX_FACTOR * tolerance


def reference_logprobs(model, ids: list[int]) -> list[float]:
    """``model``'s log-probability of ``ids[t]`` after ``ids[:t]`` (``t >= 1``), raw logits, float32."""
    logits = probe_logits(model, max(ids) + 1, ids=ids)[0, :-1]
    targets = torch.tensor(ids[1:], device=logits.device).unsqueeze(1)
    return torch.log_softmax(logits, dim=-1).gather(1, targets)[:, 0].tolist()


def active_dropout(model: torch.nn.Module) -> str:
    """The dropout that is on in ``model`` in training, named (``""`` when none): ``torch.nn.Dropout`` modules with
    ``p > 0`` (LoRA's ``lora_dropout`` included; TRL's ``disable_dropout=True`` zeroes them) and attention modules'
    ``attention_dropout`` (transformers reads it from the config at load time; TRL leaves it)."""
    rates = sorted({m.p for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0})
    attention = {getattr(m, "attention_dropout", None) for m in model.modules()}
    attention = sorted(p for p in attention if isinstance(p, float) and p > 0)
    found = [f"Dropout p={', '.join(f'{p:g}' for p in rates)}: set disable_dropout=True"] if rates else []
    if attention:
        found.append(f"attention_dropout={', '.join(f'{p:g}' for p in attention)}: load the model with "
                     "attention_dropout=0.0")  # fmt: skip
    return "; ".join(found)


class EngineCheck:
    """The checks of one [`TandemGRPOTrainer`][tandem_grpo.trainer.TandemGRPOTrainer] (module docstring).

    Args:
        trainer: the trainer, built (its vLLM backend, if any, started).
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        args = trainer.args
        self.mode = args.engine_check
        self.tolerance = float(args.engine_check_tolerance or tolerance_for(self._dtype()))
        self.generation = getattr(trainer, "vllm_generation", None) if trainer.use_vllm else None
        self.tandem = self.generation is not None and hasattr(self.generation, "generate_tandem")
        self.ids = probe_ids(len(trainer._tokenizer))
        self.junior_probe: list[float] | None = None
        self.figure_off = self._why_not_exact()
        self.due = False
        self.warned = False
        self.unchecked_warned = False

    def _dtype(self) -> torch.dtype:
        args = self.trainer.args
        if args.bf16:
            return torch.bfloat16
        if args.fp16:
            return torch.float16
        dtypes = [next(self.trainer.model.parameters()).dtype]
        llm = getattr(getattr(self.trainer, "vllm_generation", None), "llm", None)
        if llm is not None:
            dtypes.append(llm.llm_engine.model_config.dtype)
        coarser = [d for d in dtypes if d != torch.float32]
        return coarser[0] if coarser else torch.float32

    def _why_not_exact(self) -> str | None:
        """Why the rollout's log-probs cannot equal the loss's (penalties, dropout, or vLLM's own truncation), else
        None."""
        trainer, extra = self.trainer, dict(self.trainer.args.generation_kwargs or {})
        penalties = {"repetition_penalty": trainer.repetition_penalty, **extra}
        on = [name for name in ("repetition_penalty", "frequency_penalty", "presence_penalty")
              if penalties.get(name) not in (None, 0, 0.0, 1, 1.0)]  # fmt: skip
        if on:
            return f"{', '.join(on)} change the sampling distribution and not the loss's"
        dropout = active_dropout(trainer.model)
        if dropout:
            return f"dropout is on in training and off in the rollout, so the loss's log-probs are noisy ({dropout})"
        # TRL's vLLM path applies generation_kwargs over the trainer's own settings.
        settings = {"top_k": trainer.top_k, "top_p": trainer.top_p, "min_p": trainer.min_p, **extra}
        truncating = settings["top_k"] or (settings["top_p"] or 1.0) < 1.0 or settings["min_p"]
        if self.generation is not None and not self.tandem and truncating:
            return "TRL's vLLM engine reports log-probs of the truncated distribution (top_k, top_p or min_p)"
        return None

    # ------------------------------------------------------------------ start-up and weight syncs
    def start(self) -> None:
        """Hook the checks into the vLLM backend and check the tandem engine's junior (module docstring, 2).

        Raises:
            RuntimeError: the engine's junior does not compute the trainer's initial function (self-pairing).
        """
        if self.mode == "off":
            return
        if self.figure_off:
            logger.warning("engine_check: the per-step figure is not computed: %s. See %s.", self.figure_off, DOCS)
        if self.generation is None:
            return
        self.generation.sync_checks = lambda **kwargs: self.on_main(lambda engine: self.after_sync(engine, **kwargs))
        if not self.tandem:
            return
        trainer = self.trainer
        reference = None
        if trainer.args.junior_model_name_or_path is None:
            if is_zero3(trainer) or trainer.is_fsdp_enabled:
                # No rank holds the whole model before training (ZeRO-3 shards, FSDP's cpu_ram_efficient_loading);
                # a partitioned forward is a collective. The junior is still checked against itself after syncs.
                logger.info("engine_check: the junior's start-up comparison with the trainer's model is skipped "
                            "under ZeRO-3 and FSDP (no rank holds the whole model before training).")  # fmt: skip
            else:
                reference = reference_logprobs(trainer.model, self.ids)  # every rank
        self.on_main(lambda engine: self._first_junior_probe(engine, reference))

    def _first_junior_probe(self, engine, reference) -> None:
        from .vllm.checks import probe_logprobs

        with self._awake():
            self.junior_probe = probe_logprobs(engine, self.ids, "junior")
        if reference is None:
            return
        mean, top, ok = disagreement(self.junior_probe, reference, self.tolerance)
        if not ok:
            raise RuntimeError(
                f"The rollout engine's junior does not compute the senior's initial function (self-pairing): its "
                f"log-probs on a probe differ from the trainer's model by mean {mean:.3g}, max {top:.3g} nats "
                f"(tolerance {self.tolerance:g}). Likely causes: a vLLM server started on another `--model` or with "
                "`--junior-model`, a model given to the trainer with an adapter loaded or weights changed in "
                "memory (the engine loads the checkpoint on disk), or another dtype. Start the server on this "
                f"model, or pass the checkpoint the model was loaded from. See {DOCS}."
            )

    def on_main(self, check) -> None:
        """Run ``check(engine)``: on every process in colocate mode; in server mode on the main process, whose
        ``RuntimeError`` every process then raises."""
        generation = self.generation
        if generation.mode == "colocate":
            return check(generation.llm)
        from accelerate.utils import broadcast_object_list

        error = [None]
        if self.trainer.accelerator.is_main_process:
            try:
                check(generation.vllm_client)
            except Exception as err:  # any failure (a refused request, a timeout) must reach every rank, or they hang
                error[0] = str(err) if isinstance(err, RuntimeError) else f"{type(err).__name__}: {err}"
        broadcast_object_list(error, from_process=0)
        if error[0]:
            raise RuntimeError(error[0])

    @contextlib.contextmanager
    def _awake(self):
        """Colocated sleep mode between generations: weights and KV cache woken for a probe, put back to sleep."""
        generation = self.generation
        asleep = generation.mode == "colocate" and getattr(generation, "_llm_weights_sleeping", False)
        if asleep:
            generation.llm.wake_up(tags=["weights"])
            generation.llm.wake_up(tags=["kv_cache"])
        try:
            yield
        finally:
            if asleep:
                generation.llm.sleep(level=2)

    def after_sync(self, engine, loaded: set[str] | None = None, model=None) -> None:
        """After a weight sync (the backend calls it, engine awake): coverage, then the junior's probe.

        Args:
            engine: the colocated ``vllm.LLM`` or the client.
            loaded: the names a senior-only engine's reload returned (``None``: the tandem engine keeps its own).
            model: the senior-only engine's model (with ``loaded``).

        Raises:
            RuntimeError: a senior parameter the sync did not reach, or a junior that changed.
        """
        from .vllm.checks import probe_logprobs, sync_coverage, uncovered

        step = self.trainer.state.global_step + 1  # the sync precedes this step's generation
        missing = uncovered(model, loaded) if loaded is not None else sync_coverage(engine)
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise RuntimeError(
                f"Optimizer step {step}: the weight sync reached no value for {len(missing)} senior parameter(s) of "
                f"the rollout engine: {shown}. They keep their old values, so rollouts would not come from the model "
                "being trained. Likely causes: a parameter the trainer does not send (a LoRA `modules_to_save`, a "
                "bias the engine has and the model does not) or sends under a name the engine does not map. See "
                f"{DOCS}."
            )
        if self.junior_probe is None:
            return
        now = probe_logprobs(engine, self.ids, "junior")
        mean, top, ok = disagreement(now, self.junior_probe, self.tolerance)
        if not ok:
            raise RuntimeError(
                f"Optimizer step {step}: the rollout engine's junior changed since start-up (probe log-probs moved "
                f"by mean {mean:.3g}, max {top:.3g} nats): the weight sync or a sleep/wake cycle reached the frozen "
                f"junior. See {DOCS}."
            )

    # ------------------------------------------------------------------ every step
    def generated(self) -> None:
        """A training generation happened: the next loss call compares (module docstring, 1)."""
        self.due = self.mode != "off" and self.figure_off is None and self.trainer.model.training

    def at_loss(self, logps: torch.Tensor, keep: torch.Tensor, inputs: dict) -> None:
        """Compare the loss's log-probs ``[B, T]`` with the rollout's on the kept positions ``keep`` ``[B, T]``, log
        the figures and act on them, once per generation.

        Raises:
            RuntimeError: past the tolerance under ``engine_check="raise"``.
        """
        if not self.due:
            return
        self.due = False
        rollout = inputs.get("sampling_per_token_logps")
        if not isinstance(rollout, torch.Tensor) or rollout.shape != logps.shape:
            if not self.unchecked_warned:
                self.unchecked_warned = True
                logger.warning("engine_check: the rollout carries no log-probs of its tokens (TRL's own "
                               "transformers generation returns none): no per-step figure.")  # fmt: skip
            return
        diff = (rollout.float() - logps.detach().float()).abs()
        where = keep & torch.isfinite(diff)
        picked = diff[where]
        stats = torch.tensor(
            [picked.sum().item(), float(picked.numel()), picked.max().item() if picked.numel() else 0.0],
            dtype=torch.float64,
            device=logps.device,
        )
        total, count, top = self.trainer.accelerator.gather(stats).view(-1, 3).T
        if count.sum() == 0:
            return
        mean, top = (total.sum() / count.sum()).item(), top.max().item()
        metrics = self.trainer._metrics["train"]
        metrics[METRICS[0]].append(mean)
        metrics[METRICS[1]].append(top)
        if mean <= self.tolerance and top <= MAX_FACTOR * self.tolerance:
            return
        message = (
            f"Optimizer step {self.trainer.state.global_step + 1}: the rollout engine's log-probabilities of the "
            f"senior's tokens differ from the trainer's by mean {mean:.3g}, max {top:.3g} nats over "
            f"{int(count.sum().item())} tokens (tolerance {self.tolerance:g} mean, {MAX_FACTOR * self.tolerance:g} "
            "max), at the first loss after the weights were synced: the rollouts do not come from the model being "
            f"trained. Likely causes: {CAUSES}. Run `tandem-grpo check` with this model on this machine; see {DOCS}."
        )
        if self.mode == "raise":
            raise RuntimeError(message + " Stopped before the optimizer step (engine_check='raise').")
        if not self.warned:
            self.warned = True
            logger.warning("%s The figures are logged every step as %s (engine_check='warn').", message, METRICS[0])
