"""A run folder is a record that no command corrupts (issue 39): every command as a user types it
(`hgpo-jax ...` through `cli.main`), from other working folders, on moved and copied runs, with
the exit code, the one-line message and every file of the run byte for byte afterwards.

One tiny toy run of one iteration is trained once (module fixture); each test works on its own
copy of it.
"""

import hashlib
import json
import os
import shutil

import pytest

from hgpo_jax.cli import main as cli_main
from hgpo_jax.config import load_config

SMALL = ("env.num_workers=1", "--no-progress")
EVAL_SMALL = ("eval.protocol=each-once", "--games", "2", "eval.splits=[valid_seen]")


def tree(folder) -> dict[str, str]:
    """{relative path: sha256} of every file under a folder."""
    out = {}
    for here, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(here, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def without_evals(files: dict[str, str]) -> dict[str, str]:
    """A run's files less its evaluations (RUN/eval/: what eval may add beside the record)."""
    return {k: v for k, v in files.items() if not k.startswith("eval" + os.sep)}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `hgpo-jax ARGV`."""
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, command: str, *needles: str) -> None:
    """Exit 2, and stderr's last line is the one-line error naming each needle (warnings of
    libraries may come before it; no traceback)."""
    assert code == 2, err
    assert "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"hgpo-jax {command}: error: "), err
    for needle in needles:
        assert needle in line, (needle, line)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny_cpu_toy run of one iteration (its checkpoint at iteration 1)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert cli_main(["train", "tiny_cpu_toy", f"train.run_dir={run}", "train.iterations=1",
                     *SMALL]) == 0
    return run


@pytest.fixture
def run(trained, tmp_path):
    """This test's own copy of the trained run."""
    copy = tmp_path / "runs" / "toy"
    shutil.copytree(trained, copy)
    return copy


# ------------------------------------------------------------------ eval acts on the folder given
def test_eval_from_elsewhere_evaluates_the_run_and_keeps_its_record(run, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    before = tree(run)
    code, out, err = run_cli(capsys, "eval", run.resolve(), "eval.temperature=0", *EVAL_SMALL, *SMALL,
                             "--json")
    assert code == 0, err
    assert f"evaluating {run.resolve()} at iteration 1" in out
    assert os.listdir(elsewhere) == []  # no ./runs/tiny_cpu_toy made here
    assert without_evals(tree(run)) == before  # config.yaml, checkpoints, metrics untouched
    # the evaluation's own record: its settings (temperature 0) beside its results
    records = [f for f in os.listdir(run / "eval") if f.endswith(".json")]
    assert len(records) == 1 and records[0].endswith("-rl1.json")
    record = json.loads((run / "eval" / records[0]).read_text())
    assert record["config"]["eval"]["temperature"] == 0.0 and record["step"] == 1
    assert record["results"]["eval/valid_seen/episodes"] == 2.0
    assert json.loads(out.strip().splitlines()[-1])["valid_seen"]["episodes"] == 2
    # the next plain eval runs at the run's own temperature, not the last evaluation's
    assert load_config(str(run)).eval.temperature == 0.4


def test_a_moved_run_is_evaluated_and_resumed_where_it_lies(run, tmp_path, monkeypatch, capsys):
    moved = tmp_path / "cluster-copy" / "toy"
    shutil.move(run, moved)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "eval", moved, *EVAL_SMALL, *SMALL)
    assert code == 0, err
    assert f"evaluating {moved} at iteration 1" in out
    before = tree(moved)
    code, out, err = run_cli(capsys, "train", moved, "--resume", "train.iterations=2", *SMALL)
    assert code == 0, err
    assert f"iterations 2..2 (run folder {moved})" in out
    assert os.listdir(tmp_path / "runs") == [] and not (tmp_path / "toy").exists()  # nothing made here
    after = tree(moved)
    assert after["config.yaml"] == before["config.yaml"]  # written once, by the start
    assert any(k.startswith(os.path.join("checkpoints", "2")) for k in after)
    # the longer run is recorded as a change from iteration 1 on, not by rewriting config.yaml
    changes = [json.loads(line) for line in (moved / "config_changes.jsonl").read_text().splitlines()]
    assert [(c["step"], c["changes"]) for c in changes] == [(1, {"train.iterations": [1, 2]})]
    assert load_config(str(moved)).train.iterations == 2


def test_a_run_folder_cannot_be_moved_by_an_override(run, capsys):
    before = tree(run)
    code, _, err = run_cli(capsys, "eval", run, f"train.run_dir={run.parent / 'other'}", *SMALL)
    assert_one_line_error(code, err, "eval", "is a run folder", "drop train.run_dir=")
    assert tree(run) == before and not (run.parent / "other").exists()


# ------------------------------------------------------------------ resume
def test_resume_of_a_folder_without_a_run_is_an_error(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    code, _, err = run_cli(capsys, "train", "tiny_cpu_toy", "--resume", f"train.run_dir={missing}", *SMALL)
    assert_one_line_error(code, err, "train", f"--resume: {missing} holds no run to resume (no config.yaml)")
    assert not missing.exists()


def test_resume_of_a_finished_run_says_so(run, capsys):
    before = tree(run)
    code, _, err = run_cli(capsys, "train", run, "--resume", *SMALL)
    assert_one_line_error(code, err, "train", "has done all 1 iterations (train.iterations=1)",
                          "give a larger train.iterations=")
    assert tree(run) == before


def test_resume_that_changes_the_run_is_refused(run, capsys):
    before = tree(run)
    code, _, err = run_cli(capsys, "train", "tiny_cpu_toy", f"train.run_dir={run}", "--resume",
                           "algo.estimator=grpo", "optim.lr=0.5", "train.iterations=2", *SMALL)
    assert_one_line_error(code, err, "train", "algo.estimator 'hgpo' -> 'grpo'", "optim.lr 1e-05 -> 0.5",
                          "--allow-change")
    assert tree(run) == before
    # another algorithm's config on this run: refused before its checkpoints are read
    code, _, err = run_cli(capsys, "train", "tiny_cpu_ppo", f"train.run_dir={run}", "--resume", *SMALL)
    assert_one_line_error(code, err, "train", "algo.estimator 'hgpo' -> 'ppo'")
    assert tree(run) == before
    # an SFT resume of an RL run
    code, _, err = run_cli(capsys, "sft", run, "--resume", *SMALL)
    assert_one_line_error(code, err, "sft", "holds an RL run, not a supervised")
    assert tree(run) == before


def test_resume_with_allow_change_records_the_change(run, capsys):
    before = tree(run)
    code, _, err = run_cli(capsys, "train", run, "--resume", "optim.lr=2e-5", "train.iterations=2",
                           "--allow-change", *SMALL)
    assert code == 0, err
    after = tree(run)
    assert after["config.yaml"] == before["config.yaml"]
    changes = [json.loads(line) for line in (run / "config_changes.jsonl").read_text().splitlines()]
    assert changes[0]["step"] == 1
    assert changes[0]["changes"] == {"optim.lr": [1e-05, 2e-05], "train.iterations": [1, 2]}
    cfg = load_config(str(run))
    assert cfg.optim.lr == 2e-5 and cfg.train.iterations == 2  # the run as it goes on now


# ------------------------------------------------------------------ a failed start writes nothing
def test_a_failed_start_leaves_the_disk_as_it_was(tmp_path, capsys):
    mine = tmp_path / "my-folder"
    mine.mkdir()
    (mine / "config.yaml").write_text("my own notes\n")
    (mine / "data.csv").write_text("1,2\n")
    before = tree(mine)
    code, _, err = run_cli(capsys, "train", "tiny_cpu_toy", f"train.run_dir={mine}",
                           "model.path=/nonexistent", *SMALL)
    assert_one_line_error(code, err, "train")
    assert tree(mine) == before
    # a start into a new folder that fails (the model is missing) leaves no folder
    new = tmp_path / "new-run"
    code, _, err = run_cli(capsys, "train", "tiny_cpu_toy", f"train.run_dir={new}",
                           "model.path=/nonexistent", *SMALL)
    assert_one_line_error(code, err, "train", "/nonexistent")
    assert not new.exists()


def test_a_new_run_never_writes_into_a_folder_of_the_users(tmp_path, capsys):
    mine = tmp_path / "my-folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep\n")
    before = tree(mine)
    code, _, err = run_cli(capsys, "train", "tiny_cpu_toy", f"train.run_dir={mine}", *SMALL)
    assert_one_line_error(code, err, "train", "holds files no hgpo-jax run wrote (notes.txt",
                          "choose a new or empty folder")
    assert tree(mine) == before


def test_eval_of_a_config_beside_a_run_leaves_the_run_alone(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(run.parent.parent)  # ./runs/toy is a run; the config's run_dir is runs/toy
    before = tree(run)
    code, out, err = run_cli(capsys, "eval", "tiny_cpu_toy", "train.run_dir=runs/toy", *EVAL_SMALL, *SMALL)
    assert code == 0, err
    assert "evaluating tiny_cpu_toy's model.path tiny" in out and "not recorded: runs/toy holds a run" in out
    assert tree(run) == before
    # a folder that holds no run records the evaluation of the config's model in its eval/, and a
    # run may start there later
    from hgpo_jax.runs import check_run_folder

    code, out, err = run_cli(capsys, "eval", "tiny_cpu_toy", "train.run_dir=runs/fresh", *EVAL_SMALL, *SMALL)
    assert code == 0, err
    records = os.listdir(tmp_path / "runs" / "fresh" / "eval")
    assert [r for r in records if r.endswith(".json")][0].endswith("-model.json") and "metrics.jsonl" in records
    assert check_run_folder(load_config("tiny_cpu_toy", ["train.run_dir=runs/fresh"]), "runs/fresh", "rl",
                            resume=False, record=True, allow_change=False) == {}


# ------------------------------------------------------------------ export
def test_export_never_deletes_what_it_did_not_write(run, tmp_path, capsys):
    before = tree(run)
    # into the run itself, or a folder inside it
    code, _, err = run_cli(capsys, "export", run, run, "--overwrite")
    assert_one_line_error(code, err, "export", "is the run folder")
    code, _, err = run_cli(capsys, "export", run, run / "hf", "--overwrite")
    assert_one_line_error(code, err, "export", "lies inside the run folder")
    # into the folder that holds the run (and others)
    parent = run.parent
    (parent / "other.txt").write_text("x")
    parent_before = tree(parent)
    code, _, err = run_cli(capsys, "export", run, parent, "--overwrite")
    assert_one_line_error(code, err, "export", "holds the run folder")
    assert tree(parent) == parent_before
    # into the user's own folder
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("months of work")
    code, _, err = run_cli(capsys, "export", run, mine, "--overwrite")
    assert_one_line_error(code, err, "export", "is not an earlier export", "choose a new or empty folder")
    assert (mine / "thesis.tex").read_text() == "months of work"
    # a new folder, then the same folder again: --overwrite replaces an earlier export
    out = tmp_path / "hf"
    code, _, err = run_cli(capsys, "export", run, out, "--no-progress")
    assert code == 0, err
    record = json.loads((out / "hgpo_jax_export.json").read_text())
    assert record["step"] == 1 and "config.json" in record["files"]
    code, _, err = run_cli(capsys, "export", run, out, "--no-progress")
    assert_one_line_error(code, err, "export", "pass --overwrite")
    assert run_cli(capsys, "export", run, out, "--overwrite", "--no-progress")[0] == 0
    # an export the user added a file to is no longer only an export
    (out / "README.md").write_text("my notes")
    code, _, err = run_cli(capsys, "export", run, out, "--overwrite")
    assert_one_line_error(code, err, "export", "holds files no export wrote: README.md")
    assert (out / "README.md").read_text() == "my notes"
    assert tree(run) == before


# ------------------------------------------------------------------ one line, not a traceback
def test_a_damaged_checkpoint_is_one_line_for_resume_eval_and_export(run, tmp_path, capsys):
    for here, _, files in os.walk(run / "checkpoints"):
        for f in files:
            if "meta" not in here and not f.startswith(("_CHECKPOINT", "_METADATA")):
                with open(os.path.join(here, f), "wb") as fh:
                    fh.write(b"damaged")
    before = tree(run)
    code, _, err = run_cli(capsys, "train", run, "--resume", "train.iterations=2", *SMALL)
    assert_one_line_error(code, err, "train", "no checkpoint under", "restores")
    code, _, err = run_cli(capsys, "export", run, tmp_path / "hf")
    assert_one_line_error(code, err, "export", "no checkpoint under", "restores")
    assert tree(run) == before and not (tmp_path / "hf").exists()
    # --debug: the whole traceback instead
    with pytest.raises(Exception, match="no checkpoint under"):
        cli_main(["export", str(run), str(tmp_path / "hf"), "--debug"])


def test_episodes_into_a_folder_is_refused_before_the_evaluation(run, tmp_path, capsys):
    before = tree(run)
    code, _, err = run_cli(capsys, "eval", run, *EVAL_SMALL, "--episodes", tmp_path, *SMALL)
    assert_one_line_error(code, err, "eval", "--episodes", "is a folder")
    assert tree(run) == before


def test_demo_takes_a_run_folder(run, capsys):
    code, out, err = run_cli(capsys, "demo", "--model", run, "--max-new-tokens", "2")
    assert code == 0, err
    assert "reply" in out
    code, _, err = run_cli(capsys, "demo", "--model", run / "checkpoints")
    assert_one_line_error(code, err, "demo", "neither a Hugging Face model folder")


@pytest.mark.parametrize("override, needle", [
    ("model.attention=cudnn", "model.attention=cudnn is cuDNN flash attention, which runs on a GPU only"),
    ("name=" + "x" * 300, "bytes, beyond the"),
    ("train.run_dir={file}/run", "lies under the file"),
    ("rollout.max_new_tokens=100000", "max_position_embeddings"),
])
def test_what_used_to_be_a_traceback_is_one_line_before_anything_loads(override, needle, tmp_path,
                                                                        monkeypatch, capsys):
    """Each was a traceback (RuntimeError at the first rollout, OSError, NotADirectoryError, an
    error after the weights loaded); now one line, before the model loads, nothing written."""
    import hgpo_jax.runs as runs

    def must_not_run(*a, **k):
        raise AssertionError("loaded before the checks")

    monkeypatch.setattr(runs, "load_model", must_not_run)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    before = tree(tmp_path)
    code, _, err = run_cli(capsys, "train", "tiny_cpu_toy", "model.path=tiny",
                           override.format(file=tmp_path / "afile"), *SMALL)
    assert_one_line_error(code, err, "train", needle)
    assert tree(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["afile"]


def test_coordinator_that_is_no_address_is_one_line(capsys):
    code, _, err = run_cli(capsys, "train", "tiny_cpu_toy", "--coordinator", "notaport",
                           "--num-processes", "2", "--process-id", "0")
    assert_one_line_error(code, err, "train", "--coordinator 'notaport': give HOST:PORT")


def test_empty_eval_splits_is_an_error_not_an_empty_result(run, capsys):
    before = tree(run)
    code, out, err = run_cli(capsys, "eval", run, "eval.splits=[]", "--json", *SMALL)
    assert_one_line_error(code, err, "eval", "eval.splits")
    assert out == "" and tree(run) == before
