"""Loaded at start-up by every Python process the test session starts while a time breakdown is
asked for (tests/breakdown/plugin.py puts this folder first on PYTHONPATH): the process records
its own wall time and JAX compilation times, attributed to the test that started it."""

import os

if os.environ.get("HGPO_JAX_TEST_BREAKDOWN"):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import recorder

    recorder.start_child(worker="--multiprocessing-fork" in sys.argv)
