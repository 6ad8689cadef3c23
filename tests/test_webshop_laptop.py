"""experiments/webshop_laptop.py end to end with tiny settings: every stage through the CLI (the
shopper scored, a tiny model warm-started on 4 goals' episodes, one RL iteration of one estimator
whose final policy is kept, 2 test goals per eval), the report, and a second call that only
remakes the report. Nothing here needs the real experiment."""

import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import laptop, webshop_laptop  # noqa: E402

TINY = ["--in-process", "--episodes", "4", "--copy-goals", "3", "--devices", "1", "--seeds", "0", "--estimators", "hgpo_k2",
        "--set-sft", "model.path=tiny", "sft.steps=2", "sft.batch_size=4", "train.micro_batch_size=2",
        "sft.episodes=4", "sft.heldout=0.5", "sft.eval_every=2", "sft.save_every=2", "rollout.max_prompt_tokens=512",
        "rollout.max_new_tokens=16",
        "--set-rl", "train.iterations=1", "rollout.num_groups=1", "rollout.group_size=2",
        "env.max_steps=2", "env.num_workers=1", "train.mini_batch_size=4", "train.micro_batch_size=2",
        "--set-eval", "eval.games=2", "env.max_steps=2", "env.num_workers=1"]


def test_every_stage_runs_and_reports_with_tiny_settings(tmp_path, capsys):
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["--out", str(out), "--runs", str(runs), *TINY]
    assert webshop_laptop.main(args) == 0
    state = json.loads((out / "state.json").read_text())
    assert list(state["done"]) == list(laptop.STAGES)
    experts = json.loads((out / webshop_laptop.EXPERTS).read_text())
    assert experts["test"]["episodes"] == 500 and experts["train"]["episodes"] == 4
    assert 0.3 < experts["test"]["score"] < 0.8 and 0.0 < experts["test"]["success"] < 1.0
    assert experts["first"]["test"]["score"] > experts["test"]["score"]  # the third round's expert
    assert any("sft.data=first" in c for c in state["commands"])  # every SFT round ran
    copy_round, = [c for c in state["commands"] if "copy_mix.jsonl" in c]
    assert "train.seed=3" in copy_round
    turns = [json.loads(line) for line in (runs / "copy_mix.jsonl").read_text().splitlines()]
    copies = [t for t in turns if t["prompt"].startswith(webshop_laptop.COPY_PROMPT)]
    assert 0 < len(copies) == len(turns) - len(copies)  # as many copy turns as shopper turns
    assert all(t["prompt"] == webshop_laptop.COPY_PROMPT + t["response"] for t in copies)
    assert any(c.startswith("hgpo-jax sft webshop_laptop_sft") and "sft.episodes=4" in c
               for c in state["commands"])
    assert any(c.startswith("hgpo-jax train webshop_laptop_rl") and "algo.K=2" in c
               for c in state["commands"])

    results = json.loads((out / "results.json").read_text())
    table1 = results["table1"]
    assert table1["instruction shopper (the SFT's expert)"] == [experts["test"]]
    assert table1["first-result shopper (the third SFT round's expert)"] == [experts["first"]["test"]]
    for name in ("warm start (SFT)", "hgpo_k2"):
        evals, = table1[name]
        assert 0.0 <= evals["score"] <= 1.0 and 0.0 <= evals["success"] <= 1.0
    assert any(k.startswith("hierarchy/") for k in results["table5"]["hgpo_k2_s0"])
    table = (out / "results.md").read_text()
    assert "| method | score | success (%) |" in table and "| hgpo_k2 |" in table
    run_row, paired_row = [line for line in table.splitlines() if line.startswith("| hgpo_k2_s0 |")]
    assert run_row.count(" -> ") == 3  # score, success and invalid rate, first vs last iterations
    assert (out / "dynamics.png").stat().st_size > 0
    # every evaluation kept its episodes, and the report compares them goal by goal
    warm, run = (out / laptop.EPISODES / f"{n}.jsonl" for n in (laptop.WARM_START, "hgpo_k2_s0"))
    assert len(warm.read_text().splitlines()) == len(run.read_text().splitlines()) == 2  # eval.games=2
    (paired,) = results["paired"]["hgpo_k2_s0"].values()
    assert paired["goals"] == 2 and paired["higher"] + paired["lower"] + paired["same"] == 2
    assert "Goal by goal against the warm start" in table and paired_row.startswith("| hgpo_k2_s0 | 2 |")

    # kept: the warm start and the RL run's final policy as transformers folders, every log
    for folder in (out / laptop.WARM_START, out / "hgpo_k2_s0"):
        assert laptop.is_model_folder(str(folder))
    assert {"sft", "eval_warm", "rl_hgpo_k2_s0"} <= set(os.listdir(out / laptop.LOGS))
    assert (out / laptop.LOGS / "rl_hgpo_k2_s0" / "config.yaml").is_file()

    # a fresh machine: every stage is done, the report is remade from OUT alone
    shutil.rmtree(runs)
    (out / "results.md").unlink()
    capsys.readouterr()
    assert webshop_laptop.main(args) == 0
    assert "hgpo-jax" not in capsys.readouterr().out
    assert (out / "results.md").read_text() == table
    # a run whose policy was not kept is not done
    shutil.rmtree(out / "hgpo_k2_s0")
    parsed = laptop.parse_args(webshop_laptop.STUDY, webshop_laptop.__doc__, args)
    assert laptop.stages_to_run(webshop_laptop.STUDY, parsed, state) == ["rl", "report"]
