"""Benchmarks: each prints its speed as a ratio against a baseline measured in the same run
(`python -m experiments.benchmarks.<name>`), never a timed assertion; `tests/test_benchmarks.py`
and others run each once at a minimal size. `probe_decode` measures the sampler's decode on a
device; `bench_common` holds what several share."""
