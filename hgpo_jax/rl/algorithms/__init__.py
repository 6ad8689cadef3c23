"""Algorithms as units: one per family, chosen by the config's declaration.

    algorithm = build_algorithm(cfg, mesh, num_micro)   # cfg.algo.estimator -> its family's unit
    step = algorithm.policy_step(graphdef, tx, mesh, shardings, opt_shardings)  # its PPO-KL update
    state = algorithm.init_state(policy, seed)          # a critic's params and optimizer state
    adv = algorithm.advantages(rows, state, rows_pass)  # rows: base.StepRows -> base.Advantages

The path of the choice: `cfg.algo.estimator` -> `hgpo_jax.algo_specs.algorithm_spec` (its
declaration: family, critic heads, token advantages, ...) -> `FAMILIES[spec.family]` here -> that
unit's advantage stage and critic update -> the device code (`rl.advantages`, `rl.critic`). The
trainer and `plan` read the declaration and call the unit; nothing else names an algorithm.
Adding a family: a module here with an `Algorithm` subclass, its line in `FAMILIES`, its
declaration in `hgpo_jax.algo_specs.ALGORITHMS` (docs/architecture.md).
"""

from __future__ import annotations

from hgpo_jax.rl.algorithms.base import (Advantages, Algorithm, LinkedTurns, StepRows,
                                         loss_config, scoring_temperature)
from hgpo_jax.rl.algorithms.critic import CriticAlgorithm
from hgpo_jax.rl.algorithms.group import GroupAlgorithm, diagnostic_metrics
from hgpo_jax.rl.algorithms.hiper import HiperAlgorithm

FAMILIES = {"group": GroupAlgorithm, "critic": CriticAlgorithm, "hiper": HiperAlgorithm}


def build_algorithm(cfg, mesh=None, num_micro: int = 1, tokenizer=None) -> Algorithm:
    """The unit of `cfg.algo.estimator`'s family, on the run's mesh (`num_micro`: micro-batches
    per mini-batch; `tokenizer`: the policy's)."""
    spec = cfg.algo.spec
    return FAMILIES[spec.family](cfg, spec, mesh, num_micro, tokenizer)


__all__ = ["Advantages", "Algorithm", "CriticAlgorithm", "FAMILIES", "GroupAlgorithm", "HiperAlgorithm",
           "LinkedTurns", "StepRows", "build_algorithm", "diagnostic_metrics", "loss_config",
           "scoring_temperature"]
