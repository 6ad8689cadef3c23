"""experiments/gpu_check.py on a CPU with `--smoke` (tiny shapes): every part's code in this
process with its sections assembled and tabled, the check end to end with one part in a child
process, the report's assembly and table for parts that failed or timed out, the budget's skips
and the kill of a part past its timeout. Structure only: nothing is timed."""

import importlib.util
import json
import os
import subprocess
import sys

EXPERIMENTS = os.path.join(os.path.dirname(__file__), "..", "experiments")
SCRIPT = os.path.join(EXPERIMENTS, "gpu_check.py")
FAMILIES = [("group", "hgpo_k2"), ("critic", "ppo"), ("hierarchical", "hiper")]


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_every_section(tmp_path):
    """Every part's own code, in this process (`run_part_here`: the tiny shapes cost seconds, a
    fresh interpreter per part as much again), its sections assembled and tabled as `main` does;
    then the check itself end to end (`test_the_check_runs_its_parts_in_child_processes`)."""
    gc = load_check()
    args = gc.parse_args(["--smoke", "--model-dir", str(tmp_path / "model")])
    spec = gc.settings(args)
    records = {name: gc.run_part_here(name, spec) for name in gc.PART_ORDER}
    report = gc.assemble(gc.run_meta(args, ["--smoke"], list(gc.PART_ORDER), spec), records)
    out = tmp_path / "check.json"
    gc.write_report(str(out), report)
    report = json.loads(out.read_text())
    for key in ("device", "versions", "started", "parts", "parity", "plan", "iterations",
                "decode"):
        assert key in report, key
    assert report["smoke"] and report["device"]["backend"] == "cpu" and report["versions"]["jax"]
    assert [p["status"] for p in report["parts"]] == ["ok"] * 7, report["parts"]

    parity = report["parity"]
    assert parity["status"] == "ok" and parity["fused_16bit"] == "xla"
    assert {(r["a"], r["b"]) for r in parity["logprobs"]} >= {
        ("einsum fp32", "transformers fp32"), ("xla fp32", "einsum fp32"),
        ("xla bf16", "einsum bf16")}
    assert all(r["positions"] > 0 and r["max_abs"] >= r["mean_abs"] >= 0
               for r in parity["logprobs"])
    assert len(parity["greedy"]) == 3 and all(r["prompts"] == 3 for r in parity["greedy"])

    its = report["iterations"]
    assert [(i["family"], i["algorithm"]) for i in its] == FAMILIES
    for it in its:
        assert it["status"] == "ok" and "device_peak_bytes" in it
        assert it["device_peak_bytes"] is None  # a CPU keeps no memory statistics
        assert it["iteration_s"] > 0 and it["env_steps_run"] >= 1 and it["phases"]
        assert "update_mfu" in it
    plan = report["plan"]
    assert [c["algorithm"] for c in plan["configs"]] == [a for _, a in FAMILIES]
    for c in plan["configs"]:
        assert c["planned_peak_bytes"] > 0 and c["measured_peak_bytes"] is None
        assert c["measured_over_planned"] is None
    decode = report["decode"]
    assert decode["status"] == "ok" and decode["points"][0]["decode_ms_per_step"] > 0
    assert [p["decode"] for p in decode["points"]] == ["einsum", "ragged"]  # the A/B, one point
    for point in decode["points"]:  # rows of 9 to 32 tokens in a 32 bucket: fewer real tokens
        assert 0 < point["bound_ms_real_tokens"] < point["bound_ms_all_slots"]
        assert point["real_bound_over_wall"] > 0

    table = (tmp_path / "check.md").read_text()
    for heading in ("## Parity (ok)", "## Plan against the measured peak (ok)", "## Iterations",
                    "## Decode (ok)"):
        assert heading in table, heading
    for family, algo in FAMILIES:
        assert f"| {family} | `{algo}_alfworld_qwen2.5_1.5b` | ok |" in table


def test_the_check_runs_its_parts_in_child_processes(tmp_path):
    """`python experiments/gpu_check.py --smoke` as on a lent GPU, its parts in child processes
    (one part: each part's code is tested above; this is the parent and a child's round trip):
    the child's result and device come back, the parts not asked for are recorded so, and the
    JSON and its table are written."""
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--parts", "model", "--out", str(out),
                           "--model-dir", str(tmp_path / "model")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] and report["device"]["backend"] == "cpu"
    assert report["versions"]["jax"] and report["finished"] >= report["started"]
    model, = report["parts"]
    assert model["name"] == "model" and model["status"] == "ok" and model["returncode"] == 0
    assert model["wall_s"] > 0 and model["cpu_s"] > 0 and model["timeout_s"] > 0
    assert (tmp_path / "model" / "config.json").is_file()  # the child built the model folder
    assert [i["status"] for i in report["iterations"]] == ["not requested"] * 3
    assert report["parity"] == report["decode"] == {"status": "not requested"}
    assert "| model | ok |" in (tmp_path / "check.md").read_text()


def _iteration(peak):
    return {"status": "ok", "wall_s": 12.0, "device_peak_bytes": peak,
            "result": {"config": "x", "iteration_s": 10.0, "env_steps_run": 2,
                       "update_mfu": 0.4, "env_step_share_of_rollout": 0.05,
                       "metrics": {"time/rollout": 6.0},
                       "phases": [{"name": "decode", "wall": 2.0, "fraction": 0.3},
                                  {"name": "update (train steps)", "wall": 3.0,
                                   "fraction": 0.5}]}}


def test_report_assembly_and_table():
    """Three family records whatever happened to each; the plan gets the measured peaks."""
    gc = load_check()
    records = {
        "parity": {"name": "parity", "status": "failed", "error": "RuntimeError: a | b",
                   "log_tail": ["boom"]},
        "plan": {"name": "plan", "status": "ok", "result": {"overrides": [], "configs": [
            {"family": f, "algorithm": a, "config": f"{a}_cfg", "planned_peak_bytes": 2 * 2**30,
             "train_step_peak_bytes": 2 * 2**30, "sampler_peak_bytes": None, "wall_s": 1.0}
            for f, a in FAMILIES]}},
        "iteration:hgpo_k2": {"name": "iteration:hgpo_k2", **_iteration(3 * 2**30)},
        "iteration:ppo": {"name": "iteration:ppo", "status": "timeout", "reason": "killed",
                          "log_tail": ["..."]},
    }
    meta = {"command": "python experiments/gpu_check.py", "smoke": False, "started": "t0",
            "finished": "t1", "wall_s": 100.0, "budget_s": 540.0,
            "versions": {"python": "3", "jax": "0.11.2", "jaxlib": "0.11.2", "flax": "0.12.10",
                         "transformers": "5", "torch": "2"}}
    report = gc.assemble(meta, records)
    assert report["parity"] == {"status": "failed", "error": "RuntimeError: a | b",
                                "log_tail": ["boom"]}
    assert report["decode"] == {"status": "not requested"}
    its = report["iterations"]
    assert [(i["family"], i["algorithm"], i["status"]) for i in its] == [
        ("group", "hgpo_k2", "ok"), ("critic", "ppo", "timeout"),
        ("hierarchical", "hiper", "not requested")]
    assert [i["device_peak_bytes"] for i in its] == [3 * 2**30, None, None]
    configs = report["plan"]["configs"]
    assert configs[0]["measured_peak_bytes"] == 3 * 2**30
    assert configs[0]["measured_over_planned"] == 1.5
    assert configs[1]["measured_peak_bytes"] is None and configs[1]["measured_over_planned"] is None

    table = gc.markdown(report)
    assert "| parity | failed | - | - | - | RuntimeError: a \\| b |" in table
    assert "| group | `hgpo_k2_alfworld_qwen2.5_1.5b` | ok | 2 | 10.0 | 6.0 | 3.0 | 40.0% | " \
           "30.0% | 5.0% | 3.00 |" in table
    assert "| critic | `ppo_alfworld_qwen2.5_1.5b` | timeout |" in table
    assert "| `hgpo_k2_cfg` | 2.00 (2.00 / -) | 3.00 | 1.50 | 1.0 |" in table
    assert "## Decode (not requested)" in table


def test_parts_settings_and_a_skip_for_the_budget(tmp_path):
    gc = load_check()
    assert gc.selected_parts("parity,iterations,decode") == [
        "parity", "model", "iteration:hgpo_k2", "iteration:ppo", "iteration:hiper", "decode"]
    assert gc.selected_parts("hiper,plan,hiper") == ["iteration:hiper", "plan"]
    full = gc.settings(gc.parse_args([]))
    smoke = gc.settings(gc.parse_args(["--smoke", "train.seed=3"]))
    assert full["shape"] == "1.5b" and full["env"] == "alfworld"
    assert full["min_prompt_tokens"] == 1536
    assert "env.name=alfworld" in full["iteration_overrides"]
    assert full["plan_overrides"] == [] and "rollout.num_groups=2" in smoke["plan_overrides"]
    assert smoke["shape"] == "tiny" and "env.name=toy" in smoke["iteration_overrides"]
    assert smoke["iteration_overrides"][-1] == smoke["plan_overrides"][-1] == "train.seed=3"
    # nothing fits a 1 s budget: recorded as skipped, nothing started
    out = tmp_path / "skip.json"
    assert gc.main(["--smoke", "--parts", "decode,plan", "--budget-s", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["decode"]["status"] == report["plan"]["status"] == "skipped"
    assert "budget" in report["decode"]["reason"]
    assert [i["status"] for i in report["iterations"]] == ["not requested"] * 3
    assert (tmp_path / "skip.md").is_file()


def test_a_part_past_its_timeout_is_killed_with_its_group():
    gc = load_check()
    spec = gc.settings(gc.parse_args(["--smoke"]))
    record = gc.run_part("model", spec, timeout=0.5)  # the child is still importing JAX
    assert record["status"] == "timeout" and record["returncode"] == -15  # SIGTERM
    assert "timeout" in record["reason"] and "log_tail" in record
