"""Evaluation with a policy, not a trainer: the policy's weights, its agent, its env pool and
its sampler, nothing else.

    with Evaluator.load(cfg) as evaluator:    # model.path: a model folder, or a run (its weights)
        rates = evaluator.evaluate("test")    # {'eval/test/all': ..., per task type, ...}
        rates, episodes = evaluator.evaluate_episodes("test", games=96)

`hgpo-jax eval` evaluates this way: no optimizer state, reference policy, critic, experts or
guide is made, so evaluating a checkpoint takes the memory that playing takes (the weights and
the sampler's programs; `hgpo-jax plan --sampler`'s eval peak). The RL trainer evaluates its
current weights through an Evaluator over its own model, env pool and sampler.

The protocols (`eval.protocol`: the authors' "verl-agent" batches, or "each-once") are
`hgpo_jax.rl.evaluation`'s; docs/training.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hgpo_jax import distributed as dist
from hgpo_jax.agents import get_agent
from hgpo_jax.envs.registry import get_env, with_reward
from hgpo_jax.models import make_mesh
from hgpo_jax.rl.evaluation import evaluate_each_once, evaluate_split
from hgpo_jax.rl.policy import Policy
from hgpo_jax.rl.sampling import Sampler
from hgpo_jax.runs import check_process_mesh, load_policy


def env_and_agent(cfg):
    """(the env's registry entry with the config's training reward, the agent that plays it)."""
    return (with_reward(get_env(cfg.env.name), cfg.env.reward),
            get_agent(cfg.agent.name, cfg.env.name, projection=cfg.env.projection))


def make_env_pool(cfg):
    """This process's env pool of a config: its share of `rollout.num_groups` x `group_size`
    envs (the rollout's; evaluation plays its games in chunks of that many)."""
    from hgpo_jax.envs.pool import EnvPool

    r, e = cfg.rollout, cfg.env
    lo, hi = dist.process_share(r.num_groups, "rollout.num_groups")
    return EnvPool(get_env(e.name).make_env(e), num_envs=(hi - lo) * r.group_size,
                   num_workers=e.num_workers, step_timeout=e.step_timeout,
                   reset_timeout=e.reset_timeout)


class Evaluator:
    """Success rates of one policy on a config's evaluation splits.

    model() -> the policy as an NNX module (called at each evaluation: a trainer's current
    weights); pool: () -> the env pool to play in (None: one of the evaluator's own, started on
    first use and closed by `close`); sampler: the compiled-program cache to generate with
    (None: one of its own).
    """

    def __init__(self, cfg, model: Callable[[], Any], tokenizer, *,
                 pool: Callable[[], Any] | None = None, sampler: Sampler | None = None,
                 progress: bool = True):
        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer
        self._own_sampler = sampler is None
        self.sampler = Sampler() if sampler is None else sampler
        self.progress = progress
        self.env_spec, self.agent = env_and_agent(cfg)
        self._pool_of = pool
        self._own_pool = None

    @classmethod
    def load(cls, cfg, progress: bool = True) -> "Evaluator":
        """An evaluator of the policy `cfg.model` names (a model folder, `build:...`, or a run
        folder's latest weights; with the config's adapters) on the config's mesh."""
        mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
        check_process_mesh(mesh, cfg.mesh)
        model, tokenizer, _ = load_policy(cfg, mesh, progress and dist.is_main())
        return cls(cfg, lambda: model, tokenizer, progress=progress and dist.is_main())

    @property
    def pool(self):
        if self._pool_of is not None:
            return self._pool_of()
        if self._own_pool is None:
            self._own_pool = make_env_pool(self.cfg)
        return self._own_pool

    def policy(self, temperature: float) -> Policy:
        """The policy at `temperature`, with the config's rollout settings and this sampler."""
        return Policy.of_rollout(self.model(), self.tokenizer, self.cfg.rollout, temperature,
                                 sampler=self.sampler)

    def evaluate(self, split: str, games: int | None = None) -> dict[str, float]:
        """Success on `split` under `eval.protocol` at `eval.temperature` (docs/training.md):
        {'eval/<split>/<rate>': value}, overall and per task type. `games` overrides
        `eval.games` (each-once)."""
        e = self.cfg.eval
        result = evaluate_split(
            self.policy(e.temperature), self.pool, self.env_spec.list_tasks(self.cfg.env, split),
            protocol=e.protocol, seeds=e.seeds, batches=e.batches, batch_size=e.batch_size,
            games=e.games if games is None else games, **self._kwargs())
        return {f"eval/{split}/{k}": v for k, v in result.items()}

    def evaluate_episodes(self, split: str, games: int | None = None):
        """`evaluate` under the "each-once" protocol, keeping every episode: (the same
        {'eval/<split>/<rate>': value}, [hgpo_jax.rl.episodes.EpisodeResult] in task order)."""
        e = self.cfg.eval
        if e.protocol != "each-once":
            raise ValueError(f"per-episode results need eval.protocol=each-once (each game once); this "
                             f"config evaluates under {e.protocol!r}: add eval.protocol=each-once")
        rates, episodes = evaluate_each_once(
            self.policy(e.temperature), self.pool, self.env_spec.list_tasks(self.cfg.env, split),
            seeds=e.seeds, games=e.games if games is None else games, **self._kwargs())
        return {f"eval/{split}/{k}": v for k, v in rates.items()}, episodes

    def _kwargs(self) -> dict:
        return dict(max_steps=self.cfg.env.max_steps, memory_len=self.cfg.env.memory_len,
                    progress=self.progress,
                    rollout_kwargs={"spec": self.env_spec, "agent": self.agent})

    def close(self) -> None:
        """Close the evaluator's own env pool (a pool it was given stays open) and drop its
        compiled programs when the sampler is its own."""
        if self._own_pool is not None:
            self._own_pool.close()
            self._own_pool = None
        if self._own_sampler:
            self.sampler.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
