"""The decoder's attention paths (`hgpo_jax.models.decoder`): the einsum attention every
backend runs, and the fused kernels a training forward may take (`resolve_attention`: cuDNN or
XLA's on a GPU, splash on a TPU, a stand-in for tests), each probed once before it is used.

Shapes: B batch, T query tokens, S key slots, H query heads, K kv heads, G = H / K, hd head size.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp

from hgpo_jax.models.tpu_attention import splash_attention

MASKED_SCORE = -1e30  # additive score of a masked key: exp() underflows to 0, never overflows


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
