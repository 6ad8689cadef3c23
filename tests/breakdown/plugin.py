"""A pytest plugin that records where each test's time goes (tests/conftest.py registers it when
HGPO_JAX_TEST_BREAKDOWN names a file):

    HGPO_JAX_TEST_BREAKDOWN=/tmp/breakdown.jsonl make test
    python tests/breakdown/report.py /tmp/breakdown.jsonl     # the tables of docs/testing.md

Per test phase (setup, call, teardown): its wall time, the xdist worker and start time, and what
recorder.py adds up in this process (JAX trace / lower / compile, persistent-cache hits and
misses, env engines); per fixture: its own set-up time; per Python process a test starts: its
wall time and its own compile totals (tests/breakdown/sitecustomize.py, found through
PYTHONPATH)."""

from __future__ import annotations

import os
import time

import pytest

import recorder

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    path = os.environ.get("PYTHONPATH", "")
    if HERE not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, path) if p)
    recorder.watch_jax_import()
    recorder.hook_envs()


def _phase(item, phase):
    os.environ[recorder.TEST_VAR] = item.nodeid
    recorder.take()
    start, t0 = time.time(), time.perf_counter()
    yield
    recorder.write({"kind": "test", "test": item.nodeid, "phase": phase,
                    "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "start": start,
                    "wall_s": time.perf_counter() - t0, **recorder.take()})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _phase(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    t0 = time.perf_counter()
    yield
    took = time.perf_counter() - t0
    if took > 0.05:
        recorder.write({"kind": "fixture", "fixture": fixturedef.argname,
                        "scope": fixturedef.scope, "test": request.node.nodeid, "wall_s": took})
