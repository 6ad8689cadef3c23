"""hgpo_jax.config: defaults, YAML files, inheritance, overrides, strict typing, validation, and
every shipped hgpo_jax/configs/*.yaml with its paper values."""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from hgpo_jax.commands.common import format_config
from hgpo_jax.config import (CONFIG_DIR, AlgoConfig, Config, available_configs, config_from_dict,
                             config_to_dict, load_config, save_config)
from hgpo_jax.config_checks import ConfigError

PAPER_RUNS = [f"{algo}_alfworld_qwen2.5_{size}" for size in ("1.5b", "7b")
              for algo in ("hgpo_k2", "hgpo_k4", "gigpo", "grpo", "rloo")]


def write(folder, name, data) -> str:
    path = os.path.join(str(folder), name)
    with open(path, "w") as f:
        f.write(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------------------------- defaults
def test_defaults_are_the_paper_values():
    c = Config()
    assert c.name == "hgpo_k2_alfworld_qwen2.5_1.5b"
    assert (c.model.path, c.model.dtype, c.model.compute_dtype) == (
        "Qwen/Qwen2.5-1.5B-Instruct", "float32", "bfloat16")
    assert (c.env.name, c.env.split, c.env.projection) == ("alfworld", "train", "verl-agent")
    assert (c.env.max_steps, c.env.memory_len, c.env.data_dir) == (50, 2, None)
    r = c.rollout
    assert (r.group_size, r.num_groups, r.temperature) == (8, 16, 1.0)
    assert (r.max_new_tokens, r.max_prompt_tokens) == (512, 4096)  # the authors' HGPO scripts
    a = c.algo
    assert (a.estimator, a.gamma, a.K, a.alpha, a.mode) == ("hgpo", 0.95, 2, 1.0, "mean_std_norm")
    assert (a.clip_low, a.clip_high, a.kl_coef, a.kl_type, a.loss_agg, a.entropy_coef) == (
        0.2, 0.2, 0.01, "low_var_kl", "token-mean", 0.001)
    # the authors' code's semantics (docs/advantages.md)
    assert (a.invalid_penalty, a.penalty_placement, a.stats, a.level_weights, a.base_group) == (
        0.1, "row", "verl-agent", "verl-agent", False)
    assert c.optim.lr == 1e-6 and c.train.mini_batch_size == 256 and c.train.iterations == 160
    assert c.train.micro_batch_size == 32  # 16 per GPU on the paper's 2 GPUs
    e = c.eval
    assert (e.protocol, e.splits, e.temperature) == ("verl-agent", ["valid_seen", "valid_unseen"], 0.4)
    assert (e.seeds, e.batches, e.batch_size, e.every) == ([123, 456, 789], 4, 128, 0)
    assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (-1, 1, 1)
    assert c.run_path() == "runs/hgpo_k2_alfworld_qwen2.5_1.5b"
    assert load_config() == c


def test_default_lists_are_not_shared():
    a, b = Config(), Config()
    a.eval.splits.append("train")
    a.eval.seeds.append(1)
    assert b.eval.splits == ["valid_seen", "valid_unseen"] and b.eval.seeds == [123, 456, 789]


def test_allowed_values_come_from_the_consumers():
    from hgpo_jax.config_checks import allowed_values, env_splits
    from hgpo_jax.envs.alfworld import SPLITS
    from hgpo_jax.agents.verl_agent.projection import PROJECTIONS
    from hgpo_jax.envs.webshop import SPLITS as WEBSHOP_SPLITS
    from hgpo_jax.rl.advantages import ESTIMATORS, LEVEL_WEIGHTS, MODES, PENALTY_PLACEMENTS, STATS
    from hgpo_jax.rl.evaluation import EVAL_PROTOCOLS
    from hgpo_jax.rl.critic import ESTIMATOR
    from hgpo_jax.rl.loss import AGGS, KL_TYPES

    v = allowed_values()
    assert (v["estimator"], v["mode"], v["kl_type"], v["loss_agg"]) == (
        (*ESTIMATORS, ESTIMATOR, "hiper"), MODES, KL_TYPES, AGGS)
    assert set(v["env"]) == {"alfworld", "search", "toy", "toy-history", "toy-lock", "webshop"}  # the registry
    assert (env_splits("alfworld"), env_splits("webshop")) == (SPLITS, WEBSHOP_SPLITS)
    assert (v["penalty_placement"], v["stats"], v["level_weights"], v["projection"], v["protocol"]) == (
        PENALTY_PLACEMENTS, STATS, LEVEL_WEIGHTS, PROJECTIONS, EVAL_PROTOCOLS)


def test_format_config_is_compact_and_complete():
    text = format_config(Config())
    assert text.count("\n") == 10  # a title and one line per section (10 sections)
    assert "estimator=hgpo" in text and "lr=1e-06" in text and "splits=[valid_seen,valid_unseen]" in text


# ------------------------------------------------------------------------------------- YAML files
def test_round_trip(tmp_path):
    cfg = load_config(None, ["algo.K=4", "env.data_dir=/data/alf", "optim.lr=3e-7", "name=rt",
                             "eval.splits=[valid_unseen]", "eval.seeds=[7]", "mesh.data=-1"])
    path = save_config(cfg, str(tmp_path / "sub" / "config.yaml"))
    again = load_config(path)
    assert again == cfg
    assert config_to_dict(again) == config_to_dict(cfg)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    # every shipped config round-trips too
    for name in available_configs():
        c = load_config(name)
        assert load_config(save_config(c, str(tmp_path / f"{name}.yaml"))) == c


def test_partial_yaml_keeps_defaults(tmp_path):
    path = write(tmp_path, "part.yaml", "algo:\n  K: 3\nrollout:\n  num_groups: 4\noptim:\n")
    c = load_config(path)
    assert c.algo.K == 3 and c.rollout.num_groups == 4
    assert c.algo.gamma == 0.95 and c.rollout.group_size == 8 and c.optim == Config().optim
    assert c.name == "part"  # a file without `name` is named after its file
    assert load_config(write(tmp_path, "empty.yaml", "")).name == "empty"


def test_bare_name_resolves_to_shipped_config():
    c = load_config("tiny_cpu")
    assert c == load_config(os.path.join(CONFIG_DIR, "tiny_cpu.yaml"))


def test_run_folder_resolves_to_its_config(tmp_path):
    cfg = load_config("tiny_cpu_toy", ["train.seed=3"])
    save_config(cfg, str(tmp_path / "config.yaml"))
    # the same config, at the folder where it lies (a run is used where it is, wherever it moved)
    assert load_config(str(tmp_path)) == dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, run_dir=str(tmp_path)))


def test_missing_config_suggests_names(tmp_path):
    with pytest.raises(ConfigError, match="tiny_cpu"):
        load_config("tiny_cpux")
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))


def test_bad_yaml_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "bad.yaml", "algo: [1, 2\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "list.yaml", "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="algo: expected a mapping"):
        load_config(write(tmp_path, "sec.yaml", "algo: 4\n"))


def test_base_inheritance(tmp_path):
    write(tmp_path, "parent.yaml", {"name": "parent", "algo": {"K": 3, "gamma": 0.9},
                                    "rollout": {"num_groups": 4}})
    child = write(tmp_path, "child.yaml", {"base": "parent.yaml", "algo": {"K": 1}})
    c = load_config(child)
    assert (c.algo.K, c.algo.gamma, c.rollout.num_groups) == (1, 0.9, 4)
    assert c.name == "child"  # the loaded file's own name, not the base's
    # overrides win over both; bases may be shipped names
    c = load_config(write(tmp_path, "shipped.yaml", "base: tiny_cpu\nalgo:\n  K: 0\n"), ["algo.K=5"])
    assert c.algo.K == 5 and c.model.path == "tiny" and c.name == "shipped"
    # grand-parents, relative to the including file
    sub = tmp_path / "sub"
    sub.mkdir()
    write(sub, "g.yaml", {"base": "../child.yaml", "train": {"seed": 7}})
    c = load_config(str(sub / "g.yaml"))
    assert (c.algo.K, c.algo.gamma, c.train.seed) == (1, 0.9, 7)


def test_base_cycle_is_a_clear_error(tmp_path):
    write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"cycle: a.yaml -> b.yaml -> a.yaml"):
        load_config(str(tmp_path / "a.yaml"))
    write(tmp_path, "self.yaml", "base: self.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(tmp_path / "self.yaml"))
    with pytest.raises(ConfigError, match="base"):
        load_config(write(tmp_path, "badbase.yaml", "base: 3\n"))


# ------------------------------------------------------------------------------------- overrides
def test_overrides_of_every_type():
    c = load_config(None, [
        "algo.K=4",                      # int
        "algo.gamma=1",                  # int -> float
        "optim.lr=1e-6",                 # YAML string -> float
        "algo.eps=1.0e-8",               # YAML float
        "eval.splits=[valid_seen]",      # list[str]
        "eval.seeds=[1, 2]",             # list[int]
        "env.data_dir=/data/alfworld",   # Optional[str]
        "model.path=/models/Qwen 1.5B",  # str with a space
        "name=2024",                     # str field: number text kept as text
        "rollout.temperature=0",         # int -> float
        "mesh.data=-1",
    ])
    assert c.algo.K == 4 and isinstance(c.algo.gamma, float) and c.algo.gamma == 1.0
    assert c.optim.lr == 1e-6 and isinstance(c.optim.lr, float) and c.algo.eps == 1e-8
    assert c.eval.splits == ["valid_seen"] and c.env.data_dir == "/data/alfworld"
    assert c.eval.seeds == [1, 2]
    assert c.model.path == "/models/Qwen 1.5B" and c.name == "2024" and c.run_path() == "runs/2024"
    assert c.rollout.temperature == 0.0 and isinstance(c.rollout.temperature, float)
    for none in ("env.data_dir=null", "env.data_dir=", "env.data_dir=~"):
        assert load_config(None, ["env.data_dir=/x", none]).env.data_dir is None
    with pytest.raises(ConfigError, match=r"eval.splits=\[\] is empty"):  # a list, refused empty
        load_config(None, ["eval.splits=[]"])
    # a whole section as a mapping
    assert load_config(None, ["algo={K: 3, alpha: 2}"]).algo.K == 3


def test_override_order_and_file_then_override():
    c = load_config("hgpo_k4_alfworld_qwen2.5_1.5b", ["algo.K=3", "algo.K=1"])
    assert c.algo.K == 1 and c.env.memory_len == 4


@pytest.mark.parametrize("override, match", [
    ("algo.k=4", r"unknown config key 'algo.k'\. Did you mean 'algo.K'\?"),
    ("algo.gama=0.9", r"Did you mean 'algo.gamma'\?"),
    ("algos.K=4", r"unknown config key 'algos'\. Did you mean 'algo'\?"),
    ("nam=x", r"Did you mean 'name'\?"),
    ("rollout.num_group=2", r"Did you mean 'rollout.num_groups'\?"),
    ("algo.K.x=1", "at most two parts"),
    ("algoK4", "section.key=value"),
    ("=4", "no key"),
    ("base=tiny_cpu", "unknown config key 'base'"),
])
def test_bad_override_keys(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_unknown_key_in_yaml_names_file_and_suggestion(tmp_path):
    path = write(tmp_path, "typo.yaml", "optim:\n  learning_rate: 1.0e-6\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "typo.yaml" in str(e.value) and "optim.learning_rate" in str(e.value)
    with pytest.raises(ConfigError, match="Did you mean 'algo.K'"):
        load_config(write(tmp_path, "k.yaml", "algo:\n  k: 4\n"))


@pytest.mark.parametrize("override, match", [
    ("algo.K=2.5", r"algo.K: expected int, got 2.5"),
    ("algo.K=true", r"algo.K: expected int, got True"),
    ("algo.K=four", r"algo.K: expected int, got 'four'"),
    ("optim.lr=fast", r"optim.lr: expected float, got 'fast'"),
    ("optim.lr=true", r"optim.lr: expected float, got True"),
    ("optim.lr=[1]", r"optim.lr: expected float"),
    ("optim.lr=.nan", "NaN"),
    ("algo.gamma=null", r"algo.gamma: expected float, got null"),
    ("eval.splits=valid_seen", r"expected list\[str\].*\[a,b\]"),
    ("eval.splits=[1]", r"eval.splits\[0\]: expected str, got 1"),
    ("eval.seeds=[a]", r"eval.seeds\[0\]: expected int"),
    ("model.path=[a]", r"model.path: expected str"),
    ("model.path=null", r"model.path: expected str, got null"),
    ("env.data_dir=[a]", r"env.data_dir: expected str \| None"),
    ("algo={K: x}", r"algo.K: expected int"),
    ("algo=3", r"algo: expected a mapping"),
])
def test_wrong_types(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_bool_field_is_strict():
    from hgpo_jax.config_checks import coerce_value

    assert coerce_value("x", True, bool) is True
    for bad in (0, 1, "true"):
        with pytest.raises(ConfigError, match="expected bool"):
            coerce_value("x", bad, bool)


def test_yaml_float_strings_coerced(tmp_path):
    c = load_config(write(tmp_path, "f.yaml", "optim:\n  lr: 1e-6\n  weight_decay: 0\n"))
    assert c.optim.lr == 1e-6 and c.optim.weight_decay == 0.0
    assert isinstance(c.optim.weight_decay, float)


def test_overrides_must_be_a_list():
    with pytest.raises(ConfigError, match="list"):
        load_config(None, "algo.K=4")


# ------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("override, match", [
    ("algo.estimator=ppo2", r"algo.estimator='ppo2' is not allowed; use one of grpo, rloo, gigpo, hgpo, ppo"),
    ("algo.lam=1.5", r"algo.lam=1.5: must be in \[0, 1\]"),
    ("critic.cliprange_value=0", r"critic.cliprange_value=0.0: must be a finite number > 0"),
    ("rollout.group_size=1", r"rollout.group_size=1: must be >= 2"),
    ("algo.estimator=HGPO", r"Did you mean 'hgpo'"),
    ("algo.mode=std", "algo.mode"),
    ("algo.kl_type=k3", "algo.kl_type"),
    ("algo.loss_agg=sum", "algo.loss_agg"),
    ("optim.schedule=linear", r"optim.schedule='linear' is not allowed; use one of constant, cosine"),
    ("env.name=webshopp", "env.name.*Did you mean .webshop."),
    ("env.split=test", "env.split"),
    ("eval.splits=[valid_seen,bogus]", r"eval.splits\[1\]"),
    ("eval.splits=[valid_seen,valid_seen]", "without repeats"),
    ("eval.protocol=paper", "eval.protocol='paper' is not allowed; use one of verl-agent, each-once"),
    ("eval.temperature=-1", "eval.temperature"),
    ("eval.seeds=[]", "eval.seeds"),
    ("eval.seeds=[-1]", "eval.seeds"),
    ("eval.batches=0", "eval.batches"),
    ("eval.batch_size=0", "eval.batch_size"),
    ("eval.games=-1", "eval.games"),
    ("eval.every=-2", "eval.every"),
    ("env.projection=loose", "env.projection='loose' is not allowed; use one of verl-agent, strict"),
    ("algo.invalid_penalty=-0.1", r"algo.invalid_penalty=-0.1: must be a finite number >= 0"),
    ("algo.penalty_placement=step", "algo.penalty_placement"),
    ("algo.stats=torch", "algo.stats"),
    ("algo.level_weights=uniform", "algo.level_weights"),
    ("model.dtype=float16", "model.dtype"),
    ("model.compute_dtype=fp32", "model.compute_dtype"),
    ("model.path=", "model.path"),
    ("name=a/b", "name"),
    ("rollout.group_size=1", r"rollout.group_size=1: must be >= 2"),
    ("rollout.num_groups=0", "rollout.num_groups=0: must be >= 1"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
    ("rollout.max_prompt_tokens=-1", "rollout.max_prompt_tokens"),
    ("rollout.temperature=-0.1", "rollout.temperature"),
    ("rollout.top_p=0", r"rollout.top_p=0.0: must be in \(0, 1\]"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("rollout.top_k=-1", "rollout.top_k"),
    ("env.max_steps=0", "env.max_steps"),
    ("env.memory_len=-1", "env.memory_len"),
    ("env.num_workers=0", "env.num_workers"),
    ("env.step_timeout=0", "env.step_timeout"),
    ("env.reset_timeout=.inf", "env.reset_timeout"),
    ("env.data_dir=' '", "env.data_dir"),
    ("algo.gamma=1.5", r"algo.gamma=1.5: must be in \[0, 1\]"),
    ("algo.gamma=-0.1", "algo.gamma"),
    ("algo.K=-1", "algo.K=-1: must be >= 0"),
    ("algo.alpha=.inf", "algo.alpha"),
    ("algo.eps=-1", "algo.eps"),
    ("algo.clip_low=1", "algo.clip_low"),
    ("algo.clip_high=-0.1", "algo.clip_high"),
    ("algo.dual_clip=1", "algo.dual_clip=1.0: must be a finite number > 1"),
    ("algo.kl_coef=-0.01", "algo.kl_coef"),
    ("algo.entropy_coef=-0.001", r"algo.entropy_coef=-0.001: must be a finite number >= 0"),
    ("algo.entropy_coef=.inf", "algo.entropy_coef"),
    ("optim.lr=0", "optim.lr"),
    ("optim.weight_decay=-1", "optim.weight_decay"),
    ("optim.max_grad_norm=0", "optim.max_grad_norm"),
    ("optim.warmup_steps=-1", "optim.warmup_steps"),
    ("optim.b1=1", "optim.b1"),
    ("optim.b2=-0.5", "optim.b2"),
    ("train.iterations=0", "train.iterations"),
    ("train.ppo_epochs=0", "train.ppo_epochs"),
    ("train.mini_batch_size=0", "train.mini_batch_size"),
    ("train.micro_batch_size=0", "train.micro_batch_size"),
    ("train.micro_batch_size=24", r"mini_batch_size=256 must be a multiple of "
                                  r"train.micro_batch_size=24; e.g. set train.micro_batch_size=16"),
    ("train.seed=-1", "train.seed"),
    ("train.run_dir=", "train.run_dir"),
    ("train.save_every=-1", "train.save_every"),
    ("train.keep_checkpoints=0", "train.keep_checkpoints"),
    ("mesh.data=0", r"mesh.data=0: must be a positive size, or -1"),
    ("mesh.tensor=-2", "mesh.tensor"),
    ("mesh.fsdp=-1", "at most one axis may be -1"),
    ("mesh.data=3", r"micro_batch_size=32 cannot be split over the data-parallel size mesh.data x "
                    r"mesh.fsdp = 3: make train.mini_batch_size and train.micro_batch_size multiples of 3"),
    ("mesh.data=64", r"data-parallel size mesh.data x mesh.fsdp = 64: set train.micro_batch_size=64,"),
])
def test_semantic_errors(override, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, [override])
    assert isinstance(e.value, ValueError)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.gamma=2", "rollout.top_p=0", "optim.schedule=x"])
    msg = str(e.value)
    assert "algo.gamma" in msg and "rollout.top_p" in msg and "optim.schedule" in msg


def test_validate_on_a_built_config():
    cfg = Config(algo=AlgoConfig(estimator="nope"))
    with pytest.raises(ConfigError, match="algo.estimator"):
        cfg.validate()
    assert Config().validate() == Config()


# ------------------------------------------------------------------------------------- shipped
def test_every_shipped_yaml_validates():
    names = available_configs()
    assert set(PAPER_RUNS) | {"tiny_cpu", "tiny_cpu_toy"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.name == name  # run folders are named after their config
        with open(os.path.join(CONFIG_DIR, f"{name}.yaml")) as f:
            assert f.read().startswith("#"), f"{name}.yaml needs a header comment"


@pytest.mark.parametrize("name", PAPER_RUNS)
def test_paper_values(name):
    c = load_config(name)
    # shared paper hyperparameters
    assert (c.env.name, c.env.split, c.env.max_steps) == ("alfworld", "train", 50)
    assert (c.eval.splits, c.eval.protocol, c.eval.temperature) == (
        ["valid_seen", "valid_unseen"], "verl-agent", 0.4)
    assert (c.eval.seeds, c.eval.batches, c.eval.batch_size) == ([123, 456, 789], 4, 128)
    assert (c.rollout.group_size, c.rollout.num_groups) == (8, 16)
    assert (c.rollout.temperature, c.rollout.max_new_tokens) == (1.0, 512)
    assert (c.algo.invalid_penalty, c.algo.penalty_placement, c.algo.stats, c.algo.level_weights) == (
        0.1, "row", "verl-agent", "verl-agent")
    assert c.env.projection == "verl-agent" and c.algo.mode == "mean_std_norm"
    assert (c.optim.lr, c.algo.kl_coef, c.algo.kl_type, c.algo.entropy_coef) == (1e-6, 0.01, "low_var_kl", 0.001)
    assert (c.algo.clip_low, c.algo.clip_high, c.algo.gamma, c.algo.alpha) == (0.2, 0.2, 0.95, 1.0)
    assert c.train.mini_batch_size == 256
    assert (c.model.dtype, c.model.compute_dtype) == ("float32", "bfloat16")
    # algorithm
    algo = name.split("_alfworld")[0]
    if algo.startswith("hgpo"):  # the authors' HGPO scripts
        K = int(algo[-1])
        assert (c.algo.estimator, c.algo.K, c.env.memory_len) == ("hgpo", K, K)
        assert (c.train.iterations, c.rollout.max_prompt_tokens, c.train.micro_batch_size) == (160, 4096, 32)
    else:  # the authors' baseline scripts
        assert (c.algo.estimator, c.env.memory_len) == (algo, 2)
        assert (c.train.iterations, c.rollout.max_prompt_tokens) == (150, 2048)
        assert c.train.micro_batch_size == (64 if name.endswith("_1.5b") else 32)
    # model and mesh
    if name.endswith("_1.5b"):
        assert c.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
        assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (1, 2, 1)
    else:
        assert c.model.path == "Qwen/Qwen2.5-7B-Instruct"
        assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (1, 4, 1)


WEBSHOP_RUNS = [f"{a}_webshop_qwen2.5_{size}" for a in ("hgpo_k2", "hgpo_k4", "gigpo", "grpo", "rloo")
                for size in ("1.5b", "7b")]


@pytest.mark.parametrize("name", WEBSHOP_RUNS)
def test_webshop_paper_values(name):
    """The authors' WebShop scripts: recipe/hgpo/run_qwen2.5_*_webshop_train.sh (HGPO) and
    examples/*_trainer/run_webshop.sh (baselines)."""
    c = load_config(name)
    assert (c.env.name, c.env.split, c.env.seed, c.eval.splits) == ("webshop", "train", 0, ["test"])
    assert (c.eval.seeds, c.eval.batches, c.eval.batch_size, c.eval.temperature) == ([123, 456, 789], 4, 128, 0.4)
    assert (c.rollout.group_size, c.rollout.num_groups, c.rollout.max_prompt_tokens) == (8, 16, 4096)
    assert (c.train.mini_batch_size, c.optim.lr, c.algo.kl_coef, c.algo.invalid_penalty) == (64, 1e-6, 0.01, 0.1)
    assert c.algo.gamma == 0.95
    algo = name.split("_webshop")[0]
    if algo.startswith("hgpo"):
        K = int(algo[-1])
        assert (c.algo.estimator, c.algo.K, c.env.memory_len, c.algo.mode) == ("hgpo", K, K, "mean_norm")
        assert (c.env.max_steps, c.train.iterations, c.train.micro_batch_size) == (30, 160, 8)
    else:
        assert (c.algo.estimator, c.env.memory_len, c.env.max_steps, c.train.iterations) == (algo, 2, 15, 150)
        assert c.algo.mode == ("mean_norm" if algo == "gigpo" else "mean_std_norm")
        assert c.train.micro_batch_size == (16 if name.endswith("_1.5b") else 8)
    assert c.mesh.fsdp == (2 if name.endswith("_1.5b") else 4)
    assert load_config("tiny_cpu_webshop").env.name == "webshop"


PPO_RUNS = [f"ppo_{env}_qwen2.5_{size}" for env in ("alfworld", "webshop") for size in ("1.5b", "7b")]


@pytest.mark.parametrize("name", PPO_RUNS)
def test_ppo_paper_values(name):
    """verl-agent's examples/ppo_trainer/run_{alfworld,webshop}.sh (docs/ppo_spec.md): 128
    independent envs, GAE gamma = lambda = 1 (verl's defaults), critic lr 1e-5, value clip 0.5,
    no critic warm-up; the actor as the GRPO baseline."""
    c = load_config(name)
    webshop = "_webshop_" in name
    assert (c.algo.estimator, c.algo.gamma, c.algo.lam) == ("ppo", 1.0, 1.0)
    assert (c.rollout.group_size, c.rollout.num_groups, c.rollout.max_new_tokens) == (1, 128, 512)
    assert (c.critic.lr, c.critic.cliprange_value, c.critic.warmup_iterations) == (1e-5, 0.5, 0)
    assert (c.critic.weight_decay, c.critic.max_grad_norm) == (0.01, 1.0)
    assert (c.optim.lr, c.algo.kl_coef, c.algo.kl_type, c.algo.entropy_coef, c.algo.invalid_penalty) == (
        1e-6, 0.01, "low_var_kl", 0.001, 0.1)
    assert (c.env.name, c.env.max_steps, c.env.memory_len, c.train.iterations) == (
        ("webshop", 15, 2, 150) if webshop else ("alfworld", 50, 2, 150))
    assert (c.train.mini_batch_size, c.rollout.max_prompt_tokens) == ((64, 4096) if webshop else (256, 2048))
    if name.endswith("_1.5b"):
        assert c.train.micro_batch_size == (16 if webshop else 32)
    assert "critic" in format_config(c) and "critic" not in format_config(load_config("grpo_alfworld_qwen2.5_1.5b"))


def test_paper_files_use_inheritance():
    for name in PAPER_RUNS:
        with open(os.path.join(CONFIG_DIR, f"{name}.yaml")) as f:
            data = yaml.safe_load(f)
        if name != "hgpo_k2_alfworld_qwen2.5_1.5b":
            assert "base" in data, name
            assert len(yaml.safe_dump(data).splitlines()) <= 12, f"{name} should state only what differs"
    with open(os.path.join(CONFIG_DIR, "hgpo_k2_alfworld_qwen2.5_7b.yaml")) as f:
        assert "model.path=" in f.read()  # says how to point at a local download


def test_tiny_configs():
    c = load_config("tiny_cpu")
    assert (c.env.name, c.env.split, c.model.path, c.model.compute_dtype) == (
        "alfworld", "train", "tiny", "float32")
    assert (c.rollout.num_groups, c.rollout.group_size, c.env.max_steps) == (2, 2, 4)
    assert (c.rollout.max_new_tokens, c.rollout.max_prompt_tokens, c.env.memory_len) == (16, 512, 2)
    t = c.train
    assert (t.iterations, t.mini_batch_size, t.micro_batch_size, t.save_every) == (3, 8, 4, 1)
    assert t.keep_checkpoints == 2
    assert (c.eval.every, c.eval.games, c.eval.seeds, c.eval.batches, c.eval.batch_size) == (0, 4, [123], 1, 4)
    assert (c.env.num_workers, c.optim.lr) == (2, 1e-5)
    assert dataclasses.astuple(c.mesh) == (1, 1, 1)
    toy = load_config("tiny_cpu_toy")
    assert toy.env.name == "toy" and toy.name == "tiny_cpu_toy"
    assert dataclasses.replace(toy, name="tiny_cpu", env=c.env) == c


# ------------------------------------------------------------------------------------- moved keys
@pytest.mark.parametrize("old, new, value, expected", [
    ("env.eval_splits", "eval.splits", "[valid_unseen]", ["valid_unseen"]),
    ("rollout.eval_temperature", "eval.temperature", "0.7", 0.7),
    ("train.eval_every", "eval.every", "5", 5),
    ("train.eval_games", "eval.games", "9", 9),
    ("rollout.invalid_penalty", "algo.invalid_penalty", "-0.1", 0.1),  # sign flipped
])
def test_moved_keys_still_load_with_a_warning(tmp_path, old, new, value, expected):
    with pytest.warns(UserWarning, match=f"{old} is now {new}"):
        c = load_config(None, [f"{old}={value}"])
    section, key = new.split(".")
    assert getattr(getattr(c, section), key) == expected
    old_section, old_key = old.split(".")
    path = write(tmp_path, "old.yaml", f"{old_section}:\n  {old_key}: {value}\n")
    with pytest.warns(UserWarning, match=f"{old} is now {new}"):
        assert getattr(getattr(load_config(path), section), key) == expected


def test_papers_statistics_need_the_penalty_in_the_reward():
    with pytest.raises(ConfigError, match="penalty_placement=reward"):
        load_config(None, ["algo.estimator=grpo", "algo.stats=paper"])
    ok = load_config(None, ["algo.estimator=grpo", "algo.stats=paper", "algo.penalty_placement=reward"])
    assert ok.algo.stats == "paper"
    assert load_config(None, ["algo.stats=paper"]).algo.estimator == "hgpo"  # no episode term
    with pytest.raises(ConfigError, match="penalty_placement=reward"):
        load_config(None, ["algo.stats=paper", "algo.base_group=true"])


def test_the_configs_ship_inside_the_package_and_the_configs_command_lists_them(capsys):
    import hgpo_jax
    from hgpo_jax.cli import main

    assert os.path.dirname(CONFIG_DIR) == os.path.dirname(os.path.abspath(hgpo_jax.__file__))
    assert main(["configs", "7b_lora"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [n for n in available_configs() if "7b_lora" in n] and len(names) == 4
    assert main(["configs", "no-such-name"]) == 2
    assert "no shipped config name contains 'no-such-name'" in capsys.readouterr().err
