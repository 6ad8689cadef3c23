"""The device update machinery every trainer shares (RL, PPO's critic, SFT), as pure jitted
functions: shardings of parameters, optimizer states and batches; the optimizer; token log-probs;
one optimizer update over fixed micro-batches or over token-budget micro-batches of any shapes.
The losses that plug into it live with their trainers (`rl.ppo`, `rl.critic`, `trainers.sft`).

Parameters travel as an `nnx.State` pytree (`params`) beside a static `graphdef`, so every function
here is a plain `jax.jit` with explicit shardings (the pjit style). A model with LoRA adapters
travels as `models.lora.Adapted` (its adapters, which train, and its frozen base): gradients, the
optimizer state and its updates cover the adapters only (`trainable(params)`), the base only
flows through the forward.

    logprob_fn = make_logprob_fn(graphdef, mesh, param_shardings)
    logp = logprob_fn(params, input_ids, attention_mask, response_mask)  # [S, L]
    step_fn = make_update_step(graphdef, tx, micro_loss, num_micro, PolicyRows.spec(), mesh, ...)
    params, opt_state, metrics = step_fn(params, opt_state, minibatch)   # one optimizer update
    step = make_budget_update(graphdef, tx, micro_loss, PolicyRows.spec(weighted=True), mesh, ...)
    micros = budget_micros(rows, lengths, budget, ladder, shards, mesh)  # weighted rows, on device
    params, opt_state, metrics = budget_update(step, params, opt_state, micros)

Batches are the typed rows of `rl.batching` (`TokenRows`, `PolicyRows`, `CriticRows`): a step is
made for the batch's `spec`, which gives its shardings (`batch_shardings`).

Memory: log-probs (and, for the train step, the per-token entropies) are computed from the final
hidden states in sequence chunks (`LOGPROB_CHUNK` tokens at a time, rematerialized in the backward
pass), so the [S, L, vocab] fp32 logits of a 152k-vocab model never exist at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hgpo_jax import distributed as dist
from hgpo_jax.models.lora import Adapted, merge_params, trainable, with_trainable
from hgpo_jax.models.sharding import BATCH_AXES, param_sharding
from hgpo_jax.rl.batching import MicroBatch, take_micro, token_budget_micro_batches
from hgpo_jax.rl.loss import softmax_entropy

LOGPROB_CHUNK = 128
BUDGET_CHUNK_DIVISOR = 8  # token-budget micro-batches: budget / 8 logit positions per device at a time


# --------------------------------------------------------------------------- shardings
def batch_sharding(mesh: Mesh | None, ndim: int):
    """Rows over the (data, fsdp) axes, everything else replicated."""
    if mesh is None:
        return None
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def batch_shardings(mesh: Mesh | None, spec):
    """The shardings of a typed batch (`rl.batching.TokenRows.spec`, or any pytree of arrays):
    each array's rows over the (data, fsdp) axes. Without a mesh, None."""
    if mesh is None:
        return None
    return jax.tree.map(lambda x: batch_sharding(mesh, x.ndim), spec)


def on_mesh(batch, mesh: Mesh | None):
    """A typed batch of this process's host rows -> the global batch the jitted steps take, every
    process feeding its rows (`distributed.global_tree`; one process: the batch as it is)."""
    return dist.global_tree(batch, batch_shardings(mesh, batch))


def _dotted(path) -> str:
    """A jax key path into an nnx.State -> 'model.layers.0.mlp.up_proj.kernel'."""
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    if parts and parts[-1] == "value":  # the Variable's own value field
        parts.pop()
    return ".".join(parts)


def param_shardings(mesh: Mesh, params: nnx.State):
    """NamedSharding of every parameter (same tree as `params`)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: param_sharding(mesh, _dotted(path), x.shape), params)


def shard_params(params: nnx.State, mesh: Mesh | None) -> nnx.State:
    """Place params into their shardings (no-op without a mesh)."""
    if mesh is None:
        return params
    return jax.device_put(params, param_shardings(mesh, params))


def opt_state_shardings(tx: optax.GradientTransformation, params: nnx.State, mesh: Mesh):
    """Shardings of `tx`'s state for `params` (concrete or abstract): moments follow their
    parameter's sharding, scalars (step counts) are replicated over the mesh."""
    return optax.tree_map_params(tx, lambda _, s: s, jax.eval_shape(tx.init, params),
                                 param_shardings(mesh, params),
                                 transform_non_params=lambda _: NamedSharding(mesh, P()))


def init_opt_state(tx: optax.GradientTransformation, params: nnx.State, mesh: Mesh | None = None):
    """(optimizer state, its shardings) of what trains (`trainable(params)`: the adapters of an
    `Adapted`); shardings are None without a mesh."""
    params = trainable(params)
    if mesh is None:
        return jax.jit(tx.init)(params), None
    shardings = opt_state_shardings(tx, params, mesh)
    return jax.jit(tx.init, out_shardings=shardings)(params), shardings


# --------------------------------------------------------------------------- log-probs
def token_logprobs(model, input_ids, attention_mask, chunk: int = LOGPROB_CHUNK, *,
                   with_entropy: bool = False, response_mask=None, window: int | None = None,
                   temperature: float = 1.0):
    """log p(token_t | tokens_<t) for every position: float32 [S, L] (position 0 gets 0).

    input_ids, attention_mask: int [S, L], right-padded rows.
    temperature (static float > 0): the distribution is softmax(logits / temperature), the one
      the sampler draws from at that temperature (verl-agent scores log-probs, entropies and the
      KL to the reference at the rollout temperature; 1.0 leaves the logits as they are).
    with_entropy: also return the entropy of each next-token distribution, float32 [S, L]:
      entropy[:, t] is that of the distribution that predicts token t (the one logp[:, t] is
      taken from), over the full vocabulary of the fp32 logits; position 0 gets 0. Computed in
      the same chunk loop, so it costs no [S, L, V] buffer either, and it is differentiable.
    response_mask [S, L], window (static int): compute the vocabulary projection only for the
      `window` positions from each row's first response token (the response must fit in the
      window: `rl.batching.pack_rows(max_response=...)` checks it on the host). Every layer still
      runs over the whole row; the projection, log-softmax and entropy of the prompt tokens
      (most of a row, and ~40% of a small model's step) are skipped. Positions outside the
      response are 0 then. Without a window, every position is computed.
    Returns logp, or (logp, entropy) with `with_entropy`.
    """
    if not temperature > 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    hidden, _ = model.hidden_states(input_ids, attention_mask=attention_mask,
                                    right_padded=True)  # [S, L, D]
    S, L, _ = hidden.shape
    if window is None:
        # the hidden state at t predicts token t + 1
        targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros((S, 1), input_ids.dtype)], axis=1)
        out = _chunked_logprobs(model, hidden, targets, chunk, with_entropy, temperature)
        out = tuple(jnp.concatenate([jnp.zeros((S, 1), jnp.float32), x[:, :L - 1]], axis=1)
                    for x in out)  # position t holds token t's value
    else:
        if response_mask is None:
            raise ValueError("token_logprobs: a window needs the response_mask")
        h = window_predictors(hidden, response_mask, window)            # [S, W, D]
        rows, pos = response_window(response_mask, window)
        t = input_ids[rows, jnp.clip(pos, 0, L - 1)]                    # [S, W]
        out = _chunked_logprobs(model, h, t, min(chunk, window), with_entropy, temperature)
        out = tuple(window_to_rows(x, response_mask) for x in out)
    return out if with_entropy else out[0]


def response_window(response_mask, window: int):
    """(rows int [S, 1], positions int [S, W]): the token positions of each row's response window,
    its first response token and the `window` - 1 after it (past a row's end where the response
    is shorter; callers clip or mask them). response_mask: [S, L], right-padded rows."""
    start = jnp.argmax(response_mask > 0, axis=1)                        # [S]
    return jnp.arange(response_mask.shape[0])[:, None], start[:, None] + jnp.arange(window)[None, :]


def window_predictors(hidden, response_mask, window: int):
    """The hidden states that predict each response window position (the one before it: the last
    prompt token for the first), [S, W, D] from hidden [S, L, D]; positions past a row's end
    read its last slot (callers mask them)."""
    rows, pos = response_window(response_mask, window)
    return hidden[rows, jnp.clip(pos - 1, 0, hidden.shape[1] - 1)]


def window_to_rows(x, response_mask):
    """A window array [S, W] back at its rows' token positions: [S, L], 0 outside the response."""
    S, L = response_mask.shape
    rows, pos = response_window(response_mask, x.shape[1])
    out = jnp.zeros((S, L), x.dtype).at[rows, pos].set(x, mode="drop")
    return jnp.where(response_mask > 0, out, 0)


def _chunked_logprobs(model, hidden, targets, chunk: int, with_entropy: bool,
                      temperature: float):
    """(log p(targets | hidden),) or (logp, entropy), float32 [S, N], from hidden [S, N, D] and
    targets int [S, N], `chunk` positions at a time (rematerialized in the backward pass), of
    softmax(logits / temperature)."""
    S, N, D = hidden.shape
    pad = (-N) % chunk
    n = (N + pad) // chunk
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(S, n, chunk, D).swapaxes(0, 1)
    t = jnp.pad(targets, ((0, 0), (0, pad))).reshape(S, n, chunk).swapaxes(0, 1)  # [n, S, chunk]

    @jax.checkpoint
    def one_chunk(args):
        hc, tc = args
        logits = model.logits(hc).astype(jnp.float32)          # [S, chunk, V]
        if temperature != 1.0:
            logits = logits / temperature
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        if not with_entropy:
            return (picked - logz,)
        return picked - logz, softmax_entropy(logits, logz)

    return tuple(x.swapaxes(0, 1).reshape(S, n * chunk)[:, :N]
                 for x in jax.lax.map(one_chunk, (h, t)))


def budget_window_chunk(rows: int, length: int, window: int | None, budget: int,
                        shards: int = 1) -> tuple[int | None, int]:
    """(window, chunk) of `token_logprobs` for a token-budget micro-batch of rows x length
    (global rows, split over `shards` batch shards) under a budget of `budget` tokens per device.

    The window is cut to the row length (a response is never longer than its row, so nothing
    changes but the cost of the short micro-batches), and the chunk so that each device projects
    at most budget / BUDGET_CHUNK_DIVISOR positions on the vocabulary at a time: a micro-batch of
    many short rows would otherwise hold rows x LOGPROB_CHUNK fp32 logits rows at once. The chunk
    is the largest that cuts the window into equal parts under that bound (no padded positions)."""
    window = None if window is None else min(window, length)
    per_device = max(1, rows // max(shards, 1))
    span = length if window is None else window
    most = max(1, min(LOGPROB_CHUNK, span, budget // BUDGET_CHUNK_DIVISOR // per_device))
    return window, -(-span // -(-span // most))  # equal chunks: no padded positions in the last


def batch_shards(mesh: Mesh | None) -> int:
    """Devices along the batch axes (data x fsdp): how many ways a batch's rows are split."""
    if mesh is None:
        return 1
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def make_logprob_fn(graphdef, mesh: Mesh | None = None, shardings=None, window: int | None = None,
                    token_budget: int = 0, temperature: float = 1.0):
    """jit(params, input_ids [S, L], attention_mask [S, L], response_mask [S, L]) -> logp
    float32 [S, L] (`token_logprobs` at `temperature`; with a `window`, 0 outside the response).
    token_budget: the tokens per device of token-budget micro-batches (0: fixed micro-batches);
    each shape then gets its window and chunk from `budget_window_chunk` (same values)."""
    shards = batch_shards(mesh)

    def fn(params, input_ids, attention_mask, response_mask):
        w, chunk = window, LOGPROB_CHUNK
        if token_budget:
            w, chunk = budget_window_chunk(*input_ids.shape, window, token_budget, shards)
        return token_logprobs(merge_params(graphdef, params), input_ids, attention_mask, chunk,
                              response_mask=response_mask, window=w, temperature=temperature)

    if mesh is None:
        return jax.jit(fn)
    b2 = batch_sharding(mesh, 2)
    return jax.jit(fn, in_shardings=(shardings, b2, b2, b2), out_shardings=b2)


# --------------------------------------------------------------------------- the update
def _parts(params) -> tuple:
    """(what trains, the frozen base or None)."""
    return (params.train, params.frozen) if isinstance(params, Adapted) else (params, None)


def _joined(train, frozen):
    return train if frozen is None else Adapted(train, frozen)


def make_optimizer(lr: float, *, weight_decay: float = 0.01, max_grad_norm: float = 1.0,
                   warmup_steps: int = 0, schedule: str = "constant", total_steps: int = 1,
                   b1: float = 0.9, b2: float = 0.999) -> optax.GradientTransformation:
    """AdamW with global-norm clipping and a constant or cosine LR schedule (linear warmup)."""
    if schedule == "constant":
        sched = (optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps else
                 optax.constant_schedule(lr))
        if warmup_steps:
            sched = optax.join_schedules([sched, optax.constant_schedule(lr)], [warmup_steps])
    elif schedule == "cosine":
        sched = optax.warmup_cosine_decay_schedule(0.0 if warmup_steps else lr, lr, warmup_steps,
                                                   max(total_steps, warmup_steps + 1))
    else:
        raise ValueError(f"unknown LR schedule {schedule!r}; use 'constant' or 'cosine'")
    return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                       optax.adamw(sched, b1=b1, b2=b2, weight_decay=weight_decay))


def _tree_all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def apply_gradients(tx: optax.GradientTransformation, params, opt_state, grads, loss, metrics):
    """(params, opt_state, metrics) after one optimizer update with the mini-batch's `grads`,
    `loss` and `metrics` (a dict of scalars): skipped, params and state unchanged, when the loss
    or a gradient is not finite. Metrics: `train/<metric>`, `train/loss`, `train/grad_norm`,
    `train/skipped_nonfinite`."""
    finite = jnp.isfinite(loss) & _tree_all_finite(grads)

    def update(_):
        updates, new_opt = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt

    # a branch rather than an elementwise select of new vs old over the whole state: a
    # skipped update does no optimizer work and returns the inputs as they were
    new_params, new_opt = jax.lax.cond(finite, update, lambda _: (params, opt_state), None)
    out = {f"train/{k}": v for k, v in metrics.items()}
    out.update({"train/loss": loss, "train/grad_norm": optax.tree.norm(grads),
                "train/skipped_nonfinite": 1.0 - finite.astype(jnp.float32)})
    return new_params, new_opt, out


def make_update_step(graphdef, tx: optax.GradientTransformation, micro_loss, num_micro: int,
                     batch_spec, mesh: Mesh | None = None, shardings=None, opt_shardings=None):
    """jit(params, opt_state, mb) -> (params, opt_state, metrics): one optimizer update of any
    loss `micro_loss(model, micro) -> (loss, metrics)` (the PPO-KL loss, the supervised NLL).

    mb: a typed batch of [M, ...] arrays (`rl.batching.TokenRows` or a subclass) with the fields
    and ranks of `batch_spec` (`<class>.spec(...)`); M = num_micro * micro rows.
    Gradients are accumulated over `num_micro` micro-batches with `lax.scan` and averaged. A
    non-finite loss or gradient skips the update (params and optimizer state are returned
    unchanged) and reports `train/skipped_nonfinite` = 1. Metrics: `train/<metric>` (averaged
    over micro-batches), `train/loss`, `train/grad_norm`.
    """
    def loss_of_params(train, frozen, micro):
        return micro_loss(merge_params(graphdef, _joined(train, frozen)), micro)

    grad_fn = jax.value_and_grad(loss_of_params, has_aux=True)  # of what trains only

    def step(train, opt_state, mb, frozen):
        # micro-batch j = rows j, j + num_micro, j + 2 num_micro, ...: every micro-batch is
        # spread over all batch shards (a contiguous split would put whole micro-batches on one
        # shard, and XLA would then run each micro-batch unsharded on every device)
        micros = jax.tree.map(
            lambda x: x.reshape(-1, num_micro, *x.shape[1:]).swapaxes(0, 1), mb)

        def body(acc, micro):
            # tie the weights to this micro-batch so XLA cannot hoist per-layer work on them (the
            # FSDP all-gathers) out of the loop, which would keep whole gathered copies alive
            p, fp, micro = jax.lax.optimization_barrier((train, frozen, micro))
            (loss, metrics), grads = grad_fn(p, fp, micro)
            acc_grads, acc_loss, acc_metrics = acc
            return (jax.tree.map(jnp.add, acc_grads, grads), acc_loss + loss,
                    jax.tree.map(jnp.add, acc_metrics, metrics)), None

        zeros = jax.tree.map(jnp.zeros_like, train)
        _, metric_shape = jax.eval_shape(loss_of_params, train, frozen,
                                         jax.tree.map(lambda x: x[0], micros))
        zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shape)
        (grads, loss, metrics), _ = jax.lax.scan(body, (zeros, 0.0, zero_metrics), micros)
        grads = jax.tree.map(lambda g: g / num_micro, grads)
        loss = loss / num_micro
        metrics = jax.tree.map(lambda m: m / num_micro, metrics)
        return apply_gradients(tx, train, opt_state, grads, loss, metrics)

    if mesh is None:
        return SplitStep(jax.jit(step, donate_argnums=(0, 1)))
    train_sh, frozen_sh = _parts(shardings)
    return SplitStep(jax.jit(
        step, in_shardings=(train_sh, opt_shardings, batch_shardings(mesh, batch_spec), frozen_sh),
        out_shardings=(train_sh, opt_shardings, None), donate_argnums=(0, 1)))


class SplitStep:
    """`step(params, opt_state, batch) -> (params, opt_state, metrics)` over a jitted
    `fn(train, opt_state, batch, frozen) -> (train, opt_state, metrics)`: what trains and its
    optimizer state are donated, a LoRA run's frozen base never is (the KL reference shares
    it). `lower` as a jit's, for the plan."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, params, opt_state, batch):
        train, frozen = _parts(params)
        new_train, new_opt, metrics = self.fn(train, opt_state, batch, frozen)
        return with_trainable(params, new_train), new_opt, metrics

    def lower(self, params, opt_state, batch):
        train, frozen = _parts(params)
        return self.fn.lower(train, opt_state, batch, frozen)


class BudgetStep(NamedTuple):
    """The jitted parts of one token-budget update (`budget_update` runs them):

    init(params) -> acc: zero gradients, loss and metrics;
    accumulate(params, acc, micro) -> acc + the micro-batch's (gradients, loss, metrics), one
      compiled program per micro-batch shape (acc is donated);
    apply(params, opt_state, acc) -> (params, opt_state, metrics): `apply_gradients` (params
      and opt_state are donated)."""

    init: Callable
    accumulate: Callable
    apply: Callable


def make_budget_update(graphdef, tx: optax.GradientTransformation, micro_loss,
                       batch_spec, mesh: Mesh | None = None, shardings=None,
                       opt_shardings=None) -> BudgetStep:
    """The parts of an optimizer update over micro-batches of any shapes, for a `micro_loss`
    whose sum over the micro-batches is the mini-batch's loss (`ppo_budget_micro_loss`).
    batch_spec: the micro-batches' fields and ranks (`<class>.spec(...)` of one row; any rows and
    length run).
    Without a mesh, plain jits."""
    def loss_of_params(train, frozen, micro):
        return micro_loss(merge_params(graphdef, _joined(train, frozen)), micro)

    grad_fn = jax.value_and_grad(loss_of_params, has_aux=True)  # of what trains only
    metric_keys = []  # found by tracing the loss once, on the first init

    def accumulate(params, acc, micro):
        (loss, metrics), grads = grad_fn(*_parts(params), micro)
        return jax.tree.map(jnp.add, acc, (grads, loss, metrics))

    def apply(train, opt_state, acc, frozen):  # frozen: SplitStep's signature
        return apply_gradients(tx, train, opt_state, *acc)

    def zeros(params):
        return (jax.tree.map(jnp.zeros_like, trainable(params)), jnp.zeros((), jnp.float32),
                {k: jnp.zeros((), jnp.float32) for k in metric_keys})

    if mesh is None:
        jit_zeros = jax.jit(zeros)
        jit_acc = jax.jit(accumulate, donate_argnums=(1,))
        jit_apply = SplitStep(jax.jit(apply, donate_argnums=(0, 1)))
    else:
        rep = NamedSharding(mesh, P())
        mb = batch_shardings(mesh, batch_spec)
        acc_sh = (trainable(shardings), rep, rep)
        jit_zeros = jax.jit(zeros, in_shardings=(shardings,), out_shardings=acc_sh)
        jit_acc = jax.jit(accumulate, in_shardings=(shardings, acc_sh, mb), out_shardings=acc_sh,
                          donate_argnums=(1,))
        train_sh, frozen_sh = _parts(shardings)
        jit_apply = SplitStep(jax.jit(apply, in_shardings=(train_sh, opt_shardings, acc_sh, frozen_sh),
                                      out_shardings=(train_sh, opt_shardings, None),
                                      donate_argnums=(0, 1)))

    def init(params):
        if not metric_keys:
            rows = batch_shards(mesh)  # a micro-batch of one row per device, of the spec's length
            micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct((rows,) + x.shape[1:], x.dtype),
                                 batch_spec)
            _, metric_shape = jax.eval_shape(loss_of_params, *_parts(params), micro)
            metric_keys.extend(sorted(metric_shape))
        return jit_zeros(params)

    return BudgetStep(init, jit_acc, jit_apply)


def budget_plan(lengths: np.ndarray, budget: int, ladder, shards: int) -> list[MicroBatch]:
    """Token-budget micro-batches (`rl.batching.token_budget_micro_batches`) of this process's
    rows of `lengths` [N] (0: left out), planned over every process's lengths (one allgather), so
    that all processes run the same shapes. shards: batch shards per process."""
    every = np.asarray(dist.allgather_json([int(x) for x in lengths]), np.int64)  # [P, N]
    return token_budget_micro_batches(every, budget, ladder, shards=shards)


def budget_micros(local, lengths: np.ndarray, budget: int, ladder, shards: int, mesh):
    """The token-budget micro-batches of one mini-batch, device-ready, one at a time (for
    `budget_update`). local: this process's rows (a typed batch with its row weights, the same
    count on every process); lengths [M]: each row's tokens (0: a row that adds nothing, left
    out); shards: batch shards per process."""
    me = jax.process_index()
    plan = budget_plan(lengths, budget, ladder, shards)
    return (on_mesh(take_micro(local, m.rows[me], m.length), mesh) for m in plan)


def budget_update(step: BudgetStep, params, opt_state, micros: Iterable[dict]):
    """(params, opt_state, metrics): one optimizer update, gradients accumulated over `micros`
    (device-ready micro-batches, any shapes; none is a valid, zero-gradient update, as a
    mini-batch of inert rows is in the fixed form). Host loop; the steps are `step`'s jits."""
    acc = step.init(params)
    for micro in micros:
        acc = step.accumulate(params, acc, micro)
    return step.apply(params, opt_state, acc)
