"""What ALFWorld-style envs say in their text and episodes, for the layers above: the task line of
an observation and episode success per task type (host code; no env or model state).

The prompts and the reply projection that lived here are an agent's business now
(`hgpo_jax.agents`, docs/agents.md): envs build no prompts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

_TASK_MARKER = "Your task is to: "


def task_from_observation(observation: str) -> str:
    """Everything after the first "Your task is to: " of an observation, stripped ('' if absent)."""
    at = observation.find(_TASK_MARKER)
    return observation[at + len(_TASK_MARKER):].strip() if at != -1 else ""


def success_rates(task_types: Sequence[str], won: Sequence[bool]) -> dict[str, float]:
    """Episode success overall and per task type: {'all': r, 'pick_and_place_simple': r, ...}."""
    if len(task_types) != len(won):
        raise ValueError(f"{len(task_types)} task types but {len(won)} outcomes")
    by_type = defaultdict(list)
    for t, w in zip(task_types, won):
        by_type[t].append(bool(w))
    rates = {t: sum(v) / len(v) for t, v in sorted(by_type.items())}
    rates["all"] = sum(map(bool, won)) / len(won) if len(won) else 0.0
    return rates
