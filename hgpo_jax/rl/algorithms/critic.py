"""PPO with a critic (`algo.estimator: ppo`): the value model's values before this iteration's
update, GAE and the batch whitening (device code: `hgpo_jax.rl.critic`), token advantages
[S, L]; the critic is updated on the same mini-batches before the policy (verl's order), and the
policy from iteration `critic.warmup_iterations` on.

The critic family's metric of how well the values before the update predict their targets:
`critic/explained_var` = 1 - Var(target - value) / Var(target) over the positions the critic is
trained on (`explained_variance_parts`; per head too with several heads), exact over processes
(each process's moments, combined by the trainer: `Advantages.gathered`), 0.0 where the targets
have no variance (or there are none)."""

from __future__ import annotations

import jax
import numpy as np

from hgpo_jax import distributed as dist
from hgpo_jax.models.lora import Adapted, merge_params, split_params, trainable, with_trainable
from hgpo_jax.models.peft_io import lora_spec
from hgpo_jax.rl.algorithms.base import Advantages, Algorithm, StatePlan, StepRows
from hgpo_jax.rl.batching import CriticRows, budget_ladder, gather_rows
from hgpo_jax.rl.critic import (Critic, CriticState, critic_micro_weights, critic_optimizer,
                                value_counts, window_masks)
from hgpo_jax.rl.update import (batch_sharding, batch_shards, budget_micros, init_opt_state,
                                on_mesh, opt_state_shardings, param_shardings)

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


def heads_text(heads: int) -> str:
    """"3 value heads", "1 value head"."""
    return f"{heads} value head{'s' * (heads != 1)}"


def explained_variance_parts(values, returns, value_mask) -> dict[str, tuple]:
    """`critic/explained_var` of the values before the update against their targets over every
    position of `value_mask` (> 0), and with H > 1 heads `critic/explained_var/head{h}` over head
    h's alone, as `Advantages.gathered` parts: this process's moments (`value_moments`) and
    `explained_variance`, which combines every process's exactly. values, returns: this process's
    [S, W] or [S, W, H]; value_mask: of their shape."""
    keep = np.asarray(value_mask) > 0
    picks = {"critic/explained_var": (values, returns, keep)}
    if np.ndim(values) == 3:
        picks.update({f"critic/explained_var/head{h}": (values[..., h], returns[..., h],
                                                        keep[..., h])
                      for h in range(values.shape[-1])})
    return {name: (value_moments(np.asarray(r)[k], np.asarray(v)[k]), explained_variance)
            for name, (v, r, k) in picks.items()}


class CriticAlgorithm(Algorithm):
    """Each row's reward is its episode's total reward minus the invalid-action penalty of its own
    step (the rows of an episode are not linked in verl-agent's PPO baseline); its critic has
    `spec.critic_heads` heads. Its device state is a `rl.critic.CriticState`, saved as the
    checkpoint item "critic" ({"params", "opt_state"}); a checkpoint resumes it when its critic
    has as many value heads (the `score` kernel [D, H])."""

    value_masks = False  # the advantage stage gives each head's target positions (Advantages.value_mask)
    state_item = "critic"

    def __init__(self, cfg, spec, mesh=None, num_micro: int = 1, tokenizer=None):
        super().__init__(cfg, spec, mesh, num_micro, tokenizer)
        self.window = cfg.rollout.max_new_tokens
        self.critic: Critic | None = None  # its functions, made with its state (init_state)
        self.frozen = None  # with LoRA: the frozen base the critic shares with the policy

    def init_state(self, policy, seed: int):
        self.critic, state = Critic.build(self.cfg, policy, self.mesh, self.num_micro, seed,
                                          num_heads=self.spec.critic_heads,
                                          value_masks=self.value_masks)
        self.frozen = state.params.frozen if isinstance(state.params, Adapted) else None
        return state

    def state_arrays(self, state: CriticState) -> dict:
        """What a checkpoint holds: what trains (with LoRA: the adapters and the head, not the
        shared base) and its optimizer state."""
        return {"params": trainable(state.params), "opt_state": state.opt_state}

    def restore_state(self, arrays: dict) -> CriticState:
        params = arrays["params"] if self.frozen is None else Adapted(arrays["params"], self.frozen)
        return CriticState(params, arrays["opt_state"])

    @classmethod
    def state_signature(cls, spec) -> tuple[str, int]:
        return (cls.state_item, spec.critic_heads)

    @classmethod
    def checkpoint_signature(cls, item_shapes) -> tuple[str, int]:
        kernel = item_shapes["params"]["score"]["kernel"]  # nnx may wrap it: {"value": shape}
        (shape,) = jax.tree.leaves(kernel, is_leaf=lambda x: isinstance(x, tuple))
        return (cls.state_item, int(shape[-1]))

    @classmethod
    def describe_state(cls, signature) -> str:
        return f"a critic of {heads_text(signature[1])}"

    @classmethod
    def state_model(cls, cfg, policy, ckpt):
        """The critic of the newest checkpoint as a `models.CriticModel` of as many value heads."""
        from flax import nnx

        from hgpo_jax.models.critic import critic_from_policy

        if cls.state_item not in ckpt.items():
            raise ValueError(f"the newest checkpoint under {ckpt.directory} holds no critic")
        _, heads = cls.checkpoint_signature(ckpt.item_shapes(cls.state_item))
        graphdef, params = split_params(critic_from_policy(policy, num_heads=heads))
        like = {cls.state_item: {"params": trainable(params),
                                 "opt_state": init_opt_state(critic_optimizer(cfg), params)[0]}}
        state, _, _ = ckpt.restore_latest(like)
        return merge_params(graphdef, with_trainable(params, state[cls.state_item]["params"]))

    def plan_state(self, model_cfg, attention: str) -> StatePlan:
        """The critic's update step as the run builds it (`rl.critic.Critic`: its heads, and
        each head's value mask for a family that gives them), on abstract weights."""
        from flax import nnx

        from hgpo_jax.models.critic import CriticModel

        cfg, heads = self.cfg, self.spec.critic_heads
        t, r = cfg.train, cfg.rollout
        spec = lora_spec(cfg.model)  # a LoRA policy's critic: its adapters on the shared base
        graphdef, params = split_params(nnx.eval_shape(lambda: CriticModel(
            model_cfg, dtype=cfg.model.compute_dtype, param_dtype=cfg.model.dtype,
            rngs=nnx.Rngs(0), remat=t.remat, batch_mesh=self.mesh,
            scan_layers=cfg.model.scan_layers, attention=attention, num_heads=heads, lora=spec)))
        shardings = param_shardings(self.mesh, params)
        tx = critic_optimizer(cfg)
        opt_shardings = opt_state_shardings(tx, trainable(params), self.mesh)
        critic = Critic(cfg, graphdef, shardings, opt_shardings, self.mesh, self.num_micro, heads,
                        self.value_masks)
        include = ("value_mask",) if self.value_masks else ()
        batch = CriticRows.spec(t.mini_batch_size, r.max_prompt_tokens + r.max_new_tokens,
                                window=self.window, num_heads=heads, include=include)

        def budget_batch(rows: int, length: int) -> CriticRows:  # a token-budget micro-batch
            return CriticRows.spec(rows, length, window=min(self.window, length), num_heads=heads,
                                   include=include, weighted=True)

        budget = critic.budget_step is not None
        detail = f"{heads_text(heads)}, no LM head" + (
            f", rank-{spec.rank} adapters on the policy's frozen base" if spec else "")
        return StatePlan(label=self.state_item, detail=detail,
                         params=params, shardings=shardings, tx=tx, opt_shardings=opt_shardings,
                         step=critic.budget_step if budget else critic.step_fn, batch=batch,
                         facts={"heads": heads}, budget_batch=budget_batch if budget else None)

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
        gathered = explained_variance_parts(values, returns,
                                            np.asarray(window_masks(mask, self.window)[1]))
        return Advantages(adv, row_adv, {}, metrics, gathered, values=values, returns=returns)

    def updates_policy(self, iteration: int) -> bool:
        """From iteration `critic.warmup_iterations` on (at least the first), as verl's
        `trainer.critic_warmup`."""
        return self.cfg.critic.warmup_iterations <= iteration + 1

    def update_state(self, state, rows: StepRows, adv: Advantages, order, mesh):
        critic_rows, records = rows.critic_rows(adv), []
        for idx in order:
            local = gather_rows(critic_rows, idx)
            if self.critic.budget_step is None:
                state, m = self.critic.update(state, on_mesh(local, mesh))
            else:  # train.max_tokens_per_micro_batch
                state, m = self.critic.budget_update(state, self.budget_micros(
                    local, critic_rows.input_ids.shape[1], mesh))
            records.append(jax.device_get(m))
        return state, records

    def budget_micros(self, local: CriticRows, packed_length: int, mesh):
        """The token-budget micro-batches of one critic mini-batch (this process's rows `local`),
        device-ready, one at a time, each row weighted as the fixed micro-batches weigh it
        (`rl.critic.critic_micro_weights`; one gather of every process's counts). Rows without a
        value position are left out."""
        t, me = self.cfg.train, jax.process_index()
        counts = value_counts(local)
        every = np.asarray(dist.allgather_json(counts.tolist()), np.int64)    # [P, M(, H)]
        head_w, value_w = critic_micro_weights(every, self.num_micro)
        local = local.replace(head_weight=head_w[me], value_weight=value_w[me])
        total = counts if counts.ndim == 1 else counts.sum(-1)
        return budget_micros(local, np.where(total > 0, local.attention_mask.sum(1), 0),
                             t.max_tokens_per_micro_batch,
                             budget_ladder(self.cfg.rollout, t, packed_length),
                             batch_shards(mesh) // jax.process_count(), mesh)
