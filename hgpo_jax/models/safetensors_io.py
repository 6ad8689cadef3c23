"""Torch-free safetensors reading (the `safetensors` package) and streamed writing.

Reading is `safetensors.safe_open(path, framework="numpy")` (safetensors==0.8.0): it memory-maps
the file, validates the header at open (length, JSON, dtypes, offsets covering the data exactly)
and returns one tensor at a time as a NumPy array, BF16 included (an `ml_dtypes.bfloat16` array,
the dtype NumPy and JAX share; no torch). `get` copies that one tensor out of the map: reading a
256 MiB tensor of a 2 GiB file raised the RSS by 512 MiB (the mapped pages, which are reclaimable
page cache, plus the copy), reading a 40-byte one by nothing measurable. That copy is the price
of the library over a hand-made `np.memmap` view: reading and casting every tensor of that file
took 2.5 s against 0.75 s (2 busy CPU cores, file in the page cache) and held one more
tensor-sized buffer at a time (peak RSS +2,560 MiB against +2,304 MiB, both counting the mapped
pages). The library's `SafetensorError` carries no file name; it is re-raised as
`SafetensorsError` naming the file and what is wrong with it.

Writing streams each tensor to disk as it is produced, by hand, because the library cannot:
`safetensors.numpy.save_file` (like `serialize_file`) takes every tensor of the file at once, so
a shard costs its whole size in host memory, on top of the model. For the exports here
(`save_pretrained`, 5 GiB shards by default) that is up to 5 GiB per shard where streaming needs
only the largest single tensor (the 0.47 GB embedding of Qwen2.5-1.5B in bf16, 1.1 GB for 7B).
Measured writing eight 128 MiB tensors produced on demand into one file: peak RSS +1,024 MiB with
`save_file`, +128 MiB streamed. The header (what the format defines: 8-byte little-endian length,
compact JSON `{"__metadata__": ..., name: {"dtype", "shape", "data_offsets"}}` padded with spaces
to 8 bytes, then the raw little-endian bytes) is the library's byte for byte, its dtype codes come
from the library's `TensorSpec`, and the tests check that the library reads these files (and
transformers loads the exports).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import uuid
from collections.abc import Callable, Iterable

import numpy as np
from safetensors import SafetensorError, TensorSpec, safe_open


class SafetensorsError(ValueError):
    """A safetensors file that is missing, truncated or malformed."""


# the library's messages (safetensors 0.8.0) -> what they mean for a checkpoint file
_HINTS = (("header too small", "file is too short to be safetensors"),
          ("header too large", "corrupt header length"),
          ("incomplete metadata", "file truncated (its tensors do not cover the data exactly)"),
          ("unknown variant", "header names an unknown dtype"),
          ("missing field", "header lacks a field of a tensor"),
          ("invalid UTF-8", "header is not valid JSON"),
          ("invalid JSON", "header is not valid JSON"),
          ("invalid offset", "corrupt tensor offsets"),
          ("invalid shape", "a tensor's shape, dtype and byte size disagree"))


def _bad_file(path: str, err: SafetensorError) -> SafetensorsError:
    msg = str(err)
    hint = next((h for key, h in _HINTS if key in msg), "not a valid safetensors file")
    return SafetensorsError(f"{path}: {hint} ({msg})")


class SafetensorsFile:
    """The tensors of one .safetensors file, memory-mapped and read one at a time."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise SafetensorsError(f"{self.path}: " + ("is a folder, not a safetensors file"
                                                       if os.path.isdir(self.path) else
                                                       "no such file"))
        try:
            self._file = safe_open(self.path, framework="numpy")
        except SafetensorError as e:
            raise _bad_file(self.path, e) from e
        except OSError as e:
            raise SafetensorsError(f"{self.path}: cannot read the file ({e})") from e
        self.metadata = self._file.metadata() or {}
        self._names = self._file.offset_keys()  # file order
        self._known = set(self._names)

    def keys(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._known

    def _check(self, name: str) -> None:
        if name not in self._known:
            raise KeyError(f"tensor {name!r} not in {self.path}")

    def shape(self, name: str) -> tuple[int, ...]:
        self._check(name)
        return tuple(self._file.get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        """One tensor, copied out of the map (a writable array, not a view of the file)."""
        self._check(name)
        try:
            return self._file.get_tensor(name)
        except (SafetensorError, AttributeError, TypeError, ValueError) as e:
            # e.g. F8_E4M3: the library's NumPy back end has no float8 types (AttributeError)
            dtype = self._file.get_slice(name).get_dtype()
            raise SafetensorsError(f"{self.path}: cannot read tensor {name!r} ({dtype}) into "
                                   f"NumPy: {e!r}") from e


def write_safetensors(path: str | os.PathLike,
                      tensors: Iterable[tuple[str, tuple[int, ...], np.dtype]],
                      produce: Callable[[str], np.ndarray],
                      metadata: dict[str, str] | None = None) -> int:
    """Write a safetensors file, producing each tensor only when its bytes are written.

    tensors: (name, shape, dtype) in file order; produce(name) -> array of that shape and dtype.
    Returns the number of data bytes written.
    """
    specs = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in tensors]
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, shape, dtype in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        try:  # the library's dtype code, and its refusal of what safetensors cannot store
            code = TensorSpec(dtype=dtype.name, shape=list(shape), data_ptr=0,
                              data_len=nbytes).dtype
        except SafetensorError as e:
            raise ValueError(f"tensor {name!r}: dtype {dtype} cannot be stored in "
                             "safetensors") from e
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned, as the library's does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, dtype in specs:
            arr = np.asarray(produce(name), order="C")  # not ascontiguousarray: 0-d -> 1-d
            if arr.shape != shape or arr.dtype != dtype:
                raise ValueError(f"tensor {name!r}: produced {arr.shape} {arr.dtype}, "
                                 f"declared {shape} {dtype}")
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            f.write(memoryview(arr.reshape(-1).view(np.uint8)))
            del arr  # before the next one is produced: one tensor in memory at a time
    return offset


def read_index(index_path: str) -> dict[str, str]:
    """model.safetensors.index.json -> {tensor name: file name}."""
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise SafetensorsError(f"{index_path}: cannot read the shard index ({e!r})") from e
    if not isinstance(weight_map, dict):
        raise SafetensorsError(f"{index_path}: weight_map is not an object")
    return weight_map


class CheckpointReader:
    """All tensors of an HF checkpoint folder, single-file or sharded, opened lazily."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = os.fspath(folder)
        index = os.path.join(self.folder, "model.safetensors.index.json")
        single = os.path.join(self.folder, "model.safetensors")
        if os.path.isfile(index):
            self._where = read_index(index)
            for fname in sorted(set(self._where.values())):
                if not os.path.isfile(os.path.join(self.folder, fname)):
                    raise FileNotFoundError(f"{index} names shard {fname!r}, which is missing "
                                            f"from {self.folder}")
        elif os.path.isfile(single):
            self._where = {k: "model.safetensors" for k in SafetensorsFile(single).keys()}
        else:
            raise FileNotFoundError(
                f"no weights in {self.folder}: expected model.safetensors or "
                "model.safetensors.index.json (PyTorch .bin checkpoints are not read; convert "
                "them with transformers' save_pretrained(safe_serialization=True))")
        self._files: dict[str, SafetensorsFile] = {}

    def keys(self) -> list[str]:
        return list(self._where)

    def file_of(self, name: str) -> str:
        return os.path.join(self.folder, self._where[name])

    def _file(self, name: str) -> SafetensorsFile:
        fname = self._where[name]
        if fname not in self._files:
            self._files[fname] = SafetensorsFile(os.path.join(self.folder, fname))
        f = self._files[fname]
        if name not in f:
            raise SafetensorsError(f"the shard index says {name!r} is in {f.path}, but it is not")
        return f

    def shape(self, name: str) -> tuple[int, ...]:
        return self._file(name).shape(name)

    def get(self, name: str) -> np.ndarray:
        return self._file(name).get(name)


def output_folder(out_dir: str | os.PathLike, overwrite: bool) -> str:
    """The absolute path of an export folder (weights, adapters) checked before anything is
    written: not a file, and new, empty, or `overwrite` (then replaced as a whole once the
    export is complete)."""
    out_dir = os.path.abspath(os.fspath(out_dir))
    if os.path.isfile(out_dir):
        raise FileExistsError(f"{out_dir} is a file; give a folder path")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
        raise FileExistsError(f"{out_dir} already exists and is not empty; pass overwrite=True "
                              "(--overwrite) to replace it")
    return out_dir


@contextlib.contextmanager
def staged_folder(out_dir: str):
    """A new temporary sibling of `out_dir` to write an export into; moved into place as
    `out_dir` when the block completes (an existing `out_dir` replaced only then), removed when
    it fails: `out_dir` is either the complete export or untouched."""
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        yield tmp
        if not os.path.exists(out_dir):
            os.rename(tmp, out_dir)
            return
        old = f"{out_dir}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except BaseException:
            os.rename(old, out_dir)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
