"""The decoder's configuration, read from and written to a Hugging Face `config.json`.

One family-neutral `DecoderConfig` for every registered family (`hgpo_jax.models.families`): the
family named by `model_type` gives the defaults and the checks of its own keys. Both config
layouts in the wild are accepted: the one released checkpoints carry (`rope_theta`,
`rope_scaling` and `torch_dtype` at the top level) and the transformers>=5 one (`rope_parameters`,
`dtype`). Unknown keys are kept in `extra` so that an export writes them back unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

from hgpo_jax.models.families import Family, UnsupportedFamily, get_family

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class ConfigError(ValueError):
    """A config.json that this library cannot run."""


def resolve_dtype(name: str | Any) -> Any:
    """'float32' | 'bfloat16' | 'float16' (or a jnp dtype) -> jnp dtype, with a clear error."""
    if not isinstance(name, str):
        return jnp.dtype(name).type
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}")
    return DTYPES[name]


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling of type `llama3` (Llama 3.1 / 3.2): low frequencies divided by `factor`, high
    ones kept, the band between smoothly interpolated (`hgpo_jax.models.rope`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def to_hf_dict(self) -> dict:
        return {"rope_type": self.rope_type, "factor": self.factor,
                "low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The fields of a `config.json` that define the network, for any registered family.

    Defaults are Qwen2.5-1.5B-Instruct's. `model_type` picks the family (`families.get_family`),
    which fills what this config leaves open: `attention_bias` None takes the family's default
    (Qwen2: biased q/k/v; Qwen3, Llama: none), `head_dim` None the family's (Qwen3: 128; others
    hidden / heads).
    """

    vocab_size: int = 151936
    hidden_size: int = 1536
    intermediate_size: int = 8960
    num_hidden_layers: int = 28
    num_attention_heads: int = 12
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: the family's default, else hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    attention_bias: bool | None = None  # q/k/v carry a bias (o_proj too where the family says)
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    model_type: str = "qwen2"
    mlp_bias: bool = False  # gate/up/down carry a bias (Llama's `mlp_bias`)
    rope_scaling: RopeScaling | None = None  # None: plain RoPE
    extra: dict = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self):
        if isinstance(self.eos_token_id, list):  # keep the config hashable (it is static under jit)
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        try:
            family = get_family(self.model_type, source="DecoderConfig")
        except UnsupportedFamily as err:
            raise ConfigError(str(err)) from None
        if self.attention_bias is None:
            object.__setattr__(self, "attention_bias", family.default_qkv_bias)
        if self.head_dim is None and family.default_head_dim is not None:
            object.__setattr__(self, "head_dim", family.default_head_dim)
        problems = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if not problems and self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if not problems and self.head_dim is None and self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads}); set head_dim explicitly")
        if not problems and self.head_size % 2:
            problems.append(f"head_dim must be even for rotary embeddings, got {self.head_size}")
        if self.mlp_bias and "mlp_bias" not in family.reads:
            problems.append(f"mlp_bias is not part of the {self.model_type} family")
        if self.rope_scaling is not None and self.rope_scaling.rope_type not in family.rope_types:
            problems.append(f"RoPE type {self.rope_scaling.rope_type!r} is not one of the "
                            f"{self.model_type} family's {family.rope_types}")
        if problems:
            raise ConfigError(f"invalid {self.model_type} config: " + "; ".join(problems))

    @property
    def family(self) -> Family:
        return get_family(self.model_type)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qkv_bias(self) -> bool:
        """q/k/v projections carry a bias."""
        return bool(self.attention_bias)

    @property
    def out_bias(self) -> bool:
        """o_proj carries a bias (Llama, Qwen3 with attention_bias; never Qwen2)."""
        return self.qkv_bias and self.family.out_bias_with_qkv

    @property
    def qk_norm(self) -> bool:
        """An RMSNorm over each head's queries and keys before RoPE (Qwen3)."""
        return self.family.qk_norm

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)

    # ------------------------------------------------------------------ HF dict conversion
    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json") -> "DecoderConfig":
        """Build from a parsed HF config dict; `source` names the file in errors."""
        try:
            family = get_family(d.get("model_type"), source)
        except UnsupportedFamily as err:
            archs = d.get("architectures") or []
            raise ConfigError(f"{err} (architectures {archs})") from None
        problems = list(family.problems(d))
        if d.get("hidden_act", "silu") != "silu":
            problems.append(f"hidden_act {d['hidden_act']!r} is not supported (the decoder's MLP "
                            "is SwiGLU: 'silu')")
        kind = lambda r: r.get("rope_type", r.get("type")) or "default"  # noqa: E731
        params, legacy = d.get("rope_parameters") or {}, d.get("rope_scaling") or {}
        scaled = kind(legacy) != "default"  # a scaling in either layout wins over "default"
        rope = {**params, **legacy} if scaled else {**legacy, **params}
        rope_type = kind(legacy) if scaled else kind(rope)
        if rope_type not in family.rope_types:
            problems.append(f"RoPE of type {rope_type!r} ({rope}) is not supported for model_type "
                            f"{family.model_type!r}; it runs {list(family.rope_types)}")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            problems.append(f"partial_rotary_factor {rope['partial_rotary_factor']} is not supported")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads") if k not in d]
        if missing:
            problems.append(f"missing required keys {missing}")
        scaling = None
        if rope_type == "llama3" and not problems:
            need = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            if any(k not in rope for k in need):
                problems.append(f"llama3 RoPE scaling needs {list(need)}, got {rope}")
            else:
                scaling = RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                                      float(rope["high_freq_factor"]),
                                      int(rope["original_max_position_embeddings"]))
        if problems:
            raise ConfigError(f"{source}: " + "; ".join(problems))
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        common = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                  "tie_word_embeddings", "max_position_embeddings", "bos_token_id", "eos_token_id")
        kwargs = {k: d[k] for k in common if k in d}
        kwargs.update({k: bool(d[k]) for k in family.reads if d.get(k) is not None})
        kwargs.setdefault("num_key_value_heads", d["num_attention_heads"])
        kwargs.setdefault("tie_word_embeddings", False)  # HF's PretrainedConfig default
        handled = set(common) | set(family.reads) | {"model_type", "rope_theta", "rope_parameters",
                                                     "rope_scaling"}
        extra = {k: v for k, v in d.items() if k not in handled}
        return cls(model_type=family.model_type, rope_theta=float(theta), rope_scaling=scaling,
                   extra=extra, **kwargs)

    def to_hf_dict(self, dtype: str = "float32") -> dict:
        """HF config dict in the transformers>=5 layout (also read by older versions)."""
        d = dict(self.extra)
        d.pop("torch_dtype", None)
        rope = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            rope.update(self.rope_scaling.to_hf_dict())
            d["rope_scaling"] = self.rope_scaling.to_hf_dict()  # the layout before transformers 5
        d.update({
            "architectures": [self.family.causal_lm],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                             else self.eos_token_id),
            "dtype": dtype,
        })
        if self.head_dim is not None:
            d["head_dim"] = self.head_dim
        d.update(self.family.writes(self))
        return d

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "DecoderConfig":
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no config.json at {path}: expected a Hugging Face model "
                                    "folder (config.json + *.safetensors)")
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path}: cannot read config: {e}") from e
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {type(d).__name__}")
        return cls.from_hf_dict(d, source=path)

