"""The HiPER learning demo's two commands (docs/hiper.md), end to end with tiny settings:
`hgpo-jax sft toy_hiper_format` builds the plan-execute toy model and teaches it the three-block
format, and `hgpo-jax train toy_hiper model.path=<that run>` trains it with HAE and the
three-head critic, with held-out success after every iteration."""

from __future__ import annotations

import math

from hgpo_jax.cli import main as cli_main
from hgpo_jax.config import load_config
from hgpo_jax.metrics import read_metrics


def test_the_demo_configs_keep_their_settings():
    sft, rl = load_config("toy_hiper_format"), load_config("toy_hiper")
    assert (sft.agent.name, sft.model.path, sft.sft.data) == ("plan-execute", "build:toy-tiny@plan-execute", "random")
    assert (rl.agent.name, rl.algo.estimator, rl.algo.spec.critic_heads) == ("plan-execute", "hiper", 3)
    assert (rl.rollout.group_size, rl.env.name, rl.eval.every) == (1, "toy", 1)


def test_sft_then_train_with_tiny_settings(tmp_path, capsys):
    warm = tmp_path / "format"
    assert cli_main(["sft", "toy_hiper_format", "--no-progress", f"train.run_dir={warm}",
                     "sft.episodes=16", "sft.steps=2", "sft.batch_size=8", "sft.eval_every=2",
                     "train.micro_batch_size=8"]) == 0
    assert f"model.path={warm}" in capsys.readouterr().out
    run = tmp_path / "rl"
    assert cli_main(["train", "toy_hiper", "--no-progress", f"model.path={warm}",
                     f"train.run_dir={run}", "train.iterations=3", "rollout.num_groups=2",
                     "env.max_steps=3", "eval.games=3", "train.mini_batch_size=6",
                     "train.micro_batch_size=6"]) == 0
    out = capsys.readouterr().out
    assert "eval/valid_seen" in out and "first third" in out
    records = [r for r in read_metrics(str(run)) if "hiper/switch_rate" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert all(math.isfinite(r[f"critic/vf_loss/head{h}"]) for h in range(3))
        assert 0.0 <= r["eval/valid_seen/all"] <= 1.0 and r["eval/valid_seen/episodes"] == 3
