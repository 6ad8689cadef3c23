"""Prefix SFT (Agent-G²'s final scripts, `guidance.sft_coef`): the replayed expert steps of a
guided rollout as supervised rows, and their term of the actor's loss.

    sft = prefix_sft_rows(batch, agent, tokenizer, max_prompt, max_response)  # PrefixSft (host)
    rows = sft.pack(pad_id, row_multiple, length_multiple, shape)  # rl.batching.SftRows
    step = make_sft_step(graphdef, tx, coef, num_micro, ...)       # one optimizer update
    params, opt_state, metrics = step(params, opt_state, minibatch)

A row per replayed step of each kept episode (`RolloutBatch.episode_prefix_turns`): the prompt
the policy would have seen at that step (the rollout's own `step_prompt` and `encode_prompt`),
and as response the agent's SFT reply for the expert action (`Agent.scripted_reply`, what
`hgpo-jax sft` teaches) followed by the end-of-turn token; weight 1 / k, k the episode's prefix
length. One copy per rollout: the rollouts of a task that share its prefix give identical rows
(8 copies for a group of 8), as the authors'.

The loss of a micro-batch of SFT rows: coef x the weighted mean over its rows of each row's
token-mean cross-entropy, sum_r w_r CE_r / sum_r w_r (0 for a micro-batch without one), with
CE_r = -mean over the response tokens of log p (at the rollout's scoring temperature, as every
log-prob of the actor's update). The trainer runs them in mini-batches of their own after the RL
mini-batches of each epoch, so they take no part in the PG and KL terms (docs/guidance.md).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from hgpo_jax.agents import Agent
from hgpo_jax.rl.batching import SftRows, pack_rows
from hgpo_jax.rl.loss import mean_over
from hgpo_jax.rl.policy import encode_prompt
from hgpo_jax.rl.update import (BudgetStep, batch_shards, budget_window_chunk, make_budget_update,
                                make_update_step, token_logprobs)


@dataclasses.dataclass(frozen=True)
class PrefixSft:
    """A batch's prefix SFT rows on the host, N of them: prompt_ids, response_ids list[list[int]]
    [N]; weight float32 [N] (1 / the episode's prefix length); traj int [N] (the episode's
    trajectory, `RolloutBatch.episode_traj`)."""

    prompt_ids: list
    response_ids: list
    weight: np.ndarray
    traj: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def pack(self, pad_id: int, *, row_multiple: int = 1, length_multiple: int = 64,
             shape: tuple[int, int] | None = None, max_response: int | None = None) -> SftRows:
        """The rows as `SftRows` [S, L] (`rl.batching.pack_rows`: right-padded, S a multiple of
        `row_multiple`, or `shape`); the padding rows weigh 0 (inert)."""
        packed = pack_rows(self.prompt_ids, self.response_ids, np.zeros(len(self), np.float32),
                           pad_id=pad_id, row_multiple=row_multiple,
                           length_multiple=length_multiple, shape=shape, max_response=max_response)
        weight = np.zeros(packed.shape[0], np.float32)
        weight[:len(self)] = self.weight
        return SftRows(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                       response_mask=packed.response_mask, weight=weight)


def reply_ids(agent: Agent, tokenizer, action: str, max_response: int | None = None) -> list[int]:
    """The response of an expert action's SFT row: the agent's SFT reply for it
    (`Agent.scripted_reply`) and the end-of-turn token (`Tokenizer.end_of_turn_id`), cut to its
    first `max_response` tokens (rollout.max_new_tokens, the most a reply can have), as
    `hgpo-jax sft` cuts its responses (`sft.data.tokenize_samples`)."""
    ids = tokenizer.encode(agent.scripted_reply(action)) + [tokenizer.end_of_turn_id]
    return ids if max_response is None else ids[:max_response]


def prefix_sft_rows(batch, agent: Agent, tokenizer, max_prompt_tokens: int,
                    max_response: int | None = None) -> PrefixSft:
    """The prefix SFT rows of a guided rollout batch (`RolloutBatch`): one per replayed step of
    each kept episode (`episode_prefix_turns`), in episode order, weight 1 / the episode's
    prefix length; its prompt: the prompt text the policy would have seen there, encoded as the
    policy encodes its own (`rl.policy.encode_prompt`: the chat template, cut to
    `max_prompt_tokens`); its response: `reply_ids`."""
    prompts, responses, weight, traj = [], [], [], []
    replies: dict[str, list[int]] = {}
    encoded: dict[str, list[int]] = {}  # the rollouts of a task that share its prefix: one text
    for t, steps in zip(batch.episode_traj, batch.episode_prefix_turns or ()):
        for step in steps:
            if step.action not in replies:
                replies[step.action] = reply_ids(agent, tokenizer, step.action, max_response)
            if step.prompt not in encoded:
                encoded[step.prompt] = encode_prompt(tokenizer, step.prompt, max_prompt_tokens)
            prompts.append(list(encoded[step.prompt]))
            responses.append(list(replies[step.action]))
            weight.append(1.0 / len(steps))
            traj.append(int(t))
    return PrefixSft(prompts, responses, np.asarray(weight, np.float32),
                     np.asarray(traj, np.int64))


# --------------------------------------------------------------------------- the loss
def row_cross_entropy(logp, mask):
    """Each row's token-mean cross-entropy: -sum(logp x mask) / sum(mask) per row, float [M]
    from logp, mask [M, L] (0 for a row without a token)."""
    tokens = jnp.sum(mask, axis=-1)
    return -jnp.sum(logp * mask, axis=-1) / jnp.where(tokens > 0, tokens, 1.0)


def sft_micro_loss(coef: float, window: int | None = None, temperature: float = 1.0):
    """micro_loss(model, micro) -> (loss, metrics) of one fixed micro-batch of `SftRows`:
    coef x the weighted mean (micro.weight [R]) of the rows' token-mean cross-entropies; metric
    `prefix_sft_loss`, that weighted mean. window, temperature: `token_logprobs`'."""
    def micro_loss(model, micro: SftRows):
        logp = token_logprobs(model, micro.input_ids, micro.attention_mask,
                              response_mask=micro.response_mask, window=window,
                              temperature=temperature)
        sft = mean_over(row_cross_entropy(logp, micro.response_mask), micro.weight)
        return coef * sft, {"prefix_sft_loss": jax.lax.stop_gradient(sft)}
    return micro_loss


def sft_budget_micro_loss(coef: float, budget: int, window: int | None = None, shards: int = 1,
                          temperature: float = 1.0):
    """`sft_micro_loss` for token-budget micro-batches: the rows' cross-entropies summed with
    their `budget_weight` [R] (`rl.batching.fixed_micro_row_weights`), so that the sum over a
    mini-batch's micro-batches, in any grouping, is the mean over its fixed micro-batches of
    `sft_micro_loss`. Window and chunk per shape: `budget_window_chunk`."""
    def micro_loss(model, micro: SftRows):
        w, chunk = budget_window_chunk(*micro.input_ids.shape, window, budget, shards)
        logp = token_logprobs(model, micro.input_ids, micro.attention_mask, chunk,
                              response_mask=micro.response_mask, window=w,
                              temperature=temperature)
        sft = jnp.sum(micro.budget_weight * row_cross_entropy(logp, micro.response_mask))
        return coef * sft, {"prefix_sft_loss": jax.lax.stop_gradient(sft)}
    return micro_loss


def make_sft_step(graphdef, tx: optax.GradientTransformation, coef: float, num_micro: int,
                  mesh: Mesh | None = None, shardings=None, opt_shardings=None,
                  window: int | None = None, temperature: float = 1.0):
    """jit(params, opt_state, mb) -> (params, opt_state, metrics): one optimizer update of a
    mini-batch of `SftRows` [M, L] in `num_micro` fixed micro-batches (`make_update_step`):
    the mean over them of `sft_micro_loss`. Metrics: `train/prefix_sft_loss`, `train/loss`,
    `train/grad_norm`, `train/skipped_nonfinite`."""
    return make_update_step(graphdef, tx, sft_micro_loss(coef, window, temperature), num_micro,
                            SftRows.spec(), mesh, shardings, opt_shardings)


def make_sft_budget_step(graphdef, tx: optax.GradientTransformation, coef: float, budget: int,
                         mesh: Mesh | None = None, shardings=None, opt_shardings=None,
                         window: int | None = None, temperature: float = 1.0) -> BudgetStep:
    """`make_sft_step`'s update over token-budget micro-batches (`budget` tokens per device) of
    `SftRows` with their `budget_weight`; run it with `rl.update.budget_update`."""
    return make_budget_update(graphdef, tx, sft_budget_micro_loss(coef, budget, window,
                                                                  batch_shards(mesh), temperature),
                              SftRows.spec(weighted=True), mesh, shardings, opt_shardings)
