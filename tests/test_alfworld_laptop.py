"""experiments/alfworld_laptop.py end to end with tiny settings: every stage through the CLI (two
train games' walkthrough and searching episodes, a tiny model, one RL iteration of one estimator, one game per eval
split), the report and the resume/status behaviour. Nothing here needs the real experiment."""

import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import alfworld_laptop, laptop  # noqa: E402

TINY = ["--in-process", "--games", "2", "--search-games", "2", "--workers", "1", "--devices", "1", "--seeds", "0", "--estimators", "hgpo_k2",
        "--set-sft", "model.path=tiny", "sft.steps=2", "sft.batch_size=4", "train.micro_batch_size=2",
        "sft.heldout=0.5", "sft.eval_every=2", "sft.save_every=2", "rollout.max_prompt_tokens=512",
        "--set-rl", "train.iterations=1", "rollout.num_groups=1", "rollout.group_size=2",
        "env.max_steps=2", "env.num_workers=1", "train.mini_batch_size=4", "train.micro_batch_size=2",
        "--set-eval", "eval.games=1", "env.max_steps=2", "env.num_workers=1"]


def test_every_stage_runs_and_reports_with_tiny_settings(tmp_path, capsys, monkeypatch):
    # a cache of its own: episode files left by an earlier run would mark stage experts finished
    monkeypatch.setenv("HGPO_JAX_CACHE", str(tmp_path / "cache"))
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["--out", str(out), "--runs", str(runs), *TINY]
    assert alfworld_laptop.main(args) == 0
    state = json.loads((out / "state.json").read_text())
    assert list(state["done"]) == list(laptop.STAGES)
    experts = state["done"]["experts"]["result"]
    assert experts["expert"]["episodes"] == 2 and 1 <= experts["search"]["episodes"] <= 2
    assert any(c.startswith("hgpo-jax sft alfworld_laptop_sft") and "sft.data=expert+search:2" in c
               for c in state["commands"])
    assert any(c.startswith("hgpo-jax train alfworld_laptop_rl") and "algo.K=2" in c
               for c in state["commands"])

    took = state["rl_runs"]["hgpo_k2_s0"]  # the run's wall times survive the state merges
    assert took["seconds"] > 0 and took["eval_seconds"] > 0
    results = json.loads((out / "results.json").read_text())
    warm, = results["table1"]["warm start (SFT)"]
    rl, = results["table1"]["hgpo_k2"]
    for evals in (warm, rl):  # both splits, overall, each a success rate
        assert {"valid_seen/all", "valid_unseen/all"} <= set(evals)
        assert all(0.0 <= v <= 1.0 for v in evals.values())
    assert any(k.startswith("hierarchy/") for k in results["table5"]["hgpo_k2_s0"])
    table = (out / "results.md").read_text()
    assert "| warm start (SFT) |" in table and "| hgpo_k2 |" in table
    run_row, = [line for line in table.splitlines() if line.startswith("| hgpo_k2_s0 |")]
    assert run_row.count("|") == table.splitlines()[table.splitlines().index(run_row) - 2].count("|")
    assert " -> " in run_row  # rollout success over the first and last iterations
    assert (out / "dynamics.png").stat().st_size > 0

    # what later stages need is kept in OUT: the warm start (a transformers folder) and the logs
    warm = out / laptop.WARM_START
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(warm))
    assert {"sft", "eval_warm", "rl_hgpo_k2_s0"} <= set(os.listdir(out / laptop.LOGS))
    assert any("model.path=" + str(warm) in c for c in state["commands"] if c.startswith("hgpo-jax train"))

    # on a fresh machine (no run folders), a second call finds every stage done and only remakes
    # the report from what OUT keeps; --status lists the stages as done
    shutil.rmtree(runs)
    (out / "results.md").unlink()
    capsys.readouterr()
    assert alfworld_laptop.main(args) == 0
    assert "hgpo-jax" not in capsys.readouterr().out
    assert (out / "results.md").read_text() == table
    assert alfworld_laptop.main([*args, "--status"]) == 0  # the same estimators x seeds
    status = capsys.readouterr().out
    assert all(f"{stage:>10}: done" in status for stage in laptop.STAGES[:-1])


def test_two_processes_saving_state_keep_each_others_records(tmp_path):
    """Stages may run at once in two processes (a recording beside an SFT): each save merges
    into what is on disk instead of overwriting it."""
    first, second = laptop.load_state(str(tmp_path)), laptop.load_state(str(tmp_path))
    first["done"]["experts"] = {"seconds": 1.0}
    first["commands"].append("hgpo-jax sft x")
    laptop.save_state(str(tmp_path), first)
    done = second["done"]  # a reference held across a save (as a stage holds its records)
    laptop.save_state(str(tmp_path), second)
    done["sft"] = {"seconds": 2.0}
    second["commands"].append("hgpo-jax eval y")
    laptop.save_state(str(tmp_path), second)
    state = laptop.load_state(str(tmp_path))
    assert state["done"] == {"experts": {"seconds": 1.0}, "sft": {"seconds": 2.0}}
    assert state["commands"] == ["hgpo-jax sft x", "hgpo-jax eval y"]


def test_a_process_saving_state_keeps_records_another_process_rewrote(tmp_path):
    """Three seeds' runs resumed at once, each process holding the state as it was when it
    started: each save keeps the others' new records instead of writing back its stale copies."""
    out = str(tmp_path)
    start = laptop.load_state(out)
    start["rl_runs"] = {f"s{i}": {"seconds": 30.0} for i in range(3)}
    laptop.save_state(out, start)
    procs = [laptop.load_state(out) for _ in range(3)]
    for i, state in enumerate(procs):
        state["rl_runs"][f"s{i}"] = {"seconds": 10.0 + i}
        laptop.save_state(out, state)
    assert laptop.load_state(out)["rl_runs"] == {f"s{i}": {"seconds": 10.0 + i} for i in range(3)}
    assert procs[0]["rl_runs"]["s2"] == {"seconds": 30.0}  # refreshed at its next save only
    laptop.save_state(out, procs[0])
    assert procs[0]["rl_runs"]["s2"] == {"seconds": 12.0}


def test_a_kept_log_of_a_resumed_run_holds_every_iteration_and_its_last_evaluation(tmp_path):
    """A run evaluated after iteration 2, then resumed to 4 and evaluated again: the kept log
    holds iterations 1-4 and the evaluation at 4; the one at 2 would read as a rewind there."""
    from hgpo_jax.metrics import read_metrics

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("name: x\n")
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "eval/test/all": s / 10}) + "\n" for s in (1, 2, 3, 4)))
    (run / "eval" / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "eval/test/all": 0.25}) + "\n"
        + json.dumps({"step": 4, "eval/test/all": 0.45, "eval/test/episodes": 96}) + "\n")
    kept = laptop.keep_log(str(run), str(tmp_path / "out"), "rl_x")
    records = read_metrics(kept)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["eval/test/all"] for r in records] == [0.1, 0.2, 0.3, 0.45]
    assert records[-1]["eval/test/episodes"] == 96
    assert (tmp_path / "out" / laptop.LOGS / "rl_x" / "config.yaml").read_text() == "name: x\n"
    (run / "metrics.jsonl").unlink()  # an evaluation of a model, no training: all of it kept
    assert [r["step"] for r in read_metrics(laptop.keep_log(str(run), str(tmp_path / "out"), "e"))] == [2, 4]


def test_stages_are_finished_by_what_out_keeps(tmp_path, monkeypatch):
    """A stage is finished when OUT keeps its outputs, whatever state.json says (its records may
    come from another machine); a sitting on some RL runs leaves the others to do; the report is
    always made."""
    from argparse import Namespace

    out = str(tmp_path)
    state = {"done": {s: {"seconds": 1.0} for s in laptop.STAGES}, "commands": []}
    one = Namespace(stage=None, out=out, estimators=["hgpo_k2"], seeds=[0], games=2, search_games=0)
    every = Namespace(**{**vars(one), "estimators": list(laptop.ESTIMATORS), "seeds": [0, 1]})
    cache = tmp_path / "expert.jsonl"
    monkeypatch.setattr(alfworld_laptop, "expert_caches", lambda args: [str(cache)])
    # recorded done, but nothing kept (a fresh machine, an empty cache): all to do
    assert alfworld_laptop.stages_to_run(one, state) == list(laptop.STAGES)
    cache.write_text("")
    assert alfworld_laptop.stages_to_run(one, state) == ["sft", "eval_warm", "rl", "report"]
    cache.unlink()

    warm = tmp_path / laptop.WARM_START
    warm.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (warm / f).write_text("x")
    for name in ("eval_warm", "rl_hgpo_k2_s0"):
        os.makedirs(laptop.kept_log(out, name))
        (tmp_path / laptop.LOGS / name / "metrics.jsonl").write_text("")
    # the warm start kept: no expert episodes needed, whatever the cache holds
    assert alfworld_laptop.finished("experts", one, state) and alfworld_laptop.finished("sft", one, state)
    assert alfworld_laptop.finished("rl", one, state) and not alfworld_laptop.finished("rl", every, state)
    assert alfworld_laptop.stages_to_run(one, state) == ["report"]
    assert alfworld_laptop.stages_to_run(every, state) == ["rl", "report"]
    assert alfworld_laptop.stages_to_run(Namespace(stage="sft"), state) == ["sft"]
    (warm / "model.safetensors").unlink()  # a half-kept warm start is not one
    assert not alfworld_laptop.finished("sft", one, state)


def test_keep_log_refuses_a_run_without_metrics(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        laptop.keep_log(str(tmp_path / "run"), str(tmp_path / "out"), "x")


def test_a_trained_run_whose_evaluation_was_cut_short_is_only_evaluated(tmp_path, monkeypatch):
    """A run that has done the iterations asked but was stopped during its evaluation is not
    trained again (the trainer would refuse: nothing to resume), only evaluated and kept; one
    stopped before its last iteration is resumed, and so is a finished one asked for more."""
    from argparse import Namespace

    runs = tmp_path / "runs"
    for seed, step in ((0, 3), (1, 2)):  # seed 0 trained to the end (3 iterations), seed 1 not
        run = runs / f"rl_grpo_s{seed}"
        os.makedirs(run / "checkpoints" / str(step))
        (run / "metrics.jsonl").write_text("")
    called = []

    def fake_cli(args, argv, state):  # training saves the checkpoint of the last iteration asked
        called.append(argv[:2])
        if argv[0] == "train":
            run = [a.split("=", 1)[1] for a in argv if a.startswith("train.run_dir=")][0]
            asked = [a for a in argv if a.startswith("train.iterations=")]
            os.makedirs(os.path.join(run, "checkpoints", asked[-1].split("=")[1] if asked else "3"))
        return 1.0

    monkeypatch.setattr(laptop, "run_cli", fake_cli)
    study = alfworld_laptop.STUDY
    args = Namespace(out=str(tmp_path / "out"), runs=str(runs), devices=1, estimators=["grpo"],
                     seeds=[0, 1], set_rl=["train.iterations=3"], set_eval=[])
    state = {"done": {}, "commands": []}
    assert laptop.stage_rl(study, args, state)["runs"] == ["grpo_s0", "grpo_s1"]
    s0, s1 = (str(runs / f"rl_grpo_s{s}") for s in (0, 1))
    assert called == [["eval", s0], ["train", study.rl_config], ["eval", s1]]
    assert "seconds" not in state["rl_runs"]["grpo_s0"] and state["rl_runs"]["grpo_s1"]["seconds"] == 1.0

    called.clear()  # the same runs, asked for 4 iterations (a fresh OUT: nothing kept there)
    more = Namespace(**{**vars(args), "out": str(tmp_path / "out4"), "seeds": [0],
                        "set_rl": ["train.iterations=4"]})
    laptop.stage_rl(study, more, {"done": {}, "commands": []})
    assert called == [["train", study.rl_config], ["eval", s0]]
