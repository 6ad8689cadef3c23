"""Expert trajectories per task, for expert-guided rollouts (Agent-G², docs/envs.md).

    spec = get_env("alfworld")
    experts = spec.expert_trajectories(env_cfg, "train", progress=True)  # {task id: (action, ...)}

Each env records its own expert (its registry entry's `expert_trajectories`) by playing it through
the real engine; only episodes the expert wins count, and a task without one is absent. What the
envs share is here: the on-disk record, an append-only JSON-lines log with one line per task
played (won or not, so a lost game is not played again), each line flushed as soon as its episode
ends, so an interrupted recording continues where it stopped; and the loop that plays the tasks
the log lacks, in this process or in worker processes. The log's file name holds what makes a
recording stale (the recorder's version, and what the env keys its data by), so a changed
recorder or data set starts a new log instead of reusing an old one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hgpo_jax.envs.data import cache_root


def experts_folder(env: str) -> str:
    """Where env `env` keeps its expert logs: `cache_root()/<env>/experts`."""
    return os.path.join(cache_root(), env, "experts")


class ExpertLog:
    """An append-only JSON-lines file of played expert episodes: one object per line, with its
    task's `key` (a str) and the env's fields (at least `won` and `actions`).

    A line is written and flushed in one call, so a process that is killed loses at most the line
    it was writing; that torn tail is skipped when read and sealed by a newline before the next
    append. A key written twice keeps its last line.
    """

    def __init__(self, path: str):
        self.path = path

    def read(self) -> dict[str, dict]:
        """{key: record without its key} of every whole line (none when the file is missing)."""
        if not os.path.isfile(self.path):
            return {}
        out = {}
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                    key = record.pop("key")
                except (ValueError, KeyError, AttributeError, TypeError):
                    continue  # a torn line left by an interrupted write
                out[str(key)] = record
        return out

    def append(self, key: str, record: dict) -> None:
        """Add one line {"key": key, **record} and flush it to the file."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        line = json.dumps({"key": key, **record}) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            if f.tell() > 0 and not self._ends_with_newline():
                line = "\n" + line  # seal a torn last line so it stays one bad line
            f.write(line)
            f.flush()

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"


def chosen_tasks(split_tasks: Sequence, tasks: Sequence | None, env: str, split: str) -> list:
    """`tasks` (all of `split_tasks` when None), each checked to be a task of the split: an
    expert is only recorded for the tasks the env's `list_tasks` gives."""
    if tasks is None:
        return list(split_tasks)
    known = set(split_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise ValueError(f"{env}: {len(unknown)} task(s) are not in split {split!r}, e.g. "
                         f"{unknown[0]!r}; pass task ids from list_tasks(env_cfg, {split!r})")
    return list(tasks)


def record_missing(log: ExpertLog, jobs: dict[str, Any], play: Callable[[Any, Any], dict],
                   make_env: Callable[[], Any], *, workers: int = 1, progress: bool = False,
                   desc: str = "experts") -> dict[str, dict]:
    """{key: record} for every key of `jobs`, playing only those `log` lacks.

    jobs: {log key: what `play` gets (e.g. a game path)}; play(env, job) -> a JSON-able record
    with `won` and `actions`, appended to the log as soon as it returns. make_env: a picklable
    zero-argument factory of the env `play` uses, one per process. workers > 1: that many
    worker processes (spawned, so a parent that runs JAX is safe), each with its own env; `play`
    must then be a module-level function.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    from tqdm.auto import tqdm

    done = log.read()
    missing = [(key, job) for key, job in jobs.items() if key not in done]
    with tqdm(total=len(jobs), initial=len(jobs) - len(missing), desc=desc, unit="task",
              disable=not progress) as bar:
        played = _in_workers if workers > 1 and len(missing) > 1 else _in_process
        for key, record in played(missing, play, make_env, workers):
            log.append(key, record)
            done[key] = record
            bar.update()
    return {key: done[key] for key in jobs}


def _in_process(missing, play, make_env, workers) -> Iterator[tuple[str, dict]]:
    if not missing:
        return
    env = make_env()
    try:
        for key, job in missing:
            yield key, play(env, job)
    finally:
        getattr(env, "close", lambda: None)()


_WORKER_ENV = None  # the env of a worker process (_in_workers)


def _start_worker(make_env) -> None:
    global _WORKER_ENV
    _WORKER_ENV = make_env()


def _play_in_worker(play, job) -> dict:
    return play(_WORKER_ENV, job)


def _in_workers(missing, play, make_env, workers) -> Iterator[tuple[str, dict]]:
    """Records as the workers finish them (any order). On an error, or when the caller stops
    early, the jobs not started are cancelled: nothing runs on after the call."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(min(workers, len(missing)), initializer=_start_worker,
                               initargs=(make_env,), mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_play_in_worker, play, job): key for key, job in missing}
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def won_actions(records: dict[str, dict], tasks: dict[str, Any]) -> dict[Any, tuple[str, ...]]:
    """{task id: the expert's actions} of the won records; tasks: {log key: task id}."""
    return {task: tuple(records[key]["actions"]) for key, task in tasks.items()
            if records[key]["won"]}
