"""Tiny random models of the architectures TRL's GRPO tests train (built from configs, no hub), sharing the tiny
tokenizer of ``conftest`` (pad 0, EOS 1).

Each builder takes a seed and returns a model in eval mode. ``MOE_ROUTER_LOGITS`` builders set
``output_router_logits=True`` in the config, so the model returns its router logits (and TRL adds its load-balancing
loss) on every forward that does not turn them off.
"""

from __future__ import annotations

import warnings

import torch
from conftest import TINY_VOCAB, build_tiny_model

_COMMON = dict(vocab_size=len(TINY_VOCAB), pad_token_id=0, eos_token_id=1, bos_token_id=None,
               max_position_embeddings=256, tie_word_embeddings=False)  # fmt: skip
_ATTENTION = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_hidden_layers=2)


def _sharpen(model):
    with torch.no_grad():  # as conftest's Llama: sharper logits, so that models of two seeds differ clearly
        model.get_output_embeddings().weight.mul_(20)
    return model.eval()


def llama(seed: int):
    return build_tiny_model(seed)


def qwen2(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return _sharpen(Qwen2ForCausalLM(Qwen2Config(**_COMMON, **_ATTENTION, intermediate_size=32)))


def qwen3(seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return _sharpen(Qwen3ForCausalLM(Qwen3Config(**_COMMON, **_ATTENTION, intermediate_size=32)))


def gemma2(seed: int):
    """Gemma 2: logits soft-capping, alternating sliding-window and global attention layers, tied embeddings."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    config = Gemma2Config(**{**_COMMON, "tie_word_embeddings": True}, **_ATTENTION, intermediate_size=32,
                          sliding_window=4)  # fmt: skip
    return Gemma2ForCausalLM(config).eval()


def cohere2(seed: int):
    """Cohere 2: sliding-window and global layers (a cache with two layer types)."""
    from transformers import Cohere2Config, Cohere2ForCausalLM

    torch.manual_seed(seed)
    config = Cohere2Config(**_COMMON, **_ATTENTION, intermediate_size=32, sliding_window=4)
    return _sharpen(Cohere2ForCausalLM(config))


def qwen3_moe(seed: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(**_COMMON, **_ATTENTION, intermediate_size=32, moe_intermediate_size=8, num_experts=4,
                            num_experts_per_tok=2, output_router_logits=True)  # fmt: skip
    return _sharpen(Qwen3MoeForCausalLM(config))


def glm4_moe(seed: int):
    """GLM-4 MoE with router logits off, as TRL's tiny model (TRL 1.16's fused head reads ``num_experts`` to add the
    load-balancing loss when they are on, a field Glm4MoeConfig calls ``n_routed_experts``)."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    config = Glm4MoeConfig(**_COMMON, **_ATTENTION, intermediate_size=32, moe_intermediate_size=8, n_routed_experts=4,
                           num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                           topk_group=1)  # fmt: skip
    return _sharpen(Glm4MoeForCausalLM(config))


def gpt_oss(seed: int):
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    config = GptOssConfig(**_COMMON, **_ATTENTION, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                          output_router_logits=True, sliding_window=4)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its default rope scaling warns about these tiny lengths
        model = GptOssForCausalLM(config)
    return _sharpen(model)


def nemotron_h(seed: int):
    """Nemotron-H: a hybrid of Mamba-2, attention and MoE layers (one each), whose cache holds convolution and SSM
    states for the Mamba layer."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(seed)
    config = NemotronHConfig(
        **_COMMON, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32,
        layers_block_type=["mamba", "attention", "moe"], mamba_num_heads=4, mamba_head_dim=4, n_groups=1,
        ssm_state_size=8, conv_kernel=4, expand=2, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, moe_shared_expert_intermediate_size=16,
    )  # fmt: skip
    return _sharpen(NemotronHForCausalLM(config))


CAUSAL_LMS = {
    "llama": llama,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "gemma2": gemma2,
    "cohere2": cohere2,
    "qwen3_moe": qwen3_moe,
    "glm4_moe": glm4_moe,
    "gpt_oss": gpt_oss,
    "nemotron_h": nemotron_h,
}
MOE_ROUTER_LOGITS = ("qwen3_moe", "gpt_oss")


def reward_model(seed: int = 5, family: str = "qwen2"):
    """A tiny random sequence classifier (one score) over the tiny vocabulary: ``family`` ``"qwen2"``, ``"qwen3"`` or
    ``"llama"``."""
    import transformers

    prefix = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[family]
    config_class = getattr(transformers, f"{prefix}Config")
    model_class = getattr(transformers, f"{prefix}ForSequenceClassification")
    torch.manual_seed(seed)
    return model_class(config_class(**_COMMON, **_ATTENTION, intermediate_size=32, num_labels=1)).eval()


VLLM_SHAPED = ("llama", "qwen2", "qwen3")
"""The architectures [`vllm_shaped`][] builds: vLLM's own model classes of the three families most users train."""


def vllm_shaped(family: str, seed: int, tied: bool, padded: bool = True):
    """A tiny random ``family`` model (``VLLM_SHAPED``) that vLLM's CPU backend runs (head size 32, hidden 64),
    with its output head tied to the input embedding or not, sharpened as the others. Its embedding is padded to 32
    rows, past the tiny tokenizer (25 tokens; 26 as transformers loads it for a Qwen2 config, which adds
    ``<|endoftext|>``), as real checkpoints pad theirs; ``padded=False`` keeps the 25 rows (a plain vLLM engine
    samples random padding rows as often as real tokens)."""
    import transformers

    prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    rows = 32 if padded else len(TINY_VOCAB)
    config = getattr(transformers, f"{prefix}Config")(
        **{**_COMMON, "tie_word_embeddings": tied, "vocab_size": rows}, hidden_size=64, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, num_hidden_layers=2, intermediate_size=64,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    with torch.no_grad():  # sharper logits; a tied head is sharp already (each token's embedding scores itself)
        model.get_output_embeddings().weight.mul_(2 if tied else 8)
    return model.eval()
