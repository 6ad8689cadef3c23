"""Record verl-agent's search-QA projection and prompts on random cases: the fixture
tests/data/search_agent_reference.json that tests/test_search_agent.py checks
`hgpo_jax.agents.verl_agent.search` against.

    python tests/data/search_agent_reference.py /tmp/verl-agent-20bd331 \
        tests/data/search_agent_reference.json

The first argument is an exported tree of verl-agent at 20bd331 (the project holds none of their
code) holding at least the files in FILES, e.g. (the mirror of the fork zzj1111/alfworldauto
lacks a blob under env_package/webshop, so export these paths rather than all of agent_system):

    git --git-dir=<mirror> archive 20bd331 agent_system/environments/base.py \
        agent_system/environments/env_manager.py agent_system/environments/prompts \
        agent_system/environments/env_package/search/projection.py agent_system/memory \
        | tar -x -C /tmp/verl-agent-20bd331

This script imports nothing of hgpo_jax: it loads their files by path and only drives their
functions, then writes inputs and outputs (JSON, compact, UTF-8):

- projection: their `search_projection` (env_package/search/projection.py) on random replies
  (think/search/answer blocks in mixed case, "ſ" for "s", nested, duplicated, unclosed and empty
  tags, stray close tags, text after the blocks, newlines, Unicode blanks and text):
  [reply, action, valid] per reply;
- prompts: their `SearchEnvironmentManager` itself (env_manager.py lines 45-117: `__init__`,
  `reset`, `step`, `build_text_obs`; its memory is their `SearchMemory` from memory/memory.py,
  its templates their `SEARCH_TEMPLATE_NO_HIS`/`SEARCH_TEMPLATE` from prompts/search.py, its
  projection their `search_projection`), on episodes of 0-6 steps with env.history_length 0-5.
  The only glue is the stand-in for their vectorised env (`ScriptedEnvs`: `reset` returns the
  question as the observation, as SkyRL's SearchEnv does; `step` returns a scripted observation,
  an `<information>{json}</information>` text or "", with reward 0 and not done) and the config
  object (`config.env.history_length`). Per episode: the question, history_length, the history
  as their memory holds it ([projected action, observation that followed], oldest first), the
  sha256[:16] of the prompt after each step (index 0: after reset) and the last prompt in full.

Their module-level imports that play no part here are stubbed in `sys.modules`: `torch` (a
`Tensor` class for their `to_numpy`'s isinstance test) and `omegaconf`; the packages
`agent_system` and `agent_system.environments` are empty stand-ins, so only the files named above
are executed (prompts/search.py stands for `agent_system.environments.prompts`, whose
`import *` is the templates' only use in env_manager.py and environments/base.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import types
from types import SimpleNamespace

import numpy as np

SEED = 20260517
N_REPLIES = 600
N_EPISODES = 300
MAX_STEPS = 6
MAX_HISTORY_LENGTH = 5
COMMIT = "20bd331"
FILES = ("agent_system/environments/env_package/search/projection.py",
         "agent_system/environments/prompts/search.py",
         "agent_system/memory/memory.py",
         "agent_system/memory/base.py",
         "agent_system/environments/base.py",
         "agent_system/environments/env_manager.py")

WORDS = ["who", "wrote", "the", "Iliad", "capital", "of", "France", "Paris", "café", "naïve",
         "東京", "中文", "🙂", "{braces}", "{task_description}", "it's", '"quoted"',
         "back\\slash", "1984", "Beijing", "search", "answer", "Step 2:", "<information>", "x" * 40]
BLANKS = [" ", "  ", "\n", "\t", "\u00a0", "\u3000", "\x85", "\r\n", ""]
SEPARATORS = ["", " ", "\n", "\n\n", " \t"]
SEARCH_OPEN = ["<search>", "<search>", "<search>", "<Search>", "<SEARCH>", "<ſearch>",
               "<search >", "<search"]
SEARCH_CLOSE = ["</search>", "</search>", "</search>", "</Search>", "</SEARCH>", "</ſearch>", ""]
ANSWER_OPEN = ["<answer>", "<answer>", "<answer>", "<Answer>", "<ANSWER>", "<answer >"]
ANSWER_CLOSE = ["</answer>", "</answer>", "</answer>", "</Answer>", "</ANSWER>", ""]


# ------------------------------------------------------------------------------ their code
def _load(name: str, path: str, package_dir: str | None = None) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[package_dir] if package_dir else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_authors(root: str) -> SimpleNamespace:
    """Their projection function, templates and SearchEnvironmentManager, loaded from `root`."""
    torch = types.ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})
    omegaconf = types.ModuleType("omegaconf")
    omegaconf.OmegaConf = None
    sys.modules["torch"], sys.modules["omegaconf"] = torch, omegaconf
    for name in ("agent_system", "agent_system.environments"):
        package = types.ModuleType(name)
        package.__path__ = []  # a package that finds nothing by itself
        sys.modules[name] = package
    env_dir = os.path.join(root, "agent_system", "environments")
    memory_dir = os.path.join(root, "agent_system", "memory")
    prompts = _load("agent_system.environments.prompts",
                    os.path.join(env_dir, "prompts", "search.py"))
    _load("agent_system.memory", os.path.join(memory_dir, "__init__.py"), memory_dir)
    _load("agent_system.environments.base", os.path.join(env_dir, "base.py"))
    manager = _load("agent_system.environments.env_manager",
                    os.path.join(env_dir, "env_manager.py"))
    projection = _load("authors_search_projection",
                       os.path.join(env_dir, "env_package", "search", "projection.py"))
    return SimpleNamespace(search_projection=projection.search_projection,
                           SearchEnvironmentManager=manager.SearchEnvironmentManager,
                           templates=(prompts.SEARCH_TEMPLATE_NO_HIS, prompts.SEARCH_TEMPLATE))


class ScriptedEnvs:
    """A one-env stand-in for their SearchMultiProcessEnv: reset gives the question, step the
    next scripted observation (reward 0, not done)."""

    def __init__(self, question: str, observations: list[str]):
        self.question, self.observations, self.actions = question, list(observations), []

    def reset(self, kwargs):
        return [self.question], [{}]

    def step(self, actions):
        self.actions.append(actions[0])
        return [self.observations[len(self.actions) - 1]], [0.0], [False], [{}]


# ------------------------------------------------------------------------------ random text
def text(rng, most: int = 4) -> str:
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=rng.integers(0, most + 1))]
    return " ".join(words)


def pick(rng, options):
    return options[rng.integers(0, len(options))]


def padded(rng, inner: str) -> str:
    return pick(rng, BLANKS) + inner + pick(rng, BLANKS)


def fragment(rng) -> str:
    kind = rng.integers(0, 12)
    if kind == 0:
        return f"<think>{text(rng)}</think>"
    if kind == 1:
        return pick(rng, ["<THINK>", "<think>", ""]) + text(rng) + pick(rng, ["</think>", ""])
    if kind in (2, 3, 4):
        return pick(rng, SEARCH_OPEN) + padded(rng, text(rng)) + pick(rng, SEARCH_CLOSE)
    if kind in (5, 6):
        return pick(rng, ANSWER_OPEN) + padded(rng, text(rng, 2)) + pick(rng, ANSWER_CLOSE)
    if kind == 7:  # nested
        inner = f"<answer>{text(rng, 2)}</answer>"
        return pick(rng, [f"<search>{inner}</search>", f"<answer><search>{text(rng)}</search>"
                          f"</answer>", f"<search>{text(rng)}<search>{text(rng)}</search>"])
    if kind == 8:  # stray tags
        return pick(rng, ["</search>", "</answer>", "<search>", "<answer>", "</SEARCH>", "<>"])
    if kind == 9:  # empty blocks
        return pick(rng, ["<search></search>", "<answer></answer>", "<search> \n </search>",
                          "<answer>\u3000</answer>"])
    return text(rng, 8)


def random_reply(rng) -> str:
    parts = [fragment(rng) for _ in range(rng.integers(1, 6))]
    return "".join(p + pick(rng, SEPARATORS) for p in parts)


def episode_reply(rng) -> str:
    """Mostly well-formed replies (a search or an answer), some random ones."""
    roll = rng.random()
    think = f"<think>{text(rng)}</think>" + pick(rng, ["", "\n", " "])
    if roll < 0.55:
        return think + f"<search>{padded(rng, text(rng))}</search>"
    if roll < 0.75:
        return think + f"<answer>{text(rng, 2)}</answer>"
    return random_reply(rng)


def information(rng) -> str:
    docs = "".join(f'Doc {i + 1}: "{text(rng, 2)}"\n{text(rng, 6)}\n'
                   for i in range(rng.integers(1, 4)))
    return "<information>" + json.dumps({"result": docs}) + "</information>"


def observation(rng) -> str:
    roll = rng.random()
    if roll < 0.7:
        return information(rng)
    if roll < 0.9:
        return ""
    return text(rng, 6)


def question(rng) -> str:
    return text(rng, 8) + pick(rng, ["?", "", " ?", "\n"])


def sha(text_: str) -> str:
    return hashlib.sha256(text_.encode("utf-8")).hexdigest()[:16]


# ------------------------------------------------------------------------------ cases
def projection_cases(authors, rng) -> list:
    replies = [random_reply(rng) for _ in range(N_REPLIES)]
    replies += ["", "<think>t</think>", "<search>q</search>", "<answer>a</answer>"]
    actions, valids = authors.search_projection(replies)
    return [[r, a, bool(v)] for r, a, v in zip(replies, actions, valids)]


def prompt_cases(authors, rng) -> list:
    cases = []
    for _ in range(N_EPISODES):
        q = question(rng)
        steps = int(rng.integers(0, MAX_STEPS + 1))
        history_length = int(rng.integers(0, MAX_HISTORY_LENGTH + 1))
        envs = ScriptedEnvs(q, [observation(rng) for _ in range(steps)])
        config = SimpleNamespace(env=SimpleNamespace(history_length=history_length))
        manager = authors.SearchEnvironmentManager(envs, authors.search_projection, config)
        observations, _ = manager.reset({})
        prompts = [observations["text"][0]]
        for _ in range(steps):
            observations, *_ = manager.step([episode_reply(rng)])
            prompts.append(observations["text"][0])
        history = [[rec["search"], rec["information"]] for rec in manager.memory[0]]
        cases.append({"question": q, "history_length": history_length, "history": history,
                      "hashes": [sha(p) for p in prompts], "prompt": prompts[-1]})
    return cases


def main(root: str, out_path: str) -> None:
    authors = load_authors(root)
    rng = np.random.default_rng(SEED)
    fixture = {
        "source": {"repo": "verl-agent (read from its fork zzj1111/alfworldauto)", "commit": COMMIT,
                   "files": list(FILES), "script": "tests/data/search_agent_reference.py"},
        "seed": SEED,
        "templates": list(authors.templates),
        "projection": projection_cases(authors, rng),
        "prompts": prompt_cases(authors, rng),
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, separators=(",", ":"), ensure_ascii=False)
    valid = sum(v for _, _, v in fixture["projection"])
    print(f"{out_path}: {len(fixture['projection'])} replies ({valid} valid), "
          f"{len(fixture['prompts'])} episodes, {os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
