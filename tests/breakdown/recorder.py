"""Where a test's time goes: JAX tracing, lowering and compiling (with the persistent cache's hits
and misses), environment engines, and the Python processes a test starts. One JSON line per test
phase (and one per child process) appended to the file named by HGPO_JAX_TEST_BREAKDOWN; read by
tests/breakdown/report.py. Imported only when that variable is set; nothing here changes what a
test computes (it wraps a few functions with timers and listens to jax.monitoring)."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import sys
import time

EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
          "/jax/core/compile/backend_compile_duration": "compile_s",
          "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read_s"}
COUNTS = {"/jax/compilation_cache/cache_hits": "cache_hits",
          "/jax/compilation_cache/cache_misses": "cache_misses"}
TEST_VAR = "HGPO_JAX_TEST_BREAKDOWN_TEST"  # the nodeid of the test running (children inherit it)

totals: dict[str, float] = {}
_jax_hooked = False
_env_depth = 0


def add(key: str, value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value


def take() -> dict[str, float]:
    """The totals since the last call, cleared."""
    out = dict(totals)
    totals.clear()
    return out


def write(record: dict) -> None:
    path = os.environ["HGPO_JAX_TEST_BREAKDOWN"]
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def hook_jax() -> None:
    """Listen to jax.monitoring once JAX is imported (never imports it itself)."""
    global _jax_hooked
    if _jax_hooked or "jax" not in sys.modules:
        return
    from jax import monitoring

    def duration(event, secs, **kw):
        if event in EVENTS:
            add(EVENTS[event], secs)

    def count(event, **kw):
        if event in COUNTS:
            add(COUNTS[event], 1)

    monitoring.register_event_duration_secs_listener(duration)
    monitoring.register_event_listener(count)
    _jax_hooked = True


class _ImportWatch:
    """A meta-path finder that lets the real finders find `jax`, then hooks the listeners right
    after the package has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax" or _jax_hooked:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            hook_jax()

        spec.loader.exec_module = exec_module
        return spec


def watch_jax_import() -> None:
    if "jax" in sys.modules:
        hook_jax()
    else:
        sys.meta_path.insert(0, _ImportWatch())


def timed(owner, name: str, key: str) -> None:
    """Wrap owner.name so its wall time adds to `key` (outermost call only: an env step inside a
    pool call is not counted twice)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        global _env_depth
        if _env_depth:
            return original(*args, **kwargs)
        _env_depth += 1
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _env_depth -= 1
            add(key, time.perf_counter() - t0)

    wrapper.__wrapped__ = original
    setattr(owner, name, wrapper)


def hook_envs() -> None:
    """Time the env engines and the worker pool (imports the env modules, never JAX)."""
    from hgpo_jax.envs import alfworld, pool, toy
    from hgpo_jax.envs.webshop import env as webshop

    timed(pool.EnvPool, "__init__", "env_s")
    for method in ("reset", "step", "close"):
        timed(pool.EnvPool, method, "env_s")
    for cls in (alfworld.AlfworldEnv, webshop.WebShopEnv):
        for method in ("reset", "step"):
            timed(cls, method, "env_s")
    del toy


def start_child(worker: bool) -> None:
    """In a child process: at exit, one record of its wall time and compile totals (`worker`: a
    multiprocessing worker, an env pool's say, whose time its parent's env time counts)."""
    t0 = time.perf_counter()
    watch_jax_import()

    def report():
        write({"kind": "worker" if worker else "child", "test": os.environ.get(TEST_VAR, ""), "pid": os.getpid(),
               "argv": sys.argv[:4], "wall_s": time.perf_counter() - t0, **take()})

    atexit.register(report)
