"""experiments/paired.py: goal-by-goal comparison of two `eval --episodes` files, exact values."""

import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import paired  # noqa: E402


def write(path, split, scores, tasks=None):
    tasks = tasks if tasks is not None else list(range(len(scores)))
    with open(path, "w") as f:
        for i, (t, x) in enumerate(zip(tasks, scores)):
            f.write(json.dumps({"split": split, "index": i, "task": t, "task_type": "x", "won": x == 1.0,
                                "score": x, "length": 3, "ended": True}) + "\n")


def test_paired_difference_and_its_standard_error(tmp_path, capsys):
    write(tmp_path / "a.jsonl", "test", [0.2, 0.5, 0.5, 1.0])
    write(tmp_path / "b.jsonl", "test", [0.4, 0.5, 0.2, 1.0, 0.9], tasks=[0, 1, 2, 3, 99])  # goal 99 unmatched
    out = tmp_path / "out.json"
    assert paired.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--json", str(out)]) == 0
    r = json.loads(out.read_text())["paired"][str(tmp_path / "b.jsonl")]["test"]
    d = np.array([0.2, 0.0, -0.3, 0.0])
    assert r["goals"] == 4 and r["base"] == pytest.approx(0.55) and r["other"] == pytest.approx(0.525)
    assert r["diff"] == pytest.approx(-0.025) and r["diff_se"] == pytest.approx(d.std(ddof=1) / 2)
    assert r["ci95"] == pytest.approx([-0.025 - 1.96 * r["diff_se"], -0.025 + 1.96 * r["diff_se"]])
    assert (r["higher"], r["lower"], r["same"]) == (1, 1, 2)
    assert "-0.025 ±" in capsys.readouterr().out


def test_a_file_that_is_not_episodes_says_where(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"split": "test", "task": 1}\n')
    with pytest.raises(SystemExit, match="bad.jsonl:1: not an `hgpo-jax eval --episodes` line"):
        paired.read_episodes(str(bad))


def test_the_webshop_report_adds_the_paired_table(tmp_path):
    from experiments import webshop_laptop

    assert webshop_laptop.paired_section(str(tmp_path)) == ({}, "")  # no episodes folder: nothing added
    (tmp_path / "episodes").mkdir()
    write(tmp_path / "episodes" / "warm_start.jsonl", "test", [0.2, 0.5, 0.5, 1.0])
    assert webshop_laptop.paired_section(str(tmp_path)) == ({}, "")  # the warm start alone: nothing to pair
    write(tmp_path / "episodes" / "hgpo_k2_s0.jsonl", "test", [0.4, 0.5, 0.2, 1.0])
    results, md = webshop_laptop.paired_section(str(tmp_path))
    assert "| hgpo_k2_s0 | 4 | 0.550 | 0.525 | -0.025 ± " in md
    assert list(results) == ["paired"] and results["paired"]["hgpo_k2_s0"]["test"]["diff"] == pytest.approx(-0.025)


def test_search_episodes_are_paired_by_em_not_by_their_zero_score(tmp_path):
    """A search episode's score is 0 whatever its EM: the search study pairs by `won`."""
    from experiments import webshop_laptop

    (tmp_path / "episodes").mkdir()
    for name, won in (("warm_start", [0, 0, 1, 0]), ("gigpo_s0", [1, 0, 1, 1])):
        with open(tmp_path / "episodes" / f"{name}.jsonl", "w") as f:
            for i, w in enumerate(won):
                f.write(json.dumps({"split": "test", "index": i, "task": f"test:{i}", "task_type": "onehop",
                                    "won": bool(w), "score": 0.0, "length": 2, "ended": True}) + "\n")
    by_score, _ = webshop_laptop.paired_section(str(tmp_path))
    assert by_score["paired"]["gigpo_s0"]["test"]["diff"] == 0.0  # what the score alone would say
    results, md = webshop_laptop.paired_section(str(tmp_path), key="won", caption="greedy", unit="question")
    r = results["paired"]["gigpo_s0"]["test"]
    assert (r["base"], r["other"], r["diff"]) == (0.25, 0.75, 0.5)
    assert (r["higher"], r["lower"], r["same"]) == (2, 0, 2)
    assert "(`hgpo-jax eval ... --episodes`, greedy;" in md and "| gigpo_s0 | 4 | 0.250 | 0.750 | +0.500 ± " in md
    assert "Question by question against" in md and "| policy | questions |" in md and "goal" not in md
