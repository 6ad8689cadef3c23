"""PPO with a critic (`algo.estimator: ppo`): the value model's values before this iteration's
update, GAE and the batch whitening (device code: `hgpo_jax.rl.critic`), token advantages
[S, L]; the critic is updated on the same mini-batches before the policy (verl's order), and the
policy from iteration `critic.warmup_iterations` on.

The critic family's metric of how well the values before the update predict their targets:
`critic/explained_var` = 1 - Var(target - value) / Var(target) over the positions the critic is
trained on (`explained_variance_metrics`; per head too with several heads), exact over processes,
0.0 where the targets have no variance (or there are none)."""

from __future__ import annotations

import jax
import numpy as np

from hgpo_jax import distributed as dist
from hgpo_jax.rl.algorithms.base import Advantages, Algorithm, StepRows
from hgpo_jax.rl.batching import gather_rows
from hgpo_jax.rl.critic import Critic, window_masks
from hgpo_jax.rl.update import batch_sharding, on_mesh

NO_VARIANCE = 1e-12  # Var(target) at most this (times 1 + mean^2): constant targets, up to rounding


def value_moments(targets, values) -> list[float]:
    """[n, mean(t), sum((t - mean(t))^2), mean(d), sum((d - mean(d))^2)] of the targets t and the
    residuals d = t - values (float64; any shapes, flattened): what `explained_variance` merges."""
    t = np.asarray(targets, np.float64).ravel()
    d = t - np.asarray(values, np.float64).ravel()
    if not t.size:
        return [0, 0.0, 0.0, 0.0, 0.0]
    return [int(t.size), float(t.mean()), float(np.square(t - t.mean()).sum()), float(d.mean()),
            float(np.square(d - d.mean()).sum())]


def explained_variance(parts: list[list[float]]) -> float:
    """1 - Var(t - v) / Var(t) over the entries of every part (`value_moments` of each process's,
    merged exactly: Chan et al.'s pairwise update); 0.0 when there are no entries or the targets
    have no variance (Var(t) <= NO_VARIANCE (1 + mean(t)^2)): a constant target leaves nothing to
    explain."""
    n = sum(p[0] for p in parts)
    if not n:
        return 0.0

    def mean_var(i):  # the merged mean and population variance of moment pair i (mean, sum sq)
        mean = sum(p[0] * p[i] for p in parts) / n
        return mean, sum(p[i + 1] + p[0] * (p[i] - mean) ** 2 for p in parts) / n

    (mean_t, var_t), (_, var_d) = mean_var(1), mean_var(3)
    if var_t <= NO_VARIANCE * (1.0 + mean_t * mean_t):
        return 0.0
    return float(1.0 - var_d / var_t)


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
        returns = dist.local_rows(returns, self.mesh)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        metrics.update(self.explained_variance_metrics(
            values, returns, np.asarray(window_masks(mask, self.window)[1])))
        return Advantages(adv, row_adv, {}, metrics, values=values, returns=returns)

    def explained_variance_metrics(self, values, returns, value_mask) -> dict[str, float]:
        """`critic/explained_var` of the values before the update against their targets over
        every position of `value_mask` (> 0), and with H > 1 heads `critic/explained_var/head{h}`
        over head h's alone. values, returns: this process's [S, W] or [S, W, H]; value_mask: of
        their shape. Exact over the processes (one gather of each one's moments)."""
        keep = np.asarray(value_mask) > 0
        picks = {"critic/explained_var": (values, returns, keep)}
        if np.ndim(values) == 3:
            picks.update({f"critic/explained_var/head{h}": (values[..., h], returns[..., h],
                                                            keep[..., h])
                          for h in range(values.shape[-1])})
        local = [value_moments(np.asarray(r)[k], np.asarray(v)[k]) for v, r, k in picks.values()]
        parts = dist.allgather_json(local)                                    # [P][metric]
        return {name: explained_variance([p[i] for p in parts]) for i, name in enumerate(picks)}

    def update_critic(self, state, rows: StepRows, adv: Advantages, order, mesh):
        critic_rows, records = rows.critic_rows(adv), []
        for idx in order:
            state, m = self.critic.update(state, on_mesh(gather_rows(critic_rows, idx), mesh))
            records.append(jax.device_get(m))
        return state, records
