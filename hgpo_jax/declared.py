"""Things declared by name in the modules that provide them (envs, agents): gathered on first
use, looked up with an error that names the known ones.

    specs = gather(("hgpo_jax.envs.toy", ...), "ENV_SPECS", "env")   # {name: spec}
    spec = lookup(specs, "toy", "env")

A provider module holds `ATTRIBUTE = {name: spec}`; modules are imported by name, so a registry
lists them once and nothing else names what they declare.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any


def gather(providers: Sequence[str], attribute: str, kind: str) -> dict[str, Any]:
    """{name: spec} of every provider module's `attribute`; a name declared twice is an error."""
    specs: dict[str, Any] = {}
    for module in providers:
        for name, spec in getattr(importlib.import_module(module), attribute).items():
            if name in specs:
                raise ValueError(f"{kind} {name!r} is declared twice ({module})")
            specs[name] = spec
    return specs


def lookup(specs: dict[str, Any], name: str, kind: str) -> Any:
    """specs[name]; a ValueError naming the known ones otherwise."""
    if name not in specs:
        raise ValueError(f"unknown {kind} {name!r}; use one of {', '.join(specs)}")
    return specs[name]
