"""Shared test set-up.

Eight virtual CPU devices are requested before JAX starts so that sharding tests can build
(data, fsdp, tensor) meshes; single-device code runs on device 0 as usual.

The test session compiles with XLA:CPU's cheapest code generation (tests/child_env.py: the same
numbers, a faster compile) and shares one persistent compilation cache (JAX_COMPILATION_CACHE_DIR)
among its xdist workers and the processes the tests start (they inherit the environment), made by
the first process of the session and removed by it at the end, so a program compiled once is
read back elsewhere. Set HGPO_JAX_TEST_JIT_CACHE to a folder to keep the cache between sessions.
With HGPO_JAX_TEST_BREAKDOWN=FILE the session records where each test's time goes
(tests/breakdown/, docs/testing.md).
"""

import os
import shutil
import tempfile

from child_env import xla_flags  # noqa: E402  (tests/ is on sys.path: rootdir conftest)

os.environ["XLA_FLAGS"] = xla_flags(8, os.environ.get("XLA_FLAGS", ""))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_OWN_CACHE = "HGPO_JAX_TEST_JIT_CACHE" not in os.environ  # this process made the session's cache
if _OWN_CACHE:
    os.environ["HGPO_JAX_TEST_JIT_CACHE"] = tempfile.mkdtemp(prefix="hgpo-jax-test-jit-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["HGPO_JAX_TEST_JIT_CACHE"])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import pytest  # noqa: E402


def pytest_configure(config):
    """With HGPO_JAX_TEST_BREAKDOWN=FILE, record where each test's time goes (tests/breakdown)."""
    if os.environ.get("HGPO_JAX_TEST_BREAKDOWN"):
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "breakdown"))
        import plugin

        config.pluginmanager.register(plugin, "hgpo_jax_breakdown")  # its pytest_configure runs


def pytest_sessionfinish(session):
    """The process that made the session's compilation cache removes it."""
    if _OWN_CACHE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(os.environ["HGPO_JAX_TEST_JIT_CACHE"], ignore_errors=True)

from hf_models import TINY_SHAPES, build_hf_model  # noqa: E402


@pytest.fixture(scope="session", params=sorted(TINY_SHAPES))
def hf_model_dir(request, tmp_path_factory):
    """(shape name, folder) of a saved random-weight transformers Qwen2, one per TINY_SHAPES entry."""
    folder = tmp_path_factory.mktemp(f"hf-{request.param}")
    build_hf_model(TINY_SHAPES[request.param], folder)
    return request.param, str(folder)

