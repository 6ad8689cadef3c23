"""Typed run configuration: dataclasses, YAML files and `section.key=value` overrides.

    from hgpo_jax.config import load_config
    cfg = load_config("hgpo_k2_alfworld_qwen2.5_1.5b", ["algo.K=4", "rollout.num_groups=2"])
    cfg = load_config("path/to/my.yaml")       # a YAML path
    cfg = load_config()                        # the defaults (the paper's 1.5B HGPO K=2 run)

A YAML file holds any subset of the sections below (missing keys keep their defaults) and may
name a `base:` config to inherit from (a bare name = `hgpo_jax/configs/{name}.yaml`, or a path,
relative paths resolved from the including file's folder); the base is applied first, then the
file's own keys, then the overrides. If the loaded file (not its bases) sets no `name`, the name
is the file's stem. Override values are read with `yaml.safe_load` (`algo.K=4`, `optim.lr=1e-6`,
`env.eval_splits=[valid_seen]`, `env.data_dir=null`); for `str` fields the raw text is kept when
YAML would read it as a number or bool (`name=2024`). An env's own options (`EnvSpec.options`) nest
under its name: `env.<env>.key` in files and overrides, `cfg.env.<env>` in code.

Strict: an unknown key, a wrong type or a bad value raises a `ConfigError` naming the key and how
to fix it; `Config.validate()` checks the values (names, sizes, ranges, divisibility) and raises
one listing every problem (`hgpo_jax.config_checks`). No JAX at import time. See docs/config.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from hgpo_jax.algo_specs import (ALGO_OPTIONS, ONE_SCORE_CONFLICT, AdamWOptions, Options,
                                  algorithm_names, algorithm_spec, one_score_conflict)
from hgpo_jax.algo_specs import CriticOptions as CriticConfig
from hgpo_jax.guidance_specs import GUIDANCE_OPTIONS, GuidanceChoice, kind_of_enable
from hgpo_jax.config_checks import (EVAL_PROTOCOLS, NESTED, SCHEDULES, ConfigError,
                                    NestedOptions, allowed_values, check_algo_keys,
                                    cross_section_problems, env_options, env_rewards, env_splits,
                                    field_types, group_problems, option_groups, section_switch_error,
                                    section_values, set_field, unknown_key)
from hgpo_jax.metrics import write_atomically
from hgpo_jax.micro_batches import largest_divisor_at_most
from hgpo_jax.problems import Problems, suggest

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")  # package data
BASE_KEY = "base"
RUN_CONFIG_FILE = "config.yaml"  # a run folder's copy of its config (written with save_config)
RUN_CHANGES_FILE = "config_changes.jsonl"  # what later resumes changed, one JSON line per resume

# ------------------------------------------------------------------------------------- schema
@dataclass
class ModelConfig(Options):
    """The policy model (also the frozen reference model)."""

    path: str = "Qwen/Qwen2.5-1.5B-Instruct"  # local HF folder; "tiny" = a tiny random Qwen2 (cache)
    dtype: str = "float32"  # master weights: float32 | bfloat16
    compute_dtype: str = "bfloat16"  # activations: float32 | bfloat16
    scan_layers: bool = True  # stacked layer weights under lax.scan (one compiled layer); false: unrolled
    attention: str = "auto"  # training forward: auto (cuDNN flash on GPU, splash on TPU, else einsum) | einsum | xla | cudnn | splash
    lora_rank: int = 0  # LoRA adapters' rank (verl's lora_rank); 0: none, every weight trains
    lora_alpha: float = 16.0  # adapters' scale alpha / rank (verl's lora_alpha)
    lora_targets: str = "all-linear"  # adapted layers (verl's target_modules): all-linear | names among q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
    adapter: str | None = None  # a PEFT LoRA folder to start from (its rank, alpha and targets are the run's)

    def _own_problems(self, p: Problems) -> None:
        p.check(bool(self.path.strip()), "path", self.path, "a local HF folder or 'tiny'")
        p.at_least("lora_rank", self.lora_rank, 0)
        p.positive("lora_alpha", self.lora_alpha)  # lora_targets, adapter: checked on loading
        p.one_of("dtype", self.dtype, allowed_values()["dtype"])
        p.one_of("compute_dtype", self.compute_dtype, allowed_values()["dtype"])
        p.one_of("attention", self.attention, allowed_values()["attention"])


@dataclass
class EnvConfig(NestedOptions, Options):
    """The environment, its worker pool and each env's own options (`env.<env>.*`, NestedOptions)."""

    name: str = "alfworld"  # alfworld | webshop | search | toy | toy-history | toy-lock (docs/envs.md)
    split: str = "train"  # training split (alfworld: train | valid_seen | valid_unseen | valid_train; webshop: train | test)
    data_dir: str | None = None  # env data folder; None = $ALFWORLD_DATA / $WEBSHOP_DATA or the project's copy
    seed: int = 0  # webshop: the goal order and the prices of ranged products (verl-agent's env.seed)
    max_steps: int = 50  # T: env steps per episode
    memory_len: int = 2  # H: steps of memory in the prompt
    projection: str = "verl-agent"  # the agent's reply -> action rules: verl-agent | strict (docs/agents.md)
    reward: str = "default"  # training reward: default (the authors') | the env's others (webshop: score, 10 x task score)
    num_workers: int = 4  # env worker processes
    step_timeout: float = 60.0  # seconds before a stuck env step counts as failed
    reset_timeout: float = 300.0  # seconds before a stuck env reset counts as failed
    options: dict[str, Any] = field(default_factory=dict, metadata={NESTED: True})  # {env: its options}
    nested_options = staticmethod(env_options)

    def _own_problems(self, p: Problems) -> None:
        p.one_of("name", self.name, allowed_values()["env"])
        splits = env_splits(self.name)
        if splits:
            p.one_of("split", self.split, splits)
        p.at_least("seed", self.seed, 0)
        p.one_of("projection", self.projection, allowed_values()["projection"])
        rewards = env_rewards(self.name)
        if rewards:
            p.one_of("reward", self.reward, rewards)
        p.check(self.data_dir is None or bool(self.data_dir.strip()), "data_dir", self.data_dir,
                "a folder or null")
        p.at_least("max_steps", self.max_steps, 1)
        p.at_least("memory_len", self.memory_len, 0)
        p.at_least("num_workers", self.num_workers, 1)
        p.positive("step_timeout", self.step_timeout)
        p.positive("reset_timeout", self.reset_timeout)
        group_problems(self, p)  # env.<env.name>.*'s own, and no other env's set


@dataclass
class AgentConfig(Options):
    """The agent: prompt template, reply format and memory (docs/agents.md); its reply -> action
    rules are `env.projection` (the key the authors' runs and every existing config use)."""

    name: str = "verl-agent"  # reply format: verl-agent (think/action, the authors') | plan-execute (HiPER's switch/subgoal/action)

    def _own_problems(self, p: Problems) -> None:
        p.one_of("name", self.name, allowed_values()["agent"])


@dataclass
class RolloutConfig(Options):
    """Sampling of training (and evaluation) episodes."""

    group_size: int = 8  # N: rollouts per task (one group)
    num_groups: int = 16  # tasks per iteration
    temperature: float = 1.0  # training rollout temperature (0 = greedy)
    top_p: float = 1.0  # nucleus sampling mass (1 = off)
    top_k: int = 0  # top-k sampling (0 = off)
    max_new_tokens: int = 512  # max response tokens per step
    max_prompt_tokens: int = 4096  # prompts beyond this lose their start (left truncation; rollout/truncated_prompt_rate)
    prefill_chunk: int = -1  # sampler prefill tokens per chunk on the einsum path: -1 = auto (scores <= 128 MiB), 0 = whole prompt (docs/sampling.md)
    decode_attention: str = "auto"  # sampler decode: auto (ragged on a GPU where it runs), einsum (every cache slot), ragged (the rows' tokens only; docs/training.md)
    max_num_seqs: int = 1024  # the most prompts generated at once (vLLM's, verl's default); more run in successive batches: KV cache and prefill memory scale with it

    def _own_problems(self, p: Problems) -> None:
        p.at_least("num_groups", self.num_groups, 1)
        p.check(0 <= self.temperature < math.inf, "temperature", self.temperature,
                "a finite number >= 0 (0 = greedy)")
        p.check(0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1] (1 = off)")
        p.at_least("top_k", self.top_k, 0)
        p.at_least("max_new_tokens", self.max_new_tokens, 1)
        p.at_least("max_prompt_tokens", self.max_prompt_tokens, 1)
        p.check(self.prefill_chunk >= -1, "prefill_chunk", self.prefill_chunk,
                "-1 (auto), 0 (the whole prompt in one chunk) or a chunk size in tokens > 0")
        p.one_of("decode_attention", self.decode_attention, ("auto", "einsum", "ragged"))
        p.at_least("max_num_seqs", self.max_num_seqs, 1)


@dataclass
class AlgorithmChoice(Options):
    """Which algorithm (first in the algo section)."""

    estimator: str = "hgpo"  # grpo | rloo | gigpo | hgpo | ppo (a critic and GAE: the critic section)

    def _own_problems(self, p: Problems) -> None:
        p.one_of("estimator", self.estimator, algorithm_names())

    @property
    def spec(self):
        """The declaration of `estimator` (`hgpo_jax.algo_specs.AlgorithmSpec`)."""
        return algorithm_spec(self.estimator)


@dataclass
class AlgoConfig(*ALGO_OPTIONS, AlgorithmChoice):
    """The algorithm (`estimator`, declared in `hgpo_jax.algo_specs.ALGORITHMS`) and the options
    of every family, declared and checked there beside their fields: the returns (gamma,
    invalid_penalty), the group estimators' (K, alpha, mode, ...), PPO's GAE (lam) and the PPO-KL
    loss of the policy (clip_low, ..., loss_agg)."""

    def _own_problems(self, p: Problems) -> None:
        if one_score_conflict(self.estimator, self.stats, self.penalty_placement,
                              self.invalid_penalty, self.base_group):
            p.add(f"{p.prefix}{ONE_SCORE_CONFLICT}; set algo.penalty_placement=reward (or "
                  "algo.invalid_penalty=0)")


@dataclass
class OptimConfig(AdamWOptions):
    """Optax AdamW with gradient clipping (`algo_specs.AdamWOptions`) and a learning-rate
    schedule."""

    schedule: str = "constant"  # constant | cosine

    def _own_problems(self, p: Problems) -> None:
        p.one_of("schedule", self.schedule, SCHEDULES)


@dataclass
class TrainConfig(Options):
    """The training loop, checkpoints and evaluation cadence."""

    iterations: int = 160  # training iterations (rollout + update)
    ppo_epochs: int = 1  # passes over each iteration's rows
    mini_batch_size: int = 256  # step rows per optimizer update
    micro_batch_size: int = 32  # step rows per gradient-accumulation micro-batch (global)
    seed: int = 0  # seeds task sampling, rollouts and shuffling
    run_dir: str = "runs/{name}"  # {name} is replaced by Config.name
    save_every: int = 10  # iterations between checkpoints (0 = only at the end)
    keep_checkpoints: int = 3  # most recent checkpoints kept
    remat: bool = True              # recompute each layer in the backward pass (saves activation memory)
    pad_multiple: int = 64  # rows are right-padded to a multiple of this many tokens (compiled shapes)
    # token-budget micro-batches: at most this many padded tokens (rows x length) per device, rows of similar
    # length together (verl's use_dynamic_bsz); 0 = off: micro_batch_size rows padded to the longest, as the authors'
    max_tokens_per_micro_batch: int = 0
    diagnostics: bool = True  # log diag/<estimator>/{bias,abs_dev,rmse} against the oracle per iteration

    def _own_problems(self, p: Problems) -> None:
        p.at_least("iterations", self.iterations, 1)
        p.at_least("ppo_epochs", self.ppo_epochs, 1)
        p.at_least("mini_batch_size", self.mini_batch_size, 1)
        p.at_least("micro_batch_size", self.micro_batch_size, 1)
        mini, micro = self.mini_batch_size, self.micro_batch_size
        if mini >= 1 and micro >= 1 and mini % micro:
            p.add(f"train.mini_batch_size={mini} must be a multiple of train.micro_batch_size="
                  f"{micro}; e.g. set train.micro_batch_size={largest_divisor_at_most(mini, micro)}")
        p.at_least("seed", self.seed, 0)
        p.check(bool(self.run_dir.strip()), "run_dir", self.run_dir, "a folder path (may use {name})")
        p.at_least("save_every", self.save_every, 0)
        p.at_least("keep_checkpoints", self.keep_checkpoints, 1)
        p.at_least("pad_multiple", self.pad_multiple, 1)
        p.at_least("max_tokens_per_micro_batch", self.max_tokens_per_micro_batch, 0)


@dataclass
class EvalConfig(Options):
    """Evaluation: which splits, at what temperature, under which protocol (docs/training.md)."""

    protocol: str = "verl-agent"  # verl-agent: sampled batches per seed | each-once: every game once
    splits: list[str] = field(  # In-distribution (valid_seen), Out-of-distribution (valid_unseen)
        default_factory=lambda: ["valid_seen", "valid_unseen"])
    temperature: float = 0.4  # evaluation rollout temperature
    seeds: list[int] = field(default_factory=lambda: [123, 456, 789])  # verl-agent: one run per seed
    batches: int = 4  # verl-agent: batches per seed
    batch_size: int = 128  # verl-agent: episodes per batch (env i walks its own shuffled cycle)
    games: int = 0  # each-once: the first N games of a split (0 = all)
    every: int = 0  # iterations between evaluations during training (0 = never)

    def _own_problems(self, p: Problems) -> None:
        p.one_of("protocol", self.protocol, EVAL_PROTOCOLS)
        p.check(len(set(self.splits)) == len(self.splits), "splits", self.splits,
                "a list without repeats")
        p.check(0 <= self.temperature < math.inf, "temperature", self.temperature,
                "a finite number >= 0 (0 = greedy)")
        p.check(bool(self.seeds) and all(x >= 0 for x in self.seeds), "seeds", self.seeds,
                "a non-empty list of seeds >= 0")
        p.at_least("batches", self.batches, 1)
        p.at_least("batch_size", self.batch_size, 1)
        p.at_least("games", self.games, 0)
        p.at_least("every", self.every, 0)


@dataclass
class SftConfig(Options):
    """Supervised warm start (`hgpo-jax sft`, docs/sft.md); uses optim, train, model, env, mesh."""

    # recorded episodes: expert | random (the reply format only) | search (ALFWorld: the hand-coded expert that
    # searches; WebShop: the instruction shopper) | first (WebShop: the instruction shopper opening the first
    # affordable result), or several joined by "+", each with its count as kind:N (e.g. expert+search:800); or a JSONL file of turns
    data: str = "expert"
    episodes: int = 200  # episodes recorded on env.split per kind without :N (toy: tasks; alfworld: games)
    steps: int = 300  # optimizer steps
    batch_size: int = 32  # turns per step (micro-batches: see micro_batches.sft_micro_batch_size)
    heldout: float = 0.1  # fraction of the episodes (or turns) held out for the held-out loss (0 = none)
    eval_every: int = 50  # steps between held-out losses (the last step always has one)
    save_every: int = 100  # steps between checkpoints (0 = only at the end)
    # batches of turns of similar length (each padded to its own longest turn): the order is
    # shuffled, cut into pools of 64 batches, each pool sorted by length and cut into batches,
    # and the batches shuffled; false = every batch a uniform draw (the padding follows the longest)
    group_by_length: bool = False

    def sources(self) -> list[tuple[str, int]]:
        """[(episode kind, count)] of `data` ("expert+search:800" -> [("expert", episodes),
        ("search", 800)]); [] when `data` is a JSONL file of turns (a path ending in .jsonl or an
        existing file)."""
        data = self.data.strip()
        if data.endswith(".jsonl") or os.path.isfile(data):
            return []
        out = []
        for part in data.split("+"):
            kind, _, count = part.strip().partition(":")
            if not kind.isidentifier() or (count and not count.strip().isdigit()):
                raise ConfigError(f"sft.data={self.data!r}: {part!r} is not KIND or KIND:N (e.g. "
                                  "expert, random, expert+search:800) and no such file exists")
            if kind in dict(out):
                raise ConfigError(f"sft.data={self.data!r} names {kind!r} twice; give each kind "
                                  "once, with its count as KIND:N")
            out.append((kind, int(count) if count else self.episodes))
        return out

    def _own_problems(self, p: Problems) -> None:
        p.check(bool(self.data.strip()), "data", self.data,
                "expert, random, search, KIND+KIND:N or a JSONL path")
        try:
            for kind, n in self.sources() if self.data.strip() else ():
                if n < 1:
                    p.add(f"the count of {kind} in sft.data={n!r}: must be >= 1")
        except ConfigError as e:
            p.add(str(e))
        p.at_least("episodes", self.episodes, 1)
        p.at_least("steps", self.steps, 1)
        p.at_least("batch_size", self.batch_size, 1)
        p.check(0 <= self.heldout < 1, "heldout", self.heldout, "in [0, 1)")
        p.at_least("eval_every", self.eval_every, 0)
        p.at_least("save_every", self.save_every, 0)


@dataclass
class GuidanceConfig(*GUIDANCE_OPTIONS, GuidanceChoice):
    """Guided rollouts (`kind`, declared in `hgpo_jax.guidance_specs`) and every kind's options."""


@dataclass
class MeshConfig(Options):
    """Device mesh axes (data, fsdp, tensor); their product is the device count."""

    data: int = -1  # -1 = all remaining devices
    fsdp: int = 1  # parameter/optimizer-state sharding (FSDP)
    tensor: int = 1  # tensor parallelism over heads and MLP

    def _own_problems(self, p: Problems) -> None:
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for axis, n in sizes.items():
            p.check(n >= 1 or n == -1, axis, n, "a positive size, or -1 for all remaining devices")
        if sum(n == -1 for n in sizes.values()) > 1:
            p.add(f"mesh: at most one axis may be -1 (all remaining devices), got {sizes}; "
                  "give the others explicit sizes")


@dataclass
class DistConfig(Options):
    """Multi-process runs (docs/multihost.md); who joins is given on the command line."""

    heartbeat_timeout_s: int = 100  # a process silent this long counts as dead: the job stops with an error
    init_timeout_s: int = 300  # seconds to wait for every process to join at start-up

    def _own_problems(self, p: Problems) -> None:
        p.at_least("heartbeat_timeout_s", self.heartbeat_timeout_s, 1)
        p.at_least("init_timeout_s", self.init_timeout_s, 1)


@dataclass
class Config:
    """A whole run. Defaults: the paper's ALFWorld Qwen2.5-1.5B-Instruct HGPO K=2 run."""

    name: str = "hgpo_k2_alfworld_qwen2.5_1.5b"  # run name; fills {name} in train.run_dir
    model: ModelConfig = field(default_factory=ModelConfig)  # policy model
    env: EnvConfig = field(default_factory=EnvConfig)  # environment
    agent: AgentConfig = field(default_factory=AgentConfig)  # prompt and reply format
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # sampling
    algo: AlgoConfig = field(default_factory=AlgoConfig)  # advantages and loss
    optim: OptimConfig = field(default_factory=OptimConfig)  # optimizer
    train: TrainConfig = field(default_factory=TrainConfig)  # loop, checkpoints
    eval: EvalConfig = field(default_factory=EvalConfig)  # evaluation protocol
    sft: SftConfig = field(default_factory=SftConfig)  # supervised warm start
    critic: CriticConfig = field(default_factory=CriticConfig)  # value model (algo.estimator=ppo)
    guidance: GuidanceConfig = field(default_factory=GuidanceConfig)  # guided rollouts
    mesh: MeshConfig = field(default_factory=MeshConfig)  # device mesh
    dist: DistConfig = field(default_factory=DistConfig)  # multi-process time-outs

    def run_path(self) -> str:
        """`train.run_dir` with `{name}` replaced by `name`."""
        return self.train.run_dir.replace("{name}", self.name)

    def validate(self) -> Config:
        """Check every value; raise one ConfigError listing all problems, as 'key: what is wrong;
        how to fix' strings: each section's own (checked beside its fields, `_own_problems`),
        then the rules that tie sections together (`config_checks.cross_section_problems`).
        Returns self."""
        p = Problems()
        p.check(bool(self.name.strip()) and "/" not in self.name, "name", self.name,
                "a non-empty name without '/'")
        for section in SECTIONS:
            p.items.extend(getattr(self, section).problems(f"{section}."))
        cross_section_problems(self, p)
        if p.items:
            raise ConfigError("invalid config:\n  " + "\n  ".join(p.items))
        return self


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)
                             if f.name != "name"}  # type: ignore[misc]
TOP_LEVEL_SCALARS = ("name",)
# sections that only some algorithms read (`AlgorithmSpec.sections`)
SECTIONS_OF_ALGORITHMS = ("critic",)


# ------------------------------------------------------------------------------------- merging
def _negate(value: Any) -> Any:
    return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else value


# Moved keys (old section, key) -> (new section, key, conversion): old files load, with a warning.
RENAMED_KEYS: dict[tuple[str, str], tuple[str, str, Any]] = {
    ("env", "eval_splits"): ("eval", "splits", None),
    ("rollout", "eval_temperature"): ("eval", "temperature", None),
    ("train", "eval_every"): ("eval", "every", None),
    ("train", "eval_games"): ("eval", "games", None),
    # was a (negative) reward added to invalid steps; now a positive amount subtracted
    ("rollout", "invalid_penalty"): ("algo", "invalid_penalty", _negate),
    ("guidance", "enable"): ("guidance", "kind", kind_of_enable),  # one kind, on or off
    ("guidance", "gamma"): ("guidance", "sigma_gamma", None),  # they read like algo.gamma
    ("guidance", "alpha"): ("guidance", "ema_alpha", None),  # and algo.alpha
}


def _renamed(section: str, sub: str, value: Any, where: str) -> tuple[str, str, Any]:
    """(section, key, value) with a moved key translated to its new place (and a warning)."""
    if (section, sub) not in RENAMED_KEYS:
        return section, sub, value
    new_section, new_sub, convert = RENAMED_KEYS[(section, sub)]
    note = " (sign flipped: it is now subtracted)" if convert is _negate else ""
    warnings.warn(f"{where}config key {section}.{sub} is now {new_section}.{new_sub}{note}; "
                  f"update the file or override", UserWarning, stacklevel=3)
    return new_section, new_sub, convert(value) if convert else value


def apply_mapping(cfg: Config, mapping: Mapping[str, Any], where: str = "",
                  given: dict[str, str] | None = None) -> Config:
    """Merge a nested mapping (one YAML file's content, without `base`) into `cfg` in place.

    `where` prefixes error messages (e.g. the file name). given: the `algo` options set so far
    (key -> where), for `check_algo_keys`; when given, an `algo.estimator` that switches to
    another algorithm first resets the algorithm's options to its defaults (`switch_algorithm`)
    and forgets the keys set for the one before.
    """
    top_valid = list(TOP_LEVEL_SCALARS) + list(SECTIONS)
    algo = mapping.get("algo") if isinstance(mapping, Mapping) else None
    if given is not None and isinstance(algo, Mapping) and "estimator" in algo:
        switch_algorithm(cfg, algo["estimator"], given)
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}config keys must be strings, got {key!r}")
        if key in TOP_LEVEL_SCALARS:
            set_field(cfg, key, value, "", where)
        elif key in SECTIONS:
            if key in SECTIONS_OF_ALGORITHMS and (value is None or value is False):
                raise section_switch_error(key, value, where)
            if value is None:
                continue  # an empty section (`algo:` with nothing under it) keeps the defaults
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}{key}: expected a mapping of keys (e.g. {key}: "
                                  f"{{...}}), got {value!r}")
            for sub, sub_value in value.items():
                if not isinstance(sub, str):
                    raise ConfigError(f"{where}{key}: keys must be strings, got {sub!r}")
                name, sub, sub_value = _renamed(key, sub, sub_value, where)
                set_field(getattr(cfg, name), sub, sub_value, f"{name}.", where)
                if given is not None and name == "algo" and sub != "estimator":
                    given[sub] = where
        elif key == BASE_KEY:
            raise ConfigError(f"{where}'base' is only allowed at the top of a YAML file")
        else:
            raise unknown_key(key, top_valid, "", where)
    return cfg


def switch_algorithm(cfg: Config, estimator: Any, given: dict[str, str]) -> None:
    """Before `algo.estimator` is set to `estimator`: where that is another known algorithm than
    the config's, its options (all but the policy loss's) start from the new algorithm's defaults
    (`AlgorithmSpec.option_defaults`: e.g. HiPER's gamma = lam = 1) and the keys given for the
    old one are forgotten (`given`). An unknown name is left to the validation."""
    if estimator == cfg.algo.estimator or estimator not in algorithm_names():
        return
    for key, value in algorithm_spec(estimator).option_defaults().items():
        setattr(cfg.algo, key, value)
    given.clear()


# ------------------------------------------------------------------------------------- files
def available_configs() -> list[str]:
    """Names of the configs shipped in hgpo_jax/configs."""
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


def resolve_config_path(source: str, relative_to: str | None = None) -> str:
    """Absolute path of a YAML file given as a path, a run folder or a bare config name.

    A run folder means its config.yaml; a bare name, hgpo_jax/configs/{name}.yaml. Relative
    paths are tried against `relative_to` (a folder) first, then the working directory.
    """
    if is_run_folder(source):
        return os.path.abspath(os.path.join(source, RUN_CONFIG_FILE))
    looks_like_path = source.endswith((".yaml", ".yml")) or "/" in source or os.sep in source
    candidates = []
    if looks_like_path:
        if relative_to and not os.path.isabs(source):
            candidates.append(os.path.join(relative_to, source))
        candidates.append(source)
    else:
        candidates.append(os.path.join(CONFIG_DIR, f"{source}.yaml"))
        candidates.append(source)  # a YAML file without an extension in the working directory
    for c in candidates:
        if os.path.isfile(c):
            return os.path.abspath(c)
    names = available_configs()
    hint = suggest(source, names) if not looks_like_path else ""
    raise ConfigError(f"config {source!r} not found (looked at {', '.join(candidates)}).{hint} "
                      f"Give a YAML path or one of: {', '.join(names) or '(none shipped)'}")


def is_run_folder(source: str) -> bool:
    """Whether `source` is a folder holding a run's config.yaml (a run folder, maybe without
    checkpoints yet)."""
    return os.path.isdir(source) and os.path.isfile(os.path.join(source, RUN_CONFIG_FILE))


def read_yaml(path: str) -> dict:
    """One YAML file as a dict ({} for an empty file); clear errors for bad YAML."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys at the top level, "
                          f"got {type(data).__name__}")
    return data


def config_layers(source: str, _chain: tuple[str, ...] = (), _relative_to: str | None = None
                  ) -> list[tuple[str, dict]]:
    """[(path, mapping without 'base'), ...] from the farthest base to `source` itself."""
    path = resolve_config_path(source, _relative_to)
    if path in _chain:
        cycle = " -> ".join(os.path.basename(p) for p in (*_chain, path))
        raise ConfigError(f"config inheritance cycle: {cycle}; remove one of the 'base:' keys")
    data = read_yaml(path)
    base = data.pop(BASE_KEY, None)
    layers: list[tuple[str, dict]] = []
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: base: must be a config name or YAML path, got {base!r}")
        layers = config_layers(base, (*_chain, path), os.path.dirname(path))
    return [*layers, (path, data)]


# ------------------------------------------------------------------------------------- overrides
def parse_override(text: str) -> tuple[str, Any, str]:
    """'section.key=value' -> (dotted key, YAML-parsed value, raw value text)."""
    if not isinstance(text, str) or "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. algo.K=4)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has no key; write section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({e}); quote it") from None
    return key, value, raw


def _field_type(cfg: Config, key: str) -> Any | None:
    """Type of dotted `key` in cfg, or None if the key does not exist (checked later)."""
    parts = key.split(".")
    if len(parts) == 1 and parts[0] in TOP_LEVEL_SCALARS:
        return field_types(Config)[parts[0]]
    if len(parts) == 2 and (parts[0], parts[1]) in RENAMED_KEYS:
        parts = list(RENAMED_KEYS[(parts[0], parts[1])][:2])
    if len(parts) == 2 and parts[0] in SECTIONS:
        return field_types(SECTIONS[parts[0]]).get(parts[1])
    group = option_groups(SECTIONS[parts[0]]).get(parts[1]) if len(parts) == 3 \
        and parts[0] in SECTIONS else None  # env.<env>.key
    return field_types(group).get(parts[2]) if group else None


def apply_override(cfg: Config, text: str, given: dict[str, str] | None = None) -> Config:
    """Apply one `section.key=value` (or `name=value`) override to cfg in place (`given`:
    `apply_mapping`'s)."""
    key, value, raw = parse_override(text)
    tp = _field_type(cfg, key)
    str_field = tp is str or tp == (str | None)
    if str_field and isinstance(value, (bool, int, float)):
        value = raw.strip()  # `name=2024`: keep the text, not YAML's number
    parts = key.split(".")
    where = f"override {text!r}: "
    if parts[0] not in SECTIONS and not (len(parts) == 1 and parts[0] in TOP_LEVEL_SCALARS):
        raise unknown_key(parts[0], [*TOP_LEVEL_SCALARS, *SECTIONS], "", where)
    if len(parts) > 3 or len(parts) == 3 and (not option_groups(SECTIONS[parts[0]])
                                               or parts[1] in field_types(SECTIONS[parts[0]])):
        raise ConfigError(f"{where}keys have at most two parts (section.key; three for an env's "
                          f"own options, env.<env>.key), got {key!r}")
    return apply_mapping(cfg, unflatten({key: value}), where, given)


# ------------------------------------------------------------------------------------- public API
def load_config(source: str | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- YAML layers (bases first) <- overrides, then `validate()`.

    Args:
      source: a YAML path, a run folder holding config.yaml, a bare name of
        hgpo_jax/configs/{name}.yaml, or None (defaults).
      overrides: `section.key=value` strings applied in order.
    Raises:
      ConfigError (a ValueError) naming the key and how to fix it.
    """
    if isinstance(overrides, str):
        raise ConfigError("overrides must be a list of 'section.key=value' strings, not one string")
    cfg = Config()
    given: dict[str, str] = {}  # the algo options set for the chosen algorithm (check_algo_keys)
    if source is not None:
        layers = config_layers(os.fspath(source))
        for path, data in layers:
            saved = _is_saved_run_config(path)  # a run's own record holds every key: not checked
            apply_mapping(cfg, data, f"{path}: ", None if saved else given)
        if "name" not in layers[-1][1]:
            cfg.name = os.path.splitext(os.path.basename(layers[-1][0]))[0]
        if _is_saved_run_config(layers[-1][0]) and "scan_layers" not in layers[-1][1].get("model", {}):
            cfg.model.scan_layers = False  # written before scanned layers: its checkpoints are unrolled
        if is_run_folder(source):  # a run is where its folder is, with what its resumes changed
            for record in read_config_changes(source):
                apply_mapping(cfg, unflatten({k: new for k, (_, new) in record["changes"].items()}),
                              f"{os.path.join(source, RUN_CHANGES_FILE)}: ")
            cfg.train.run_dir = os.path.abspath(source)
    for text in overrides:
        apply_override(cfg, text, given)
    cfg.validate()  # a value out of range first, then a key the algorithm does not read
    check_algo_keys(cfg, given)
    return cfg


def config_to_dict(cfg: Config) -> dict:
    """Plain nested dict (copies), in schema order, with env.<env.name>.* (other envs': left out)."""
    return {"name": cfg.name, **{s: section_values(getattr(cfg, s)) for s in SECTIONS}}


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Defaults <- a nested mapping (strict, no `base`), then validate."""
    return apply_mapping(Config(), data).validate()


RUN_CONFIG_HEADER = "# hgpo-jax run config (written by hgpo_jax.config.save_config)"


def _is_saved_run_config(path: str) -> bool:
    """Whether a YAML file is a run's own config.yaml (written by `save_config`)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().strip() == RUN_CONFIG_HEADER
    except OSError:
        return False


def save_config(cfg: Config, path: str) -> str:
    """Write cfg as YAML (atomically); `load_config(path)` gives back an equal Config."""
    text = (RUN_CONFIG_HEADER + "\n"
            + yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False))
    write_atomically(path, text.encode("utf-8"))
    return path


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"section.key": value, "env.<env>.key": value} -> {"section": {"key": value}, "env":
    {"<env>": {"key": value}}} (the inverse of `runs.flat_config`)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def read_config_changes(run_dir: str) -> list[dict]:
    """The changes that resumes of a run made, oldest first: [{"step", "time", "changes":
    {"section.key": [old, new]}}] from RUN_DIR/config_changes.jsonl ([] without it)."""
    path = os.path.join(run_dir, RUN_CHANGES_FILE)
    if not os.path.isfile(path):
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{n}: not a JSON line ({e}); the run's record of its "
                                      "config changes is damaged") from None
    return records


__all__ = [
    "AlgoConfig", "Config", "CriticConfig", "DistConfig", "EnvConfig", "EvalConfig", "MeshConfig",
    "ModelConfig", "OptimConfig", "RolloutConfig", "SftConfig", "TrainConfig",
    "RENAMED_KEYS", "RUN_CHANGES_FILE", "RUN_CONFIG_FILE", "apply_override", "available_configs",
    "config_from_dict", "config_to_dict", "is_run_folder", "load_config", "parse_override",
    "read_config_changes", "resolve_config_path", "save_config", "unflatten",
]
