"""Multi-turn rollouts: all envs in lockstep, one batched `generate` per step.

    batch = collect_rollouts(policy, env_pool, tasks, group_size=8, max_steps=50, memory_len=2)
    episode = watch_episode(policy, env, task, max_steps=50, memory_len=2, agent=agent)  # one env

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
keeps the memory, and hands each env turn (`PlayedTurn`) to a per-turn callback.
`collect_rollouts` keeps the turns as the batch's rows; `watch_episode` runs the same loop on one
env object (behind the pool's interface) and keeps every turn's observation, reply and parse as
it is played (what `hgpo-jax demo --episode` shows).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from hgpo_jax.agents import DEFAULT_AGENT, Agent, Reply, Turn, get_agent
from hgpo_jax.agents.registry import agent_spec
from hgpo_jax.distributed import allgather_json, any_process
from hgpo_jax.envs.pool import EnvReply
from hgpo_jax.envs.prompts import success_rates
from hgpo_jax.envs.registry import EnvSpec


def encode_prompt(tokenizer, text: str, max_prompt_tokens: int) -> list[int]:
    """The token ids a step's prompt text becomes: the tokenizer's chat template around one user
    message, cut to its last `max_prompt_tokens` tokens (left truncation, as the authors')."""
    return encode_prompt_with_length(tokenizer, text, max_prompt_tokens)[0]


def encode_prompt_with_length(tokenizer, text: str, max_prompt_tokens: int) -> tuple[list[int], int]:
    """(`encode_prompt`'s token ids, the prompt's length in tokens before the cut): the prompt
    lost its start when the length is beyond `max_prompt_tokens`."""
    ids = tokenizer.chat_prompt([{"role": "user", "content": text}])
    return ids[-max_prompt_tokens:], len(ids)


_warned_prompt_cut = False  # the first prompt cut in this process warns; later ones are counted only


def prompt_cut_message(max_prompt_tokens: int, longest: int) -> str:
    """The warning of the first prompt `rollout.max_prompt_tokens` cuts (one line)."""
    return (f"rollout.max_prompt_tokens={max_prompt_tokens} cut the start of a prompt: the longest "
            f"prompt so far has {longest} tokens, of which the model sees the last "
            f"{max_prompt_tokens} (the task and the oldest memory go first); raise "
            f"rollout.max_prompt_tokens to at least {longest} or shorten the prompts "
            "(env.memory_len), and watch rollout/truncated_prompt_rate")


@dataclasses.dataclass
class PromptCuts:
    """What a policy's `encode_prompt` has done so far: prompts encoded, prompts cut to
    `max_prompt_tokens` (left truncation) and the longest prompt seen, in tokens before any cut.
    The first cut in a process warns once (`prompt_cut_message`)."""

    prompts: int = 0
    cut: int = 0
    longest: int = 0

    def add(self, length: int, max_prompt_tokens: int) -> None:
        """Count one prompt of `length` tokens (before the cut)."""
        global _warned_prompt_cut
        self.prompts += 1
        self.longest = max(self.longest, length)
        if length > max_prompt_tokens:
            self.cut += 1
            if not _warned_prompt_cut:
                _warned_prompt_cut = True
                warnings.warn(prompt_cut_message(max_prompt_tokens, self.longest), UserWarning,
                              stacklevel=3)


@dataclasses.dataclass
class Policy:
    """What a rollout needs of the model: weights, tokenizer, sampling settings and the sampler
    whose compiled programs it generates with (`hgpo_jax.rl.sampling.Sampler`: a run passes its
    own to every policy it makes, so its programs are reused across iterations and go with the
    run; default: a sampler of this policy's own)."""

    model: Any
    tokenizer: Any
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    max_prompt_tokens: int = 2048
    prefill_chunk: int = -1  # the sampler's prefill chunk (-1 = auto; `generate`'s prefill_chunk)
    decode_attention: str = "auto"  # the sampler's decode attention (`generate`'s decode)
    max_num_seqs: int = 0  # the most prompts generated at once (`generate`'s max_rows; 0 = all)
    sampler: Any = dataclasses.field(default=None, repr=False, compare=False)
    # prompts encoded and cut so far (collect_rollouts reports each rollout's share)
    prompt_cuts: PromptCuts = dataclasses.field(default_factory=PromptCuts, repr=False, compare=False)

    def __post_init__(self):
        if self.sampler is None:
            from hgpo_jax.rl.sampling import Sampler

            self.sampler = Sampler()

    @classmethod
    def of_rollout(cls, model, tokenizer, rollout, temperature: float, sampler=None) -> "Policy":
        """The policy a config's `rollout` section samples with (its top_p, top_k, max_new_tokens,
        max_prompt_tokens, prefill_chunk, decode_attention, max_num_seqs), at `temperature`,
        generating with `sampler` (None: a sampler of its own)."""
        return cls(model, tokenizer, temperature=temperature, top_p=rollout.top_p,
                   top_k=rollout.top_k, max_new_tokens=rollout.max_new_tokens,
                   max_prompt_tokens=rollout.max_prompt_tokens, prefill_chunk=rollout.prefill_chunk,
                   decode_attention=rollout.decode_attention, max_num_seqs=rollout.max_num_seqs,
                   sampler=sampler)

    def encode_prompt(self, text: str) -> list[int]:
        """Chat-template a user message; keeps the last `max_prompt_tokens` tokens if too long
        (counted in `prompt_cuts`)."""
        ids, length = encode_prompt_with_length(self.tokenizer, text, self.max_prompt_tokens)
        self.prompt_cuts.add(length, self.max_prompt_tokens)
        return ids

    def generate(self, prompts: list[list[int]], rng, row_ids=None):
        """Sample a reply to each prompt; row_ids: each prompt's row (its env's global index),
        which makes the samples independent of the batch and of the process count."""
        from hgpo_jax.rl.sampling import generate

        return generate(self.model, prompts, self.max_new_tokens, temperature=self.temperature,
                        top_p=self.top_p, top_k=self.top_k,
                        eos_token_id=self.tokenizer.eos_token_ids, rng=rng,
                        prefill_chunk=self.prefill_chunk, row_ids=row_ids,
                        decode=self.decode_attention, max_rows=self.max_num_seqs,
                        sampler=self.sampler)


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
    max_prompt_tokens (0 for a policy that does not count them). A guided rollout
    (`collect_rollouts(prefixes=...)`): the rows are the policy's turns only (their step ids
    count the policy's turns, 0..n-1); episode_length counts the replayed steps too, and
    episode_prefix [E] holds them (zeros without guidance), episode_prefix_anchors [E] their
    anchors (the history of hgpo's first policy turns); an episode the prefix ended, with no
    policy turn, is not kept. episode_prefix_turns [E]: each kept episode's replayed steps as
    `ReplayedTurn`s (the prompt the policy would have seen, the expert action), for prefix SFT;
    None unless asked for (`collect_rollouts(sft_prompts=True)`).
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
    """One replayed expert step of a guided rollout, as prefix SFT needs it: `prompt_ids`, the
    token ids of the prompt the policy would have seen at that step (`step_prompt` over the
    memory of the steps replayed before it, `encode_prompt`: the chat template, cut to the
    policy's max_prompt_tokens) and `action`, the expert action sent."""

    prompt_ids: list[int]
    action: str


@dataclasses.dataclass(frozen=True)
class Played:
    """What `play_lockstep` leaves of its M envs' episodes, each [M]: the task text (its reset's;
    "" for an env that failed there), whether it was won, whether the pool failed it, and its
    score after its last turn (`score` None for an env without one, `EnvSpec.score_key`; an
    entry None for an env that played no turn); timing: the loop's seconds per phase.
    prefix_anchors: the anchors of the observations the expert steps replayed before the policy
    played (`prefixes`) were played from, in order (empty lists without a prefix; their number is
    `prefix_steps`); prefix_turns:
    each env's replayed steps as `ReplayedTurn`s (`play_lockstep(sft_prompts=True)`; else empty
    lists)."""

    task: list[str]
    won: list[bool]
    failed: list[bool]
    score: list | None
    timing: dict
    prefix_anchors: list[list] = dataclasses.field(default_factory=list)
    prefix_turns: list[list] = dataclasses.field(default_factory=list)

    @property
    def prefix_steps(self) -> list[int]:
        """[M] the expert steps each env replayed (0 without a prefix; [] when none was given)."""
        return [len(a) for a in self.prefix_anchors]


def play_lockstep(policy: Policy, env_pool, env_tasks: Sequence, max_steps: int, memory_len: int,
                  on_turn: Callable[[PlayedTurn], None], *, rng=0, spec: EnvSpec | None = None,
                  agent: Agent | None = None, together: bool = True,
                  progress: bool = False, prefixes: Sequence[Sequence[str]] | None = None,
                  sft_prompts: bool = False) -> Played:
    """The rollout's loop, the one place that plays: env i of `env_pool` runs `env_tasks[i]` for
    at most `max_steps` steps, all envs in lockstep (see the module docstring); `on_turn(turn)`
    sees each env turn the pool did not fail (`PlayedTurn`), in env order within a step, before
    the memory keeps it.

    rng: int seed or PRNG key, split per step. together: this process plays in lockstep with the
    others of a multi-process run (each reply drawn with its env's global index as the row id;
    the loop ends when no env is left on any process); else alone (row ids: the pool's indices).
    spec, agent: as `collect_rollouts`'.

    prefixes: env i's expert actions to replay first (expert-guided rollouts, `rl.guide`; None
    or [] for none): after the reset they are sent to the env as they are, step j of every env
    that has one together, each kept in the memory as a turn of the agent's own (`replayed_reply`);
    they earn the episode its rewards and may win or end it, but `on_turn` never sees them (they
    are no rows). The policy then plays the env's remaining `max_steps - len(prefix)` steps, its
    turns numbered from 0 (`PlayedTurn.step`: the rows' step ids; the replayed steps are their
    history, `Played.prefix_anchors`). sft_prompts: also keep, for each replayed step, the
    prompt the policy would have seen there and the action (`Played.prefix_turns`, prefix SFT);
    these prompts are not counted in the policy's `prompt_cuts`."""
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
    replies = env_pool.reset(list(env_tasks))
    timing["env_reset"] = time.perf_counter() - t0
    obs = [r.obs for r in replies]
    infos = [r.info for r in replies]
    failed = [r.failed for r in replies]
    running = [not r.failed for r in replies]
    task_text = [task_of(info) if not f else "" for info, f in zip(infos, failed)]
    history: list[list[Turn]] = [[] for _ in range(num_envs)]
    won = [False] * num_envs
    score = [None] * num_envs
    prefix_anchors: list[list] = [[] for _ in range(num_envs)]  # one per replayed step
    prefix_turns: list[list[ReplayedTurn]] = [[] for _ in range(num_envs)]

    def record(i: int, r: EnvReply) -> None:  # an env's answer to a turn played (prefix or policy)
        obs[i], infos[i] = r.obs, r.info
        won[i] = won[i] or bool(r.info.get("won", False))
        if spec.score_key is not None:
            score[i] = float(r.info.get(spec.score_key, 0.0))
        if r.done:
            running[i] = False

    if prefixes is not None:
        if len(prefixes) != num_envs:
            raise ValueError(f"prefixes: one list of actions per env, {num_envs}, not {len(prefixes)}")
        t1 = time.perf_counter()
        for j in range(min(max(map(len, prefixes), default=0), max_steps)):
            actions = {i: prefixes[i][j] for i in range(num_envs) if running[i] and j < len(prefixes[i])}
            if not actions:
                break
            shown = {i: encode_prompt(policy.tokenizer, step_prompt(
                agent, task_text[i], obs[i], infos[i], history[i], memory_len),
                policy.max_prompt_tokens) for i in actions} if sft_prompts else {}
            for i, r in env_pool.step(actions).items():
                if r.failed:
                    failed[i], running[i] = True, False
                    continue
                history[i].append(agent.remember(obs[i], replayed_reply(actions[i])))
                prefix_anchors[i].append(infos[i]["anchor"])
                if sft_prompts:
                    prefix_turns[i].append(ReplayedTurn(shown[i], actions[i]))
                record(i, r)
        timing["prefix"] = time.perf_counter() - t1

    bar = tqdm(total=max_steps, desc="rollout", unit="step", disable=not progress, leave=False)
    for t in range(max_steps):
        active = [i for i in range(num_envs)
                  if running[i] and len(prefix_anchors[i]) + t < max_steps]
        # processes sample together (one SPMD program): one with no env left still takes part
        if not (any_process(bool(active)) if together else active):
            break
        t1 = time.perf_counter()
        prompts = [policy.encode_prompt(step_prompt(agent, task_text[i], obs[i], infos[i],
                                                    history[i], memory_len)) for i in active]
        timing["prompts"] += time.perf_counter() - t1
        key, sub = jax.random.split(key)
        t1 = time.perf_counter()
        out = policy.generate(prompts, sub, row_ids=[first_env + i for i in active])
        timing["generate"] += time.perf_counter() - t1
        t1 = time.perf_counter()
        texts, parsed = {}, {}
        for i, toks in zip(active, out.tokens):
            texts[i] = policy.tokenizer.decode(toks)
            parsed[i] = agent.parse(texts[i])
        timing["replies"] += time.perf_counter() - t1
        t2 = time.perf_counter()
        step_replies = env_pool.step({i: reply.action for i, reply in parsed.items()})
        timing["env_step"] += time.perf_counter() - t2
        for j, i in enumerate(active):
            r = step_replies[i]
            if r.failed:
                failed[i], running[i] = True, False
                continue
            on_turn(PlayedTurn(i, t, obs[i], infos[i], prompts[j], list(out.tokens[j]),
                               list(out.logprobs[j]), texts[i], parsed[i], r,
                               float(spec.train_reward(r.reward, r.info))))
            history[i].append(agent.remember(obs[i], parsed[i]))
            record(i, r)
        bar.update(1)
    bar.close()
    return Played(task_text, won, failed, score if spec.score_key is not None else None, timing,
                  prefix_anchors=prefix_anchors,
                  prefix_turns=prefix_turns if sft_prompts else [])


def replayed_reply(action: str) -> Reply:
    """An expert action replayed in a guided rollout as the agent's memory keeps it: the action
    as sent, valid, and no plan (a plan-execute agent's next turn finds no sub-goal carried, as
    at an episode's start, and writes its own)."""
    return Reply(action, True, "")


def collect_rollouts(policy: Policy, env_pool, tasks: Sequence, group_size: int, max_steps: int,
                     memory_len: int = 2, *, rng=0, spec: EnvSpec | None = None,
                     agent: Agent | None = None, progress: bool = False,
                     prefixes: Sequence[Sequence[str]] | None = None,
                     sft_prompts: bool = False) -> RolloutBatch:
    """Run len(tasks) * group_size episodes in lockstep for at most `max_steps` steps each
    (`play_lockstep`, one row per env turn of the policy's). prefixes: expert actions to replay
    before the policy plays, one list per env (`play_lockstep`; None: none); sft_prompts: keep
    the replayed steps' prompts and actions (`RolloutBatch.episode_prefix_turns`, prefix SFT).

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
                           progress=progress, prefixes=prefixes, sft_prompts=sft_prompts)
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
    prefix = played.prefix_steps or [0] * len(played.won)
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
        episode_prefix_anchors=[list(played.prefix_anchors[i]) if played.prefix_anchors else []
                                for i in kept],
        episode_prefix_turns=[list(played.prefix_turns[i]) for i in kept]
        if played.prefix_turns else None)


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
