"""A worked example: a guidance kind with an option and a state of its own, end to end
(docs/architecture.md, "How to add a guidance"; run by tests/test_guided_rollout.py).

"hint": every training rollout starts with the first `guidance.hint_steps` steps of its task's
expert replayed, for as long as the run's success so far is below one half. The success so far
is the kind's state: the wins and the episodes it has seen, kept in every checkpoint (meta
`guidance`) and restored on resume. `guidance.hint_steps` is its option (1 by default, checked
>= 0).

In the project the three parts are edits of two files and one new module: the options class and
the declaration in `hgpo_jax/guidance_specs.py` (the class added to `GUIDANCE_OPTIONS`, the spec
to `GUIDANCE_KINDS`), the unit in a module of `hgpo_jax/rl/guides/` with its line in `GUIDES`.
Here they are made when this script starts, before `hgpo_jax.config` is imported (its `guidance`
section is built from `GUIDANCE_OPTIONS`), so the test changes no file of the package:

    python tests/example_guidance.py '[["train", "tiny_cpu_toy", "guidance.kind=hint"], ...]'

runs each hgpo-jax command line of the JSON list in turn and prints their exit codes as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from hgpo_jax import guidance_specs


# 1. Its options: fields with their defaults, checked beside them.
@dataclasses.dataclass
class HintOptions(guidance_specs.Options):
    hint_steps: int = 1  # expert steps replayed before each rollout while success < 1/2

    def _own_problems(self, p) -> None:
        p.at_least("hint_steps", self.hint_steps, 0)


# 2. Its declaration: the options it reads (its key is refused for every other kind, and the
# other kinds' keys for it) and what it needs of the env (experts to replay).
guidance_specs.GUIDANCE_OPTIONS += (HintOptions,)
guidance_specs.GUIDANCE_KINDS["hint"] = guidance_specs.GuidanceSpec(
    "hint", "the expert's first steps replayed while the run's success is below 1/2",
    options=(HintOptions,), experts=True)

from hgpo_jax.envs.registry import get_env  # noqa: E402  (after the declaration)
from hgpo_jax.rl import guides  # noqa: E402
from hgpo_jax.rl.guides.replay import ReplayingPool  # noqa: E402


# 3. Its unit: what it needs before the weights, its plans, its pool, its update and its state.
class Hint(guides.Guidance):
    """Plans: each rollout's expert steps to replay (a list of actions per rollout)."""

    name = "hint"

    def __init__(self, cfg, prepared, *, tokenizer=None, agent=None):
        super().__init__(cfg)
        self.experts = prepared
        self.wins, self.episodes = 0, 0

    @classmethod
    def prepare(cls, cfg, *, drawn_tasks, progress, saved):
        """The experts of the tasks the run will draw (recorded before the weights load)."""
        return get_env(cfg.env.name).expert_trajectories(cfg.env, cfg.env.split,
                                                         progress=progress, tasks=drawn_tasks())

    def steps(self) -> int:
        return self.cfg.guidance.hint_steps if 2 * self.wins < self.episodes or not self.episodes \
            else 0

    def plan(self, tasks, group_size):
        steps = self.steps()
        return [list(self.experts.get(t, ()))[:steps] for t in tasks for _ in range(group_size)]

    def pool(self, env_pool, plans, max_steps):
        return ReplayingPool(env_pool, plans, max_steps)

    def update(self, plans, episode_traj, episode_won):
        self.wins += int(sum(bool(w) for w in episode_won))
        self.episodes += len(episode_won)
        return {"hint/steps": float(max(map(len, plans), default=0)),
                "hint/success_so_far": self.wins / max(self.episodes, 1)}

    def state_dict(self):
        return {"wins": self.wins, "episodes": self.episodes}

    def load_state_dict(self, state):
        if "wins" not in state:
            raise ValueError("the checkpoint's guidance state is not a hint's; resume with its "
                             "guidance.kind")
        self.wins, self.episodes = int(state["wins"]), int(state["episodes"])


guides.GUIDES["hint"] = Hint


def main(commands: list[list[str]]) -> list[int]:
    """Each command line through `hgpo_jax.cli.main`, in turn -> their exit codes."""
    from hgpo_jax.cli import main as cli_main

    return [cli_main(argv) for argv in commands]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
