"""Where the WebShop data lives and how it is read.

Lookup order: `env.data_dir` (the `data_dir` argument), else `$WEBSHOP_DATA`, else the project's small set
(`../shared/data/webshop/webshop-small-v1.tar.xz`, or `$HGPO_JAX_WEBSHOP_ARCHIVE`), checked against
its sha256 and unpacked once, atomically, into `$HGPO_JAX_CACHE/webshop/` (hgpo_jax.envs.data).

A data folder holds the files of WebShop's "small" mode, the one verl-agent trains on:
`items_shuffle_1000.json` (products), `items_ins_v2_1000.json` (attributes and instructions) and
`name_nouns_en_core_web_sm_3.8.0.json` (the reward's noun tokens of each product name, so spaCy
is not needed), plus, optionally, the golden outputs of the original env
(`webshop_golden_env.json`, `lucene_top50.jsonl`) that the tests compare against.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

from hgpo_jax.envs import data

ARCHIVE_NAME = "webshop-small-v1.tar.xz"
DATA_FOLDER = "webshop-small"
PRODUCTS_FILE = "items_shuffle_1000.json"
ATTRIBUTES_FILE = "items_ins_v2_1000.json"
NOUNS_FILE = "name_nouns_en_core_web_sm_3.8.0.json"
GOLDEN_FILE = "webshop_golden_env.json"
LUCENE_FILE = "lucene_top50.jsonl"
REQUIRED_FILES = (PRODUCTS_FILE, ATTRIBUTES_FILE, NOUNS_FILE)

_HOW_TO_GET_DATA = (
    "WebShop data not found. Set env.data_dir=/path to a folder "
    f"holding {', '.join(REQUIRED_FILES)}, set $WEBSHOP_DATA, or put the project's archive "
    f"shared/data/webshop/{ARCHIVE_NAME} beside the checkout (or point "
    "$HGPO_JAX_WEBSHOP_ARCHIVE at it). Looked in: {looked}")


class WebShopDataError(FileNotFoundError):
    """The WebShop data cannot be found or is damaged."""


def _data_folder(path: str) -> str | None:
    """`path` or `path/webshop-small` if it holds the required files, else None."""
    return data.required_folder(path, DATA_FOLDER, REQUIRED_FILES)


def unpack_archive(archive: str, dest_root: str) -> str:
    """Unpack the small-set archive into `dest_root/webshop-small` once, atomically."""
    return data.unpack_archive(archive, dest_root, DATA_FOLDER, _data_folder, WebShopDataError)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> str:
    """The folder holding the WebShop files (see the module docstring for the lookup order)."""
    return data.resolve_env_data(
        "webshop", ARCHIVE_NAME, DATA_FOLDER, REQUIRED_FILES,
        ((data_dir, "env.data_dir"), (os.environ.get("WEBSHOP_DATA"), "$WEBSHOP_DATA")),
        os.environ.get("HGPO_JAX_WEBSHOP_ARCHIVE"), _HOW_TO_GET_DATA, WebShopDataError)


@lru_cache(maxsize=8)
def data_digest(folder: str) -> str:
    """The first 16 hex digits of a sha256 over the files the env reads (REQUIRED_FILES, in that
    order): the identity of a data set, which recordings made from it are keyed by."""
    import hashlib

    digest = hashlib.sha256()
    for name in REQUIRED_FILES:
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


@lru_cache(maxsize=8)
def _read_json_cached(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_data_json(folder: str, name: str):
    """A JSON file of the data folder (cached per process: treat the result as read-only)."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise WebShopDataError(f"{path} is missing; the WebShop data folder {folder} is incomplete")
    return _read_json_cached(path)


def read_lucene_top50(folder: str) -> list[dict]:
    """The golden search results: [{'set', 'query', 'asins', 'scores'}] (lucene_top50.jsonl)."""
    path = os.path.join(folder, LUCENE_FILE)
    if not os.path.isfile(path):
        raise WebShopDataError(f"{path} is missing (the golden search results ship with the "
                               "project's small-set archive only)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
