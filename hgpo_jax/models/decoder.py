"""The decoder of every model family in Flax NNX (Qwen2 / Qwen2.5, Qwen3, Llama 3.x: `families`).

What the families differ in is read from the `DecoderConfig` (biases, per-head q/k norms, head
size, RoPE scaling); everything else is one code path. Module and attribute names mirror Hugging
Face's causal LMs (`model.layers.3.self_attn.q_proj`, `...self_attn.q_norm`), so the weight port in
`hf_io.py` is a rename plus a transpose of linear kernels.

Shapes: B batch, T new tokens, S cache slots, D hidden, H query heads, K kv heads, hd head size,
V vocabulary.

One attention code path serves three uses:
- full forward (no cache): tokens occupy slots 0..T-1, keys are the same tokens;
- prefill and decode (with a `KVCache`): the T new tokens are written at slots
  `cache.index .. cache.index+T-1`, and every query attends to the valid slots at or before its own;
- decode into a ragged cache (`KVCache(ragged=True)`, after a right-padded prefill): each row's
  one new token is written at its own next slot (`cache.pos`), so a row's tokens are always its
  first slots, and its query reads those slots only (`gpu_attention.ragged_decode_attention`).
Left-padded rows are handled by `attention_mask` (0 on padding): padded slots are never attended to,
and RoPE positions count real tokens only, so a left-padded row gives the logits of the unpadded row.
"""

from __future__ import annotations

import functools
import numbers
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from hgpo_jax.models.config import DecoderConfig, resolve_dtype
from hgpo_jax.models.gpu_attention import ragged_decode_attention
from hgpo_jax.models.lora import LoraSpec, is_adapter_path, linear, new_adapter_value
from hgpo_jax.models.rope import apply_rope, inv_frequencies, rope_cos_sin
from hgpo_jax.models.sharding import place_param, rows_sharding
from hgpo_jax.models.tpu_attention import splash_attention

_INIT = nnx.initializers.normal(stddev=0.02)  # HF initializer_range default
MASKED_SCORE = -1e30  # additive score of a masked key: exp() underflows to 0, never overflows


# --------------------------------------------------------------------------- KV cache
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


# --------------------------------------------------------------------------- building blocks
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


def attention(q, kt, v, mask):
    """Grouped-query attention as two plain batched matmuls per kv head.

    q [B, H, T, hd]; kt [B, K, hd, S] (keys transposed); v [B, K, S, hd]; mask bool [B, 1, T, S]
    -> [B, H, T, hd]. The G = H/K query heads of a kv head are folded into the rows (G*T), so both
    products are [rows, hd] x [hd, S] and [rows, S] x [S, hd] with no transposes of the cache
    (XLA:CPU otherwise copies the cache every decode step). Scores and softmax in float32.

    The softmax is normalized after the second product (divide the [rows, hd] output, not the
    [rows, S] probabilities) and masking is an additive bias of MASKED_SCORE: both save a pass
    over the [B, K, G*T, S] scores, about half the attention time of a CPU prefill. The row max is
    a constant to autodiff (softmax does not depend on it). A query row with no visible key gets a
    uniform average (finite, never NaN).
    """
    B, H, T, hd = q.shape
    K, S = kt.shape[1], kt.shape[3]
    G = H // K
    qg = q.reshape(B, K, G * T, hd) * jnp.asarray(hd ** -0.5, q.dtype)
    scores = jnp.einsum("bkmd,bkds->bkms", qg, kt, preferred_element_type=jnp.float32)
    bias = jnp.where(mask, 0.0, MASKED_SCORE).astype(jnp.float32)         # [B, 1, T, S]
    scores = scores.reshape(B, K, G, T, S) + bias[:, :, None]
    row_max = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    unnorm = jnp.exp(scores - row_max)                                    # [B, K, G, T, S]
    denom = jnp.sum(unnorm, axis=-1).reshape(B, K, G * T, 1)
    out = jnp.einsum("bkms,bksd->bkmd", unnorm.astype(v.dtype).reshape(B, K, G * T, S), v,
                     preferred_element_type=jnp.float32)
    return (out / denom).reshape(B, H, T, hd).astype(q.dtype)


# --------------------------------------------------------------------------- fused attention
ATTENTION_IMPLS = ("auto", "einsum", "xla", "cudnn", "splash", "flash_standin")


def resolve_attention(impl: str, dtype, head_size: int, platform: str | None = None) -> str:
    """The attention path a training forward takes: 'einsum' (`attention` above: scores
    [B, K, G*T, S] in float32), 'xla' (`jax.nn.dot_product_attention`'s XLA path: same memory),
    'cudnn' (cuDNN flash attention: no [T, S] buffer in either pass), 'splash' (the Pallas TPU
    splash-attention kernel, `tpu_attention.py`: no [T, S] buffer either) or 'flash_standin'
    (plan only).

    'auto' is cuDNN where it runs (a GPU, 16-bit compute dtype, head size a multiple of 8 up to
    128), splash on a TPU (bfloat16 or float32 compute, head size a multiple of 128, the TPU lane
    width), else 'einsum'. 'splash' runs on TPU, and on CPU through Pallas's interpreter (slow: for
    tests); on GPU it is an error. The sampler's prefill takes the resolved fused path on
    right-padded prompts (else 'einsum' in chunks); its decode (a cache) always takes 'einsum'.
    """
    if impl not in ATTENTION_IMPLS:
        usable = tuple(a for a in ATTENTION_IMPLS if a != "flash_standin")
        raise ValueError(f"model.attention={impl!r}: use one of {usable}")
    platform = platform or jax.default_backend()
    if impl == "splash" and platform not in ("tpu", "cpu"):
        raise ValueError(f"model.attention='splash' is a Pallas TPU kernel and cannot run on "
                         f"{platform}: use 'auto' (cuDNN flash on a GPU) or 'einsum'")
    if impl != "auto":
        return impl
    if platform == "tpu":
        ok = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float32) and head_size % 128 == 0
        path = "splash" if ok else "einsum"
    else:
        ok = (platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
              and head_size % 8 == 0 and head_size <= 128)
        path = "cudnn" if ok else "einsum"
    if path != "einsum" and platform == jax.default_backend() \
            and fused_attention_failure(path, jnp.dtype(dtype).name, head_size):
        return "einsum"  # the kernel does not compile on this device: said once, not chosen
    return path


def failure_line(error: Exception) -> str:
    """A kernel's lowering or compile error as one short line: its type and its first line."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{type(error).__name__}: {first}"


@functools.lru_cache(maxsize=None)
def fused_attention_failure(impl: str, dtype: str, head_size: int) -> str | None:
    """Why the fused attention `impl` ('cudnn', 'splash') does not compile on this process's
    default device for `dtype` and `head_size` (one line, also printed once on stderr), or None
    where it does: `resolve_attention`'s 'auto' takes a fused kernel only where it compiled
    here, so a path that never ran on this hardware is never the silent default. The probe
    compiles one small causal attention (2 rows, 256 tokens, 2 heads), once per process."""
    shape = jax.ShapeDtypeStruct((2, 256, 2, head_size), jnp.dtype(dtype))
    lengths = jax.ShapeDtypeStruct((2,), jnp.int32)
    try:
        jax.jit(functools.partial(fused_attention, impl=impl)).lower(shape, shape, shape, lengths).compile()
        return None
    except Exception as e:  # noqa: BLE001 (any lowering or compile error of the kernel)
        why = failure_line(e)
        print(f"hgpo-jax: {impl} attention does not compile on this {jax.default_backend()} "
              f"device ({why}); model.attention=auto takes einsum attention instead",
              file=sys.stderr, flush=True)
        return why


@jax.custom_vjp
def _flash_standin(q, k, v, lengths):
    """A stand-in with flash attention's memory profile for `hgpo-jax plan` on CPU (its values
    mean nothing): output [B, T, H, hd], residuals q, k, v, output and a float32 logsumexp [B, H, T],
    and a backward with no [T, S] buffer. Never run for real."""
    return _flash_standin_fwd(q, k, v, lengths)[0]


def _flash_standin_fwd(q, k, v, lengths):
    G = q.shape[2] // k.shape[2]
    out = q + jnp.repeat(v.sum(axis=1, keepdims=True), G, axis=2)
    lse = jnp.sum(q.astype(jnp.float32), axis=-1).transpose(0, 2, 1)  # [B, H, T]
    return out, (q, k, v, out, lse, lengths)


def _flash_standin_bwd(res, g):
    q, k, v, out, lse, lengths = res
    dq = g * lse.transpose(0, 2, 1)[..., None].astype(g.dtype) + out
    dk = jnp.zeros_like(k) + q.sum(axis=(1, 2), keepdims=True)[:, :, :1].astype(k.dtype)
    dv = jnp.zeros_like(v) + g.sum(axis=(1, 2), keepdims=True)[:, :, :1].astype(v.dtype)
    return dq, dk, dv, None


_flash_standin.defvjp(_flash_standin_fwd, _flash_standin_bwd)


def fused_attention(q, k, v, lengths, impl: str, mesh=None):
    """Causal attention over right-padded rows without a score buffer of ours.

    q [B, T, H, hd]; k, v [B, T, K, hd]; lengths int32 [B] (real tokens of each row, which are
    its first `lengths` slots; at least 1) -> [B, T, H, hd]. impl: 'xla', 'cudnn', 'splash' or
    'flash_standin' (see `resolve_attention`). mesh: the Mesh the rows are split on (the model's
    `batch_mesh`); only 'splash' uses it (a Pallas call must be split by hand: `tpu_attention`).
    """
    if impl == "flash_standin":
        return _flash_standin(q, k, v, lengths)
    if impl == "splash":
        return splash_attention(q, k, v, lengths, interpret=jax.default_backend() == "cpu",
                                mesh=mesh)
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, key_value_seq_lengths=lengths,
                                        implementation=impl)


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary embeddings; q/k/v (and o) biases and an RMSNorm
    over each head's queries and keys (`q_norm`, `k_norm`, before RoPE) where the config says."""

    def __init__(self, cfg: DecoderConfig, *, dtype, param_dtype, rngs: nnx.Rngs,
                 lora: LoraSpec | None = None, lora_rngs: nnx.Rngs | None = None):
        D, H, K, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_size
        kw = dict(dtype=dtype, param_dtype=param_dtype, kernel_init=_INIT, rngs=rngs, lora=lora,
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
                      _write_kv(cache_kv, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), index))
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
            new_kv = ck, cv = _write_kv(cache_kv, k, v, index)
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


def _write_kv(cache_kv, k, v, index):
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
        kw = dict(use_bias=cfg.mlp_bias, dtype=dtype, param_dtype=param_dtype, kernel_init=_INIT,
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
                                      param_dtype=param_dtype, embedding_init=_INIT, rngs=rngs)
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


def _remat_layer_output(layer, x, cos, sin, mask, fused=None):
    """One decoder layer without a cache, rematerialized: the backward pass keeps only the layer's
    inputs and recomputes everything inside it (`jax.checkpoint` over the layer's weights)."""
    graphdef, state = nnx.split(layer)

    def run(state, x, cos, sin, mask):
        return nnx.merge(graphdef, state)(x, cos, sin, mask, fused=fused)[0]

    return jax.checkpoint(run)(state, x, cos, sin, mask)


# --------------------------------------------------------------------------- the causal LM
class CausalLM(nnx.Module):
    """A causal language model of any registered family (`config.model_type`).

    `model(input_ids)` -> logits [B, T, V]. With `cache=` it returns `(logits, new_cache)`.
    `dtype` is the compute dtype, `param_dtype` the storage dtype of the weights. `remat=True`
    keeps only each layer's input for the backward pass and recomputes the layer (training at
    long sequence lengths; no effect on the values). `batch_mesh`: a Mesh whose batch axes
    ("data", "fsdp") split the batch dim of the activations between layers (set by
    `load_pretrained(mesh=...)`); without it XLA may split FSDP-sharded layers along the hidden
    dim instead, which defeats remat (a 4 -> 8 layer plan grew 0.97 -> 1.57 GiB, with it
    0.52 -> 0.56 GiB). No effect on the values.

    scan_layers: stacked layer weights run by `jax.lax.scan` (one compiled layer instead of L; see
    Decoder); same values as the unrolled form. attention: the training forward's attention
    path ('auto', 'einsum', 'xla', 'cudnn'; `resolve_attention`), used when rows are right-padded.
    lora: low-rank adapters on the linear layers it targets (`lora.py`; None: none), their A
    drawn from `lora_seed`, their B zero.
    """

    def __init__(self, config: DecoderConfig, *, dtype="float32", param_dtype="float32",
                 rngs: nnx.Rngs | None = None, remat: bool = False, batch_mesh=None,
                 scan_layers: bool = False, attention: str = "auto", lm_head: bool = True,
                 lora: LoraSpec | None = None, lora_seed: int = 0):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        resolve_attention(attention, jnp.float32, config.head_size)  # validates the name
        self.config = config
        self.remat = remat  # recompute each layer in the backward pass (training memory)
        self.batch_mesh = batch_mesh  # split activations' batch dim over its batch axes
        self.scan_layers = scan_layers
        self.attention = attention
        self.lora = lora
        self.dtype, self.param_dtype = resolve_dtype(dtype), resolve_dtype(param_dtype)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, rngs=rngs)
        self.model = Decoder(config, scan_layers=scan_layers, lora=lora, lora_seed=lora_seed, **kw)
        self.lm_head = (None if config.tie_word_embeddings or not lm_head else
                        nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False,
                                   kernel_init=_INIT, **kw))

    def __call__(self, input_ids, *, positions=None, attention_mask=None, cache: KVCache | None = None):
        """input_ids int [B, T]; positions int [B, T] (default: count of real tokens before each,
        continuing from the cache); attention_mask {0,1} [B, T] (default all ones).

        Returns logits [B, T, V] in the compute dtype, or (logits, KVCache) when a cache is given.
        """
        hidden, new_cache = self.hidden_states(input_ids, positions=positions,
                                               attention_mask=attention_mask, cache=cache)
        logits = self.logits(hidden)
        return logits if cache is None else (logits, new_cache)

    def logits(self, hidden):
        """Final hidden states [B, T, D] -> logits [B, T, V]."""
        if self.lm_head is None:
            return self.model.embed_tokens.attend(hidden)
        return self.lm_head(hidden)

    def new_cache(self, batch: int, max_len: int, dtype="float32", ragged: bool = False
                  ) -> KVCache:
        """An empty KVCache in this model's layout (stacked for scanned layers); `ragged` for a
        ragged decode (`KVCache`; unrolled layers only)."""
        return KVCache.init(self.config, batch, max_len, dtype, stacked=self.scan_layers,
                            ragged=ragged)

    def hidden_states(self, input_ids, *, positions=None, attention_mask=None, cache=None,
                      last_only: bool = False, right_padded: bool = False):
        """Everything but the LM head: -> (hidden [B, T, D] after the final norm, new cache or None).

        last_only (a prefill that needs only the next-token logits): hidden is [B, 1, D], the last
        slot's, and the last layer computes keys and values for all T tokens but its queries,
        attention output and MLP for the last slot only (same values as hidden[:, -1:]).
        right_padded: the caller promises every row's real tokens come first (attention_mask a
        prefix of ones), which lets a forward without a cache take the fused attention path
        (`self.attention`); rows of all padding are fine. With a cache it is a prefill into an
        EMPTY cache (index 0; the caller's promise): the fused path (no [T, T] scores) where
        `self.attention` resolves to one, else the einsum path; keys/values of all T slots are
        written, key_mask marks the real ones, `pos` becomes the rows' lengths, and with
        last_only hidden is each row's LAST REAL token's (slot length-1; a row of only padding
        gives slot 0's, finite and meaningless).

        A ragged cache (`KVCache(ragged=True)`): filled by a right-padded prefill as above, then
        decoded one token per row per call (T = 1, not right_padded): each row's token is written
        at its slot `cache.pos` and reads its slots [0, pos] only (`Attention._ragged_decode`);
        a row whose attention_mask is 0 (finished) does not advance.
        """
        B, T = input_ids.shape
        new_mask = (jnp.ones((B, T), bool) if attention_mask is None
                    else attention_mask.astype(bool))
        start_pos = jnp.zeros((B,), jnp.int32) if cache is None else cache.pos
        if positions is None:
            counted = jnp.cumsum(new_mask.astype(jnp.int32), axis=1) - 1
            positions = jnp.maximum(start_pos[:, None] + counted, 0)
        if cache is None:
            key_mask, q_slots, S, index = new_mask, jnp.arange(T), T, None
        else:
            index, S = cache.index, cache.max_len
            key_mask = jax.lax.dynamic_update_slice(cache.key_mask, new_mask, (0, index))
            q_slots = index + jnp.arange(T)
        fused, last_slot = None, None
        if cache is not None and cache.ragged and not right_padded:
            if T != 1:
                raise ValueError(f"a ragged KV cache decodes one token per row per call, not {T}: "
                                 "fill it with a right-padded prefill (right_padded=True)")
            fused, last_only = ("ragged", self.batch_mesh), False
        elif (right_padded and cache is not None) or (
                cache is None and not last_only and (right_padded or attention_mask is None)):
            fused = resolve_attention(self.attention, self.dtype, self.config.head_size)
            fused = None if fused == "einsum" else (fused, self.batch_mesh)
        if right_padded and cache is not None and last_only:
            last_slot = jnp.maximum(new_mask.sum(axis=1) - 1, 0).astype(jnp.int32)  # [B]
        if fused is not None and fused[0] == "ragged":  # each row's slot stands for the mask
            mask = cache.pos                                                  # [B]
            key_mask = cache.key_mask
        elif fused is not None:  # the rows' lengths stand for the mask (at least 1: finite rows)
            mask = jnp.maximum(new_mask.sum(axis=1), 1).astype(jnp.int32)   # [B]
        else:
            causal = jnp.arange(S)[None, :] <= q_slots[:, None]              # [T, S]
            mask = (key_mask[:, None, None, :] & causal[None, None])          # [B, 1, T, S]

        cfg = self.config
        cos, sin = rope_cos_sin(positions, inv_frequencies(cfg.head_size, cfg.rope_theta,
                                                           cfg.rope_scaling))
        x = self._split_batch(self.model.embed_tokens(input_ids))
        run = self._scanned_layers if self.scan_layers else self._unrolled_layers
        x, kv = run(x, cos, sin, mask, cache, index, last_only, fused, last_slot)
        hidden = self.model.norm(x)
        if cache is None:
            return hidden, None
        return hidden, KVCache(k=kv[0], v=kv[1], key_mask=key_mask,
                               pos=start_pos + new_mask.sum(axis=1).astype(jnp.int32),
                               index=index + T, ragged=cache.ragged)

    def _unrolled_layers(self, x, cos, sin, mask, cache, index, last_only, fused, last_slot=None):
        """The L layers one after the other -> (x, (keys, values) tuples or None)."""
        new_k, new_v = [], []
        for i, layer in enumerate(self.model.layers):
            last = last_only and i == len(self.model.layers) - 1
            if cache is None and self.remat and not last:
                x = self._split_batch(_remat_layer_output(layer, x, cos, sin, mask, fused))
                continue
            cache_kv = None if cache is None else layer_kv(cache, i)
            x, kv = layer(x, cos, sin, mask, cache_kv, index, last_query_only=last, fused=fused,
                          last_slot=last_slot)
            x = self._split_batch(x)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        return x, (None if cache is None else (tuple(new_k), tuple(new_v)))

    def _scanned_layers(self, x, cos, sin, mask, cache, index, last_only, fused, last_slot=None):
        """The stacked layers under `jax.lax.scan` -> (x, stacked (keys, values) or None).

        Without a cache the weights are the scan's xs (their gradients come back stacked), each
        layer rematerialized with `remat`. With a cache, the stacked keys/values ride in the carry
        and each layer writes only its T new slots. last_only: L-1 layers in the scan, the last one
        after it (its queries cover the last slot only).
        """
        if cache is not None and cache.ragged:
            raise ValueError("a ragged KV cache is one array per layer: run the model's layers "
                             "unrolled (relayout_layers(model, False)) to decode into it")
        graphdef, state = nnx.split(self.model.layers)
        L = self.config.num_hidden_layers
        n = L - 1 if last_only else L

        def apply(st, x, cache_kv=None, last=False):
            return nnx.merge(graphdef, st)(x, cos, sin, mask, cache_kv, index,
                                           last_query_only=last, fused=fused, last_slot=last_slot)

        layer_at = lambda i: jax.tree.map(lambda a: a[i], state)  # noqa: E731
        if cache is None:
            def body(x, st):
                f = lambda st, x: apply(st, x)[0]  # noqa: E731
                f = jax.checkpoint(f) if self.remat else f
                return self._split_batch(f(st, x)), None

            x, _ = jax.lax.scan(body, x, state if n == L else jax.tree.map(lambda a: a[:n], state))
            if last_only:
                x = self._split_batch(apply(layer_at(L - 1), x, last=True)[0])
            return x, None

        T = x.shape[1]

        def with_layer(carry, i, last=False):
            x, ks, vs = carry
            x, (ck, cv) = apply(layer_at(i), x, (ks[i], vs[i]), last)
            B, K, hd, _ = ck.shape
            new_k = jax.lax.dynamic_slice(ck, (0, 0, 0, index), (B, K, hd, T))
            new_v = jax.lax.dynamic_slice(cv, (0, 0, index, 0), (B, K, T, hd))
            ks = jax.lax.dynamic_update_slice(ks, new_k[None], (i, 0, 0, 0, index))
            vs = jax.lax.dynamic_update_slice(vs, new_v[None], (i, 0, 0, index, 0))
            return self._split_batch(x), ks, vs

        carry, _ = jax.lax.scan(lambda c, i: (with_layer(c, i), None), (x, cache.k, cache.v),
                                jnp.arange(n))
        if last_only:
            carry = with_layer(carry, L - 1, last=True)
        x, ks, vs = carry
        return x, (ks, vs)

    def _split_batch(self, x):
        """x [B, ...] constrained to be split over batch_mesh's batch axes (where they divide
        B); unchanged without a batch_mesh."""
        if self.batch_mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, rows_sharding(self.batch_mesh, x.shape))

    def num_params(self) -> int:
        return sum(x.size for x in jax.tree.leaves(nnx.state(self, nnx.Param)))


class CriticModel(CausalLM):
    """A decoder backbone with `num_heads` value heads and no LM head: Hugging Face's
    `...ForTokenClassification` of the family (`Qwen2ForTokenClassification`, ...) with
    `num_labels=num_heads` (1: the critic verl builds for PPO).

    `critic(input_ids, attention_mask=...)` -> values float32 [B, T] with one head, [B, T, H] with
    H = num_heads > 1, one per position (the value of the state that the tokens up to and
    including that position make; head h is one learned value, e.g. of one level of a hierarchy).
    The head `score` is a Linear(hidden, num_heads) with a bias, initialized as transformers does
    a missing head: N(0, 0.02) weights, zero bias. The options are CausalLM's.
    """

    def __init__(self, config: DecoderConfig, *, dtype="float32", param_dtype="float32",
                 rngs: nnx.Rngs | None = None, num_heads: int = 1, **options):
        num_heads = check_num_heads(num_heads)
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        super().__init__(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs, lm_head=False,
                         **options)
        self.num_heads = num_heads
        self.score = nnx.Linear(config.hidden_size, num_heads, use_bias=True, kernel_init=_INIT,
                                bias_init=nnx.initializers.zeros_init(), dtype=self.dtype,
                                param_dtype=self.param_dtype, rngs=rngs)

    def __call__(self, input_ids, *, positions=None, attention_mask=None, cache=None):
        if cache is not None:
            raise ValueError("a critic scores whole rows; it takes no KV cache")
        hidden, _ = self.hidden_states(input_ids, positions=positions, attention_mask=attention_mask)
        return self.values(hidden)

    def values(self, hidden):
        """Final hidden states [..., D] -> values float32 [...] (one head: the head axis dropped)
        or [..., H] (H = num_heads > 1)."""
        values = self.score(hidden).astype(jnp.float32)
        return values[..., 0] if self.num_heads == 1 else values

    def logits(self, hidden):
        raise TypeError("a CriticModel has no LM head: use values()")


def check_num_heads(num_heads) -> int:
    """`num_heads` as an int >= 1 (a critic's value heads); ValueError otherwise."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise ValueError(f"a critic needs num_heads >= 1 value heads (an int), got {num_heads!r}")
    return int(num_heads)


def new_value_head(leaf: str, shape: tuple[int, ...], dtype, seed: int):
    """A new critic head's `kernel` [D, H] (N(0, 0.02), transformers' initializer_range) or `bias`
    [H] (0), as a host (NumPy) array; one key for the whole kernel, so H = 1 draws what it always
    has for `seed`."""
    import numpy as np

    if leaf == "bias":
        return np.zeros(shape, dtype)
    return (0.02 * np.asarray(jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32))).astype(dtype)


def critic_from_policy(policy: CausalLM, seed: int = 0, num_heads: int = 1) -> CriticModel:
    """A CriticModel whose backbone is a copy of `policy`'s (same layout, dtypes, placement and
    options) with `num_heads` new value heads (`new_value_head`, seeded with `seed`): verl's
    critic, started from the policy's checkpoint. A policy with adapters gives a critic with its
    own copy of them on the SAME frozen base arrays (not copied: nothing trains them)."""
    lora = getattr(policy, "lora", None)
    options = dict(remat=policy.remat, batch_mesh=policy.batch_mesh, scan_layers=policy.scan_layers,
                   attention=policy.attention, lora=lora)
    abstract = nnx.eval_shape(lambda: CriticModel(policy.config, dtype=policy.dtype,
                                                  param_dtype=policy.param_dtype,
                                                  rngs=nnx.Rngs(0), num_heads=num_heads, **options))
    graphdef, state = nnx.split(abstract)
    backbone = dict(nnx.to_flat_state(nnx.state(policy.model)))
    filled = []
    for path, var in nnx.to_flat_state(state):
        if path[0] == "model":
            value = backbone[path[1:]][...]
            value = jnp.copy(value) if lora is None or is_adapter_path(path) else value
        else:  # the head, replicated like the backbone's scales
            value = jnp.asarray(new_value_head(path[-1], var.shape, var.dtype, seed))
        filled.append((path, var.replace(value=value)))
    return nnx.merge(graphdef, nnx.from_flat_state(filled))


def cast_to_compute(model: CausalLM) -> CausalLM:
    """The model with its floating-point weights stored in its compute dtype (`model.dtype`), e.g.
    fp32 master weights as bf16. Outputs are unchanged: every layer (Linear, Embed, RMSNorm) casts
    its weights to the compute dtype where it uses them. Inside a jitted program that loops over
    the same weights (the sampler's decode), calling this before the loop converts each weight once
    per call instead of once per step. Changes `model` in place and returns it (unchanged when the
    weights are already in the compute dtype)."""
    dtype = jnp.dtype(model.dtype)
    if jnp.dtype(model.param_dtype) == dtype:
        return model
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    nnx.update(model, params)
    return model


def relayout_layers(model: CausalLM, scan_layers: bool) -> CausalLM:
    """The model with its layers in the other layout (stacked for `scan_layers`, else a list of
    L layers), same weights (placed where XLA puts them: `hgpo_jax.rl.update.shard_params` puts them
    back on a mesh's partition rules). Changes `model` in place and returns it (unchanged when the
    layout already matches)."""
    if model.scan_layers == scan_layers:
        return model
    layers = model.model.layers
    model.model.layers = (stack_layers(list(layers)) if scan_layers
                          else nnx.List(unstack_layers(layers)))
    model.scan_layers = scan_layers
    return model


def add_adapters(model, spec: LoraSpec, seed: int = 0):
    """`model` (a CausalLM without adapters) with new adapters of `spec`: the same base arrays
    (not copied), A from `seed` and each layer's path (`new_adapter_value`), B zero, placed as
    the partition rules say on the model's `batch_mesh`."""
    if getattr(model, "lora", None) is not None:
        raise ValueError("the model already has adapters")
    options = dict(remat=model.remat, batch_mesh=model.batch_mesh, scan_layers=model.scan_layers,
                   attention=model.attention, lora=spec)
    abstract = nnx.eval_shape(lambda: CausalLM(model.config, dtype=model.dtype,
                                               param_dtype=model.param_dtype, rngs=nnx.Rngs(0),
                                               **options))
    graphdef, state = nnx.split(abstract)
    base = dict(nnx.to_flat_state(nnx.state(model)))
    filled = []
    for path, var in nnx.to_flat_state(state):
        if is_adapter_path(path):
            dotted = ".".join(str(p) for p in path)
            host = new_adapter_value(dotted, var.shape, np.float32, seed)
            value = place_param(host, model.batch_mesh, dotted)
        else:
            value = base[path][...]
        filled.append((path, var.replace(value=value)))
    return nnx.merge(graphdef, nnx.from_flat_state(filled))
