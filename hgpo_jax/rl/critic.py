"""PPO with a critic (`algo.estimator: ppo`), device side: values, GAE, whitening, value loss
(its unit in the trainer's loop: `hgpo_jax.rl.algorithms.critic`).

What verl-agent's PPO baseline computes (docs/ppo_spec.md, from its run scripts,
`core_algos.compute_gae_advantage_return` / `compute_value_loss` and the critic worker):

- Every step of an episode is its own row, and the rows of an episode are not linked: a row's
  reward is the whole episode's reward (10 x won) minus `invalid_penalty` when the step's reply
  was invalid, placed on its last response token; there is no bootstrap from the next step.
- The critic is the policy's decoder with a scalar head (`models.CriticModel`, started from the policy's
  weights). V_t, the value before response token t, is the head's output at the token before it
  (the last prompt token for t = 0). Values are kept for t <= L (L the response length; t < W):
  one position more than the response, the state after the last token, whose return is 0.
- GAE over the row's whole window with V = 0 outside that mask and 0 after the window:
  delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}; returns = A + V (before
  whitening); A is then whitened over every response token of the batch (mean, unbiased
  variance, A <- (A - mean) / sqrt(var + 1e-8)). With the defaults gamma = lam = 1, A_t = r - V_t
  and the return is r on every response token.
- Value loss: max((v - R)^2, (clip(v, V_old - c, V_old + c) - R)^2), token-mean over the value
  mask (no 1/2), c = `critic.cliprange_value` (0.5); values for GAE and for the clip come from the
  critic before this iteration's update.

Layout: every [S, W] array here is a row's response window (`rl.update.response_window`): column t
is response token t, W = rollout.max_new_tokens (verl's response_length). `rl.update.window_to_rows`
puts a window array back at the rows' token positions [S, L] for the actor's loss.

Heads: a critic may have H value heads (`models.CriticModel(num_heads=H)`). With one head (PPO)
values and returns are [S, W] as above; with H > 1 they carry a trailing head axis, [S, W, H], and
the critic's loss (`critic_value_loss`) is the sum over heads of each head's clipped value loss,
each over its own value mask. GAE and whitening (`gae_advantages`) read one head's [S, W] values.

Token budgets (`train.max_tokens_per_micro_batch`): the critic's update runs over the same kind
of token-budget micro-batches as the policy's (`make_critic_budget_step`), each row weighted per
head as its fixed micro-batch's token-mean weighs it (`critic_micro_weights`), so the loss,
gradient and metrics are the fixed micro-batches'.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from hgpo_jax.algo_specs import ALGORITHMS
from hgpo_jax.models.lora import merge_params, split_params
from hgpo_jax.rl.batching import CriticRows, fixed_micro_weights, head_axis
from hgpo_jax.rl.loss import mean_over
from hgpo_jax.rl.update import (BudgetStep, batch_sharding, budget_update, make_budget_update,
                               make_update_step, window_predictors, window_to_rows)

# algo.estimator of the run whose critic this module serves (its declaration's family "critic")
ESTIMATOR = next(name for name, spec in ALGORITHMS.items() if spec.family == "critic")
WHITEN_EPS = 1e-8


def window_masks(response_mask, window: int):
    """(token_mask, value_mask), float32 [S, W]: t < L, and t <= L for rows with a response (the
    values and the value loss cover one position more than the response). response_mask [S, L]."""
    length = jnp.sum(response_mask > 0, axis=1)[:, None]                  # [S, 1]
    t = jnp.arange(window)[None, :]
    return ((t < length).astype(jnp.float32),
            ((t <= length) & (length > 0)).astype(jnp.float32))


def token_values(critic, input_ids, attention_mask, response_mask, window: int):
    """V_t for each response window position: float32 [S, W] for a critic of one head, [S, W, H]
    for H > 1 heads; 0 outside the value mask. input_ids, attention_mask, response_mask: [S, L],
    right-padded rows."""
    hidden, _ = critic.hidden_states(input_ids, attention_mask=attention_mask, right_padded=True)
    h = window_predictors(hidden, response_mask, window)                    # [S, W, D]
    values = critic.values(h)                                               # [S, W] or [S, W, H]
    value_mask = window_masks(response_mask, window)[1]                    # [S, W]
    return values * (value_mask if values.ndim == 2 else value_mask[..., None])


def row_rewards_window(rewards, response_mask, window: int):
    """Each row's reward on its last response token: float32 [S, W]. rewards: [S]."""
    length = jnp.sum(response_mask > 0, axis=1)
    t = jnp.arange(window)[None, :]
    return jnp.where(t == (length - 1)[:, None], rewards[:, None].astype(jnp.float32), 0.0)


def gae(rewards, values, gamma: float, lam: float):
    """(advantages, returns), float32 [S, W], by GAE over the whole window (no masking inside; a
    value after the window is 0). rewards, values: [S, W]."""
    def body(next_adv_value, xs):
        next_adv, next_value = next_adv_value
        r, v = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        return (adv, v), adv

    zeros = jnp.zeros(rewards.shape[:1], jnp.float32)
    _, adv = jax.lax.scan(body, (zeros, zeros), (rewards.T.astype(jnp.float32),
                                                 values.T.astype(jnp.float32)), reverse=True)
    adv = adv.T
    return adv, adv + values


def whiten_over(x, mask, eps: float = WHITEN_EPS):
    """(x - mean) / sqrt(var + eps) with the mean and the unbiased variance over the masked
    entries (all of the batch); a mask of one entry has variance 0."""
    n = jnp.sum(mask)
    mean = mean_over(x, mask)
    var = mean_over(jnp.square(x - mean), mask) * n / jnp.maximum(n - 1.0, 1.0)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def gae_advantages(rewards, values, response_mask, window: int, gamma: float, lam: float):
    """(advantages [S, L] at the response tokens (0 elsewhere), returns [S, W], metrics): the
    whole batch's GAE and whitening. rewards: [S] (episode reward minus the step's penalty);
    values [S, W] from `token_values`; response_mask [S, L]."""
    token_mask, value_mask = window_masks(response_mask, window)
    adv, returns = gae(row_rewards_window(rewards, response_mask, window), values, gamma, lam)
    adv = whiten_over(adv, token_mask)
    metrics = {"critic/values_mean": mean_over(values, value_mask),
               "critic/returns_mean": mean_over(returns, token_mask),
               "critic/advantages_mean_raw": mean_over(returns - values, token_mask)}
    return window_to_rows(adv * token_mask, response_mask), returns, metrics


def clipped_square_errors(vpred, old_values, returns, clip: float):
    """(l1, l2): (v - R)^2 and (clip(v, V_old - c, V_old + c) - R)^2, elementwise (any shape)."""
    clipped = old_values + jnp.clip(vpred - old_values, -clip, clip)
    return jnp.square(vpred - returns), jnp.square(clipped - returns)


def value_loss(vpred, old_values, returns, value_mask, clip: float):
    """(loss, metrics): one head's clipped value loss, token-mean over `value_mask` (0 when the
    mask is empty), and the fraction of positions where the clipped term is the larger. All
    [S, W]."""
    l1, l2 = clipped_square_errors(vpred, old_values, returns, clip)
    loss = mean_over(jnp.maximum(l1, l2), value_mask)
    return loss, {"vf_loss": loss, "vf_clipfrac": mean_over((l2 > l1).astype(jnp.float32), value_mask),
                  "vpred_mean": mean_over(vpred, value_mask)}


def head_value_mask(value_mask, shape: tuple[int, ...]):
    """A value mask for values of `shape` ([S, W] or [S, W, H]): [S, W] as it is for one head; for
    H heads [S, W, H], each head's own, or [S, W], the same for every head (broadcast). Raises
    ValueError on any other shape."""
    mask_shape = tuple(value_mask.shape)
    if mask_shape == tuple(shape):
        return value_mask
    if len(shape) == 3 and mask_shape == tuple(shape[:2]):
        return jnp.broadcast_to(value_mask[..., None], shape)
    raise ValueError(f"a value mask of shape {mask_shape} does not fit values of shape "
                     f"{tuple(shape)}: give [S, W], or [S, W, H] (one mask per head)")


def value_positions(response_mask, value_mask, shape: tuple[int, ...]):
    """float32 of `shape` ([S, W] or [S, W, H]): where a critic's values are trained, the window's
    value positions (`window_masks`, W = shape[1]) of every head, within each head's own
    `value_mask` where the rows carry one (None: all of them). response_mask [S, L]."""
    mask = head_value_mask(window_masks(response_mask, shape[1])[1], shape)
    return mask if value_mask is None else mask * value_mask


def critic_value_loss(vpred, old_values, returns, value_mask, clip: float):
    """(loss, metrics): the critic's value loss over its heads.

    One head: vpred, old_values, returns, value_mask [S, W], `value_loss` as it is.
    H > 1 heads: vpred, old_values, returns [S, W, H]; value_mask [S, W, H] (each head's own
    positions) or [S, W] (the same for every head). The loss is the sum over heads of each head's
    `value_loss` (its token-mean over its own mask; a head whose mask is empty adds 0). Metrics:
    vf_loss (that sum), vf_clipfrac and vpred_mean over every head's masked positions together,
    and per head `vf_loss/head{h}`, `vf_clipfrac/head{h}`, `vpred_mean/head{h}`.
    """
    if not vpred.shape == old_values.shape == returns.shape:
        raise ValueError(f"critic_value_loss: vpred {vpred.shape}, old_values {old_values.shape} "
                         f"and returns {returns.shape} must have one shape ([S, W] or [S, W, H])")
    mask = head_value_mask(value_mask, vpred.shape)
    if vpred.ndim == 2:
        return value_loss(vpred, old_values, returns, mask, clip)
    per_head = [value_loss(vpred[..., h], old_values[..., h], returns[..., h], mask[..., h], clip)
                for h in range(vpred.shape[-1])]
    loss = sum(head_loss for head_loss, _ in per_head)
    l1, l2 = clipped_square_errors(vpred, old_values, returns, clip)
    metrics = {"vf_loss": loss, "vf_clipfrac": mean_over((l2 > l1).astype(jnp.float32), mask),
               "vpred_mean": mean_over(vpred, mask)}
    for h, (_, head_metrics) in enumerate(per_head):
        metrics.update({f"{name}/head{h}": v for name, v in head_metrics.items()})
    return loss, metrics


def critic_micro_loss(clip: float, window: int):
    """micro_loss(critic, micro: `CriticRows`) -> (loss, metrics) for `make_update_step`: the
    critic's `critic_value_loss` over the window's value positions, or only those of the rows'
    `value_mask` (each head's own targets) when they carry one."""
    def micro_loss(critic, micro: CriticRows):
        vpred = token_values(critic, micro.input_ids, micro.attention_mask, micro.response_mask,
                             window)
        value_mask = value_positions(micro.response_mask, micro.value_mask, vpred.shape)
        loss, metrics = critic_value_loss(vpred, micro.values, micro.returns, value_mask, clip)
        return loss, jax.tree.map(jax.lax.stop_gradient, metrics)
    return micro_loss


def critic_budget_micro_loss(clip: float, window: int):
    """micro_loss(critic, micro) -> (loss, metrics) for token-budget micro-batches (`CriticRows`
    with its row weights, `critic_micro_weights`): `critic_micro_loss`'s value loss and metrics as
    sums of per-position terms weighted by the rows' head_weight (each head's loss and metrics)
    and value_weight (the metrics over every head's positions), so that their sum over a
    mini-batch's micro-batches, in any grouping, is the mean over the fixed micro-batches of
    `critic_micro_loss`. The window is cut to the micro-batch's length (no response is longer)."""
    def micro_loss(critic, micro: CriticRows):
        w = min(window, micro.input_ids.shape[1])
        vpred = token_values(critic, micro.input_ids, micro.attention_mask, micro.response_mask, w)
        mask = value_positions(micro.response_mask, micro.value_mask, vpred.shape)
        l1, l2 = clipped_square_errors(vpred, micro.values, micro.returns, clip)
        terms = {"vf_loss": jnp.maximum(l1, l2), "vf_clipfrac": (l2 > l1).astype(jnp.float32),
                 "vpred_mean": vpred}
        own = mask * (micro.head_weight[:, None] if vpred.ndim == 2
                      else micro.head_weight[:, None, :])                 # each head's weights
        if vpred.ndim == 2:
            metrics = {k: jnp.sum(x * own) for k, x in terms.items()}
        else:  # the sum over heads of each one's loss; clipfrac and vpred over every position
            every = mask * micro.value_weight[:, None, None]
            metrics = {k: jnp.sum(x * every) for k, x in terms.items()}
            metrics["vf_loss"] = jnp.sum(terms["vf_loss"] * own)
            for h in range(vpred.shape[-1]):
                metrics.update({f"{k}/head{h}": jnp.sum(x[..., h] * own[..., h])
                                for k, x in terms.items()})
        return metrics["vf_loss"], jax.tree.map(jax.lax.stop_gradient, metrics)
    return micro_loss


def value_counts(rows: CriticRows) -> np.ndarray:
    """Each row's value positions (host): int [M] for a critic of one head, [M, H] per head for H
    > 1, counted on `value_positions`, the mask of the critic's losses."""
    mask = value_positions(rows.response_mask, rows.value_mask, np.shape(rows.values))
    return np.asarray(mask).sum(1).astype(np.int64)


def critic_micro_weights(counts, num_micro: int) -> tuple[np.ndarray, np.ndarray]:
    """(head_weight, value_weight): the row weights under which the token-budget critic loss
    (`critic_budget_micro_loss`) is the fixed micro-batches' (`rl.batching.fixed_micro_weights`'
    token-mean, per head and over every head). counts: [P, M] (one head) or [P, M, H], every
    process's `value_counts` of the mini-batch. Returns head_weight of `counts`' shape and
    value_weight [P, M], float32."""
    counts = np.asarray(counts)
    if counts.ndim == 2:
        weight = fixed_micro_weights(counts, num_micro)[0]
        return weight, weight
    head = np.stack([fixed_micro_weights(counts[..., h], num_micro)[0]
                     for h in range(counts.shape[-1])], axis=-1)
    return head, fixed_micro_weights(counts.sum(-1), num_micro)[0]


def _merge_critic(graphdef, params, num_heads: int):
    """The critic of `graphdef` and `params`, checked to have `num_heads` value heads."""
    critic = merge_params(graphdef, params)
    if getattr(critic, "num_heads", 1) != num_heads:
        raise ValueError(f"the critic has {critic.num_heads} value heads but its functions were "
                         f"built for num_heads={num_heads}; pass num_heads={critic.num_heads}")
    return critic


def make_value_fn(graphdef, window: int, mesh: Mesh | None = None, shardings=None,
                  num_heads: int = 1):
    """jit(critic params, input_ids, attention_mask, response_mask [S, L]) -> values [S, W]
    (num_heads=1) or [S, W, H] (num_heads=H > 1)."""
    def fn(params, input_ids, attention_mask, response_mask):
        return token_values(_merge_critic(graphdef, params, num_heads), input_ids, attention_mask,
                            response_mask, window)

    if mesh is None:
        return jax.jit(fn)
    b2 = batch_sharding(mesh, 2)
    out = batch_sharding(mesh, 2 + len(head_axis(num_heads)))
    return jax.jit(fn, in_shardings=(shardings, b2, b2, b2), out_shardings=out)


def make_gae_fn(window: int, gamma: float, lam: float, mesh: Mesh | None = None):
    """jit(rewards [S], values [S, W], response_mask [S, L]) -> `gae_advantages`' output, over the
    whole (global) batch: the whitening statistics are the batch's, whatever its sharding."""
    fn = functools.partial(gae_advantages, window=window, gamma=gamma, lam=lam)
    if mesh is None:
        return jax.jit(fn)
    b1, b2 = batch_sharding(mesh, 1), batch_sharding(mesh, 2)
    return jax.jit(fn, in_shardings=(b1, b2, b2), out_shardings=(b2, b2, None))


def make_critic_step(graphdef, tx, clip: float, window: int, num_micro: int,
                     mesh: Mesh | None = None, shardings=None, opt_shardings=None,
                     num_heads: int = 1, value_masks: bool = False):
    """jit(critic params, opt_state, mb) -> (params, opt_state, metrics): one critic update on a
    mini-batch (`CriticRows`, values and returns [M, W], or [M, W, H] for num_heads=H > 1),
    micro-batch token-means averaged (as verl's accumulation); metrics `train/vf_loss`,
    `train/vf_clipfrac`, ... (`critic_value_loss`) are renamed `critic/...` by the caller.
    value_masks: the mini-batches carry `CriticRows.value_mask`."""
    spec = CriticRows.spec(num_heads=num_heads, include=("value_mask",) if value_masks else ())
    return make_update_step(graphdef, tx, critic_micro_loss(clip, window), num_micro, spec, mesh,
                            shardings, opt_shardings)


def make_critic_budget_step(graphdef, tx, clip: float, window: int, mesh: Mesh | None = None,
                            shardings=None, opt_shardings=None, num_heads: int = 1,
                            value_masks: bool = False) -> BudgetStep:
    """`make_critic_step`'s update over token-budget micro-batches (`CriticRows` with their row
    weights, of any rows and length; run it with `rl.update.budget_update`): the fixed
    micro-batches' loss, gradients and metrics."""
    spec = CriticRows.spec(num_heads=num_heads, weighted=True,
                           include=("value_mask",) if value_masks else ())
    return make_budget_update(graphdef, tx, critic_budget_micro_loss(clip, window), spec, mesh,
                              shardings, opt_shardings)


# --------------------------------------------------------------------------- the run's critic
def critic_optimizer(cfg):
    """The critic's AdamW (`cfg.critic`: constant lr after an optional linear warm-up)."""
    from hgpo_jax.rl.update import make_optimizer

    c = cfg.critic
    return make_optimizer(c.lr, weight_decay=c.weight_decay, max_grad_norm=c.max_grad_norm,
                          warmup_steps=c.warmup_steps, schedule="constant", b1=c.b1, b2=c.b2)


@flax.struct.dataclass
class CriticState:
    """A PPO run's value model on device: its params and AdamW state (one pytree; a checkpoint
    holds it as {"params", "opt_state"} under "critic")."""

    params: Any
    opt_state: Any


class Critic:
    """A PPO run's value model: its jitted functions and shardings on the run's mesh (its arrays
    are a `CriticState`, part of the run's device state).

    `Critic.build` makes it from the policy at the start of the run
    (`models.critic.critic_from_policy`: the policy's backbone, a new head seeded with `seed`).
    A LoRA policy's critic has its own adapters and head on the policy's frozen base (the same
    arrays): its params are a `models.lora.Adapted`, its optimizer state covers what trains.
    """

    def __init__(self, cfg, graphdef, shardings, opt_shardings, mesh: Mesh, num_micro: int,
                 num_heads: int = 1, value_masks: bool = False):
        c, window = cfg.critic, cfg.rollout.max_new_tokens
        self.graphdef, self.shardings, self.opt_shardings = graphdef, shardings, opt_shardings
        self.num_heads = num_heads
        self.tx = critic_optimizer(cfg)
        self.value_fn = make_value_fn(graphdef, window, mesh, shardings, num_heads)
        self.gae_fn = make_gae_fn(window, cfg.algo.gamma, cfg.algo.lam, mesh)  # one head's values
        self.step_fn = make_critic_step(graphdef, self.tx, c.cliprange_value, window, num_micro,
                                        mesh, shardings, opt_shardings, num_heads, value_masks)
        self.budget_step = make_critic_budget_step(  # train.max_tokens_per_micro_batch (0: none)
            graphdef, self.tx, c.cliprange_value, window, mesh, shardings, opt_shardings,
            num_heads, value_masks) if cfg.train.max_tokens_per_micro_batch else None

    @classmethod
    def build(cls, cfg, policy, mesh: Mesh, num_micro: int, seed: int = 0,
              num_heads: int = 1, value_masks: bool = False) -> tuple[Critic, CriticState]:
        """(the critic's functions, its initial state) from the policy, with `num_heads` value
        heads (values [S, W] for one, [S, W, H] for H > 1); value_masks: its mini-batches carry
        each head's target positions (`CriticRows.value_mask`)."""
        from hgpo_jax.models.critic import critic_from_policy
        from hgpo_jax.rl.update import init_opt_state, param_shardings, shard_params

        graphdef, params = split_params(critic_from_policy(policy, seed, num_heads))
        shardings = param_shardings(mesh, params)
        params = shard_params(params, mesh)  # placed already: no copy of a shared frozen base
        opt_state, opt_shardings = init_opt_state(critic_optimizer(cfg), params, mesh)
        return (cls(cfg, graphdef, shardings, opt_shardings, mesh, num_micro, num_heads,
                    value_masks),
                CriticState(params, opt_state))

    def update(self, state: CriticState, mb: CriticRows) -> tuple[CriticState, dict]:
        """One critic optimizer step on mini-batch `mb` -> (state, metrics
        `critic/...`)."""
        return _critic_result(*self.step_fn(state.params, state.opt_state, mb))

    def budget_update(self, state: CriticState, micros) -> tuple[CriticState, dict]:
        """`update` over a mini-batch's token-budget micro-batches (`CriticRows` with their row
        weights, device-ready): the same step."""
        return _critic_result(*budget_update(self.budget_step, state.params, state.opt_state,
                                             micros))


def _critic_result(params, opt_state, metrics) -> tuple[CriticState, dict]:
    """(state, metrics `critic/...`) of an update's (params, opt_state, metrics `train/...`)."""
    return CriticState(params, opt_state), {"critic/" + k.split("/", 1)[1]: v
                                            for k, v in metrics.items()
                                            if k != "train/loss"}  # the loss is vf_loss
