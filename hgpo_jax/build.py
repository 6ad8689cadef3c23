"""Models built for an environment: `model.path=build:<env>-<size>[@<agent>][/<family>]` (and
`tiny`), resolved to a model folder, built once into the cache.

    folder = resolve_model_path("build:alfworld-base")   # $HGPO_JAX_CACHE/models/alfworld-base-v1
    folder = resolve_model_path("build:toy-tiny@plan-execute")  # its text as that agent writes it
    folder = resolve_model_path("build:toy-tiny/qwen3")  # a Qwen3 (default: qwen2; or llama)

A recipe that needs an env and a model together, so it lives above both: the tokenizer
(`hgpo_jax.models.local.train_tokenizer`) is trained on the env's own text, the (prompt,
response) turns of the episodes the env records (`EnvSpec.record_episodes`), written by the
verl-agent agent (`hgpo_jax.agents`; or the agent named after "@": its prompts are other text,
which a tokenizer trained on the verl-agent's would cut into many more tokens), rendered with the chat template (`hgpo_jax.sft.data`):
toy env: expert and random episodes of its train tasks;
ALFWorld: expert (walkthrough) episodes of 200 train games played on the real engine; WebShop:
200 scripted purchases of train goals. The weights are random (`build_model`).
"""

from __future__ import annotations

import os
import shutil
import uuid

from hgpo_jax.models.local import FAMILY_SETTINGS, SIZES, build_model, train_tokenizer
from hgpo_jax.models.tokenizer import QWEN2_5_CHAT_TEMPLATE

BUILD_PREFIX = "build:"
BUILD_VERSION = 1  # bump when the corpus, tokenizer or sizes change: older cached builds are not reused
CORPUS_EPISODES = 200  # expert episodes of the train split whose turns train the tokenizer


def buildable_envs() -> tuple[str, ...]:
    """The envs a model is built for: those whose registry entry declares a `built_model`."""
    from hgpo_jax.envs.registry import env_names, get_env

    return tuple(name for name in env_names() if get_env(name).built_model is not None)


def env_corpus(env: str, agent: str | None = None) -> list[str]:
    """The env's own text: the turns of the episodes its `built_model` names (default: expert
    episodes of the train split, recorded by the env's registry entry), as `agent` (default: the
    verl-agent agent) writes them, rendered with the chat template."""
    from hgpo_jax.agents import DEFAULT_AGENT, get_agent
    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.sft import data

    spec = get_env(env)
    built = spec.built_model
    if built is None:
        raise ValueError(f"no corpus for env {env!r}; use one of {buildable_envs()}")
    if built.episodes is not None:
        episodes = built.episodes()
    else:
        from hgpo_jax.config import EnvConfig

        episodes = spec.record_episodes(EnvConfig(name=env), "train", CORPUS_EPISODES, "expert")
    texts = data.samples_from_episodes(episodes, built.memory_len,
                                       get_agent(agent or DEFAULT_AGENT, env))
    return data.chat_texts(texts, QWEN2_5_CHAT_TEMPLATE)


def build_agent(path: str) -> str | None:
    """The agent after "@" in 'build:<env>-<size>@<agent>' (None: the default agent's text)."""
    return path.partition("/")[0].partition("@")[2] or None


def build_family(path: str) -> str:
    """The model family after "/" in 'build:<env>-<size>[@<agent>]/<family>' (default qwen2)."""
    family = path[len(BUILD_PREFIX):].partition("/")[2] or "qwen2"
    if family not in FAMILY_SETTINGS:
        raise ValueError(f"model.path {path!r}: no built models of family {family!r}; use one of "
                         f"{', '.join(FAMILY_SETTINGS)} after '/' (e.g. build:toy-tiny/qwen3)")
    return family


def parse_build_spec(path: str) -> tuple[str, str]:
    """'build:toy-small' (or 'build:toy-small@plan-execute', 'build:toy-small/llama') ->
    ('toy', 'small')."""
    spec = path[len(BUILD_PREFIX):].partition("/")[0].partition("@")[0]
    env, _, size = spec.rpartition("-")
    if env not in buildable_envs() or size not in SIZES:
        raise ValueError(f"model.path {path!r}: expected build:<env>-<size> with env in "
                         f"{buildable_envs()} and "
                         f"size in {sorted(SIZES)}, e.g. build:toy-small")
    build_family(path)
    agent = build_agent(path)
    if agent is not None:
        from hgpo_jax.agents import agent_names

        if agent not in agent_names():
            raise ValueError(f"model.path {path!r}: no agent {agent!r} to write the tokenizer's "
                             f"text; use one of {', '.join(agent_names())} after '@' (e.g. "
                             f"build:{env}-{size}@{agent_names()[-1]})")
    return env, size


def build_for_env(path: str, folder: str, seed: int = 0) -> str:
    """Build `path` ('build:<env>-<size>') into `folder` atomically (once; a half-built folder is
    never used)."""
    env, size = parse_build_spec(path)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    tmp = f"{folder}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        from hgpo_jax.envs.registry import get_env

        built = get_env(env).built_model
        tokenizer = train_tokenizer(env_corpus(env, build_agent(path)), built.vocab,
                                    isolate=built.isolate)
        build_model(tmp, tokenizer, size, seed=seed, family=build_family(path),
                    rope_theta=built.rope_theta)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not os.path.isfile(os.path.join(folder, "config.json")):
                raise  # not a concurrent build that won the race
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def is_built_on_use(path: str) -> bool:
    """Whether `model.path` names a model built here on first use ('tiny', 'build:...')."""
    return path == "tiny" or path.startswith(BUILD_PREFIX)


def model_path_folder(path: str) -> str:
    """The folder `resolve_model_path(path)` gives, without building or checking anything: for
    'tiny' and 'build:<env>-<size>' its place in the cache (it may not be built yet), else `path`."""
    from hgpo_jax.envs.data import cache_root
    from hgpo_jax.envs.registry import get_env

    if path == "tiny":
        return os.path.join(cache_root(), "tiny-qwen2")
    if path.startswith(BUILD_PREFIX):
        env, size = parse_build_spec(path)
        agent = build_agent(path)
        family = build_family(path)
        name = (f"{env}-{size}" + (f"-{agent}" if agent else "")
                + (f"-{family}" if family != "qwen2" else ""))
        version = get_env(env).built_model.version
        name += f"-v{BUILD_VERSION}" + (f".{version}" if version != 1 else "")
        return os.path.join(cache_root(), "models", name)
    return path


def resolve_model_path(path: str) -> str:
    """A model folder (config.json + weights + tokenizer) for `model.path`:
    'tiny' -> a tiny random Qwen2 built once in the cache; 'build:<env>-<size>[/<family>]' -> a
    model of that size and family (default qwen2) with a tokenizer trained on the env's text, built
    once in the cache; anything else must be an existing folder."""
    if path == "tiny":
        from hgpo_jax.models.tiny import build_tiny_pretrained

        folder = model_path_folder(path)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            print(f"building a tiny random Qwen2 in {folder} ...", flush=True)
            build_tiny_pretrained(folder, overwrite=True)
        return folder
    if path.startswith(BUILD_PREFIX):
        env, size = parse_build_spec(path)
        folder = model_path_folder(path)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            print(f"building {path} (tokenizer trained on the {env} env's text, random "
                  f"{size} {build_family(path)}) in {folder} ...", flush=True)
            build_for_env(path, folder)
        return folder
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"model.path {path!r} is not a local folder. Download the checkpoint (e.g. "
            "`huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir DIR`) and pass "
            "model.path=DIR, use a run folder of hgpo-jax (its latest checkpoint), or build one "
            "here: model.path=tiny or model.path=build:<env>-<size> (e.g. build:toy-small)")
    return path
