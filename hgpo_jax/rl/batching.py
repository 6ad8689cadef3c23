"""Pack rollout rows (prompt + response per env step) into padded device batches.

Every step of every trajectory is one training row: the prompt tokens followed by the response
tokens, right-padded to a bucketed length L; the loss covers response tokens only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np


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
    max_response: the log-prob window (`rl.ppo.token_logprobs`); a longer response is an error."""
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


def gather_rows(arrays: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    """Rows `idx` [M] of every [S, ...] array; index -1 gives an inert row (all masks and the
    advantage 0, so it adds nothing to the loss or its gradient)."""
    pad = idx < 0
    out = {k: v[np.where(pad, 0, idx)].copy() for k, v in arrays.items()}
    for k in ("attention_mask", "response_mask", "advantages"):
        if k in out:
            out[k][pad] = 0
    return out
