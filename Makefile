# hvd_gradpart: `make demo` runs the main job, `make test` the fast tier of the tests (minutes),
# `make test-slow` the rest (the cluster's included; CI runs both tiers), `make test-all` both;
# the fast tier on JOBS pytest-xdist workers, the launches one at a time; `make bench` the quick
# evaluation suite (`make bench-full` or `BENCH=full make bench`: all of it), `make report` every
# table and plot from the committed results; all set up first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done
JOBS ?= 2
PYTEST := $(PY) -m pytest tests -q -rs
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: setup demo test test-slow test-all bench bench-full report clean

setup: $(STAMP)

$(STAMP): scripts/setup.sh constraints.txt setup.py
	bash scripts/setup.sh
	touch $(STAMP)

test: setup
	$(PYTEST) -m "not slow" -n $(JOBS) --durations=10

test-slow: setup
	$(PYTEST) -m slow --durations=30

test-all: test test-slow

demo: setup
	bash scripts/demo.sh

bench: setup
	bash benchmarks/suite.sh

bench-full: setup
	BENCH=full bash benchmarks/suite.sh

report: setup
	$(PY) -m benchmarks.report

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
