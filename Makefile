# The two commands a newcomer needs: `make demo` (the main job, on the embedded SQLite
# default) and `make test` (the full suite). Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test check bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m tableq.demo

test: $(VENV)/.installed
	$(PY) -m pytest

check: $(VENV)/.installed
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m pytest tests/test_unit.py -q

bench: $(VENV)/.installed
	$(PY) benchmarks/core_bench.py

clean:
	rm -rf $(VENV) tableq.db tableq.db-wal tableq.db-shm demo-out
