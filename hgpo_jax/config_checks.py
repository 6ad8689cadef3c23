"""The checks of a config's values, below the schema that declares them (`hgpo_jax.config`):
the error they raise (`ConfigError`), each value against its field's type (`set_field`,
`coerce_value`), the keys a config may not hold (an unknown key, an algorithm's option it never
reads, a section given as null), the names a value may take (`allowed_values`: the algorithms',
envs', agents', models'; each env's splits and rewards), the rules that tie sections together
(`cross_section_problems`) and the option groups a section holds nested under it by name
(`NestedOptions`: the env section's `env.<env>.*`, each env's own options, `EnvSpec.options`).

Strict: an unknown key names the closest valid one; a wrong type names the key, the expected type
and the value. Allowed coercions: int -> float, a numeric string -> float (PyYAML reads `1e-6` as
a string), None only for Optional fields. Each section checks its own values beside its fields
(`_own_problems`, with `hgpo_jax.problems.Problems`); `Config.validate` adds the rules here and
raises one `ConfigError` listing every problem. Nothing here imports JAX at module import time;
the allowed names come from the modules that use them (imported on first validation).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from hgpo_jax.algo_specs import (AGGS, KL_TYPES, LEVEL_WEIGHTS, MODES, PENALTY_PLACEMENTS, STATS,
                                  algorithm_names, algorithm_spec, readers_of)
from hgpo_jax.guidance_specs import (GUIDANCE_OPTIONS, guidance_kind_names, guidance_readers,
                                     guidance_spec)
from hgpo_jax.micro_batches import largest_divisor_at_most, nearest_sft_batch_sizes, sft_batch_fits
from hgpo_jax.problems import Problems, suggest

DTYPES = ("float32", "bfloat16")
SCHEDULES = ("constant", "cosine")
EVAL_PROTOCOLS = ("verl-agent", "each-once")  # rl.evaluation


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says which key and how to fix it."""


# ------------------------------------------------------------------------------------- types
@lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a config dataclass (annotations are strings here)."""
    return typing.get_type_hints(cls)


def set_field(obj: Any, key: str, value: Any, prefix: str, where: str) -> None:
    """Type-check `value` for field `key` of dataclass instance `obj` and set it (`where` prefixes
    an error's message, e.g. the file name; `prefix` is the section's, e.g. "algo."). `key` may
    name an option group nested in `obj` (`NestedOptions`): `value` is then a mapping of its keys."""
    groups = option_groups(type(obj))
    if key in groups:
        return set_group(getattr(obj, key), value, f"{prefix}{key}.", where)
    hints = field_types(type(obj))
    valid = [f.name for f in dataclasses.fields(obj) if not f.metadata.get(NESTED)]
    if key not in valid:
        raise unknown_key(key, [*valid, *groups], prefix, where)
    try:
        setattr(obj, key, coerce_value(f"{prefix}{key}", value, hints[key]))
    except ConfigError as e:
        raise ConfigError(f"{where}{e}") from None


def set_group(group: Any, value: Any, prefix: str, where: str) -> None:
    """Set the keys of a mapping in the nested option group `group` (a dataclass; `prefix`: its
    keys', e.g. "env.<env>."); null keeps it as it is, as an empty section does."""
    if value is None:
        return
    name = prefix.rstrip(".")
    if not isinstance(value, Mapping):
        first = dataclasses.fields(group)[0].name
        raise ConfigError(f"{where}{name}: expected a mapping of its keys (e.g. {name}: "
                          f"{{{first}: ...}} or the override {prefix}{first}=...), got {value!r}")
    for key, sub_value in value.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}{name}: keys must be strings, got {key!r}")
        set_field(group, key, sub_value, prefix, where)


def _type_name(tp: Any) -> str:
    """Readable type: 'float', 'str | None', 'list[str]'."""
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp))


def _bad_type(key: str, tp: Any, value: Any, hint: str = "") -> ConfigError:
    return ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})"
                       + (f"; {hint}" if hint else ""))


def coerce_value(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the field type `tp`; return it (coerced) or raise ConfigError.

    Coercions: int -> float; a numeric string -> float; None only for Optional types. bool is
    never an int or float. NaN is refused for floats.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported config field type {tp}")
        try:
            return coerce_value(key, value, inner[0])
        except ConfigError:
            if typing.get_origin(inner[0]) is not None:
                raise  # a container's own message names the bad element
            raise _bad_type(key, tp, value, "give a value or null") from None
    if value is None:
        return _none_error(key, tp)
    if origin is list:
        if not isinstance(value, list):
            raise _bad_type(key, tp, value, f"write a YAML list, e.g. {key.split('.')[-1]}: [a, b] "
                                            f"or {key}=[a,b]")
        (elem,) = typing.get_args(tp)
        return [coerce_value(f"{key}[{i}]", v, elem) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise _bad_type(key, tp, value, "use true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad_type(key, tp, value, "use a whole number")
        return value
    if tp is float:
        return _coerce_float(key, value)
    if tp is str:
        if not isinstance(value, str):
            raise _bad_type(key, tp, value, "quote it to make it a string")
        return value
    raise TypeError(f"unsupported config field type {tp}")


def _none_error(key: str, tp: Any):
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got null/None; only Optional fields "
                      "accept null, so give a value or delete the key to keep the default")


def _coerce_float(key: str, value: Any) -> float:
    """int, float or numeric string -> float; bool and NaN refused."""
    if isinstance(value, bool):
        raise _bad_type(key, float, value, "use a number")
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float):
        out = value
    elif isinstance(value, str):
        try:
            out = float(value.strip())
        except ValueError:
            raise _bad_type(key, float, value, "use a number such as 0.5 or 1e-6") from None
    else:
        raise _bad_type(key, float, value, "use a number")
    if math.isnan(out):
        raise ConfigError(f"{key}: NaN is not a valid value; use a number")
    return out


def unknown_key(key: str, valid: Sequence[str], prefix: str, where: str) -> ConfigError:
    """The error of a key not among `valid` (naming the closest one and every valid key)."""
    full = f"{prefix}{key}"
    return ConfigError(f"{where}unknown config key {full!r}.{suggest(str(key), valid, prefix)} "
                       f"Valid keys{' in ' + prefix.rstrip('.') if prefix else ''}: {', '.join(valid)}")


# ------------------------------------------------------------------------------------- nested options
NESTED = "nested"  # the metadata key marking the field of a section's option groups (not a key)


def env_options() -> dict[str, type]:
    """{env name: its options class} of the registered envs that declare one (`EnvSpec.options`),
    nested in the config as `env.<name>.*`."""
    from hgpo_jax.envs.registry import env_names, get_env

    found = {name: getattr(get_env(name), "options", None) for name in env_names()}
    return {name: cls for name, cls in found.items() if cls is not None}


def marked_env_options(mark: str) -> tuple[str, ...]:
    """The "env.<env>.<key>" names of the env options whose dataclass field carries `mark` in its
    metadata (e.g. "path": a file path a run records as absolute; "run_setting": a setting a
    resume may change, see hgpo_jax.runs)."""
    return tuple(f"env.{env}.{f.name}" for env, cls in env_options().items()
                 for f in dataclasses.fields(cls) if f.metadata.get(mark))


def option_groups(section: type) -> dict[str, type]:
    """{key: options class} of the option groups nested in a config section class ({} but for a
    `NestedOptions`)."""
    return section.nested_options() if issubclass(section, NestedOptions) else {}


class NestedOptions:
    """A config section holding groups of options nested under it by name, `section.<key>.*`
    (`EnvConfig`: one group per env that declares its own options, `env.<env>.key`). The groups
    are a dataclass field `options` ({key: group}, marked NESTED: no key of its own, so that they
    compare, copy, pickle and `dataclasses.asdict` with the section) read and set as attributes
    (`cfg.env.<env>`). A subclass names the groups' classes (`nested_options`); the group in use
    is the one its `name` names (`active_options`: checked, saved and printed; the others keep
    their defaults, `group_problems`). Built in code, it takes copies of the groups given
    (`options={...}`) and the defaults of the others."""

    @staticmethod
    def nested_options() -> dict[str, type]:
        return {}

    def active_options(self) -> dict[str, Any]:
        """{key: group} of the group in use: the one named by the section's `name` ({} if none)."""
        name = getattr(self, "name", None)
        return {name: self.options[name]} if name in self.options else {}

    def __post_init__(self) -> None:
        given, classes = self.options, self.nested_options()
        unknown = [key for key in given if key not in classes]
        if unknown:
            raise ConfigError(f"{type(self).__name__}: no option group {unknown[0]!r}; the groups "
                              f"are {', '.join(classes) or '(none)'}")
        self.options = {key: copy.deepcopy(given[key]) if key in given else cls()
                        for key, cls in classes.items()}

    def __getattr__(self, name: str) -> Any:  # only called when no attribute or field is `name`
        groups = self.__dict__.get("options")
        if groups is not None and name in groups:
            return groups[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        groups = self.__dict__.get("options")
        if groups is not None and name in groups:
            groups[name] = value
        else:
            object.__setattr__(self, name, value)


def section_values(section: Any, every: bool = False) -> dict[str, Any]:
    """A config section as a plain dict (copies, in field order), each option group it uses (or,
    `every`, holds: `NestedOptions`) as a dict under its key after the section's own keys."""
    values = {f.name: copy.deepcopy(getattr(section, f.name))
              for f in dataclasses.fields(section) if not f.metadata.get(NESTED)}
    if isinstance(section, NestedOptions):
        groups = section.options if every else section.active_options()
        values.update({key: dataclasses.asdict(group) for key, group in groups.items()})
    return values


def group_problems(section: NestedOptions, p: Problems) -> None:
    """The problems of a section's option groups, under `p.prefix` + key: those of the group in
    use (its `problems(prefix)`), and any other group set away from its defaults
    (`env.<env>.key=...` with another env.name)."""
    active = section.active_options()
    for key, group in section.options.items():
        if key in active:
            p.items.extend(group.problems(f"{p.prefix}{key}."))
            continue
        default = type(group)()
        changed = [f"{p.prefix}{key}.{f.name}" for f in dataclasses.fields(group)
                   if getattr(group, f.name) != getattr(default, f.name)]
        if changed:
            owner = p.prefix.rstrip(".")
            p.add(f"{p.prefix}{key}.* applies to {owner} {key}; {owner}.name is {section.name} "
                  f"({', '.join(changed)} set): drop {'it' if len(changed) == 1 else 'them'}, or "
                  f"set {owner}.name={key}")


# ------------------------------------------------------------------------------------- keys
def check_algo_keys(cfg, given: Mapping[str, str]) -> None:
    """Refuse the `algo` options given (in a config file or an override: `given`, key -> where)
    that the algorithm chosen in `cfg` (a `Config`) does not read, naming the key and the
    algorithms that read it."""
    if cfg.algo.estimator not in algorithm_names():
        return  # the validation names the unknown algorithm
    for key, where in given.items():
        users = readers_of(key)
        if cfg.algo.estimator not in users:
            raise ConfigError(
                f"{where}algo.{key} is not an option of algo.estimator={cfg.algo.estimator}, "
                f"which never reads it (it is {', '.join(users)}'s); drop it, or choose "
                f"{'that algorithm' if len(users) == 1 else 'one of those'}")


def section_switch_error(key: str, value: Any, where: str) -> ConfigError:
    """`critic: null` (or false, or empty) read as an attempt to turn the section's model off:
    the algorithm decides whether there is one; the section only sets it up."""
    users = [name for name in algorithm_names() if key in algorithm_spec(name).sections]
    others = [name for name in algorithm_names() if name not in users]
    text = "null" if value is None else "false"
    return ConfigError(
        f"{where}{key}: {text} does not turn the {key} off: "
        f"algo.estimator decides whether a run has one ({', '.join(users)} train a {key}; "
        f"{', '.join(others)} do not) and this section only sets it up; drop the line (its "
        f"defaults), or choose an algorithm without a {key} (e.g. algo.estimator={others[-1]})")


# ------------------------------------------------------------------------------------- names
@lru_cache(maxsize=1)
def allowed_values() -> dict[str, tuple[str, ...]]:
    """Allowed names: the algorithms' (`hgpo_jax.algo_specs`) and those of the envs, agents and
    models (imported lazily)."""
    from hgpo_jax.agents import agent_names, projection_names
    from hgpo_jax.envs.registry import env_names
    from hgpo_jax.models.attention import ATTENTION_IMPLS

    return {"estimator": algorithm_names(), "mode": tuple(MODES), "kl_type": tuple(KL_TYPES),
            "loss_agg": tuple(AGGS), "env": env_names(), "dtype": DTYPES,
            "schedule": SCHEDULES, "penalty_placement": tuple(PENALTY_PLACEMENTS),
            "stats": tuple(STATS), "level_weights": tuple(LEVEL_WEIGHTS),
            "agent": agent_names(), "projection": projection_names(),
            "protocol": tuple(EVAL_PROTOCOLS),
            "attention": tuple(a for a in ATTENTION_IMPLS if a != "flash_standin")}


def env_splits(name: str) -> tuple[str, ...]:
    """The split names of env `name` (none for an unknown env: its name is reported instead)."""
    from hgpo_jax.envs.registry import env_names, get_env

    return get_env(name).splits if name in env_names() else ()


def env_has_experts(name: str) -> bool | None:
    """Whether env `name` records expert trajectories for guided rollouts (its registry entry's
    `expert_trajectories`); None for an unknown env (its name is reported instead)."""
    from hgpo_jax.envs.registry import env_names, get_env

    if name not in env_names():
        return None
    return getattr(get_env(name), "expert_trajectories", None) is not None


def _env_eval_splits(name: str) -> tuple[str, ...]:
    """The default evaluation splits of env `name` (none for an unknown env)."""
    from hgpo_jax.envs.registry import env_names, get_env

    return get_env(name).eval_splits if name in env_names() else ()


def env_rewards(name: str) -> tuple[str, ...]:
    """The training reward names of env `name` (none for an unknown env)."""
    from hgpo_jax.envs.registry import env_names, get_env, reward_names

    return reward_names(get_env(name)) if name in env_names() else ()


def _agent_spec(name: str):
    """The registry entry of agent `name` (None for an unknown agent: its name is reported)."""
    from hgpo_jax.agents.registry import agent_names, agent_spec

    return agent_spec(name) if name in agent_names() else None


# ------------------------------------------------------------------------------------- rules
def _envs_where(declared: str) -> tuple[str, ...]:
    """The registered envs whose registry entry sets `declared` (a field of EnvSpec)."""
    from hgpo_jax.envs.registry import env_names, get_env

    return tuple(n for n in env_names() if getattr(get_env(n), declared, None))


def guidance_problems(cfg, p: Problems) -> None:
    """The `guidance` section against its kind and the env: a key of another kind's options set
    (`GuidanceSpec.reads`); for a kind that replays experts, an env that records them and a step
    left for the policy; the uniform draw and a prefix of the whole expert only on an env whose
    entry allows them (`EnvSpec.whole_expert_guidance`: ALFWorld, as the authors')."""
    g, e = cfg.guidance, cfg.env
    if g.kind not in guidance_kind_names():
        return  # the section's own check names the unknown kind
    reads = guidance_spec(g.kind).reads()
    for cls in GUIDANCE_OPTIONS:
        for f in dataclasses.fields(cls):
            value = getattr(g, f.name)
            if f.name not in reads and value != f.default:
                users = guidance_readers(f.name)
                p.add(f"guidance.{f.name}={value!r}: guidance.kind={g.kind} never reads it (an "
                      f"option of guidance.kind={'|'.join(users)}); drop it, or set "
                      f"guidance.kind={users[0]}")
    if not guidance_spec(g.kind).experts:
        return
    p.check(e.max_steps >= 2, "env.max_steps", e.max_steps,
            f">= 2 with guidance.kind={g.kind} (a prefix replays at least one step, and an "
            "episode the prefix ends has no turn of the policy to train)")
    has = env_has_experts(e.name)
    if has is False:
        p.add(f"guidance.kind={g.kind}: env {e.name!r} records no expert trajectories to replay "
              "(`EnvSpec.expert_trajectories`); set guidance.kind=none or use an env that has "
              f"them ({', '.join(_envs_where('expert_trajectories'))})")
    allowed = _envs_where("whole_expert_guidance")
    if e.name not in allowed:
        why = f"the authors allow it on {', '.join(allowed) or 'no env'} only"
        p.check(g.prefix_sample_mode != "uniform_fixed", "guidance.prefix_sample_mode",
                g.prefix_sample_mode, f"gaussian on env {e.name!r} (uniform_fixed: {why})")
        p.check(not g.allow_full_prefix, "guidance.allow_full_prefix", g.allow_full_prefix,
                f"false on env {e.name!r} ({why})")


def cross_section_problems(cfg, p: Problems) -> None:
    """The rules over two sections of `cfg` (a `Config`), added to `p`: group sizes and the agent
    the algorithm allows, the agent's prompts and reply rules for the env, the longest row in a
    token budget, the env's splits to evaluate, SFT and mesh sizes against the micro-batch."""
    e, r, a, t, v, f = cfg.env, cfg.rollout, cfg.algo, cfg.train, cfg.eval, cfg.sft
    if a.estimator in algorithm_names() and a.spec.singleton_groups:
        p.at_least("rollout.group_size", r.group_size, 1)
    else:
        p.check(r.group_size >= 2, "rollout.group_size", r.group_size,
                ">= 2 (group-relative advantages are 0 in a group of one)")
    if a.estimator in algorithm_names() and a.spec.agent not in (None, cfg.agent.name):
        p.add(f"algo.estimator={a.estimator!r} needs the agent {a.spec.agent!r} (its reply format); "
              f"set agent.name={a.spec.agent}")
    agent = _agent_spec(cfg.agent.name)
    if agent and e.name in allowed_values()["env"]:
        p.check(e.name in agent.envs, "agent.name", cfg.agent.name, f"an agent with a prompt for "
                f"env.name={e.name!r} (this one has prompts for {', '.join(agent.envs)})")
    if agent and e.projection in allowed_values()["projection"]:
        p.one_of("env.projection", e.projection, agent.projections)
    if t.max_tokens_per_micro_batch > 0 and t.pad_multiple >= 1:  # the longest row must fit
        longest = r.max_prompt_tokens + r.max_new_tokens
        padded = -(-longest // t.pad_multiple) * t.pad_multiple
        p.check(t.max_tokens_per_micro_batch >= padded, "train.max_tokens_per_micro_batch",
                t.max_tokens_per_micro_batch,
                f"0 (off) or at least the longest possible row, rollout.max_prompt_tokens + "
                f"rollout.max_new_tokens = {longest} tokens padded to train.pad_multiple="
                f"{t.pad_multiple}: set it to >= {padded}")

    splits = env_splits(e.name)
    if not v.splits:
        example = ",".join(_env_eval_splits(e.name) or splits[:1])
        p.add(f"eval.splits=[] is empty: name the splits to evaluate, e.g. eval.splits=[{example}]"
              + (f" (env {e.name!r} has the splits {', '.join(splits)})" if splits else ""))
    for i, s in enumerate(v.splits):
        if splits:
            p.one_of(f"eval.splits[{i}]", s, splits)

    if f.batch_size >= 1 and t.micro_batch_size >= 1 \
            and not sft_batch_fits(f.batch_size, t.micro_batch_size):
        micro = largest_divisor_at_most(f.batch_size, t.micro_batch_size)
        below, above = nearest_sft_batch_sizes(f.batch_size, t.micro_batch_size)
        p.add(f"sft.batch_size={f.batch_size} runs in micro-batches of {micro} row(s) only (its "
              f"largest divisor <= train.micro_batch_size={t.micro_batch_size}), under half of "
              f"min(sft.batch_size, train.micro_batch_size) = "
              f"{min(f.batch_size, t.micro_batch_size)}; set sft.batch_size={below} or "
              f"{above} (a multiple of {t.micro_batch_size} runs {t.micro_batch_size}-row micro-batches)")

    guidance_problems(cfg, p)

    m = cfg.mesh
    data_parallel = m.data * m.fsdp  # every micro-batch is split over both axes
    if m.data >= 1 and m.fsdp >= 1 and t.micro_batch_size >= 1 \
            and t.micro_batch_size % data_parallel:
        fits = [n for n in range(data_parallel, t.mini_batch_size + 1, data_parallel)
                if t.mini_batch_size % n == 0]
        near = [n for n in fits if n >= t.micro_batch_size] or fits  # closest to the setting
        fix = (f"set train.micro_batch_size={near[0] if near[0] >= t.micro_batch_size else near[-1]}"
               if fits else
               f"make train.mini_batch_size and train.micro_batch_size multiples of {data_parallel}")
        p.add(f"train.micro_batch_size={t.micro_batch_size} cannot be split over the "
              f"data-parallel size mesh.data x mesh.fsdp = {data_parallel}: {fix}, or use a "
              f"mesh whose data x fsdp divides {t.micro_batch_size}")

