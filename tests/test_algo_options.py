"""An algorithm owns its options: each declares the `algo` keys it reads and its own defaults
(`AlgorithmSpec.options / ignores / defaults`); a key given for an algorithm that never reads it is
refused by name, a config that switches algorithms starts from the new one's defaults, and HAE's
keyword defaults are HiPER's option defaults."""

import dataclasses
import inspect
import warnings

import pytest

from hgpo_jax.algo_specs import (ALGORITHMS, LossOptions, algorithm_names, hiper_option_defaults,
                                 readers_of)
from hgpo_jax.config import available_configs, load_config, save_config
from hgpo_jax.config_checks import ConfigError

HIPER = ["algo.estimator=hiper", "agent.name=plan-execute"]


@pytest.mark.parametrize("estimator, key, value, owner", [
    ("hiper", "omega", 2.0, "gigpo"), ("grpo", "lam_seg", 0.5, "hiper"),
    ("gigpo", "keep_penalty", -0.3, "hiper"), ("ppo", "K", 4, "hgpo"),
    ("hgpo", "lam_seg", 0.5, "hiper"), ("grpo", "K", 4, "hgpo"), ("rloo", "mode", "mean_norm", "grpo"),
])
def test_a_key_the_algorithm_never_reads_is_refused_by_name(estimator, key, value, owner):
    extra = ["agent.name=plan-execute"] if estimator == "hiper" else []
    with pytest.raises(ConfigError, match=rf"algo\.{key} is not an option of "
                                          rf"algo\.estimator={estimator}.*{owner}"):
        load_config("tiny_cpu_toy", [f"algo.estimator={estimator}", *extra, f"algo.{key}={value}"])


def test_a_key_in_a_config_file_is_refused_with_the_file_named(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: tiny_cpu_toy\nalgo:\n  estimator: grpo\n  omega: 2.0\n")
    with pytest.raises(ConfigError, match=rf"{path}: algo\.omega is not an option of "
                                          r"algo\.estimator=grpo"):
        load_config(str(path))


def test_switching_algorithms_starts_from_the_new_ones_defaults():
    """tiny_cpu_toy inherits HGPO's gamma 0.95 (set in its base file); switched to HiPER by an
    override it has HiPER's: gamma = lam = 1 (the authors' runs), the HAE defaults."""
    algo = load_config("tiny_cpu_toy", HIPER).algo
    assert (algo.gamma, algo.lam, algo.lam_seg, algo.keep_penalty_mode, algo.invalid_penalty,
            algo.norm_adv) == (1.0, 1.0, 0.95, "normalized", 0.1, True)
    assert load_config("tiny_cpu_toy", [*HIPER, "algo.gamma=0.9"]).algo.gamma == 0.9  # given after
    assert load_config("tiny_cpu_toy", ["algo.estimator=ppo", "rollout.group_size=1"]).algo.gamma == 1.0
    # the policy loss is every algorithm's: what the base set stays
    base = load_config("tiny_cpu_toy", ["algo.kl_coef=0.05"])
    assert load_config("tiny_cpu_toy", ["algo.kl_coef=0.05", *HIPER]).algo.kl_coef == base.algo.kl_coef
    # keys set for the algorithm before the switch are forgotten, not refused
    assert load_config("tiny_cpu_toy", ["algo.K=4", "algo.estimator=grpo"]).algo.K == 2


def test_every_algorithm_declares_its_keys_and_defaults():
    loss = {f.name for f in dataclasses.fields(LossOptions)}
    for name in algorithm_names():
        spec = ALGORITHMS[name]
        reads = spec.reads()
        assert reads and not set(reads) & loss and "estimator" not in reads
        assert set(reads) <= set(spec.option_defaults())
    assert readers_of("lam_seg") == ("hiper",) and readers_of("K") == ("hgpo",)
    assert readers_of("kl_coef") == algorithm_names()


def test_hae_keyword_defaults_are_hipers_option_defaults():
    from hgpo_jax.rl import hae_advantages

    defaults = hiper_option_defaults()
    params = {k: p.default for k, p in inspect.signature(hae_advantages).parameters.items()
              if p.default is not inspect.Parameter.empty and k in defaults}
    assert params == defaults  # the same names, the same values


def test_shipped_configs_load_and_saved_run_configs_keep_every_key(tmp_path):
    """No shipped config gives a key its algorithm does not read; a run folder's config.yaml
    (every key of every algorithm) still loads."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in available_configs():
            load_config(name)
    run = tmp_path / "run"
    run.mkdir()
    save_config(load_config("tiny_cpu_toy", ["algo.estimator=grpo"]), str(run / "config.yaml"))
    assert load_config(str(run)).algo.estimator == "grpo"
    with pytest.raises(ConfigError, match=r"algo\.K is not an option of algo\.estimator=grpo"):
        load_config(str(run), ["algo.K=4"])  # a resume's override is checked
