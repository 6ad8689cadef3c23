"""Qwen2 / Qwen2.5 (`model_type` qwen2): q/k/v projections with a bias, o_proj without."""

from hgpo_jax.models.families import Family


def sliding_window_problems(d: dict) -> list[str]:
    """Qwen's configs carry sliding-window keys; the released dense checkpoints turn it off, and a
    config that turns it on is refused (full causal attention is all the decoder runs)."""
    sliding = [i for i, t in enumerate(d.get("layer_types") or []) if t != "full_attention"]
    if d.get("use_sliding_window") or sliding:
        return ["sliding-window attention (use_sliding_window / layer_types) is not supported; "
                "the released Qwen checkpoints ship with use_sliding_window=false"]
    return []


def _writes(cfg) -> dict:
    return {"use_sliding_window": False, **({} if cfg.qkv_bias else {"attention_bias": False})}


FAMILY = Family(
    model_type="qwen2", causal_lm="Qwen2ForCausalLM", critic="Qwen2ForTokenClassification",
    default_qkv_bias=True, out_bias_with_qkv=False, qk_norm=False, default_head_dim=None,
    rope_types=("default",), reads=("attention_bias",), problems=sliding_window_problems,
    writes=_writes)
