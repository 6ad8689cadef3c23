"""The decoder's layers (`hgpo_jax.models.decoder`): RMSNorm, grouped-query self-attention with
RoPE over a `KVCache`, the MLP, one decoder layer and the stack of them (unrolled, or scanned
over stacked weights).

Shapes: B batch, T new tokens, S cache slots, D hidden, H query heads, K kv heads, hd head size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hgpo_jax.models.attention import attention, fused_attention
from hgpo_jax.models.config import DecoderConfig
from hgpo_jax.models.gpu_attention import ragged_decode_attention
from hgpo_jax.models.kv_cache import RaggedKV, write_kv
from hgpo_jax.models.lora import LoraSpec, linear
from hgpo_jax.models.rope import apply_rope

INIT = nnx.initializers.normal(stddev=0.02)  # HF initializer_range default


class RMSNorm(nnx.Module):
    """y = scale * x / sqrt(mean(x^2) + eps), computed in float32 like HF."""

    def __init__(self, dim: int, eps: float, *, dtype, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x):  # [..., D] -> [..., D]
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * x32.astype(self.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary embeddings; q/k/v (and o) biases and an RMSNorm
    over each head's queries and keys (`q_norm`, `k_norm`, before RoPE) where the config says."""

    def __init__(self, cfg: DecoderConfig, *, dtype, param_dtype, rngs: nnx.Rngs,
                 lora: LoraSpec | None = None, lora_rngs: nnx.Rngs | None = None):
        D, H, K, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_size
        kw = dict(dtype=dtype, param_dtype=param_dtype, kernel_init=INIT, rngs=rngs, lora=lora,
                  lora_rngs=lora_rngs)
        self.q_proj = linear("q_proj", D, H * hd, use_bias=cfg.qkv_bias, **kw)
        self.k_proj = linear("k_proj", D, K * hd, use_bias=cfg.qkv_bias, **kw)
        self.v_proj = linear("v_proj", D, K * hd, use_bias=cfg.qkv_bias, **kw)
        self.o_proj = linear("o_proj", H * hd, D, use_bias=cfg.out_bias, **kw)
        norm = dict(dtype=dtype, param_dtype=param_dtype)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, **norm) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, **norm) if cfg.qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_size = H, K, hd

    def _heads(self, proj, norm, x, n):
        """x [B, T, D] -> proj(x) as n heads [B, T, n, hd], each normalized by `norm` (if any)."""
        y = proj(x).reshape(x.shape[0], x.shape[1], n, self.head_size)
        return y if norm is None else norm(y)

    def __call__(self, x, cos, sin, mask, cache_kv=None, index=None, last_query_only=False,
                 fused: tuple | None = None, last_slot=None):
        """x [B, T, D]; cos/sin [B, T, hd]; mask bool [B, 1, T, S].

        With cache_kv = (k [B, K, hd, S], v [B, K, S, hd]), the new keys and values are written
        at slots `index .. index+T-1` and attention runs over all S slots; without one S == T.
        last_query_only: keys and values of all T tokens, but only one token per row queries
        (Tq = 1 instead of T): slot T-1, or `last_slot` (int32 [B], a slot among the T new ones:
        each right-padded row's last real token). Returns (y [B, Tq, D], (k, v) written cache or
        None).

        fused ((impl, mesh): impl 'xla', 'cudnn', 'splash', 'flash_standin' (`resolve_attention`),
        mesh the model's `batch_mesh`, which a Pallas kernel needs): `fused_attention`
        instead, and `mask` is then the rows' lengths int32 [B] (right-padded rows, causal). With a
        cache this is a prefill into an EMPTY cache (the caller's promise): the T tokens attend to
        each other only, and their keys/values are written at `index` for the decode. With
        last_query_only the queries at `last_slot` take the einsum path over the T new keys
        (scores [B, K, G, T]: no [T, T] buffer).

        A decode step into a ragged cache (cache_kv a `RaggedKV`, fused ("ragged", mesh), T = 1):
        `mask` is each row's slot int32 [B] (its `KVCache.pos`); the new key and value are written
        there, and the query reads the row's slots [0, slot] only (`ragged_decode_attention`).
        """
        B, T, _ = x.shape
        H, K, hd = self.num_heads, self.num_kv_heads, self.head_size
        if fused is not None and fused[0] == "ragged":
            return self._ragged_decode(x, cos, sin, mask, cache_kv, fused[1])
        if fused is not None:
            k = apply_rope(self._heads(self.k_proj, self.k_norm, x, K), cos, sin,
                           heads_first=False)                                        # [B, T, K, hd]
            v = self._heads(self.v_proj, None, x, K)                                 # [B, T, K, hd]
            new_kv = (None if cache_kv is None else
                      write_kv(cache_kv, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), index))
            if last_query_only:
                xq, cq, sq = (_query_rows(a, last_slot) for a in (x, cos, sin))
                q = apply_rope(self._heads(self.q_proj, self.q_norm, xq, H).transpose(0, 2, 1, 3),
                               cq, sq)                                               # [B, H, 1, hd]
                slot = T - 1 if last_slot is None else last_slot[:, None]
                visible = (jnp.arange(T)[None, :] <= slot) & (jnp.arange(T)[None, :] < mask[:, None])
                out = attention(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3),
                                visible[:, None, None, :]).transpose(0, 2, 1, 3)   # [B, 1, H, hd]
            else:
                q = apply_rope(self._heads(self.q_proj, self.q_norm, x, H), cos, sin,
                               heads_first=False)
                out = fused_attention(q, k, v, mask, *fused)                         # [B, T, H, hd]
            return self.o_proj(out.reshape(B, -1, H * hd)), new_kv
        heads_first = lambda proj, norm, y, n: self._heads(proj, norm, y, n).transpose(0, 2, 1, 3)  # noqa: E731
        k = apply_rope(heads_first(self.k_proj, self.k_norm, x, K), cos, sin)     # [B, K, T, hd]
        kt = k.transpose(0, 1, 3, 2)                                              # [B, K, hd, T]
        v = heads_first(self.v_proj, None, x, K)                                 # [B, K, T, hd]
        if last_query_only:
            x, cos, sin = (_query_rows(a, last_slot) for a in (x, cos, sin))
            mask = (mask[:, :, -1:] if last_slot is None else
                    jnp.take_along_axis(mask, last_slot[:, None, None, None], axis=2))
        q = apply_rope(heads_first(self.q_proj, self.q_norm, x, H), cos, sin)     # [B, H, Tq, hd]
        new_kv = None
        if cache_kv is not None:
            if isinstance(cache_kv, RaggedKV):
                raise ValueError("a ragged KV cache is filled by a right-padded prefill "
                                 "(right_padded=True) and then decoded one token at a time")
            new_kv = ck, cv = write_kv(cache_kv, k, v, index)
            kt, v = ck.astype(q.dtype), cv.astype(q.dtype)
        out = attention(q, kt, v, mask).transpose(0, 2, 1, 3)  # [B, Tq, H, hd]
        return self.o_proj(out.reshape(B, -1, H * hd)), new_kv

    def _ragged_decode(self, x, cos, sin, slots, cache_kv, mesh):
        """One decode step into a ragged cache (see `__call__`): x [B, 1, D], slots int32 [B] ->
        (y [B, 1, D], the layer's (k, v) with each row's new key and value at its slot)."""
        B, T, _ = x.shape
        H, K, hd = self.num_heads, self.num_kv_heads, self.head_size
        if T != 1 or not isinstance(cache_kv, RaggedKV):
            raise ValueError(f"a ragged decode step feeds one token per row into a ragged cache "
                             f"(got {T} tokens, cache {type(cache_kv).__name__})")
        heads_first = lambda proj, norm, n: self._heads(proj, norm, x, n).transpose(0, 2, 1, 3)  # noqa: E731
        q = apply_rope(heads_first(self.q_proj, self.q_norm, H), cos, sin)       # [B, H, 1, hd]
        k = apply_rope(heads_first(self.k_proj, self.k_norm, K), cos, sin)       # [B, K, 1, hd]
        v = heads_first(self.v_proj, None, K)                                   # [B, K, 1, hd]
        put = jax.vmap(lambda c, new, s: jax.lax.dynamic_update_slice(c, new, (0, s, 0)))
        ck = put(cache_kv.k, k.astype(cache_kv.k.dtype), slots)
        cv = put(cache_kv.v, v.astype(cache_kv.v.dtype), slots)
        out = ragged_decode_attention(q[:, :, 0], ck.astype(q.dtype), cv.astype(q.dtype),
                                      slots + 1, mesh=mesh)                      # [B, H, hd]
        return self.o_proj(out.reshape(B, 1, H * hd)), (ck, cv)


def _query_rows(x, last_slot):
    """x [B, T, ...] -> [B, 1, ...]: each row's slot `last_slot[b]` (int [B]), or slot T-1 for
    every row when last_slot is None."""
    if last_slot is None:
        return x[:, -1:]
    index = last_slot.reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.take_along_axis(x, index, axis=1)


class MLP(nnx.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: DecoderConfig, *, dtype, param_dtype, rngs: nnx.Rngs,
                 lora: LoraSpec | None = None, lora_rngs: nnx.Rngs | None = None):
        D, I = cfg.hidden_size, cfg.intermediate_size
        kw = dict(use_bias=cfg.mlp_bias, dtype=dtype, param_dtype=param_dtype, kernel_init=INIT,
                  rngs=rngs, lora=lora, lora_rngs=lora_rngs)
        self.gate_proj = linear("gate_proj", D, I, **kw)
        self.up_proj = linear("up_proj", D, I, **kw)
        self.down_proj = linear("down_proj", I, D, **kw)

    def __call__(self, x):  # [B, T, D] -> [B, T, D]
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, dtype, param_dtype, rngs: nnx.Rngs,
                 lora: LoraSpec | None = None, lora_rngs: nnx.Rngs | None = None):
        norm = dict(dtype=dtype, param_dtype=param_dtype)
        adapters = dict(lora=lora, lora_rngs=lora_rngs)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm)
        self.self_attn = Attention(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs, **adapters)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm)
        self.mlp = MLP(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs, **adapters)

    def __call__(self, x, cos, sin, mask, cache_kv=None, index=None, last_query_only=False,
                 fused=None, last_slot=None):
        """x [B, T, D] -> (x' [B, Tq, D], new (k, v) or None); Tq = 1 with last_query_only (the
        layer's keys/values still cover all T tokens: slot T-1 or `last_slot` [B] queries), else
        T. See Attention."""
        h, new_kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache_kv, index,
                                   last_query_only, fused, last_slot)
        x = (_query_rows(x, last_slot) if last_query_only else x) + h
        return x + self.mlp(self.post_attention_layernorm(x)), new_kv


class Decoder(nnx.Module):
    """Embeddings, decoder layers and the final norm (HF's `model.` prefix).

    scan_layers: `layers` is one DecoderLayer whose weights are stacked on a leading [L] axis
    (parameter paths `model.layers.mlp.up_proj.kernel` [L, D, I]), run by `jax.lax.scan`; else an
    `nnx.List` of L layers (`model.layers.3.mlp.up_proj.kernel` [D, I]). Both draw the same initial
    weights from the same rngs.
    """

    def __init__(self, cfg: DecoderConfig, *, dtype, param_dtype, rngs: nnx.Rngs,
                 scan_layers: bool = False, lora: LoraSpec | None = None, lora_seed: int = 0):
        self.embed_tokens = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype,
                                      param_dtype=param_dtype, embedding_init=INIT, rngs=rngs)
        # adapters draw from a stream of their own: the base weights are the same with or without
        lora_rngs = nnx.Rngs(params=lora_seed) if lora else None
        layers = [DecoderLayer(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs, lora=lora,
                               lora_rngs=lora_rngs)
                  for _ in range(cfg.num_hidden_layers)]
        self.layers = stack_layers(layers) if scan_layers else nnx.List(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)


def stack_layers(layers: list) -> DecoderLayer:
    """L identical-structure layers -> one layer whose every weight has a leading [L] axis."""
    graphdef = nnx.graphdef(layers[0])
    states = [nnx.state(layer) for layer in layers]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


def unstack_layers(stacked: DecoderLayer) -> list:
    """Inverse of `stack_layers`: a layer with [L, ...] weights -> L layers."""
    graphdef, state = nnx.split(stacked)
    n = jax.tree.leaves(state)[0].shape[0]
    return [nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state)) for i in range(n)]


def remat_layer_output(layer, x, cos, sin, mask, fused=None):
    """One decoder layer without a cache, rematerialized: the backward pass keeps only the layer's
    inputs and recomputes everything inside it (`jax.checkpoint` over the layer's weights)."""
    graphdef, state = nnx.split(layer)

    def run(state, x, cos, sin, mask):
        return nnx.merge(graphdef, state)(x, cos, sin, mask, fused=fused)[0]

    return jax.checkpoint(run)(state, x, cos, sin, mask)
