"""The rest of the tool on a HiPER run: one tiny `tiny_cpu_hiper` run of one iteration, trained
once in the unchanged trainer (module fixture), then evaluated, its critic exported, resumed
and plotted as a user would (`hgpo-jax ...` through `cli.main`); `hgpo-jax plan` of the config
is in tests/test_hiper.py (it needs no run).

The run's prompts are cut to 256 tokens (the plan-execute prompt of a toy turn is ~1,050 with
the tiny tokenizer): what is checked here is the path, not the replies, and the shorter rows
make its steps cheap on a CPU. A persistent compilation cache, for this module alone, lets the
resumed run reuse the first one's programs.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from test_run_folder import EVAL_SMALL, SMALL, assert_one_line_error, run_cli

from hgpo_jax.config import load_config

CUT = "rollout.max_prompt_tokens=256"
pytestmark = pytest.mark.filterwarnings("ignore:rollout.max_prompt_tokens=256 cut the start")


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """JAX's persistent compilation cache (programs that took over a second to compile) in a
    folder of this module's; JAX's settings as they were after it."""
    from jax.experimental.compilation_cache import compilation_cache

    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_entry_size_bytes")
    before = {k: getattr(jax.config, k) for k in keys}  # the cache sets a minimum entry size
    jax.config.update(keys[0], str(tmp_path_factory.mktemp("jax-cache")))
    compilation_cache.reset_cache()
    yield
    for k, v in before.items():
        jax.config.update(k, v)
    compilation_cache.reset_cache()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, compile_cache):
    """(run folder, its first iteration's metrics): tiny_cpu_hiper, one iteration, trained with
    the trainer as it is."""
    from hgpo_jax.trainers.rl import Trainer

    run = tmp_path_factory.mktemp("hiper") / "run"
    cfg = load_config("tiny_cpu_hiper", [f"train.run_dir={run}", "env.num_workers=1",
                                         "train.iterations=1", CUT])
    with Trainer(cfg, progress=False) as trainer:
        (metrics,) = trainer.train()
    return run, metrics


@pytest.fixture
def run(trained):
    return trained[0]


def test_tiny_hiper_trains_in_the_unchanged_trainer_and_saves_three_heads(trained):
    from hgpo_jax.runs import load_run_state_model

    run, metrics = trained
    for head in range(3):
        assert np.isfinite(metrics[f"critic/vf_loss/head{head}"])
        assert np.isfinite(metrics[f"critic/explained_var/head{head}"])
    assert metrics["train/updates"] >= 1 and np.isfinite(metrics["train/loss"])
    assert 0.0 <= metrics["hiper/switch_rate"] <= 1.0
    # a segment starts on turn 0 and on each SWITCH: 1 / (segment starts per turn)
    assert metrics["hiper/mean_segment_length"] == pytest.approx(1 / metrics["hiper/segments_per_turn"])
    assert np.isfinite(metrics["critic/explained_var"])
    critic, _ = load_run_state_model(str(run))
    assert critic.num_heads == 3


def test_eval_of_a_hiper_run_is_recorded_in_its_folder(run, capsys):
    code, out, err = run_cli(capsys, "eval", run, *EVAL_SMALL, *SMALL, "--json")
    assert code == 0, err
    assert f"evaluating {run} at iteration 1" in out
    records = [f for f in os.listdir(run / "eval") if f.endswith(".json")]
    assert len(records) == 1 and records[0].endswith("-rl1.json")
    record = json.loads((run / "eval" / records[0]).read_text())
    assert record["step"] == 1 and record["config"]["algo"]["estimator"] == "hiper"
    assert record["results"]["eval/valid_seen/episodes"] == 2.0
    assert json.loads(out.strip().splitlines()[-1])["valid_seen"]["episodes"] == 2


def test_eval_of_a_hiper_run_builds_the_policy_alone(run, capsys, monkeypatch):
    """`hgpo-jax eval` of a HiPER run (trained with a critic, a reference and two optimizers)
    plays with the policy alone: no trainer, no optimizer state, no algorithm (whose state is the
    critic); every array the evaluator's loading left alive is a weight of its policy."""
    from flax import nnx

    import hgpo_jax.runs as runs
    from hgpo_jax.trainers import evaluator as evaluator_module
    from hgpo_jax.trainers import rl as rl_module

    def refuse(*args, **kwargs):
        raise AssertionError("evaluation built a part of training")

    monkeypatch.setattr(rl_module.Trainer, "__init__", refuse)
    monkeypatch.setattr(rl_module, "build_algorithm", refuse)
    monkeypatch.setattr(runs, "init_opt_state", refuse)
    built = []
    load = evaluator_module.Evaluator.load.__func__

    def spied(cls, cfg, progress=True):
        before = {id(a) for a in jax.live_arrays()}
        evaluator = load(cls, cfg, progress)
        built.append((evaluator, [a for a in jax.live_arrays() if id(a) not in before]))
        return evaluator

    monkeypatch.setattr(evaluator_module.Evaluator, "load", classmethod(spied))
    code, out, err = run_cli(capsys, "eval", run, *EVAL_SMALL, *SMALL)
    assert code == 0, err
    (evaluator, made), = built
    weights = jax.tree.leaves(nnx.state(evaluator.model()))
    assert {id(a) for a in made} <= {id(w) for w in weights}
    assert sum(a.nbytes for a in made) == sum(w.nbytes for w in weights)
    assert evaluator.sampler.num_compiles >= 1  # its own programs, none shared


def test_the_exported_critic_has_three_labels_and_transformers_reads_its_values(run, tmp_path,
                                                                                capsys):
    import jax.numpy as jnp
    import torch
    from hf_models import hf_logits
    from transformers import Qwen2ForTokenClassification

    from hgpo_jax.runs import load_run_state_model

    out = tmp_path / "critic"
    code, _, err = run_cli(capsys, "export", run, out, "--critic", "--no-progress")
    assert code == 0, err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForTokenClassification"]
    assert cfg["num_labels"] == 3 and len(cfg["id2label"]) == len(cfg["label2id"]) == 3
    hf = Qwen2ForTokenClassification.from_pretrained(out, dtype=torch.float32).eval()
    assert hf.config.num_labels == 3
    ours, _ = load_run_state_model(str(run))
    ids = np.random.RandomState(0).randint(0, cfg["vocab_size"], (2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    values = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    assert values.shape == (2, 9, 3)
    np.testing.assert_allclose(hf_logits(hf, ids, mask) * mask[..., None],
                               values * mask[..., None], atol=2e-5)


def test_a_resumed_hiper_run_goes_on_with_its_three_heads(run, tmp_path, capsys):
    from hgpo_jax.checkpoint import Checkpointer
    from hgpo_jax.rl.algorithms import saved_state_signature

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    code, out, err = run_cli(capsys, "train", copy, "--resume", "train.iterations=2", *SMALL)
    assert code == 0, err
    assert f"resuming {copy} at iteration 1" in out and "iterations 2..2" in out
    records = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "hiper/switch_rate" in r] == [1, 2]
    ckpt = Checkpointer(copy / "checkpoints", read_only=True)
    try:
        assert ckpt.steps()[-1] == 2
        assert saved_state_signature(ckpt.items(), ckpt.item_shapes) == ("critic", 3)
    finally:
        ckpt.close()


def test_a_hiper_run_resumed_as_ppo_is_refused_before_anything_loads(run, capsys):
    before = sorted(os.listdir(run))
    code, _, err = run_cli(capsys, "train", run, "--resume", "--allow-change",
                           "algo.estimator=ppo", "train.iterations=2", *SMALL)
    assert_one_line_error(code, err, "train", "holds a critic of 3 value heads, but "
                          "algo.estimator=ppo trains a critic of 1 value head",
                          "resume it with algo.estimator=hiper")
    assert sorted(os.listdir(run)) == before


def test_plot_draws_the_hiper_panels(run, tmp_path, capsys):
    """The defaults, then HiPER's switch rate, mean segment length and explained variances."""
    from test_metrics import load_plot

    plot = load_plot()
    out = tmp_path / "plots.png"
    assert plot.main([str(run), "--out", str(out)]) == 0
    assert os.path.getsize(out) > 10_000
    printed = capsys.readouterr().out
    drawn = len(plot.DEFAULT_METRICS) + len(plot.FAMILY_METRICS)
    assert f"wrote {out} ({drawn} metrics, 1 runs)" in printed and "skipped" not in printed
    assert {"hiper/switch_rate", "hiper/mean_segment_length",
            "critic/explained_var/head2"} <= set(plot.FAMILY_METRICS)
