"""Benchmarks stay runnable: each runs once on a minimal size (timings are not checked)."""

import importlib


def load_script(name):
    return importlib.import_module(f"experiments.benchmarks.{name}")


def test_bench_model_runs(capsys):
    res = load_script("bench_model").main(["--batch", "1", "--seq", "8", "--repeats", "1"])
    assert res["flax_tok_s"] > 0 and res["torch_tok_s"] > 0 and res["ratio"] > 0
    assert "ratio flax/transformers" in capsys.readouterr().out
