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


def file_sha256(path: str) -> str:
    """The sha256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(archive: str, error: type[Exception] = OSError) -> None:
    """Check `archive` against `archive.sha256` (sha256sum format), if that file exists; raises
    `error` on a mismatch."""
    sums = archive + ".sha256"
    if not os.path.isfile(sums):
        return
    with open(sums, encoding="utf-8") as f:
        expected = f.read().split()[0].lower()
    if file_sha256(archive) != expected:
        raise error(f"{archive} fails its checksum ({sums}): the file is damaged; "
                    "restore it before training")


def is_complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, COMPLETE_MARKER))


def publish_folder(ready: str, final: str) -> None:
    """Put the fully written folder `ready` in place as `final`, atomically: mark it complete,
    remove a `final` left incomplete (an interrupted write), rename. When a concurrent writer
    renamed its complete copy first, that copy is kept (the caller removes `ready`)."""
    open(os.path.join(ready, COMPLETE_MARKER), "w").close()
    if os.path.isdir(final) and not is_complete(final):
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(ready, final)
    except OSError:
        if not is_complete(final):
            raise  # not a concurrent writer that won the race


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
        publish_folder(unpacked, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def required_folder(path: str, folder_name: str, required: tuple[str, ...]) -> str | None:
    """`path` or `path/<folder_name>` if it holds every `required` file, else None."""
    for folder in (path, os.path.join(path, folder_name)):
        if all(os.path.isfile(os.path.join(folder, f)) for f in required):
            return folder
    return None


def resolve_env_data(env: str, archive_name: str, folder_name: str, required: tuple[str, ...],
                     given: tuple[tuple[str | None, str], ...], archive_override: str | None,
                     how_to_get: str, error: type[Exception],
                     find: Callable[[str], str | None] | None = None) -> str:
    """The folder holding an env's data files, looked up the way every env that ships an archive
    does: each (path, what it is) of `given` that is set (an explicit `data_dir`, the env's
    variable) must hold the `required` files (or a `folder_name` folder that does); else the
    complete unpack in `cache_root()/<env>/<folder_name>`; else the project's archive
    (`candidate_archives(env, archive_name, archive_override)`), unpacked there once (`find`:
    the unpacked folder check, default `required_folder`). `how_to_get` is formatted with
    `looked=` the places tried for the `error` raised when nothing holds the data."""
    for path, what in given:
        if path:
            path = os.fspath(path)
            folder = required_folder(path, folder_name, required)
            if folder:
                return folder
            lacking = [f for f in required if not os.path.isfile(os.path.join(path, f))]
            raise error(f"{what}={path!r} lacks {lacking}. " + how_to_get.format(looked=[path]))
    cached = os.path.join(cache_root(), env, folder_name)
    if is_complete(cached):
        return cached
    find = find or (lambda tmp: required_folder(tmp, folder_name, required))
    looked = []
    for archive in candidate_archives(env, archive_name, archive_override):
        if os.path.isfile(archive):
            return unpack_archive(archive, os.path.dirname(cached), folder_name, find, error)
        looked.append(archive)
    raise error(how_to_get.format(looked=looked))
