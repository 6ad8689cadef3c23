"""`EnvPool`: M environments in P worker processes, stepped as a batch, with fault isolation.

    from hgpo_jax.envs.pool import EnvPool
    with EnvPool(functools.partial(ToyMemoryEnv, max_steps=50), num_envs=16, num_workers=4,
                 step_timeout=60.0, reset_timeout=120.0) as pool:
        replies = pool.reset(tasks)                        # len(tasks) == 16 -> list[EnvReply] (16)
        while pool.running:
            replies = pool.step({i: policy(replies[i]) for i in pool.running})  # {i: EnvReply}

Layout. Env i lives in worker `i % P` (round-robin, so the N envs of a group, which are adjacent
and share a task, are spread over the workers). Workers run in parallel; each steps its own envs
one after the other and sends one reply per env as soon as that env is done, so the parent applies
the timeout per env step (the deadline restarts after every reply of that worker) and knows which
env hung. The parent waits on all workers at once (`multiprocessing.connection.wait`).

Failures (the reply is `failed=True, done=True`, with an `error` text; the episode is lost and
must be excluded from training; `stats` counts it):
- an exception raised by the env's code (`reset` or `step`): the worker survives; the reply's
  error is the exception's last traceback line; that env is broken (stepping it raises
  ValueError) until the next `reset`, which re-creates the env object in the worker.
- a step (or reset) that exceeds its timeout: the worker is killed (SIGTERM, then SIGKILL after a
  short grace) and replaced by a fresh one; the env being stepped is failed.
- a worker that dies (segfault, OOM killer, `kill -9`): replaced the same way. If it died while
  working on the batch, the env it was stepping is failed; if it died while idle (it had not yet
  acknowledged the batch), no env is to blame.
- Replay restore: the other envs of a replaced worker do not lose their state. The pool records,
  per env, the task and every action since the last reset; on the fresh worker each running env is
  re-created, `reset(task)` and its actions are replayed (envs must be deterministic; ALFWorld
  and the toy env are). The observation after the replay must equal the last one the pool handed
  out, else the env is failed ("restore diverged"). Envs of that worker whose step in this batch
  was not done yet are restored and then stepped, in the same batch. A restore that raises, times
  out (limit: `reset_timeout + step_timeout * (len(history) + 1)`) or diverges fails that env.
  An env that fails this way although it was not in the batch is still reported: `step` returns
  an entry for it too (`failed=True`), so a caller that iterates the returned dict sees it.

Shutdown: workers are daemon processes that ignore SIGINT (the parent owns Ctrl-C), exit when
their pipe closes or their parent dies, and close their envs on the way out. `close()` asks
politely, then terminates and kills stragglers and joins them; it is idempotent, runs at
interpreter exit (atexit) for every pool still open, and best effort from `__del__`. A
KeyboardInterrupt (or any exception) inside `step`/`reset` kills the workers that were busy,
marks their envs failed ("interrupted") and re-raises; the pool stays closable (and usable after
a `reset`).

Actions must be `str` (anything else raises TypeError rather than being silently `str()`-ed: a
None or a list there is a caller bug). Tasks and env replies must be picklable. Not thread-safe.
No jax / torch imports here: workers only import this module and the env's.
"""

from __future__ import annotations

import atexit
import dataclasses
import multiprocessing as mp
import operator
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import wait as _wait_connections
from typing import Any

__all__ = ["EnvPool", "EnvReply", "PoolStats", "assign_round_robin"]

_LARGE_MESSAGE = 32 * 1024  # bytes; bigger messages are sent from a thread with a time limit
_KILL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL
_WATCHDOG_PERIOD = 0.5  # seconds between a worker's checks that its parent is alive


# ---------------------------------------------------------------------------------------- public
@dataclasses.dataclass(frozen=True)
class EnvReply:
    """One env's answer to a reset or a step.

    obs: the observation text; reward: float (0.0 for a reset); done: the episode is over (also
    True when failed); info: the env's info dict ({} when failed); failed: the episode was lost
    (timeout, worker death, env exception, failed restore) and must not be trained on;
    error: why it failed (None otherwise).
    """

    obs: str
    reward: float
    done: bool
    info: dict
    failed: bool = False
    error: str | None = None
    # a reset's: the (action, EnvReply) turns a wrapper of the pool played in the env before
    # handing it over (a guided rollout's replayed expert prefix); () from the pool itself
    prior: tuple = ()


@dataclasses.dataclass
class PoolStats:
    """Counters since the pool was created (`EnvPool.stats`); `as_dict()` for logging."""

    resets: int = 0  # env resets requested
    steps: int = 0  # env steps requested
    worker_restarts: int = 0  # fresh workers started to replace killed / dead ones
    timeouts: int = 0  # env resets / steps / restores that exceeded their time limit
    worker_deaths: int = 0  # workers found dead (not killed by the pool for a timeout)
    env_exceptions: int = 0  # exceptions raised by env code (reset / step / replay)
    failed_episodes: int = 0  # episodes marked failed, for any reason
    restored_envs: int = 0  # envs moved to a fresh worker by replay, successfully
    restore_failures: int = 0  # envs whose replay raised, timed out or diverged
    interrupts: int = 0  # step / reset calls aborted by an exception (e.g. KeyboardInterrupt)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def assign_round_robin(num_envs: int, num_workers: int) -> list[list[int]]:
    """Env indices of each worker: worker w gets envs w, w + P, w + 2P, ... (P = num_workers)."""
    return [list(range(w, num_envs, num_workers)) for w in range(num_workers)]


def restore_timeout(reset_timeout: float, step_timeout: float, num_actions: int) -> float:
    """Time limit of a replay restore: one reset plus `num_actions` steps."""
    return reset_timeout + step_timeout * num_actions


# ---------------------------------------------------------------------------------------- worker
# Jobs (parent -> worker, a list per message; None asks the worker to exit):
#   ("reset", env, task)                      -> ("ok", env, (obs, 0.0, False, info))
#   ("step", env, action)                     -> ("ok", env, (obs, reward, done, info))
#   ("restore", env, task, history, action)   -> ("ok", env, (check_obs, (obs, reward, done, info)))
#        reset(task), replay `history`; check_obs is the observation after the replay; then step
#        `action` if it is not None (else the result is the replay's last one).
# Any exception -> ("error", env, "<what> raised <last traceback line>"). Before running a message's
# jobs the worker sends ("ack",), so the parent knows whether a dead worker had started on them.


def _exception_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def _result(obs, reward, done, info) -> tuple[str, float, bool, dict]:
    return obs, float(reward), bool(done), dict(info)


def _run_job(envs: dict, env_fn: Callable, job: tuple) -> tuple:
    """Run one job on the worker's envs ({env index: env}); never raises (bar BaseException)."""
    kind, index = job[0], job[1]
    what = "env_fn()"
    try:
        if kind == "step":
            env = envs.get(index)
            if env is None:
                raise RuntimeError(f"env {index} is not alive in this worker (reset it first)")
            what = "env.step"
            return ("ok", index, _result(*env.step(job[2])))
        # reset / restore: a fresh env object for a restore or after a failure, else reuse
        env = envs.get(index)
        if env is None:
            env = envs[index] = env_fn()
        what = "env.reset"
        obs, info = env.reset(job[2])
        result = _result(obs, 0.0, False, info)
        if kind == "reset":
            return ("ok", index, result)
        what = "env.step (replay)"
        for action in job[3]:
            result = _result(*env.step(action))
        check_obs = result[0]
        if job[4] is not None:
            what = "env.step"
            result = _result(*env.step(job[4]))
        return ("ok", index, (check_obs, result))
    except Exception as exc:  # noqa: BLE001 - env code may raise anything; the worker survives
        broken = envs.pop(index, None)
        if broken is not None:
            try:
                broken.close()
            except Exception:  # noqa: BLE001
                pass
        return ("error", index, f"{what} raised {_exception_line(exc)}")


def _watch_parent(parent_pid: int) -> None:
    """Worker-side thread: exit the worker if its parent process is gone (e.g. SIGKILLed)."""
    while True:
        time.sleep(_WATCHDOG_PERIOD)
        if os.getppid() != parent_pid:
            os._exit(1)


def _worker_main(conn, env_fn: Callable, parent_pid: int) -> None:
    """Worker process: receive job lists, reply one message per job, until None or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the parent
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    envs: dict[int, Any] = {}
    try:
        while True:
            try:
                jobs = conn.recv()
            except (EOFError, OSError):
                break
            if jobs is None:
                break
            try:
                conn.send(("ack",))
            except (EOFError, OSError):
                return
            for job in jobs:
                reply = _run_job(envs, env_fn, job)
                try:
                    conn.send(reply)
                except (EOFError, OSError):
                    return
                except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable info dict
                    envs.pop(job[1], None)
                    conn.send(("error", job[1], f"reply could not be sent: {_exception_line(exc)}"))
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass


# ---------------------------------------------------------------------------------------- parent
_LIVE_POOLS: "weakref.WeakSet[EnvPool]" = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


@dataclasses.dataclass
class _EnvState:
    """Parent-side record of one env. status: new | pending | running | done | failed."""

    status: str = "new"
    task: Any = None
    history: list = dataclasses.field(default_factory=list)  # actions since the last reset
    last_obs: str | None = None
    error: str | None = None


@dataclasses.dataclass
class _Job:
    """A job in flight: `msg` is what the worker gets; report: the caller asked for this env."""

    msg: tuple
    timeout: float
    report: bool

    @property
    def env(self) -> int:
        return self.msg[1]


class _Worker:
    """A worker process and the parent's end of its pipe."""

    def __init__(self, ctx, env_fn, slot: int):
        self.slot = slot
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child_conn, env_fn, os.getpid()),
                                name=f"EnvPool-worker-{slot}", daemon=True)
        self.proc.start()
        child_conn.close()  # the child's end lives in the child only: its death gives us EOF
        self.has_replied = False  # sent anything yet (a fresh worker may still be starting)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, payload: bytes, timeout: float) -> bool:
        """Send pickled jobs; False if the worker is dead or does not read within `timeout`."""
        try:
            if len(payload) <= _LARGE_MESSAGE:  # fits in the (empty) socket buffer: never blocks
                self.conn.send_bytes(payload)
                return True
            errors: list = []

            def _send():
                try:
                    self.conn.send_bytes(payload)
                except Exception as exc:  # noqa: BLE001
                    errors.append(exc)

            thread = threading.Thread(target=_send, daemon=True)
            thread.start()
            thread.join(timeout)
            return not thread.is_alive() and not errors
        except (OSError, EOFError, ValueError):
            return False

    def kill(self, grace: float = _KILL_GRACE, wait_first: float = 0.0) -> int | None:
        """Wait `wait_first` s for it to exit by itself, then SIGTERM, SIGKILL after `grace` s,
        join; returns the exit code."""
        try:
            if wait_first > 0:
                self.proc.join(wait_first)
            if self.proc.exitcode is None:
                self.proc.terminate()
                self.proc.join(grace)
                if self.proc.exitcode is None:
                    self.proc.kill()
                    self.proc.join(5.0)
        except (OSError, ValueError, AssertionError):
            pass
        self.close_conn()
        return self.proc.exitcode

    def close_conn(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass


@dataclasses.dataclass
class _Flight:
    """A worker's jobs in flight during one batch."""

    queue: deque
    deadline: float
    acked: bool = False


class EnvPool:
    """M envs in P worker processes, stepped as a batch. See the module docstring.

    Args:
      env_fn: picklable zero-argument callable returning an env (`hgpo_jax.envs.base.Env`),
        e.g. `functools.partial(ToyMemoryEnv, max_steps=50)`. Called in the workers.
      num_envs: M >= 1.
      num_workers: P >= 1; min(P, M) workers are started.
      step_timeout: seconds one env step may take.
      reset_timeout: seconds one env reset may take (also the base of a restore's limit).
      start_timeout: extra seconds granted to the first reply of a freshly started worker
        (interpreter start-up and imports).
    """

    def __init__(self, env_fn: Callable[[], Any], num_envs: int, num_workers: int = 1,
                 step_timeout: float = 60.0, reset_timeout: float = 120.0,
                 start_timeout: float = 60.0):
        if not callable(env_fn):
            raise TypeError(f"env_fn must be a zero-argument callable, got {env_fn!r}")
        num_envs = _positive_int(num_envs, "num_envs")
        num_workers = _positive_int(num_workers, "num_workers")
        for name, value in (("step_timeout", step_timeout), ("reset_timeout", reset_timeout),
                            ("start_timeout", start_timeout)):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        try:
            pickle.dumps(env_fn)
        except Exception as exc:
            raise TypeError(f"env_fn must be picklable (worker processes are spawned): "
                            f"{_exception_line(exc)}; use a module-level class or function, or "
                            f"functools.partial of one, not a lambda or a local function") from exc
        self.num_envs = num_envs
        self.num_workers = min(num_workers, num_envs)
        self.step_timeout = float(step_timeout)
        self.reset_timeout = float(reset_timeout)
        self.start_timeout = float(start_timeout)
        self.stats = PoolStats()
        self._env_fn = env_fn
        self._ctx = mp.get_context("spawn")
        self._assignment = assign_round_robin(num_envs, self.num_workers)
        self._slot_of = [i % self.num_workers for i in range(num_envs)]
        self._envs = [_EnvState() for _ in range(num_envs)]
        self._closed = False
        self._workers: list[_Worker | None] = [None] * self.num_workers
        self._started: list[_Worker] = []  # every worker not yet known to be joined (for close)
        _LIVE_POOLS.add(self)
        try:
            for slot in range(self.num_workers):
                self._worker(slot, restart=False)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------ public API
    @property
    def worker_pids(self) -> list[int | None]:
        """Pid of each worker slot's current process (None for a slot whose worker was lost)."""
        return [w.pid if w is not None else None for w in self._workers]

    @property
    def running(self) -> list[int]:
        """Indices of the envs that can be stepped now (reset, not done, not failed)."""
        return [i for i, e in enumerate(self._envs) if e.status == "running"]

    def worker_of(self, index: int) -> int:
        """The worker slot of env `index`."""
        return self._slot_of[self._check_index(index)]

    def reset(self, tasks: Sequence[Any]) -> list[EnvReply]:
        """Start a new episode in the first len(tasks) envs: env i gets `tasks[i]`
        (1 <= len(tasks) <= num_envs). The envs past them are left idle: not steppable until a
        later reset gives them a task (an evaluation's last, smaller chunk plays only its games).

        Returns a list of len(tasks) EnvReply (reward 0.0). Clears the action histories and makes
        the reset envs steppable again, whatever happened before (failed envs are re-created).
        """
        self._check_open()
        if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
            raise TypeError(f"tasks must be a sequence of at most {self.num_envs} tasks, got "
                            f"{type(tasks)}")
        if not 1 <= len(tasks) <= self.num_envs:
            raise ValueError(f"reset needs one task per env, for 1 to {self.num_envs} envs: got "
                             f"{len(tasks)} tasks")
        try:
            pickle.dumps(list(tasks))
        except Exception as exc:
            raise TypeError(f"tasks must be picklable: {_exception_line(exc)}") from exc
        jobs = {i: _Job(("reset", i, task), self.reset_timeout, True)
                for i, task in enumerate(tasks)}
        for i in range(self.num_envs):
            self._envs[i] = _EnvState(status="pending", task=tasks[i]) if i < len(tasks) else _EnvState()
        self.stats.resets += len(tasks)
        results = self._run_batch(jobs)
        return [results[i] for i in range(len(tasks))]

    def step(self, actions: Mapping[int, str]) -> dict[int, EnvReply]:
        """Step the given envs, {env index: action str}; the others are left alone.

        Returns {env index: EnvReply} for every given env, plus an entry (failed=True) for any
        other env that was lost during this call (its worker was replaced and its replay failed).
        Raises ValueError for an unknown index or an env that is not running (never reset, done,
        or failed: call `reset`), TypeError for a non-str action.
        """
        self._check_open()
        if not isinstance(actions, Mapping):
            raise TypeError(f"step takes a mapping {{env index: action str}}, got {type(actions)}")
        jobs = {}
        for index, action in actions.items():
            index = self._check_index(index)
            if not isinstance(action, str):
                raise TypeError(f"action for env {index} must be a str, got {type(action).__name__}"
                                f": {action!r:.80}")
            state = self._envs[index]
            if state.status != "running":
                why = {"new": "it was never reset", "done": "its episode is done",
                       "failed": f"its episode failed ({state.error})",
                       "pending": "its last reset did not finish"}[state.status]
                raise ValueError(f"cannot step env {index}: {why}; call reset() first")
            jobs[index] = _Job(("step", index, action), self.step_timeout, True)
        self.stats.steps += len(jobs)
        return self._run_batch(jobs) if jobs else {}

    def close(self) -> None:
        """Stop every worker (politely, then SIGTERM / SIGKILL) and join them. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        _LIVE_POOLS.discard(self)
        workers = list(getattr(self, "_started", []))
        self._workers = [None] * len(self._workers)
        bye = pickle.dumps(None)
        for w in workers:
            try:
                w.conn.send_bytes(bye)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + _KILL_GRACE
        for w in workers:
            try:
                w.proc.join(max(0.0, deadline - time.monotonic()))
            except (OSError, ValueError, AssertionError):
                pass
        for w in workers:
            w.kill()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort (e.g. at interpreter shutdown)
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.running)} running"
        return (f"EnvPool(num_envs={self.num_envs}, num_workers={self.num_workers}, {state}, "
                f"step_timeout={self.step_timeout}, reset_timeout={self.reset_timeout})")

    # ------------------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this EnvPool is closed")

    def _check_index(self, index) -> int:
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"env index must be an int, got {type(index).__name__}") from None
        if isinstance(index, bool) or not 0 <= i < self.num_envs:
            raise ValueError(f"unknown env index {index!r}: the pool has envs "
                             f"0..{self.num_envs - 1}")
        return i

    def _worker(self, slot: int, restart: bool = True) -> _Worker:
        """The slot's worker; a fresh one if it has none (counted as a restart if `restart`)."""
        w = self._workers[slot]
        if w is None:
            self._started = [old for old in self._started if old.proc.exitcode is None]
            w = _Worker(self._ctx, self._env_fn, slot)
            self._started.append(w)
            self._workers[slot] = w
            self.stats.worker_restarts += restart
        return w

    def _run_batch(self, jobs: dict[int, _Job]) -> dict[int, EnvReply]:
        """Send the jobs to their workers and collect one EnvReply per reported env."""
        by_slot: dict[int, list[_Job]] = {}
        for index in sorted(jobs):
            by_slot.setdefault(self._slot_of[index], []).append(jobs[index])
        results: dict[int, EnvReply] = {}
        flights: dict[int, _Flight] = {}
        try:
            for slot, slot_jobs in by_slot.items():
                self._dispatch(slot, slot_jobs, flights, results)
            while flights:
                self._collect(flights, results)
        except BaseException:
            self._abort(flights)
            raise
        return results

    def _dispatch(self, slot: int, jobs: list[_Job], flights: dict, results: dict) -> None:
        """Send `jobs` to the slot's worker (starting one if needed) and register the flight."""
        while jobs:
            w = self._worker(slot)
            payload = pickle.dumps([job.msg for job in jobs], protocol=pickle.HIGHEST_PROTOCOL)
            extra = 0.0 if w.has_replied else self.start_timeout
            if w.send(payload, self.reset_timeout + extra):
                flights[slot] = _Flight(deque(jobs), time.monotonic() + jobs[0].timeout + extra)
                return
            # dead before it got the jobs (killed while idle) or not reading: no env to blame
            jobs = self._replace(slot, jobs, None, "died", results)

    def _collect(self, flights: dict, results: dict) -> None:
        """Wait for the next reply of any worker (or a deadline) and handle it."""
        now = time.monotonic()
        for slot in [s for s, f in flights.items() if f.deadline <= now]:
            flight = flights.pop(slot)
            culprit = flight.queue[0] if flight.acked else None
            jobs = self._replace(slot, list(flight.queue), culprit, "timeout", results)
            if jobs:
                self._dispatch(slot, jobs, flights, results)
        if not flights:
            return
        conns = {self._workers[slot].conn: slot for slot in flights}
        timeout = max(0.0, min(f.deadline for f in flights.values()) - time.monotonic())
        for conn in _wait_connections(list(conns), timeout):
            slot = conns[conn]
            # handle every message already waiting on this pipe (fewer wait() calls)
            while self._receive(slot, flights, results) and conn.poll():
                pass

    def _receive(self, slot: int, flights: dict, results: dict) -> bool:
        """Receive and handle one message of the slot's worker; False once its flight is over."""
        flight = flights[slot]
        try:
            msg = self._workers[slot].conn.recv()
        except (EOFError, OSError):
            flights.pop(slot)
            culprit = flight.queue[0] if flight.acked else None
            jobs = self._replace(slot, list(flight.queue), culprit, "died", results)
            if jobs:
                self._dispatch(slot, jobs, flights, results)
            return False
        self._workers[slot].has_replied = True
        if msg[0] == "ack":  # the worker starts on the jobs now (start-up time is over)
            flight.acked = True
            flight.deadline = time.monotonic() + flight.queue[0].timeout
            return True
        job = flight.queue.popleft()
        assert msg[1] == job.env, f"worker {slot} replied for env {msg[1]}, expected {job.env}"
        self._apply(job, msg, results)
        if flight.queue:
            flight.deadline = time.monotonic() + flight.queue[0].timeout
            return True
        flights.pop(slot)
        return False

    def _apply(self, job: _Job, msg: tuple, results: dict) -> None:
        """Record a worker's reply to `job` in the env's state and, if reported, in results."""
        index, state = job.env, self._envs[job.env]
        kind = job.msg[0]
        if msg[0] == "error":
            self.stats.env_exceptions += 1
            if kind == "restore":
                self.stats.restore_failures += 1
            self._fail(index, msg[2], results)
            return
        if kind == "restore":
            check_obs, result = msg[2]
            if check_obs != state.last_obs:
                self.stats.restore_failures += 1
                self._fail(index, "restore diverged: replaying the env's actions on a fresh "
                                  "worker gave a different observation (is the env deterministic?)",
                           results)
                return
            self.stats.restored_envs += 1
        else:
            result = msg[2]
        action = {"step": 2, "restore": 4}.get(kind)
        action = job.msg[action] if action is not None else None
        if action is not None:
            state.history.append(action)
        obs, reward, done, info = result
        state.last_obs = obs
        state.status = "done" if done else "running"
        if job.report:
            results[index] = EnvReply(obs, reward, done, info)

    def _fail(self, index: int, error: str, results: dict) -> None:
        state = self._envs[index]
        if state.status != "failed":
            self.stats.failed_episodes += 1
        state.status, state.error = "failed", error
        results[index] = EnvReply("", 0.0, True, {}, failed=True, error=error)

    def _replace(self, slot: int, queue: list[_Job], culprit: _Job | None, reason: str,
                 results: dict) -> list[_Job]:
        """Kill the slot's worker, fail the culprit, return the jobs for a fresh worker.

        culprit: the job the worker was on when it hung or died; None when it had not yet
        acknowledged the batch. A worker that never replied at all fails every job (its
        replacement would most likely fail the same way). Otherwise the returned jobs restore
        every other running env of the slot by replay (those with a job in `queue` also redo
        that job), in env order; `_dispatch` starts the fresh worker.
        """
        old = self._workers[slot]
        # a closed pipe means the process is exiting: let it, to report its real exit code
        exitcode = old.kill(wait_first=0.5 if reason == "died" else 0.0) if old else None
        self._workers[slot] = None
        never_started = old is not None and not old.has_replied
        if reason == "timeout":
            self.stats.timeouts += 1
        else:
            self.stats.worker_deaths += 1
        if culprit is not None:
            what = {"reset": "reset", "step": "step", "restore": "restore"}[culprit.msg[0]]
            if reason == "timeout":
                error = f"{what} timed out after {culprit.timeout:.1f}s; worker {slot} was replaced"
            else:
                error = f"worker process died (exit code {exitcode}) during {what}"
            if culprit.msg[0] == "restore":
                self.stats.restore_failures += 1
            self._fail(culprit.env, error, results)
        elif never_started:
            # a fresh worker that never said anything will not do better next time
            why = ("did not start in time" if reason == "timeout"
                   else f"died before starting (exit code {exitcode})")
            for job in queue:
                if job.msg[0] == "restore":
                    self.stats.restore_failures += 1
                self._fail(job.env, f"worker process {why}; check that env_fn can be unpickled "
                                    f"and called in a fresh process", results)
            return []
        pending = {job.env: job for job in queue if job is not culprit}
        jobs = []
        for index in self._assignment[slot]:
            state = self._envs[index]
            if index in pending:
                job = pending[index]
                if job.msg[0] == "step":  # restore, then take the step
                    job = self._restore_job(index, job.msg[2], report=True)
                jobs.append(job)
            elif state.status == "running":  # alive on the old worker, not in this batch
                jobs.append(self._restore_job(index, None, report=False))
        return jobs

    def _restore_job(self, index: int, action: str | None, report: bool) -> _Job:
        state = self._envs[index]
        n = len(state.history) + (action is not None)
        return _Job(("restore", index, state.task, list(state.history), action),
                    restore_timeout(self.reset_timeout, self.step_timeout, n), report)

    def _abort(self, flights: dict) -> None:
        """After an exception mid-batch: kill the busy workers, fail their envs, count it."""
        self.stats.interrupts += 1
        for slot in list(flights):
            w = self._workers[slot]
            if w is not None:
                w.kill(grace=0.2)
            self._workers[slot] = None
            for index in self._assignment[slot]:
                if self._envs[index].status in ("running", "pending"):
                    self._fail(index, "interrupted: the batch was aborted and its worker killed",
                               {})
        flights.clear()


def _positive_int(value, name: str) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if isinstance(value, bool) or v < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return v
