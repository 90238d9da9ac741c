# The two commands a newcomer needs: `make run` (set up, then run the node agent on the
# embedded default config) and `make test` (set up, then the whole suite, as CI runs it).
# `make test-fast` is the inner loop: the unit and integration tiers, which need no Go build,
# image or cluster, set up with only what they use.
# Both set up through scripts/setup.sh, which installs only what is missing. Python runs in the
# project's own virtual environment, .venv (made by setup.sh from pyproject.toml), never in the
# machine's interpreter; PYTHON names the interpreter that makes it.
PYTHON ?= python3
export PYTHON
VENV := .venv
PY := $(VENV)/bin/python
# Nothing from the caller's environment may add to what that interpreter sees.
unexport PYTHONPATH PYTHONHOME PYTHONUSERBASE
export PYTHONNOUSERSITE := 1
# Bytecode is cached (in __pycache__, which git ignores): a shell that sets
# PYTHONDONTWRITEBYTECODE would make every test's child process compile the package and the
# tests again, about a third of make test-fast's time.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-fast lint lock fuzz bench bench-fleet proto check-setup setup-run setup-test setup-fast setup-lint

setup-run:
	scripts/setup.sh run

setup-test:
	scripts/setup.sh test

setup-fast:
	scripts/setup.sh fast

setup-lint:
	scripts/setup.sh lint

run: setup-run
	$(PY) -m cdi_gen run

# The machine's own tests (clusters, runtimes, real uevents) run one after another on one
# pytest-xdist worker while the other workers take the unit and integration files beside
# them (tests/plugins/machine.py), so the suite takes about its cluster tier's time.
test: setup-test
	$(PY) -m pytest -n auto --dist loadscope

# Four pytest workers (pytest-xdist), each test file on one worker, so a module's fixtures
# (the wheel test's build, a udevd) are made once. Four and not one per core: a third of the
# tiers' time is spent waiting on child processes, sockets and deadlines, which two more
# workers fill (on 2 cores: 52 s against 68 s with two). The tests are safe side by side
# (temporary folders of their own, ports from the kernel, loop numbers picked at random).
# FAST_EXAMPLES caps each property-based test's examples (tests/conftest.py); make test runs
# them all.
FAST_EXAMPLES ?= 25
FAST_WORKERS ?= 4
test-fast: setup-fast
	CDI_GEN_FAST_EXAMPLES=$(FAST_EXAMPLES) $(PY) -m pytest -q -n $(FAST_WORKERS) --dist loadfile \
		tests/unit tests/integration

lint: setup-lint
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: setup-test
	$(PY) benchmarks/run.py

# The simulated fleet (benchmarks/fleet.py): kwok nodes with a DRA pool each on the current
# lane's control plane; minutes, so not part of `make bench`. FLEET_ARGS="--nodes 50".
FLEET_ARGS ?=
bench-fleet: setup-test
	$(PY) benchmarks/fleet.py $(FLEET_ARGS)

# The property-based fuzzing of configs, specs and udev records with many more inputs than
# the suite runs (FUZZ_EXAMPLES per fuzz test); prints inputs, time and any finding. Memory is
# capped at 4 GiB so that a blow-up is a MemoryError (a finding), not a node out of memory.
FUZZ_EXAMPLES ?= 5000
fuzz: setup-test
	ulimit -v 4194304 && CDI_GEN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q \
		--hypothesis-show-statistics --timeout=3600 tests/unit/test_fuzz_inputs.py

proto: setup-lint
	PYTHON=$(PY) proto/generate.sh

# The one way to move the lock (requirements/*.txt) forward: every set resolved anew to the newest
# releases pyproject.toml allows, the environment made from it, the protos generated again with
# the locked grpcio-tools and the grpcio and protobuf floors raised to match (scripts/lock.sh).
# Needs the network; commit what it changed in one commit.
lock:
	scripts/lock.sh

# Whether the Debian packages scripts/setup.sh installs for `test` are all the suite needs: a
# root file system made from nothing but that list, where the package is installed and what
# the suite starts is started (scripts/check_setup.sh). Slow (minutes) and not part of make test.
check-setup:
	scripts/check_setup.sh
