"""The environments by name: what the trainer, SFT, evaluation and configs need of each.

    spec = get_env("webshop")
    env_fn = spec.make_env(cfg.env)            # picklable zero-argument factory for the workers
    tasks = spec.list_tasks(cfg.env, "test")   # task ids of a split
    r = spec.train_reward(reward, info)        # the reward training sees

Envs build no prompts and read no replies: that is an agent's business (`hgpo_jax.agents`,
`get_agent(cfg.agent.name, spec.name)`). Each env declares its specs in its own module as `ENV_SPECS = {name: EnvSpec}`; the modules are
listed once in `PROVIDERS` (imported on first use). Adding an env is a folder with that
declaration and one line here; nothing else in the system names envs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import lru_cache

from hgpo_jax.declared import gather, lookup

PROVIDERS = ("hgpo_jax.envs.alfworld", "hgpo_jax.envs.toy", "hgpo_jax.envs.webshop",
             "hgpo_jax.envs.search")


def env_reward(reward: float, info: dict) -> float:
    """Training uses the env's own reward (ALFWorld: 10 on success)."""
    return float(reward)


@dataclasses.dataclass(frozen=True)
class BuiltModel:
    """What a model built for the env (`model.path=build:<env>-<size>`, hgpo_jax.build) is made of.

    vocab: its tokenizer's vocabulary size; episodes() -> the episodes whose turns (prompts and
    replies, as an agent writes them) train that tokenizer, None: 200 expert episodes of the
    train split (`EnvSpec.record_episodes`); memory_len: the turns of memory those prompts show;
    isolate: a regex of spans the tokenizer keeps whole pieces (`train_tokenizer`), e.g. the
    made-up names an agent must copy; None: none; rope_theta: the model's RoPE base, None: the
    family's (Qwen2: 1e6, made for long contexts; a small model trained from scratch on short
    prompts may place tokens better with a smaller one); version: bump when any of these change,
    so a model built before is built afresh (its cache folder is named by it).
    """

    vocab: int
    episodes: Callable[[], list] | None = None
    memory_len: int = 2
    isolate: str | None = None
    rope_theta: float | None = None
    version: int = 1


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the rest of the system needs of one environment.

    make_env(env_cfg) -> a picklable zero-argument factory of envs (hgpo_jax.envs.base.Env);
    list_tasks(env_cfg, split) -> the task ids of a split (what `env.reset` takes);
    splits: the split names; eval_splits: the default evaluation splits;
    train_reward(reward, info) -> the reward of a step for training (the authors');
    rewards: other training rewards the env offers, by name (`env.reward`; "default" is
    train_reward), e.g. WebShop's dense "score";
    score_key: an info key holding an episode score to report beside success (None: none);
    record_episodes(env_cfg, split, n, kind, *, seed, progress) -> n recorded episodes of a
    split for `sft` (hgpo_jax.sft.data.Episode), None: the env records none;
    episode_kinds: the kinds `record_episodes` records (`sft.data`'s KIND names, e.g. "expert",
    "random"), checked before anything is recorded;
    expert_trajectories(env_cfg, split, *, progress=False, workers=1, tasks=None) ->
    {task id: (action, ...)}: for every task of `split` (the ids `list_tasks` gives; `tasks`: a
    subset of them) that has an expert, the expert's action strings in order, as the env takes
    them (expert-guided rollouts replay them as is). Recorded by playing the expert through the
    env itself; only episodes it wins count, and a task without one is absent (unmatched).
    Recordings are kept under `cache_root()/<env>/experts/` (hgpo_jax.envs.experts), keyed so
    that another recorder version or data set is recorded afresh, and an interrupted recording
    resumes; progress: a progress bar; workers: worker processes for a slow recording. A missing
    data set raises FileNotFoundError saying how to get it. None: the env has no expert.
    whole_expert_guidance: whether expert-guided rollouts may draw prefix depths uniformly and
    replay a whole expert (`guidance.prefix_sample_mode=uniform_fixed`,
    `guidance.allow_full_prefix`), as the authors allow on ALFWorld only.
    built_model: what `model.path=build:<name>-<size>` builds for this env (BuiltModel); None:
    no model is built for it.
    options: an options class of the env's own (a dataclass whose `problems(prefix)` lists
    problems), nested in the config as `env.<name>.*`; None: the env has none.
    """

    name: str
    make_env: Callable
    list_tasks: Callable
    splits: tuple[str, ...]
    eval_splits: tuple[str, ...]
    train_reward: Callable[[float, dict], float] = env_reward
    rewards: tuple[tuple[str, Callable[[float, dict], float]], ...] = ()
    score_key: str | None = None
    record_episodes: Callable | None = None
    episode_kinds: tuple[str, ...] = ()
    expert_trajectories: Callable | None = None
    whole_expert_guidance: bool = False
    built_model: BuiltModel | None = None
    options: type | None = None


@lru_cache(maxsize=1)
def _specs() -> dict[str, EnvSpec]:
    return gather(PROVIDERS, "ENV_SPECS", "env")


DEFAULT_REWARD = "default"


def reward_names(spec: EnvSpec) -> tuple[str, ...]:
    """The training rewards `spec` offers (`env.reward`): "default" and its own."""
    return (DEFAULT_REWARD, *(name for name, _ in spec.rewards))


def with_reward(spec: EnvSpec, name: str) -> EnvSpec:
    """`spec` whose `train_reward` is its reward `name` (reward_names); an error names them."""
    if name == DEFAULT_REWARD:
        return spec
    found = dict(spec.rewards)
    if name not in found:
        raise ValueError(f"env {spec.name!r} has no training reward {name!r}; use one of "
                         f"{', '.join(reward_names(spec))}")
    return dataclasses.replace(spec, train_reward=found[name])


def env_names() -> tuple[str, ...]:
    """The names of every registered env."""
    return tuple(_specs())


def get_env(name: str) -> EnvSpec:
    """The spec of env `name`; a clear error naming the known ones otherwise."""
    return lookup(_specs(), name, "env")
