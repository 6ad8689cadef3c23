"""The package's layers (docs/architecture.md): the import-linter contracts of pyproject.toml hold,
and they say what the architecture promises."""

import os
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def contracts() -> dict[str, dict]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return {c["type"]: c for c in tomllib.load(f)["tool"]["importlinter"]["contracts"]}


def layer_of(layers: list[str], module: str) -> int:
    """Index of the layer holding `module` (0 = top)."""
    for i, layer in enumerate(layers):
        if module in [m.strip() for m in layer.replace("|", ":").split(":")]:
            return i
    raise AssertionError(f"{module} is in no layer")


def test_the_contracts_say_what_the_architecture_promises():
    c = contracts()
    layers = c["layers"]["layers"]
    below = {m: layer_of(layers, m) for m in ("hgpo_jax.envs", "hgpo_jax.models", "hgpo_jax.config",
                                              "hgpo_jax.rl", "hgpo_jax.sft", "hgpo_jax.runs",
                                              "hgpo_jax.trainers", "hgpo_jax.cli")}
    # envs and models: the two foundations, side by side, below config, the RL core and the rest
    assert below["hgpo_jax.envs"] == below["hgpo_jax.models"]
    assert "hgpo_jax.envs | hgpo_jax.models" in layers  # independent siblings
    assert below["hgpo_jax.envs"] > below["hgpo_jax.config"] > below["hgpo_jax.rl"]
    # the RL core, then run folders and SFT data, then the trainers, then the CLI on top
    assert below["hgpo_jax.rl"] > below["hgpo_jax.sft"] > below["hgpo_jax.runs"] \
        > below["hgpo_jax.trainers"] > below["hgpo_jax.cli"] == 0
    assert sorted(c["independence"]["modules"]) == ["hgpo_jax.envs", "hgpo_jax.models"]
    assert "hgpo_jax" in c["acyclic_siblings"]["ancestors"]


def test_every_module_is_in_a_layer():
    """A new top-level module must be given its place in the layers."""
    layers = contracts()["layers"]["layers"]
    named = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    package = os.path.join(ROOT, "hgpo_jax")
    found = {"hgpo_jax." + (n[:-3] if n.endswith(".py") else n) for n in os.listdir(package)
             if (n.endswith(".py") and n != "__init__.py")
             or os.path.isfile(os.path.join(package, n, "__init__.py"))}
    assert found == named, f"not in a layer: {sorted(found - named)}; gone: {sorted(named - found)}"


def test_the_imports_keep_the_contracts():
    """`lint-imports` (function-level imports included) over hgpo_jax: every contract kept."""
    exe = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"Contracts: {len(contracts())} kept, 0 broken." in out.stdout


def _source(*parts: str) -> str:
    path = os.path.join(ROOT, "hgpo_jax", *parts)
    files = ([os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".py")]
             if os.path.isdir(path) else [path])
    return "\n".join(open(f, encoding="utf-8").read() for f in files)


def test_the_trainer_runs_and_plan_leave_the_algorithms_state_to_the_algorithm():
    """An algorithm owns its state (rl/algorithms): the trainers, runs.py and plan name neither
    the critic's state class nor its checkpoint item; they call the unit's methods."""
    for where in (("trainers",), ("runs.py",)):
        text = _source(*where)
        assert "CriticState" not in text, where
        assert '"critic"' not in text and "'critic'" not in text, where
        assert "state_item" in text, where  # the algorithm names its checkpoint item


def test_the_top_floors_stay_small():
    """cli.py holds the parser and the dispatch (each command's body: hgpo_jax/commands/);
    config.py the schema, loading and overrides (checks: config_checks.py; run-folder records:
    runs.py; SFT batch arithmetic: micro_batches.py)."""
    lines = {name: len(_source(name).splitlines()) for name in ("cli.py", "config.py")}
    assert lines["cli.py"] <= 350 and lines["config.py"] <= 700, lines
