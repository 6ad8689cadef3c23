"""A small, fast, deterministic text environment where the right action depends on history.

The "button-corridor-door" game (task = any int):
  1. A room with coloured buttons: the agent presses one (any colour is fine).
  2. A corridor of a task-dependent length: "go forward" advances, "look" stays.
  3. A junction with one door per colour: opening the door of the colour pressed in step 1 wins
     (reward 10), any other door ends the episode (reward 0).

The junction observation is the same whatever button was pressed, so steps that share the
junction anchor can need different actions: exactly the "context inconsistency" that HGPO's
history-aware groups (level k >= 1) resolve and that GiGPO's anchor-only groups blur.

`reveal=True` (the "toy-history" env) makes that history visible in the observations, as HGPO's
hierarchy needs (it groups by past *observations*): the first corridor observation after the
press names its colour ("A red light blinks."), and the junction lists the doors in a
task-dependent order different from the buttons', so no fixed position-to-position habit wins:
the agent has to carry the colour from its memory to the door.
Same protocol and info keys as ALFWorld (`hgpo_jax.envs.base`). Unknown actions answer
"Nothing happens." and change nothing. Importable as `hgpo_jax.envs.toy` (the toy family's
package); its splits and scripted episodes are the family's (`common.py`).
"""

from __future__ import annotations

from collections.abc import Iterable

from hgpo_jax.envs.episodes import Episode
from hgpo_jax.envs.toy.common import (EXPERT_MAX_STEPS, KINDS, SPLIT_OFFSET, SPLITS,
                                      expert_trajectories, list_tasks, scripted_episodes)

PALETTE = ("red", "blue", "green", "yellow", "white", "black")
WIN_REWARD = 10.0
TASK = "open the door of the colour of the button you pressed."


def env_kwargs(name: str) -> dict:
    """ToyMemoryEnv's keyword arguments for an env name: 'toy', or 'toy-history' (reveal=True)."""
    if name not in ("toy", "toy-history"):
        raise ValueError(f"{name!r} is not a toy env; use 'toy' or 'toy-history'")
    return {"reveal": name == "toy-history"}


def _join(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else items[0]


class ToyMemoryEnv:
    """Button-corridor-door game; `reset(task: int)`. See the module docstring."""

    task_type = "memory"

    def __init__(self, max_steps: int = 50, num_colors: int = 3, reveal: bool = False):
        if not 2 <= num_colors <= len(PALETTE):
            raise ValueError(f"num_colors must be in [2, {len(PALETTE)}], got {num_colors}")
        self.max_steps = max_steps
        self.num_colors = num_colors
        self.reveal = reveal
        self._task = None

    # ------------------------------------------------------------------ protocol
    def reset(self, task) -> tuple[str, dict]:
        task = int(task)
        offset = task % len(PALETTE)
        self.colors = [PALETTE[(offset + i) % len(PALETTE)] for i in range(self.num_colors)]
        self.doors = list(self.colors)
        if self.reveal:  # a task-dependent rotation other than the identity
            shift = 1 + (task // len(PALETTE)) % (self.num_colors - 1)
            self.doors = self.colors[shift:] + self.colors[:shift]
        self.corridor = 1 + task % 3
        self._task, self.pressed, self.progress, self.steps = task, None, 0, 0
        self.phase, self.won = "room", False
        return self._observe(f"Task {task}: open the door of the colour you choose.")

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._task is None:
            raise RuntimeError("call reset(task) before step()")
        if self.phase == "over":
            obs, info = self._observe("The episode is over.")
            return obs, 0.0, True, info
        self.steps += 1
        action = " ".join(str(action).lower().split())
        reward, message = 0.0, None
        if action not in self._admissible():
            message = "Nothing happens."
        elif self.phase == "room":
            self.pressed, self.phase = action.split()[1], "corridor"
            message = "You hear a click somewhere ahead."
        elif self.phase == "corridor":
            if action == "go forward":
                self.progress += 1
                if self.progress >= self.corridor:
                    self.phase = "junction"
        else:  # junction
            opened = action.split()[1]
            self.won = opened == self.pressed
            reward = WIN_REWARD if self.won else 0.0
            message = "The door opens. You win!" if self.won else "The door is locked. You lose."
            self.phase = "over"
        done = self.phase == "over" or self.steps >= self.max_steps
        obs, info = self._observe(message)
        return obs, reward, done, info

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ helpers
    def _admissible(self) -> list[str]:
        if self.phase == "room":
            return [f"press {c} button" for c in self.colors]
        if self.phase == "corridor":
            return ["go forward", "look"]
        if self.phase == "junction":
            return [f"open {c} door" for c in self.doors]
        return []

    def _scene(self) -> str:
        if self.phase == "room":
            return f"You are in a room with a {_join([c + ' button' for c in self.colors])}."
        if self.phase == "corridor":
            light = f"A {self.pressed} light blinks. " if self.reveal and self.progress == 0 else ""
            return f"{light}You are in a corridor, {self.corridor - self.progress} step(s) from its end."
        if self.phase == "junction":
            return f"You are at a junction with a {_join([c + ' door' for c in self.doors])}."
        return "The episode is over."

    def _observe(self, message: str | None) -> tuple[str, dict]:
        scene = self._scene()
        obs = f"{message} {scene}" if message else scene
        info = {"admissible_actions": self._admissible(), "won": self.won,
                "task_type": self.task_type, "anchor": scene, "task": TASK}
        return obs, info

    def solution(self) -> list[str]:
        """An optimal action sequence from the current reset state (for tests and demos)."""
        color = self.colors[0]
        return [f"press {color} button"] + ["go forward"] * self.corridor + [f"open {color} door"]


# --------------------------------------------------------------------------- registry entries
_SPLIT_OFFSET, _list_tasks = SPLIT_OFFSET, list_tasks  # older names, for importers
TOY_KINDS = KINDS  # the episode kinds toy_episodes records


def _make_env(env_cfg):
    import functools

    return functools.partial(ToyMemoryEnv, max_steps=env_cfg.max_steps, **env_kwargs(env_cfg.name))


def toy_episodes(tasks: Iterable[int], kind: str = "expert", *, seed: int = 0, max_steps: int = 50,
                 **env_kwargs) -> list[Episode]:
    """Toy-env episodes: kind "expert" plays its scripted solution (always wins), "random" a
    uniformly random admissible action at every step (the format without the skill)."""
    return scripted_episodes(ToyMemoryEnv(max_steps=max_steps, **env_kwargs), tasks, kind,
                             seed=seed, max_steps=max_steps, name="toy")


def _record_episodes(env_cfg, split: str, n: int, kind: str, *, seed: int = 0,
                     progress: bool = False) -> list:
    return toy_episodes(list_tasks(env_cfg, split)[:n], kind, seed=seed,
                        max_steps=env_cfg.max_steps, **env_kwargs(env_cfg.name))


# --------------------------------------------------------------------------- expert trajectories
def _expert_trajectories(env_cfg, split: str, *, progress: bool = False, workers: int = 1,
                         tasks=None) -> dict[int, tuple[str, ...]]:
    """The registry's expert_trajectories: each task's scripted solution (`solution()`), played
    to check it wins. Instant, so nothing is kept on disk; progress and workers are unused."""
    import functools

    make = functools.partial(ToyMemoryEnv, max_steps=EXPERT_MAX_STEPS, **env_kwargs(env_cfg.name))
    return expert_trajectories(make, env_cfg, split, tasks=tasks)


def corpus_episodes() -> list:
    """The episodes whose turns train a built toy model's tokenizer: expert and random episodes of
    300 tasks, in both variants (the 'toy' and the 'toy-history' text)."""
    return [ep for reveal in (False, True) for ep in
            toy_episodes(range(300), "expert", reveal=reveal)
            + toy_episodes(range(300), "random", seed=1, max_steps=12, reveal=reveal)]


def _env_specs() -> dict:
    from hgpo_jax.envs.registry import BuiltModel, EnvSpec

    built = {"toy": BuiltModel(vocab=1024, episodes=corpus_episodes, memory_len=4)}
    return {name: EnvSpec(
        name=name, make_env=_make_env, list_tasks=list_tasks, splits=SPLITS,
        eval_splits=("valid_seen", "valid_unseen"),
        record_episodes=_record_episodes, episode_kinds=TOY_KINDS,
        expert_trajectories=_expert_trajectories, built_model=built.get(name))
        for name in ("toy", "toy-history")}


ENV_SPECS = _env_specs()
