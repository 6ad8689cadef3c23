"""Every iteration recorded once (issue 29): a resumed run drops from metrics.jsonl and the
TensorBoard event files the records of the steps after its checkpoint before it logs them again."""

import json
import os
import time

import pytest
from tensorboardX import SummaryWriter
from tensorboardX.proto.event_pb2 import Event

from hgpo_jax.config import load_config
from hgpo_jax.metrics import (MetricsLogger, _event_records, read_metrics, truncate_metrics,
                              truncate_tensorboard)
from hgpo_jax.runs import Run
from hgpo_jax.trainers.rl import Trainer
from hgpo_jax.trainers.sft import SftTrainer


def line(step, **metrics):
    return json.dumps({"step": step, "time": 1.0, **metrics})


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def raw_records(run_dir):
    """metrics.jsonl as written, one dict per line (not read_metrics, which hides repeats)."""
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def assert_each_step_once(records):
    pairs = [(r["step"], k) for r in records for k in r if k not in ("step", "time", "nonfinite")]
    repeated = sorted({p for p in pairs if pairs.count(p) > 1})
    assert not repeated, f"(step, metric) logged twice: {repeated[:10]}"


def tb_scalars(tb_dir):
    """(tag, step) of every scalar in the event files of tb_dir, repeats included."""
    out = []
    for name in sorted(os.listdir(tb_dir)):
        with open(os.path.join(tb_dir, name), "rb") as f:
            data = f.read()
        for _, _, payload in _event_records(data):
            event = Event.FromString(payload)
            out += [(v.tag, event.step) for v in event.summary.value]
    return out


# ------------------------------------------------------------------------------ truncate_metrics
def test_truncate_drops_later_steps_and_keeps_the_restored_steps_records(tmp_path):
    lines = [line(1, a=1.0), line(2, a=2.0), line(2, e=0.5), line(3, a=3.0), line(4, a=4.0),
             line(4, e=0.7)]
    write(tmp_path / "metrics.jsonl", "\n".join(lines) + "\n")
    assert truncate_metrics(str(tmp_path), 2) == 3
    # the kept lines byte for byte, train and eval records of step 2 both
    assert (tmp_path / "metrics.jsonl").read_text() == "\n".join(lines[:3]) + "\n"
    assert read_metrics(str(tmp_path)) == [{"step": 1, "time": 1.0, "a": 1.0},
                                           {"step": 2, "time": 1.0, "a": 2.0, "e": 0.5}]
    assert truncate_metrics(str(tmp_path / "metrics.jsonl"), 2) == 0  # a .jsonl path works too
    assert truncate_metrics(str(tmp_path), 0) == 3  # a restart from scratch: nothing stays
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_truncate_tolerates_a_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, "\n".join([line(1, a=1.0), line(2, a=2.0), line(3, a=3.0)]) + '\n{"step": 4, "ti')
    with pytest.warns(UserWarning, match="truncated last line"):
        assert truncate_metrics(str(tmp_path), 2) == 1
    assert [r["step"] for r in raw_records(tmp_path)] == [1, 2]
    # nothing past the step but a crash's half line (already ended by a logger): dropped alone
    write(path, line(1, a=1.0) + "\n" + '{"step": 2, "ti\n')
    with pytest.warns(UserWarning, match="truncated last line"):
        assert truncate_metrics(str(tmp_path), 5) == 0
    assert path.read_text() == line(1, a=1.0) + "\n"


def test_truncate_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    text = "\n".join(line(s, a=float(s)) for s in range(1, 6)) + "\n"
    write(path, text)
    os.chmod(path, 0o640)
    # nothing to drop: the file is not rewritten
    before = os.stat(path)
    assert truncate_metrics(str(tmp_path), 5) == 0
    assert os.stat(path).st_ino == before.st_ino and os.stat(path).st_mtime_ns == before.st_mtime_ns
    # a failure before the rename leaves the old file whole and no temporary file
    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        truncate_metrics(str(tmp_path), 2)
    assert path.read_text() == text and os.listdir(tmp_path) == ["metrics.jsonl"]
    monkeypatch.undo()
    # the rewrite is a new file renamed over the old one, with the old one's permissions
    assert truncate_metrics(str(tmp_path), 2) == 3
    after = os.stat(path)
    assert after.st_ino != before.st_ino and after.st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["metrics.jsonl"]
    assert [r["step"] for r in raw_records(tmp_path)] == [1, 2]


def test_truncate_without_a_file(tmp_path):
    assert truncate_metrics(str(tmp_path), 3) == 0
    assert truncate_metrics(str(tmp_path / "missing"), 3) == 0
    assert os.listdir(tmp_path) == []
    assert truncate_tensorboard(str(tmp_path / "tb"), 3) == 0


# ------------------------------------------------------------------------------ TensorBoard
def test_truncate_tensorboard_drops_the_later_events(tmp_path):
    tb = tmp_path / "tb"
    w = SummaryWriter(logdir=str(tb), filename_suffix=".old")
    for step in range(1, 6):
        w.add_scalar("a", float(step), step)
        w.add_scalar("b", -float(step), step)
    w.close()
    w = SummaryWriter(logdir=str(tb), filename_suffix=".early")  # nothing past step 3
    w.add_scalar("c", 1.0, 1)
    w.close()
    old, early = sorted(os.listdir(tb), key=lambda n: not n.endswith(".old"))
    with open(tb / old, "ab") as f:  # a crash in the middle of a record
        f.write(b"\x30\x00\x00\x00\x00\x00\x00\x00\x01\x02")
    early_inode = os.stat(tb / early).st_ino
    assert truncate_tensorboard(str(tb), 3) == 4
    assert sorted(tb_scalars(str(tb))) == sorted([("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2),
                                                  ("b", 3), ("c", 1)])
    assert os.stat(tb / early).st_ino == early_inode  # untouched
    with open(tb / old, "rb") as f:  # the version header stays first
        first = Event.FromString(next(_event_records(f.read()))[2])
    assert first.WhichOneof("what") == "file_version"
    assert sorted(os.listdir(tb)) == sorted([old, early])
    # a damaged file is left as it is, with a warning
    with open(tb / "events.out.tfevents.bad", "wb") as f:
        f.write(b"\x03\x00\x00\x00\x00\x00\x00\x00" + b"\x00" * 4 + b"\xff\xff\xff" + b"\x00" * 4)
    with pytest.warns(UserWarning, match="left as it is"):
        assert truncate_tensorboard(str(tb), 1) == 4


def test_a_resumed_logger_rewinds_before_it_logs(tmp_path):
    """The interrupted run logged steps 1-4 (checkpoint at 2); the resumed one logs 3 and 4 again."""
    run = str(tmp_path)
    with MetricsLogger(run) as log:
        for step in range(1, 5):
            log.log(step, {"train/loss": float(step)})
            if step == 2:
                log.log(step, {"eval/x": 0.5})  # eval metrics in a record of their own
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write('{"step": 5, "ti')  # killed while writing step 5
    time.sleep(1.1)  # tensorboardX names event files by the second: the resumed writer's is new
    with MetricsLogger(run) as log:
        with pytest.warns(UserWarning, match="truncated last line"):
            assert log.rewind(2) == 2
        for step in (3, 4):
            log.log(step, {"train/loss": 10.0 + step})
        with pytest.raises(RuntimeError, match="rewind before logging"):
            log.rewind(3)  # would cut what this logger itself wrote
        assert log.rewind(4) == 0  # a second train() call: nothing to drop, logging goes on
        log.log(4, {"eval/x": 0.25})
    records = raw_records(run)
    assert [r["step"] for r in records] == [1, 2, 2, 3, 4, 4]
    assert_each_step_once(records)
    assert [r["train/loss"] for r in read_metrics(run)] == [1.0, 2.0, 13.0, 14.0]
    scalars = tb_scalars(os.path.join(run, "tb"))
    assert len(scalars) == len(set(scalars)) == 6
    with pytest.raises(RuntimeError, match="after close"):
        log.rewind(1)


# ------------------------------------------------------------------------------ whole runs
class Killed(BaseException):
    """The process dies (SIGKILL, a node lost) between logging a step and checkpointing it."""


def kill_at_save(monkeypatch, step):
    save = Run.save

    def dying_save(self, s):
        if s == step:
            raise Killed(s)
        save(self, s)

    monkeypatch.setattr(Run, "save", dying_save)


def check_resumed_run(run, steps, restored, t_resume):
    records = raw_records(run)
    assert_each_step_once(records)
    assert sorted({r["step"] for r in records}) == list(range(1, steps + 1))
    # the steps after the checkpoint are the resumed run's own records
    assert all(r["time"] >= t_resume for r in records if r["step"] > restored)
    assert all(r["time"] < t_resume for r in records if r["step"] <= restored)
    assert [r["step"] for r in read_metrics(run)] == list(range(1, steps + 1))
    scalars = tb_scalars(os.path.join(run, "tb"))
    assert len(scalars) == len(set(scalars))
    assert {s for _, s in scalars} == set(range(1, steps + 1))


@pytest.mark.slow
def test_an_rl_run_killed_after_unsaved_iterations_logs_each_once_when_resumed(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    cfg = load_config("tiny_cpu_toy", [f"train.run_dir={run}", "env.num_workers=1", "train.iterations=4",
                                       "train.save_every=2", "eval.every=2"])
    kill_at_save(monkeypatch, 4)  # iterations 3 and 4 are logged, only 2 is saved
    with pytest.raises(Killed), Trainer(cfg, progress=False) as t:
        t.train()
    monkeypatch.undo()
    before = raw_records(run)
    splits = len(cfg.eval.splits)  # eval at 2 and 4: a record of its own per split
    assert [r["step"] for r in before] == [1, 2] + [2] * splits + [3, 4] + [4] * splits
    time.sleep(1.1)  # tensorboardX names event files by the second
    t_resume = time.time()
    with Trainer(cfg, resume=True, progress=False) as t:
        assert t.iteration == 2
        assert len(t.train()) == 2
    check_resumed_run(run, 4, 2, t_resume)
    assert [r["step"] for r in raw_records(run)] == [r["step"] for r in before]


@pytest.mark.slow
@pytest.mark.parametrize("save_every", [2, 0], ids=["from-checkpoint", "no-checkpoint"])
def test_an_sft_run_killed_after_unsaved_steps_logs_each_once_when_resumed(tmp_path, monkeypatch,
                                                                           save_every):
    """As the WebShop warm start's log (steps after the checkpoint twice); without a checkpoint the
    resumed run starts again from scratch and every old record goes."""
    run = str(tmp_path / "run")
    cfg = load_config("toy_format", [f"train.run_dir={run}", "model.path=tiny", "sft.episodes=40",
                                     "sft.steps=4", "sft.batch_size=8", "train.micro_batch_size=4",
                                     "sft.eval_every=2", f"sft.save_every={save_every}"])
    kill_at_save(monkeypatch, 4)
    with pytest.raises(Killed), SftTrainer(cfg, progress=False) as t:
        t.train()
    monkeypatch.undo()
    assert [r["step"] for r in raw_records(run)] == [1, 2, 3, 4]
    time.sleep(1.1)  # tensorboardX names event files by the second
    t_resume = time.time()
    with SftTrainer(cfg, resume=True, progress=False) as t:
        assert t.step == (2 if save_every else 0)
        t.train()
    check_resumed_run(run, 4, 2 if save_every else 0, t_resume)
    assert "heldout/nll" in read_metrics(run)[1]
