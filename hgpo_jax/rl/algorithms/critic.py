"""PPO with a critic (`algo.estimator: ppo`): the value model's values before this iteration's
update, GAE and the batch whitening (device code: `hgpo_jax.rl.critic`), token advantages
[S, L]; the critic is updated on the same mini-batches before the policy (verl's order), and the
policy from iteration `critic.warmup_iterations` on."""

from __future__ import annotations

import jax
import numpy as np

from hgpo_jax import distributed as dist
from hgpo_jax.rl.algorithms.base import Advantages, Algorithm, StepRows
from hgpo_jax.rl.batching import gather_rows
from hgpo_jax.rl.critic import Critic
from hgpo_jax.rl.update import batch_sharding, on_mesh


class CriticAlgorithm(Algorithm):
    """Each row's reward is its episode's total reward minus the invalid-action penalty of its own
    step (the rows of an episode are not linked in verl-agent's PPO baseline); its critic has
    `spec.critic_heads` heads. Its device state is a `rl.critic.CriticState`."""

    value_masks = False  # the advantage stage gives each head's target positions (Advantages.value_mask)

    def __init__(self, cfg, spec, mesh=None, num_micro: int = 1, tokenizer=None):
        super().__init__(cfg, spec, mesh, num_micro, tokenizer)
        self.window = cfg.rollout.max_new_tokens
        self.critic: Critic | None = None  # its functions, made with its state (init_state)

    def init_state(self, policy, seed: int):
        self.critic, state = Critic.build(self.cfg, policy, self.mesh, self.num_micro, seed,
                                          num_heads=self.spec.critic_heads,
                                          value_masks=self.value_masks)
        return state

    def rewards(self, rows: StepRows) -> np.ndarray:
        """float32 [S]: each row's episode reward minus its own step's penalty (0 for inert rows)."""
        turns = rows.turns
        penalty = self.cfg.algo.invalid_penalty * ((turns.traj_id >= 0) & ~turns.valid)
        return (turns.episode_rewards() - penalty).astype(np.float32)

    def advantages(self, rows: StepRows, state, rows_pass) -> Advantages:
        n, mask = rows.num_rows, rows.tokens.response_mask
        values = rows_pass(self.critic.value_fn, state.params, width=self.window)
        rows_1d, rows_2d = batch_sharding(self.mesh, 1), batch_sharding(self.mesh, 2)
        adv, returns, metrics = self.critic.gae_fn(
            dist.global_rows(self.rewards(rows), rows_1d), dist.global_rows(values, rows_2d),
            dist.global_rows(mask, rows_2d))
        adv = dist.local_rows(adv, self.mesh)
        row_adv = (adv[:n] * mask[:n]).sum(1) / np.maximum(mask[:n].sum(1), 1)
        return Advantages(adv, row_adv, {}, {k: float(v) for k, v in jax.device_get(metrics).items()},
                          values=values, returns=dist.local_rows(returns, self.mesh))

    def update_critic(self, state, rows: StepRows, adv: Advantages, order, mesh):
        critic_rows, records = rows.critic_rows(adv), []
        for idx in order:
            state, m = self.critic.update(state, on_mesh(gather_rows(critic_rows, idx), mesh))
            records.append(jax.device_get(m))
        return state, records
