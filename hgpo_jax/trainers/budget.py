"""Token-budget micro-batches on the trainer's side (`train.max_tokens_per_micro_batch`): a
forward pass over all of a process's rows in micro-batches of at most a budget of tokens, and the
micro-batches of one mini-batch of the policy's update or of prefix SFT, weighted so that the loss
and the gradient are the fixed micro-batches' (`rl.batching`, `rl.update.budget_update`). The
trainer is where an iteration's rows meet across processes: these passes gather the token counts
and lengths every process needs (`distributed.allgather_json`)."""

from __future__ import annotations

import jax
import numpy as np

from hgpo_jax import distributed as dist
from hgpo_jax.rl.batching import (PolicyRows, SftRows, TokenRows, fixed_micro_row_weights,
                                   fixed_micro_weights, take_micro)
from hgpo_jax.rl.update import budget_micros, budget_plan, on_mesh


def budget_rows_pass(fn, params, arrays, budget: int, ladder, shards: int,
                     mesh, width: int | None = None) -> np.ndarray:
    """fn(params, input_ids, attention_mask, response_mask) over all of this process's rows
    [S, L] in token-budget micro-batches, each padded only to its own length; the outputs back at
    their rows: [S, L] (fn's [R, length] in the first columns, 0 after), or [S, width] for an fn
    whose output columns are not token positions (the critic's values; [S, width, H] with H
    heads). arrays: `TokenRows` (of any class) or a dict holding their arrays."""
    me = jax.process_index()
    tokens = TokenRows.of(arrays)
    S, L = tokens.input_ids.shape
    out = None
    for micro in budget_plan(tokens.attention_mask.sum(1), budget, ladder, shards):
        rows = micro.rows[me]
        part = on_mesh(take_micro(tokens, rows, micro.length), mesh)
        res = dist.local_rows(fn(params, part.input_ids, part.attention_mask, part.response_mask), mesh)
        if out is None:  # [S, L] or [S, width], with any trailing axes of fn's (a critic's heads)
            out = np.zeros((S, width or L) + res.shape[2:], np.float32)
        keep = rows >= 0
        out[rows[keep], :res.shape[1]] = res[keep]
    return out


def budget_minibatch(local: PolicyRows, num_micro: int, agg: str, budget: int, ladder,
                     shards: int, mesh):
    """The token-budget micro-batches of one mini-batch, device-ready, one at a time (for
    `rl.update.budget_update`). local: this process's rows of the mini-batch (`gather_rows`), each
    process the same count; every micro-batch gets the loss weights of the fixed micro-batches
    (`rl.batching.fixed_micro_weights`: the same loss and gradient as the fixed step). Rows
    without response tokens are left out. One allgather each for the token counts and the
    lengths."""
    me = jax.process_index()
    tokens = local.response_mask.sum(1).astype(np.int64)
    every = np.asarray(dist.allgather_json([int(x) for x in tokens]), np.int64)  # [P, M]
    token_w, agg_w = fixed_micro_weights(every, num_micro, agg)
    local = local.replace(token_weight=token_w[me], agg_weight=agg_w[me])
    return budget_micros(local, np.where(tokens > 0, local.attention_mask.sum(1), 0), budget,
                         ladder, shards, mesh)


def budget_sft_minibatch(local: SftRows, num_micro: int, budget: int, ladder, shards: int, mesh):
    """The token-budget micro-batches of one prefix SFT mini-batch, device-ready, one at a time
    (for `rl.update.budget_update`). local: this process's rows of the mini-batch (`gather_rows`),
    each process the same count; each row weighted as the fixed micro-batches weigh it
    (`rl.batching.fixed_micro_row_weights`: the same loss and gradient as the fixed step). Rows
    of weight 0 (inert) are left out. One allgather of the weights, one of the lengths."""
    every = np.asarray(dist.allgather_json([float(w) for w in local.weight]), np.float64)  # [P, M]
    local = local.replace(budget_weight=fixed_micro_row_weights(every, num_micro)[jax.process_index()])
    return budget_micros(local, np.where(local.weight > 0, local.attention_mask.sum(1), 0),
                         budget, ladder, shards, mesh)
