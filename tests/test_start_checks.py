"""The checks before any weights load (hgpo_jax.trainers.checks) and the degenerate settings they
and the config refuse: each error is one line naming the option and the fix, and no check writes
anything (the folders it looks at list the same before and after)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import warnings

import pytest

from hgpo_jax.config import load_config
from hgpo_jax.config_checks import ConfigError
from hgpo_jax.micro_batches import sft_batch_fits
from hgpo_jax.trainers import checks
from hgpo_jax.trainers.checks import (check_attention, check_output_file, check_start,
                                      check_writable_folder, splits_played)
from hf_models import TINY_SHAPES, build_hf_model
from toy_policies import RecordingPool

MAX_POSITIONS = 512  # the test model's max_position_embeddings


@pytest.fixture(scope="module")
def tokenizer():
    from hgpo_jax.models.tiny import train_tiny_tokenizer

    return train_tiny_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny Hugging Face Qwen2 folder: config.json (max_position_embeddings=512), random
    weights, a tokenizer."""
    folder = tmp_path_factory.mktemp("hf-model")
    build_hf_model(dict(TINY_SHAPES["tied_gqa2"], vocab_size=1024,
                        max_position_embeddings=MAX_POSITIONS), folder)
    tokenizer.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """An empty cache folder of this test's own (not created: a check that builds would make it)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("HGPO_JAX_CACHE", str(folder))
    return folder


def listing(*roots) -> list[tuple]:
    """Every file and folder under `roots` with its size and modification time."""
    out = []
    for root in map(str, roots):
        for folder, dirs, files in os.walk(root):
            for name in sorted(dirs + files):
                path = os.path.join(folder, name)
                st = os.stat(path)
                out.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns))
    return sorted(out)


@pytest.fixture
def unchanged(tmp_path, model_dir):
    """`with unchanged():` the test's folder and the model folder list the same after the block."""

    @contextlib.contextmanager
    def watch():
        before = listing(tmp_path, model_dir)
        yield
        assert listing(tmp_path, model_dir) == before

    return watch


def config(model_dir, tmp_path, *overrides, base="tiny_cpu_toy"):
    return load_config(base, [f"model.path={model_dir}", f"train.run_dir={tmp_path / 'run'}",
                              "rollout.max_prompt_tokens=400", "rollout.max_new_tokens=16",
                              *overrides])


def raises(error, *fragments):
    """pytest.raises(error) whose one-line message holds every fragment."""
    return pytest.raises(error, match="^[^\n]*" + "[^\n]*".join(map(re.escape, fragments)) + "[^\n]*$")


# ------------------------------------------------------------------------------------- 1a model
def test_a_good_config_passes_every_kind_and_writes_nothing(model_dir, tmp_path, unchanged):
    cfg = config(model_dir, tmp_path, "eval.every=2")
    with unchanged():
        for kind in ("rl", "sft", "eval"):
            check_start(cfg, kind=kind, run_dir=cfg.run_path())
    assert not os.path.exists(cfg.run_path())
    with raises(ValueError, "check_start(kind='train')", "rl, sft, eval"):
        check_start(cfg, kind="train", run_dir=None)


def test_the_model_folder_needs_config_json_and_tokenizer_files(model_dir, tmp_path, unchanged):
    no_config, no_tokenizer = tmp_path / "no_config", tmp_path / "no_tokenizer"
    no_config.mkdir()
    (no_config / "tokenizer.json").write_text("{}")
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    with unchanged():
        with raises(FileNotFoundError, f"model.path={no_config}", "has no config.json",
                    "Hugging Face model folder"):
            check_start(config(model_dir, tmp_path, f"model.path={no_config}"), kind="rl", run_dir=None)
        with raises(FileNotFoundError, f"model.path={no_tokenizer}", "tokenizer.json",
                    "copy them from the Hugging Face model folder"):
            check_start(config(model_dir, tmp_path, f"model.path={no_tokenizer}"), kind="eval",
                        run_dir=None)
        with raises(FileNotFoundError, "is not a folder", "huggingface-cli download"):
            check_start(config(model_dir, tmp_path, f"model.path={tmp_path / 'nowhere'}"),
                        kind="sft", run_dir=None)


def test_the_longest_row_must_fit_the_models_positions(model_dir, tmp_path, unchanged):
    too_long = config(model_dir, tmp_path, "rollout.max_prompt_tokens=500")
    with unchanged():
        for kind in ("rl", "sft", "eval"):
            with raises(ValueError, "rollout.max_prompt_tokens + rollout.max_new_tokens = 500 + 16 = 516",
                        f"max_position_embeddings={MAX_POSITIONS}", "at most 512"):
                check_start(too_long, kind=kind, run_dir=None)
        check_start(config(model_dir, tmp_path, "rollout.max_prompt_tokens=496"), kind="rl",
                    run_dir=None)


def test_a_run_folder_is_checked_through_its_base_model(model_dir, tmp_path, unchanged):
    base = tmp_path / "base_without_config"
    base.mkdir()
    (base / "tokenizer.json").write_text("{}")
    run = tmp_path / "sft_run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("name: sft_run\n")
    (run / "model_source.json").write_text(json.dumps({"path": str(base), "folder": str(base)}))
    with unchanged(), raises(FileNotFoundError, f"model.path={run} (its base model {base})",
                             "has no config.json"):
        check_start(config(model_dir, tmp_path, f"model.path={run}"), kind="rl", run_dir=None)


def test_models_built_on_first_use_are_not_built_but_checked_once_built(model_dir, tmp_path, cache,
                                                                        unchanged):
    for path in ("tiny", "build:toy-tiny"):
        with unchanged():
            check_start(config(model_dir, tmp_path, f"model.path={path}"), kind="rl", run_dir=None)
        assert not cache.exists()  # nothing built
    built = cache / "tiny-qwen2"  # where model.path=tiny is built
    built.mkdir(parents=True)
    (built / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    (built / "tokenizer.json").write_text("{}")
    with unchanged(), raises(ValueError, "= 416 is beyond the model's max_position_embeddings=128"):
        check_start(config(model_dir, tmp_path, "model.path=tiny"), kind="rl", run_dir=None)


# ------------------------------------------------------------------------------------- 1b attention
def test_attention_must_run_on_the_backend(model_dir, tmp_path, unchanged):
    with unchanged(), raises(ValueError, "model.attention=cudnn", "GPU only", "backend here is cpu",
                             "model.attention=auto", "model.attention=einsum"):
        check_start(config(model_dir, tmp_path, "model.attention=cudnn"), kind="rl", run_dir=None)
    with raises(ValueError, "model.attention=splash", "cannot run on gpu", "model.attention=auto"):
        check_attention("splash", "bfloat16", "gpu")
    with raises(ValueError, "model.attention=cudnn needs 16-bit activations",
                "model.compute_dtype=bfloat16"):
        check_attention("cudnn", "float32", "gpu")
    for ok in (("cudnn", "bfloat16", "gpu"), ("splash", "float32", "cpu"), ("splash", "bfloat16", "tpu"),
               ("auto", "float32", "gpu"), ("einsum", "float32", "cpu")):
        check_attention(*ok)


# ------------------------------------------------------------------------------------- 1c env data
@pytest.mark.parametrize("env", ["alfworld", "webshop"])
def test_env_data_that_is_not_found_is_one_line_naming_env_data_dir(model_dir, tmp_path, unchanged, env):
    empty = tmp_path / "empty_data"
    empty.mkdir()
    splits = {"alfworld": "eval.splits=[valid_seen]", "webshop": "eval.splits=[test]"}[env]
    cfg = config(model_dir, tmp_path, f"env.name={env}", f"env.data_dir={empty}", splits)
    with unchanged(), raises(FileNotFoundError, f"env.name={env} cannot list the tasks of split 'train'",
                             "env.data_dir=/path"):
        check_start(cfg, kind="rl", run_dir=None)


def test_the_splits_each_command_lists(model_dir, tmp_path):
    cfg = config(model_dir, tmp_path, "eval.splits=[valid_unseen,valid_seen]")
    assert splits_played(cfg, "rl") == ["train"]  # eval.every=0: no evaluation during training
    every = config(model_dir, tmp_path, "eval.splits=[valid_unseen,train]", "eval.every=5")
    assert splits_played(every, "rl") == ["train", "valid_unseen"]
    assert splits_played(cfg, "eval") == ["train", "valid_unseen", "valid_seen"]
    assert splits_played(cfg, "eval", ["valid_seen"]) == ["train", "valid_seen"]
    assert splits_played(cfg, "sft") == ["train"]
    turns = tmp_path / "turns.jsonl"
    turns.write_text("")
    assert splits_played(config(model_dir, tmp_path, f"sft.data={turns}"), "sft") == []


# ------------------------------------------------------------------------------------- 1d sft data
def test_sft_data_file_must_exist_and_be_a_file(model_dir, tmp_path, unchanged):
    folder = tmp_path / "turns.jsonl"
    folder.mkdir()
    with unchanged():
        with raises(FileNotFoundError, f"sft.data={tmp_path / 'missing.jsonl'} is no existing JSONL file",
                    "sft.data=expert"):
            check_start(config(model_dir, tmp_path, f"sft.data={tmp_path / 'missing.jsonl'}"),
                        kind="sft", run_dir=None)
        with raises(ValueError, f"sft.data={folder} is a folder, not a JSONL file"):
            check_start(config(model_dir, tmp_path, f"sft.data={folder}"), kind="sft", run_dir=None)


def test_sft_episode_kinds_must_be_ones_the_env_records(model_dir, tmp_path, unchanged, monkeypatch):
    from hgpo_jax.envs import registry

    assert registry.get_env("toy").episode_kinds == ("expert", "random")
    assert registry.get_env("alfworld").episode_kinds == ("expert", "search")
    assert registry.get_env("webshop").episode_kinds == ("expert", "search", "first")
    with unchanged():
        with raises(ValueError, "sft.data=expert+search:5: env 'toy' records no 'search' episodes",
                    "use expert, random"):
            check_start(config(model_dir, tmp_path, "sft.data=expert+search:5"), kind="sft", run_dir=None)
        check_start(config(model_dir, tmp_path, "sft.data=expert+random:5"), kind="sft", run_dir=None)
        spec = registry.get_env("toy")
        monkeypatch.setitem(registry._specs(), "toy", dataclasses.replace(spec, record_episodes=None))
        with raises(ValueError, "env 'toy' records no episodes", "JSONL file"):
            check_start(config(model_dir, tmp_path), kind="sft", run_dir=None)


# ------------------------------------------------------------------------------------- 1e outputs
def test_the_run_folder_must_be_creatable_and_writable(tmp_path, unchanged, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with unchanged():
        with raises(ValueError, f"train.run_dir={afile / 'run'} lies under the file {afile}",
                    "choose another folder"):
            check_writable_folder(str(afile / "run"))
        with raises(ValueError, f"train.run_dir={afile} is a file; choose a folder"):
            check_writable_folder(str(afile))
        long = tmp_path / "runs" / ("r" * 300) / "x"
        with raises(ValueError, "'rrrrrrrrrrrrrrrrrrrrrrrr'... is 300 bytes, beyond the 255",
                    "choose a shorter name"):
            check_writable_folder(str(long))
        check_writable_folder(str(tmp_path / "new" / "run"))  # made later, by the run
        locked = str(tmp_path)
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: p != locked and real_access(p, mode))
        with raises(ValueError, f"train.run_dir={tmp_path / 'run'}: {locked} is not writable",
                    "choose a folder you can write in"):
            check_start(load_config("tiny_cpu_toy", ["model.path=tiny"]), kind="rl",
                        run_dir=str(tmp_path / "run"))


def test_an_output_file_must_not_be_a_folder_and_its_folder_writable(tmp_path, unchanged):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with unchanged():
        with raises(ValueError, f"--episodes {tmp_path} is a folder", "episodes.jsonl"):
            check_output_file(str(tmp_path), "--episodes")
        with raises(ValueError, f"--episodes {afile / 'out.jsonl'} lies under the file {afile}"):
            check_output_file(str(afile / "out.jsonl"), "--episodes")
        with raises(ValueError, "--episodes", "beyond the 255"):
            check_output_file(str(tmp_path / ("e" * 256 + ".jsonl")), "--episodes")
        check_output_file(str(afile), "--episodes")  # an existing file is replaced
        check_output_file(str(tmp_path / "new" / "episodes.jsonl"), "--episodes")


# ------------------------------------------------------------------------------------- 2a eval.splits
def test_an_empty_eval_splits_is_refused_with_the_envs_splits():
    with pytest.raises(ConfigError, match=re.escape(
            "eval.splits=[] is empty: name the splits to evaluate, e.g. eval.splits=[valid_seen,"
            "valid_unseen] (env 'alfworld' has the splits train, valid_seen, valid_unseen, valid_train)")):
        load_config(None, ["eval.splits=[]"])
    with pytest.raises(ConfigError, match=re.escape("e.g. eval.splits=[test] (env 'webshop' has the "
                                                    "splits train, test)")):
        load_config(None, ["env.name=webshop", "eval.splits=[]"])


# ------------------------------------------------------------------------------------- 2b held-out
def test_a_heldout_part_that_rounds_to_nothing_is_refused_before_loading(model_dir, tmp_path, unchanged):
    turns = tmp_path / "turns.jsonl"
    turns.write_text("".join(json.dumps({"prompt": f"p{i}", "response": "r"}) + "\n" for i in range(3)))
    with unchanged():
        with raises(ValueError, "sft.heldout=0.1 of 3 episodes holds out none (round(0.1 x 3) = 0)",
                    "a larger sft.episodes", "a larger sft.heldout (above 0.167)",
                    "sft.heldout=0 to train without a held-out loss"):
            check_start(config(model_dir, tmp_path, "sft.episodes=3"), kind="sft", run_dir=None)
        with raises(ValueError, f"sft.heldout=0.1 of 3 turns in {turns} holds out none",
                    "add turns to the JSONL file", "sft.heldout=0"):
            check_start(config(model_dir, tmp_path, f"sft.data={turns}"), kind="sft", run_dir=None)
        with raises(ValueError, "sft.heldout=0.6 of 1 episodes holds out all of them",
                    "lower sft.heldout"):
            check_start(config(model_dir, tmp_path, "sft.episodes=1", "sft.heldout=0.6"), kind="sft",
                        run_dir=None)
        for ok in (["sft.episodes=3", "sft.heldout=0"], ["sft.episodes=5", "sft.heldout=0.2"]):
            check_start(config(model_dir, tmp_path, *ok), kind="sft", run_dir=None)


def test_build_samples_refuses_an_empty_heldout_part_and_allows_none(model_dir, tmp_path, tokenizer):
    from hgpo_jax.trainers.sft import build_samples

    with raises(ValueError, "sft.heldout=0.1 of 3 episodes recorded holds out none", "sft.heldout=0"):
        build_samples(config(model_dir, tmp_path, "sft.episodes=3"), tokenizer)
    train, held, info = build_samples(config(model_dir, tmp_path, "sft.episodes=3", "sft.heldout=0"),
                                      tokenizer)
    assert held == [] and len(train) == info["train_turns"] > 0 and info["heldout_episodes"] == 0


def test_sft_without_heldout_logs_no_heldout_loss(model_dir, tmp_path, capsys):
    from hgpo_jax.metrics import read_metrics
    from hgpo_jax.trainers.sft import SftTrainer

    cfg = config(model_dir, tmp_path, "sft.heldout=0", "sft.episodes=4", "sft.steps=2",
                 "sft.batch_size=4", "sft.eval_every=1", "model.compute_dtype=float32",
                 base="toy_format")
    with SftTrainer(cfg, progress=False) as trainer:
        assert not trainer.has_heldout
        history = trainer.train()
    assert len(history) == 2 and all("heldout/nll" not in m for m in history)
    records = read_metrics(cfg.run_path())
    assert records and all("heldout/nll" not in r for r in records)
    assert "nan" not in capsys.readouterr().out.lower()


# ------------------------------------------------------------------------------------- 2c sft.batch_size
def test_sft_batch_size_must_split_into_micro_batches_of_at_least_half():
    with pytest.raises(ConfigError, match=re.escape(
            "sft.batch_size=7 runs in micro-batches of 1 row(s) only (its largest divisor <= "
            "train.micro_batch_size=4), under half of min(sft.batch_size, train.micro_batch_size) "
            "= 4; set sft.batch_size=6 or 8")):
        load_config("toy_format", ["sft.batch_size=7", "train.micro_batch_size=4"])
    with pytest.raises(ConfigError, match=re.escape("set sft.batch_size=10 or 12")):
        load_config("toy_format", ["sft.batch_size=11", "train.micro_batch_size=8"])
    for ok in ("6", "3", "8", "12"):  # 3-row, whole and 4-row micro-batches
        load_config("toy_format", [f"sft.batch_size={ok}", "train.micro_batch_size=4"])
    assert [n for n in range(1, 17) if not sft_batch_fits(n, 4)] == [5, 7, 11, 13]  # 9, 15: 3 rows
    assert sft_batch_fits(10, 8) and sft_batch_fits(14, 8) and not sft_batch_fits(13, 8)


# ------------------------------------------------------------------------------------- 2d prompts
def test_cut_prompts_are_counted_and_warned_about_once(tokenizer, monkeypatch):
    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.rl import policy as policy_module
    from hgpo_jax.rl.policy import encode_prompt, encode_prompt_with_length
    from hgpo_jax.rl.rollout import collect_rollouts, summary_metrics
    from toy_policies import ScriptedToyPolicy

    monkeypatch.setattr(policy_module, "_warned_prompt_cut", False)
    spec = get_env("toy")

    def run(max_prompt_tokens):
        policy = ScriptedToyPolicy(None, tokenizer, max_prompt_tokens=max_prompt_tokens,
                                   pick_door=lambda doors: doors[0] if doors else "red")
        batch = collect_rollouts(policy, RecordingPool(2, 3), [0], group_size=2, max_steps=3, spec=spec)
        return batch, policy

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        full, policy = run(4096)
        assert full.metrics()["rollout/truncated_prompt_rate"] == 0.0 and not caught
        assert full.prompts == policy.prompt_cuts.prompts == len(full) and full.prompts_cut == 0
        first = len(full.prompt_ids[0])  # the first prompt of the cut run: its longest when it warns
        cut, _ = run(16)
        cut_again, _ = run(16)
    assert cut.metrics()["rollout/truncated_prompt_rate"] == 1.0 and cut.prompts_cut == cut.prompts > 0
    assert cut_again.metrics()["rollout/truncated_prompt_rate"] == 1.0
    assert all(len(p) == 16 for p in cut.prompt_ids)
    assert len(caught) == 1  # once per process
    message = str(caught[0].message)
    assert "\n" not in message and "rollout.max_prompt_tokens=16 cut the start of a prompt" in message
    assert f"the longest prompt so far has {first} tokens" in message
    assert f"raise rollout.max_prompt_tokens to at least {first}" in message
    # merged over processes: cut prompts / prompts of all of them
    parts = [dict(full.summary(), prompts=4, prompts_cut=1), dict(full.summary(), prompts=6, prompts_cut=2)]
    assert summary_metrics(parts)["rollout/truncated_prompt_rate"] == pytest.approx(0.3)
    # the module function keeps its signature and behaviour, and does not warn
    text = "a long prompt " * 40
    assert encode_prompt(tokenizer, text, 8) == encode_prompt_with_length(tokenizer, text, 8)[0]
    assert len(encode_prompt(tokenizer, text, 8)) == 8 < encode_prompt_with_length(tokenizer, text, 8)[1]


# ------------------------------------------------------------------------------------- 2e coordinator
def test_a_coordinator_must_be_host_colon_port(monkeypatch, tmp_path, unchanged):
    import jax

    from hgpo_jax.distributed import DistributedArgs, check_coordinator, init_distributed

    called = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: called.append(a))
    with unchanged():
        with pytest.raises(ValueError, match=re.escape(
                "--coordinator 'notaport': give HOST:PORT (e.g. 10.0.0.1:1234)")):
            init_distributed(DistributedArgs("notaport", 2, 0))
        for bad in ("host:", ":1234", "host:12ab"):
            with raises(ValueError, f"--coordinator {bad!r}: give HOST:PORT"):
                init_distributed(DistributedArgs(bad, 2, 0))
        for bad in ("host:0", "host:65536"):
            with raises(ValueError, f"--coordinator {bad!r}: port", "outside 1..65535"):
                init_distributed(DistributedArgs(bad, 2, 0))
    assert called == []
    assert check_coordinator("10.0.0.1:1234") == ("10.0.0.1", 1234)
    assert check_coordinator("node-0.cluster:65535") == ("node-0.cluster", 65535)
