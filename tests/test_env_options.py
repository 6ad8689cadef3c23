"""An env's own options (`EnvSpec.options`), nested in the config under the env's name:
`env.<env>.*` in YAML files, 3-part overrides (`env.search.url=...`), `cfg.env.search` in code,
checked beside the other keys, printed and recorded only for the env in use
(`hgpo_jax.config_checks.NestedOptions`, docs/config.md).

The machinery is tested on the toy env given a small options class of its own (the registry's
entry replaced for one test); the search env, the first to declare options, has its own test.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
from dataclasses import dataclass, field

import pytest
import yaml

from hgpo_jax.commands.common import format_config
from hgpo_jax.config import (Config, EnvConfig, config_from_dict, config_to_dict, load_config,
                             save_config, unflatten)
from hgpo_jax.config_checks import ConfigError, coerce_value, env_options, field_types
from hgpo_jax.problems import Problems

@dataclass
class ToyOptions:
    """A test double of an env's own options: one field of every type a config key may have."""

    level: int = 1  # a whole number >= 1
    noise: float = 0.0  # in [0, 1]
    words: list[str] = field(default_factory=list)
    path: str | None = None
    label: str = ""
    loud: bool = False

    def problems(self, prefix: str = "env.toy.") -> list[str]:
        p = Problems(prefix)
        p.check(self.level >= 1, "level", self.level, ">= 1")
        p.check(0 <= self.noise <= 1, "noise", self.noise, "in [0, 1]")
        return p.items


@pytest.fixture
def toy_options(monkeypatch):
    """The toy env declaring `ToyOptions` as its own (`env.toy.*`) for one test."""
    from hgpo_jax.envs import registry

    spec = dataclasses.replace(registry.get_env("toy"), options=ToyOptions)
    monkeypatch.setitem(registry._specs(), "toy", spec)
    return spec


def toy(*overrides: str) -> Config:
    return load_config("tiny_cpu_toy", overrides)


# ------------------------------------------------------------------------------------- the schema
def test_a_config_holds_each_envs_options_as_an_attribute(toy_options):
    cfg = Config()
    assert cfg.env.toy == ToyOptions() and cfg.env.options["toy"] is cfg.env.toy
    assert set(cfg.env.options) == set(env_options()) and "toy" in env_options()
    cfg.env.toy.level = 3  # the group itself
    assert cfg.env.options["toy"].level == 3
    cfg.env.toy = ToyOptions(label="x")  # or a whole group
    assert cfg.env.options["toy"] == ToyOptions(label="x") and "toy" not in vars(cfg.env)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cfg.env.nope  # noqa: B018
    assert Config().env.toy is not Config().env.toy  # no group shared between configs
    # built in code: copies of the groups given, the defaults of the others
    given = ToyOptions(level=2)
    env = EnvConfig(name="toy", options={"toy": given})
    assert env.toy == given and env.toy is not given and env == EnvConfig(name="toy",
                                                                          options={"toy": given})
    assert EnvConfig(options={}) == EnvConfig()
    with pytest.raises(ConfigError, match="no option group 'nope'"):
        EnvConfig(options={"nope": ToyOptions()})


def test_copies_of_a_config_are_deep(toy_options):
    cfg = toy("env.toy.words=[a]")
    for other in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg)),
                  config_from_dict(config_to_dict(cfg))):
        assert other == cfg
        other.env.toy.words.append("b")
        other.env.toy.level = 5
        assert cfg.env.toy == ToyOptions(words=["a"])
    env = dataclasses.replace(cfg.env, split="test")  # a section copied by replace
    env.toy.level = 7
    assert cfg.env.toy.level == 1 and env.toy.level == 7


def test_the_nested_options_are_no_key_of_their_own(toy_options):
    assert "options" not in config_to_dict(Config())["env"]
    with pytest.raises(ConfigError, match="unknown config key 'env.options'"):
        load_config(None, ["env.options={toy: {level: 2}}"])


# ------------------------------------------------------------------------------------- YAML, overrides
def test_yaml_nests_the_options_under_the_envs_name(tmp_path, toy_options):
    path = tmp_path / "run.yaml"
    path.write_text("base: tiny_cpu_toy\nenv:\n  name: toy\n  max_steps: 4\n  toy:\n    level: 3\n"
                    "    words: [a, b]\n    noise: 5e-1\n")
    cfg = load_config(str(path))
    assert cfg.env.max_steps == 4
    assert cfg.env.toy == ToyOptions(level=3, words=["a", "b"], noise=0.5)
    empty = tmp_path / "empty.yaml"  # an empty group keeps its defaults, as an empty section
    empty.write_text("base: tiny_cpu_toy\nenv:\n  toy:\n")
    assert load_config(str(empty)).env.toy == ToyOptions()
    # a file's group, then an override of one of its keys
    assert load_config(str(path), ["env.toy.level=4"]).env.toy.words == ["a", "b"]


@pytest.mark.parametrize("override, key, expected", [
    ("env.toy.level=4", "level", 4),
    ("env.toy.noise=1", "noise", 1.0),  # int -> float
    ("env.toy.noise=5e-1", "noise", 0.5),  # YAML's string -> float
    ("env.toy.words=[a,b]", "words", ["a", "b"]),
    ("env.toy.words=[]", "words", []),
    ("env.toy.path=/data/x", "path", "/data/x"),
    ("env.toy.path=null", "path", None),
    ("env.toy.path=", "path", None),
    ("env.toy.label=2024", "label", "2024"),  # a str key keeps the text
    ("env.toy.path=2024", "path", "2024"),  # so does an optional one
    ("env.toy.loud=true", "loud", True),
])
def test_three_part_overrides_are_typed_as_any_key(toy_options, override, key, expected):
    cfg = toy(override)
    value = getattr(cfg.env.toy, key)
    assert value == expected and type(value) is type(expected)


def test_a_group_as_one_override(toy_options):
    assert toy("env.toy={level: 2, words: [x]}").env.toy == ToyOptions(level=2, words=["x"])
    assert toy("env.toy=null").env.toy == ToyOptions()


@pytest.mark.parametrize("override, match", [
    ("env.toy.levle=2", r"unknown config key 'env.toy.levle'\. Did you mean 'env.toy.level'\? "
                        r"Valid keys in env.toy: level, noise, words, path, label, loud"),
    ("env.tyo.level=2", r"unknown config key 'env.tyo'\. Did you mean 'env.toy'\?"),
    ("env.toy=3", r"env.toy: expected a mapping of its keys \(e.g. env.toy: \{level: \.\.\.\} or "
                  r"the override env.toy.level=\.\.\.\), got 3"),
    ("env.toy=[1]", r"env.toy: expected a mapping"),
    ("env.toy.level=2.5", r"env.toy.level: expected int, got 2.5"),
    ("env.toy.level=null", r"env.toy.level: expected int, got null"),
    ("env.toy.noise=loud", r"env.toy.noise: expected float, got 'loud'"),
    ("env.toy.words=a", r"env.toy.words: expected list\[str\]"),
    ("env.toy.words=[1]", r"env.toy.words\[0\]: expected str, got 1"),
    ("env.toy.loud=1", r"env.toy.loud: expected bool"),
    ("env.toy.level.x=1", "at most two parts"),
    ("env.seed.x=1", "at most two parts"),  # a plain key has no keys under it
    ("env.options.toy=1", "at most two parts"),
    ("algo.K.x=1", "at most two parts"),
])
def test_bad_nested_keys_and_values(toy_options, override, match):
    with pytest.raises(ConfigError, match=match):
        toy(override)


def test_an_unknown_nested_key_in_a_file_names_the_file(tmp_path, toy_options):
    path = tmp_path / "typo.yaml"
    path.write_text("env:\n  toy:\n    levle: 2\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown config key 'env.toy.levle'\. "
                                          r"Did you mean 'env.toy.level'\?"):
        load_config(str(path))
    path.write_text("env:\n  toy: fast\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: env.toy: expected a mapping"):
        load_config(str(path))


# ------------------------------------------------------------------------------------- validation
def test_the_groups_problems_join_the_configs(toy_options):
    with pytest.raises(ConfigError) as e:
        toy("env.toy.level=0", "env.toy.noise=2", "algo.K=-1")
    text = str(e.value)
    assert "env.toy.level=0: must be >= 1" in text and "env.toy.noise=2.0: must be in [0, 1]" in text
    assert "algo.K=-1" in text  # every problem at once


def test_options_of_another_env_are_a_problem(toy_options):
    with pytest.raises(ConfigError, match=r"env.toy.\* applies to env toy; env.name is alfworld "
                                          r"\(env.toy.level, env.toy.words set\): drop them, or "
                                          r"set env.name=toy"):
        load_config(None, ["env.toy.level=3", "env.toy.words=[a]"])
    with pytest.raises(ConfigError, match=r"env.toy.\* applies to env toy; env.name is alfworld"):
        toy("env.toy.level=3", "env.name=alfworld")
    # its defaults are no setting: another env's group left as it is passes
    assert load_config(None, ["env.toy.level=1"]).env.toy == ToyOptions()
    # another env's group is not checked beyond that (its own problems are its env's)
    assert "env.toy.level" not in "".join(Config().env.problems("env."))


# ------------------------------------------------------------------------------------- printing
def test_the_print_shows_the_options_of_the_env_in_use(toy_options):
    text = format_config(toy("env.toy.level=3", "env.toy.words=[a,b]"))
    lines = text.splitlines()
    env = next(i for i, line in enumerate(lines) if line.startswith("  env "))
    assert lines[env + 1] == ("  env.toy   level=3 noise=0 words=[a,b] path=None label= "
                              "loud=False")
    assert text.count("\n") == format_config(toy()).count("\n")
    default = format_config(Config())  # an env without options of its own: as before
    assert default.count("\n") == 10 and "  env." not in default


# ------------------------------------------------------------------------------------- run folders
def test_a_run_folder_records_the_options_of_its_env(tmp_path, toy_options):
    cfg = toy("env.toy.level=3", "env.toy.words=[a]")
    path = save_config(cfg, str(tmp_path / "run" / "config.yaml"))
    saved = yaml.safe_load(open(path))
    assert saved["env"]["toy"] == {"level": 3, "noise": 0.0, "words": ["a"], "path": None,
                                   "label": "", "loud": False}
    assert set(saved["env"]) - set(config_to_dict(Config())["env"]) == {"toy"}
    assert load_config(path) == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg
    # another env's run records none (its config.yaml as before)
    alf = load_config(None, ["name=alf"])
    saved = yaml.safe_load(open(save_config(alf, str(tmp_path / "alf.yaml"))))
    assert not set(saved["env"]) & set(env_options()) and load_config(str(tmp_path / "alf.yaml")) == alf


def test_a_run_folder_written_before_env_options_loads(tmp_path, toy_options):
    cfg = toy()
    path = save_config(cfg, str(tmp_path / "config.yaml"))
    data = yaml.safe_load(open(path))
    del data["env"]["toy"]  # as written before the toy env had options
    header = open(path).readline()
    with open(path, "w") as f:
        f.write(header + yaml.safe_dump(data, sort_keys=False))
    again = load_config(path)
    assert again.env.toy == ToyOptions() and again == cfg


def test_a_resume_compares_and_records_the_options(tmp_path, toy_options):
    from hgpo_jax.runs import (config_changes, flat_config, is_run_setting,
                               record_config_changes)

    old = toy("env.toy.level=3")
    flat = flat_config(old)
    assert flat["env.toy.level"] == 3 and "env.options" not in flat
    assert set(flat) == set(flat_config(Config()))  # every env's keys, whatever env.name
    assert config_from_dict(unflatten(flat)) == old  # the inverse
    new = toy("env.toy.level=4", "env.toy.words=[a]")
    changes = config_changes(old, new)
    assert changes == {"env.toy.level": (3, 4), "env.toy.words": ([], ["a"])}
    assert not any(map(is_run_setting, changes))  # what the run is: refused without --allow-change
    assert config_changes(old, copy.deepcopy(old)) == {}
    run = tmp_path / "run"
    save_config(old, str(run / "config.yaml"))
    record_config_changes(str(run), 2, changes)
    assert json.loads((run / "config_changes.jsonl").read_text())["changes"]["env.toy.level"] == [3, 4]
    resumed = load_config(str(run))
    assert resumed.env.toy == new.env.toy


# ------------------------------------------------------------------------------------- every env's
def test_every_envs_options_are_config_keys():
    """Each registered env's options class: a dataclass of keys a config can hold (types the
    config checks know, defaults that pass them and its own checks), named apart from the env
    section's own keys."""
    plain = set(field_types(EnvConfig))
    for name, cls in env_options().items():
        assert dataclasses.is_dataclass(cls) and name not in plain, name
        default, hints = cls(), field_types(cls)
        for f in dataclasses.fields(cls):
            value = getattr(default, f.name)
            assert coerce_value(f"env.{name}.{f.name}", value, hints[f.name]) == value
        assert default.problems(f"env.{name}.") == [], name


def test_every_envs_options_have_their_rows_in_the_docs():
    """docs/config.md's schema has a row per key of each env's own options."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "config.md"), encoding="utf-8") as f:
        docs = f.read()
    missing = [f"env.{name}.{f.name}" for name, cls in env_options().items()
               for f in dataclasses.fields(cls) if f"| `env.{name}.{f.name}` |" not in docs]
    assert not missing, f"docs/config.md has no row for {missing}"


def test_the_search_env_options(tmp_path):
    """The search env (`hgpo_jax.envs.search`): its YAML and overrides as a user writes them."""
    from hgpo_jax.envs.registry import env_names, get_env

    if "search" not in env_names() or get_env("search").options is None:
        pytest.skip("the search env is not registered with options yet")
    options = get_env("search").options
    yaml_text = ("env:\n  name: search\n  max_steps: 4\n  search:\n"
                 "    url: http://127.0.0.1:8000/retrieve\n    data_sources: [hotpotqa, nq]\n"
                 "eval:\n  splits: [test]\n")
    cfg = config_from_dict(yaml.safe_load(yaml_text))
    assert isinstance(cfg.env.search, options)
    assert (cfg.env.search.url, cfg.env.search.data_sources) == (
        "http://127.0.0.1:8000/retrieve", ["hotpotqa", "nq"])
    assert cfg.env.search.topk == options().topk  # the rest: defaults
    path = tmp_path / "search.yaml"
    path.write_text(yaml_text)
    cfg = load_config(str(path), ["env.search.url=http://host:8000/retrieve", "env.search.topk=5"])
    assert (cfg.env.search.url, cfg.env.search.topk) == ("http://host:8000/retrieve", 5)
    assert load_config(save_config(cfg, str(tmp_path / "run.yaml"))) == cfg
    assert "\n  env.search  url=http://host:8000/retrieve topk=5 " in format_config(cfg)
    with pytest.raises(ConfigError, match=r"env.search.topk=0: must be >= 1"):
        load_config(str(path), ["env.search.topk=0"])
    with pytest.raises(ConfigError, match=r"env.search.\* applies to env search; env.name is "
                                          r"alfworld"):
        load_config(None, ["env.search.url=http://host:8000/retrieve"])
