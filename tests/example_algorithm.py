"""A worked example: an algorithm with an option and a device state of its own, end to end
(docs/architecture.md, "How to add an algorithm"; run by tests/test_algorithms.py).

"ema": every step row's advantage is its episode's reward minus a running baseline, an
exponential moving average of the batches' mean episode reward. The baseline is the algorithm's
state: a device array made at the start of the run, updated after each iteration's advantages,
saved in every checkpoint (item "ema") and restored on resume. `algo.baseline_decay` is its
option (the average's decay, 0.9 by default, checked in [0, 1]).

In the project the three parts are edits of two files: the options class and the declaration in
`hgpo_jax/algo_specs.py` (the class added to `ALGO_OPTIONS`, the spec to `ALGORITHMS`), the unit
in a module of `hgpo_jax/rl/algorithms/` with its line in `FAMILIES`. Here they are made when
this script starts, before `hgpo_jax.config` is imported (its `algo` section is built from
`ALGO_OPTIONS`), so the test changes no file of the package:

    python tests/example_algorithm.py '[["train", "tiny_cpu_toy", "algo.estimator=ema"], ...]'

runs each hgpo-jax command line of the JSON list in turn and prints their exit codes as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import jax.numpy as jnp
import numpy as np

from hgpo_jax import algo_specs
from hgpo_jax import distributed as dist


# 1. Its options: fields with the defaults of the runs it reproduces, checked beside them.
@dataclasses.dataclass
class BaselineOptions(algo_specs.Options):
    baseline_decay: float = 0.9  # the running baseline's decay per iteration

    def _own_problems(self, p) -> None:
        p.in_range("baseline_decay", self.baseline_decay, 0, 1, "in [0, 1]")


# 2. Its declaration: the options it reads (a key of another algorithm's is refused for it, and
# `algo.baseline_decay` for every other algorithm), what it needs of the run.
algo_specs.ALGO_OPTIONS += (BaselineOptions,)
algo_specs.ALGORITHMS["ema"] = algo_specs.AlgorithmSpec(
    "ema", "ema", "each step gets its episode's reward minus a running baseline",
    singleton_groups=True, options=(BaselineOptions,))

from hgpo_jax.rl import algorithms  # noqa: E402  (after the declaration, as the package's own)
from hgpo_jax.rl.algorithms import Advantages, Algorithm, StepRows  # noqa: E402


# 3. Its unit: the advantage stage, and the state it owns.
class EmaBaseline(Algorithm):
    """Advantages float32 [S]: episode reward - baseline for the n real rows, 0 for inert ones;
    the state: the baseline, a float32 scalar on the device."""

    state_item = "ema"  # the checkpoint item of its state

    def init_state(self, policy, seed: int):
        return jnp.zeros((), jnp.float32)

    def state_arrays(self, state) -> dict:
        return {"baseline": state}

    def restore_state(self, arrays: dict):
        return arrays["baseline"]

    @classmethod
    def state_signature(cls, spec):
        return ("ema",)  # any saved baseline resumes it

    @classmethod
    def checkpoint_signature(cls, item_shapes):
        return ("ema",)

    @classmethod
    def describe_state(cls, signature) -> str:
        return "an EMA baseline"

    def advantages(self, rows: StepRows, state, rows_pass) -> Advantages:
        n = rows.num_rows
        episode = rows.turns.episode_rewards()                            # [S], inert rows 0
        adv = np.zeros(episode.shape, np.float32)
        adv[:n] = episode[:n] - float(state)
        return Advantages(adv, adv[:n], {"ema/baseline": float(state)})

    def update_state(self, state, rows: StepRows, adv: Advantages, order, mesh):
        """After the advantages, before the policy's update: the baseline moves towards this
        iteration's mean episode reward over every process's rows."""
        episode = rows.turns.episode_rewards()[:rows.num_rows]
        total, count = np.sum(dist.allgather_json([float(episode.sum()), len(episode)]), axis=0)
        mean = total / max(count, 1)
        decay = self.cfg.algo.baseline_decay
        return decay * state + (1.0 - decay) * mean, [{"ema/batch_mean": mean}]


algorithms.FAMILIES["ema"] = EmaBaseline


def main(commands: list[list[str]]) -> list[int]:
    """Each command line through `hgpo_jax.cli.main`, in turn -> their exit codes."""
    from hgpo_jax.cli import main as cli_main

    return [cli_main(argv) for argv in commands]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
