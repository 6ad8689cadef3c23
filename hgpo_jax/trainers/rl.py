"""The training loop: rollout -> advantages -> old/ref log-probs -> PPO epochs -> checkpoint.

    trainer = Trainer(load_config("tiny_cpu"))
    trainer.train()          # or: hgpo-jax train tiny_cpu [key=value ...] [--resume]

One iteration (docs/training.md):
1. rollout: `num_groups` tasks x `group_size` envs in lockstep (sampler + EnvPool);
2. advantages: `compute_step_advantages(estimator, ...)` on the step rows (host grouping + jit);
   with `algo.estimator: ppo`, after step 3: the critic's values, GAE and whitening (rl/critic.py);
3. pack every step into a row (prompt + response, loss on response tokens), compute the rollout
   policy's and the frozen reference policy's token log-probs (jit, sharded over the batch);
4. `ppo_epochs` passes over shuffled mini-batches, each one AdamW update with micro-batch
   gradient accumulation; a non-finite loss/gradient skips that update (logged); a PPO run
   first updates its critic on the same mini-batches;
5. metrics to JSONL + TensorBoard; a checkpoint every `save_every` iterations and on SIGTERM.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from hgpo_jax import distributed as dist
from hgpo_jax.envs.registry import get_env
from hgpo_jax.rl.advantages import compute_step_advantages
from hgpo_jax.rl.batching import (MicroBatch, fixed_micro_weights, gather_rows, length_ladder,
                                   minibatch_indices, pack_rows, packed_shape, take_micro,
                                   token_budget_micro_batches)
from hgpo_jax.rl.grouping import hierarchy_stats
from hgpo_jax.rl.critic import CRITIC_BATCH, Critic
from hgpo_jax.rl.ppo import (BUDGET_WEIGHTS, LossConfig, make_budget_train_step, make_train_step,
                             ppo_batch_ndims)
from hgpo_jax.rl.update import batch_sharding, budget_update, make_logprob_fn
from hgpo_jax.rl.rollout import Policy, collect_rollouts, summary_metrics
from hgpo_jax.runs import Run


# --------------------------------------------------------------------------- set-up helpers
def build_loss_config(cfg) -> LossConfig:
    """The config's PPO-KL loss settings (`cfg.algo`)."""
    a = cfg.algo
    return LossConfig(clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip,
                      kl_coef=a.kl_coef, kl_type=a.kl_type, agg=a.loss_agg,
                      entropy_coef=a.entropy_coef)


def advantage_options(algo) -> dict:
    """The `compute_step_advantages` options of a config's algo section (all but the estimator)."""
    return dict(invalid_penalty=algo.invalid_penalty, gamma=algo.gamma, K=algo.K, alpha=algo.alpha,
                mode=algo.mode, omega=algo.omega, eps=algo.eps,
                penalty_placement=algo.penalty_placement, stats=algo.stats,
                level_weights=algo.level_weights, base_group=algo.base_group)


def diagnostic_metrics(columns, valid, algo) -> dict[str, float]:
    """diag/<estimator>/{bias, abs_dev, rmse} of grpo, gigpo and hgpo against the oracle
    (hgpo_jax.rl.diagnostics) under the run's options, and diag/coverage. An estimator the options
    cannot serve (stats=paper with a penalty on single rows) is left out."""
    from hgpo_jax.rl.diagnostics import oracle_deviation

    out = {}
    for estimator in ("grpo", "gigpo", "hgpo"):
        try:
            stats = oracle_deviation(*columns, valid=valid, estimators=(estimator,),
                                     **advantage_options(algo))[estimator]
        except ValueError:
            continue
        out.update({f"diag/{estimator}/{k}": v for k, v in stats.items() if k != "coverage"})
        out["diag/coverage"] = stats["coverage"]
    return out


def progress_line(iteration: int, total: int, metrics: dict[str, float]) -> str:
    """One line per iteration: success (training rollouts and held-out splits), invalid replies,
    losses, time."""
    parts = [f"it {iteration:>4}/{total}"]
    for key, label in (("success/all", "success"), ("rollout/invalid_action_rate", "invalid"),
                       ("train/loss", "loss"), ("train/kl_loss", "kl")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.3f}")
    for key in sorted(metrics):
        if key.startswith("eval/") and key.endswith("/all") and key.count("/") == 2:
            parts.append(f"{key[5:-4]} {metrics[key]:.3f}")
    if "time/iteration" in metrics:
        parts.append(f"{metrics['time/iteration']:.1f}s")
    return "  ".join(parts)


class TaskSampler:
    """Draws training tasks without replacement, reshuffling per pass; its state is JSON-able."""

    def __init__(self, tasks: list, seed: int):
        self.tasks = list(tasks)
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(len(self.tasks))
        self.cursor = 0

    def next(self, n: int) -> list:
        out = []
        for _ in range(n):
            if self.cursor >= len(self.order):
                self.order, self.cursor = self.rng.permutation(len(self.tasks)), 0
            out.append(self.tasks[int(self.order[self.cursor])])
            self.cursor += 1
        return out

    def state(self) -> dict:
        return {"cursor": self.cursor, "order": self.order.tolist(),
                "rng": self.rng.bit_generator.state}

    def load(self, state: dict) -> None:
        self.cursor = int(state["cursor"])
        self.order = np.asarray(state["order"], np.int64)
        self.rng.bit_generator.state = state["rng"]


def row_statistics(parts: list[dict]) -> tuple[dict[str, float], float]:
    """(metrics, tokens): the per-row statistics of an iteration over all processes. parts: one dict per process,
    {"rows": n, "adv": [sum, sum of squares], "tokens": t, "logp_gap": [sum, count],
    "row_means": {metric: mean over its rows}}; row means are weighted by rows."""
    rows = sum(p["rows"] for p in parts)
    adv_sum, adv_sq = (sum(p["adv"][i] for p in parts) for i in (0, 1))
    mean = adv_sum / max(rows, 1)
    gap, count = (sum(p["logp_gap"][i] for p in parts) for i in (0, 1))
    out = {"train/mean_advantage": mean,
           "train/std_advantage": math.sqrt(max(adv_sq / max(rows, 1) - mean * mean, 0.0)),
           "train/rollout_vs_policy_logp_gap": gap / max(count, 1)}
    for key in sorted({k for p in parts for k in p["row_means"]}):
        held = [(p["rows"], p["row_means"][key]) for p in parts if key in p["row_means"]]
        out[key] = sum(n * v for n, v in held) / max(sum(n for n, _ in held), 1)
    return out, float(sum(p["tokens"] for p in parts))


def _mean_metrics(records: list[dict]) -> dict[str, float]:
    sums, counts = defaultdict(float), defaultdict(int)
    for r in records:
        for k, v in r.items():
            sums[k] += float(v)
            counts[k] += 1
    return {k: sums[k] / counts[k] for k in sums}


# --------------------------------------------------------------------------- token-budget micro-batches
def budget_plan(lengths: np.ndarray, budget: int, ladder, shards: int) -> list[MicroBatch]:
    """Token-budget micro-batches (`rl.batching.token_budget_micro_batches`) of this process's
    rows of `lengths` [N] (0: left out), planned over every process's lengths (one allgather), so
    that all processes run the same shapes. shards: batch shards per process."""
    every = np.asarray(dist.allgather_json([int(x) for x in lengths]), np.int64)  # [P, N]
    return token_budget_micro_batches(every, budget, ladder, shards=shards)


def budget_rows_pass(fn, params, arrays: dict[str, np.ndarray], budget: int, ladder, shards: int,
                     sharding, mesh, width: int | None = None) -> np.ndarray:
    """fn(params, input_ids, attention_mask, response_mask) over all of this process's rows
    [S, L] in token-budget micro-batches, each padded only to its own length; the outputs back at
    their rows: [S, L] (fn's [R, length] in the first columns, 0 after), or [S, width] for an fn
    whose output columns are not token positions (the critic's values). sharding: the rows'."""
    keys = ("input_ids", "attention_mask", "response_mask")
    me = jax.process_index()
    S, L = arrays["input_ids"].shape
    out = np.zeros((S, width or L), np.float32)
    for micro in budget_plan(arrays["attention_mask"].sum(1), budget, ladder, shards):
        rows = micro.rows[me]
        part = take_micro({k: arrays[k] for k in keys}, rows, micro.length)
        res = dist.local_rows(fn(params, *(dist.global_rows(part[k], sharding) for k in keys)), mesh)
        keep = rows >= 0
        out[rows[keep], :res.shape[1]] = res[keep]
    return out


def budget_minibatch(local: dict[str, np.ndarray], num_micro: int, agg: str, budget: int, ladder,
                     shards: int, shardings: dict):
    """The token-budget micro-batches of one mini-batch, device-ready, one at a time (for
    `rl.update.budget_update`). local: this process's rows of the mini-batch (`gather_rows`), each
    process the same count; every micro-batch gets the loss weights of the fixed micro-batches
    (`rl.batching.fixed_micro_weights`: the same loss and gradient as the fixed step). Rows
    without response tokens are left out. shardings: key -> the rows' sharding. One allgather
    each for the token counts and the lengths."""
    me = jax.process_index()
    tokens = local["response_mask"].sum(1).astype(np.int64)
    every = np.asarray(dist.allgather_json([int(x) for x in tokens]), np.int64)  # [P, M]
    token_w, agg_w = fixed_micro_weights(every, num_micro, agg)
    local = dict(local, token_weight=token_w[me], agg_weight=agg_w[me])
    lengths = np.where(tokens > 0, local["attention_mask"].sum(1), 0)
    sh = {k: shardings[k] for k in local}
    plan = budget_plan(lengths, budget, ladder, shards)
    return (dist.global_tree(take_micro(local, m.rows[me], m.length), sh) for m in plan)


# --------------------------------------------------------------------------- the trainer
class Trainer(Run):
    """The RL run: the policy, the frozen reference, the optimizer, the env pool, checkpoints and
    metrics (`hgpo_jax.runs.Run` holds what it shares with the supervised trainer)."""

    def __init__(self, cfg, *, resume: bool = False, progress: bool = True):
        t, r = cfg.train, cfg.rollout
        est_updates = t.iterations * t.ppo_epochs * max(1, math.ceil(
            r.num_groups * r.group_size * cfg.env.max_steps / t.mini_batch_size))
        super().__init__(cfg, resume=resume, progress=progress, total_updates=est_updates)
        self._pool = None
        try:  # a failure past this point must still close the checkpointer and logger
            # whole groups per process (group statistics never need another process's envs)
            self.groups = dist.process_share(r.num_groups, "rollout.num_groups")
            self.procs = jax.process_count()
            ppo = cfg.algo.estimator == "ppo"  # token-level advantages from a critic (GAE)
            num_micro = t.mini_batch_size // t.micro_batch_size
            self.mb_shardings = {k: batch_sharding(self.mesh, n) for k, n in
                                 {**ppo_batch_ndims(ppo), **CRITIC_BATCH, **BUDGET_WEIGHTS}.items()}
            self.ref_params = jax.tree.map(jnp.copy, self.params)  # the frozen initial policy
            self.critic = Critic(cfg, self.model(), self.mesh, num_micro, t.seed) if ppo else None
            self.train_step = make_train_step(self.graphdef, self.tx, build_loss_config(cfg), num_micro,
                                              self.mesh, self.shardings, self.opt_shardings,
                                              window=r.max_new_tokens, token_advantages=ppo)
            self.budget = t.max_tokens_per_micro_batch  # token-budget micro-batches (0: fixed)
            self.budget_step = make_budget_train_step(
                self.graphdef, self.tx, build_loss_config(cfg), self.budget, self.mesh,
                self.shardings, self.opt_shardings, window=r.max_new_tokens,
                token_advantages=ppo) if self.budget else None
            self.logprob_fn = make_logprob_fn(self.graphdef, self.mesh, self.shardings,
                                              window=r.max_new_tokens, token_budget=self.budget)

            self.env_spec = get_env(cfg.env.name)
            self.sampler = TaskSampler(self.env_spec.list_tasks(cfg.env, cfg.env.split), t.seed)
            self.key = jax.random.PRNGKey(t.seed)
            self.np_rng = np.random.default_rng(t.seed + 1)
            self.iteration = 0
            if resume:
                self.restore()
        except BaseException:
            self.close()
            raise

    @property
    def pool(self):
        """The env worker pool, started on first use (export and plan never start it)."""
        if self._pool is None:
            from hgpo_jax.envs.pool import EnvPool

            r, e = self.cfg.rollout, self.cfg.env
            lo, hi = self.groups  # this process's groups
            self._pool = EnvPool(self.env_spec.make_env(e), num_envs=(hi - lo) * r.group_size,
                                 num_workers=e.num_workers, step_timeout=e.step_timeout,
                                 reset_timeout=e.reset_timeout)
        return self._pool

    # ------------------------------------------------------------------ state
    def arrays(self) -> dict:
        out = super().arrays()
        if self.critic is not None:
            out["critic"] = self.critic.arrays()
        return out

    def load_arrays(self, state: dict) -> None:
        super().load_arrays(state)
        if self.critic is not None:
            self.critic.load_arrays(state["critic"])

    def meta(self) -> dict:
        return {**super().meta(), "iteration": self.iteration, "key": np.asarray(self.key).tolist(),
                "sampler": self.sampler.state(), "np_rng": self.np_rng.bit_generator.state}

    def load_meta(self, meta: dict) -> None:
        self.iteration = int(meta["iteration"])
        self.key = jnp.asarray(meta["key"], jnp.uint32)
        self.sampler.load(meta["sampler"])
        self.np_rng.bit_generator.state = meta["np_rng"]

    def policy(self, temperature: float) -> Policy:
        r = self.cfg.rollout
        return Policy(self.model(), self.tokenizer,
                      temperature=temperature, top_p=r.top_p, top_k=r.top_k,
                      max_new_tokens=r.max_new_tokens, max_prompt_tokens=r.max_prompt_tokens,
                      prefill_chunk=r.prefill_chunk)

    # ------------------------------------------------------------------ one iteration
    def run_iteration(self) -> dict[str, float]:
        """One iteration; in a multi-process run every process runs it at once on its own groups
        (`self.groups`) and returns the same, global metrics."""
        cfg, t0 = self.cfg, time.perf_counter()
        r, a, t = cfg.rollout, cfg.algo, cfg.train
        multi = self.procs > 1
        self.key, rollout_key = jax.random.split(self.key)
        lo, hi = self.groups
        tasks = self.sampler.next(r.num_groups)[lo:hi]
        batch = collect_rollouts(self.policy(r.temperature), self.pool, tasks, r.group_size,
                                 cfg.env.max_steps, cfg.env.memory_len, rng=rollout_key,
                                 spec=self.env_spec, projection=cfg.env.projection,
                                 progress=self.progress)
        t_rollout = time.perf_counter()
        metrics = summary_metrics(dist.allgather_json(batch.summary())) if multi else batch.metrics()
        if metrics["rollout/steps"] == 0:
            metrics["train/skipped_empty_batch"] = 1.0
            return metrics

        columns = (batch.task_id, batch.traj_id, batch.step_id, batch.anchor, batch.reward)
        row_means = {}  # this process's per-row statistics (reduced over processes below)
        if self.critic is not None:  # advantages come from the critic, after the log-probs
            adv = np.zeros(len(batch), np.float32)
        elif len(batch):
            adv = compute_step_advantages(a.estimator, *columns, valid=batch.valid,
                                          **advantage_options(a))
            if t.diagnostics:
                row_means.update(diagnostic_metrics(columns, batch.valid, a))
            for k, frac in enumerate(hierarchy_stats(batch.task_id, batch.traj_id, batch.step_id,
                                                     batch.anchor, K=a.K)):
                row_means[f"hierarchy/level{k}_grouped_fraction"] = float(frac)
        else:  # a process whose envs all failed still takes part, with inert rows only
            adv = np.zeros((0,), np.float32)
        if not multi:
            metrics.update(row_means)
            metrics["train/mean_advantage"] = float(adv.mean())
            metrics["train/std_advantage"] = float(adv.std())
        t_adv = time.perf_counter()

        # every process packs to the same [S, L] and feeds S / P rows of each global batch
        row_multiple = t.micro_batch_size // self.procs
        shape = dist.max_over_processes(*packed_shape(
            batch.prompt_ids, batch.response_ids, row_multiple=row_multiple,
            length_multiple=t.pad_multiple))
        packed = pack_rows(batch.prompt_ids, batch.response_ids, adv, batch.sample_logp,
                           pad_id=self.tokenizer.pad_token_id, row_multiple=row_multiple,
                           length_multiple=t.pad_multiple, shape=shape,
                           max_response=self.cfg.rollout.max_new_tokens)
        arrays = packed.arrays()
        arrays["old_logp"] = self._logprobs(self.params, arrays)
        arrays["ref_logp"] = self._logprobs(self.ref_params, arrays)
        mask = arrays["response_mask"]
        if self.critic is not None:
            metrics.update(self._critic_advantages(batch, arrays, packed.num_rows))
            if len(batch):  # per-row means of the token advantages, for the advantage metrics
                adv = (arrays["advantages"] * mask).sum(1)[:len(batch)] / np.maximum(
                    mask.sum(1)[:len(batch)], 1)
            if not multi:
                metrics["train/mean_advantage"] = float(adv.mean()) if len(adv) else 0.0
                metrics["train/std_advantage"] = float(adv.std()) if len(adv) else 0.0
        gap = np.abs((arrays["old_logp"] - arrays["sample_logp"]) * mask).sum()
        if not multi:
            metrics["train/rollout_vs_policy_logp_gap"] = float(gap / max(mask.sum(), 1))
        t_logp = time.perf_counter()

        records, critic_records = [], []
        mini = t.mini_batch_size // self.procs
        draw = dist.max_over_processes(packed.num_rows)[0]
        epochs = []
        for _ in range(t.ppo_epochs):
            batches = minibatch_indices(packed.num_rows, mini, self.np_rng, draw=draw)
            count = dist.max_over_processes(len(batches))[0]
            epochs.append(batches + [np.full(mini, -1, np.int64)] * (count - len(batches)))  # inert updates

        def minibatch(idx, keys):
            mb = gather_rows({k: arrays[k] for k in keys}, idx)
            return dist.global_tree(mb, {k: self.mb_shardings[k] for k in keys})

        if self.critic is not None:  # the critic's updates come first (verl's order)
            for idx in (i for batches in epochs for i in batches):
                critic_records.append(jax.device_get(self.critic.update(minibatch(idx, CRITIC_BATCH))))
            metrics.update(_mean_metrics(critic_records))
        actor_keys = tuple(ppo_batch_ndims())
        if self.critic is None or cfg.critic.warmup_iterations <= self.iteration + 1:
            for idx in (i for batches in epochs for i in batches):
                if self.budget:
                    self.params, self.opt_state, m = self._budget_update(arrays, idx, actor_keys)
                else:
                    self.params, self.opt_state, m = self.train_step(self.params, self.opt_state,
                                                                     minibatch(idx, actor_keys))
                records.append(jax.device_get(m))
        metrics.update(_mean_metrics(records))
        metrics["train/updates"] = float(len(records))
        t_end = time.perf_counter()
        tokens = float(packed.attention_mask.sum())
        if multi:
            stats, tokens = row_statistics(dist.allgather_json({
                "rows": len(batch), "adv": [float(adv.sum()), float(np.square(adv).sum())],
                "tokens": tokens, "logp_gap": [float(gap), float(mask.sum())], "row_means": row_means}))
            metrics.update(stats)
        metrics.update({"time/rollout": t_rollout - t0, "time/advantages": t_adv - t_rollout,
                        "time/logprobs": t_logp - t_adv, "time/update": t_end - t_logp,
                        "time/iteration": t_end - t0,
                        "perf/update_tokens_per_s": tokens * t.ppo_epochs / max(t_end - t_logp, 1e-9),
                        "perf/rollout_tokens_per_s": metrics["rollout/response_tokens"]
                        / max(t_rollout - t0, 1e-9)})
        return metrics

    def _logprobs(self, params, arrays) -> np.ndarray:
        """Token log-probs of all rows [S, L] (see `_per_micro_batch`)."""
        return self._per_micro_batch(self.logprob_fn, params, arrays)

    def _per_micro_batch(self, fn, params, arrays, width: int | None = None) -> np.ndarray:
        """fn(params, input_ids, attention_mask, response_mask) over all rows, `micro_batch_size`
        rows per call (bounded memory; each process feeds its share of every call), or with
        `train.max_tokens_per_micro_batch` token-budget micro-batches (`_per_budget_micro_batch`;
        `width`: fn's output columns when they are not the token positions)."""
        if self.budget:
            return self._per_budget_micro_batch(fn, params, arrays, width)
        mb = self.cfg.train.micro_batch_size // self.procs
        sh = self.mb_shardings["input_ids"]
        out = [dist.local_rows(fn(params, *(
            dist.global_rows(arrays[k][i:i + mb], sh)
            for k in ("input_ids", "attention_mask", "response_mask"))), self.mesh)
            for i in range(0, arrays["input_ids"].shape[0], mb)]
        return np.concatenate(out, axis=0)

    # ------------------------------------------------------------------ token-budget micro-batches
    def _ladder(self, arrays) -> tuple[int, ...]:
        """The padded lengths of token-budget micro-batches (`rl.batching.length_ladder`): up to
        the longest possible row (and the packed length, should a row be longer)."""
        r = self.cfg.rollout
        return length_ladder(max(r.max_prompt_tokens + r.max_new_tokens,
                                 arrays["input_ids"].shape[1]), self.cfg.train.pad_multiple)

    def _per_budget_micro_batch(self, fn, params, arrays, width: int | None = None) -> np.ndarray:
        return budget_rows_pass(fn, params, arrays, self.budget, self._ladder(arrays),
                                self.dp // self.procs, self.mb_shardings["input_ids"], self.mesh,
                                width)

    def _budget_update(self, arrays, idx: np.ndarray, keys):
        """One actor update on mini-batch rows `idx` (this process's; -1 inert) in token-budget
        micro-batches: the same loss and gradient as `self.train_step`.
        -> (params, opt_state, metrics)."""
        t = self.cfg.train
        micros = budget_minibatch(gather_rows({k: arrays[k] for k in keys}, idx),
                                  t.mini_batch_size // t.micro_batch_size, self.cfg.algo.loss_agg,
                                  self.budget, self._ladder(arrays), self.dp // self.procs,
                                  self.mb_shardings)
        return budget_update(self.budget_step, self.params, self.opt_state, micros)

    def _critic_advantages(self, batch, arrays: dict, num_rows: int) -> dict[str, float]:
        """PPO with a critic (rl/critic.py): each row's reward (its episode's total reward minus
        the invalid-action penalty of its own step), the critic's values before this iteration's
        update, GAE and the batch whitening. Sets arrays' token `advantages` [S, L], `values` and
        `returns` [S, W]; returns the (global) critic metrics."""
        a = self.cfg.algo
        episode = defaultdict(float)
        for traj, r in zip(batch.traj_id, batch.reward):
            episode[traj] += float(r)
        rewards = np.zeros(arrays["input_ids"].shape[0], np.float32)
        rewards[:num_rows] = [episode[traj] - a.invalid_penalty * (not ok)
                              for traj, ok in zip(batch.traj_id, batch.valid)]
        values = self._per_micro_batch(self.critic.value_fn, self.critic.params, arrays,
                                       width=self.cfg.rollout.max_new_tokens)
        adv, returns, metrics = self.critic.gae_fn(
            dist.global_rows(rewards, batch_sharding(self.mesh, 1)),
            dist.global_rows(values, self.mb_shardings["values"]),
            dist.global_rows(arrays["response_mask"], self.mb_shardings["response_mask"]))
        arrays.update(advantages=dist.local_rows(adv, self.mesh), values=values,
                      returns=dist.local_rows(returns, self.mesh))
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict]:
        """Run the remaining iterations; returns the per-iteration metrics."""
        t = self.cfg.train
        history = []
        self.rewind_metrics(self.iteration)  # drop the old records of the steps to come
        with self.stop_on_sigterm(), tqdm(total=t.iterations, initial=self.iteration, unit="it",
                                          desc=f"train {self.cfg.name}", disable=not self.progress) as bar:
            while self.iteration < t.iterations and not self.stopping:
                metrics = self.run_iteration()
                self.iteration += 1
                self.agree_stop()  # SIGTERM on any process stops (and saves) all of them
                self.logger.log(self.iteration, metrics)
                history.append(metrics)
                bar.update(1)
                bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in
                                 ("train/loss", "success/all", "train/kl_loss") if k in metrics})
                every = self.cfg.eval.every
                if every and self.iteration % every == 0:
                    for split in self.cfg.eval.splits:
                        ev = self.evaluate(split)
                        self.logger.log(self.iteration, ev)
                        metrics.update(ev)
                line = progress_line(self.iteration, t.iterations, metrics)
                if self.main:
                    tqdm.write(line) if self.progress else print(line, flush=True)
                if self.should_save(self.iteration, t.save_every, t.iterations):
                    self.save(self.iteration)
        return history

    def evaluate(self, split: str, games: int | None = None) -> dict[str, float]:
        """Success of the current policy on `split` under `eval.protocol` at `eval.temperature`
        (docs/training.md): overall and per task type. `games` overrides `eval.games` (each-once)."""
        from hgpo_jax.rl.evaluation import evaluate_split

        e = self.cfg.eval
        result = evaluate_split(
            self.policy(e.temperature), self.pool, self.env_spec.list_tasks(self.cfg.env, split),
            protocol=e.protocol, seeds=e.seeds, batches=e.batches, batch_size=e.batch_size,
            games=e.games if games is None else games, max_steps=self.cfg.env.max_steps,
            memory_len=self.cfg.env.memory_len, progress=self.progress,
            rollout_kwargs={"spec": self.env_spec, "projection": self.cfg.env.projection})
        return {f"eval/{split}/{k}": v for k, v in result.items()}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        super().close()
