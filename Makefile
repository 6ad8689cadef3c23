# The two commands in README.md: `make run` and `make test`.
# Both create the virtual environment on first use (and again when a requirements file changes).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test setup clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

# The learning demo: a format-only warm start of a model built here, then HGPO on the toy env
# with held-out success after every iteration (README: "make run").
run: $(STAMP)
	@stamp=$$(date +%Y%m%d-%H%M%S); \
	$(VENV)/bin/hgpo-jax sft toy_format train.run_dir=runs/toy_format-$$stamp && \
	$(VENV)/bin/hgpo-jax train toy_hgpo model.path=runs/toy_format-$$stamp \
	    train.run_dir=runs/toy_hgpo-$$stamp

test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15 tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
