# The two README commands are `sudo make run` and `sudo make test`.
# `install` is idempotent and quick when nothing is missing (scripts/install.sh); `test` also
# installs the test-only tools (chromium, for the report's headless-browser test).
PYTHON ?= .venv/bin/python
PYTEST_ARGS ?=

.PHONY: install install-test run test unit clean bench

install:
	scripts/install.sh

run: install
	$(PYTHON) -m testbed run

# Runs at `auto` need this machine's calibration: measured here once, not inside a timed test.
test: install-test
	$(PYTHON) -m testbed calibrate --if-missing --quiet
	$(PYTHON) -m pytest $(PYTEST_ARGS)

install-test:
	scripts/install.sh --test-tools

unit:
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

bench: install
	$(PYTHON) benchmarks/send_rate.py

clean:
	@if [ -x $(PYTHON) ]; then $(PYTHON) -m testbed clean; else echo "nothing installed"; fi
