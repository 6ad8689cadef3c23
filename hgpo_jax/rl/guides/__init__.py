"""Guidance as a unit, one per `guidance.kind` (declared in `hgpo_jax.guidance_specs`): what a
kind adds to a run's rollouts and updates, behind one interface the trainer calls without
knowing which kind it holds.

    unit_type = guidance_unit(cfg.guidance.kind)                        # e.g. AgentG2
    prepared = unit_type.prepare(cfg, drawn_tasks=..., progress=..., saved=...)  # before weights
    guidance = unit_type(cfg, prepared, tokenizer=tokenizer, agent=agent)
    plans = guidance.plan(tasks, group_size)        # every rollout's plan, every process alike
    pool = guidance.pool(env_pool, plans[lo:hi], max_steps)  # this process's rollouts' pool
    batch = collect_rollouts(policy, pool, ...)    # the rollout loop names no guidance
    metrics = guidance.update(plans, episode_traj, episode_won)  # before the advantages
    sft = guidance.sft_rows(batch)                 # supervised rows for the update, or None
    meta["guidance"] = guidance.state_dict()       # with the checkpoints (None: nothing)

`base.Guidance` is the kind `none` (nothing replayed, nothing added) and the base of
every other: a kind overrides what it adds. Kinds: `g2` (`rl.guides.g2.AgentG2`: Agent-G²'s
expert prefixes, replayed by a wrapper of the env pool, `rl.guides.replay.ReplayingPool`).
Adding a kind: a module here with a `Guidance` subclass, its line in `GUIDES`, its declaration
in `hgpo_jax.guidance_specs.GUIDANCE_KINDS` (docs/architecture.md, worked in
tests/example_guidance.py).
"""

from __future__ import annotations

from hgpo_jax.rl.guides.base import Guidance
from hgpo_jax.rl.guides.g2 import AgentG2

GUIDES: dict[str, type[Guidance]] = {"none": Guidance, "g2": AgentG2}


def guidance_unit(kind: str) -> type[Guidance]:
    """The unit of `guidance.kind` (a ValueError naming the known kinds)."""
    if kind not in GUIDES:
        raise ValueError(f"no guidance unit for guidance.kind={kind!r}; known: {', '.join(GUIDES)}")
    return GUIDES[kind]
