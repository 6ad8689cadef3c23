"""Supervised samples for the warm start: episodes -> (prompt, response) turns -> token ids.

    episodes = toy_episodes(range(100), kind="expert")          # or "random", alfworld_episodes(games)
    texts = samples_from_episodes(episodes, 2, get_env("toy").build_prompt)  # [(prompt, response)]
    samples = tokenize_samples(texts, tokenizer, max_prompt_tokens=512)    # [SftSample]

A sample is exactly what the RL rollout shows the model at that step: the same prompt builder
(`hgpo_jax.envs.prompts.build_prompt`) with the same memory of (observation, action) turns, the
same chat template and left truncation (`hgpo_jax.rl.rollout.encode_prompt`). The response is in
the policy's format, a short reasoning line in <think> </think> and the action in
<action> </action>, followed by the end-of-turn token, so the model learns to stop. The loss
covers the response tokens only.

Sources: expert episodes (ALFWorld: each game's walkthrough played through the real engine, so
every step has its real observation and admissible actions; toy env: its scripted solution),
ALFWorld "search" episodes (ALFWorld's hand-coded expert, which looks for the objects instead of
going straight to them), "random" episodes (a uniformly random admissible action at every step:
the reply format without the skill), and any JSONL file of {"prompt": ..., "response": ...} chat
turns.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hgpo_jax.envs.prompts import Turn, build_prompt


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a recorded episode: what the env showed and what was done."""

    observation: str
    admissible: tuple[str, ...]
    action: str


@dataclasses.dataclass(frozen=True)
class Episode:
    """A recorded episode. task: the text the prompts show as the task; source: where it came
    from (e.g. 'toy:3', 'alfworld:<game path>')."""

    task: str
    steps: tuple[Step, ...]
    won: bool
    source: str


@dataclasses.dataclass(frozen=True)
class SftSample:
    """Token ids of one turn: the prompt (chat template included) and the response (end-of-turn
    token included). The loss covers `response_ids` only."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]


def response_text(action: str) -> str:
    """The policy's reply format for `action`: a short reasoning line, then the action."""
    return f"<think>I will {action}.</think><action>{action}</action>"


# ---------------------------------------------------------------------------------- episodes
def play_episode(env, task, choose: Callable[[str, dict, int], str], max_steps: int,
                 source: str = "") -> Episode:
    """Run one episode of `env` on `task`; choose(observation, info, t) -> action string."""
    obs, info = env.reset(task)
    task_text = info.get("task", "")
    steps, won = [], False
    for t in range(max_steps):
        action = choose(obs, info, t)
        steps.append(Step(obs, tuple(info["admissible_actions"]), action))
        obs, _, done, info = env.step(action)
        won = bool(info.get("won", False))
        if done:
            break
    return Episode(task_text, tuple(steps), won, source)


def toy_episodes(tasks: Iterable[int], kind: str = "expert", *, seed: int = 0, max_steps: int = 50,
                 **env_kwargs) -> list[Episode]:
    """Toy-env episodes: kind "expert" plays its scripted solution (always wins), "random" a
    uniformly random admissible action at every step (the format without the skill)."""
    from hgpo_jax.envs.toy import ToyMemoryEnv

    if kind not in ("expert", "random"):
        raise ValueError(f"unknown toy episode kind {kind!r}; use 'expert' or 'random'")
    env = ToyMemoryEnv(max_steps=max_steps, **env_kwargs)
    rng = np.random.default_rng(seed)
    out = []
    for task in tasks:
        if kind == "expert":
            env.reset(task)
            plan = env.solution()
            choose = lambda obs, info, t, plan=plan: plan[t]  # noqa: E731
        else:
            choose = lambda obs, info, t: str(rng.choice(info["admissible_actions"]))  # noqa: E731
        out.append(play_episode(env, task, choose, max_steps, source=f"toy:{task}"))
    return out


ALFWORLD_KINDS = ("expert", "search")


def alfworld_episodes(games: Sequence[str], *, kind: str = "expert", seed: int = 0, max_steps: int = 50,
                      first_index: int = 0, progress: bool = False) -> list[Episode]:
    """Winning episodes of `games` played through the real ALFWorld engine (every step gets its
    real observation and admissible actions): kind "expert" replays each game's stored
    walkthrough (straight to the hidden objects), kind "search" plays ALFWorld's hand-coded
    expert (`envs.alfworld.SearchExpert`: it looks for the objects receptacle by receptacle;
    its random choices seeded by `seed` and the game's index, counted from `first_index`, so a
    list recorded in slices equals the list recorded at once). Games not won within
    `max_steps` are dropped (with a warning for walkthroughs, which should always win)."""
    import warnings

    from tqdm.auto import tqdm

    from hgpo_jax.envs.alfworld import AlfworldEnv, walkthrough

    if kind not in ALFWORLD_KINDS:
        raise ValueError(f"unknown ALFWorld episode kind {kind!r}; use one of {ALFWORLD_KINDS}")
    env = AlfworldEnv(max_steps=max_steps, facts=kind == "search")
    out = []
    try:
        for i, game in enumerate(tqdm(games, desc=f"{kind} episodes", unit="game", disable=not progress)):
            if kind == "expert":
                plan = walkthrough(game)
                ep = play_episode(env, game, lambda obs, info, t, plan=plan: plan[t],
                                  min(max_steps, len(plan)), source=f"alfworld:{game}")
                if not ep.won:
                    warnings.warn(f"the walkthrough of {game} did not win in {max_steps} steps; skipped")
            else:
                ep = _search_episode(env, game, seed * 1_000_003 + first_index + i, max_steps)
            if ep is not None and ep.won:
                out.append(ep)
    finally:
        env.close()
    return out


def _search_episode(env, game: str, seed: int, max_steps: int) -> Episode | None:
    """One episode of the hand-coded expert on `game`; None when the expert gives up."""
    from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout

    from hgpo_jax.envs.alfworld import SearchExpert

    expert, last = None, ""

    def choose(obs, info, t):
        nonlocal expert, last
        if t == 0:
            expert = SearchExpert(game, obs, seed=seed)
        last = expert.act(env.state, info["admissible_actions"], last)
        return last

    try:
        return play_episode(env, game, choose, max_steps, source=f"alfworld-search:{game}")
    except (HandCodedAgentFailed, HandCodedAgentTimeout):
        return None


def spread(items: Sequence, n: int) -> list:
    """`n` items evenly spaced over `items` (all of them when n <= 0 or n >= len)."""
    if n <= 0 or n >= len(items):
        return list(items)
    return [items[int(i)] for i in np.linspace(0, len(items) - 1, n).round().astype(int)]


def cached_alfworld_episodes(split: str, num_games: int, data_dir: str | None = None,
                             progress: bool = False, kind: str = "expert") -> list[Episode]:
    """Winning episodes (see alfworld_episodes) of `num_games` games spread over a split (sorted
    paths, so every task type is covered), played once and cached as JSON lines under
    $HGPO_JAX_CACHE/expert/ (alfworld-SPLIT-N.jsonl; alfworld-SPLIT-search-N.jsonl for "search")."""
    from hgpo_jax.envs.alfworld import list_games

    path = alfworld_episodes_path(split, num_games, kind)
    if os.path.isfile(path):
        return load_episodes(path)
    episodes = alfworld_episodes(spread(list_games(split, data_dir), num_games), kind=kind,
                                 progress=progress)
    save_episodes(episodes, path)
    return episodes


def alfworld_episodes_path(split: str, num_games: int, kind: str = "expert") -> str:
    """Where cached_alfworld_episodes keeps (or finds) its episodes."""
    from hgpo_jax.envs.data import cache_root

    name = f"alfworld-{split}-{num_games}" if kind == "expert" else f"alfworld-{split}-{kind}-{num_games}"
    return os.path.join(cache_root(), "expert", f"{name}.jsonl")


def save_episodes(episodes: Sequence[Episode], path: str) -> str:
    """Write episodes as JSON lines (atomically)."""
    tmp = f"{path}.tmp{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(json.dumps(dataclasses.asdict(ep)) + "\n")
    os.replace(tmp, path)
    return path


def load_episodes(path: str) -> list[Episode]:
    with open(path, encoding="utf-8") as f:
        return [Episode(d["task"], tuple(Step(s["observation"], tuple(s["admissible"]), s["action"])
                                         for s in d["steps"]), d["won"], d["source"])
                for d in map(json.loads, f)]


# ---------------------------------------------------------------------------------- samples
def samples_from_episodes(episodes: Iterable[Episode], memory_len: int,
                          prompt: str | Callable) -> list[tuple[str, str]]:
    """[(prompt text, response text)], one per step, exactly as the rollout builds the prompt.

    prompt: the env's prompt builder (`EnvSpec.build_prompt`), or a str: the first sentence of
    ALFWorld's prompt (`build_prompt(..., intro=prompt)`)."""
    if isinstance(prompt, str):
        prompt = functools.partial(build_prompt, intro=prompt)
    out = []
    for ep in episodes:
        history: list[Turn] = []
        for step in ep.steps:
            text = prompt(ep.task, step.observation, step.admissible, history, memory_len)
            out.append((text, response_text(step.action)))
            history.append(Turn(step.observation, step.action))
    return out


def read_jsonl_turns(path: str) -> list[tuple[str, str]]:
    """A user's data: one {"prompt": str, "response": str} object per line (the prompt is the
    user message; the chat template and the end-of-turn token are added here)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
            if not isinstance(d, dict) or not isinstance(d.get("prompt"), str) \
                    or not isinstance(d.get("response"), str):
                raise ValueError(f"{path}:{n}: each line must be an object with string fields "
                                 f"'prompt' and 'response', got {line.strip()[:120]!r}")
            out.append((d["prompt"], d["response"]))
    return out


def tokenize_samples(texts: Iterable[tuple[str, str]], tokenizer, max_prompt_tokens: int,
                     max_response_tokens: int | None = None) -> list[SftSample]:
    """Token ids of each (prompt, response): the rollout's prompt encoding; the response's
    tokens plus the end-of-turn token (a response longer than `max_response_tokens` is cut)."""
    from hgpo_jax.rl.rollout import encode_prompt

    end = tokenizer.end_of_turn_id
    out = []
    for prompt, response in texts:
        resp = tokenizer.encode(response) + [end]
        if max_response_tokens is not None:
            resp = resp[:max_response_tokens]
        out.append(SftSample(tuple(encode_prompt(tokenizer, prompt, max_prompt_tokens)), tuple(resp)))
    return out


def chat_texts(texts: Iterable[tuple[str, str]], chat_template: str) -> list[str]:
    """Whole rendered turns (chat template, prompt, response, end of turn): a tokenizer corpus."""
    from transformers.utils.chat_template_utils import render_jinja_template

    conversations = [[{"role": "user", "content": p}, {"role": "assistant", "content": r}]
                     for p, r in texts]
    if not conversations:
        return []
    rendered, _ = render_jinja_template(conversations, chat_template=chat_template)
    return list(rendered)
