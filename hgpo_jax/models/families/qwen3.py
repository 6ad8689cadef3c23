"""Qwen3, dense (`model_type` qwen3): no biases by default (o_proj's follows q/k/v's), an RMSNorm
over each head's queries and keys before RoPE (`q_norm`, `k_norm`: [head_dim] scales), and
`head_dim` from the config (transformers' default 128, not hidden / heads: Qwen3-4B has 2560 / 32 =
80 but 128). Tied embeddings where the config says (0.6B-4B tie, 8B does not)."""

from hgpo_jax.models.families import Family
from hgpo_jax.models.families.qwen2 import sliding_window_problems


def _writes(cfg) -> dict:
    return {"use_sliding_window": False, "attention_bias": cfg.qkv_bias, "head_dim": cfg.head_size}


FAMILY = Family(
    model_type="qwen3", causal_lm="Qwen3ForCausalLM", critic="Qwen3ForTokenClassification",
    default_qkv_bias=False, out_bias_with_qkv=True, qk_norm=True, default_head_dim=128,
    rope_types=("default",), reads=("attention_bias",), problems=sliding_window_problems,
    writes=_writes)
