"""Where env data lives: the cache folder, the project's archives and their atomic unpacking.

Every env that ships data as an archive beside the checkout (`../shared/data/<env>/<name>`) finds
it the same way: an explicit `data_dir`, else the env's variable (`$ALFWORLD_DATA`,
`$WEBSHOP_DATA`), else the archive, checked against its `.sha256` file and unpacked once into
`$HGPO_JAX_CACHE/<env>/` (default `~/.cache/hgpo_jax`). The unpack goes to a temporary sibling
folder, is marked complete and renamed into place, so an interrupted unpack is never used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable

COMPLETE_MARKER = ".complete"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cache_root() -> str:
    """`$HGPO_JAX_CACHE`, else `$XDG_CACHE_HOME/hgpo_jax`, else `~/.cache/hgpo_jax`."""
    return os.environ.get("HGPO_JAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hgpo_jax")


def candidate_archives(env: str, name: str, override: str | None = None) -> list[str]:
    """Where the project's archive `shared/data/<env>/<name>` may be: `override` (a path from an
    environment variable) first, then beside and inside the checkout and the working folder."""
    found = [override] if override else []
    for base in (os.path.dirname(_REPO), _REPO, os.path.dirname(os.getcwd()), os.getcwd()):
        found.append(os.path.join(base, "shared", "data", env, name))
    return list(dict.fromkeys(found))


def verify_sha256(archive: str, error: type[Exception] = OSError) -> None:
    """Check `archive` against `archive.sha256` (sha256sum format), if that file exists; raises
    `error` on a mismatch."""
    sums = archive + ".sha256"
    if not os.path.isfile(sums):
        return
    with open(sums, encoding="utf-8") as f:
        expected = f.read().split()[0].lower()
    digest = hashlib.sha256()
    with open(archive, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise error(f"{archive} fails its checksum ({sums}): the file is damaged; "
                    "restore it before training")


def is_complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, COMPLETE_MARKER))


def unpack_archive(archive: str, dest_root: str, folder: str,
                   find: Callable[[str], str | None], error: type[Exception] = OSError) -> str:
    """Unpack `archive` into `dest_root/folder` once, atomically; returns that folder.

    find: given the temporary extraction folder, the folder inside it that holds the data (None:
    the archive is not the expected one, `error` is raised). A complete earlier unpack is reused;
    a half-unpacked one (an interrupted run) is removed and redone.
    """
    final = os.path.join(dest_root, folder)
    if is_complete(final):
        return final
    verify_sha256(archive, error)
    os.makedirs(dest_root, exist_ok=True)
    tmp = os.path.join(dest_root, f".unpack-{uuid.uuid4().hex[:8]}")
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(tmp, filter="data")
        unpacked = find(tmp)
        if unpacked is None:
            raise error(f"{archive} does not contain the expected data ({folder})")
        open(os.path.join(unpacked, COMPLETE_MARKER), "w").close()
        if os.path.isdir(final) and not is_complete(final):
            shutil.rmtree(final)  # left by an interrupted unpack of an older version
        try:
            os.rename(unpacked, final)
        except OSError:
            if not is_complete(final):
                raise  # not a concurrent unpack that won the race
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
