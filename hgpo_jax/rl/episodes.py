"""Episodes played to be looked at rather than trained on: each task once (`play_each_once`,
`hgpo-jax eval --episodes`), one env turn by turn (`watch_episode`, `hgpo-jax demo --episode`),
and the success rates of a batch of them (`evaluate`, `summarize_episodes`). They play through
the rollout's one loop (`hgpo_jax.rl.rollout.play_lockstep`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from hgpo_jax.agents import Agent, Reply
from hgpo_jax.distributed import allgather_json
from hgpo_jax.envs.pool import EnvReply
from hgpo_jax.envs.prompts import success_rates
from hgpo_jax.envs.registry import EnvSpec
from hgpo_jax.rl.policy import Policy
from hgpo_jax.rl.rollout import PlayedTurn, collect_rollouts, play_lockstep


def mean_and_sem(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) of `values` [n]: the sample std (ddof 1) / sqrt(n);
    (0, 0) for no values, (value, 0) for one."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return 0.0, 0.0
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    """One evaluation episode: `index` of its task in the evaluated list, the task, its type, whether
    it was won, the env's episode score (0.0 for an env without one), its steps, and whether the env
    itself ended it (`done`) within the step limit rather than the limit cutting it."""

    index: int
    task: Any
    task_type: str
    won: bool
    score: float
    length: int
    ended: bool


def play_each_once(policy: Policy, env_pool, tasks: Sequence, max_steps: int, memory_len: int = 2, *,
                   rng=0, spec: EnvSpec | None = None, agent: Agent | None = None,
                   progress: bool = False) -> tuple[list[EpisodeResult], int]:
    """Play every task once (in chunks of `env_pool.num_envs` envs) with `policy`; returns the
    episodes in task order and the number of tasks whose episode an env failure lost. A chunk
    plays only as many envs as it has tasks (the last one is often smaller), the pool's other
    envs idle: each env's replies are drawn with its global index as the row id, so a task's
    episode does not depend on how many others play beside it.

    In a multi-process run every process calls this with the same tasks and its own pool: each chunk
    of (pool size x processes) tasks is split evenly over the processes (a smaller chunk padded
    with its last task to a multiple of the process count; the padding's episodes are dropped),
    and every process returns all the episodes."""
    import jax

    n, procs = env_pool.num_envs, jax.process_count()
    key = jax.random.PRNGKey(rng) if isinstance(rng, int) else rng
    played, failed = [], 0
    for start in tqdm(range(0, len(tasks), n * procs), desc="evaluate", unit="batch", disable=not progress):
        chunk = list(tasks[start:start + n * procs])
        real = len(chunk)
        per = -(-real // procs)  # envs each process plays
        chunk += [chunk[-1]] * (per * procs - real)
        lo = per * jax.process_index()
        key, sub = jax.random.split(key)
        batch = collect_rollouts(policy, env_pool, chunk[lo:lo + per], 1, max_steps, memory_len,
                                 rng=sub, spec=spec, agent=agent)
        score = (batch.episode_score.tolist() if batch.episode_score is not None
                 else [0.0] * len(batch.episode_traj))
        done = set(batch.traj_id[batch.done].tolist())
        episodes = [e for part in allgather_json(
            [[lo + int(i), bool(w), t, x, int(steps), int(i) in done] for i, w, t, x, steps in
             zip(batch.episode_traj, batch.episode_won, batch.episode_task_type, score,
                 batch.episode_length)]) for e in part]
        kept = {e[0] for e in episodes}
        failed += sum(1 for i in range(real) if i not in kept)
        played += [EpisodeResult(start + i, chunk[i], t, bool(w), float(x), int(steps), bool(d))
                   for i, w, t, x, steps, d in sorted(episodes, key=lambda e: e[0]) if i < real]
    return played, failed


@dataclasses.dataclass(frozen=True)
class WatchedTurn:
    """One turn of `watch_episode`: the observation the prompt showed, the prompt's tokens (after
    the cut to the policy's max_prompt_tokens), the model's reply as decoded, the agent's parse of
    it (`Reply`: the action sent to the env, valid, the plan carried), and the env's answer: the
    turn's training reward (`EnvSpec.train_reward`) and whether the episode ended."""

    observation: str
    prompt_tokens: int
    reply: str
    parsed: Reply
    reward: float
    done: bool


@dataclasses.dataclass(frozen=True)
class WatchedEpisode:
    """One episode of `watch_episode`: the task text, its turns in order, whether it was won and
    the env's episode score (None for an env without one, `EnvSpec.score_key`)."""

    task: str
    turns: tuple[WatchedTurn, ...]
    won: bool
    score: float | None = None

    @property
    def reward(self) -> float:
        """The turns' training rewards summed."""
        return float(sum(t.reward for t in self.turns))


class _OneEnv:
    """One env object (`hgpo_jax.envs.base.Env`) behind the pool interface `play_lockstep`
    steps (`EnvPool.reset` / `step` of env 0), in this process: no worker, no failure
    isolation (the env's exceptions propagate), its answers as the env gives them."""

    num_envs = 1

    def __init__(self, env):
        self.env = env

    def reset(self, tasks: Sequence) -> list[EnvReply]:
        obs, info = self.env.reset(tasks[0])
        return [EnvReply(obs, 0.0, False, info)]

    def step(self, actions: dict[int, str]) -> dict[int, EnvReply]:
        return {0: EnvReply(*self.env.step(actions[0]))}


def watch_episode(policy: Policy, env, task, max_steps: int, memory_len: int = 2, *, rng=0,
                  spec: EnvSpec | None = None, agent: Agent | None = None,
                  on_turn: Callable[[int, WatchedTurn], None] | None = None) -> WatchedEpisode:
    """Play one episode of `task` on one env object (`hgpo_jax.envs.base.Env`, no pool) with
    `policy`, keeping every turn's observation, reply and parse (`hgpo-jax demo --episode`).

    The rollout's own loop (`play_lockstep`) over this one env, seen through its per-turn
    callback: `step_prompt` over the task text, the memory of `agent.remember`'s turns and the
    window `memory_len`; one `generate` per step (rng: int seed or PRNG key, split per step, the
    env's row id 0, so it samples what `collect_rollouts` of this one task in a pool of one env
    samples); `agent.parse`'s action sent to the env, valid or not; at most `max_steps` steps.
    spec, agent: as `collect_rollouts`'. on_turn(t, turn): called after each turn t (0-based) is
    played, e.g. to print it as the episode goes."""
    turns: list[WatchedTurn] = []

    def watch(turn: PlayedTurn) -> None:
        turns.append(WatchedTurn(turn.observation, len(turn.prompt_ids), turn.reply, turn.parsed,
                                 turn.reward, bool(turn.answer.done)))
        if on_turn is not None:
            on_turn(len(turns) - 1, turns[-1])

    played = play_lockstep(policy, _OneEnv(env), [task], max_steps, memory_len, watch, rng=rng,
                           spec=spec, agent=agent, together=False)
    return WatchedEpisode(played.task[0], tuple(turns), played.won[0],
                          None if played.score is None else played.score[0])


def summarize_episodes(episodes: Sequence[EpisodeResult], failed: int = 0,
                       scored: bool = False) -> dict[str, float]:
    """The rates of evaluation episodes: success overall ('all') and per task type, 'episodes' and
    'failed' (episodes lost to env failures, left out of the rates), 'mean_length' (steps per
    episode), 'ended' (the share the env itself ended within the step limit: a purchase in
    WebShop), and where `scored` (the env has a task score) 'score', the mean episode score, and
    'score_sem', its standard error over the episodes (sample std / sqrt(n); 0 for one episode)."""
    won = [e.won for e in episodes]
    rates = success_rates([e.task_type for e in episodes], won) if won else {"all": 0.0}
    if scored:
        rates["score"], rates["score_sem"] = mean_and_sem([e.score for e in episodes])
    rates.update({"mean_length": float(np.mean([e.length for e in episodes])) if episodes else 0.0,
                  "ended": float(np.mean([e.ended for e in episodes])) if episodes else 0.0,
                  "episodes": float(len(episodes)), "failed": float(failed)})
    return rates


def evaluate(policy: Policy, env_pool, tasks: Sequence, max_steps: int, memory_len: int = 2, *,
             rng=0, spec: EnvSpec | None = None, agent: Agent | None = None,
             progress: bool = False) -> dict[str, float]:
    """`summarize_episodes` of `play_each_once`: play every task once with `policy` and return
    the rates ('score' and 'score_sem' for an env with a task score, spec.score_key).

    Use the paper's eval temperature (0.4) in `policy`."""
    episodes, failed = play_each_once(policy, env_pool, tasks, max_steps, memory_len, rng=rng,
                                      spec=spec, agent=agent, progress=progress)
    return summarize_episodes(episodes, failed, scored=spec is not None and spec.score_key is not None)
