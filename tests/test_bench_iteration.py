"""experiments/benchmarks/bench_iteration.py: its cost formulas, and one tiny iteration end to end (toy env,
2 groups x 2 envs, 3 steps; about 30-40 s on 2 cores, most of it compiling)."""

import importlib
import json

import numpy as np
import pytest

from hgpo_jax.models.config import DecoderConfig



def load_bench():
    return importlib.import_module("experiments.benchmarks.bench_iteration")


CFG = DecoderConfig(vocab_size=100, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1)


def test_cost_formulas_count_by_hand():
    b = load_bench()
    # per layer: q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8x12
    assert b.matmul_weights(CFG) == 2 * (64 + 32 + 32 + 64 + 288)
    assert b.causal_pairs([3, 1]) == 6 + 1
    # 2 x weights x 4 tokens + 4 x 2 layers x 2 heads x 4 head_dim x 7 pairs + head on 2 positions
    assert b.forward_flops(CFG, [3, 1], 2) == 2 * 960 * 4 + 4 * 2 * 2 * 4 * 7 + 2 * 8 * 100 * 2
    assert b.kv_bytes_per_token(CFG, 2) == 2 * 2 * 1 * 4 * 2
    # rows: prompt 5 with 3 tokens (2 decode steps), prompt 2 with 1 token (none)
    flops, nbytes = b.decode_steps(CFG, [5, 2], [3, 1], weight_bytes=1000, kv_itemsize=2)
    kv = b.kv_bytes_per_token(CFG, 2)
    np.testing.assert_allclose(nbytes, [1000 + 6 * kv, 1000 + 7 * kv])
    per_row = 2 * (960 + 8 * 100)
    np.testing.assert_allclose(flops, [per_row + 4 * 2 * 2 * 4 * 6, per_row + 4 * 2 * 2 * 4 * 7])
    assert b.roofline_s([10.0, 1.0], [1.0, 10.0], peak_flops=1.0, peak_bw=2.0) == 10.0 + 5.0
    assert b.pad_prompt([1, 2, 3], 7) == [3, 1, 2, 3, 1, 2, 3]
    assert b.pad_prompt([1, 2, 3], 2) == [1, 2, 3]


def test_one_tiny_iteration_reports_every_phase(tmp_path, capsys):
    b = load_bench()
    out = tmp_path / "table.json"
    res = b.main(["--shape", "tiny", "--model-dir", str(tmp_path / "model"),
                  "--min-prompt-tokens", "200", "--json", str(out),
                  "env.name=toy", "rollout.num_groups=2", "rollout.group_size=2",
                  "env.max_steps=3", "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=512",
                  "train.mini_batch_size=4", "train.micro_batch_size=2", "env.num_workers=1"])
    assert json.loads(out.read_text())["phases"] == res["phases"]
    phases = {p["name"]: p for p in res["phases"]}
    device = ["old log-probs", "ref log-probs", "update (train steps)"]
    device += (["prefill", "decode"] if "prefill" in phases else ["generate (prefill+decode)"])
    for name in ["env reset", "prompts (build + tokenize)", "env steps",
                 "advantages (+ diagnostics)", *device]:
        assert phases[name]["wall"] > 0, name
    for name in device:  # a lower bound: positive, and not far above what was measured
        assert 0 < phases[name]["fraction"] <= 2.0, (name, phases[name])
        assert phases[name]["tokens"] > 0 and phases[name]["work"] > 0
    # the phases add up to the iteration; shares to 1
    assert sum(p["wall"] for p in res["phases"]) == pytest.approx(res["iteration_s"], rel=1e-6)
    # 2 x 2 envs x 3 steps (random replies never finish the toy episodes early... or may win)
    steps = res["metrics"]["rollout/steps"]
    assert 4 <= steps <= 12 and phases["old log-probs"]["tokens"] == phases["ref log-probs"]["tokens"]
    assert res["lengths"]["prompt_tokens"]["min"] >= 200  # the floor was applied
    assert res["lengths"]["response_tokens"]["max"] <= 8
    assert "iteration" in capsys.readouterr().out
