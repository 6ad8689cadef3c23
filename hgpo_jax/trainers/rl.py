"""The training loop: rollout -> rows and old/ref log-probs -> advantages -> PPO epochs ->
checkpoint.

    trainer = Trainer(load_config("tiny_cpu"))
    trainer.train()          # or: hgpo-jax train tiny_cpu [key=value ...] [--resume]

One iteration (docs/training.md):
1. collect: `num_groups` tasks x `group_size` envs in lockstep (sampler + EnvPool);
2. rows: pack every step into a row (prompt + response, loss on response tokens), compute the
   rollout policy's and the frozen reference policy's token log-probs (jit, sharded over the batch);
3. advantages: the algorithm's unit (`rl.algorithms`, chosen by `algo.estimator`'s declaration):
   the group estimators on the step rows (host grouping + jit), or a critic's values, GAE and
   whitening;
4. update: `ppo_epochs` passes over shuffled mini-batches, each one AdamW update with micro-batch
   gradient accumulation; a non-finite loss/gradient skips that update (logged); a PPO run
   first updates its critic on the same mini-batches;
5. row statistics reduced over processes; metrics to JSONL + TensorBoard; a checkpoint every
   `save_every` iterations and on SIGTERM.
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from hgpo_jax import distributed as dist
from hgpo_jax.envs.registry import get_env
from hgpo_jax.models.lora import adapters_off
from hgpo_jax.rl.algorithms import (Advantages, LinkedTurns, StepRows, build_algorithm, loss_config,
                                    scoring_temperature)
from hgpo_jax.rl.batching import (PolicyRows, SftRows, TokenRows, budget_ladder, gather_rows,
                                   minibatch_indices, pack_rows, packed_shape)
from hgpo_jax.rl.guides import guidance_unit
from hgpo_jax.rl.policy import Policy
from hgpo_jax.rl.ppo import LossConfig
from hgpo_jax.rl.rollout import RolloutBatch, collect_rollouts, summary_metrics
from hgpo_jax.rl.sampling import Sampler
from hgpo_jax.rl.update import budget_update, make_logprob_fn, on_mesh
from hgpo_jax.runs import Run, newest_meta
from hgpo_jax.trainers.budget import budget_minibatch, budget_rows_pass, budget_sft_minibatch
from hgpo_jax.trainers.evaluator import Evaluator, env_and_agent, make_env_pool
from hgpo_jax.trainers.iteration_metrics import (mean_metrics, merge_row_statistics,
                                                 prefix_sft_metrics, progress_line)
from hgpo_jax.trainers.state import LoopState, TaskSampler, TrainState, drawn_tasks


# --------------------------------------------------------------------------- set-up helpers
def build_loss_config(cfg) -> LossConfig:
    """The config's PPO-KL loss settings (`cfg.algo`, at the rollout's `scoring_temperature`)."""
    return loss_config(cfg.algo, scoring_temperature(cfg.rollout))


# --------------------------------------------------------------------------- guidance
def prepare_guidance(cfg, resume: bool, progress: bool):
    """(the unit type of `guidance.kind`, what it prepared before the weights load:
    `Guidance.prepare` with the tasks the run draws, on demand, and, resuming, the newest
    checkpoint's guidance state)."""
    unit = guidance_unit(cfg.guidance.kind)
    saved = newest_meta(cfg.run_path()).get("guidance") if resume else None

    def drawn() -> list:
        return drawn_tasks(get_env(cfg.env.name).list_tasks(cfg.env, cfg.env.split), cfg)

    return unit, unit.prepare(cfg, drawn_tasks=drawn, progress=progress, saved=saved)


# --------------------------------------------------------------------------- the trainer
class Trainer(Run):
    """The RL run: the env pool, the device state (`TrainState`: policy, optimizer state,
    reference, the algorithm's state, key), the loop state (`LoopState`), checkpoints and metrics
    (`hgpo_jax.runs.Run` holds what it shares with the supervised trainer).

    One iteration (`run_iteration`) is four stages over typed values, then one reduction:
    collect (rollouts) -> rows (`StepRows`: packing, old and reference log-probs, linked turns)
    -> advantages (the algorithm's unit, `rl.algorithms`, built once from the config's
    declaration) -> update (the unit's own state, then the policy) -> metrics (per-row statistics
    reduced over processes in one place)."""

    def __init__(self, cfg, *, resume: bool = False, progress: bool = True, record: bool = True,
                 allow_change: bool = False):
        t, r = cfg.train, cfg.rollout
        est_updates = t.iterations * t.ppo_epochs * max(1, math.ceil(
            r.num_groups * r.group_size * cfg.env.max_steps / t.mini_batch_size))
        # what the guidance needs (e.g. the experts, recorded once, then cached) and a resumed
        # guidance state are made and checked before the weights load (evaluation plays
        # without guidance: `trainers.evaluator`)
        guidance_type, prepared = prepare_guidance(cfg, resume, progress)
        super().__init__(cfg, resume=resume, progress=progress, total_updates=est_updates,
                         record=record, allow_change=allow_change)
        self._pool = None
        self.sampler = Sampler()  # the run's compiled generation programs (rollouts, evaluation)
        self._tasks: list = []  # the last collected iteration's tasks (`collect`)
        try:  # a failure past this point must still close the checkpointer and logger
            # whole groups per process (group statistics never need another process's envs)
            self.groups = dist.process_share(r.num_groups, "rollout.num_groups")
            self.procs = jax.process_count()
            num_micro = t.mini_batch_size // t.micro_batch_size
            self.algorithm = build_algorithm(cfg, self.mesh, num_micro, self.tokenizer)
            self.state = TrainState(params=self.state.params, opt_state=self.state.opt_state,
                                    ref_params=adapters_off(self.state.params),
                                    key=jax.random.PRNGKey(t.seed),
                                    algo_state=self.algorithm.init_state(self.model(), t.seed))
            self.train_step = self.algorithm.policy_step(self.graphdef, self.tx, self.mesh,
                                                         self.shardings, self.opt_shardings)
            self.budget = t.max_tokens_per_micro_batch  # token-budget micro-batches (0: fixed)
            self.budget_step = self.algorithm.policy_budget_step(
                self.graphdef, self.tx, self.budget, self.mesh, self.shardings,
                self.opt_shardings) if self.budget else None
            self.logprob_fn = make_logprob_fn(self.graphdef, self.mesh, self.shardings,
                                              window=r.max_new_tokens, token_budget=self.budget,
                                              temperature=scoring_temperature(r))

            self.env_spec, self.agent = env_and_agent(cfg)
            self.evaluator = Evaluator(cfg, self.model, self.tokenizer, pool=lambda: self.pool,
                                       sampler=self.sampler, progress=self.progress)
            self.loop = LoopState(0, TaskSampler(self.env_spec.list_tasks(cfg.env, cfg.env.split), t.seed),
                                  np.random.default_rng(t.seed + 1))
            self.guidance = guidance_type(cfg, prepared, tokenizer=self.tokenizer, agent=self.agent)
            self.sft_step, self.sft_budget_step = self._sft_steps()
            if resume:
                self.restore()
        except BaseException:
            self.close()
            raise

    def _sft_steps(self) -> tuple:
        """(fixed step, token-budget step) of the guidance's supervised rows (the budget one
        None without `train.max_tokens_per_micro_batch`); (None, None) when it adds none
        (`Guidance.sft_coef` 0)."""
        coef = self.guidance.sft_coef
        if not coef > 0:
            return None, None
        step = self.algorithm.sft_step(self.graphdef, self.tx, coef, self.mesh, self.shardings,
                                       self.opt_shardings)
        budget = self.algorithm.sft_budget_step(
            self.graphdef, self.tx, coef, self.budget, self.mesh, self.shardings,
            self.opt_shardings) if self.budget else None
        return step, budget

    @property
    def iteration(self) -> int:
        """Iterations done (`loop.iteration`)."""
        return self.loop.iteration

    @property
    def pool(self):
        """The env worker pool, started on first use (export and plan never start it)."""
        if self._pool is None:
            self._pool = make_env_pool(self.cfg)
        return self._pool

    # ------------------------------------------------------------------ the checkpoint
    def checkpoint_tree(self) -> tuple[dict, dict]:
        """arrays: the policy's params and optimizer state, and the algorithm's state under its
        `Algorithm.state_item` (when it keeps one); meta: the loop state and the rollout key."""
        arrays, meta = super().checkpoint_tree()
        item = self.algorithm.state_item
        if item is not None:
            arrays[item] = self.algorithm.state_arrays(self.state.algo_state)
        state = self.guidance.state_dict()
        guide = {} if state is None else {"guidance": state}
        return arrays, {**meta, **self.loop.to_meta(), **guide,
                        "key": np.asarray(self.state.key).tolist()}

    def load_checkpoint_tree(self, arrays: dict, meta: dict) -> None:
        super().load_checkpoint_tree(arrays, meta)
        item = self.algorithm.state_item
        algo_state = None if item is None else self.algorithm.restore_state(arrays[item])
        self.state = self.state.replace(algo_state=algo_state,
                                        key=jnp.asarray(meta["key"], jnp.uint32))
        self.loop.load_meta(meta)
        if "guidance" in meta:
            self.guidance.load_state_dict(meta["guidance"])

    def policy(self, temperature: float) -> Policy:
        """The current policy at `temperature`, generating with the run's sampler (the same
        policy the run's evaluations play: `Evaluator.policy`)."""
        return self.evaluator.policy(temperature)

    # ------------------------------------------------------------------ one iteration
    def run_iteration(self) -> dict[str, float]:
        """One iteration; in a multi-process run every process runs it at once on its own groups
        (`self.groups`) and returns the same, global metrics."""
        t0 = time.perf_counter()
        batch, plans = self.collect()
        retries = self.guidance.retries
        metrics = self._rollout_metrics(batch)
        while metrics["rollout/steps"] == 0 and retries > 0:  # e.g. every prefix ended its episode
            retries -= 1
            batch, plans = self.collect(same_tasks=True)
            metrics = self._rollout_metrics(batch)
        # the guidance learns from the rollouts, before the advantages
        metrics.update(self.guidance.update(plans, *self._kept_episodes(batch)))
        t_rollout = time.perf_counter()
        if metrics["rollout/steps"] == 0:
            metrics["train/skipped_empty_batch"] = 1.0
            return metrics
        rows = self.step_rows(batch)
        sft = self.sft_rows(batch, rows.tokens.shape[1]) if self.sft_step is not None else None
        t_logp = time.perf_counter()
        adv = self.algorithm.advantages(rows, self.state.algo_state, functools.partial(
            self._per_micro_batch, arrays=rows.token_rows()))
        t_adv = time.perf_counter()
        metrics.update(adv.metrics)
        metrics.update(self.update(rows, adv, sft))
        t_end = time.perf_counter()
        stats, tokens = self.row_statistics(rows, adv)
        metrics.update(stats)
        metrics.update({"time/rollout": t_rollout - t0, "time/advantages": t_adv - t_logp,
                        "time/logprobs": t_logp - t_rollout, "time/update": t_end - t_adv,
                        "time/iteration": t_end - t0,
                        "perf/update_tokens_per_s": tokens * self.cfg.train.ppo_epochs
                        / max(t_end - t_adv, 1e-9),
                        "perf/rollout_tokens_per_s": metrics["rollout/response_tokens"]
                        / max(t_rollout - t0, 1e-9)})
        return metrics

    def collect(self, same_tasks: bool = False) -> tuple[RolloutBatch, list | None]:
        """Stage 1: this process's groups of rollouts (the next tasks, the next rollout key),
        and the guidance's plan of every rollout (`Guidance.plan`: drawn for the iteration's
        tasks of every process alike; this process's rollouts play in the guidance's pool of
        its own plans). same_tasks: the last call's tasks again (a guided batch redrawn)."""
        cfg, r = self.cfg, self.cfg.rollout
        key, rollout_key = jax.random.split(self.state.key)
        self.state = self.state.replace(key=key)
        lo, hi = self.groups
        if not same_tasks:
            self._tasks = self.loop.tasks.next(r.num_groups)
        plans = self.guidance.plan(self._tasks, r.group_size)
        pool = self.guidance.pool(self.pool, None if plans is None else
                                  plans[lo * r.group_size:hi * r.group_size], cfg.env.max_steps)
        batch = collect_rollouts(self.policy(r.temperature), pool, self._tasks[lo:hi],
                                 r.group_size, cfg.env.max_steps, cfg.env.memory_len,
                                 rng=rollout_key, spec=self.env_spec, agent=self.agent,
                                 progress=self.progress)
        return batch, plans

    def _rollout_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        """The rollout's metrics over every process's batch."""
        return (summary_metrics(dist.allgather_json(batch.summary())) if self.procs > 1
                else batch.metrics())

    def _kept_episodes(self, batch: RolloutBatch) -> tuple[list[int], list[bool]]:
        """(rollout index in the iteration, won) of every kept episode of every process, in
        batch order (process by process): what the guidance updates from."""
        first = self.groups[0] * self.cfg.rollout.group_size
        mine = ([first + int(i) for i in batch.episode_traj], batch.episode_won.tolist())
        if self.procs == 1:
            return mine
        parts = dist.allgather_json(list(mine))
        return [i for p in parts for i in p[0]], [w for p in parts for w in p[1]]

    def step_rows(self, batch: RolloutBatch) -> StepRows:
        """Stage 2: the step rows packed (every process to the same [S, L], feeding S / P rows of
        each global batch), with the rollout policy's and the reference policy's log-probs and
        the rows linked into episodes."""
        t = self.cfg.train
        row_multiple = t.micro_batch_size // self.procs
        shape = dist.max_over_processes(*packed_shape(
            batch.prompt_ids, batch.response_ids, row_multiple=row_multiple,
            length_multiple=t.pad_multiple))
        packed = pack_rows(batch.prompt_ids, batch.response_ids, np.zeros(len(batch), np.float32),
                           batch.sample_logp, pad_id=self.tokenizer.pad_token_id,
                           row_multiple=row_multiple, length_multiple=t.pad_multiple, shape=shape,
                           max_response=self.cfg.rollout.max_new_tokens)
        tokens = TokenRows.of(packed.arrays())
        return StepRows(batch, packed, old_logp=self._logprobs(self.state.params, tokens),
                        ref_logp=self._logprobs(self.state.ref_params, tokens),
                        turns=LinkedTurns.of(batch, packed.shape[0]))

    def update(self, rows: StepRows, adv: Advantages, sft: SftRows | None = None
               ) -> dict[str, float]:
        """Stage 4: `ppo_epochs` passes over shuffled mini-batches (every process the same count:
        inert ones fill in), the algorithm's own state updates first (a critic: verl's order), then the
        policy's (when `Algorithm.updates_policy`); with prefix SFT rows (`sft`), each epoch's
        policy updates are followed by updates on shuffled mini-batches of those rows alone
        (drawn after all the RL ones, so the RL mini-batches are those of a run without them).
        -> the updates' mean metrics (the RL updates'; `prefix_sft_metrics` for the others)."""
        t = self.cfg.train
        mini = t.mini_batch_size // self.procs
        epochs = [self._epoch_batches(rows.num_rows, mini) for _ in range(t.ppo_epochs)]
        sft_rows = 0 if sft is None else int(np.count_nonzero(sft.weight))
        sft_epochs = [self._epoch_batches(sft_rows, mini) if sft is not None else []
                      for _ in range(t.ppo_epochs)]
        order = [idx for batches in epochs for idx in batches]

        policy_rows = rows.policy_rows(adv)
        algo_state, records = self.algorithm.update_state(self.state.algo_state, rows, adv, order,
                                                          self.mesh)
        self.state = self.state.replace(algo_state=algo_state)
        metrics = mean_metrics(records)
        records, sft_records = [], []
        if self.algorithm.updates_policy(self.iteration):
            for batches, sft_batches in zip(epochs, sft_epochs):
                records += [self._policy_update(policy_rows, idx) for idx in batches]
                sft_records += [self._sft_update(sft, idx) for idx in sft_batches]
        metrics.update(mean_metrics(records))
        metrics["train/updates"] = float(len(records) + len(sft_records))
        if sft is not None:
            metrics.update(prefix_sft_metrics(sft_records, sum(dist.allgather_json(sft_rows))))
        return metrics

    def _epoch_batches(self, num_rows: int, mini: int) -> list[np.ndarray]:
        """One epoch's shuffled mini-batches of `mini` of this process's rows [0, num_rows)
        (`minibatch_indices`, drawn alike on every process; every process the same count: inert
        ones, all -1, fill in)."""
        draw = dist.max_over_processes(num_rows)[0]
        batches = minibatch_indices(num_rows, mini, self.loop.np_rng, draw=draw)
        count = dist.max_over_processes(len(batches))[0]
        return batches + [np.full(mini, -1, np.int64)] * (count - len(batches))  # inert updates

    def _policy_update(self, policy_rows: PolicyRows, idx: np.ndarray) -> dict:
        """One policy update on mini-batch rows `idx` (-1 inert), fixed or token-budget
        micro-batches; the state is updated -> its metrics (host)."""
        if self.budget:
            params, opt_state, m = self._budget_update(policy_rows, idx)
        else:
            params, opt_state, m = self.train_step(self.state.params, self.state.opt_state,
                                                   on_mesh(gather_rows(policy_rows, idx), self.mesh))
        self.state = self.state.replace(params=params, opt_state=opt_state)
        return jax.device_get(m)

    def _sft_update(self, sft: SftRows, idx: np.ndarray) -> dict:
        """One policy update on the guidance's supervised rows `idx` (-1 inert) alone, fixed or token-budget
        micro-batches (`budget_sft_minibatch`); the state is updated -> its metrics (host)."""
        t = self.cfg.train
        local = gather_rows(sft, idx)
        if self.budget:
            micros = budget_sft_minibatch(local, t.mini_batch_size // t.micro_batch_size,
                                          self.budget, self._ladder(sft.input_ids.shape[1]),
                                          self.dp // self.procs, self.mesh)
            params, opt_state, m = budget_update(self.sft_budget_step, self.state.params,
                                                 self.state.opt_state, micros)
        else:
            params, opt_state, m = self.sft_step(self.state.params, self.state.opt_state,
                                                 on_mesh(local, self.mesh))
        self.state = self.state.replace(params=params, opt_state=opt_state)
        return jax.device_get(m)

    def sft_rows(self, batch: RolloutBatch, packed_length: int) -> SftRows:
        """The guidance's supervised rows of this process's kept episodes (`Guidance.sft_rows`,
        e.g. prefix SFT's), packed as the step rows are: every process to the same [S, L], S a
        multiple of micro_batch_size / P, L at least the step rows' `packed_length` (the fixed
        steps then compile for one length when the SFT rows are no longer)."""
        t, r = self.cfg.train, self.cfg.rollout
        sft = self.guidance.sft_rows(batch)
        row_multiple = t.micro_batch_size // self.procs
        S, L = dist.max_over_processes(*packed_shape(
            sft.prompt_ids, sft.response_ids, row_multiple=row_multiple,
            length_multiple=t.pad_multiple))
        return sft.pack(self.tokenizer.pad_token_id, row_multiple=row_multiple,
                        length_multiple=t.pad_multiple, shape=(S, max(L, packed_length)),
                        max_response=r.max_new_tokens)

    def row_statistics(self, rows: StepRows, adv: Advantages) -> tuple[dict[str, float], float]:
        """Stage 5: the per-row statistics (advantages, the rollout-vs-policy log-prob gap, the
        advantage stage's row means and the metrics it left to gather, `Advantages.gathered`)
        and the tokens of the iteration, reduced over processes: the one place an iteration's
        metrics are combined across processes."""
        mask = rows.tokens.response_mask
        gap = np.abs((rows.old_logp - rows.tokens.sample_logp) * mask).sum()
        tokens = float(rows.tokens.attention_mask.sum())
        if self.procs > 1:
            parts = dist.allgather_json({
                "rows": len(rows.batch), "adv": [float(adv.row_adv.sum()),
                                                 float(np.square(adv.row_adv).sum())],
                "tokens": tokens, "logp_gap": [float(gap), float(mask.sum())],
                "row_means": adv.row_means,
                "gathered": {k: part for k, (part, _) in adv.gathered.items()}})
            stats, tokens = merge_row_statistics(parts)
            return {**stats, **adv.gathered_metrics([p["gathered"] for p in parts])}, tokens
        row_adv = adv.row_adv
        return {**adv.row_means, **adv.gathered_metrics(),
                "train/mean_advantage": float(row_adv.mean()) if len(row_adv) else 0.0,
                "train/std_advantage": float(row_adv.std()) if len(row_adv) else 0.0,
                "train/rollout_vs_policy_logp_gap": float(gap / max(mask.sum(), 1))}, tokens

    def _logprobs(self, params, arrays) -> np.ndarray:
        """Token log-probs of all rows [S, L] (see `_per_micro_batch`; arrays: `TokenRows` or a
        dict of their arrays)."""
        return self._per_micro_batch(self.logprob_fn, params, arrays)

    def _per_micro_batch(self, fn, params, arrays, width: int | None = None) -> np.ndarray:
        """fn(params, input_ids, attention_mask, response_mask) over all rows, `micro_batch_size`
        rows per call (bounded memory; each process feeds its share of every call), or with
        `train.max_tokens_per_micro_batch` token-budget micro-batches (`_per_budget_micro_batch`;
        `width`: fn's output columns when they are not the token positions)."""
        if self.budget:
            return self._per_budget_micro_batch(fn, params, arrays, width)
        mb = self.cfg.train.micro_batch_size // self.procs
        tokens = TokenRows.of(arrays)
        out = []
        for i in range(0, tokens.rows, mb):
            part = on_mesh(jax.tree.map(lambda x: x[i:i + mb], tokens), self.mesh)
            out.append(dist.local_rows(fn(params, part.input_ids, part.attention_mask,
                                          part.response_mask), self.mesh))
        return np.concatenate(out, axis=0)

    # ------------------------------------------------------------------ token-budget micro-batches
    def _ladder(self, packed_length: int) -> tuple[int, ...]:
        """The padded lengths of token-budget micro-batches (`rl.batching.budget_ladder`)."""
        return budget_ladder(self.cfg.rollout, self.cfg.train, packed_length)

    def _per_budget_micro_batch(self, fn, params, arrays, width: int | None = None) -> np.ndarray:
        tokens = TokenRows.of(arrays)
        return budget_rows_pass(fn, params, tokens, self.budget,
                                self._ladder(tokens.input_ids.shape[1]), self.dp // self.procs,
                                self.mesh, width)

    def _budget_update(self, rows: PolicyRows, idx: np.ndarray):
        """One actor update on mini-batch rows `idx` (this process's; -1 inert) in token-budget
        micro-batches: the same loss and gradient as `self.train_step`.
        -> (params, opt_state, metrics)."""
        t = self.cfg.train
        micros = budget_minibatch(gather_rows(rows, idx), t.mini_batch_size // t.micro_batch_size,
                                  self.cfg.algo.loss_agg, self.budget,
                                  self._ladder(rows.input_ids.shape[1]),
                                  self.dp // self.procs, self.mesh)
        return budget_update(self.budget_step, self.state.params, self.state.opt_state, micros)

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict]:
        """Run the remaining iterations; returns the per-iteration metrics."""
        t = self.cfg.train
        history = []
        self.begin(self.iteration, t.iterations, "iterations", "train.iterations")
        self.rewind_metrics(self.iteration)  # drop the old records of the steps to come
        with self.stop_on_sigterm(), tqdm(total=t.iterations, initial=self.iteration, unit="it",
                                          desc=f"train {self.cfg.name}", disable=not self.progress) as bar:
            while self.iteration < t.iterations and not self.stopping:
                metrics = self.run_iteration()
                self.loop.iteration += 1
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
        """The current policy's success on `split` (`trainers.evaluator.Evaluator.evaluate`)."""
        return self.evaluator.evaluate(split, games)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self.sampler.clear()
        super().close()
