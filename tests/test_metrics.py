"""hgpo_jax.metrics (JSONL + TensorBoard) and experiments/plot.py."""

from __future__ import annotations

import glob
import json
import math
import os
import struct

import numpy as np
import pytest

from hgpo_jax.metrics import MetricsLogger, metric_series, read_metrics, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lines(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def read_tb_scalars(tb_dir) -> dict[str, list[tuple[int, float]]]:
    """Scalars of the event files in tb_dir, read with tensorboardX's protobufs (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_jsonl_content(tmp_path):
    run = str(tmp_path / "run")
    with MetricsLogger(run, tensorboard=False) as log:
        log.log(1, {"train/pg_loss": 0.5, "success/all": np.float32(0.25), "n": 3})
        log.log(2, {"train/pg_loss": np.array(0.75)})
    recs = lines(run)
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[0]["train/pg_loss"] == 0.5 and recs[0]["success/all"] == 0.25 and recs[0]["n"] == 3.0
    assert recs[1] == {"step": 2, "time": recs[1]["time"], "train/pg_loss": 0.75}
    assert abs(recs[0]["time"] - __import__("time").time()) < 60
    assert read_metrics(run) == recs


def test_nonfinite_written_as_null(tmp_path):
    run = str(tmp_path)
    with MetricsLogger(run, tensorboard=False) as log:
        log.log(0, {"a": float("nan"), "b": float("inf"), "c": 1.0})
    (rec,) = lines(run)
    assert rec["a"] is None and rec["b"] is None and rec["c"] == 1.0
    assert rec["nonfinite"] == ["a", "b"]
    with open(os.path.join(run, "metrics.jsonl")) as f:
        text = f.read()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    (back,) = read_metrics(run)
    assert math.isnan(back["a"]) and math.isnan(back["b"]) and "nonfinite" not in back


def test_bad_input(tmp_path):
    with MetricsLogger(str(tmp_path), tensorboard=False) as log:
        with pytest.raises(TypeError, match="'x'"):
            log.log(0, {"x": "high"})
        with pytest.raises(TypeError, match="step"):
            log.log(1.5, {"x": 1.0})
        with pytest.raises(ValueError, match="reserved"):
            log.log(0, {"step": 1.0})
    assert not os.path.getsize(os.path.join(str(tmp_path), "metrics.jsonl"))  # nothing half-written
    with pytest.raises(RuntimeError, match="close"):
        log.log(0, {"x": 1.0})
    log.close()  # idempotent


def test_tensorboard_events(tmp_path):
    run = str(tmp_path)
    with MetricsLogger(run) as log:
        for step in range(3):
            log.log(step, {"train/kl_loss": 0.1 * step, "success/all": 1.0})
    files = glob.glob(os.path.join(run, "tb", "events.out.tfevents.*"))
    assert files and all(os.path.getsize(f) > 0 for f in files)
    scalars = read_tb_scalars(os.path.join(run, "tb"))
    assert [s for s, _ in scalars["train/kl_loss"]] == [0, 1, 2]
    np.testing.assert_allclose([v for _, v in scalars["train/kl_loss"]], [0.0, 0.1, 0.2], rtol=1e-6)
    assert scalars["success/all"] == [(0, 1.0), (1, 1.0), (2, 1.0)]


def test_truncated_last_line(tmp_path):
    run = str(tmp_path)
    with MetricsLogger(run, tensorboard=False) as log:
        log.log(1, {"x": 1.0})
        log.log(2, {"x": 2.0})
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write('{"step": 3, "time": 1.0, "x": 3.')  # a crash mid-write
    with pytest.warns(UserWarning, match="truncated last line"):
        recs = read_metrics(run)
    assert [r["step"] for r in recs] == [1, 2]
    # a resumed logger starts on a fresh line, so its records survive
    with MetricsLogger(run, tensorboard=False) as log:
        log.log(3, {"x": 30.0})
    with pytest.warns(UserWarning, match="malformed line 3"):
        recs = read_metrics(run)
    assert [(r["step"], r["x"]) for r in recs] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_resume_dedup(tmp_path):
    run = str(tmp_path)
    with MetricsLogger(run, tensorboard=False) as log:  # first run: crashed after step 5
        for step in range(1, 6):
            log.log(step, {"x": float(step)})
        log.log(5, {"eval/success": 0.5})  # a second record for the same step merges
    with MetricsLogger(run, tensorboard=False) as log:  # resumed from the step-3 checkpoint
        log.log(4, {"x": 40.0})
    recs = read_metrics(run)
    assert [(r["step"], r["x"]) for r in recs] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    assert len(lines(run)) == 7  # the file itself is append-only
    with MetricsLogger(run, tensorboard=False) as log:
        log.log(5, {"x": 50.0})
        log.log(5, {"eval/success": 0.75})
    recs = read_metrics(run)
    assert recs[-1]["step"] == 5 and recs[-1]["x"] == 50.0 and recs[-1]["eval/success"] == 0.75
    assert metric_series(recs, "eval/success") == ([5], [0.75])


def test_read_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_metrics(str(tmp_path))


# ------------------------------------------------------------------------------------- plot.py
def load_plot():
    from experiments import plot

    return plot


def synthetic_run(folder, seed, iterations=12):
    rng = np.random.default_rng(seed)
    with MetricsLogger(str(folder), tensorboard=False) as log:
        for it in range(1, iterations + 1):
            log.log(it, {"train/kl_loss": 0.001 * it + 0.0005 * rng.random(),
                         "train/pg_clipfrac": 0.05 * rng.random(),
                         "train/pg_loss": rng.normal(0, 0.1),
                         "train/mean_advantage": rng.normal(0, 0.01),
                         "rollout/mean_step_reward": 0.2 * it * rng.random(),
                         "success/all": min(1.0, 0.08 * it),
                         "custom/tokens_per_s": 100.0 + it})


def test_plot_two_runs(tmp_path, capsys):
    import matplotlib.image

    plot = load_plot()
    a, b = tmp_path / "hgpo_k2", tmp_path / "gigpo"
    synthetic_run(a, 0)
    synthetic_run(b, 1, iterations=8)
    out = str(tmp_path / "cmp.png")
    assert plot.main([str(a), str(b), "--out", out, "--metrics", "custom/tokens_per_s", "missing/x"]) == 0
    assert os.path.getsize(out) > 20_000
    img = matplotlib.image.imread(out)
    assert img.shape[0] > 500 and img.shape[1] > 1000 and float(np.var(img[..., :3])) > 1e-3
    assert "missing/x" in capsys.readouterr().out  # skipped with a note


def test_plot_single_run_default_out_and_errors(tmp_path, capsys):
    plot = load_plot()
    run = tmp_path / "one"
    synthetic_run(run, 2, iterations=3)
    assert plot.main([str(run)]) == 0
    assert os.path.getsize(run / "plots.png") > 10_000
    assert plot.main([str(tmp_path / "nope")]) == 1
    assert plot.main([str(run), "--only", "--metrics", "missing/x"]) == 1
    assert "metrics.jsonl" in capsys.readouterr().err
    assert plot.default_out(["a", "b"]) == "runs_comparison.png"
    assert plot.run_label("x/run", ["x/run", "y/run"]) == "x/run"


def test_write_atomically_new_file_in_a_new_folder_gets_the_umask_mode(tmp_path):
    path = tmp_path / "made" / "out.jsonl"
    old = os.umask(0o027)
    try:
        write_atomically(str(path), b"one\n")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"one\n"
    assert path.stat().st_mode & 0o777 == 0o640  # 0o666 under umask 027, as open() would give
    assert os.listdir(path.parent) == ["out.jsonl"]  # no temporary file left
    os.chmod(path, 0o600)
    write_atomically(str(path), b"two\n")  # an existing file keeps its mode
    assert path.read_bytes() == b"two\n" and path.stat().st_mode & 0o777 == 0o600
