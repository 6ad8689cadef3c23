"""Algorithms as units: one per family, chosen by the config's declaration.

    algorithm = build_algorithm(cfg, mesh, num_micro)   # cfg.algo.estimator -> its family's unit
    step = algorithm.policy_step(graphdef, tx, mesh, shardings, opt_shardings)  # its PPO-KL update
    state = algorithm.init_state(policy, seed)          # a critic's params and optimizer state
    adv = algorithm.advantages(rows, state, rows_pass)  # rows: base.StepRows -> base.Advantages
    state, metrics = algorithm.update_state(state, rows, adv, order, mesh)
    arrays = algorithm.state_arrays(state)              # saved as checkpoint item `state_item`

The path of the choice: `cfg.algo.estimator` -> `hgpo_jax.algo_specs.algorithm_spec` (its
declaration: family, critic heads, token advantages, ...) -> `FAMILIES[spec.family]` here -> that
unit's advantage stage and state update -> the device code (`rl.advantages`, `rl.critic`). The
trainer and `plan` read the declaration and call the unit; nothing else names an algorithm.

A run's resume and export ask here about the state a checkpoint holds, before anything loads:
`state_signature(spec)` (what algorithm `spec` needs), `saved_state_signature(items,
item_shapes)` (what a checkpoint holds, from its metadata alone) and `describe_state`. A
signature is a tuple whose first entry is the family's `state_item`; None is no state.
Adding a family: a module here with an `Algorithm` subclass, its line in `FAMILIES`, its
declaration in `hgpo_jax.algo_specs.ALGORITHMS` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from hgpo_jax.algo_specs import AlgorithmSpec
from hgpo_jax.rl.algorithms.base import (Advantages, Algorithm, LinkedTurns, StatePlan, StepRows,
                                         loss_config, scoring_temperature)
from hgpo_jax.rl.algorithms.critic import CriticAlgorithm
from hgpo_jax.rl.algorithms.group import GroupAlgorithm, diagnostic_metrics
from hgpo_jax.rl.algorithms.hiper import HiperAlgorithm

FAMILIES = {"group": GroupAlgorithm, "critic": CriticAlgorithm, "hiper": HiperAlgorithm}


def family_of(spec: AlgorithmSpec) -> type[Algorithm]:
    """The unit class of algorithm `spec`'s family."""
    return FAMILIES[spec.family]


def build_algorithm(cfg, mesh=None, num_micro: int = 1, tokenizer=None) -> Algorithm:
    """The unit of `cfg.algo.estimator`'s family, on the run's mesh (`num_micro`: micro-batches
    per mini-batch; `tokenizer`: the policy's)."""
    spec = cfg.algo.spec
    return family_of(spec)(cfg, spec, mesh, num_micro, tokenizer)


def state_signature(spec: AlgorithmSpec) -> Hashable | None:
    """What a checkpoint must hold for algorithm `spec`'s state (None: it has none)."""
    return family_of(spec).state_signature(spec)


def saved_state_signature(items: list[str], item_shapes: Callable) -> Hashable | None:
    """The signature of the algorithm state a checkpoint holds (None: none), from its item names
    `items` and item_shapes(item) -> the item's tree of shape tuples (no array is read)."""
    for family in FAMILIES.values():
        if family.state_item is not None and family.state_item in items:
            return family.checkpoint_signature(item_shapes(family.state_item))
    return None


def describe_state(signature: Hashable | None, other: Hashable | None = None) -> str:
    """A state signature in words ("a critic of 3 value heads"); None as "no <other's item>"
    ("no critic"; "no state" when `other` is None too)."""
    if signature is None:
        return f"no {other[0] if other else 'state'}"
    family = next(f for f in FAMILIES.values() if f.state_item == signature[0])
    return family.describe_state(signature)


__all__ = ["Advantages", "Algorithm", "CriticAlgorithm", "FAMILIES", "GroupAlgorithm", "HiperAlgorithm",
           "LinkedTurns", "StatePlan", "StepRows", "build_algorithm", "describe_state",
           "diagnostic_metrics", "family_of", "loss_config", "saved_state_signature",
           "scoring_temperature", "state_signature"]
