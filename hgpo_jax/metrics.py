"""Per-iteration metrics to JSONL (`RUN_DIR/metrics.jsonl`) and TensorBoard (`RUN_DIR/tb`).

    with MetricsLogger(run_dir) as log:
        log.log(step, {"train/pg_loss": 0.12, "success/all": 0.5})
    records = read_metrics(run_dir)          # [{"step": 1, "time": ..., "train/pg_loss": ...}, ...]

JSONL format: one JSON object per line, `{"step": int, "time": unix seconds, **metrics}`, flushed
after every line. JSON has no NaN/inf, so a non-finite value is written as `null` and its key is
listed in a `"nonfinite": [keys]` field of that line (TensorBoard gets the value itself);
`read_metrics` turns those nulls back into NaN.

Resuming: a run restarts from its last checkpoint, so the records it logged after that checkpoint
(up to the interruption) would come again. Before it logs anything, a training run therefore calls
`MetricsLogger.rewind(step)` with the step it starts from (the restored checkpoint's; 0 for a run
from scratch): `truncate_metrics` rewrites metrics.jsonl without the records of later steps, and
`truncate_tensorboard` rewrites the TensorBoard event files that hold events of later steps
without them, each file atomically (a temporary file in the same folder, fsync, os.replace), so
every step is in the files once (jq, pandas and TensorBoard see no repeats). Records of the
restored step itself are kept (train and eval metrics of one step may come in two calls).
`read_metrics` still reads a file written before this rewind existed: it reads in order and (1)
when a step is lower than a step seen before (the run rewound to a checkpoint), drops the earlier
records of that step and every later step; (2) merges records of the same step (later keys win),
so train and eval metrics logged in two calls for one step come back as one record. A crash can
leave a truncated last line: `read_metrics` skips it with a warning, the next logger starts on a
fresh line, and a rewind that rewrites the file drops it (with a warning).

The event files' record framing (length, its CRC, payload, its CRC) is read here by hand, a few
lines, because tensorboardX writes event files but has no reader and TensorBoard's own reader
would add TensorBoard (or TensorFlow) as a dependency; the events themselves are decoded with
tensorboardX's protobuf classes, and kept records are copied byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import struct
import time
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
RESERVED_KEYS = ("step", "time", "nonfinite")


def metrics_path(run_dir: str) -> str:
    """`run_dir/metrics.jsonl` (a path to a .jsonl file is returned unchanged)."""
    return run_dir if run_dir.endswith(".jsonl") else os.path.join(run_dir, METRICS_FILE)


def to_scalar(key: str, value: Any) -> float:
    """A Python/NumPy/JAX number or 0-d array -> float; clear TypeError otherwise."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "shape", None) == () or getattr(value, "size", None) == 1:
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"metric {key!r} must be a number or a one-element array, got "
                    f"{type(value).__name__}: {value!r:.80}")


def encode_record(step: int, metrics: Mapping[str, Any], wall_time: float) -> str:
    """One JSONL line (without the newline): non-finite values -> null + "nonfinite" list."""
    record: dict[str, Any] = {"step": step, "time": wall_time}
    nonfinite = []
    for key, value in metrics.items():
        x = to_scalar(key, value)
        if math.isfinite(x):
            record[key] = x
        else:
            record[key] = None
            nonfinite.append(key)
    if nonfinite:
        record["nonfinite"] = nonfinite
    return json.dumps(record, allow_nan=False)


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be an int, got {type(step).__name__}: {step!r}")
    return int(step)


def _check_keys(metrics: Mapping[str, Any]) -> None:
    for key in metrics:
        if not isinstance(key, str) or not key:
            raise TypeError(f"metric names must be non-empty strings, got {key!r}")
        if key in RESERVED_KEYS:
            raise ValueError(f"metric name {key!r} is reserved (JSONL fields {RESERVED_KEYS}); "
                             "rename it, e.g. 'train/" + key + "'")


class MetricsLogger:
    """Appends metrics to `run_dir/metrics.jsonl` and (optionally) TensorBoard `run_dir/tb`.

    Args:
      run_dir: run folder (created if missing).
      tensorboard: also write TensorBoard scalars with tensorboardX; if tensorboardX is missing,
        a warning is issued and only the JSONL file is written.
    """

    def __init__(self, run_dir: str, tensorboard: bool = True):
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        self.path = metrics_path(run_dir)
        _end_with_newline(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._max_step: int | None = None  # the highest step this logger logged
        self._writer = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                warnings.warn("tensorboardX is not installed: metrics go to metrics.jsonl only "
                              "(pip install tensorboardX)", stacklevel=2)
            else:
                self._writer = SummaryWriter(logdir=os.path.join(run_dir, TB_DIR))

    @property
    def tb_dir(self) -> str | None:
        """The TensorBoard folder, or None without TensorBoard."""
        return os.path.join(self.run_dir, TB_DIR) if self._writer is not None else None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one record for `step` (flushed) and write each scalar to TensorBoard."""
        if self._file is None:
            raise RuntimeError("MetricsLogger.log after close()")
        step = _check_step(step)
        _check_keys(metrics)
        now = time.time()
        line = encode_record(step, metrics, now)  # validates every value before writing anything
        self._file.write(line + "\n")
        self._file.flush()
        self._max_step = step if self._max_step is None else max(self._max_step, step)
        if self._writer is not None:
            for key, value in metrics.items():
                self._writer.add_scalar(key, to_scalar(key, value), step, walltime=now)
            self._writer.flush()

    def rewind(self, last_step: int) -> int:
        """Drop the records of steps after `last_step` from metrics.jsonl and the TensorBoard
        files (see the module docstring); returns how many metrics.jsonl records went. A resumed
        run calls it with its checkpoint's step before it logs again. The JSONL file is closed
        around the rewrite and opened again (an open handle would keep writing to the replaced
        file). This logger's own TensorBoard event file holds no step past `last_step` (checked),
        so it is never rewritten under its open writer."""
        if self._file is None:
            raise RuntimeError("MetricsLogger.rewind after close()")
        last_step = _check_step(last_step)
        if self._max_step is not None and self._max_step > last_step:
            raise RuntimeError(f"MetricsLogger.rewind({last_step}) after this logger logged step "
                               f"{self._max_step}: rewind before logging")
        self._file.close()
        try:
            dropped = truncate_metrics(self.path, last_step)
        finally:
            self._file = open(self.path, "a", encoding="utf-8")
        if self._writer is not None:
            truncate_tensorboard(os.path.join(self.run_dir, TB_DIR), last_step)
        return dropped

    def close(self) -> None:
        """Flush and close the files (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _end_with_newline(path: str) -> None:
    """If a crash left `path` ending mid-line, end that line so new records start cleanly."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")


def decode_record(line: str) -> dict:
    """Parse one JSONL line; nulls listed in "nonfinite" become NaN; the list is dropped."""
    record = json.loads(line)
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        raise ValueError("not a metrics record (a JSON object with an int 'step')")
    for key in record.pop("nonfinite", None) or ():
        if record.get(key) is None:
            record[key] = math.nan
    return record


def read_metrics(run_dir: str) -> list[dict]:
    """Records of `run_dir/metrics.jsonl`, one per step, sorted by step (see module docstring).

    Unparseable lines are skipped with a warning (expected only for the last line after a crash).
    Raises FileNotFoundError if the file does not exist.
    """
    path = metrics_path(run_dir)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    by_step: dict[int, dict] = {}
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = decode_record(line)
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            what = "truncated last line (crash?)" if i == last else f"malformed line {i + 1}"
            warnings.warn(f"{path}: skipping {what}: {e}", stacklevel=2)
            continue
        step = record["step"]
        if by_step and step < max(by_step):  # the run rewound to a checkpoint: drop the stale tail
            by_step = {s: r for s, r in by_step.items() if s < step}
        by_step.setdefault(step, {}).update(record)
    return [by_step[s] for s in sorted(by_step)]


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` (its folder made if missing) through a temporary file in the same
    folder: fsync, then os.replace, so a reader (or a crash) sees the old file or the new one,
    never a mix. An existing file keeps its permissions; a new one gets the umask's, as `open`
    would give it: the temporary file is opened with mode 0o666 and the kernel applies the umask
    (`tempfile.mkstemp` would make it 0o600, and reading the umask means setting it, which races
    with the threads that create files beside this, Orbax's among them)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a power cut
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def truncate_metrics(run_dir: str, last_step: int) -> int:
    """Rewrite `run_dir/metrics.jsonl` without the records of steps after `last_step`; returns
    how many records were dropped. Records of `last_step` and earlier stay, in order, byte for
    byte. Unreadable lines (a crash's truncated last line) are dropped too, with a warning, when
    the file is rewritten; it is rewritten (atomically) only when something is dropped. A missing
    file is fine (0)."""
    last_step = _check_step(last_step)
    path = metrics_path(run_dir)
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return 0
    kept, dropped, bad = [], 0, []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            step = decode_record(line.decode("utf-8"))["step"]
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            what = "truncated last line (crash?)" if i == last else f"malformed line {i + 1}"
            bad.append(f"{what}: {e}")
            continue
        if step > last_step:
            dropped += 1
        else:
            kept.append(line)
    if dropped or bad:
        for what in bad:
            warnings.warn(f"{path}: dropping {what}", stacklevel=2)
        write_atomically(path, b"".join(line + b"\n" for line in kept))
    return dropped


def _event_records(data: bytes):
    """(start, end, payload) of each whole TFRecord in an event file's bytes (length, its crc,
    payload, its crc); stops at a truncated tail."""
    pos = 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + n + 4
        if end > len(data):
            return
        yield pos, end, data[pos + 12:pos + 12 + n]
        pos = end


def truncate_tensorboard(tb_dir: str, last_step: int) -> int:
    """Rewrite the TensorBoard event files of `tb_dir` that hold events of steps after
    `last_step` without those events (atomically, each kept record byte for byte); returns how
    many events were dropped. A file's version header is always kept; a file with no event past
    `last_step` is not touched (the open file of a running writer among them), nor is one that
    cannot be parsed (a warning says so: TensorBoard then shows its late steps until the new
    ones replace them). Without tensorboardX (which parses the events) nothing is done (0)."""
    last_step = _check_step(last_step)
    try:
        from google.protobuf.message import DecodeError
        from tensorboardX.proto.event_pb2 import Event
    except ImportError:
        return 0
    if not os.path.isdir(tb_dir):
        return 0
    total = 0
    for name in sorted(os.listdir(tb_dir)):
        path = os.path.join(tb_dir, name)
        if "tfevents" not in name or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        kept, dropped = [], 0
        try:
            for start, end, payload in _event_records(data):
                event = Event.FromString(payload)
                if event.step > last_step and event.WhichOneof("what") != "file_version":
                    dropped += 1
                else:
                    kept.append(data[start:end])
        except DecodeError as e:  # a damaged file, left as it is
            warnings.warn(f"{path}: not an event file TensorBoard events can be dropped from "
                          f"({type(e).__name__}: {e}); left as it is", stacklevel=2)
            continue
        if dropped:
            write_atomically(path, b"".join(kept))
            total += dropped
    return total


def metric_series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that have `key` (None -> NaN)."""
    steps, values = [], []
    for r in records:
        if key in r:
            steps.append(r["step"])
            values.append(math.nan if r[key] is None else float(r[key]))
    return steps, values


__all__ = ["MetricsLogger", "decode_record", "encode_record", "metric_series", "metrics_path",
           "read_metrics", "to_scalar", "truncate_metrics", "truncate_tensorboard"]
