"""The PPO-KL update of the policy, as pure jitted functions on the shared update machinery
(`hgpo_jax.rl.update`: shardings, log-probs, optimizer, micro-batched and token-budget updates):

    step_fn = make_train_step(graphdef, tx, loss_cfg, num_micro, mesh, param_shardings, opt_shardings)
    params, opt_state, metrics = step_fn(params, opt_state, minibatch)   # one optimizer update
    budget_step = make_budget_train_step(graphdef, tx, loss_cfg, budget, mesh, param_shardings, ...)
    params, opt_state, metrics = budget_update(budget_step, params, opt_state, micros)  # the same
        # update over token-budget micro-batches of any shapes (rl.batching.token_budget_micro_batches)
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from hgpo_jax.rl.batching import PolicyRows
from hgpo_jax.rl.loss import ppo_kl_loss
from hgpo_jax.rl.update import (BudgetStep, batch_shards, budget_window_chunk, make_budget_update,
                                make_update_step, token_logprobs)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Static settings of `ppo_kl_loss` (hashable: part of the compiled program)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    kl_coef: float = 0.01
    kl_type: str = "low_var_kl"
    agg: str = "token-mean"
    entropy_coef: float = 0.001
    temperature: float = 1.0  # log-probs, entropy and KL of softmax(logits / T): the rollout's T


def ppo_micro_loss(loss_cfg: LossConfig, window: int | None = None):
    """micro_loss(model, micro) -> (loss, metrics) of the PPO-KL objective with entropy bonus
    (`window`: see `token_logprobs`). micro: `PolicyRows`."""
    def micro_loss(model, micro: PolicyRows):
        # the entropy is always computed (for the train/entropy metric); with entropy_coef=0 it
        # is not differentiated
        logp, entropy = token_logprobs(model, micro.input_ids, micro.attention_mask,
                                       with_entropy=True, response_mask=micro.response_mask,
                                       window=window, temperature=loss_cfg.temperature)
        return ppo_kl_loss(logp, micro.old_logp, micro.ref_logp, micro.advantages,
                           micro.response_mask, clip_low=loss_cfg.clip_low,
                           clip_high=loss_cfg.clip_high, dual_clip=loss_cfg.dual_clip,
                           kl_coef=loss_cfg.kl_coef, kl_type=loss_cfg.kl_type, agg=loss_cfg.agg,
                           entropy=entropy, entropy_coef=loss_cfg.entropy_coef)
    return micro_loss


def make_train_step(graphdef, tx: optax.GradientTransformation, loss_cfg: LossConfig,
                    num_micro: int, mesh: Mesh | None = None, shardings=None, opt_shardings=None,
                    window: int | None = None, token_advantages: bool = False):
    """jit(params, opt_state, mb) -> (params, opt_state, metrics): one PPO optimizer update.

    mb: `PolicyRows` of M = num_micro * micro rows, advantages [M] (or [M, L] with
    token_advantages), no row weights. The loss
    includes the entropy bonus (`loss_cfg.entropy_coef`), and `train/entropy` is always logged.
    See `make_update_step`.
    """
    return make_update_step(graphdef, tx, ppo_micro_loss(loss_cfg, window), num_micro,
                            PolicyRows.spec(token_advantages=token_advantages), mesh, shardings,
                            opt_shardings)


# --------------------------------------------------------------------------- token-budget update

def ppo_budget_micro_loss(loss_cfg: LossConfig, budget: int, window: int | None = None,
                          shards: int = 1):
    """micro_loss(model, micro) -> (loss, metrics) for token-budget micro-batches: the PPO-KL
    loss (with entropy bonus) and its metrics as sums of per-token terms weighted by the rows'
    `agg_weight` / `token_weight` [R] (micro: `PolicyRows` with its row weights) (`rl.batching.fixed_micro_weights`), so that their sum
    over a mini-batch's micro-batches, in any grouping, is `ppo_micro_loss`'s mean over the fixed
    micro-batches. Window and chunk per shape: `budget_window_chunk`.

    `ppo_kl_loss` with weights w (mask x row weight) as its mask and token-mean aggregation gives
    sum(w x) / sum(w) for every aggregated term; times sum(w) that is the weighted sum. With
    seq-mean, the token-mean metrics (pg_clipfrac, ppo_kl) come from a second pass with the token
    weights."""
    def micro_loss(model, micro: PolicyRows):
        w, chunk = budget_window_chunk(*micro.input_ids.shape, window, budget, shards)
        logp, entropy = token_logprobs(model, micro.input_ids, micro.attention_mask, chunk,
                                       with_entropy=True, response_mask=micro.response_mask,
                                       window=w, temperature=loss_cfg.temperature)

        def weighted(row_weight):
            weights = micro.response_mask * row_weight[:, None]
            loss, metrics = ppo_kl_loss(
                logp, micro.old_logp, micro.ref_logp, micro.advantages, weights,
                clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high,
                dual_clip=loss_cfg.dual_clip, kl_coef=loss_cfg.kl_coef, kl_type=loss_cfg.kl_type,
                agg="token-mean", entropy=entropy, entropy_coef=loss_cfg.entropy_coef)
            total = jnp.sum(weights)
            return loss * total, {k: v * total for k, v in metrics.items()}

        loss, metrics = weighted(micro.agg_weight)
        if loss_cfg.agg != "token-mean":
            _, by_token = weighted(micro.token_weight)
            metrics.update(pg_clipfrac=by_token["pg_clipfrac"], ppo_kl=by_token["ppo_kl"])
        return loss, metrics
    return micro_loss


def make_budget_train_step(graphdef, tx: optax.GradientTransformation, loss_cfg: LossConfig,
                           budget: int, mesh: Mesh | None = None, shardings=None,
                           opt_shardings=None, window: int | None = None,
                           token_advantages: bool = False) -> BudgetStep:
    """The PPO update of `make_train_step` over token-budget micro-batches (`budget` tokens per
    device): micro-batches are `PolicyRows` with their row weights. Run it
    with `budget_update`; it gives the fixed micro-batches' loss, gradients and metrics."""
    return make_budget_update(graphdef, tx,
                              ppo_budget_micro_loss(loss_cfg, budget, window, batch_shards(mesh)),
                              PolicyRows.spec(token_advantages=token_advantages, weighted=True),
                              mesh, shardings, opt_shardings)
