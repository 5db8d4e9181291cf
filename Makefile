# hvd_gradpart: `make demo` runs the main job, `make test` the fast tier of the tests (minutes),
# `make test-all` all of them (the cluster's included; CI runs both), `make bench` the quick
# evaluation suite (`make bench-full` or `BENCH=full make bench`: all of it), `make report` every
# table and plot from the committed results; all set up first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: setup demo test test-all bench bench-full report clean

setup: $(STAMP)

$(STAMP): scripts/setup.sh constraints.txt setup.py
	bash scripts/setup.sh
	touch $(STAMP)

test: setup
	$(PY) -m pytest tests -q -rs -m "not slow" --durations=10

test-all: setup
	$(PY) -m pytest tests -q -rs --durations=30

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
