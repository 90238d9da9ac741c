# The two commands a newcomer needs: `make run` (set up, then run the node agent on the
# embedded default config) and `make test` (the whole suite, as CI runs it).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: setup run test lint bench proto

# Debian 12's python3 is "externally managed" (PEP 668); this installs into it on purpose,
# as the project's own machines and CI do, rather than into a venv the commands would miss.
setup:
	PIP_BREAK_SYSTEM_PACKAGES=1 $(PIP) install -q -e '.[test,lint]'

run: setup
	cdi-gen run

test:
	$(PYTHON) -m pytest

lint:
	ruff check src tests benchmarks
	ruff format --check src tests benchmarks
	mypy

bench:
	$(PYTHON) benchmarks/run.py

proto:
	proto/generate.sh
