# The two commands a newcomer needs: `make run` (set up, then run the node agent on the
# embedded default config) and `make test` (set up, then the whole suite, as CI runs it).
# Both set up through scripts/setup.sh, which installs only what is missing.
PYTHON ?= python3
export PYTHON

.PHONY: run test lint fuzz bench proto setup-run setup-test setup-lint

setup-run:
	scripts/setup.sh run

setup-test:
	scripts/setup.sh test

setup-lint:
	scripts/setup.sh lint

run: setup-run
	$(PYTHON) -m cdi_gen run

test: setup-test
	$(PYTHON) -m pytest

lint: setup-lint
	ruff check src tests benchmarks scripts
	ruff format --check src tests benchmarks scripts
	mypy
	lint-imports

bench: setup-test
	$(PYTHON) benchmarks/run.py

# The property-based fuzzing of configs, specs and udev records with many more inputs than
# the suite runs (FUZZ_EXAMPLES per fuzz test); prints inputs, time and any finding. Memory is
# capped at 4 GiB so that a blow-up is a MemoryError (a finding), not a node out of memory.
FUZZ_EXAMPLES ?= 5000
fuzz: setup-test
	ulimit -v 4194304 && CDI_GEN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PYTHON) -m pytest -q \
		--hypothesis-show-statistics --timeout=3600 tests/unit/test_fuzz_inputs.py

proto: setup-test
	proto/generate.sh
