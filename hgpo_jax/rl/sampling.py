"""Batched sampling from a policy (any model family): one compiled program (prefill + decode loop) per bucket.

    from hgpo_jax.rl.sampling import generate
    out = generate(model, prompts, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
                   eos_token_id=None, rng=None)
    out.tokens          # list[list[int]]: new tokens of each prompt, cut after the first eos (kept)
    out.logprobs        # log-prob of each token under the distribution it was drawn from
    out.model_logprobs  # log-prob of each token under the model itself (temperature 1, no filter)

Device side (pure, under jit): the prompt batch is prefilled into a KV cache and the first token
drawn (the prefill executable), then one `lax.while_loop` (the decode executable) samples one
token per step, feeds it back through the cache, and stops when every row has produced an eos or
`max_new_tokens` tokens. The cache passes from one to the other on device; they are two
executables only so each gets its best XLA options. Host side (NumPy): prompts are padded to a
bucketed shape, and the result is cut back to lists.

The prefill takes one of two paths (`prefill_path`): where the model's attention resolves to a
fused kernel (`resolve_attention`: cuDNN on a GPU with 16-bit compute, ...) the prompts are
RIGHT-padded and prefilled in one forward with no score buffer; elsewhere they are LEFT-padded
and enter the cache in chunks of C tokens (`prefill_chunk_size`), whose einsum attention holds
scores [B, K, G*C, P] instead of [B, K, G*P, P].

Shapes: B batch (bucketed), P prompt slots (bucketed), N new-token slots (bucketed), V vocabulary.

Bucketing and compile counting: `Sampler` keeps one ahead-of-time compiled program (a prefill
and a decode-loop executable) per static key (model graph, bucketed B/P/N, greedy or not, top_k,
whether top_p filters, number of eos ids, the prefill path and chunk, parameter shardings). `Sampler.num_compiles` is the
number of programs it has compiled. There is no process-wide cache: whoever generates holds its
own Sampler (a run's policy, a command) and passes it as `sampler=`; without one, `generate`
compiles for that call only. Temperature, top_p's value, the rng, the eos ids and the
actual `max_new_tokens` are runtime arguments and never cause a compile.

See docs/sampling.md.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
import time
from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from hgpo_jax.distributed import local_rows, max_over_processes
from hgpo_jax.models.attention import failure_line, resolve_attention
from hgpo_jax.models.decoder import cast_to_compute, relayout_layers
from hgpo_jax.models.kv_cache import KVCache
from hgpo_jax.models.gpu_attention import ragged_slots
from hgpo_jax.models.lora import merge_params
from hgpo_jax.models.xla_options import compiler_options
from hgpo_jax.models.sharding import BATCH_AXES, fit_spec, rows_sharding
from hgpo_jax.rl.batching import bucket

DEFAULT_SEED = 0  # rng=None samples with jax.random.PRNGKey(DEFAULT_SEED)
MIN_PROMPT_BUCKET = 32
MIN_NEW_BUCKET = 8
PAD_ID = 0  # token fed in padded prompt slots (masked out, so its value never matters)
MAX_PROGRAMS = 64  # a Sampler's default bound: a rollout's buckets (a few B x P x N) and more
AUTO_CHUNK = -1  # prefill_chunk: pick the chunk from PREFILL_SCORE_BYTES (prefill_chunk_size)
PREFILL_SCORE_BYTES = 128 << 20  # auto chunk: one layer's float32 scores per device stay within
MIN_PREFILL_CHUNK = 64  # auto chunk: never fewer query tokens per chunk than this
PREFILL_ROW_TOKENS = 1 << 15  # fused prefill: prompt slots per device in one forward (row groups)


# --------------------------------------------------------------------------- output
@dataclasses.dataclass(frozen=True)
class GenerateOutput:
    """Result of `generate`, one entry per prompt (host lists of Python ints / floats).

    tokens:          new tokens, cut after the first eos (the eos is kept)
    logprobs:        log-prob of each token under the sampling policy: log_softmax of the
                     temperature-scaled, top-k/top-p-filtered logits it was drawn from; for greedy
                     (temperature 0) the model's plain log_softmax of the chosen token
    model_logprobs:  log_softmax(logits) of each token at temperature 1 without filtering
    num_compiles:    programs the sampler has compiled so far (this call included)
    compile_s:       seconds this call spent compiling (0.0 when its bucket was compiled before)
    prefill_s:       wall seconds of this call's prefill executable (prompt in, first token out;
                     compile excluded), measured up to `block_until_ready` of its output
    decode_s:        wall seconds of this call's decode executable (the other new tokens)
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    model_logprobs: list[list[float]]
    num_compiles: int = 0
    compile_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0


# --------------------------------------------------------------------------- device: one step
def filter_logits(logits, temperature, top_k: int = 0, top_p=1.0):
    """logits [..., V] -> float32 logits / temperature with -inf outside the kept tokens.

    Same order and rules as transformers' warpers: temperature, then top-k, then top-p.
    - temperature > 0 (greedy is handled by the caller, not here).
    - top_k (static int; 0 = off): keep the tokens whose scaled logit is >= the k-th largest
      (`lax.top_k` threshold). Tokens tied with the k-th are all kept, as in HF.
    - top_p (float in (0, 1]; exactly 1.0 as a Python number = off, no sort): HF's
      TopPLogitsWarper: sort ascending, drop the tokens whose cumulative probability (from the
      lowest up, inclusive) is <= 1 - top_p, always keep the most likely token. Equivalently: keep a
      token iff the probability of the strictly more likely tokens is < top_p, i.e. the smallest
      top set whose mass reaches top_p. Tokens tied with the least likely kept one are all kept.
    """
    scaled = logits.astype(jnp.float32) / temperature
    vocab = scaled.shape[-1]
    if top_k and top_k < vocab:
        kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]                 # [..., 1]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    if not (isinstance(top_p, (int, float)) and top_p >= 1.0):
        ascending = jnp.sort(scaled, axis=-1)                            # [..., V]
        cum = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
        removed = (cum <= 1.0 - top_p).at[..., -1].set(False)            # a prefix of `ascending`
        first_kept = jnp.sum(removed, axis=-1, keepdims=True)            # [..., 1]
        cutoff = jnp.take_along_axis(ascending, first_kept, axis=-1)
        scaled = jnp.where(scaled < cutoff, -jnp.inf, scaled)
    return scaled


def sample_token(logits, rng, temperature, *, greedy: bool, top_k: int = 0, top_p=1.0):
    """One sampling step. logits [B, V]; rng a raw PRNG key, or one per row [B, 2] (see
    `categorical`); -> (token int32 [B], policy log-prob [B], model log-prob [B]) in float32.

    greedy: argmax (first index on ties); both log-probs are log_softmax(logits)[token].
    Otherwise the token is drawn from softmax(filter_logits(...)) and the policy log-prob is the
    log_softmax of those filtered logits at the token.
    """
    logits = logits.astype(jnp.float32)
    model_lse = jax.nn.logsumexp(logits, axis=-1)
    if greedy:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        model_lp = _take(logits, token) - model_lse
        return token, model_lp, model_lp
    filtered = filter_logits(logits, temperature, top_k, top_p)
    token = categorical(rng, filtered)
    policy_lp = _take(filtered, token) - jax.nn.logsumexp(filtered, axis=-1)
    return token, policy_lp, _take(logits, token) - model_lse


def categorical(rng, logits):
    """Draw one token per row from softmax(logits [B, V]) -> int32 [B], by inverting the CDF
    with one uniform per row (cheaper on CPU than Gumbel-max, which needs V uniforms per row).
    rng: one raw key (the B uniforms drawn from it together) or raw keys [B, 2], one per row (each
    row's uniform from its own key: a row's draw then does not depend on the other rows).

    The inversion runs in two levels so that no vocabulary-wide cumulative sum is needed: the
    vocabulary is cut into blocks of `cdf_block_size(V)` tokens (about sqrt(V)); u ~ U[0, total)
    first picks the block whose cumulative mass exceeds it, then the token inside that block whose
    cumulative weight exceeds what is left of u. The result has exactly the distribution of a
    one-level inversion (P(block) * P(token | block)); on the bench vocabulary (4096) it makes a
    decode step about 15% cheaper. A token of probability 0 (-inf logit) is never returned: in
    the ~1e-7 event that float rounding puts u on such a token (at an edge of a level's CDF),
    the heaviest token (or block) of that level is returned instead.
    """
    B, V = logits.shape
    block = cdf_block_size(V)
    n_blocks = -(-V // block)
    weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))        # [B, V], max 1
    weights = jnp.pad(weights, ((0, 0), (0, n_blocks * block - V)))
    weights = weights.reshape(B, n_blocks, block)
    mass = jnp.sum(weights, axis=-1)                                            # [B, n_blocks]
    u = row_uniforms(rng, B) * jnp.sum(mass, axis=-1)
    blk, below = _invert_cdf(mass, u)
    inner = jnp.take_along_axis(weights, blk[:, None, None], axis=1)[:, 0]     # [B, block]
    tok, _ = _invert_cdf(inner, u - below)
    return blk * block + tok


def row_uniforms(rng, rows: int):
    """U[0, 1) float32 [rows]: from one raw key (uint32 [2]) together, or from raw keys
    [rows, 2], one each."""
    if rng.ndim == 2:
        return jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(rng)
    return jax.random.uniform(rng, (rows,), jnp.float32)


def row_keys(rng, row_ids):
    """A raw key (uint32 [2]) and the rows' ids int32 [B] -> raw keys uint32 [B, 2], row r's
    `fold_in(rng, row_ids[r])`: a row's samples depend on its id, never on its place in a batch."""
    return jax.vmap(lambda r: jax.random.fold_in(rng, r))(row_ids)


def token_keys(keys, step):
    """Row keys [B, 2] and the index of the new token (int32 []) -> that token's keys [B, 2]."""
    return jax.vmap(lambda k: jax.random.fold_in(k, step))(keys)


def cdf_block_size(vocab: int) -> int:
    """Tokens per block of `categorical`'s two-level CDF: the power of two >= sqrt(vocab)."""
    return 1 << max(0, math.ceil(math.log2(max(vocab, 1)) / 2))


def _invert_cdf(weights, u):
    """weights [B, n] >= 0 (positive sum), u [B] -> (index int32 [B], cumulative weight before
    that index [B]). The index is the first whose inclusive cumulative weight exceeds u; one of
    weight 0 (only reachable through float rounding at the edges) is replaced by the heaviest."""
    n = weights.shape[-1]
    cdf = jnp.cumsum(weights, axis=-1)                                          # [B, n]
    index = jnp.minimum(jnp.sum(cdf <= u[:, None], axis=-1), n - 1).astype(jnp.int32)
    index = jnp.where(_take(weights, index) > 0, index,
                      jnp.argmax(weights, axis=-1).astype(jnp.int32))
    return index, _take(cdf, index) - _take(weights, index)


def _take(x, index):
    """x [B, V], index [B] -> x[b, index[b]] [B]."""
    return jnp.take_along_axis(x, index[:, None], axis=-1)[:, 0]


# --------------------------------------------------------------------------- device: the program
@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything that shapes the compiled program (hashable: a compile key)."""

    max_new: int                 # N, new-token slots
    greedy: bool
    top_k: int
    use_top_p: bool
    cache_dtype: object
    mesh: object                 # jax Mesh or None
    unroll_layers: bool = True   # run a scanned model's layers unrolled (see _sampling_model)
    prefill_attention: str = "einsum"  # 'einsum': left-padded, chunked; else a fused impl, right-padded
    prefill_chunk: int = 0       # C, query tokens per prefill chunk (the einsum path; 0 = all P)
    prefill_row_groups: int = 1  # the fused path: rows prefilled in this many forwards
    decode_attention: str = "einsum"  # 'einsum': every cache slot; 'ragged': the rows' tokens only


def _sampling_model(graphdef, state, static: _Static):
    """The model a generation program runs, its weights prepared once per call (not once per
    token), same values:
    - cast to the compute dtype (`cast_to_compute`): otherwise every decode step converts the fp32
      master weights again (1.5B shape, 128 rows, on an H200: 7.75 ms per step before, 5.29 after,
      docs/training.md);
    - a model with scanned layers unrolled (its stacked weights sliced once per call): its decode
      then runs about 1.7-2x faster (2-core CPU and H100, docs/training.md) for a longer compile."""
    model = cast_to_compute(nnx.merge(graphdef, state))
    if static.unroll_layers and model.scan_layers:
        model = relayout_layers(model, False)
    return model


def _constrain_cache(cache: KVCache, mesh) -> KVCache:
    """On a mesh, split the cache's batch dim over BATCH_AXES and the kv heads over 'tensor'
    (where they divide); without a mesh, the cache unchanged."""
    if mesh is None:
        return cache
    batch, slots = cache.key_mask.shape
    constrain = jax.lax.with_sharding_constraint
    if cache.stacked:  # [L, B, K, ...]: the layer axis stays whole
        kv_spec = NamedSharding(mesh, fit_spec(P(None, BATCH_AXES, "tensor"), cache.k.shape, mesh))
        k, v = constrain(cache.k, kv_spec), constrain(cache.v, kv_spec)
    else:
        kv_spec = NamedSharding(mesh, fit_spec(P(BATCH_AXES, "tensor"), cache.k[0].shape, mesh))
        k = tuple(constrain(x, kv_spec) for x in cache.k)
        v = tuple(constrain(x, kv_spec) for x in cache.v)
    row_spec = rows_sharding(mesh, (batch,))
    mask_spec = rows_sharding(mesh, (batch, slots))
    return cache.replace(k=k, v=v, key_mask=constrain(cache.key_mask, mask_spec),
                         pos=constrain(cache.pos, row_spec))


def _grow_cache(cache: KVCache, extra: int) -> KVCache:
    """Append `extra` empty slots to every row: k [B, K, hd, S] -> [B, K, hd, S + extra],
    v [B, K, S, hd] -> [B, K, S + extra, hd] (per layer, or stacked with a leading [L])."""
    pad_k = lambda x: jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, extra),))  # noqa: E731
    pad_v = lambda x: jnp.pad(x, ((0, 0),) * (x.ndim - 2) + ((0, extra), (0, 0)))  # noqa: E731
    grow = (lambda f, kv: f(kv)) if cache.stacked else (lambda f, kv: tuple(map(f, kv)))  # noqa: E731
    return cache.replace(k=grow(pad_k, cache.k), v=grow(pad_v, cache.v),
                         key_mask=jnp.pad(cache.key_mask, ((0, 0), (0, extra))))


def _sample_step(logits, key, temperature, top_p, static: _Static):
    """sample_token with the program's static settings (top_p is ignored unless static.use_top_p)."""
    return sample_token(logits, key, temperature, greedy=static.greedy, top_k=static.top_k,
                        top_p=top_p if static.use_top_p else 1.0)


class Samples(NamedTuple):
    """The new tokens drawn so far: tokens int32 [B, N] (PAD_ID after a row's end), their
    log-probs under the sampling distribution and under the model, float32 [B, N] (0 after)."""

    tokens: jax.Array
    logprobs: jax.Array
    model_logprobs: jax.Array


class DecodeState(NamedTuple):
    """The decode loop's carry (`_prefill_program` makes it, `_decode_program` runs it on).

    step: int32 [], the next new token's index; token: int32 [B], the last token drawn; cache:
    the KV cache (P + N slots); done: bool [B], rows finished (an eos, or a dummy row); samples:
    `Samples`; lengths: int32 [B], new tokens kept per row (up to and including its first eos);
    keys: uint32 [B, 2], each row's sampling key (`row_keys`)."""

    step: jax.Array
    token: jax.Array
    cache: KVCache
    done: jax.Array
    samples: Samples
    lengths: jax.Array
    keys: jax.Array


def _record(i, token, lp, mlp, done, samples: Samples, lengths, eos_ids):
    """Write step i's outputs for rows not yet done; -> (samples, lengths, done)."""
    active = ~done
    samples = Samples(samples.tokens.at[:, i].set(jnp.where(active, token, PAD_ID)),
                      samples.logprobs.at[:, i].set(jnp.where(active, lp, 0.0)),
                      samples.model_logprobs.at[:, i].set(jnp.where(active, mlp, 0.0)))
    is_eos = jnp.any(token[:, None] == eos_ids[None, :], axis=-1)
    return samples, lengths + active.astype(jnp.int32), done | (active & is_eos)


def _prefill_program(state, input_ids, attention_mask, row_valid, row_ids, eos_ids, rng,
                     temperature, top_p, *, graphdef, static: _Static):
    """Prefill and the first token, on device.

    input_ids int32 [B, P], left-padded (static.prefill_attention 'einsum') or right-padded (a
    fused path); attention_mask bool [B, P]; row_valid bool [B] (False on dummy rows of the batch
    bucket); row_ids int32 [B] (each row's id: its keys are `row_keys(rng, row_ids)`, and new
    token i of a row is drawn with `token_keys(keys, i)`); eos_ids int32 [E]; rng raw key;
    temperature, top_p float32 [].
    Returns the decode loop's carry, a `DecodeState` at step 1 (the first token drawn, the cache
    with P + N slots).
    """
    model = _sampling_model(graphdef, state, static)
    B, Pn = input_ids.shape
    N = static.max_new
    if static.prefill_attention == "einsum":
        # a cache of exactly Pn slots (each chunk's attention is C x Pn), then N empty slots added
        cache = _constrain_cache(model.new_cache(B, Pn, static.cache_dtype), static.mesh)
        hidden, cache = _chunked_prefill(model, input_ids, attention_mask, cache,
                                         static.prefill_chunk or Pn, static.mesh)  # [B, 1, D]
        cache = _constrain_cache(_grow_cache(cache, N), static.mesh)
    else:  # right-padded rows, fused forwards (their attention never reads the cache, so the
        # cache has its Pn + N slots from the start: no second copy); hidden: last real tokens'.
        # A ragged decode's cache: each row's new tokens right after its prompt (slots rounded up)
        ragged = static.decode_attention == "ragged"
        slots = ragged_slots(Pn + N) if ragged else Pn + N
        cache = _constrain_cache(model.new_cache(B, slots, static.cache_dtype, ragged=ragged),
                                 static.mesh)
        hidden, cache = _fused_prefill(model, input_ids, attention_mask, cache,
                                       static.prefill_row_groups, static.mesh)
    keys = row_keys(rng, row_ids)
    token, lp, mlp = _sample_step(model.logits(hidden[:, -1]), token_keys(keys, 0), temperature,
                                  top_p, static)
    samples = Samples(jnp.zeros((B, N), jnp.int32), jnp.zeros((B, N), jnp.float32),
                      jnp.zeros((B, N), jnp.float32))
    samples, lengths, done = _record(0, token, lp, mlp, ~row_valid, samples,
                                     jnp.zeros((B,), jnp.int32), eos_ids)
    return DecodeState(jnp.int32(1), token, cache, done, samples, lengths, keys)


def _chunked_prefill(model, input_ids, attention_mask, cache: KVCache, chunk: int, mesh):
    """Left-padded prompts into an empty cache of P slots, C = `chunk` tokens at a time.

    input_ids int32 [B, P], attention_mask bool [B, P] -> (hidden [B, 1, D] of slot P-1, cache).
    Each chunk's tokens are written at slots index..index+C-1 and attend causally to every slot
    written so far (their scores are [B, K, G*C, P]). P % C tokens go first as one shorter chunk,
    then P // C chunks of C run in a `lax.scan` (one compiled chunk); a single chunk is today's
    one forward. Same values as one forward, up to float summation order.
    """
    B, Pn = input_ids.shape
    rest, n = Pn % chunk, Pn // chunk

    def step(cache, ids, mask):
        hidden, cache = model.hidden_states(ids, attention_mask=mask, cache=cache, last_only=True)
        return hidden, _constrain_cache(cache, mesh)

    if rest:
        _, cache = step(cache, input_ids[:, :rest], attention_mask[:, :rest])
    if n == 1:
        return step(cache, input_ids[:, rest:], attention_mask[:, rest:])
    chunks = lambda x: x[:, rest:].reshape(B, n, chunk).swapaxes(0, 1)  # noqa: E731  [n, B, C]

    def body(carry, xs):
        hidden, cache = step(carry[1], *xs)
        return (hidden, cache), None

    hidden0 = jnp.zeros((B, 1, model.config.hidden_size), model.dtype)
    (hidden, cache), _ = jax.lax.scan(body, (hidden0, cache),
                                      (chunks(input_ids), chunks(attention_mask)))
    return hidden, cache


def _fused_prefill(model, input_ids, attention_mask, cache: KVCache, groups: int, mesh):
    """Right-padded prompts into an empty cache of P + N slots through the fused attention path,
    `groups` forwards of B / groups rows each (a `lax.scan`), so the activations of one forward
    (the MLP's [rows, P, intermediate] above all) cover a group of rows, not the whole batch.

    input_ids int32 [B, P], attention_mask bool [B, P] -> (hidden [B, 1, D] of each row's last
    real token, cache). Group g holds rows g, g + groups, g + 2 groups, ... (row b = r * groups +
    g), so on a mesh every group spans every batch shard; each group's keys and values go into a
    cache of its own rows and are then written into its rows of `cache`.
    """
    def forward(ids, mask, into):
        return model.hidden_states(ids, attention_mask=mask, cache=into, last_only=True,
                                   right_padded=True)

    if groups == 1:
        hidden, cache = forward(input_ids, attention_mask, cache)
        return hidden, _constrain_cache(cache, mesh)
    B = input_ids.shape[0]
    R = B // groups
    pick = lambda x, g: jax.lax.dynamic_index_in_dim(  # noqa: E731  group g's rows [R, ...]
        x.reshape(R, groups, *x.shape[1:]), g, axis=1, keepdims=False)
    dtype = (cache.k if cache.stacked else cache.k[0]).dtype

    def body(carry, g):
        hidden, cache = carry
        own, part = forward(pick(input_ids, g), pick(attention_mask, g),
                            model.new_cache(R, cache.max_len, dtype, ragged=cache.ragged))
        hidden = _put_rows(hidden, own, g, groups, axis=0)
        axis = 1 if cache.stacked else 0
        put = lambda big, small: _put_rows(big, small, g, groups, axis)  # noqa: E731
        cache = cache.replace(k=jax.tree.map(put, cache.k, part.k),
                              v=jax.tree.map(put, cache.v, part.v),
                              key_mask=_put_rows(cache.key_mask, part.key_mask, g, groups, 0),
                              pos=_put_rows(cache.pos, part.pos, g, groups, axis=0),
                              index=part.index)
        return (hidden, _constrain_cache(cache, mesh)), None

    hidden0 = jnp.zeros((B, 1, model.config.hidden_size), model.dtype)
    (hidden, cache), _ = jax.lax.scan(body, (hidden0, cache), jnp.arange(groups))
    return hidden, cache


def _put_rows(big, small, g, groups: int, axis: int):
    """Write `small` (R rows on `axis`) into rows g, g + groups, ... of `big` (R * groups rows)."""
    shape = big.shape
    R = shape[axis] // groups
    split = big.reshape(*shape[:axis], R, groups, *shape[axis + 1:])
    start = (0,) * (axis + 1) + (g,) + (0,) * (len(shape) - axis - 1)
    update = jnp.expand_dims(small.astype(big.dtype), axis + 1)
    return jax.lax.dynamic_update_slice(split, update, start).reshape(shape)


def prefill_row_groups(requested: int, rows: int, prompt_slots: int) -> int:
    """Forwards the fused prefill splits its rows into (`_fused_prefill`): 1 when `requested`
    (the prefill_chunk setting) is 0, else the fewest (a power of two dividing `rows`, the batch
    rows per device) that keep each forward within PREFILL_ROW_TOKENS prompt slots per device
    (32,768: e.g. 8 rows of 4,096). The paper's 128 prompts of 4,096 on one device: 16 groups."""
    groups = 1
    while requested != 0 and rows // groups * prompt_slots > PREFILL_ROW_TOKENS \
            and rows % (2 * groups) == 0:
        groups *= 2
    return groups


def _decode_program(state, carry: DecodeState, eos_ids, temperature, top_p, n_new, *, graphdef,
                    static: _Static) -> DecodeState:
    """The decode loop on device: one `lax.while_loop` step per token until every row has an eos
    or n_new (int32 [] <= N) tokens. carry: `_prefill_program`'s output (donated: the loop
    updates the KV cache in place instead of copying it). Returns the loop's final state, of
    which the caller reads `samples` and `lengths` (at most n_new per row); returning all of it
    lets every donated buffer alias an output."""
    model = _sampling_model(graphdef, state, static)

    def cond(s: DecodeState):
        return (s.step < n_new) & ~jnp.all(s.done)

    def body(s: DecodeState) -> DecodeState:
        # finished rows feed a masked token: they write nothing the other rows could see
        hidden, cache = model.hidden_states(s.token[:, None], attention_mask=~s.done[:, None],
                                            cache=s.cache)
        token, lp, mlp = _sample_step(model.logits(hidden[:, 0]), token_keys(s.keys, s.step),
                                      temperature, top_p, static)
        samples, lengths, done = _record(s.step, token, lp, mlp, s.done, s.samples, s.lengths,
                                         eos_ids)
        return s._replace(step=s.step + 1, token=token, cache=cache, done=done, samples=samples,
                          lengths=lengths)

    return jax.lax.while_loop(cond, body, carry)


# --------------------------------------------------------------------------- host: buckets
def batch_bucket(n: int, multiple: int = 1) -> int:
    """Rows -> bucketed batch: next power of two, then up to a multiple of `multiple` (the
    data-parallel size on a mesh)."""
    b = bucket(n, 1)
    return -(-b // multiple) * multiple


def prompt_bucket(n: int) -> int:
    """Longest prompt -> prompt slots: next power of two, at least MIN_PROMPT_BUCKET."""
    return bucket(n, MIN_PROMPT_BUCKET)


def new_tokens_bucket(n: int) -> int:
    """max_new_tokens -> new-token slots: next power of two, at least MIN_NEW_BUCKET."""
    return bucket(n, MIN_NEW_BUCKET)


def prefill_chunk_size(requested: int, rows: int, heads: int, prompt_slots: int) -> int:
    """Query tokens per chunk of the einsum prefill, in [1, prompt_slots] (prompt_slots = one
    chunk, the whole prompt in one forward).

    requested: 0 = one chunk; n > 0 = n tokens (at most prompt_slots); AUTO_CHUNK (-1) = the
    largest power of two C whose float32 scores of one layer on one device,
    rows x heads x C x prompt_slots x 4 bytes, stay within PREFILL_SCORE_BYTES (128 MiB), but at
    least MIN_PREFILL_CHUNK (64) and at most prompt_slots. rows: batch rows per device; heads:
    query heads (H). E.g. 16 rows x 4 heads x 4096 slots: C = 128; 16 x 4 x 1024: 512;
    64 x 12 x 4096 (the paper's 128 prompts on 2 devices): 64 (the floor; 768 MiB of scores).
    """
    if not isinstance(requested, (int, np.integer)) or isinstance(requested, bool) \
            or requested < AUTO_CHUNK:
        raise ValueError(f"prefill_chunk must be an int >= -1 (-1 = auto, 0 = the whole prompt "
                         f"in one chunk, n > 0 = n tokens per chunk), got {requested!r}")
    if requested == 0:
        return prompt_slots
    if requested > 0:
        return min(int(requested), prompt_slots)
    per_token = max(rows, 1) * heads * prompt_slots * 4          # bytes of one query row
    chunk = 1 << max(0, (PREFILL_SCORE_BYTES // per_token).bit_length() - 1) \
        if PREFILL_SCORE_BYTES >= per_token else 1
    return min(max(chunk, MIN_PREFILL_CHUNK), prompt_slots)


DECODE_ATTENTIONS = ("auto", "einsum", "ragged")


def decode_path(requested: str, prefill_attention: str, unrolled: bool, head_size: int = 128,
                platform: str | None = None) -> str:
    """The attention of the sampler's decode: 'einsum' (`attention.attention` over every slot of
    the cache: the prompt bucket's padding and the new-token slots not yet written included) or
    'ragged' (`gpu_attention.ragged_decode_attention`: each row's tokens only). requested: 'auto'
    (ragged on a GPU where the prefill is fused, the layers run unrolled and the head size is a
    power of two >= 16, as the Triton kernel's blocks need; else einsum), or either by name
    ('ragged' off a GPU runs Pallas's interpreter: tests). prefill_attention: the prefill's path
    (`prefill_path`); unrolled: the sampling model's layers are unrolled."""
    if requested not in DECODE_ATTENTIONS:
        raise ValueError(f"decode={requested!r}: use one of {', '.join(DECODE_ATTENTIONS)}")
    fits = prefill_attention != "einsum" and unrolled
    if requested == "auto":
        triton = head_size >= 16 and head_size & (head_size - 1) == 0
        on_gpu = (platform or jax.default_backend()) == "gpu"
        return "ragged" if fits and triton and on_gpu else "einsum"
    if requested == "ragged" and not fits:
        raise ValueError("decode='ragged' needs right-padded prompts (a model whose attention "
                         "resolves to a fused path, e.g. model.attention=cudnn on a GPU or xla) "
                         "and unrolled layers (Sampler(unroll_layers=True)); use decode='auto'")
    return requested


def prefill_path(model) -> str:
    """The attention path of the sampler's prefill: `resolve_attention` of the model's
    `attention` option ('einsum': left-padded prompts in chunks; any other: right-padded prompts
    through `fused_attention` in one forward)."""
    return resolve_attention(model.attention, model.dtype, model.config.head_size)


def right_pad(prompts: Sequence[Sequence[int]], batch: int, length: int):
    """prompts -> (input_ids int32 [batch, length], attention_mask bool [batch, length],
    row_valid bool [batch]); each prompt left-aligned (slots 0..len-1), dummy rows all padding."""
    ids = np.full((batch, length), PAD_ID, np.int32)
    mask = np.zeros((batch, length), bool)
    for r, p in enumerate(prompts):
        ids[r, :len(p)] = p
        mask[r, :len(p)] = True
    valid = np.zeros((batch,), bool)
    valid[:len(prompts)] = True
    return ids, mask, valid


def left_pad(prompts: Sequence[Sequence[int]], batch: int, length: int):
    """prompts -> (input_ids int32 [batch, length], attention_mask bool [batch, length],
    row_valid bool [batch]); each prompt right-aligned, dummy rows all padding."""
    ids = np.full((batch, length), PAD_ID, np.int32)
    mask = np.zeros((batch, length), bool)
    for r, p in enumerate(prompts):
        ids[r, length - len(p):] = p
        mask[r, length - len(p):] = True
    valid = np.zeros((batch,), bool)
    valid[:len(prompts)] = True
    return ids, mask, valid


# --------------------------------------------------------------------------- host: checks
def _check_args(model, prompts, max_new_tokens, temperature, top_p, top_k, prefill_chunk=0):
    prefill_chunk_size(prefill_chunk, 1, 1, 1)  # raises on a bad value
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 = no nucleus filter), got {top_p!r}")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = no top-k filter), got {top_k!r}")
    cfg = model.config
    for r, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {r} is empty; every prompt needs at least one token "
                             "(e.g. a BOS or chat-template token)")
        if len(p) + max_new_tokens > cfg.max_position_embeddings:
            raise ValueError(
                f"prompt {r} has {len(p)} tokens; with max_new_tokens={max_new_tokens} that is "
                f"{len(p) + max_new_tokens} positions, more than the model's "
                f"max_position_embeddings={cfg.max_position_embeddings}; shorten the prompt or "
                "lower max_new_tokens")
        lo, hi = min(p), max(p)
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(f"prompt {r} has token ids in [{lo}, {hi}], outside the vocabulary "
                             f"[0, {cfg.vocab_size})")


def _eos_array(eos_token_id) -> np.ndarray:
    """None | int | list of ints -> int32 [E] (None: [-1], which no token matches)."""
    if eos_token_id is None:
        return np.asarray([-1], np.int32)
    ids = [eos_token_id] if isinstance(eos_token_id, (int, np.integer)) else list(eos_token_id)
    if not ids:
        return np.asarray([-1], np.int32)
    return np.asarray(ids, np.int32)


def _raw_key(rng) -> np.ndarray | jax.Array:
    """None | int seed | PRNGKey (raw uint32 or typed) -> raw uint32 key data."""
    if rng is None:
        rng = DEFAULT_SEED
    if isinstance(rng, (int, np.integer)):
        return jax.random.PRNGKey(int(rng))
    rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng)
    return rng


def params_mesh(state):
    """The Mesh the parameters are sharded over (a NamedSharding whose mesh has the batch axes),
    or None for single-device parameters."""
    for leaf in jax.tree.leaves(state):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and set(BATCH_AXES) <= set(sharding.mesh.axis_names):
            return sharding.mesh
    return None


def _mesh_processes(mesh) -> int:
    """How many processes own devices of `mesh` (1 without a mesh)."""
    if mesh is None:
        return 1
    return len({d.process_index for d in mesh.devices.flat})


def _row_ids(row_ids, n: int, rows: int, procs: int) -> np.ndarray:
    """This process's block of the batch's row ids, int32 [rows]: `row_ids` (one per prompt) or,
    without them, the prompts' places in the global batch; dummy rows get -1 (their draws are
    never kept)."""
    out = np.full((rows,), -1, np.int32)
    if row_ids is None:
        first = jax.process_index() * rows if procs > 1 else 0
        out[:n] = np.arange(first, first + n)
        return out
    ids = np.asarray(row_ids)
    if ids.shape != (n,) or not np.issubdtype(ids.dtype, np.integer) or (n and ids.min() < 0):
        raise ValueError(f"row_ids must hold one integer >= 0 per prompt ({n}), got {row_ids!r}")
    out[:n] = ids
    return out


def _batches(prompts: int, max_rows: int, procs: int) -> int:
    """Generation calls for `prompts` prompts (this process's) at most `max_rows` at a time
    (0 = all at once): 1, or the most any process needs (the calls are collective)."""
    if not isinstance(max_rows, (int, np.integer)) or isinstance(max_rows, bool) or max_rows < 0:
        raise ValueError(f"max_rows must be an int >= 0 (0 = every prompt at once), "
                         f"got {max_rows!r}")
    if max_rows == 0:
        return 1
    need = -(-prompts // max_rows)
    return max(max_over_processes(need)[0] if procs > 1 else need, 1)


def _state_signature(state) -> tuple:
    leaves, treedef = jax.tree.flatten(state)
    return treedef, tuple((x.shape, x.dtype, x.sharding) for x in leaves)


# --------------------------------------------------------------------------- host: the sampler
def _prefill_args(args):
    """generate's placed args (state, ids, mask, valid, row_ids, eos, rng, temperature, top_p,
    n_new) -> `_prefill_program`'s (all but n_new)."""
    return args[:-1]


def _decode_args(args, carry):
    """generate's placed args and the prefill's carry -> `_decode_program`'s (state, carry, eos,
    temperature, top_p, n_new)."""
    state, _, _, _, _, eos, _, temperature, top_p, n_new = args
    return state, carry, eos, temperature, top_p, n_new


def _prefill_static(model, rows_per_device: int, prompt_slots: int, prefill_chunk: int,
                    decode: str = "auto", unroll_layers: bool = True) -> dict:
    """_Static's prefill and decode fields: the prefill's path (`prefill_path`) and, on the
    einsum path, its chunk (`prefill_chunk_size`; 0 on a fused path, where it is unused); the
    decode's attention (`decode_path` of `decode`)."""
    path = prefill_path(model)
    decode_attention = decode_path(decode, path, unroll_layers or not model.scan_layers,
                                   model.config.head_size)
    if path != "einsum":
        return dict(prefill_attention=path, prefill_chunk=0, prefill_row_groups=prefill_row_groups(
            prefill_chunk, rows_per_device, prompt_slots), decode_attention=decode_attention)
    chunk = prefill_chunk_size(prefill_chunk, rows_per_device, model.config.num_attention_heads,
                               prompt_slots)
    return dict(prefill_attention=path, prefill_chunk=chunk, decode_attention=decode_attention)


class Sampler:
    """A cache of compiled generation programs, one per bucket (see the module docstring), owned
    by whoever generates with it: a run (`hgpo_jax.rl.policy.Policy.sampler`, the trainer's and
    the evaluator's), a command, a test. Nothing is shared between owners, and the programs go
    with their owner (`clear`, or the owner dropped).

    max_programs: the most programs kept; beyond it the least recently used is dropped (a
    bucket seen again compiles again). num_compiles: programs compiled so far (dropped ones
    included); held: programs kept now. compile_s: total seconds spent compiling.
    unroll_layers: run a scanned model's layers unrolled (`_sampling_model`).
    """

    def __init__(self, unroll_layers: bool = True, max_programs: int = MAX_PROGRAMS):
        if max_programs < 1:
            raise ValueError(f"max_programs={max_programs}: a sampler keeps at least one program")
        self._programs: collections.OrderedDict = collections.OrderedDict()
        self.max_programs = max_programs
        self.num_compiles = 0
        self.compile_s = 0.0
        self.unroll_layers = unroll_layers  # see _sampling_model
        # why decode='auto' no longer tries the ragged kernel here (its compile failed), or None
        self.ragged_failure: str | None = None

    @property
    def held(self) -> int:
        return len(self._programs)

    def clear(self) -> None:
        """Drop every compiled program (e.g. after the model's structure changed, or when its
        owner is done)."""
        self._programs.clear()

    def _keep(self, key, programs) -> None:
        self._programs[key] = programs
        self._programs.move_to_end(key)
        while len(self._programs) > self.max_programs:
            self._programs.popitem(last=False)

    def generate(self, model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 eos_token_id=None, rng=None, mesh=None,
                 prefill_chunk: int = AUTO_CHUNK, row_ids=None, decode: str = "auto",
                 max_rows: int = 0) -> GenerateOutput:
        """See the module-level `generate`."""
        if decode not in DECODE_ATTENTIONS:
            raise ValueError(f"decode={decode!r}: use one of {', '.join(DECODE_ATTENTIONS)}")
        prompts = [list(map(int, p)) for p in prompts]
        _check_args(model, prompts, max_new_tokens, temperature, top_p, top_k, prefill_chunk)
        graphdef, state = nnx.split(model)
        mesh = mesh if mesh is not None else params_mesh(state)
        procs = _mesh_processes(mesh)
        auto = decode == "auto"
        decode = "einsum" if auto and self.ragged_failure else decode
        batches = _batches(len(prompts), max_rows, procs)
        if batches > 1:
            return self._generate_in_batches(
                model, prompts, max_new_tokens, batches, max_rows, procs, row_ids,
                temperature=temperature, top_p=top_p, top_k=top_k, eos_token_id=eos_token_id,
                rng=rng, mesh=mesh, prefill_chunk=prefill_chunk, decode=decode)
        if not prompts and procs == 1:
            return GenerateOutput([], [], [], self.num_compiles, 0.0)
        dp = 1 if mesh is None else math.prod(mesh.shape[a] for a in BATCH_AXES)
        # several processes: one batch over the mesh, each process's prompts in its own block of
        # B / procs rows, and the buckets agreed (the largest any process needs)
        rows, longest = max_over_processes(len(prompts), max(map(len, prompts), default=1)) \
            if procs > 1 else (len(prompts), max(len(p) for p in prompts))
        B = batch_bucket(rows, dp // procs) * procs
        Pn = prompt_bucket(longest)
        greedy = temperature == 0
        vocab = model.config.vocab_size
        static = _Static(
            max_new=new_tokens_bucket(max_new_tokens), greedy=greedy,
            top_k=0 if greedy or top_k >= vocab else int(top_k),
            use_top_p=not greedy and top_p < 1.0, cache_dtype=jnp.dtype(model.dtype),
            mesh=mesh, unroll_layers=self.unroll_layers,
            **_prefill_static(model, B // dp, Pn, prefill_chunk, decode, self.unroll_layers))

        pad = left_pad if static.prefill_attention == "einsum" else right_pad
        ids, mask, valid = pad(prompts, B // procs, Pn)
        ids_of_rows = _row_ids(row_ids, len(prompts), B // procs, procs)
        eos = _eos_array(eos_token_id)
        scalars = (_raw_key(rng), np.float32(temperature if not greedy else 1.0),
                   np.float32(top_p), np.int32(max_new_tokens))
        args = (state, *self._place((ids, mask, valid, ids_of_rows), (eos, *scalars), mesh, state))

        key = (graphdef, _state_signature(state), (B, Pn), eos.shape, static)
        programs = self._programs.get(key)
        compile_s = 0.0
        if programs is None:
            t0 = time.perf_counter()
            programs, static = self._compile_or_fall_back(graphdef, static, args, mesh, state, auto)
            compile_s = time.perf_counter() - t0
            self.compile_s += compile_s
            self.num_compiles += 1
            self._keep(key[:-1] + (static,), programs)
        else:
            self._programs.move_to_end(key)

        prefill, decode = programs
        t0 = time.perf_counter()
        carry = jax.block_until_ready(prefill(*_prefill_args(args)))
        t1 = time.perf_counter()
        final = jax.block_until_ready(decode(*_decode_args(args, carry)))
        t2 = time.perf_counter()
        toks, lps, mlps, lengths = (local_rows(x, mesh) for x in (*final.samples, final.lengths))
        n = len(prompts)
        return GenerateOutput(
            tokens=[toks[r, :lengths[r]].tolist() for r in range(n)],
            logprobs=[lps[r, :lengths[r]].tolist() for r in range(n)],
            model_logprobs=[mlps[r, :lengths[r]].tolist() for r in range(n)],
            num_compiles=self.num_compiles, compile_s=compile_s, prefill_s=t1 - t0,
            decode_s=t2 - t1)

    def _generate_in_batches(self, model, prompts, max_new_tokens, batches: int, max_rows: int,
                             procs: int, row_ids, **kw) -> GenerateOutput:
        """`generate` of at most `max_rows` prompts at a time (this process's), `batches` calls
        (the same count on every process), outputs joined in prompt order. Row ids keep every
        row's draws what one batch would give them."""
        if row_ids is None and procs > 1:
            raise ValueError("generating in batches of max_rows on several processes needs "
                             "row_ids (one per prompt), so that the rows' draws stay independent")
        ids = list(range(len(prompts))) if row_ids is None else list(row_ids)
        _row_ids(ids, len(prompts), len(prompts), 1)  # one id >= 0 per prompt, checked whole
        parts = [self.generate(model, prompts[b * max_rows:(b + 1) * max_rows], max_new_tokens,
                               row_ids=ids[b * max_rows:(b + 1) * max_rows], **kw)
                 for b in range(batches)]
        return GenerateOutput(
            tokens=[t for o in parts for t in o.tokens],
            logprobs=[t for o in parts for t in o.logprobs],
            model_logprobs=[t for o in parts for t in o.model_logprobs],
            num_compiles=self.num_compiles, compile_s=sum(o.compile_s for o in parts),
            prefill_s=sum(o.prefill_s for o in parts), decode_s=sum(o.decode_s for o in parts))

    def _compile_or_fall_back(self, graphdef, static: _Static, args, mesh, state, auto: bool):
        """(programs, the static they were built for): `_compile`'s; where decode='auto' chose
        the ragged kernel and it does not lower or compile on this device, the einsum decode
        instead, said in one line on stderr, and this sampler's later 'auto' calls skip the
        kernel (`ragged_failure`). A path never run on a device is never the silent default."""
        try:
            return self._compile(graphdef, static, args, mesh, state), static
        except Exception as e:  # noqa: BLE001 (any lowering or compile error of the kernel)
            if not (auto and static.decode_attention == "ragged"):
                raise
            self.ragged_failure = failure_line(e)
            print(f"hgpo-jax: the ragged decode kernel did not compile on this device "
                  f"({self.ragged_failure}); the sampler decodes with einsum attention instead "
                  "(rollout.decode_attention=einsum chooses it; docs/sampling.md)",
                  file=sys.stderr, flush=True)
            static = dataclasses.replace(static, decode_attention="einsum")
            return self._compile(graphdef, static, args, mesh, state), static

    @staticmethod
    def _compile(graphdef, static: _Static, args, mesh, state):
        """The (prefill, decode) executables of one bucket. They get different XLA options: on
        CPU the compute-bound prefill runs faster without YNNPACK fusions, the decode loop's
        small per-token products with them (docs/sampling.md)."""
        prefill = jax.jit(partial(_prefill_program, graphdef=graphdef, static=static)).lower(
            *_prefill_args(args)).compile(compiler_options=compiler_options(mesh, state, "prefill"))
        carry = jax.tree.map(lambda o, sh: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=sh),
                             prefill.out_info, prefill.output_shardings)
        decode = jax.jit(partial(_decode_program, graphdef=graphdef, static=static),
                         donate_argnums=1).lower(
            *_decode_args(args, carry)).compile(
            compiler_options=compiler_options(mesh, state, "decode"))
        return prefill, decode

    @staticmethod
    def _place(batched, replicated, mesh, state):
        """Put batch arrays on the batch axes of `mesh` (or the params' device) and the rest
        replicated."""
        if mesh is None:
            leaves = jax.tree.leaves(state)
            device = next(iter(leaves[0].devices())) if leaves else None
            put = lambda x: jax.device_put(x, device)  # noqa: E731
            return tuple(map(put, batched)) + tuple(map(put, replicated))
        out = []
        procs = _mesh_processes(mesh)
        for x in batched:  # x: this process's rows (all of them with one process)
            shape = (x.shape[0] * procs, *x.shape[1:])
            out.append(jax.device_put(x, rows_sharding(mesh, shape)) if procs == 1 else
                       jax.make_array_from_process_local_data(rows_sharding(mesh, shape), x, shape))
        rep = NamedSharding(mesh, P())
        out.extend(jax.device_put(jnp.asarray(x), rep) for x in replicated)
        return tuple(out)


def compile_for_plan(graphdef, abs_params, rows: int, prompt_slots: int, max_new_tokens: int,
                     mesh, cache_dtype, *, prefill_chunk: int = AUTO_CHUNK,
                     unroll_layers: bool = True) -> dict:
    """Compile (nothing runs) the generation programs a rollout of `rows` prompts of up to
    `prompt_slots` tokens and `max_new_tokens` new ones uses, on abstract weights `abs_params`
    (ShapeDtypeStructs with the run's shardings), sampling at temperature > 0 without top-k/top-p
    and one eos id: for `hgpo-jax plan --sampler`.

    Returns {"batch": B, "prompt_slots": P, "new_slots": N, "chunk": C (0 on a fused path),
    "row_groups": the fused path's forwards (`prefill_row_groups`; 1 on the einsum path),
    "prefill_attention": the prefill path, "cache_dtype", "cache_bytes": the KV cache's bytes on
    one device (P + N slots), "prefill", "decode": the compiled executables}.
    """
    model = merge_params(graphdef, abs_params)  # a LoRA run's adapters and base: one state
    graphdef, abs_params = nnx.split(model)
    dp = 1 if mesh is None else math.prod(mesh.shape[a] for a in BATCH_AXES)
    B, Pn, N = batch_bucket(rows, dp), prompt_bucket(prompt_slots), new_tokens_bucket(max_new_tokens)
    static = _Static(max_new=N, greedy=False, top_k=0, use_top_p=False,
                     cache_dtype=jnp.dtype(cache_dtype), mesh=mesh, unroll_layers=unroll_layers,
                     **_prefill_static(model, B // dp, Pn, prefill_chunk, "auto", unroll_layers))
    if mesh is None:
        batched = lambda shape: {}  # noqa: E731
        rep = {}
    else:
        batched = lambda shape: {"sharding": rows_sharding(mesh, shape)}  # noqa: E731
        rep = {"sharding": NamedSharding(mesh, P())}
    args = (abs_params,
            *(jax.ShapeDtypeStruct(shape, dtype, **batched(shape))
              for shape, dtype in (((B, Pn), jnp.int32), ((B, Pn), jnp.bool_), ((B,), jnp.bool_),
                                   ((B,), jnp.int32))),
            *(jax.ShapeDtypeStruct(shape, dtype, **rep)
              for shape, dtype in (((1,), jnp.int32), ((2,), jnp.uint32), ((), jnp.float32),
                                   ((), jnp.float32), ((), jnp.int32))))
    prefill, decode = Sampler._compile(graphdef, static, args, mesh, abs_params)
    cache_out = jax.tree.leaves((prefill.out_info[2].k, prefill.out_info[2].v))
    cache_shardings = jax.tree.leaves((prefill.output_shardings[2].k, prefill.output_shardings[2].v))
    cache_bytes = sum(math.prod(sh.shard_shape(o.shape)) * jnp.dtype(o.dtype).itemsize
                      for o, sh in zip(cache_out, cache_shardings))
    return {"batch": B, "prompt_slots": Pn, "new_slots": N, "chunk": static.prefill_chunk,
            "row_groups": static.prefill_row_groups,
            "prefill_attention": static.prefill_attention, "cache_dtype": static.cache_dtype,
            "cache_bytes": cache_bytes, "prefill": prefill, "decode": decode}


def generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, eos_token_id=None,
             rng=None, mesh=None, sampler: Sampler | None = None,
             prefill_chunk: int = AUTO_CHUNK, row_ids=None, decode: str = "auto",
             max_rows: int = 0) -> GenerateOutput:
    """Sample up to `max_new_tokens` new tokens for each prompt, all prompts in one batch (or
    in batches of at most `max_rows`).

    model: a CausalLM. prompts: list of token-id lists (each non-empty).
    temperature: 0 = greedy (argmax; top_k / top_p are then irrelevant), else the softmax
      temperature. top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass (1 = off).
      Applied in HF's order: temperature, top-k, top-p (see `filter_logits`).
    eos_token_id: None, an int or a list of ints; a row stops after its first eos (kept).
    rng: a jax PRNG key (raw uint32[2] or typed) or an int seed; None = seed DEFAULT_SEED (0), so
      calls without an rng repeat the same samples: pass a fresh key per call when sampling.
    row_ids: one integer >= 0 per prompt naming its row (a rollout passes each env's global
      index). Row r's k-th new token is drawn with fold_in(fold_in(rng, row_ids[r]), k), so a
      row's samples do not depend on the other rows, the batch bucket or how the rows are split
      over processes. None: the prompts' places in the global batch (0..n-1 on one process).
    mesh: the (data, fsdp, tensor) mesh the params live on; default: found from the params'
      shardings. The batch (padded to a multiple of data*fsdp) and the KV cache's batch dim are
      split over ("data", "fsdp").
    sampler: the compiled-program cache to use (`Sampler`); None: one for this call only, so its
      programs are compiled afresh and dropped after (hold a Sampler to reuse them).
    prefill_chunk: query tokens per chunk of the einsum prefill (-1 = auto, 0 = the whole prompt
      bucket at once; see `prefill_chunk_size`); unused where the prefill is fused
      (`prefill_path`). Same tokens whatever the chunk, up to float summation order.
    decode: the decode's attention (`decode_path`): 'auto' (the ragged decode on a GPU where it
      runs, else einsum), 'einsum' (every cache slot) or 'ragged' (each row's tokens only; off a
      GPU through Pallas's interpreter). Same tokens either way, up to float summation order.
    max_rows: the most prompts (per process) in one batch, vLLM's max_num_seqs: more run in
      successive batches, each with its own KV cache, so the cache and the prefill's temporaries
      scale with max_rows instead of the prompt count; 0 = all at once. Same tokens either way
      (each row's draws depend on its row id only), up to float summation order.

    Returns a GenerateOutput (see there for the log-prob semantics and the timings).
    Raises ValueError on an empty prompt, a prompt + max_new_tokens longer than the model's
    max_position_embeddings, temperature < 0, top_p outside (0, 1], top_k < 0 or
    prefill_chunk < -1.
    """
    return (sampler or Sampler()).generate(
        model, prompts, max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        eos_token_id=eos_token_id, rng=rng, mesh=mesh, prefill_chunk=prefill_chunk,
        row_ids=row_ids, decode=decode, max_rows=max_rows)
