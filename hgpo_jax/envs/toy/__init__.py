"""The toy envs: small, fast, deterministic text games for tests and algorithm studies.

| env | module | what it shows |
|---|---|---|
| `toy`, `toy-history` | `memory.py` (`ToyMemoryEnv`) | the right action depends on history |
| `toy-lock` | `lock.py` (`ToyLockEnv`) | sparse reward, every step readable (guidance) |

Their splits of task ints and scripted (expert, random) episodes are shared (`common.py`). The
button-corridor-door game's names stay importable from here (`from hgpo_jax.envs.toy import
ToyMemoryEnv`); the registry reads `ENV_SPECS`, every toy env's.
"""

from __future__ import annotations

from hgpo_jax.envs.toy import lock
from hgpo_jax.envs.toy.lock import ToyLockEnv, lock_episodes
from hgpo_jax.envs.toy.memory import (_SPLIT_OFFSET, EXPERT_MAX_STEPS, PALETTE, SPLITS, TASK,
                                      TOY_KINDS, WIN_REWARD, ToyMemoryEnv, _expert_trajectories,
                                      _join, _list_tasks, _make_env, _record_episodes,
                                      corpus_episodes, env_kwargs, toy_episodes)
from hgpo_jax.envs.toy.memory import ENV_SPECS as _MEMORY_SPECS

__all__ = ["EXPERT_MAX_STEPS", "PALETTE", "SPLITS", "TASK", "TOY_KINDS", "WIN_REWARD",
           "ToyLockEnv", "ToyMemoryEnv", "corpus_episodes", "env_kwargs", "lock_episodes",
           "toy_episodes", "ENV_SPECS", "_SPLIT_OFFSET", "_expert_trajectories", "_join",
           "_list_tasks", "_make_env", "_record_episodes"]

ENV_SPECS = {**_MEMORY_SPECS, **lock.ENV_SPECS}
