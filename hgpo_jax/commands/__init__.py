"""The bodies of the `hgpo-jax` commands, one module each (`hgpo_jax.cli` holds the parser and
the dispatch): `train`, `eval`, `sft`, `export`, `plan` and `demo`, and what several of them
share: `common` (the config of a command, joining a multi-process job, progress bars, the config
as printed at start-up) and `fit` (train's and eval's memory plan on a GPU, before JAX starts).
Each module imports the heavy parts (JAX, the trainers) inside its functions, so that `hgpo-jax
--help` and argument errors stay quick."""
