# The two README commands are `sudo make run` and `sudo make test`.
# `install` is idempotent and quick when nothing is missing (scripts/install.sh).
PYTHON ?= .venv/bin/python
PYTEST_ARGS ?=

.PHONY: install run test unit clean bench

install:
	scripts/install.sh

run: install
	$(PYTHON) -m testbed run

test: install
	$(PYTHON) -m pytest $(PYTEST_ARGS)

unit:
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

bench: install
	$(PYTHON) benchmarks/send_rate.py

clean:
	@if [ -x $(PYTHON) ]; then $(PYTHON) -m testbed clean; else echo "nothing installed"; fi
