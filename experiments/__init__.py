"""The project's studies, comparisons and checks: scripts run as modules from the repository root,
`python -m experiments.<name>` (their results and commands are under docs/results/). Benchmarks
are in `experiments.benchmarks`; the checks against the authors' code (`*_reference.py`) run
their functions beside the project's. `gpu_check.py` also runs by path, on a lent GPU."""
