"""Llama 3.x and its small relatives such as SmolLM2 (`model_type` llama): no biases by default
(o_proj's follows q/k/v's; the MLP's is `mlp_bias`), RoPE plain or scaled with type `llama3`
(Llama 3.1 / 3.2), tied embeddings where the config says (Llama 3.2 1B/3B and SmolLM2 tie)."""

from hgpo_jax.models.families import Family


def _writes(cfg) -> dict:
    return {"attention_bias": cfg.qkv_bias, "mlp_bias": cfg.mlp_bias, "head_dim": cfg.head_size}


FAMILY = Family(
    model_type="llama", causal_lm="LlamaForCausalLM", critic="LlamaForTokenClassification",
    default_qkv_bias=False, out_bias_with_qkv=True, qk_norm=False, default_head_dim=None,
    rope_types=("default", "llama3"), reads=("attention_bias", "mlp_bias"), writes=_writes)
