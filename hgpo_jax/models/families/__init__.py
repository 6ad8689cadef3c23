"""Model families: the registry of decoder families, keyed by the `model_type` of an HF config.json.

Every family runs on the same machinery (`hgpo_jax.models.decoder`: attention paths, RoPE, the KV
cache, scanned layers, sharding rules, the HF tensor mapping); a family is one small module that
states how its config.json differs and what an export writes back:

    qwen2   Qwen2 / Qwen2.5: q/k/v biases
    qwen3   Qwen3 (dense): no biases, an RMSNorm over each head's q and k before RoPE, head_dim
            from the config (128 when absent)
    llama   Llama 3.x, SmolLM2: no biases, RoPE scaling of type llama3

The rest of the system asks this registry (`get_family`, `family_names`) and never names a family
module. How to add a family: docs/models.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


class UnsupportedFamily(KeyError):
    """A model_type that no registered family runs."""

    def __str__(self):  # KeyError quotes its message; this one is a sentence
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class Family:
    """What one decoder family differs in.

    model_type:      the HF config.json `model_type`
    causal_lm:       the transformers class of a policy export (config.json `architectures`)
    critic:          the transformers class of a critic export (token-level value heads)
    default_qkv_bias: whether q/k/v carry a bias when config.json says nothing (`attention_bias`)
    out_bias_with_qkv: whether o_proj carries a bias whenever q/k/v do (Llama, Qwen3), or never
                     (Qwen2)
    qk_norm:         an RMSNorm over each head's queries and keys, before RoPE (Qwen3)
    default_head_dim: head_dim when config.json has none (None: hidden_size // num_attention_heads)
    rope_types:      the RoPE types of config.json's `rope_parameters` / `rope_scaling` it runs
    reads:           config.json keys the family reads besides the common ones (`config.py`)
    problems:        d -> the family's own reasons to refuse a config.json (list of sentences)
    writes:          DecoderConfig -> the family's own keys of an exported config.json
    """

    model_type: str
    causal_lm: str
    critic: str
    default_qkv_bias: bool
    out_bias_with_qkv: bool
    qk_norm: bool
    default_head_dim: int | None
    rope_types: tuple[str, ...]
    reads: tuple[str, ...] = ()
    problems: Callable[[dict], list[str]] = lambda d: []
    writes: Callable[[Any], dict] = lambda cfg: {}


def _registry() -> dict[str, Family]:
    from hgpo_jax.models.families import llama, qwen2, qwen3

    return {f.model_type: f for f in (qwen2.FAMILY, qwen3.FAMILY, llama.FAMILY)}


FAMILIES: dict[str, Family] = _registry()

# HF model types people try that are not decoders of these families, with why (for the error).
KNOWN_UNSUPPORTED = {
    "qwen3_moe": "a mixture-of-experts model (experts are not implemented)",
    "qwen2_moe": "a mixture-of-experts model (experts are not implemented)",
    "gemma3": "another architecture (sliding-window layers, pre/post norms, soft-capping)",
    "gemma2": "another architecture (sliding-window layers, pre/post norms, soft-capping)",
    "gpt2": "another architecture (learned positions, LayerNorm, fused qkv)",
    "mistral": "another family (sliding-window attention)",
    "qwen2_vl": "a vision-language model", "qwen2_5_vl": "a vision-language model",
    "qwen3_vl": "a vision-language model",
}


def family_names() -> tuple[str, ...]:
    """The model types that load here, in registry order."""
    return tuple(FAMILIES)


def get_family(model_type: str | None, source: str = "config.json") -> Family:
    """The family of `model_type`; UnsupportedFamily naming the supported ones otherwise."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    why = KNOWN_UNSUPPORTED.get(model_type)
    raise UnsupportedFamily(
        f"{source}: model_type {model_type!r} is not supported"
        f"{f' ({why})' if why else ''}; hgpo-jax runs the decoder families "
        f"{', '.join(family_names())} (Qwen2 / Qwen2.5, Qwen3 dense, Llama 3.x and SmolLM2): "
        "see docs/models.md for adding one")
