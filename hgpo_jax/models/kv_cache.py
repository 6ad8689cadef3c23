"""The KV cache of the decoder's prefill and decode (`hgpo_jax.models.decoder`).

Shapes: B batch, S cache slots, K kv heads, hd head size, L layers. A cache holds every layer's
keys (stored transposed, [B, K, hd, S], so a decode step reads them without a transpose) and
values ([B, K, S, hd]), stacked [L, ...] for a scanned model or a tuple of layers; a ragged cache
(`KVCache(ragged=True)`, after a right-padded prefill) keeps keys untransposed and each row's
next slot in `pos`, so a row's tokens are always its first slots
(`gpu_attention.ragged_decode_attention`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from hgpo_jax.models.config import DecoderConfig, resolve_dtype


@struct.dataclass
class KVCache:
    """Keys and values of past tokens, as a pytree (jit/scan friendly).

    k:         per layer, [B, K, hd, S] (keys stored transposed: scores are a plain matmul); a tuple
               of L arrays, or one stacked array [L, B, K, hd, S] for a model with scanned layers;
               a ragged cache: [B, K, S, hd] per layer, as v (the ragged kernel's layout)
    v:         per layer, [B, K, S, hd]; a tuple, or stacked [L, B, K, S, hd]
    key_mask:  [B, S] bool, True where a slot holds a real (non-padding) token (a ragged cache
               keeps it from its prefill only: its rows' real tokens are slots [0, pos))
    pos:       [B] int32, RoPE position of the next real token of each row (a ragged cache: also
               the slot it is written at)
    index:     [] int32, the next slot to write (shared by all rows; a ragged cache's prefill)
    ragged:    static: the rows' tokens are their first `pos` slots, each decode step writing
               at the row's own slot `pos` (see the module docstring); unstacked layers only
    """

    k: tuple | jax.Array
    v: tuple | jax.Array
    key_mask: jax.Array
    pos: jax.Array
    index: jax.Array
    ragged: bool = struct.field(pytree_node=False, default=False)

    @classmethod
    def init(cls, config: DecoderConfig, batch: int, max_len: int, dtype="float32", *,
             stacked: bool = False, ragged: bool = False) -> "KVCache":
        """An empty cache with room for `max_len` slots per row; `stacked` for a model with
        scanned layers (`CausalLM.scan_layers`); `ragged` for a ragged decode (keys [B, K, S,
        hd]; not stacked)."""
        dtype = resolve_dtype(dtype)
        K, hd, L = config.num_key_value_heads, config.head_size, config.num_hidden_layers
        if stacked and ragged:
            raise ValueError("a ragged KV cache is one array per layer: run the model's layers "
                             "unrolled (relayout_layers(model, False)) to decode into it")
        if stacked:
            k = jnp.zeros((L, batch, K, hd, max_len), dtype)
            v = jnp.zeros((L, batch, K, max_len, hd), dtype)
        else:
            k_shape = (batch, K, max_len, hd) if ragged else (batch, K, hd, max_len)
            k = tuple(jnp.zeros(k_shape, dtype) for _ in range(L))
            v = tuple(jnp.zeros((batch, K, max_len, hd), dtype) for _ in range(L))
        return cls(k=k, v=v, key_mask=jnp.zeros((batch, max_len), bool),
                   pos=jnp.zeros((batch,), jnp.int32), index=jnp.zeros((), jnp.int32),
                   ragged=ragged)

    @property
    def max_len(self) -> int:
        return self.key_mask.shape[1]

    @property
    def stacked(self) -> bool:
        return not isinstance(self.k, tuple)


class RaggedKV(tuple):
    """One layer's (k, v) of a ragged cache, both [B, K, S, hd] (`KVCache(ragged=True)`): a tuple
    that says its layout, so a layer writes its keys untransposed."""

    def __new__(cls, k, v):
        return super().__new__(cls, (k, v))

    k = property(lambda self: self[0])
    v = property(lambda self: self[1])


def layer_kv(cache: "KVCache", i: int) -> tuple:
    """Layer i's (k, v) of an unstacked cache: a `RaggedKV` for a ragged cache."""
    kv = (cache.k[i], cache.v[i])
    return RaggedKV(*kv) if cache.ragged else kv


def write_kv(cache_kv, k, v, index):
    """Write T new keys k and values v [B, K, T, hd] into one layer's cache at slot `index` (the
    same for every row) -> the updated (k, v): k stored [B, K, hd, S] (transposed), or [B, K, S,
    hd] in a ragged cache (`RaggedKV`); v [B, K, S, hd]."""
    ck, cv = cache_kv
    if isinstance(cache_kv, RaggedKV):
        new_k = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, 0, index, 0))
    else:
        new_k = jax.lax.dynamic_update_slice(ck, k.transpose(0, 1, 3, 2).astype(ck.dtype),
                                             (0, 0, 0, index))
    return new_k, jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, 0, index, 0))
