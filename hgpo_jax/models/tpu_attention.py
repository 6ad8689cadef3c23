"""Causal attention over right-padded rows with the Pallas TPU splash-attention kernel.

`splash_attention(q, k, v, lengths)` is the 'splash' path of `qwen2.fused_attention`: the same
contract (q [B, T, H, hd]; k, v [B, T, K, hd]; lengths int32 [B], each row's real tokens first;
causal) computed by `jax.experimental.pallas.ops.tpu.splash_attention` (flash attention with
block sparsity: blocks above the diagonal are skipped, no [T, S] score buffer in either pass,
and its own custom VJP with dq and dkv kernels). Grouped-query heads go to the kernel as they
are (its MHA form takes K kv heads for H query heads), so K and V are never repeated.

How the rows become the kernel's arguments:
- padding: segment ids, 1 on each row's first `length` slots and 0 after. A query attends to a
  key only where both have the same id and the key is not later, so a real query sees its row's
  real prefix, and a padded query sees the padded keys up to itself (never an empty row: finite
  output, which the callers ignore);
- length: T is padded up to a multiple of 128 (the kernel's lane width) and the block is the
  largest of 512, 256, 128 that divides it (`splash_blocks`); training lengths are multiples of
  64 (at most 64 slots of padding), prompt buckets powers of two (32: 96 slots);
- layout: [B, T, H, hd] -> [B, H, T, hd] (the kernel's), then `jax.vmap` over rows (the
  kernel takes one row [H, T, hd]); q is scaled by hd**-0.5 before (the kernel has no scale).

On a mesh the kernel must see one device's rows: XLA's partitioner does not split a Mosaic
custom call, so without `mesh` a multi-device program is expected to gather every row onto
every device (not tried: no TPU here). With `mesh`
the call runs under `jax.shard_map`, rows split over the batch axes and heads over `tensor`
(where they divide).

interpret=True runs the same kernel through Pallas's interpreter (`pallas_call(interpret=True)`:
the kernel body as a jitted loop over its grid, on any backend): how the tests check it on CPU.
Slow; never for training. The TPU interpret mode (`interpret=pltpu.InterpretParams()`, which also
simulates TPU memory) cannot run the batched kernel in JAX 0.10.2: under `jax.vmap` it fails with
"ValueError: safe_zip() argument 1 has length 3 but argument 0 has length 4" (its grid gains the
row dimension, the kernel's dimension semantics name 3); the tests use it on one row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec as P

from hgpo_jax.models.sharding import BATCH_AXES, fit_spec

LANES = 128                     # the kernel's blocks are multiples of the TPU lane width
BLOCK_SIZES = (512, 256, 128)   # largest first: fewer grid steps per row on long sequences


def splash_blocks(length: int) -> tuple[int, int]:
    """(padded length, block size) for sequences of `length` slots: the length rounded up to a
    multiple of 128 and the largest of 512, 256, 128 that divides it (4608 -> (4608, 512),
    2560 -> (2560, 512), 384 -> (384, 128), 64 -> (128, 128))."""
    if length < 1:
        raise ValueError(f"splash attention needs at least one slot per row, got length {length}")
    padded = -(-length // LANES) * LANES
    return padded, next(b for b in BLOCK_SIZES if padded % b == 0)


def _kernel(num_heads: int, length: int, block: int, interpret=False):
    """The splash kernel for one row ([H, T, hd] queries): causal over `length` slots, the same
    block size in the forward, dq and dkv kernels. interpret: False, True or a
    `pltpu.InterpretParams` (passed to `pallas_call`)."""
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                              block_q_dq=block, block_kv_dq=block)
    mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * num_heads)
    return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)


def _splash_rows(q, k, v, lengths, interpret: bool):
    """`splash_attention` on the rows of one device: same shapes, no mesh."""
    B, T, H, hd = q.shape
    length, block = splash_blocks(T)
    pad = ((0, 0), (0, length - T), (0, 0), (0, 0))
    heads_first = lambda x: jnp.pad(x, pad).transpose(0, 2, 1, 3)  # noqa: E731  [B, *, Tp, hd]
    q = heads_first(q * jnp.asarray(hd ** -0.5, q.dtype))
    k, v = heads_first(k), heads_first(v)
    segments = (jnp.arange(length)[None, :] < lengths[:, None]).astype(jnp.int32)  # [B, Tp]
    kernel = _kernel(H, length, block, interpret)

    def row(q1, k1, v1, seg):  # [H, Tp, hd], [K, Tp, hd], [K, Tp, hd], [Tp]
        return kernel(q1, k1, v1, segment_ids=splash.SegmentIds(q=seg, kv=seg))

    out = jax.vmap(row)(q, k, v, segments)                    # [B, H, Tp, hd]
    return out.transpose(0, 2, 1, 3)[:, :T]


def splash_attention(q, k, v, lengths, *, interpret: bool = False, mesh=None):
    """Causal grouped-query attention over right-padded rows by the Pallas TPU splash kernel.

    q [B, T, H, hd]; k, v [B, T, K, hd] (H a multiple of K); lengths int32 [B] (real tokens of
    each row, its first slots; at least 1) -> [B, T, H, hd] in q's dtype. Slots past a row's
    length hold finite values that mean nothing. interpret: run the kernel in Pallas's
    interpreter (CPU tests). mesh: the (data, fsdp, tensor) Mesh the rows are split on, or
    None on one device (see the module docstring).
    """
    B, T, H, hd = q.shape
    K = k.shape[2]
    if k.shape != (B, T, K, hd) or v.shape != k.shape or H % K or lengths.shape != (B,):
        raise ValueError(f"splash attention: q {q.shape}, k {k.shape}, v {v.shape}, lengths "
                         f"{lengths.shape}: expected q [B, T, H, hd], k and v [B, T, K, hd] with H "
                         "a multiple of K, lengths [B]")
    lengths = lengths.astype(jnp.int32)
    run = lambda q, k, v, lengths: _splash_rows(q, k, v, lengths, interpret)  # noqa: E731
    if mesh is None:
        return run(q, k, v, lengths)
    rows = fit_spec(P(BATCH_AXES), (B,), mesh)
    heads = fit_spec(P(None, None, "tensor"), k.shape, mesh)
    batch = rows[0] if len(rows) else None
    head = heads[2] if len(heads) > 2 else None
    qkv = P(batch, None, head)
    return jax.shard_map(run, mesh=mesh, in_specs=(qkv, qkv, qkv, P(batch)), out_specs=qkv,
                         check_vma=False)(q, k, v, lengths)
