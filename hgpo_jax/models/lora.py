"""Low-rank adapters (LoRA) on the decoder's linear layers, for every family.

    spec = LoraSpec(rank=8, alpha=16.0)                  # verl's lora_rank / lora_alpha; rank 0: off
    model = CausalLM(config, lora=spec)                  # q/k/v/o/gate/up/down carry adapters
    nnx.state(model, nnx.LoRAParam)                      # the adapters only (what trains)
    nnx.state(model, BASE)                               # the frozen base only

A targeted layer computes y = x W + b + (alpha / r) * (x A) B with A [in, r] and B [r, out]
(PEFT's lora_A.weight and lora_B.weight, transposed), B zero at the start, so a new adapter's
model equals its base. The adapters are `nnx.LoRAParam`s (a subclass of `nnx.Param`) named
`lora_a` / `lora_b` beside the layer's `kernel`: filters split them from the base, and scanned
layers stack them on the leading [L] axis like every other weight.

Written here rather than with qwix (the JAX library tunix uses for LoRA): qwix 0.1.8's
`apply_lora_to_model` adds adapters by running the model once and intercepting its `dot_general`
calls. On the decoder's unrolled layers that works; on its scanned layers (one DecoderLayer with
stacked weights, split and merged inside `jax.lax.scan`, the training default) it fails with an
IndexError, and the adapters it creates carry qwix's names (`kernel_lora_a`) and initialisation,
not the ones the PEFT port below needs. An adapter is one more pair of weights on a linear layer:
declaring it in the layer keeps every attention path, the KV cache, the sharding rules and the
weight port working unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import zlib
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR = "all-linear"  # PEFT's and verl's name for every linear layer but the LM head
BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))  # filter: the base weights, not the adapters
# filter: what trains when a model has adapters: the adapters, and a head the base does not
# have (a critic's value head `score`, new weights on the shared base)
TRAINED = nnx.Any(nnx.LoRAParam, nnx.PathContains("score"))
LEAVES = ("lora_a", "lora_b")


def parse_targets(targets) -> tuple[str, ...]:
    """`model.lora_targets` -> the layer names, in TARGETS order: "all-linear" (PEFT's, verl's
    default), a comma-separated string or a list of names among TARGETS. ValueError names an
    unknown one."""
    if isinstance(targets, str):
        names = list(TARGETS) if targets.strip() == ALL_LINEAR else [
            t.strip() for t in targets.split(",") if t.strip()]
    else:
        names = [str(t) for t in targets]
    unknown = [t for t in names if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown LoRA target {unknown[0]!r}: use {ALL_LINEAR!r} or names among "
                         f"{', '.join(TARGETS)}")
    return tuple(t for t in TARGETS if t in names)


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Which linear layers carry adapters, of what rank, scaled by alpha / rank (rslora: by
    alpha / sqrt(rank), PEFT's use_rslora)."""

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS
    rslora: bool = False

    def __post_init__(self):
        if self.rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {self.rank} (rank 0 means no "
                             "adapters: pass no LoraSpec)")
        if not self.targets:
            raise ValueError("LoRA with no target layers: name some of " + ", ".join(TARGETS))
        object.__setattr__(self, "targets", parse_targets(self.targets))

    @property
    def scale(self) -> float:
        return float(self.alpha) / (math.sqrt(self.rank) if self.rslora else self.rank)

    def on(self, name: str) -> bool:
        return name in self.targets


def from_options(rank: int, alpha: float, targets) -> LoraSpec | None:
    """The spec of `model.lora_rank` / `lora_alpha` / `lora_targets`; None for rank 0 (off)."""
    return None if rank == 0 else LoraSpec(rank, alpha, parse_targets(targets))


class LoRALinear(nnx.Linear):
    """`nnx.Linear` plus an adapter: y = x W + b + scale * (x A) B; A [in, r], B [r, out]
    (`nnx.LoRAParam`s in `adapter_dtype`, float32 by default: they train while the base may be
    bfloat16). A is drawn from `lora_rngs` (PEFT's default, uniform in +-1/sqrt(in)), B is zero."""

    def __init__(self, in_features: int, out_features: int, *, rank: int, scale: float,
                 lora_rngs: nnx.Rngs, adapter_dtype=jnp.float32, **kw):
        super().__init__(in_features, out_features, **kw)
        bound = 1.0 / np.sqrt(in_features)
        self.lora_a = nnx.LoRAParam(jax.random.uniform(lora_rngs.params(), (in_features, rank),
                                                       adapter_dtype, -bound, bound))
        self.lora_b = nnx.LoRAParam(jnp.zeros((rank, out_features), adapter_dtype))
        self.lora_scale = scale

    def __call__(self, x):  # [..., in] -> [..., out]
        y = super().__call__(x)
        dtype = self.dtype or x.dtype
        a, b = self.lora_a[...].astype(dtype), self.lora_b[...].astype(dtype)
        return y + (x.astype(dtype) @ a @ b) * jnp.asarray(self.lora_scale, dtype)


def linear(name: str, in_features: int, out_features: int, *, lora: LoraSpec | None,
           lora_rngs: nnx.Rngs | None, **kw) -> nnx.Linear:
    """The decoder's linear layer `name` (a TARGETS name): with an adapter where `lora` targets
    it, else a plain `nnx.Linear` (no LoRA: today's model, parameter for parameter)."""
    if lora is None or not lora.on(name):
        return nnx.Linear(in_features, out_features, **kw)
    return LoRALinear(in_features, out_features, rank=lora.rank, scale=lora.scale,
                      lora_rngs=lora_rngs if lora_rngs is not None else nnx.Rngs(0), **kw)


def is_adapter_path(path: tuple) -> bool:
    """A flat-state path of an adapter weight (`...q_proj.lora_a`)."""
    return bool(path) and path[-1] in LEAVES


def new_adapter_value(dotted: str, shape: tuple[int, ...], dtype, seed: int) -> np.ndarray:
    """A fresh adapter weight for loading (host NumPy): `lora_b` zeros, `lora_a` uniform in
    +-1/sqrt(in) from a key of (seed, the layer's own dotted path), so that the same layer gets
    the same A whether the layers are scanned or not (a stacked [L, in, r] draws layer by layer
    from `model.layers.<i>....`)."""
    if dotted.endswith("lora_b"):
        return np.zeros(shape, dtype)
    from hgpo_jax.models.sharding import is_stacked_path

    if is_stacked_path(dotted):
        head, _, tail = dotted.partition("layers.")
        return np.stack([new_adapter_value(f"{head}layers.{i}.{tail}", shape[1:], dtype, seed)
                         for i in range(shape[0])])
    key = jax.random.fold_in(jax.random.PRNGKey(seed), zlib.crc32(dotted.encode()) & 0x7FFFFFFF)
    bound = 1.0 / np.sqrt(shape[0])
    return np.asarray(jax.random.uniform(key, shape, jnp.float32, -bound, bound)).astype(dtype)


# ------------------------------------------------------------------------------ a policy's params
@flax.struct.dataclass
class Adapted:
    """A model's parameters when only its adapters train, one pytree: `train` (the
    `nnx.LoRAParam` state, and a critic's value head: `TRAINED`) and `frozen` (the base's
    `nnx.Param` state, never differentiated, never in an optimizer). Every other parameter tree
    is a plain `nnx.State` (all weights train)."""

    train: Any
    frozen: Any


def split_params(model: nnx.Module) -> tuple[Any, Any]:
    """(graphdef, params): params the model's `nnx.Param` state, or `Adapted` when it has
    adapters (`CausalLM.lora`; what trains: `TRAINED`)."""
    if getattr(model, "lora", None) is None:
        return nnx.split(model, nnx.Param)
    graphdef, train, frozen = nnx.split(model, TRAINED, nnx.Param)
    return graphdef, Adapted(train, frozen)


def merge_params(graphdef, params) -> nnx.Module:
    """The model of `split_params`' (graphdef, params)."""
    if isinstance(params, Adapted):
        return nnx.merge(graphdef, params.train, params.frozen)
    return nnx.merge(graphdef, params)


def trainable(params):
    """What trains (and what the optimizer and a checkpoint hold): the adapters of an `Adapted`,
    else every parameter."""
    return params.train if isinstance(params, Adapted) else params


def with_trainable(params, train):
    """`params` with its trainable part replaced by `train`."""
    return params.replace(train=train) if isinstance(params, Adapted) else train


def adapters_off(params):
    """The base model's parameters in the same tree (the KL reference of a LoRA run): an
    `Adapted` whose adapters' B are zero, sharing the frozen arrays (no copy of the base); a
    plain state is copied (it trains in place, the reference must not)."""
    if not isinstance(params, Adapted):
        return jax.tree.map(jnp.copy, params)
    off = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if _leaf_name(path) == "lora_b" else jnp.copy(x),
        params.train)
    return params.replace(train=off)


def _leaf_name(path) -> str:
    names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
    names = [n for n in names if n and n != "value"]
    return names[-1] if names else ""


def folder_fingerprint(folder: str, sample: int = 1 << 16, samples: int = 4) -> str:
    """A fingerprint of a model folder that reads no weight whole: sha256 over config.json and,
    per *.safetensors file (sorted), its size, its header and `samples` blocks of `sample` bytes
    spread evenly over it. Two folders of the same architecture with other weights differ in
    every block; a copy of the folder elsewhere fingerprints the same."""
    h = hashlib.sha256()
    names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors") or n == "config.json")
    for name in names:
        path = os.path.join(folder, name)
        size = os.path.getsize(path)
        h.update(f"{name}:{size}".encode())
        with open(path, "rb") as f:
            if name == "config.json":
                h.update(f.read())
                continue
            header = int.from_bytes(f.read(8), "little")
            h.update(f.read(min(header, 1 << 24)))
            for i in range(samples):
                f.seek(max(0, (size - sample) * i // max(1, samples - 1)))
                h.update(f.read(sample))
    return h.hexdigest()
