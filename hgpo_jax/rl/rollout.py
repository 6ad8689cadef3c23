"""Multi-turn rollouts: all envs in lockstep, one batched `generate` per step.

    batch = collect_rollouts(policy, env_pool, tasks, group_size=8, max_steps=50, memory_len=2)

Env i runs task `tasks[i // group_size]`, so each group of `group_size` envs starts from the same
state. Each step: the agent (`agent=`, hgpo_jax.agents) writes the prompts of the envs still
running (task, memory of the last `memory_len` turns, current observation, admissible actions),
the policy generates for them only, the agent parses the replies (`Reply`: the action, valid or
not, is what the env is sent), the pool steps those envs, and one row per env step is recorded
(reward: the env's training reward, `EnvSpec.train_reward` of `spec=`; the invalid-action penalty
is the advantage computation's business); the memory keeps what `agent.remember` keeps of the
turn. Defaults: the verl-agent agent of `spec`'s env (ALFWorld's for no spec) and an unregistered
env's entry (`default_spec`). Finished envs cost no generation. An episode whose env failed in
the pool (timeout, dead worker) is dropped from the returned rows and counted in `batch.num_failed`. A prompt longer than
the policy's `max_prompt_tokens` loses its start (left truncation): `rollout/truncated_prompt_rate`
counts such prompts, and the first one in a process warns (`PromptCuts`).

One loop plays (`play_lockstep`): it builds the prompts, samples, parses and steps the envs and
keeps the memory, and hands each env turn (`PlayedTurn`) to a per-turn callback. An env pool may
hand an env over with turns already played (`EnvReply.prior` of its reset: a guided rollout's
expert prefix, replayed by a wrapper of the pool, `hgpo_jax.rl.guides`): the loop keeps them in
the memory as turns of the agent's own and the policy plays the steps that are left.
`collect_rollouts` keeps the turns as the batch's rows; `hgpo_jax.rl.episodes` plays through the
same loop to evaluate (each task once) and to watch one env turn by turn (`hgpo-jax demo
--episode`). The policy and its prompt encoding are `hgpo_jax.rl.policy`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from hgpo_jax.agents import DEFAULT_AGENT, Agent, Reply, Turn, get_agent
from hgpo_jax.agents.registry import agent_spec
from hgpo_jax.distributed import any_process
from hgpo_jax.envs.pool import EnvReply
from hgpo_jax.envs.prompts import success_rates
from hgpo_jax.envs.registry import EnvSpec
from hgpo_jax.rl.policy import Policy


@dataclasses.dataclass
class RolloutBatch:
    """One row per env step (host NumPy / lists), ready for `compute_step_advantages`.

    task_id, traj_id, step_id: int [S]; anchor: list[str] [S]; prompt_ids, response_ids:
    list[list[int]]; sample_logp: list[list[float]] (log-probs under the sampling policy);
    reward: float [S] (the env's training reward; no invalid-action penalty is applied here);
    valid: bool [S] (the reply's projection was valid); done: bool [S]; won: bool [S] (the
    trajectory's outcome); task_type: list[str] [S].
    Episode-level: episode_traj (env index), episode_won, episode_task_type, episode_length,
    each [E], for the E trajectories kept; episode_score [E] (the env's score of the episode,
    e.g. WebShop's task score; None for envs without one); num_failed episodes dropped; timing
    in seconds; prompts: the prompts encoded, prompts_cut: those cut to the policy's
    max_prompt_tokens (0 for a policy that does not count them). An episode handed over with
    replayed turns (`EnvReply.prior`, a guided rollout): the rows are the policy's turns only
    (their step ids count the policy's turns, 0..n-1); episode_length counts the replayed steps
    too, and episode_prefix [E] holds them (zeros without guidance), episode_prefix_anchors [E]
    their anchors (the history of hgpo's first policy turns), episode_prefix_turns [E] the
    turns themselves (`ReplayedTurn`: the prompt the policy would have seen, the action; prefix
    SFT's rows); an episode the prefix ended, with no policy turn, is not kept.
    """

    task_id: np.ndarray
    traj_id: np.ndarray
    step_id: np.ndarray
    anchor: list
    prompt_ids: list
    response_ids: list
    sample_logp: list
    reward: np.ndarray
    valid: np.ndarray
    done: np.ndarray
    won: np.ndarray
    task_type: list
    episode_traj: np.ndarray
    episode_won: np.ndarray
    episode_task_type: list
    episode_length: np.ndarray
    num_failed: int
    timing: dict
    episode_score: np.ndarray | None = None
    prompts: int = 0
    prompts_cut: int = 0
    episode_prefix: np.ndarray | None = None
    episode_prefix_anchors: list | None = None
    episode_prefix_turns: list | None = None

    def prefix_anchors(self) -> dict | None:
        """{traj_id: anchors replayed before its step 0} of the guided episodes (None: none;
        `compute_step_advantages(prefix_anchors=...)`)."""
        if not self.episode_prefix_anchors or not any(self.episode_prefix_anchors):
            return None
        return {int(t): list(a) for t, a in zip(self.episode_traj, self.episode_prefix_anchors) if a}

    def __len__(self) -> int:
        return int(self.task_id.shape[0])

    def metrics(self) -> dict[str, float]:
        """Success overall and per task type, invalid-action rate, lengths, failures."""
        return summary_metrics([self.summary()])

    def summary(self) -> dict:
        """What `metrics` needs, as JSON-able columns (gathered from every process of a
        multi-process run and merged with `summary_metrics`)."""
        return {"episode_task_type": list(self.episode_task_type),
                "episode_won": self.episode_won.tolist(),
                "episode_length": self.episode_length.tolist(), "valid": self.valid.tolist(),
                "reward": self.reward.tolist(),
                "response_tokens": [len(r) for r in self.response_ids],
                "num_failed": self.num_failed, "timing": dict(self.timing),
                "prompts": self.prompts, "prompts_cut": self.prompts_cut,
                **({"episode_score": self.episode_score.tolist()}
                   if self.episode_score is not None else {})}


def summary_metrics(summaries: list[dict]) -> dict[str, float]:
    """Rollout metrics of the rows of several `RolloutBatch.summary()`s together (one per process):
    success overall and per task type, invalid-action rate, lengths, failures, the share of
    prompts cut to rollout.max_prompt_tokens; time/* is the slowest summary's."""
    def cat(key, dtype):
        return np.asarray([v for s in summaries for v in s[key]], dtype)

    types = [t for s in summaries for t in s["episode_task_type"]]
    won, length = cat("episode_won", bool), cat("episode_length", np.int64)
    valid, reward = cat("valid", bool), cat("reward", np.float64)
    rows = len(valid)
    prompts = sum(s.get("prompts", 0) for s in summaries)
    cut = sum(s.get("prompts_cut", 0) for s in summaries)
    out = {f"success/{k}": v for k, v in success_rates(types, won).items()}
    n = max(rows, 1)
    out.update({
        "rollout/invalid_action_rate": float(1.0 - valid.sum() / n) if rows else 0.0,
        "rollout/mean_episode_length": float(length.mean()) if len(length) else 0.0,
        "rollout/mean_step_reward": float(reward.mean()) if rows else 0.0,
        "rollout/steps": float(rows),
        "rollout/episodes": float(len(won)),
        "rollout/failed_episodes": float(sum(s["num_failed"] for s in summaries)),
        "rollout/response_tokens": float(sum(sum(s["response_tokens"]) for s in summaries)),
        "rollout/truncated_prompt_rate": cut / prompts if prompts else 0.0,
    })
    if any("episode_score" in s for s in summaries):
        score = cat("episode_score", np.float64)
        out["score/all"] = float(score.mean()) if len(score) else 0.0
    for k in summaries[0]["timing"]:
        out[f"time/{k}"] = max(s["timing"][k] for s in summaries)
    return out


def task_of(info: dict) -> str:
    """The task text a reset's info gives the prompts of its episode ("" for an env without one)."""
    return info.get("task", "")


def step_prompt(agent: Agent, task: str, observation: str, info: dict, history: Sequence[Turn],
                memory_len: int) -> str:
    """One step's prompt text: `agent`'s user message over the episode's task, the current
    observation, the admissible actions of the env's current `info`, and the memory (`history`,
    every past turn as `agent.remember` kept it, of which the last `memory_len` are shown)."""
    return agent.prompt(task, observation, info["admissible_actions"], history, memory_len)


@dataclasses.dataclass(frozen=True)
class PlayedTurn:
    """One env's turn of a rollout step, as `play_lockstep` hands it to its per-turn callback:
    the env (its index in the pool) and the step t; the observation and the env's info the
    prompt showed (its anchor, task type, admissible actions); the prompt's token ids (after the
    cut to the policy's max_prompt_tokens); the reply's tokens and their log-probs under the
    sampling policy, its decoded text and the agent's parse (`Reply`: the action sent); the
    env's answer (`EnvReply`) and the turn's training reward (`EnvSpec.train_reward`)."""

    env: int
    step: int
    observation: str
    info: dict
    prompt_ids: list[int]
    response_ids: list[int]
    sample_logp: list[float]
    reply: str
    parsed: Reply
    answer: EnvReply
    reward: float


@dataclasses.dataclass(frozen=True)
class ReplayedTurn:
    """A turn the env was handed over with (`EnvReply.prior`: a guided rollout's replayed
    expert step): `prompt`, the text of the prompt the policy would have seen there
    (`step_prompt` over the memory of the turns before it; prefix SFT encodes it), `action`, the
    action sent, `anchor`, the anchor of the observation it was played from."""

    prompt: str
    action: str
    anchor: Any = None


@dataclasses.dataclass(frozen=True)
class Played:
    """What `play_lockstep` leaves of its M envs' episodes, each [M]: the task text (its reset's;
    "" for an env that failed there), whether it was won, whether the pool failed it, and its
    score after its last turn (`score` None for an env without one, `EnvSpec.score_key`; an
    entry None for an env that played no turn); timing: the loop's seconds per phase;
    replayed: each env's turns it was handed over with, as `ReplayedTurn`s (`EnvReply.prior`;
    empty lists without)."""

    task: list[str]
    won: list[bool]
    failed: list[bool]
    score: list | None
    timing: dict
    replayed: list[list] = dataclasses.field(default_factory=list)

    @property
    def prefix_steps(self) -> list[int]:
        """[M] the turns each env was handed over with (0 without a prefix)."""
        return [len(r) for r in self.replayed]


def play_lockstep(policy: Policy, env_pool, env_tasks: Sequence, max_steps: int, memory_len: int,
                  on_turn: Callable[[PlayedTurn], None], *, rng=0, spec: EnvSpec | None = None,
                  agent: Agent | None = None, together: bool = True,
                  progress: bool = False) -> Played:
    """The rollout's loop, the one place that plays: env i of `env_pool` runs `env_tasks[i]` for
    at most `max_steps` steps, all envs in lockstep (see the module docstring); `on_turn(turn)`
    sees each env turn the pool did not fail (`PlayedTurn`), in env order within a step, before
    the memory keeps it.

    rng: int seed or PRNG key, split per step. together: this process plays in lockstep with the
    others of a multi-process run (each reply drawn with its env's global index as the row id;
    the loop ends when no env is left on any process); else alone (row ids: the pool's indices).
    spec, agent: as `collect_rollouts`'.

    An env the pool hands over with turns already played (its reset's `EnvReply.prior`: a guided
    rollout's expert prefix, `hgpo_jax.rl.guides`) keeps them in the memory as turns of the
    agent's own (`replayed_reply`); they earned the episode its rewards and may have won or ended
    it, but `on_turn` never sees them (they are no rows). The policy then plays the env's
    remaining `max_steps - len(prior)` steps, its turns numbered from 0 (`PlayedTurn.step`: the
    rows' step ids; the replayed turns are their history, `Played.replayed`)."""
    import jax

    num_envs = len(env_tasks)
    key = jax.random.PRNGKey(rng) if isinstance(rng, int) else rng
    first_env = jax.process_index() * num_envs if together else 0  # global index of env 0
    agent = default_agent(spec) if agent is None else agent
    spec = default_spec() if spec is None else spec
    # seconds: env resets; prompt building + tokenizing; generate; reply decoding + parsing;
    # env steps
    timing = {"env_reset": 0.0, "prompts": 0.0, "generate": 0.0, "replies": 0.0, "env_step": 0.0}
    t0 = time.perf_counter()
    envs = Lockstep.reset(env_pool, env_tasks, agent, memory_len, spec.score_key)
    timing["env_reset"] = time.perf_counter() - t0
    prefix_steps = [len(r) for r in envs.replayed]
    bar = tqdm(total=max_steps, desc="rollout", unit="step", disable=not progress, leave=False)
    for t in range(max_steps):
        active = [i for i in range(num_envs) if envs.running[i] and prefix_steps[i] + t < max_steps]
        # processes sample together (one SPMD program): one with no env left still takes part
        if not (any_process(bool(active)) if together else active):
            break
        key, sub = jax.random.split(key)
        play_policy_step(envs, env_pool, policy, agent, active, t, memory_len, sub, first_env,
                         spec, on_turn, timing)
        bar.update(1)
    bar.close()
    return Played(envs.task, envs.won, envs.failed, envs.score if spec.score_key is not None
                  else None, timing, replayed=envs.replayed)


@dataclasses.dataclass
class Lockstep:
    """The envs of one `play_lockstep` between turns, each list [M]: the current observation and
    info, whether the pool failed the env, whether it still runs, its task text (its reset's;
    "" for an env that failed there), its memory (every turn as the agent keeps it), whether it
    was won and its score (None until a turn; None throughout for an env without one), the turns
    it was handed over with (`ReplayedTurn`s)."""

    obs: list
    infos: list
    failed: list
    running: list
    task: list
    history: list
    won: list
    score: list
    replayed: list
    score_key: str | None = None

    @classmethod
    def reset(cls, env_pool, env_tasks: Sequence, agent: Agent, memory_len: int,
              score_key: str | None = None) -> "Lockstep":
        """Reset the pool's envs to `env_tasks`; the turns an env is handed over with
        (`EnvReply.prior`) are kept as the agent's own (`replay`)."""
        replies = env_pool.reset(list(env_tasks))
        n = len(replies)
        envs = cls(obs=[r.obs for r in replies], infos=[r.info for r in replies],
                   failed=[r.failed for r in replies], running=[not r.failed for r in replies],
                   task=[task_of(r.info) if not r.failed else "" for r in replies],
                   history=[[] for _ in range(n)], won=[False] * n, score=[None] * n,
                   replayed=[[] for _ in range(n)], score_key=score_key)
        for i, r in enumerate(replies):
            for action, answer in r.prior:
                envs.replay(i, action, answer, agent, memory_len)
        return envs

    def prompt(self, i: int, agent: Agent, memory_len: int) -> str:
        """Env i's prompt text now (`step_prompt`)."""
        return step_prompt(agent, self.task[i], self.obs[i], self.infos[i], self.history[i],
                           memory_len)

    def record(self, i: int, r: EnvReply, remembered: Turn) -> None:
        """Env i's answer `r` to a turn (replayed or the policy's) whose memory is `remembered`;
        an answer the pool failed ends the env instead (nothing kept)."""
        if r.failed:
            self.failed[i], self.running[i] = True, False
            return
        self.history[i].append(remembered)
        self.obs[i], self.infos[i] = r.obs, r.info
        self.won[i] = self.won[i] or bool(r.info.get("won", False))
        if self.score_key is not None:
            self.score[i] = float(r.info.get(self.score_key, 0.0))
        if r.done:
            self.running[i] = False


    def replay(self, i: int, action: str, answer: EnvReply, agent: Agent, memory_len: int) -> None:
        """Env i's turn `action`, answered `answer`, played before the policy's (a replayed
        expert step): kept in the memory as the agent's own (`replayed_reply`) and, unless the
        pool failed it, in `replayed[i]` with the prompt the policy would have seen there."""
        turn = ReplayedTurn(self.prompt(i, agent, memory_len), action, self.infos[i]["anchor"])
        self.record(i, answer, agent.remember(self.obs[i], replayed_reply(action)))
        if not answer.failed:
            self.replayed[i].append(turn)


def play_policy_step(envs: Lockstep, env_pool, policy: Policy, agent: Agent, active: list[int],
                     t: int, memory_len: int, key, first_env: int, spec: EnvSpec,
                     on_turn: Callable[[PlayedTurn], None], timing: dict) -> None:
    """Step t of the policy's turns for the `active` envs: their prompts, one batched generate
    (row ids: the envs' global indices, `first_env` + i), the agent's parse, one pool step;
    `on_turn` sees each turn the pool did not fail, before the memory keeps it. `timing`'s
    seconds grow by this step's."""
    t1 = time.perf_counter()
    prompts = [policy.encode_prompt(envs.prompt(i, agent, memory_len)) for i in active]
    timing["prompts"] += time.perf_counter() - t1
    t1 = time.perf_counter()
    out = policy.generate(prompts, key, row_ids=[first_env + i for i in active])
    timing["generate"] += time.perf_counter() - t1
    t1 = time.perf_counter()
    texts = {i: policy.tokenizer.decode(toks) for i, toks in zip(active, out.tokens)}
    parsed = {i: agent.parse(text) for i, text in texts.items()}
    timing["replies"] += time.perf_counter() - t1
    t1 = time.perf_counter()
    answers = env_pool.step({i: reply.action for i, reply in parsed.items()})
    timing["env_step"] += time.perf_counter() - t1
    for j, i in enumerate(active):
        r = answers[i]
        if not r.failed:
            on_turn(PlayedTurn(i, t, envs.obs[i], envs.infos[i], prompts[j], list(out.tokens[j]),
                               list(out.logprobs[j]), texts[i], parsed[i], r,
                               float(spec.train_reward(r.reward, r.info))))
        envs.record(i, r, agent.remember(envs.obs[i], parsed[i]))


def replayed_reply(action: str) -> Reply:
    """An expert action replayed in a guided rollout as the agent's memory keeps it: the action
    as sent, valid, and no plan (a plan-execute agent's next turn finds no sub-goal carried, as
    at an episode's start, and writes its own)."""
    return Reply(action, True, "")


def collect_rollouts(policy: Policy, env_pool, tasks: Sequence, group_size: int, max_steps: int,
                     memory_len: int = 2, *, rng=0, spec: EnvSpec | None = None,
                     agent: Agent | None = None, progress: bool = False) -> RolloutBatch:
    """Run len(tasks) * group_size episodes in lockstep for at most `max_steps` steps each
    (`play_lockstep`, one row per env turn of the policy's; a guided rollout's pool hands its
    envs over with their prefixes replayed, `EnvReply.prior`).

    env_pool must hold at least len(tasks) * group_size envs; the first that many play (the
    others stay idle: `EnvPool.reset`). rng: int seed or PRNG key for
    sampling (split per step; each env's replies are drawn with its global index as the row id,
    `generate(row_ids=...)`, so they do not depend on which other envs are still running). In a multi-process run every process calls this at once for its
    own tasks (and env pool) with the same rng; they step in lockstep until no env is left on any
    of them, and generate as one batch over the mesh. spec: the env's registry entry (training
    reward, score; None: `default_spec()`); agent: prompts, reply parsing and memory (None:
    `default_agent(spec)`).
    Returns a RolloutBatch; see the module docstring.
    """
    num_envs = len(tasks) * group_size
    if group_size < 1 or not tasks:
        raise ValueError(f"need at least one task and group_size >= 1 (got {len(tasks)} tasks, "
                         f"group_size {group_size})")
    if env_pool.num_envs < num_envs:
        raise ValueError(f"env_pool has {env_pool.num_envs} envs but {len(tasks)} tasks x group "
                         f"{group_size} need {num_envs}")
    cuts = getattr(policy, "prompt_cuts", None)  # None: a policy that does not count its cuts
    cuts_before = (cuts.prompts, cuts.cut) if cuts is not None else (0, 0)
    turns: list[PlayedTurn] = []
    played = play_lockstep(policy, env_pool, [tasks[i // group_size] for i in range(num_envs)],
                           max_steps, memory_len, turns.append, rng=rng, spec=spec, agent=agent,
                           progress=progress)
    batch = _to_batch(turns, played, group_size)
    if cuts is not None:
        batch.prompts, batch.prompts_cut = cuts.prompts - cuts_before[0], cuts.cut - cuts_before[1]
    return batch


def default_spec() -> EnvSpec:
    """An unregistered env's entry: the env's own reward, no score."""
    return EnvSpec(name="custom", make_env=None, list_tasks=None, splits=(), eval_splits=())


def default_agent(spec: EnvSpec | None = None) -> Agent:
    """The agent of a rollout given none: the default agent's for `spec`'s env, or, for no spec
    or an env it has no prompt for (e.g. `default_spec()`), the prompt it declares generic
    (`AgentSpec.generic_env`: the verl-agent agent's think/action prompt)."""
    default = agent_spec(DEFAULT_AGENT)
    if spec is not None and spec.name in default.envs:
        return get_agent(DEFAULT_AGENT, spec.name)
    if default.generic_env is None:
        raise ValueError(f"agent {DEFAULT_AGENT!r} has no prompt for env "
                         f"{getattr(spec, 'name', None)!r}; pass the rollout an agent")
    return get_agent(DEFAULT_AGENT, default.generic_env)


def _to_batch(turns: list[PlayedTurn], played: Played, group_size: int) -> RolloutBatch:
    """The rows of the played turns of the episodes the pool did not fail (env i: task
    i // group_size, trajectory i)."""
    won, score = played.won, played.score
    turns = [t for t in turns if not played.failed[t.env]]
    traj = [t.env for t in turns]
    kept = sorted(set(traj))
    prefix = played.prefix_steps
    length = {i: prefix[i] for i in kept}
    ttype = {}
    for t in turns:
        length[t.env] += 1
        ttype[t.env] = t.info["task_type"]
    return RolloutBatch(
        task_id=np.asarray([i // group_size for i in traj], np.int64),
        traj_id=np.asarray(traj, np.int64),
        step_id=np.asarray([t.step for t in turns], np.int64),
        anchor=[t.info["anchor"] for t in turns], prompt_ids=[t.prompt_ids for t in turns],
        response_ids=[t.response_ids for t in turns],
        sample_logp=[t.sample_logp for t in turns],
        reward=np.asarray([t.reward for t in turns], np.float64),
        valid=np.asarray([t.parsed.valid for t in turns], bool),
        done=np.asarray([t.answer.done for t in turns], bool),
        won=np.asarray([won[i] for i in traj], bool),
        task_type=[t.info["task_type"] for t in turns],
        episode_traj=np.asarray(kept, np.int64),
        episode_won=np.asarray([won[i] for i in kept], bool),
        episode_task_type=[ttype[i] for i in kept],
        episode_length=np.asarray([length[i] for i in kept], np.int64),
        num_failed=int(sum(played.failed)), timing=played.timing,
        episode_score=None if score is None else np.asarray([score[i] for i in kept], np.float64),
        episode_prefix=np.asarray([prefix[i] for i in kept], np.int64),
        episode_prefix_anchors=[[r.anchor for r in played.replayed[i]] for i in kept],
        episode_prefix_turns=[list(played.replayed[i]) for i in kept])
