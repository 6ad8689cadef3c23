"""Pack rollout rows (prompt + response per env step) into padded device batches.

Every step of every trajectory is one training row: the prompt tokens followed by the response
tokens, right-padded to a bucketed length L; the loss covers response tokens only.

With `train.max_tokens_per_micro_batch` the update and the log-prob passes cut the rows into
token-budget micro-batches instead (`token_budget_micro_batches`: rows of similar length
together, each micro-batch padded to its own length on `length_ladder`), and the update weighs
every row as the fixed micro-batches would (`fixed_micro_weights`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import flax.struct
import jax
import numpy as np

from hgpo_jax.models.critic import check_num_heads


@dataclasses.dataclass
class TrainBatch:
    """Host arrays of S rows (S padded to a multiple of `row_multiple`; padded rows are inert).

    input_ids int32 [S, L]; attention_mask int32 [S, L] (1 on real tokens); response_mask
    float32 [S, L] (1 on response tokens); advantages float32 [S]; sample_logp float32 [S, L]
    (log-probs the sampler reported, aligned with input_ids; 0 elsewhere).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    response_mask: np.ndarray
    advantages: np.ndarray
    sample_logp: np.ndarray
    num_rows: int  # real rows before padding

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "num_rows"}


# --------------------------------------------------------------------------- device batches
def rows_field(ndim: int, dtype=np.float32, *, optional: bool = False, inert: bool = False,
               heads: bool = False):
    """A batch field: an array of `ndim` dims whose first is the rows ([M] or [M, L]), of
    `dtype`. optional: None unless asked for (`TokenRows.spec(include=...)`). inert: zero in an
    inert row (`gather_rows`), as a mask or a loss weight is. heads: one value per critic head,
    a trailing head axis H after those dims when there are several ([M, W] for one head,
    [M, W, H] for H > 1: `TokenRows.spec(num_heads=H)`)."""
    kwargs = {"default": None} if optional else {}
    return flax.struct.field(metadata={"ndim": ndim, "dtype": dtype, "inert": inert,
                                       "heads": heads}, **kwargs)


def head_axis(num_heads: int) -> tuple[int, ...]:
    """The trailing shape of a `heads` field: () for one head (today's arrays), (H,) for H > 1."""
    num_heads = check_num_heads(num_heads)
    return () if num_heads == 1 else (num_heads,)


Rows = TypeVar("Rows", bound="TokenRows")


@flax.struct.dataclass
class TokenRows:
    """M right-padded rows of L tokens (a pytree: host NumPy or device arrays).

    input_ids int32 [M, L]; attention_mask int32 [M, L] (1 on real tokens); response_mask
    float32 [M, L] (1 on response tokens: the loss covers them only)."""

    input_ids: Any = rows_field(2, np.int32)
    attention_mask: Any = rows_field(2, np.int32, inert=True)
    response_mask: Any = rows_field(2, inert=True)

    @classmethod
    def of(cls: type[Rows], arrays: Mapping[str, Any] | TokenRows) -> Rows:
        """The class's fields out of a dict of arrays, or out of rows of another `TokenRows` class
        (optional ones left None when absent)."""
        if isinstance(arrays, TokenRows):
            arrays = _arrays(arrays)
        return cls(**{f.name: arrays[f.name] for f in dataclasses.fields(cls) if f.name in arrays})

    @classmethod
    def spec(cls: type[Rows], rows: int = 1, length: int = 8, *, include: Sequence[str] = (),
             ndims: Mapping[str, int] | None = None, num_heads: int = 1) -> Rows:
        """The batch as `jax.ShapeDtypeStruct`s of [rows] or [rows, length] (the fields' declared
        ranks, or `ndims`' for the named ones), and a trailing head axis [..., num_heads] on the
        `heads` fields when num_heads > 1: what a jitted step's shardings and abstract
        evaluations are made from. Optional fields are None unless in `include`."""
        ndims = dict(ndims or {})
        tail = head_axis(num_heads)
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is None and f.name not in include:
                continue
            ndim = ndims.pop(f.name, f.metadata["ndim"])
            shape = (rows, length)[:ndim] + (tail if f.metadata.get("heads") else ())
            out[f.name] = jax.ShapeDtypeStruct(shape, f.metadata["dtype"])
        if ndims:
            raise ValueError(f"{cls.__name__}.spec: no fields {sorted(ndims)}")
        return cls(**out)

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


@flax.struct.dataclass
class PolicyRows(TokenRows):
    """The PPO update's rows: `TokenRows` and

    advantages float32 [M] per row, or [M, L] per token (PPO with a critic); old_logp, ref_logp
    float32 [M, L] (the rollout policy's and the reference's token log-probs); token_weight,
    agg_weight float32 [M]: a token-budget micro-batch's row weights (`fixed_micro_weights`;
    None in a fixed mini-batch)."""

    advantages: Any = rows_field(1, inert=True)
    old_logp: Any = rows_field(2)
    ref_logp: Any = rows_field(2)
    token_weight: Any = rows_field(1, optional=True, inert=True)
    agg_weight: Any = rows_field(1, optional=True, inert=True)

    @classmethod
    def spec(cls, rows: int = 1, length: int = 8, *, token_advantages: bool = False,
             weighted: bool = False, **kwargs) -> PolicyRows:
        """`TokenRows.spec` with advantages per token (`token_advantages`) and the token-budget
        row weights (`weighted`)."""
        return super().spec(rows, length, ndims={"advantages": 2} if token_advantages else None,
                            include=("token_weight", "agg_weight") if weighted else (), **kwargs)


@flax.struct.dataclass
class SftRows(TokenRows):
    """Prefix SFT's supervised rows (`rl.prefix_sft`): `TokenRows` (the response: the agent's
    reply for an expert action and its end of turn) and

    weight float32 [M]: the row's weight in its micro-batch's weighted mean (1 / its env's prefix
    length; 0 in an inert row); budget_weight float32 [M]: a token-budget micro-batch's row
    weights (`fixed_micro_row_weights` of `weight`; None in a fixed mini-batch)."""

    weight: Any = rows_field(1, inert=True)
    budget_weight: Any = rows_field(1, optional=True, inert=True)

    @classmethod
    def spec(cls, rows: int = 1, length: int = 8, *, weighted: bool = False, **kwargs) -> SftRows:
        """`TokenRows.spec` with the token-budget row weights (`weighted`)."""
        return super().spec(rows, length, include=("budget_weight",) if weighted else (), **kwargs)


@flax.struct.dataclass
class CriticRows(TokenRows):
    """The critic update's rows: `TokenRows` and values, returns float32 [M, W] for a critic of
    one head, [M, W, H] for H > 1 (the value model's old predictions and the returns over the
    response window, per head); value_mask, of the same shape, where each head has a target (None:
    every value position of the window, `rl.critic.window_masks`); head_weight float32 [M] ([M, H])
    and value_weight [M]: a token-budget micro-batch's row weights per head and over all heads
    (`rl.critic.critic_micro_weights`; None in a fixed mini-batch)."""

    values: Any = rows_field(2, heads=True)
    returns: Any = rows_field(2, heads=True)
    value_mask: Any = rows_field(2, heads=True, optional=True, inert=True)
    head_weight: Any = rows_field(1, heads=True, optional=True, inert=True)
    value_weight: Any = rows_field(1, optional=True, inert=True)

    @classmethod
    def spec(cls, rows: int = 1, length: int = 8, *, window: int | None = None,
             num_heads: int = 1, weighted: bool = False, include=(), **kwargs) -> CriticRows:
        """`TokenRows.spec` with values and returns (and value_mask, when included) [rows,
        window] (window default: `length`), [rows, window, num_heads] when num_heads > 1, and the
        token-budget row weights head_weight [rows] ([rows, num_heads]) and value_weight [rows]
        (`weighted`; `rl.critic.critic_micro_weights`)."""
        include = tuple(include) + (("head_weight", "value_weight") if weighted else ())
        out = super().spec(rows, length, num_heads=num_heads, include=include, **kwargs)
        if window is None:
            return out
        values = jax.ShapeDtypeStruct((rows, window) + head_axis(num_heads), out.values.dtype)
        mask = None if out.value_mask is None else values
        return out.replace(values=values, returns=values, value_mask=mask)


def _arrays(batch: TokenRows) -> dict[str, Any]:
    """{field: array} of a batch (its None fields left out)."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
            if getattr(batch, f.name) is not None}


MIN_BUCKET = 64


def bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """Smallest power of two >= max(n, minimum): padded sizes, so jit compiles once per bucket."""
    m = max(int(n), int(minimum), 1)
    return 1 << (m - 1).bit_length()


def bucket_length(n: int, multiple: int = 64) -> int:
    """Round a sequence length up to a multiple of `multiple` (few distinct compiled shapes)."""
    return max(multiple, int(math.ceil(n / multiple)) * multiple)


def packed_shape(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], *,
                 row_multiple: int = 1, length_multiple: int = 64) -> tuple[int, int]:
    """(S, L) of `pack_rows` for these rows: rows padded to a multiple of `row_multiple` (at least
    one multiple), the longest prompt + response bucketed to a multiple of `length_multiple`."""
    n = len(prompt_ids)
    L = bucket_length(max((len(p) + len(r) for p, r in zip(prompt_ids, response_ids)), default=1),
                      length_multiple)
    return max(row_multiple, int(math.ceil(max(n, 1) / row_multiple)) * row_multiple), L


def pack_rows(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
              advantages: Sequence[float], sample_logp: Sequence[Sequence[float]] | None = None, *,
              pad_id: int = 0, row_multiple: int = 1, length_multiple: int = 64,
              shape: tuple[int, int] | None = None, max_response: int | None = None) -> TrainBatch:
    """Rows -> TrainBatch. Rows are right-padded; S is padded to a multiple of `row_multiple`.
    shape: a larger (S, L) to pad to (every process of a multi-process run packs to the largest
    `packed_shape` of all); default `packed_shape`.
    max_response: the log-prob window (`rl.update.token_logprobs`); a longer response is an error."""
    n = len(prompt_ids)
    if not (len(response_ids) == len(advantages) == n) or (sample_logp is not None and len(sample_logp) != n):
        raise ValueError(f"pack_rows: {n} prompts, {len(response_ids)} responses, "
                         f"{len(advantages)} advantages"
                         + ("" if sample_logp is None else f", {len(sample_logp)} log-prob rows"))
    need = packed_shape(prompt_ids, response_ids, row_multiple=row_multiple,
                        length_multiple=length_multiple)
    S, L = need if shape is None else shape
    if S < need[0] or L < need[1]:
        raise ValueError(f"pack_rows: shape {shape} is smaller than the rows need {need}")
    ids = np.full((S, L), pad_id, np.int32)
    attn = np.zeros((S, L), np.int32)
    resp = np.zeros((S, L), np.float32)
    logp = np.zeros((S, L), np.float32)
    adv = np.zeros((S,), np.float32)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        P, R = len(p), len(r)
        if P == 0:
            raise ValueError(f"row {i} has an empty prompt")
        if max_response is not None and R > max_response:
            raise ValueError(f"row {i}: a response of {R} tokens does not fit the log-prob window "
                             f"of {max_response} (rollout.max_new_tokens)")
        ids[i, :P] = p
        ids[i, P:P + R] = r
        attn[i, :P + R] = 1
        resp[i, P:P + R] = 1.0
        if sample_logp is not None:
            if len(sample_logp[i]) != R:
                raise ValueError(f"row {i}: {R} response tokens but {len(sample_logp[i])} log-probs")
            logp[i, P:P + R] = sample_logp[i]
    adv[:n] = np.asarray(advantages, np.float32)
    return TrainBatch(ids, attn, resp, adv, logp, num_rows=n)


def minibatch_indices(num_rows: int, mini_batch_size: int, rng: np.random.Generator,
                      draw: int | None = None) -> list[np.ndarray]:
    """Shuffle rows [0, num_rows) and split into mini-batches of exactly `mini_batch_size` int
    indices; the last one is padded with -1 (inert rows: see `gather_rows`), so every update has
    the same shape and no row counts twice.

    draw: shuffle a permutation of range(draw) >= num_rows and keep the indices below num_rows
    (default num_rows). Processes of a multi-process run pass the same `draw` (the most rows any
    of them has), so their shared `rng` stays in step whatever their own row counts."""
    draw = num_rows if draw is None else max(draw, num_rows)
    if draw <= 0:
        return []
    perm = rng.permutation(draw)
    if draw > num_rows:
        perm = perm[perm < num_rows]
    if num_rows <= 0:
        return []
    count = int(math.ceil(num_rows / mini_batch_size))
    perm = np.concatenate([perm, np.full(count * mini_batch_size - num_rows, -1, perm.dtype)])
    return [perm[i * mini_batch_size:(i + 1) * mini_batch_size] for i in range(count)]


def gather_rows(batch: Rows, idx: np.ndarray) -> Rows:
    """Rows `idx` [M] of every [S, ...] host array of `batch` (any trailing axes, a head axis
    included, come along); index -1 gives an inert row (its `inert` fields, the masks, advantages
    and loss weights, 0: it adds nothing to the loss or its gradient)."""
    pad = idx < 0
    out = {k: v[np.where(pad, 0, idx)].copy() for k, v in _arrays(batch).items()}
    for f in dataclasses.fields(batch):
        if f.metadata.get("inert") and f.name in out:
            out[f.name][pad] = 0
    return batch.replace(**out)


# --------------------------------------------------------------------------- token budget
def length_ladder(max_length: int, multiple: int = 64, steps: int = 4) -> tuple[int, ...]:
    """The padded lengths a token-budget micro-batch may take, ascending: every multiple of
    `multiple` up to 2 * steps of them, then `steps` per doubling (x1.25, 1.5, 1.75, 2 for
    steps=4, so a row is padded by less than a quarter of its length), and last
    `bucket_length(max_length, multiple)`, the longest row any batch can hold. Few lengths, so
    few compiled shapes: 17 for 1,072 tokens in multiples of 32, 21 for 4,608 in 64s."""
    if steps < 1:
        raise ValueError(f"length_ladder: steps must be >= 1, got {steps}")
    top = bucket_length(max_length, multiple) // multiple  # in units of `multiple`
    units = set(range(1, min(2 * steps, top) + 1))
    base = steps
    while base * 2 <= top:  # base = steps * 2^k
        units.update(u for u in range(base * 2, base * 4, base // steps * 2) if u <= top)
        base *= 2
    units.add(top)
    return tuple(sorted(u * multiple for u in units))


def fit_length(n: int, ladder: Sequence[int]) -> int:
    """The shortest length of `ladder` (ascending) that holds n tokens. Raises ValueError when
    none does."""
    for length in ladder:
        if length >= n:
            return int(length)
    raise ValueError(f"a row of {n} tokens is longer than the longest micro-batch length "
                     f"{ladder[-1]} (rollout.max_prompt_tokens + rollout.max_new_tokens, padded)")


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """One token-budget micro-batch of a multi-process batch: `rows` int [P, R] holds each
    process's R row indices into its own arrays (-1: an inert row; every process feeds R rows, so
    the global micro-batch has P * R rows), `length` the padded length of all of them."""

    rows: np.ndarray
    length: int

    @property
    def shape(self) -> tuple[int, int]:
        """The global (rows, length) the micro-batch is compiled for."""
        return self.rows.size, self.length


def token_budget_micro_batches(lengths, budget: int, ladder: Sequence[int], *,
                               shards: int = 1) -> list[MicroBatch]:
    """Split rows into micro-batches of at most `budget` padded tokens per device.

    lengths: int [P, N] (or [N] for one process): every process's row lengths (prompt +
      response; 0 for a row that adds nothing, which is left out). Every process must pass the
      same lengths (all processes' rows) and gets the same plan, so all of them run the same
      sequence of compiled shapes.
    budget: tokens per device: rows per device x the micro-batch's padded length.
    ladder: the allowed padded lengths, ascending (`length_ladder`).
    shards: batch shards (devices along the mesh's data x fsdp axes) per process: each process's
      rows of a micro-batch are split evenly over them.

    Each process sorts its rows from longest to shortest; rank i of the micro-batch plan takes
    every process's i-th longest row and is as long as the longest of them. Micro-batches take
    consecutive ranks: the first rank's length fitted to the ladder fixes the micro-batch's
    length `Lb`, and it holds `budget // Lb` rows per device (all the rows it takes are no longer
    than Lb). The last micro-batch of shorter rows holds the next power of two of the rows it
    needs per device (at most `budget // Lb`), padded with inert rows, so row counts stay few too.
    Returns the micro-batches, longest first. Raises ValueError when a row is longer than the
    ladder's longest length or its length is over the budget.
    """
    lengths = np.asarray(lengths, np.int64)
    lengths = lengths.reshape(1, -1) if lengths.ndim == 1 else lengths
    if shards < 1:
        raise ValueError(f"token_budget_micro_batches: shards must be >= 1, got {shards}")
    orders = np.argsort(-lengths, axis=1, kind="stable")             # [P, N] longest first
    ranked = np.take_along_axis(lengths, orders, axis=1)            # [P, N]
    merged = ranked.max(axis=0) if ranked.size else np.zeros(0, np.int64)
    count = int((merged > 0).sum())  # ranks with a row (zeros sort last)
    out, i = [], 0
    while i < count:
        length = fit_length(int(merged[i]), ladder)
        per_device = budget // length
        if per_device < 1:
            raise ValueError(f"train.max_tokens_per_micro_batch={budget} is smaller than a row "
                             f"padded to {length} tokens; set it to at least {ladder[-1]}")
        need = -(-(count - i) // shards)  # rows per device for all the remaining ranks
        per_device = min(per_device, bucket(need, 1))
        take = min(per_device * shards, count - i)
        rows = np.full((lengths.shape[0], per_device * shards), -1, np.int64)
        rows[:, :take] = np.where(ranked[:, i:i + take] > 0, orders[:, i:i + take], -1)
        out.append(MicroBatch(rows, length))
        i += take
    return out


def budget_ladder(rollout, train, packed_length: int = 0) -> tuple[int, ...]:
    """The padded lengths of a run's token-budget micro-batches (`length_ladder` in multiples of
    `train.pad_multiple`): up to its longest possible row, rollout.max_prompt_tokens +
    max_new_tokens (and `packed_length`, a packed batch's, should a row be longer)."""
    return length_ladder(max(rollout.max_prompt_tokens + rollout.max_new_tokens, packed_length),
                         train.pad_multiple)


def largest_micro_batches(budget: int, ladder: Sequence[int], rows: int,
                          shards: int = 1) -> list[tuple[int, int]]:
    """The token-budget micro-batch shapes that bound its memory, as (rows per device, padded
    length): the one that holds the most tokens per device (ties: the longest) and the one of the
    longest rows, of the shapes `token_budget_micro_batches` can form for a mini-batch of `rows`
    rows (global) split over `shards` batch shards: at each ladder length Lb, min(budget // Lb,
    the power of two >= rows / shards) rows per device. One shape when both are the same.
    Raises ValueError when the longest length is over the budget."""
    cap = bucket(-(-rows // max(shards, 1)), 1)
    shapes = [(min(budget // length, cap), int(length)) for length in ladder]
    if shapes[-1][0] < 1:
        raise ValueError(f"train.max_tokens_per_micro_batch={budget} is smaller than a row padded "
                         f"to {ladder[-1]} tokens; set it to at least {ladder[-1]}")
    most = max(shapes, key=lambda s: (s[0] * s[1], s[1]))
    return [most] if most == shapes[-1] else [most, shapes[-1]]


def fixed_micro_weights(response_tokens, num_micro: int, agg: str = "token-mean"
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Per-row loss weights under which a mini-batch split any other way has the loss of the
    fixed split (`rl.update.make_update_step`): the mean over `num_micro` micro-batches of each one's
    aggregate, micro-batch j holding the global rows j, j + num_micro, j + 2 num_micro, ...

    response_tokens: [P, M] (or [M]) response tokens of every process's rows of the mini-batch;
      global row p * M + i is process p's row i (`distributed.global_rows`).
    agg: the loss's aggregation (`rl.loss.AGGS`).
    Returns (token_weight, agg_weight), float32 [P, M] (the input's shape): a token of row r in
    fixed micro-batch j weighs token_weight[r] = 1 / (num_micro T_j) in a token-mean, T_j the
    response tokens of j; agg_weight is the same for "token-mean", and 1 / (num_micro N_j T_r) for
    "seq-mean" (N_j the rows of j with a response token, T_r the row's own tokens). Summing
    weight x value over every response token of the mini-batch, in any grouping, gives the fixed
    split's loss. Rows without response tokens weigh 0.
    """
    tokens = np.asarray(response_tokens, np.float64)
    flat, j, total = _fixed_micro_totals(tokens, num_micro, "fixed_micro_weights")
    has = flat > 0
    token_w = np.where(has, 1.0 / (num_micro * np.maximum(total, 1.0)), 0.0)
    if agg == "token-mean":
        agg_w = token_w
    elif agg == "seq-mean":
        seqs = np.bincount(j, weights=has.astype(np.float64), minlength=num_micro)[j]
        agg_w = np.where(has, 1.0 / (num_micro * np.maximum(seqs, 1.0) * np.maximum(flat, 1.0)), 0.0)
    else:
        raise ValueError(f"fixed_micro_weights: unknown agg {agg!r}; use token-mean or seq-mean")
    return (token_w.reshape(tokens.shape).astype(np.float32),
            agg_w.reshape(tokens.shape).astype(np.float32))


def _fixed_micro_totals(values: np.ndarray, num_micro: int, caller: str):
    """The fixed split of a mini-batch's rows (global row r in micro-batch r % num_micro):
    (flat values [R], each row's micro-batch j [R], the sum of the values of each row's
    micro-batch [R]). Raises ValueError (naming `caller`) when R rows do not form num_micro equal
    micro-batches."""
    flat = values.reshape(-1)
    if num_micro < 1 or flat.size % num_micro:
        raise ValueError(f"{caller}: {flat.size} rows cannot form {num_micro} equal micro-batches")
    j = np.arange(flat.size) % num_micro
    return flat, j, np.bincount(j, weights=flat, minlength=num_micro)[j]


def fixed_micro_row_weights(weights, num_micro: int) -> np.ndarray:
    """Per-row weights under which a mini-batch split any other way has the loss of a weighted
    mean per fixed micro-batch (`fixed_micro_weights`' split: micro-batch j holds the global rows
    j, j + num_micro, ...), averaged over the `num_micro` micro-batches: row r of fixed
    micro-batch j weighs w_r / (num_micro W_j), W_j the sum of the weights of j (0 where W_j is
    0). weights: float [P, M] (or [M]), every process's rows of the mini-batch (global row
    p * M + i is process p's row i). Returns float32 of the input's shape: summing weight x value
    over the rows, in any grouping, gives the mean over the fixed micro-batches of
    sum_j(w x value) / W_j (prefix SFT's loss, `rl.prefix_sft`)."""
    w = np.asarray(weights, np.float64)
    flat, _, total = _fixed_micro_totals(w, num_micro, "fixed_micro_row_weights")
    out = np.where(total > 0, flat / (num_micro * np.where(total > 0, total, 1.0)), 0.0)
    return out.reshape(w.shape).astype(np.float32)


def take_micro(batch: Rows, rows: np.ndarray, length: int) -> Rows:
    """One micro-batch from host arrays: rows `rows` [R] (-1: inert, see `gather_rows`) of every
    array, and the first `length` columns of every one of 2 or more dims ([S, L] token positions;
    a critic's [S, W] or [S, W, H] response windows, whose positions past `length` hold no
    response token of a row of at most `length` tokens)."""
    out = _arrays(gather_rows(batch, rows))
    return batch.replace(**{k: v[:, :length] if v.ndim >= 2 else v for k, v in out.items()})
