"""experiments/alfworld_laptop.py end to end with tiny settings: every stage through the CLI (two
train games' walkthrough and searching episodes, a tiny model, one RL iteration of one estimator, one game per eval
split), the report and the resume/status behaviour. Nothing here needs the real experiment."""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import alfworld_laptop  # noqa: E402

TINY = ["--games", "2", "--search-games", "2", "--workers", "1", "--devices", "1", "--seeds", "0", "--estimators", "hgpo_k2",
        "--set-sft", "model.path=tiny", "sft.steps=2", "sft.batch_size=4", "train.micro_batch_size=2",
        "sft.heldout=0.5", "sft.eval_every=2", "sft.save_every=2", "rollout.max_prompt_tokens=512",
        "--set-rl", "train.iterations=1", "rollout.num_groups=1", "rollout.group_size=2",
        "env.max_steps=2", "env.num_workers=1", "train.mini_batch_size=4", "train.micro_batch_size=2",
        "--set-eval", "eval.games=1", "env.max_steps=2", "env.num_workers=1"]


def test_every_stage_runs_and_reports_with_tiny_settings(tmp_path, capsys):
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["--out", str(out), "--runs", str(runs), *TINY]
    assert alfworld_laptop.main(args) == 0
    state = json.loads((out / "state.json").read_text())
    assert list(state["done"]) == list(alfworld_laptop.STAGES)
    experts = state["done"]["experts"]["result"]
    assert experts["expert"]["episodes"] == 2 and 1 <= experts["search"]["episodes"] <= 2
    assert any(c.startswith("hgpo-jax sft alfworld_laptop_sft") and "sft.data=expert+search:2" in c
               for c in state["commands"])
    assert any(c.startswith("hgpo-jax train alfworld_laptop_rl") and "algo.K=2" in c
               for c in state["commands"])

    results = json.loads((out / "results.json").read_text())
    warm, = results["table1"]["warm start (SFT)"]
    rl, = results["table1"]["hgpo_k2"]
    for evals in (warm, rl):  # both splits, overall, each a success rate
        assert {"valid_seen/all", "valid_unseen/all"} <= set(evals)
        assert all(0.0 <= v <= 1.0 for v in evals.values())
    assert any(k.startswith("hierarchy/") for k in results["table5"]["hgpo_k2_s0"])
    table = (out / "results.md").read_text()
    assert "| warm start (SFT) |" in table and "| hgpo_k2 |" in table
    assert (out / "dynamics.png").stat().st_size > 0

    # a second call finds every stage done and runs nothing; --status lists them with wall times
    capsys.readouterr()
    assert alfworld_laptop.main(args) == 0
    assert "hgpo-jax" not in capsys.readouterr().out
    assert alfworld_laptop.main([*args, "--status"]) == 0  # the same estimators x seeds
    status = capsys.readouterr().out
    assert all(f"{stage:>10}: done in" in status for stage in alfworld_laptop.STAGES)


def test_two_processes_saving_state_keep_each_others_records(tmp_path):
    """Stages may run at once in two processes (a recording beside an SFT): each save merges
    into what is on disk instead of overwriting it."""
    first, second = alfworld_laptop.load_state(str(tmp_path)), alfworld_laptop.load_state(str(tmp_path))
    first["done"]["experts"] = {"seconds": 1.0}
    first["commands"].append("hgpo-jax sft x")
    alfworld_laptop.save_state(str(tmp_path), first)
    second["done"]["sft"] = {"seconds": 2.0}
    second["commands"].append("hgpo-jax eval y")
    alfworld_laptop.save_state(str(tmp_path), second)
    state = alfworld_laptop.load_state(str(tmp_path))
    assert state["done"] == {"experts": {"seconds": 1.0}, "sft": {"seconds": 2.0}}
    assert state["commands"] == ["hgpo-jax sft x", "hgpo-jax eval y"]


def test_a_sitting_on_some_rl_runs_leaves_the_others_to_do():
    """`--stage rl --estimators hgpo_k2 --seeds 0` records the stage done; a later plain call
    still runs the RL runs it did not do, then their evaluation; the report is always made."""
    from argparse import Namespace

    done = {s: {"seconds": 1.0} for s in alfworld_laptop.STAGES if s != "sft"}
    state = {"done": done, "rl_runs": {"hgpo_k2_s0": {}}, "rl_evals": {"hgpo_k2_s0": {}}}
    one = Namespace(stage=None, estimators=["hgpo_k2"], seeds=[0])
    every = Namespace(stage=None, estimators=list(alfworld_laptop.ESTIMATORS), seeds=[0, 1])
    assert alfworld_laptop.finished("rl", one, state) and alfworld_laptop.finished("eval_rl", one, state)
    assert not alfworld_laptop.finished("rl", every, state)
    assert not alfworld_laptop.finished("eval_rl", every, state)
    assert not alfworld_laptop.finished("sft", one, state)  # never recorded done
    assert alfworld_laptop.stages_to_run(one, state) == ["sft", "report"]
    assert alfworld_laptop.stages_to_run(every, state) == ["sft", "rl", "eval_rl", "report"]
    state["done"]["sft"] = {"seconds": 1.0}
    assert alfworld_laptop.finished("sft", every, state)
    assert alfworld_laptop.stages_to_run(one, state) == ["report"]  # the report is always made
    assert alfworld_laptop.stages_to_run(Namespace(stage="sft"), state) == ["sft"]
