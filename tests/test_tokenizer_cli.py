"""Tokenizer wrapper, the tiny local checkpoint builder and the `hgpo-jax demo` main job."""

import json
import os

import numpy as np
import pytest
from hf_models import hf_logits, load_hf

from hgpo_jax.cli import main
from hgpo_jax.models import load_pretrained, load_tokenizer
from hgpo_jax.models.tiny import TINY_CONFIG, build_tiny_pretrained


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_pretrained(tmp_path_factory.mktemp("tiny") / "model")


def test_tiny_checkpoint_is_a_valid_hf_folder(tiny_dir):
    cfg = json.load(open(os.path.join(tiny_dir, "config.json")))
    assert cfg["vocab_size"] == TINY_CONFIG.vocab_size and cfg["model_type"] == "qwen2"
    tok = load_tokenizer(tiny_dir)
    assert cfg["eos_token_id"] == tok.eos_token_ids[0]
    ids = np.asarray([tok.encode("go to cabinet 1")])
    # transformers loads the same weights and agrees with the Flax model
    np.testing.assert_allclose(np.asarray(load_pretrained(tiny_dir)(ids)),
                               hf_logits(load_hf(tiny_dir), ids), atol=1e-4)


def test_tokenizer_round_trip_and_chat_template(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    text = "You open the fridge 1. <action>take mug 1 from countertop 1</action>"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.chat_prompt([{"role": "system", "content": "be brief"},
                           {"role": "user", "content": "look"}])
    rendered = tok.decode(ids, skip_special_tokens=False)
    assert rendered == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nlook<|im_end|>\n"
                        "<|im_start|>assistant\n")
    im_end = tok.hf.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tok.eos_token_ids and tok.pad_token_id is not None
    assert max(ids) < TINY_CONFIG.vocab_size


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)


def test_demo_main_job_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HGPO_JAX_CACHE", str(tmp_path))
    assert main(["demo", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "building a tiny random Qwen2" in out and "reply" in out and "tokens/s" in out
    assert os.path.isfile(tmp_path / "tiny-qwen2" / "config.json")
    assert main(["demo", "--max-new-tokens", "2", "--prompt", "hi"]) == 0  # reuses the cache
    assert "building" not in capsys.readouterr().out


def test_demo_reports_a_bad_model_folder(tmp_path, capsys):
    assert main(["demo", "--model", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["eval", "tiny_cpu_webshop", "--split", "nosuch"], "env 'webshop' has the splits train, test"),
    (["eval", "tiny_cpu", "--split", "valid_sen"], "has the splits train, valid_seen, valid_unseen"),
    (["eval", "tiny_cpu_webshop", "--split", "test", "--games", "-2"], "--games -2: give a number"),
    (["eval", "tiny_cpu_webshop", "--games", "3"], "add eval.protocol=each-once"),
    (["demo", "--max-new-tokens", "-3"], "--max-new-tokens -3: give at least 1"),
])
def test_bad_cli_input_is_refused_before_anything_loads(argv, message, tmp_path, capsys, monkeypatch):
    """Each error names what was wrong; nothing heavy (the model, the env pool) started first."""
    import hgpo_jax.build as build
    import hgpo_jax.trainers.rl as trainer

    def must_not_run(*a, **k):
        raise AssertionError("started before the arguments were checked")

    monkeypatch.setattr(trainer.Trainer, "__init__", must_not_run)
    monkeypatch.setattr(build, "resolve_model_path", must_not_run)
    assert main([*argv, f"train.run_dir={tmp_path / 'run'}"] if argv[0] == "eval" else argv) == 2
    err = capsys.readouterr().err
    assert f"hgpo-jax {argv[0]}: error:" in err and message in err
    assert not (tmp_path / "run").exists()


def test_export_refuses_a_full_folder_before_loading(tmp_path, capsys, monkeypatch):
    """`export RUN OUT` into a folder that holds files: an error naming --overwrite (the CLI's
    flag), before the run's model is loaded; the folder is left as it was."""
    import hgpo_jax.runs as runs

    run, out = tmp_path / "run", tmp_path / "out"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("name: x\n")
    out.mkdir()
    (out / "keep.txt").write_text("mine")

    def must_not_run(*a, **k):
        raise AssertionError("loaded before the arguments were checked")

    monkeypatch.setattr(runs, "load_model", must_not_run)
    assert main(["export", str(run), str(out)]) == 2
    err = capsys.readouterr().err
    assert "hgpo-jax export: error:" in err and "pass --overwrite" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
