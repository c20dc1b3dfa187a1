"""TRL integration: a tandem ``VLLMGeneration`` for ``GRPOTrainer`` (colocate and server modes).

TRL 1.16 builds its vLLM backend in ``GRPOTrainer.__init__`` as ``VLLMGeneration(...)``
(``trl/generation/vllm_generation.py``), which in turn builds ``vllm.LLM(...)`` (colocate) or ``VLLMClient(...)``
(server). The tandem versions reuse all of it:

- [`TandemVLLMGeneration`][tandem_grpo.vllm.trl_generation.TandemVLLMGeneration] subclasses ``VLLMGeneration``; its
  ``_init_vllm`` runs TRL's own ``_init_vllm`` with the module-level names ``LLM`` / ``VLLMClient`` that TRL calls
  swapped, for that call only, for factories that add the tandem engine arguments
  ([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs]) or build a
  [`TandemVLLMClient`][tandem_grpo.vllm.client.TandemVLLMClient]. Every other TRL behaviour (TP groups, env setup,
  quantization detection, ``sync_weights`` for FSDP/DeepSpeed/PEFT, prefix-cache reset) is TRL's code, unchanged.
- Weight sync streams TRL's own ``_iter_named_params()`` into the senior only: TRL's ``sync_weights`` in server
  mode; in colocate mode [`TandemForCausalLM.reload_senior`][tandem_grpo.vllm.model.TandemForCausalLM.reload_senior]
  (vLLM's in-place reload; TRL's per-tensor ``load_weights`` fails on backends that repack weights, such as vLLM's
  CPU backend). The junior never changes.
- Sleep mode (colocate, ``vllm_enable_sleep_mode=True``): TRL puts the engine to sleep at level 2 (weights
  discarded) between generations and re-pushes the trained weights. The tandem engine asks vLLM to keep the junior's
  parameters across that sleep (``sleep_preserve_parameter_names=["junior.*"]``, vLLM's ``ModelConfig``; vLLM copies
  them to host memory and back), wakes the weights before each weight sync, and the sync streams the senior's
  weights only. vLLM without that option: sleep mode is refused.
- [`use_tandem_vllm`][tandem_grpo.vllm.trl_generation.use_tandem_vllm] is the context the trainer's ``__init__`` runs
  ``super().__init__`` in, so that ``GRPOTrainer`` constructs a
  [`TandemVLLMGeneration`][tandem_grpo.vllm.trl_generation.TandemVLLMGeneration] where it would construct a
  ``VLLMGeneration``.
- [`tandem_generate_vllm`][tandem_grpo.vllm.trl_generation.tandem_generate_vllm] is what the trainer's
  ``_generate_single_turn`` calls instead of ``self.vllm_generation.generate``: the vLLM counterpart of the
  transformers path's [`tandem_generate`][tandem_grpo.generation.tandem_generate].
"""

from __future__ import annotations

import contextlib
import functools
import logging
import urllib.parse
from collections.abc import Iterator

from ..handoff import HandoffRule
from ..rollout import Rollout
from ..sampling import SamplingSettings, default_eos_token_ids
from ._compat import JUNIOR_SLEEP_PATTERN, check_sleep_preservation, check_vllm
from .engine import (
    CPU_KV_CACHE_BYTES,
    boundary_tables,
    cpu_kv_cache_default,
    engine_kwargs,
    generate_with_llm,
    select_processor,
)

try:  # TRL imports vLLM lazily; the module itself imports without it.
    import trl.generation.vllm_generation as _trl_vllm_generation
    from trl.generation.vllm_generation import VLLMGeneration
except ImportError:  # pragma: no cover - TRL is a hard dependency of the package
    _trl_vllm_generation = None
    VLLMGeneration = object

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _swap_attr(module, name: str, value) -> Iterator[None]:
    if not hasattr(module, name):
        raise RuntimeError(
            f"{module.__name__} has no `{name}`; this tandem-grpo release supports trl>=1.16,<1.17 (see pyproject)."
        )
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def serve_command(
    model: str,
    junior_model: str | None,
    host: str | None = None,
    port: int | None = None,
    base_url: str | None = None,
) -> str:
    """The shell command that starts a tandem server for ``model`` (used in error messages and the README).

    ``base_url``, when given, wins over ``host`` and ``port``, as in TRL's ``VLLMGeneration``.
    """
    if base_url is not None:
        url = urllib.parse.urlsplit(base_url)
        host, port = url.hostname, url.port or port
    parts = ["tandem-grpo vllm-serve --model", model]
    if junior_model:
        parts += ["--junior-model", junior_model]
    if port is not None:
        parts += ["--port", str(port)]
    if host not in (None, "0.0.0.0", "localhost", "127.0.0.1"):
        parts += ["--host", str(host)]
    return " ".join(parts)


class TandemVLLMGeneration(VLLMGeneration):
    """TRL's ``VLLMGeneration`` with a tandem engine (module docstring).

    Args:
        *args: ``VLLMGeneration``'s positional arguments, as ``GRPOTrainer`` passes them.
        rule: the handoff rule (``HandoffRule.from_config(args)``).
        junior_model: the junior's folder or hub id; ``None`` = a frozen copy of the senior's initial weights.
        llm_kwargs: extra ``vllm.LLM`` arguments for colocate mode, on top of TRL's (e.g. ``enforce_eager=True``,
            ``dtype="float32"`` on a CPU); ignored in server mode (pass server flags to ``tandem-grpo vllm-serve``).
        **kwargs: ``VLLMGeneration``'s keyword arguments, as ``GRPOTrainer`` passes them.

    Raises:
        NotImplementedError: ``enable_sleep_mode=True`` in colocate mode on a vLLM without
            ``sleep_preserve_parameter_names`` (the junior would not survive sleep level 2), or
            ``model_impl="transformers"`` (the tandem model is a vLLM class).
        ValueError: structured outputs (they constrain the senior's logits only), or a junior whose vocabulary
            differs from the senior's.
        ImportError: vLLM missing or older than the minimum version.
        ConnectionError: server mode, no server at the address (the message has the command that starts one).
    """

    def __init__(
        self, *args, rule: HandoffRule, junior_model: str | None = None, llm_kwargs: dict | None = None, **kwargs
    ) -> None:
        self.rule = rule
        self.junior_model = junior_model
        self.llm_kwargs = dict(llm_kwargs or {})
        # Set by the trainer (tandem_grpo.engine_check): run once after each weight sync, the engine awake.
        self.sync_checks = None
        self._checks_due = False
        super().__init__(*args, **kwargs)

    # --- construction ---------------------------------------------------------------------------------------------

    def _eos_token_ids(self) -> list[int]:
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        return default_eos_token_ids(tokenizer, getattr(self.model, "generation_config", None))

    def _init_vllm(self) -> None:
        check_vllm()
        if self.structured_outputs_regex is not None:
            raise ValueError("vllm_structured_outputs_regex is not supported by tandem generation.")
        if self.mode == "colocate":
            if self.enable_sleep_mode:
                check_sleep_preservation()
            if self.model_impl == "transformers":
                raise NotImplementedError("vllm_model_impl='transformers' cannot host the tandem model; use 'vllm'.")
            from ..models import resolve_model_path

            extra = engine_kwargs(
                self.model.name_or_path,
                resolve_model_path(self.junior_model) if self.junior_model else None,
                eos_token_ids=self._eos_token_ids(),
                trust_remote_code=self.trust_remote_code,
                options=self.llm_kwargs,
            )
            original_llm = _trl_vllm_generation.LLM

            def tandem_llm(*args, **kwargs):
                return original_llm(*args, **self.engine_options(kwargs, extra))

            with _swap_attr(_trl_vllm_generation, "LLM", tandem_llm):
                super()._init_vllm()
        elif self.mode == "server":
            from .client import TandemVLLMClient

            hint = serve_command(
                self.model.name_or_path, self.junior_model, self.server_host, self.server_port, self.server_base_url
            )
            with _swap_attr(_trl_vllm_generation, "VLLMClient", functools.partial(TandemVLLMClient, start_hint=hint)):
                super()._init_vllm()
            if self.accelerator.is_main_process:
                info = self.vllm_client.check_tandem()
                served = info.get("junior_path")
                if (self.junior_model is None) != (served is None):
                    raise RuntimeError(
                        f"junior_model_name_or_path={self.junior_model!r} but the server's junior is "
                        f"{served or 'a copy of its senior'}: the server's junior is the one that would co-generate. "
                        f"Restart the server with `{hint}`."
                    )
                from ..models import resolve_model_path

                named = resolve_model_path(self.junior_model) if self.junior_model is not None else None
                if named is not None and served != named:
                    # Another folder may hold the same weights (a server on another machine): said, not refused.
                    logger.warning(
                        "junior_model_name_or_path=%r resolves to %s here; the server's junior was loaded from %s. "
                        "If these are not the same weights, restart the server with `%s`.",
                        self.junior_model, named, served, hint,
                    )  # fmt: skip
        else:
            super()._init_vllm()  # raises TRL's error for an unknown mode

    def engine_options(self, trl_kwargs: dict, tandem_kwargs: dict) -> dict:
        """The ``vllm.LLM`` keyword arguments of the colocated engine: TRL's (``trl_kwargs``), the tandem engine's
        ([`engine_kwargs`][tandem_grpo.vllm.engine.engine_kwargs]), ``llm_kwargs``; on a CPU an explicit KV cache;
        with sleep mode, ``junior.*`` added to ``sleep_preserve_parameter_names``; the logits processor of the runner
        vLLM will pick ([`select_processor`][tandem_grpo.vllm.engine.select_processor])."""
        kwargs = {**trl_kwargs, **tandem_kwargs, **self.llm_kwargs}
        # The training model already sits in this process: see build_llm on the CPU KV-cache size.
        if cpu_kv_cache_default(kwargs):
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if kwargs.get("enable_sleep_mode"):
            kept = list(kwargs.get("sleep_preserve_parameter_names") or [])
            kwargs["sleep_preserve_parameter_names"] = [*kept, JUNIOR_SLEEP_PATTERN]
        select_processor(kwargs)
        return kwargs

    def sync_weights(self) -> None:
        """Push the training model's weights into the senior (module docstring); the junior is never touched."""
        self._checks_due = True
        if self.mode != "colocate":
            return super().sync_weights()
        self._wake_weights()
        model = self.engine_model()
        # Clones: the reload buffers a layer's tensors until the layer is complete, and a parameter TRL gathered
        # (DeepSpeed ZeRO-3, FSDP) is released when its gather context exits.
        model.reload_senior((name, tensor.detach().clone()) for name, tensor in self._iter_named_params())
        self.llm.reset_prefix_cache()

    def _wake_weights(self) -> None:
        """Sleep mode: map the engine's weights back before loading into them (TRL's ``sync_weights`` does the
        same); vLLM restores the preserved junior here."""
        _wake_weights(self)

    def engine_model(self):
        """The colocated engine's [`TandemForCausalLM`][tandem_grpo.vllm.model.TandemForCausalLM] (senior and
        junior), in this process."""
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    # --- generation -----------------------------------------------------------------------------------------------

    def sampling_settings(self) -> SamplingSettings:
        """The trainer's sampling settings (TRL passes ``GRPOConfig``'s fields to ``VLLMGeneration``)."""
        return SamplingSettings.from_config(self)

    def generate_tandem(self, prompt_ids: list[list[int]], num_generations: int, seeds: list[int]) -> Rollout:
        """Tandem completions for this process's ``prompt_ids`` (one entry per completion, as TRL passes them).

        Args:
            prompt_ids: ``B`` prompts (token ids), each prompt repeated ``num_generations`` times in a row.
            num_generations: completions per prompt (used for TRL's server-mode bookkeeping only).
            seeds: ``B`` coin-stream seeds, distinct per completion (the rollout replays its unit starts from them).

        Returns:
            The [`Rollout`][tandem_grpo.rollout.Rollout] of this process's completions (``senior_logprobs`` ``None``
            if vLLM returned no log-probs).
        """
        if len(prompt_ids) != len(seeds):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(seeds)} seeds: pass one seed per completion.")
        sampling = self.sampling_settings()
        if self.mode == "server":
            self._run_sync_checks()
            return self._generate_server(prompt_ids, seeds, sampling)
        sleeping = self.enable_sleep_mode
        if sleeping and getattr(self, "_llm_weights_sleeping", False):
            self.sync_weights()  # as TRL's generate: level 2 discarded the senior's weights
        if sleeping:
            self.llm.wake_up(tags=["kv_cache"])
        self._run_sync_checks()
        rollout = self._generate_colocate(prompt_ids, seeds, sampling)
        if sleeping:
            self.llm.sleep(level=2)
            self._llm_weights_sleeping = True
        return rollout

    def _run_sync_checks(self) -> None:
        """``sync_checks()`` once after each weight sync (tandem_grpo.engine_check), before the next generation."""
        if self._checks_due and self.sync_checks is not None:
            self._checks_due = False
            self.sync_checks()

    def _generate_in_process(self, prompt_ids, seeds, sampling: SamplingSettings):
        return generate_with_llm(
            self.llm,
            prompt_ids,
            seeds,
            self.rule,
            sampling,
            max_tokens=self.max_completion_length,
            generation_kwargs=self.generation_kwargs,
        )

    def _generate_colocate(self, prompt_ids, seeds, sampling: SamplingSettings):
        import torch

        if self.tensor_parallel_size > 1:
            # Same scheme as TRL: every rank of a TP group generates the group's prompts and keeps its own share.
            gathered = [None] * self.tensor_parallel_size
            torch.distributed.all_gather_object(gathered, (list(prompt_ids), list(seeds)), group=self.tp_group)
            all_prompts = [p for prompts, _ in gathered for p in prompts]
            all_seeds = [s for _, group_seeds in gathered for s in group_seeds]
            rollout = self._generate_in_process(all_prompts, all_seeds, sampling)
            rank = torch.distributed.get_rank(group=self.tp_group)
            share = slice(rank * len(prompt_ids), (rank + 1) * len(prompt_ids))
            return rollout.select(share)
        return self._generate_in_process(prompt_ids, seeds, sampling)

    def _generate_server(self, prompt_ids, seeds, sampling: SamplingSettings):
        from accelerate.utils import broadcast_object_list, gather_object

        all_prompts = gather_object(list(prompt_ids))
        all_seeds = gather_object(list(seeds))
        if self.accelerator.is_main_process:
            ids, mixture, records = self.vllm_client.generate_tandem(
                all_prompts,
                all_seeds,
                self.rule,
                sampling,
                max_tokens=self.max_completion_length,
                generation_kwargs=self.generation_kwargs,
            )
            info = self.vllm_client.check_tandem()
            tables = boundary_tables(
                self.model.name_or_path, int(info["vocab_size"]), tuple(int(i) for i in info["eos_token_ids"])
            )
            payload = Rollout.from_engine(ids, mixture, records, all_seeds, self.rule, tables)
        else:
            payload = None
        box = [payload]
        broadcast_object_list(box, from_process=0)
        index = self.accelerator.process_index
        return box[0].select(slice(index * len(prompt_ids), (index + 1) * len(prompt_ids)))


class SeniorVLLMGeneration(VLLMGeneration):
    """TRL's ``VLLMGeneration`` for senior-only rollouts (``junior_probability == 0`` or ``kl_to_junior``): TRL's
    engine and generation, with two changes in colocate mode.

    - ``llm_kwargs`` reach ``vllm.LLM`` (``dtype="float32"``, ``enforce_eager=True`` on a CPU), as for the tandem
      engine, so that every arm of a study samples from the same engine settings.
    - ``sync_weights`` loads through vLLM's in-place reload lifecycle (``initialize_layerwise_reload`` /
      ``finalize_layerwise_reload``), as the tandem engine's senior does: TRL's per-tensor ``model.load_weights``
      fails on backends that repack weights after loading (vLLM's CPU backend: ``'Parameter' object has no attribute
      'weight_loader'``).

    Server mode is TRL's, unchanged.
    """

    def __init__(self, *args, llm_kwargs: dict | None = None, **kwargs) -> None:
        self.llm_kwargs = dict(llm_kwargs or {})
        self.sync_checks = None  # as TandemVLLMGeneration's; called with the names each colocated sync loaded
        super().__init__(*args, **kwargs)

    def _init_vllm(self) -> None:
        if self.mode != "colocate" or not self.llm_kwargs:
            return super()._init_vllm()
        original_llm = _trl_vllm_generation.LLM

        def llm(*args, **kwargs):
            kwargs.update(self.llm_kwargs)
            return original_llm(*args, **kwargs)

        with _swap_attr(_trl_vllm_generation, "LLM", llm):
            super()._init_vllm()

    def sync_weights(self) -> None:
        if self.mode != "colocate":
            return super().sync_weights()
        from .model import reload_in_place

        _wake_weights(self)
        engine = self.llm.llm_engine
        model = engine.model_executor.driver_worker.model_runner.model
        # Clones, as in TandemVLLMGeneration.sync_weights.
        weights = ((name, tensor.detach().clone()) for name, tensor in self._iter_named_params())
        loaded = reload_in_place(model, engine.model_config, model.load_weights, weights)
        self.llm.reset_prefix_cache()
        if self.sync_checks is not None:
            self.sync_checks(loaded=set(loaded), model=model)


def _wake_weights(generation) -> None:
    """TRL's wake-up before a colocate weight sync (``VLLMGeneration.sync_weights``, TRL 1.16), for the overrides
    here: with sleep mode on, the weights are mapped back (and preserved parameters restored) first."""
    if generation.enable_sleep_mode:
        _trl_vllm_generation.empty_cache()
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False


@contextlib.contextmanager
def use_tandem_vllm(args, **llm_kwargs) -> Iterator[None]:
    """Run ``GRPOTrainer.__init__`` inside this so that it builds a
    [`TandemVLLMGeneration`][tandem_grpo.vllm.trl_generation.TandemVLLMGeneration].

    ``trl.trainer.grpo_trainer`` refers to ``VLLMGeneration`` by a module-level name; inside the context that name
    is a factory adding the tandem settings from ``args``. For senior-only rollouts (``junior_probability == 0`` or
    ``kl_to_junior``) it is a [`SeniorVLLMGeneration`][tandem_grpo.vllm.trl_generation.SeniorVLLMGeneration]
    (TRL's engine, no junior inside, with ``llm_kwargs`` and a weight sync that works on every backend). A no-op when
    ``args.use_vllm`` is false.
    Usage in the trainer:

        with use_tandem_vllm(args):
            super().__init__(model=model, args=args, ...)

    Args:
        args: the trainer's config (a [`TandemGRPOConfig`][tandem_grpo.config.TandemGRPOConfig]).
        **llm_kwargs: extra ``vllm.LLM`` arguments for colocate mode.

    Raises:
        RuntimeError: the installed TRL has no ``trl.trainer.grpo_trainer.VLLMGeneration`` (unsupported TRL).
    """
    if not getattr(args, "use_vllm", False):
        yield
        return
    import trl.trainer.grpo_trainer as grpo_module

    current = getattr(grpo_module, "VLLMGeneration", None)
    if isinstance(current, functools.partial) and current.func in (TandemVLLMGeneration, SeniorVLLMGeneration):
        yield  # an enclosing use_tandem_vllm is active (e.g. a script around a trainer that also uses it): keep it
        return
    if args.co_generates:
        factory = functools.partial(
            TandemVLLMGeneration,
            rule=HandoffRule.from_config(args),
            junior_model=getattr(args, "junior_model_name_or_path", None),
            llm_kwargs=llm_kwargs,
        )
    else:
        factory = functools.partial(SeniorVLLMGeneration, llm_kwargs=llm_kwargs)
    with _swap_attr(grpo_module, "VLLMGeneration", factory):
        yield


def tandem_generate_vllm(trainer, prompt_ids: list[list[int]], num_generations: int, seeds: list[int]) -> Rollout:
    """Tandem rollouts for ``TandemGRPOTrainer._generate_single_turn`` when ``use_vllm=True``.

    Call it where TRL calls ``self.vllm_generation.generate(...)`` (after TRL's ``sync_weights`` block).

    Args:
        trainer: the trainer; ``trainer.vllm_generation`` must be a
            [`TandemVLLMGeneration`][tandem_grpo.vllm.trl_generation.TandemVLLMGeneration] (built by running
            ``GRPOTrainer.__init__`` under [`use_tandem_vllm`][tandem_grpo.vllm.trl_generation.use_tandem_vllm]).
        prompt_ids: this process's prompts, one per completion (TRL's ``prompt_ids``).
        num_generations: completions per prompt.
        seeds: one coin-stream seed per completion.

    Returns:
        The [`Rollout`][tandem_grpo.rollout.Rollout]: token ids, authorship, unit starts, ``log p_s(B)``
        coefficients and the senior's exact score term of each token at the sampling temperature (``NaN`` on junior
        tokens that carry no senior term, which the trainer masks).

    Raises:
        TypeError: ``trainer.vllm_generation`` is not a tandem backend.
    """
    backend = getattr(trainer, "vllm_generation", None)
    if not isinstance(backend, TandemVLLMGeneration):
        raise TypeError(
            "trainer.vllm_generation is not a TandemVLLMGeneration: build the trainer inside "
            "tandem_grpo.vllm.trl_generation.use_tandem_vllm(args)."
        )
    return backend.generate_tandem(prompt_ids, num_generations, seeds)
