# The two commands a newcomer needs: `make demo` (the main job, on the embedded SQLite
# default) and `make test` (the full suite). Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test check bench bench-quick bench-full clean faults-suite faults-suite-long \
	faults-worker faults-worker-long faults-worker-soak faults-long

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m tableq.demo

test: $(VENV)/.installed
	$(PY) -m pytest

# Lint, then tests/test_typing.py: mypy --strict on src/ and the import contracts of the
# layers (lint-imports; both configured in pyproject.toml), and the unit tests.
check: $(VENV)/.installed
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m pytest tests/test_typing.py tests/test_unit.py -q

# The network, clock, contention, model and Spark fault tests (tests/faults/README.md): the
# CI tier alone, then the longer tier (the same tests with larger sizes, see the README).
SUITE_FAULT_TESTS := tests/faults/test_model.py tests/faults/test_stale_leases.py \
	tests/faults/test_dedup.py tests/faults/test_contention.py tests/faults/test_commit_cut.py \
	tests/faults/test_clock_skew.py tests/faults/test_upgrade.py tests/faults/test_silent_cut.py \
	tests/test_clock.py
SUITE_SPARK_TESTS := tests/spark/test_stream.py -k "random_points or server_crashed"

faults-suite: $(VENV)/.installed
	$(PY) -m pytest $(SUITE_FAULT_TESTS) -s -q -p no:cacheprovider
	$(PY) -m pytest $(SUITE_SPARK_TESTS) -s -q -p no:cacheprovider

faults-suite-long: $(VENV)/.installed
	TABLEQ_FAULT_SCALE=$${TABLEQ_FAULT_SCALE:-20} TABLEQ_FAULT_S1_STEPS=$${TABLEQ_FAULT_S1_STEPS:-50} \
	TABLEQ_FAULT_S1_EXAMPLES=$${TABLEQ_FAULT_S1_EXAMPLES:-200} \
	TABLEQ_FAULT_D1_KEYS=$${TABLEQ_FAULT_D1_KEYS:-10000} TABLEQ_FAULT_D2_KEYS=$${TABLEQ_FAULT_D2_KEYS:-5000} \
	TABLEQ_FAULT_D2_ERROR_KEYS=$${TABLEQ_FAULT_D2_ERROR_KEYS:-2000} \
	TABLEQ_FAULT_L1_PER_PRODUCER=$${TABLEQ_FAULT_L1_PER_PRODUCER:-12500} \
	TABLEQ_FAULT_M1_SECONDS=$${TABLEQ_FAULT_M1_SECONDS:-600} TABLEQ_FAULT_M1_PER_PRODUCER=$${TABLEQ_FAULT_M1_PER_PRODUCER:-100000} \
	TABLEQ_FAULT_C1_PER_PRODUCER=$${TABLEQ_FAULT_C1_PER_PRODUCER:-2500} \
	TABLEQ_FAULT_F9_PER_PAUSE=$${TABLEQ_FAULT_F9_PER_PAUSE:-40} \
	TABLEQ_FAULT_F9_PAUSES=$${TABLEQ_FAULT_F9_PAUSES:-200} \
	TABLEQ_FAULT_F10_N=$${TABLEQ_FAULT_F10_N:-10000} \
	TABLEQ_FAULT_SPARK_N=$${TABLEQ_FAULT_SPARK_N:-1500} \
	sh -c '$(PY) -m pytest $(SUITE_FAULT_TESTS) -s -q -p no:cacheprovider --timeout=14400 && \
	       $(PY) -m pytest $(SUITE_SPARK_TESTS) -s -q -p no:cacheprovider --timeout=3600'

# The worker fault tests (tests/faults/README.md): the CI tier alone, then the longer tier
# (the same tests with more messages and faults, and a server down for a minute), and the
# one-hour soak. Sizes: TABLEQ_FAULT_SCALE, TABLEQ_FAULT_FAULTS, TABLEQ_FAULT_OUTAGE_S.
WORKER_FAULT_TESTS := tests/faults/test_worker_kills.py tests/faults/test_worker_outages.py

faults-worker: $(VENV)/.installed
	$(PY) -m pytest $(WORKER_FAULT_TESTS) -s -q -p no:cacheprovider

faults-worker-long: $(VENV)/.installed
	TABLEQ_FAULT_SCALE=$${TABLEQ_FAULT_SCALE:-20} TABLEQ_FAULT_FAULTS=$${TABLEQ_FAULT_FAULTS:-10} \
	TABLEQ_FAULT_OUTAGE_S=$${TABLEQ_FAULT_OUTAGE_S:-60} \
	$(PY) -m pytest $(WORKER_FAULT_TESTS) -s -q -p no:cacheprovider --timeout=7200

# SOAK_DB may name several databases ("postgres mysql"): one soak each, in turn.
# SOAK_CRASH_EVERY_S crashes the server that often (0: never).
faults-worker-soak: $(VENV)/.installed
	@status=0; for db in $${SOAK_DB:-postgres}; do \
	  (cd tests/faults && ../../$(PY) soak.py --minutes $${SOAK_MINUTES:-60} --db $$db \
	     --crash-every-s $${SOAK_CRASH_EVERY_S:-0}) || status=1; \
	done; exit $$status

# The whole longer tier in one command, one part after another (they share 2 cores): the
# suite's longer tier, the worker's longer tier, then the one-hour soak with a server crash
# every 10 minutes. Every size variable above still applies (TABLEQ_FAULT_*, SOAK_MINUTES,
# SOAK_DB, SOAK_CRASH_EVERY_S). A failing part does not stop the next; the exit status is
# non-zero if any part failed. Hours on 2 cores (tests/faults/RESULTS.md).
faults-long: $(VENV)/.installed
	@status=0; \
	$(MAKE) --no-print-directory faults-suite-long || status=1; \
	$(MAKE) --no-print-directory faults-worker-long || status=1; \
	SOAK_CRASH_EVERY_S=$${SOAK_CRASH_EVERY_S:-600} $(MAKE) --no-print-directory faults-worker-soak \
	  || status=1; \
	if [ $$status -ne 0 ]; then echo "faults-long: a part failed (see above)"; fi; exit $$status

# The side-by-side benchmark (benchmarks/RESULTS.md): its own .venv-bench with the peers,
# throwaway PostgreSQL and MariaDB servers. BENCH_ARGS passes options (python -m benchmarks -h).
bench: $(VENV)/.installed
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: $(VENV)/.installed
	$(PY) -m benchmarks --quick --out out/bench-quick $(BENCH_ARGS)

bench-full: $(VENV)/.installed
	$(PY) -m benchmarks --full $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-bench tableq.db tableq.db-wal tableq.db-shm demo-out
