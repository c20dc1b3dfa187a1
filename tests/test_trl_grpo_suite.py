"""TRL's own GRPOTrainer tests, each run on ``trl.GRPOTrainer`` (the control) and on ``TandemGRPOTrainer`` (at the
default ``junior_probability`` 0.5, self-paired).

Every test mirrors the test of the same name in huggingface/trl ``tests/test_grpo_trainer.py`` (its classes
``TestGetHighEntropyMask``, ``TestGRPORolloutDispatch`` and ``TestGRPOTrainer``, as of the TRL 1.16 series): the
same trainer options, the same kind of model, data and reward, the same checks. The tests are written for this suite
and run offline: tiny random models built from configs (``tiny_architectures``; the policy of most tests is a Qwen2,
as TRL's ``tiny-Qwen2ForCausalLM-2.5``; MoE configs turn ``output_router_logits`` on), saved with the tiny
tokenizer of ``conftest`` (plus a plain chat template) where TRL passes a hub id, and a few prompts over the tiny
vocabulary in place of TRL's "zen" dataset. Runs are shorter (``max_steps=2`` where TRL trains 3 epochs). The GRPO
run of each test shows that the adaptation is faithful: TRL's trainer passes it.

Differences, each marked where it applies:

- Documented refusals of co-generation (README, ``TandemGRPOTrainer``): ``rollout_func``, ``tools``,
  ``environment_factory``, beam search in ``generation_kwargs``, a PEFT prompt-learning senior: strict ``xfail``
  for the tandem trainer only (the refusal is a ``ValueError`` at construction).
- TRL tests that need what no offline tiny model has (a tool-calling chat template and its response parser, Liger
  kernels, vLLM, a GPU, vision-language processors) are left out or skipped for both trainers, with the reason.
- ``test_train_with_mask_truncated_completions`` replaces ``generate`` with fixed completions; co-generation does
  not call ``generate``, so for the tandem trainer the same completions replace the co-generation call.
- Checks that read TRL 1.16's behaviour where it changed since (the ``ref`` adapter of a ``target_parameters``
  LoRA with peft >= 0.20; ``use_liger_kernel`` deprecated, so a LoRA on ``lm_head`` is refused without Liger too).

CI runs this module in environment B (marker ``upstream_trl``; not ``vllm``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from unittest.mock import MagicMock, Mock, patch

import pytest
import torch
import transformers
from conftest import build_tiny_tokenizer
from datasets import Dataset, DatasetDict, IterableDatasetDict
from packaging.version import Version
from tiny_architectures import CAUSAL_LMS, MOE_ROUTER_LOGITS, reward_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from tandem_grpo import TandemGRPOConfig, TandemGRPOTrainer

pytestmark = pytest.mark.upstream_trl

KINDS = ("grpo", "tandem")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% if not loop.last %}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}\n{% endif %}"
)
# Prompts over the tiny vocabulary (letters a-h, "1", "2", ".", "!", "?", newlines), in place of TRL's "zen".
TRAIN_PROMPTS = ["ab c", "d e", "f.\ng", "h a", "b", "c d e", "1 2", "g h.", "a!", "e f", "h\na", "d?"]
TEST_PROMPTS = ["a b", "c.", "2 1"]
REFUSED = "documented refusal of tandem co-generation"


# ------------------------------------------------------------------------------------------------- fixtures


class TinyHub:
    """Tiny random models saved on first use, each with the tiny tokenizer: what the TRL tests load by hub id."""

    def __init__(self, root):
        self.root, self.paths = root, {}

    def tokenizer(self):
        tokenizer = build_tiny_tokenizer()
        tokenizer.chat_template = CHAT_TEMPLATE
        return tokenizer

    def path(self, name: str) -> str:
        if name not in self.paths:
            folder = self.root / name
            if name.startswith("reward"):  # "reward", "reward-qwen3", "reward-llama"
                model = reward_model(family=name.split("-")[1] if "-" in name else "qwen2")
            elif name == "remote":
                model = None
                _save_remote_code(folder)
            else:
                model = CAUSAL_LMS[name](0)
            if model is not None:
                model.save_pretrained(folder)
            self.tokenizer().save_pretrained(folder)
            self.paths[name] = str(folder)
        return self.paths[name]


def _save_remote_code(folder) -> None:
    """A Llama under another model type, loaded through ``auto_map`` (custom code), as TRL's
    ``tiny-RemoteForCausalLM``."""
    import json

    from conftest import build_tiny_model

    build_tiny_model(0).save_pretrained(folder)
    (folder / "configuration_remote.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass RemoteConfig(LlamaConfig):\n    model_type = 'remote'\n"
    )
    (folder / "modeling_remote.py").write_text(
        "from transformers import LlamaForCausalLM\n\nfrom .configuration_remote import RemoteConfig\n\n\n"
        "class RemoteForCausalLM(LlamaForCausalLM):\n    config_class = RemoteConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="remote", architectures=["RemoteForCausalLM"], auto_map={
        "AutoConfig": "configuration_remote.RemoteConfig",
        "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
    })  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return TinyHub(tmp_path_factory.mktemp("tiny-hub"))


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a trainer built without `args` writes its default output folder here


def zen(config: str = "standard_prompt_only", split: str | None = "train", streaming: bool = False):
    """The tiny prompts as TRL's ``load_dataset("trl-internal-testing/zen", config, split=..., streaming=...)``."""

    def part(prompts):
        if config == "conversational_prompt_only":
            prompts = [[{"role": "user", "content": p}] for p in prompts]
        dataset = Dataset.from_dict({"prompt": prompts})
        return dataset.to_iterable_dataset() if streaming else dataset

    if split is None:
        return DatasetDict({"train": part(TRAIN_PROMPTS), "test": part(TEST_PROMPTS)})
    return part(TRAIN_PROMPTS if split == "train" else TEST_PROMPTS)


def trainer_class(kind: str):
    return GRPOTrainer if kind == "grpo" else TandemGRPOTrainer


def make_args(kind: str, output_dir, **overrides):
    """GRPOConfig (control) or TandemGRPOConfig (default tandem fields) with TRL's test settings, on a CPU."""
    base = dict(
        output_dir=str(output_dir), learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
        max_completion_length=8, report_to="none", bf16=False, max_steps=2, save_strategy="no", seed=0,
    )  # fmt: skip
    config = GRPOConfig if kind == "grpo" else TandemGRPOConfig
    return config(**{**base, **overrides})


def generate_needs_router_logits_off(request, kind: str, model: str) -> None:
    """Before transformers 5.19, ``generate`` (the control's rollouts) keeps the all-ones attention mask on decode
    steps, so a MoE config with ``output_router_logits=True`` fails in its load-balancing loss there (the tandem loop
    turns router logits off, as a rollout never needs them)."""
    if kind == "grpo" and model in MOE_ROUTER_LOGITS and Version(transformers.__version__) < Version("5.19"):
        request.applymarker(pytest.mark.xfail(raises=RuntimeError, reason=generate_needs_router_logits_off.__doc__))


def refuse_for_tandem(request, kind: str, what: str) -> None:
    if kind == "tandem":
        request.applymarker(pytest.mark.xfail(raises=ValueError, strict=True, reason=f"{REFUSED}: {what}"))


def build(kind, hub, tmp_path, *, model="qwen2", reward_funcs="reward", train_dataset="default", args=None, **kw):
    """The trainer of ``kind``: ``model`` / ``reward_funcs`` name a tiny hub model (or are objects)."""
    model = hub.path(model) if isinstance(model, str) and model in CAUSAL_LMS else model
    if isinstance(reward_funcs, str) and reward_funcs.startswith("reward"):
        reward_funcs = hub.path(reward_funcs)
    if isinstance(reward_funcs, list):
        reward_funcs = [hub.path(f) if isinstance(f, str) and f.startswith("reward") else f for f in reward_funcs]
    train_dataset = zen() if isinstance(train_dataset, str) and train_dataset == "default" else train_dataset
    args = args if args is not None else make_args(kind, tmp_path / "out")
    return trainer_class(kind)(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kw)


def snapshot(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def assert_all_changed(trainer, before: dict[str, torch.Tensor], skip=lambda name: False) -> None:
    for name, old in before.items():
        if not skip(name):
            assert not torch.equal(old, trainer.model.get_parameter(name)), f"Parameter {name} has not changed."


def train_and_check(trainer) -> None:
    """TRL's most common test body: train, a train loss is logged, and every parameter changed."""
    before = snapshot(trainer)
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert_all_changed(trainer, before)
    if isinstance(trainer, TandemGRPOTrainer):
        assert any("tandem/senior_token_fraction" in row for row in trainer.state.log_history)


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def unique_letters_reward(completions, **kwargs):
    return [float(len(set(c))) for c in completions]


# --------------------------------------------------------------------------------------- TestGetHighEntropyMask

_ENTROPIES = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
_MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


def _high_entropy_mask(kind, entropies, mask, threshold):
    trainer = Mock(spec=trainer_class(kind))
    trainer.accelerator = Mock(num_processes=1)
    trainer.accelerator.gather = lambda x: x
    trainer.accelerator.pad_across_processes = lambda x, dim, pad_index: x
    return trainer_class(kind).get_high_entropy_mask(trainer, entropies, mask, threshold)


@pytest.mark.parametrize(
    ("name", "entropies", "mask", "threshold", "expected"),
    [
        ("test_compute_entropy_mask_0", _ENTROPIES, _MASK, 0.8, [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]]),
        ("test_compute_entropy_mask_1",
         torch.tensor([[0.1, 0.2, 0.3, 1.4, 0.5, 0.14], [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]]),
         torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]]), 0.8, [[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0]]),
        ("test_compute_entropy_mask_lower_threshold", _ENTROPIES, _MASK, 0.5,
         [[0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0]]),
        ("test_compute_entropy_threshold_0", _ENTROPIES, _MASK, 0.0, [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]),
        ("test_compute_entropy_threshold_1", _ENTROPIES, _MASK, 1.0, [[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]]),
        ("test_compute_entropy_all_masked", _ENTROPIES, torch.zeros(2, 6, dtype=torch.long), 0.5,
         [[0] * 6, [0] * 6]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_get_high_entropy_mask(kind, name, entropies, mask, threshold, expected):
    got = _high_entropy_mask(kind, entropies, mask, threshold)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.bool))


# ------------------------------------------------------------------------------------- TestGRPORolloutDispatch


def _dispatch_trainer(kind):
    trainer = object.__new__(trainer_class(kind))
    trainer.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True, gather=lambda t: t)
    trainer.args = SimpleNamespace(report_to=[])
    trainer.model = SimpleNamespace(training=True)
    trainer.state = SimpleNamespace(global_step=2, num_input_tokens_seen=0)
    trainer._last_loaded_step = 1
    trainer.use_vllm = False
    trainer.use_transformers_continuous_batching = False
    trainer.vllm_generation = SimpleNamespace(sync_weights=MagicMock())
    trainer.processing_class = SimpleNamespace(batch_decode=MagicMock(return_value=["decoded"]))
    trainer._tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    trainer.eos_token_ids = [2]  # TRL 1.16 reads the trainer's EOS ids here
    trainer.tools = None
    trainer.environment_factories = None
    names = ["mean_length", "min_length", "max_length", "clipped_ratio", "mean_terminated_length",
             "min_terminated_length", "max_terminated_length"]  # fmt: skip
    trainer._metrics = {"train": {"num_tokens": [], **{f"completions/{n}": [] for n in names}}}
    return trainer


@pytest.mark.parametrize("case", ["prefers_rollout_func", "syncs_vllm_weights", "raises_on_missing_keys"])
def test_generate_rollout_func(kind, case, request):
    """TRL's ``test_generate_prefers_rollout_func``, ``..._syncs_vllm_weights_when_needed``,
    ``..._raises_when_required_keys_are_missing``."""
    if kind == "tandem":
        pytest.skip(f"{REFUSED}: rollout_func (refused at construction, so a tandem trainer never dispatches to it)")
    trainer = _dispatch_trainer(kind)
    if case == "raises_on_missing_keys":
        trainer.rollout_func = MagicMock(return_value={"prompt_ids": [[1]], "completion_ids": [[2]]})
        with pytest.raises(ValueError, match="rollout_func must return keys"):
            trainer._generate(["prompt"])
        return
    output = {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[-0.1]], "env_mask": [[1]]}
    trainer.rollout_func = MagicMock(return_value=output)
    trainer.use_vllm = case == "syncs_vllm_weights"
    result = trainer._generate(["prompt"])
    trainer.rollout_func.assert_called_once_with(["prompt"], trainer)
    if case == "prefers_rollout_func":
        assert (result[0], result[1], result[2]) == ([[1]], [[2]], [[1]])
    else:
        trainer.vllm_generation.sync_weights.assert_called_once()
        assert trainer._last_loaded_step == trainer.state.global_step


def test_rollout_func_refused_by_the_tandem_trainer(hub, tmp_path):
    """The refusal the tandem variants above stand for."""
    with pytest.raises(ValueError, match="`rollout_func` cannot be combined with tandem co-generation"):
        build("tandem", hub, tmp_path, rollout_func=lambda prompts, trainer: {})


# --------------------------------------------------------------------------------------------- TestGRPOTrainer


def test_init_minimal(kind, hub):
    if kind == "grpo" and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        pytest.skip(
            "GRPOConfig's default bf16=True is refused by transformers on a machine without bf16 support (TRL runs "
            "this test on a GPU); TandemGRPOConfig resolves bf16 from the hardware, so the tandem variant runs here"
        )
    trainer_class(kind)(model=hub.path("qwen2"), reward_funcs=hub.path("reward"), train_dataset=zen())


@pytest.mark.parametrize("model", ["cohere2", "glm4_moe", "gpt_oss", "qwen2", "qwen3_moe", "nemotron_h"])
def test_train(kind, hub, tmp_path, model, request):
    generate_needs_router_logits_off(request, kind, model)
    trainer = build(kind, hub, tmp_path, model=model)
    train_and_check(trainer)
    if trainer.aux_loss_enabled:  # MoE models log the load-balancing loss
        assert trainer.state.log_history[-1]["aux_loss"] is not None


@pytest.mark.parametrize("config_name", ["standard_prompt_only", "conversational_prompt_only"])
def test_train_dataset_format(kind, hub, tmp_path, config_name):
    train_and_check(build(kind, hub, tmp_path, train_dataset=zen(config_name)))


def test_trust_remote_code(kind, hub, tmp_path):
    def reward_func(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="custom code"):
        build(kind, hub, tmp_path, model=hub.path("remote"), reward_funcs=reward_func,
              args=make_args(kind, tmp_path / "out"))  # fmt: skip
    trainer = build(kind, hub, tmp_path, model=hub.path("remote"), reward_funcs=reward_func,
                    args=make_args(kind, tmp_path / "out", trust_remote_code=True))  # fmt: skip
    assert type(trainer.model).__name__ == "RemoteForCausalLM"


@pytest.mark.parametrize("loss_type", ["bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_train_loss_types(kind, hub, tmp_path, loss_type):
    args = make_args(kind, tmp_path / "out", loss_type=loss_type, max_completion_length=32,
                     gradient_accumulation_steps=2, max_steps=1,
                     importance_sampling_level="sequence" if loss_type == "luspo" else "token")  # fmt: skip
    train_and_check(build(kind, hub, tmp_path, args=args))


def _eval_args(kind, tmp_path, **overrides):
    return make_args(kind, tmp_path / "out", per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=2,
                     **overrides)  # fmt: skip


def test_train_with_eval(kind, hub, tmp_path):
    data = zen(split=None)
    build(kind, hub, tmp_path, args=_eval_args(kind, tmp_path), train_dataset=data["train"],
          eval_dataset=data["test"]).train()  # fmt: skip


def test_train_with_num_generations_eval(kind, hub, tmp_path):
    data = zen(split=None)
    build(kind, hub, tmp_path, args=_eval_args(kind, tmp_path, num_generations_eval=1), train_dataset=data["train"],
          eval_dataset=data["test"]).train()  # fmt: skip


def test_train_with_iterable_dataset(kind, hub, tmp_path):
    trainer = build(kind, hub, tmp_path, train_dataset=zen(streaming=True))
    assert trainer.args.accelerator_config.dispatch_batches is False
    train_and_check(trainer)


def _eval_sets(eval_dataset_type: str):
    if eval_dataset_type == "none":
        return None
    streaming = "iterable" in eval_dataset_type
    split = zen(split="test", streaming=streaming)
    if eval_dataset_type in ("dataset", "iterable_dataset"):
        return split
    if eval_dataset_type in ("dataset_dict", "iterable_dataset_dict"):
        return (IterableDatasetDict if streaming else DatasetDict)({"data1": split, "data2": split})
    return {"data1": split, "data2": split}


_EVAL_TYPES = ["dataset", "iterable_dataset", "dataset_dict", "iterable_dataset_dict", "dict_of_dataset",
               "dict_of_iterable_dataset"]  # fmt: skip


@pytest.mark.parametrize("eval_dataset_type", [*_EVAL_TYPES, "none"])
def test_init_with_eval_dataset(kind, hub, tmp_path, eval_dataset_type):
    eval_dataset = _eval_sets(eval_dataset_type)
    trainer = build(kind, hub, tmp_path, eval_dataset=eval_dataset)
    if eval_dataset is None:
        assert trainer.eval_dataset is None
    elif isinstance(trainer.eval_dataset, dict):
        assert set(trainer.eval_dataset) == {"data1", "data2"}
    else:
        assert trainer.eval_dataset is eval_dataset


def test_iterable_dataset_requires_dispatch_batches_false(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", accelerator_config={"dispatch_batches": True})
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        build(kind, hub, tmp_path, args=args, train_dataset=zen(streaming=True))


def test_iterable_dataset_forces_num_workers_zero(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", dataloader_num_workers=4, max_steps=1)
    trainer = build(kind, hub, tmp_path, args=args, train_dataset=zen(streaming=True))
    assert trainer.args.dataloader_num_workers == 0


def test_iterable_eval_keeps_map_style_train_workers(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", per_device_eval_batch_size=3, dataloader_num_workers=4)
    trainer = build(kind, hub, tmp_path, args=args, eval_dataset=zen(split="test", streaming=True))
    assert trainer.args.dataloader_num_workers == 4
    assert trainer.get_train_dataloader().num_workers == 4
    assert trainer.get_eval_dataloader().num_workers == 0
    assert trainer.args.dataloader_num_workers == 4


@pytest.mark.parametrize("eval_dataset_type", _EVAL_TYPES)
def test_evaluate_with_eval_dataset(kind, hub, tmp_path, eval_dataset_type):
    trainer = build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", per_device_eval_batch_size=3))
    metrics = trainer.evaluate(eval_dataset=_eval_sets(eval_dataset_type))
    if eval_dataset_type in ("dataset", "iterable_dataset"):
        assert metrics["eval_loss"] is not None
    else:
        assert metrics["eval_data1_loss"] is not None and metrics["eval_data2_loss"] is not None


def test_train_eval_on_start(kind, hub, tmp_path):
    data = zen(split=None)
    args = _eval_args(kind, tmp_path, loss_type="grpo", eval_on_start=True)
    build(kind, hub, tmp_path, args=args, train_dataset=data["train"], eval_dataset=data["test"]).train()


def test_train_multiple_iterations(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", num_iterations=2)))


# ---------------------------------------------------------------------------------------------------- PEFT


def _base_names(model_name: str, hub) -> list[str]:
    model = AutoModelForCausalLM.from_pretrained(hub.path(model_name), dtype=torch.float32)
    return [f"base_model.model.{n}" for n, _ in model.named_parameters()]


def _check_peft_trained(trainer, before, base_names, also_skip=()) -> None:
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for name, old in before.items():
        new = trainer.model.get_parameter(name)
        if name in base_names:
            torch.testing.assert_close(old, new, msg=f"Parameter {name} has changed.")
        elif "base_layer" not in name and not any(part in name for part in also_skip):
            assert not torch.equal(old, new), f"Parameter {name} has not changed."


def test_train_peft_config(kind, hub, tmp_path):
    from peft import LoraConfig

    model = AutoModelForCausalLM.from_pretrained(hub.path("qwen2"), dtype=torch.float32)
    base_names = [f"base_model.model.{n}" for n, _ in model.named_parameters()]
    trainer = build(kind, hub, tmp_path, model=model, peft_config=LoraConfig())
    before = snapshot(trainer)
    trainer.train()
    _check_peft_trained(trainer, before, base_names)


def test_liger_kernel_with_peft_lm_head_raises(kind, hub, tmp_path):
    """TRL 1.16 refuses a LoRA on ``lm_head`` with or without Liger (its log-probs read ``lm_head.weight``)."""
    from peft import LoraConfig

    model = AutoModelForCausalLM.from_pretrained(hub.path("qwen2"), dtype=torch.float32)
    args = make_args(kind, tmp_path / "out", use_liger_kernel=True)
    with pytest.raises(ValueError, match="lm_head"):
        build(kind, hub, tmp_path, model=model, args=args,
              peft_config=LoraConfig(target_modules=["q_proj", "v_proj", "lm_head"]))  # fmt: skip


@pytest.mark.parametrize("modules_to_save", [None, ["lm_head"]])
def test_liger_kernel_with_peft_allowed(kind, hub, tmp_path, modules_to_save):
    """TRL's ``test_liger_kernel_with_peft_non_lm_head_target_allowed`` and
    ``..._modules_to_save_lm_head_allowed``: in TRL 1.16 ``use_liger_kernel`` is deprecated (a FutureWarning, the
    Liger loss gone), so both build."""
    from peft import LoraConfig

    model = AutoModelForCausalLM.from_pretrained(hub.path("qwen2"), dtype=torch.float32)
    args = make_args(kind, tmp_path / "out", use_liger_kernel=True)
    peft_config = LoraConfig(target_modules=["q_proj", "v_proj"], modules_to_save=modules_to_save)
    with pytest.warns(FutureWarning, match="use_liger_kernel"):
        build(kind, hub, tmp_path, model=model, args=args, peft_config=peft_config)


def test_liger_kernel_with_peft_prompt_learning(kind, hub, tmp_path, request):
    """TRL's ``test_liger_kernel_with_peft_prompt_learning_raises``: TRL 1.16 deprecated the Liger loss, so a prompt
    tuning adapter builds with GRPOTrainer (a FutureWarning). Co-generation refuses a prompt-learning PEFT senior
    at construction (documented): its forward prepends virtual tokens at every call."""
    from peft import PromptTuningConfig, TaskType

    refuse_for_tandem(request, kind, "PEFT prompt-learning senior")
    model = AutoModelForCausalLM.from_pretrained(hub.path("qwen2"), dtype=torch.float32)
    args = make_args(kind, tmp_path / "out", use_liger_kernel=True)
    peft_config = PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4)
    with pytest.warns(FutureWarning, match="use_liger_kernel"):
        build(kind, hub, tmp_path, model=model, args=args, peft_config=peft_config)


def test_train_peft_model(kind, hub, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(hub.path("qwen2"), dtype=torch.float32)
    base_names = [f"base_model.model.{n}" for n, _ in model.named_parameters()]
    trainer = build(kind, hub, tmp_path, model=get_peft_model(model, LoraConfig()))
    before = snapshot(trainer)
    trainer.train()
    _check_peft_trained(trainer, before, base_names, also_skip=("ref",))


def test_train_moe_peft_model(kind, hub, tmp_path, request):
    """A LoRA on gpt-oss's stacked expert weights (``target_parameters``), beta > 0. TRL 1.16 with peft >= 0.20
    keeps a frozen ``ref`` copy of the adapter (TRL's test, written for older peft, asserts there is none)."""
    from peft import LoraConfig, get_peft_model

    generate_needs_router_logits_off(request, kind, "gpt_oss")
    model = AutoModelForCausalLM.from_pretrained(hub.path("gpt_oss"), dtype=torch.float32)
    base_names = [f"base_model.model.{n}" for n, _ in model.named_parameters()]
    model = get_peft_model(model, LoraConfig(target_parameters=["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]))
    trainer = build(kind, hub, tmp_path, model=model, args=make_args(kind, tmp_path / "out", beta=0.1))
    before = snapshot(trainer)
    trainer.train()
    _check_peft_trained(trainer, before, base_names, also_skip=(".ref.",))


def test_train_peft_with_gradient_checkpointing(kind, hub, tmp_path):
    from peft import LoraConfig

    model = AutoModelForCausalLM.from_pretrained(hub.path("qwen2"), dtype=torch.float32)
    base_names = [f"base_model.model.{n}" for n, _ in model.named_parameters()]
    args = make_args(kind, tmp_path / "out", gradient_checkpointing=True)
    trainer = build(kind, hub, tmp_path, model=model, args=args, peft_config=LoraConfig())
    before = snapshot(trainer)
    trainer.train()
    _check_peft_trained(trainer, before, base_names)


# -------------------------------------------------------------------------------------------------- rewards


def test_train_different_reward_model(kind, hub, tmp_path):
    """A reward model of another family (Llama) with its own tokenizer copy and pad token."""
    from transformers import AutoModelForSequenceClassification

    reward = AutoModelForSequenceClassification.from_pretrained(hub.path("reward-llama"))
    reward_tokenizer = AutoTokenizer.from_pretrained(hub.path("reward-llama"))
    reward_tokenizer.pad_token = "<pad>"
    train_and_check(build(kind, hub, tmp_path, reward_funcs=reward, train_dataset=zen("conversational_prompt_only"),
                          reward_processing_classes=reward_tokenizer))  # fmt: skip


def test_train_reward_func_standard(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, reward_funcs=length_reward))


def test_train_reward_func_conversational(kind, hub, tmp_path):
    def reward_func(completions, **kwargs):
        return [float(len(completion[0]["content"])) for completion in completions]

    train_and_check(
        build(kind, hub, tmp_path, reward_funcs=reward_func, train_dataset=zen("conversational_prompt_only"))
    )


def test_train_multiple_reward_funcs(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, reward_funcs=[length_reward, unique_letters_reward]))


def test_train_sync_and_async_reward_funcs(kind, hub, tmp_path):
    def constant_reward(completions, **kwargs):
        return [1 for _ in completions]

    async def async_reward(completions, **kwargs):
        return [float(len(set(c))) for c in completions]

    train_and_check(build(kind, hub, tmp_path, reward_funcs=[length_reward, constant_reward, async_reward]))


def test_train_multiple_reward_funcs_with_None_output(kind, hub, tmp_path):  # noqa: N802 (TRL's name)
    def not_applicable(completions, **kwargs):
        return [None] * len(completions)

    train_and_check(build(kind, hub, tmp_path, reward_funcs=[length_reward, not_applicable]))


def test_train_multiple_reward_funcs_with_weights(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", reward_weights=[0.7, 0.3])
    trainer = build(kind, hub, tmp_path, args=args, reward_funcs=[length_reward, unique_letters_reward])
    train_and_check(trainer)
    last = trainer.state.log_history[-1]
    for name in ("length_reward", "unique_letters_reward"):
        assert f"rewards/{name}/mean" in last and f"rewards/{name}/std" in last


@pytest.mark.parametrize("multi_objective_aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_reward_metric_reflects_reward_weights(kind, hub, tmp_path, multi_objective_aggregation):
    def constant_reward_1(completions, **kwargs):
        return [1.0] * len(completions)

    def constant_reward_0(completions, **kwargs):
        return [0.0] * len(completions)

    args = make_args(kind, tmp_path / "out", reward_weights=[0.7, 0.3],
                     multi_objective_aggregation=multi_objective_aggregation)  # fmt: skip
    trainer = build(kind, hub, tmp_path, args=args, reward_funcs=[constant_reward_1, constant_reward_0])
    trainer.train()
    assert abs(trainer.state.log_history[-1]["reward"] - 0.7) < 1e-5


def test_train_multiple_mixed_reward_funcs(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, reward_funcs=[length_reward, "reward"]))


def test_train_reward_func_additional_column(kind, hub, tmp_path):
    dataset = zen().add_column("some_values", list(range(len(TRAIN_PROMPTS))))

    def reward_func(completions, some_values, **kwargs):
        return [float(abs(len(c) - v)) for c, v in zip(completions, some_values, strict=True)]

    train_and_check(build(kind, hub, tmp_path, reward_funcs=reward_func, train_dataset=dataset))


# ------------------------------------------------------------------------------------------ reference model


def test_train_with_sync_ref_model(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", beta=0.1, sync_ref_model=True, ref_model_sync_steps=2)
    trainer = build(kind, hub, tmp_path, args=args)
    before = snapshot(trainer)
    assert trainer.ref_model is not None
    before_ref = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert_all_changed(trainer, before)
    for name, old in before_ref.items():
        assert not torch.equal(old, trainer.ref_model.get_parameter(name)), f"Ref parameter {name} has not changed."
    if kind == "tandem":  # the junior is frozen: with a synced reference it is a copy of its own
        assert trainer.junior is not trainer.ref_model


def test_train_beta_non_zero(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", beta=0.1)))


def test_train_with_pad_to_multiple_of(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", pad_to_multiple_of=8)))


# ---------------------------------------------------------------------------------------- off-policy masking


def test_get_off_policy_mask(kind):
    mask = torch.ones((3, 4))
    advantages = torch.tensor([1.0, -1.0, -1.0]).unsqueeze(-1)
    sampling = torch.zeros((3, 4))
    logps = torch.tensor([[-2.0] * 4, [-0.5] * 4, [-2.0] * 4])  # keep (A > 0), keep (low KL), drop
    got = trainer_class(kind).get_off_policy_mask(advantages, logps, sampling, mask, 1.0)
    torch.testing.assert_close(got, torch.tensor([[1.0], [1.0], [0.0]]))


def test_get_off_policy_mask_padding(kind):
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    advantages = torch.tensor([[-1.0]])
    sampling = torch.zeros((1, 4))
    logps = torch.tensor([[-2.0, -2.0, -10_000.0, 10_000.0]])  # padding values must be ignored
    off_policy = trainer_class(kind).get_off_policy_mask
    torch.testing.assert_close(off_policy(advantages, logps, sampling, mask, 1.0), torch.tensor([[0.0]]))
    logps[0, :2] = -0.5
    torch.testing.assert_close(off_policy(advantages, logps, sampling, mask, 1.0), torch.tensor([[1.0]]))


def test_train_with_off_policy_mask(kind, hub, tmp_path):
    trainer = build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", off_policy_mask_threshold=0.5))
    before = snapshot(trainer)
    trainer.train()
    assert_all_changed(trainer, before)


def test_train_with_bias_correction_kl(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", beta=0.1, use_bias_correction_kl=True)
    train_and_check(build(kind, hub, tmp_path, args=args))


@pytest.mark.parametrize("model", ["qwen3", "gemma2"])  # Gemma2 ties its embeddings and lm_head, Qwen3 does not
def test_train_with_cast_lm_head_to_fp32(kind, hub, tmp_path, model):
    trainer = build(
        kind, hub, tmp_path, model=model, args=make_args(kind, tmp_path / "out", cast_lm_head_to_fp32=True)
    )
    train_and_check(trainer)
    assert trainer.model.lm_head.weight.dtype == torch.float32


# ------------------------------------------------------------------------------------------------- entropy


def test_train_with_static_entropy(kind, hub, tmp_path):
    trainer = build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", entropy_coef=0.1))
    train_and_check(trainer)
    last = trainer.state.log_history[-1]
    assert last["policy_loss"] is not None and last["entropy_coef"] is not None


def test_train_with_adaptive_entropy(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0)
    trainer = build(kind, hub, tmp_path, args=args)
    train_and_check(trainer)
    assert trainer.state.log_history[-1]["policy_loss"] is not None
    assert trainer.entropy_coef > 0.01


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "luspo"])
def test_entropy_bonus_scale(kind, hub, tmp_path, loss_type):
    """The entropy bonus is ``entropy_coef`` times the mean per-token entropy for every loss type."""
    args = make_args(kind, tmp_path / "out", loss_type=loss_type, max_completion_length=16, logging_steps=1,
                     entropy_coef=0.5, max_steps=3,
                     importance_sampling_level="sequence" if loss_type == "luspo" else "token")  # fmt: skip
    trainer = build(kind, hub, tmp_path, args=args)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "policy_loss" in h and "loss" in h and h.get("entropy")]
    assert logs
    ratios = sorted((h["policy_loss"] - h["loss"]) / h["entropy"] for h in logs)
    assert ratios[len(ratios) // 2] == pytest.approx(0.5, rel=0.3)


def test_train_with_adaptive_entropy_gradient_accumulation(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", gradient_accumulation_steps=2, entropy_coef=0.01,
                     use_adaptive_entropy=True, entropy_target=15.0, entropy_coef_delta=0.005)  # fmt: skip
    trainer = build(kind, hub, tmp_path, args=args)
    train_and_check(trainer)
    assert trainer.entropy_coef == pytest.approx(min(0.01 + 0.005 * trainer.state.global_step, 1.0), abs=1e-6)


def test_entropy_bonus_flows_gradients(kind, hub, tmp_path):
    """With the bonus on, entropies carry gradients. (TRL's test also checks that they are detached with the bonus
    off; TRL 1.16 computes them in its fused LM head, which keeps their graph either way.)"""
    trainer = build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", entropy_coef=0.1))
    model = trainer.model
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]], device=model.device)
    assert trainer._entropy_bonus_enabled
    _, entropies, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, torch.ones_like(ids), logits_to_keep=4, compute_entropy=True
    )
    assert entropies.requires_grad


def test_train_with_entropy_filter(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", top_entropy_quantile=0.2)))


# ------------------------------------------------------------------------------------------------ generation


def test_train_with_additional_generation_kwargs(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", top_p=0.9, top_k=10, min_p=0.01, repetition_penalty=1.1)
    train_and_check(build(kind, hub, tmp_path, args=args))


def test_train_normalize_then_sum_aggregation(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", multi_objective_aggregation="normalize_then_sum")
    train_and_check(build(kind, hub, tmp_path, args=args, reward_funcs=[length_reward, unique_letters_reward]))


@pytest.mark.parametrize("scale_rewards", [False, "group", "batch", True, "none"])
def test_train_scale_rewards(kind, hub, tmp_path, scale_rewards):
    train_and_check(build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", scale_rewards=scale_rewards)))


# Three fixed completions (EOS 1, pad 0): truncated; EOS inside; EOS at the last allowed position.
_FIXED = [[2, 3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 1], [12, 13, 14, 15, 16, 17, 18, 1]]


def test_train_with_mask_truncated_completions(kind, hub, tmp_path):
    """``generate`` (GRPO) or the co-generation call (tandem) returns ``_FIXED``: one truncated completion is masked,
    the other two train (dapo normalizes by the tokens of the whole batch)."""
    from tandem_grpo.rollout import Rollout

    def fake_generate(input_ids, **kwargs):
        width = max(map(len, _FIXED))
        rows = [row + [0] * (width - len(row)) for row in _FIXED]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=1)

    def fake_tandem_generate(senior, junior, input_ids, attention_mask, *, rule, tables, seeds, **kwargs):
        return Rollout.replay(_FIXED, seeds.tolist(), rule, tables)

    args = make_args(kind, tmp_path / "out", mask_truncated_completions=True, loss_type="dapo")
    trainer = build(kind, hub, tmp_path, args=args)
    target = ("transformers.generation.utils.GenerationMixin.generate" if kind == "grpo"
              else "tandem_grpo.trainer.tandem_generate")  # fmt: skip
    with patch(target, side_effect=fake_generate if kind == "grpo" else fake_tandem_generate) as fake:
        train_and_check(trainer)
    assert fake.called


def test_train_with_mask_truncated_completions_all_masked(kind, hub, tmp_path):
    """Every completion is truncated (EOS made practically impossible: its logit is 0 while the others are scaled
    by 1000, where TRL relies on its large vocabulary making EOS unlikely): no learning signal, no parameter moves."""
    model = AutoModelForCausalLM.from_pretrained(hub.path("qwen2"), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(1000.0)
        model.lm_head.weight[1] = 0.0
    args = make_args(kind, tmp_path / "out", mask_truncated_completions=True, loss_type="dapo")
    trainer = build(kind, hub, tmp_path, model=model, args=args)
    before = snapshot(trainer)
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] == pytest.approx(0.0)
    for name, old in before.items():
        assert torch.equal(old, trainer.model.get_parameter(name)), f"Parameter {name} has changed."


def test_warning_raised_all_rewards_none(kind, hub, tmp_path, caplog):
    def always_none(completions, **kwargs):
        return [None] * len(completions)

    trainer = build(kind, hub, tmp_path, reward_funcs=always_none, args=make_args(kind, tmp_path / "out", max_steps=1))
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_trainer"):
        trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"])
def test_warning_raised_sequence_level_with_token_summed_loss(kind, hub, tmp_path, caplog, loss_type):
    args = make_args(kind, tmp_path / "out", importance_sampling_level="sequence", loss_type=loss_type)
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_trainer"):
        build(kind, hub, tmp_path, args=args, reward_funcs=lambda completions, **kw: [0.0] * len(completions))
    assert ("weights each sequence by its completion length" in caplog.text) == (loss_type != "grpo")


def test_train_num_generations_larger_than_batch_size(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", num_generations=6, gradient_accumulation_steps=2, max_steps=1)
    train_and_check(build(kind, hub, tmp_path, args=args))


def test_train_delta_clipping(kind, hub, tmp_path):
    train_and_check(build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", delta=2.0)))


def test_train_multiple_dataloader_workers(kind, hub, tmp_path):
    torch.multiprocessing.set_start_method("spawn", force=True)  # as TRL's test: fork after threads may deadlock
    args = make_args(kind, tmp_path / "out", dataloader_num_workers=2, max_steps=1)
    train_and_check(build(kind, hub, tmp_path, args=args))


def test_train_with_generation_kwargs(kind, hub, tmp_path, request):
    refuse_for_tandem(request, kind, "beam search (num_beams=2) in generation_kwargs")
    generation_kwargs = {"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}
    args = make_args(kind, tmp_path / "out", generation_kwargs=generation_kwargs)
    train_and_check(build(kind, hub, tmp_path, args=args))


def test_train_with_reward_func_accessing_trainer_state(kind, hub, tmp_path):
    def reward_func(completions, **kwargs):
        assert hasattr(kwargs.get("trainer_state"), "global_step")
        return [float(len(set(c))) for c in completions]

    build(kind, hub, tmp_path, reward_funcs=reward_func).train()


def test_train_reward_func_with_log_extra(kind, hub, tmp_path):
    def reward_func(completions, **kwargs):
        kwargs["log_extra"]("test_column", [c[:5] for c in completions])
        return [float(len(c)) for c in completions]

    trainer = build(kind, hub, tmp_path, reward_funcs=reward_func,
                    args=make_args(kind, tmp_path / "out", log_completions=True))  # fmt: skip
    trainer.train()
    assert "test_column" in trainer._logs["extra"]


def test_train_reward_func_with_log_metric(kind, hub, tmp_path):
    def reward_func(completions, **kwargs):
        kwargs["log_metric"]("custom_accuracy", 0.75)
        return [float(len(c)) for c in completions]

    trainer = build(kind, hub, tmp_path, reward_funcs=reward_func)
    trainer.train()
    assert "custom_accuracy" in {k for entry in trainer.state.log_history for k in entry}


def test_prepare_input_called_with_correct_data(kind, hub, tmp_path):
    """steps_per_generation=4 x per_device_train_batch_size=6 = 24 completions per generation batch: 6 prompts, 4
    generations each, each batch used for 8 training steps (num_iterations 2); 3 epochs of 2 generation batches."""
    args = make_args(kind, tmp_path / "out", max_completion_length=8, gradient_accumulation_steps=3,
                     steps_per_generation=4, num_generations=4, per_device_train_batch_size=6, num_iterations=2,
                     shuffle_dataset=False, max_steps=-1, num_train_epochs=3)  # fmt: skip
    trainer = build(kind, hub, tmp_path, args=args)
    first = [{"prompt": p} for p in TRAIN_PROMPTS[:6] for _ in range(4)]
    second = [{"prompt": p} for p in TRAIN_PROMPTS[6:12] for _ in range(4)]
    cls = trainer_class(kind)
    with patch.object(cls, "training_step", wraps=trainer.training_step) as step:
        trainer.train()
    assert step.call_count == 48
    for i in range(8):
        assert step.call_args_list[i].args[1] == first
    for i in range(8, 16):
        assert step.call_args_list[i].args[1] == second


def test_train_sequence_importance_sampling(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", num_iterations=2, importance_sampling_level="sequence")
    train_and_check(build(kind, hub, tmp_path, args=args))


def test_train_with_chat_template_kwargs(kind, hub, tmp_path):
    args = make_args(kind, tmp_path / "out", chat_template_kwargs={"enable_thinking": False})
    train_and_check(
        build(kind, hub, tmp_path, model="qwen3", args=args, train_dataset=zen("conversational_prompt_only"))
    )


# --------------------------------------------------------------------------------------- tools, environments


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


class CounterEnvironment:
    def reset(self, **kwargs):
        self.counter = 0

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add.

        Returns:
            The counter.
        """
        self.counter += step
        return self.counter


_TOOL_TESTS = {
    "test_train_with_tools[sync]": {"tools": [multiply_tool]},
    "test_train_with_tools[async]": {"tools": [multiply_tool]},
    "test_train_with_malformed_tool_calls": {"tools": [multiply_tool]},
    "test_train_with_multiple_environments": {"environment_factory": {"counter": CounterEnvironment}},
    "test_train_with_unknown_environment_raises": {"environment_factory": {"counter": CounterEnvironment}},
    "test_train_with_environment_factory": {"environment_factory": CounterEnvironment},
    "test_train_with_environment_owned_reward": {"environment_factory": CounterEnvironment},
    "test_environment_owned_reward_coexists_with_reward_funcs": {"environment_factory": CounterEnvironment},
    "test_environment_owned_reward_mixed_environments": {"environment_factory": {"a": CounterEnvironment}},
    "test_environment_owned_data_requires_max_steps": {"environment_factory": CounterEnvironment},
    "test_multiple_environments_without_dataset_raises": {"environment_factory": {"a": CounterEnvironment}},
    "test_train_with_environment_owned_data": {"environment_factory": CounterEnvironment},
}


@pytest.mark.parametrize("name", list(_TOOL_TESTS))
def test_tools_and_environments(kind, hub, tmp_path, name, request):
    """TRL's tool and environment tests replace ``generate`` with Qwen3 token ids of tool calls and need a chat
    template that renders tool calls, with TRL's response parser for it: no offline tiny tokenizer has one, so the
    control is skipped. The tandem trainer refuses ``tools`` and ``environment_factory`` at construction (documented),
    before any of that matters."""
    if kind == "grpo":
        pytest.skip("needs a tool-calling chat template and its response parser (Qwen3's); none is available offline")
    refuse_for_tandem(request, kind, "tools and environment_factory")
    build(kind, hub, tmp_path, args=make_args(kind, tmp_path / "out", max_steps=1), **_TOOL_TESTS[name]).train()


def test_no_reward_source_raises(kind, hub, tmp_path):
    with pytest.raises(ValueError, match="No reward source provided"):
        trainer_class(kind)(model=hub.path("qwen3"), args=make_args(kind, tmp_path / "out"),
                            train_dataset=zen("conversational_prompt_only"))  # fmt: skip


def test_dataset_required_without_environment(kind, hub, tmp_path):
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        trainer_class(kind)(model=hub.path("qwen3"), reward_funcs=hub.path("reward"),
                            args=make_args(kind, tmp_path / "out"))  # fmt: skip


# --------------------------------------------------------------------------------- reward processing classes


def test_mismatched_reward_processing_classes_length(kind, hub, tmp_path):
    with pytest.raises(ValueError, match="must match"):
        build(kind, hub, tmp_path, reward_funcs=["reward", "reward-qwen3"],
              reward_processing_classes=AutoTokenizer.from_pretrained(hub.path("reward")))  # fmt: skip


def test_correct_reward_processing_classes_list(kind, hub, tmp_path):
    classes = [AutoTokenizer.from_pretrained(hub.path(name)) for name in ("reward", "reward-qwen3")]
    trainer = build(kind, hub, tmp_path, reward_funcs=["reward", "reward-qwen3"], reward_processing_classes=classes)
    assert len(trainer.reward_processing_classes) == 2


def test_single_reward_model_with_single_processing_class(kind, hub, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(hub.path("reward"))
    trainer = build(kind, hub, tmp_path, reward_processing_classes=tokenizer)
    assert len(trainer.reward_processing_classes) == 1 and trainer.reward_processing_classes[0] == tokenizer
