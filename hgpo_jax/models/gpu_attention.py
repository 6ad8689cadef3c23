"""One decode step's attention over a ragged KV cache, reading only the slots that hold tokens.

`ragged_decode_attention(q, k, v, lengths)` is the sampler's decode attention on a GPU
(`hgpo_jax.rl.sampling`, `generate(..., decode="ragged")`): each row's one new query attends to the
first `lengths[b]` slots of its row of the cache, and slots past them are never read. The einsum
decode (`attention.attention`) reads every slot of the cache, the prompt bucket's padding and the
new-token slots not yet written included: at 128 rows x (2,048 + 512) slots that is about a third
more cache than the rows' real tokens (issue 49; docs/training.md, "Decode over the filled cache").

The kernel is JAX's own Pallas GPU decode attention (`jax.experimental.pallas.ops.gpu.
decode_attention.gqa`, a Triton kernel JAX tests on GPUs): for each row and kv head, the slots are
cut into `k_splits` parts, each a grid program that loops over blocks of `block_k` slots up to
the row's length (a part wholly past it returns at once), with an online softmax; the parts'
partial outputs are combined after. Its layout is keys and values [B, S, K, hd]; the ragged
cache stores both [B, K, S, hd] (the kernel's own inner layout: `gqa` swaps the two axes, and the
two swaps cancel in XLA), so no copy of the cache is made.

How the cache becomes ragged (`kv_cache.KVCache(ragged=True)`): the prompts are right-padded, so
row b's prompt is slots [0, len_b), and each new token is written at the row's own next slot
(`KVCache.pos`) instead of one slot shared by all rows: the row's tokens stay slots [0, pos_b).

Sizes (`decode_blocks`): blocks of BLOCK_K = 128 slots (the cache's slot count is rounded up to
a multiple, `ragged_slots`), and as many parts as keep about TARGET_PROGRAMS programs in flight
(B x K x parts), each part a whole number of blocks.

On a mesh the kernel must see one device's rows (XLA does not split a Triton custom call), so
with `mesh` it runs under `jax.shard_map`: rows over the batch axes, kv heads over `tensor`.
Off a GPU it runs through Pallas's interpreter (`interpret=True`): slow, for the tests only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import decode_attention
from jax.sharding import PartitionSpec as P

from hgpo_jax.models.sharding import BATCH_AXES, fit_spec

BLOCK_K = 128            # slots per block the kernel loads at a time (>= 16, Triton's dot)
TARGET_PROGRAMS = 2048   # grid programs in flight: enough for the SMs of an H100/H200


def ragged_slots(slots: int) -> int:
    """A ragged cache's slot count for `slots` wanted: rounded up to a multiple of BLOCK_K."""
    return -(-max(int(slots), 1) // BLOCK_K) * BLOCK_K


def decode_blocks(slots: int, programs: int) -> tuple[int, int]:
    """(block_k, k_splits) of the kernel for `slots` cache slots (a multiple of BLOCK_K) and
    `programs` = rows x kv heads on one device: the most parts (each a whole number of blocks)
    that keep rows x kv heads x parts within TARGET_PROGRAMS, at least one."""
    if slots % BLOCK_K:
        raise ValueError(f"a ragged cache has a multiple of {BLOCK_K} slots, not {slots} "
                         "(ragged_slots)")
    blocks = slots // BLOCK_K
    want = max(1, TARGET_PROGRAMS // max(int(programs), 1))
    splits = max(d for d in range(1, blocks + 1) if blocks % d == 0 and d <= want)
    return BLOCK_K, splits


def _rows(q, k, v, lengths, interpret: bool):
    """`ragged_decode_attention` on the rows of one device: same shapes, no mesh."""
    B, K, S, hd = k.shape
    block_k, k_splits = decode_blocks(S, B * K)
    swap = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [B, S, K, hd], the kernel's argument
    return decode_attention.gqa(q, swap(k), swap(v), kv_seq_len=lengths, sm_scale=hd ** -0.5,
                                block_k=block_k, k_splits=k_splits, interpret=interpret)


def ragged_decode_attention(q, k, v, lengths, *, interpret: bool | None = None, mesh=None):
    """Attention of one query per row over the first `lengths` slots of its row of the cache.

    q [B, H, hd] (the new token's queries, RoPE applied); k, v [B, K, S, hd] (a ragged cache's
    layer, S a multiple of BLOCK_K, H a multiple of K); lengths int32 [B] (slots read per row, at
    least 1) -> [B, H, hd] in q's dtype (scores and softmax in float32). interpret: run the
    kernel in Pallas's interpreter (default: off a GPU). mesh: the (data, fsdp, tensor) Mesh the
    rows are split on, or None on one device.
    """
    B, H, hd = q.shape
    K = k.shape[1]
    if k.ndim != 4 or k.shape[0] != B or k.shape[3] != hd or v.shape != k.shape or H % K \
            or lengths.shape != (B,):
        raise ValueError(f"ragged decode attention: q {q.shape}, k {k.shape}, v {v.shape}, "
                         f"lengths {lengths.shape}: expected q [B, H, hd], k and v [B, K, S, hd] "
                         "with H a multiple of K, lengths [B]")
    interpret = jax.default_backend() != "gpu" if interpret is None else interpret
    lengths = lengths.astype(jnp.int32)
    run = lambda q, k, v, lengths: _rows(q, k, v, lengths, interpret)  # noqa: E731
    if mesh is None:
        return run(q, k, v, lengths)
    rows = fit_spec(P(BATCH_AXES), (B,), mesh)
    heads = fit_spec(P(None, "tensor"), k.shape, mesh)
    batch = rows[0] if len(rows) else None
    head = heads[1] if len(heads) > 1 else None
    cache, queries = P(batch, head), P(batch, head)
    return jax.shard_map(run, mesh=mesh, in_specs=(queries, cache, cache, P(batch)),
                         out_specs=queries, check_vma=False)(q, k, v, lengths)
