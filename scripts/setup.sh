#!/usr/bin/env bash
# Sets up this machine for one purpose, idempotently: `run` (the agent alone), `test` (the
# whole suite: the real runtimes, udev, the Go CDI library, containerd, Kubernetes nodes of
# every cluster lane and the agent's image), `fast` (the unit and integration tiers only, for
# `make test-fast`: the package with its test extra, udev, util-linux, the upstream CDI schema
# and the wheel test's wheels; no Go build, image, runtime or cluster) or `lint`. `make run`, `make test`, `make lint` and .ci/run all call it,
# so CI proves the very path a newcomer takes. `scripts/setup.sh --packages MODE` prints the
# Debian packages MODE installs, one a line (what `make check-setup` builds a root file system
# from).
#
# Python runs in the project's own virtual environment, .venv at the repository root, never in
# the machine's interpreter: whatever lingers there (a package from an earlier `make lint`, a
# hand install) cannot make a test pass here. It is installed from the lock (requirements/*.txt,
# pinned and hashed, made by `make lock`), so two machines on two days install the same bytes; an
# install that cannot honour the lock stops with one line naming the distribution. The
# environment is keyed on pyproject.toml, the lock and the interpreter: when any changes it is
# made anew, so it holds only what the lock pins for its set (the suite checks that,
# tests/plugins/environment.py). A fresh clone gets a fresh one.
#
# Each part is checked first and installed only when missing, so a second run costs about a
# second. When something is missing and cannot be installed here (not root, no network), it
# stops before anything runs, with one message listing what is missing and how to get it.
set -Eeuo pipefail

list_only=false
case "${1:-}" in
    --packages)
        list_only=true
        shift
        ;;
    # What scripts/lock.sh needs of setup: uv's path (installed if missing), the lock's id.
    --uv | --lock-id)
        mode="${1#--}"
        ;;
esac
mode="${mode:-${1:-}}"
case "$mode" in
    run | test | fast | lint | uv | lock-id) ;;
    *)
        echo "usage: scripts/setup.sh [--packages] run|test|fast|lint | --uv | --lock-id" >&2
        exit 2
        ;;
esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
PYTHON="${PYTHON:-python3}"
VENV="$repo/.venv"
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# Nothing from the caller's environment may add to what the project's interpreter sees.
unset PYTHONPATH PYTHONHOME PYTHONUSERBASE
export PYTHONNOUSERSITE=1

say() { printf 'setup (%s): %s\n' "$mode" "$*" >&2; }
fail() {
    printf 'setup (%s): %s\n' "$mode" "$*" >&2
    exit 1
}
is_root() { [ "$(id -u)" -eq 0 ]; }

# --- Debian packages -----------------------------------------------------------------------
# What each mode needs from Debian, as package names (checked with dpkg, installed with apt).
# python3-venv: Debian's python3 makes no virtual environment without it.
run_packages=(python3 python3-venv libudev1)
# The crio lane builds CRI-O with cgo against libseccomp (gcc, libc6-dev, pkg-config,
# libseccomp-dev) and its static pinns helper (gcc), and the current and crio lanes' runc 1.5 is
# built the same way; the crio node runs Debian's conmon, images reach CRI-O's store through
# podman, and the oldest lane (and the e2e tier) run Debian's runc.
test_packages=(
    ca-certificates make git util-linux mount udev busybox-static iptables
    podman runc conmon containernetworking-plugins catatonit mmdebstrap
    golang-go golang-github-container-orchestrated-devices-container-device-interface-dev
    gcc libc6-dev pkg-config libseccomp-dev
)
# The unit and integration tiers' share of that list: systemd-udevd and udevadm
# (test_udev_real.py), unshare and mount (a private mount namespace, a tmpfs, a UTS namespace)
# and the upstream CDI schema with its test data, which Debian ships in the Go CDI library's
# package (test_spec_rules.py, test_samples.py; Debian's Go toolchain is not needed for it).
fast_packages=(
    ca-certificates make git util-linux mount udev
    golang-github-container-orchestrated-devices-container-device-interface-dev
)

missing_packages() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${db:Status-Status}\n' "$pkg" 2>/dev/null | grep -qx installed \
            || printf '%s\n' "$pkg"
    done
}

ensure_packages() {
    local missing
    mapfile -t missing < <(missing_packages "$@")
    [ "${#missing[@]}" -eq 0 ] && return 0
    is_root || fail "missing Debian packages: ${missing[*]}; run this as root (it installs them with apt-get) or install them yourself"
    say "installing ${missing[*]}"
    apt-get update -q </dev/null >&2 \
        || fail "apt-get update failed (no network?); missing Debian packages: ${missing[*]}"
    # --no-install-recommends keeps the machine close to what the recipes were measured on
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >&2 \
        || fail "apt-get install failed; missing Debian packages: ${missing[*]}"
    mapfile -t missing < <(missing_packages "$@")
    [ "${#missing[@]}" -eq 0 ] || fail "still missing after apt-get install: ${missing[*]}"
}

# --- the Python package, in the project's virtual environment ------------------------------
# Three sets, each a superset of the one before: `base` (the agent: make run), `test` (the
# package with its test extra: make test-fast) and `dev` (with the test and lint extras: make
# test, make lint, make bench). One environment holds one of them, never anything else; a set
# already covered installs nothing. make test and make lint share dev so that the order in
# which they ran cannot change what a test sees; make test-fast after either runs in dev, on
# a fresh clone in test, and the suite checks the environment against the set it holds
# (tests/plugins/environment.py reads .cdi-gen-set).
#
# The lock: one file per set, each pinned and hashed (scripts/lock.sh). Its id, the first 12
# hex digits of the files' sha256 in name order, is what `cdi-gen --version` and the image's
# label name (deploy/Containerfile computes it the same way).
LOCK=requirements
lock_id() { cat "$LOCK"/build.txt "$LOCK"/dev.txt "$LOCK"/run.txt "$LOCK"/test.txt | sha256sum | cut -c1-12; }

# The lock's files each set installs (base also needs the build backend for the editable
# install; test and dev hold it).
set_files() {
    case "$1" in
        base) echo "$LOCK/run.txt $LOCK/build.txt" ;;
        test) echo "$LOCK/test.txt" ;;
        dev) echo "$LOCK/dev.txt" ;;
    esac
}

venv_key() {
    printf '%s %s %s\n' "$("$PYTHON" -c 'import sys; print(sys.version.split()[0], sys.base_prefix)')" \
        "$(cat "$LOCK"/*.txt | sha256sum | cut -c1-64)" "$(sha256sum pyproject.toml | cut -c1-64)"
}

# Runs an install of the lock's files; when it fails, its output, then one line naming the
# locked distribution it failed on (a hash that no longer matches, a version gone) and why.
install_locked() {
    local files="$1" log pin name found="" why
    shift
    log="$(mktemp)"
    if "$@" >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    cat "$log" >&2
    # uv quotes the distribution it failed on as `name==version`; pip names it in its lines.
    found="$(grep -m1 -oE '`[A-Za-z0-9][A-Za-z0-9._-]*==[^` ]+`' "$log" | tr -d '`' || true)"
    if [ -z "$found" ]; then
        # shellcheck disable=SC2086 # the set's files, several words
        while read -r pin; do
            name="${pin%%==*}"
            if grep -qiE "(^|[^A-Za-z0-9_.-])${name//./\\.}([^A-Za-z0-9_.-]|$)" "$log"; then
                found="$pin"
                break
            fi
        done < <(sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ ;]*\).*/\1/p' $files)
    fi
    why="$(grep -E '^\s*(cause|Caused by|ERROR|error):' "$log" | tail -n 1 | sed -E 's/^\s*[A-Za-z ]+:\s*//' | cut -c1-200)"
    rm -f "$log"
    fail "the lock cannot be installed: ${found:-no locked distribution named in the output above}: ${why:-see above} (from $files; run make lock if the registry changed)"
}

# How much of the package a set holds: nothing (0), base, test, dev.
set_rank() {
    case "$1" in
        base) echo 1 ;;
        test) echo 2 ;;
        dev) echo 3 ;;
        *) echo 0 ;;
    esac
}

ensure_venv() {
    local set="$1" key have
    key="$(venv_key)" || fail "$PYTHON does not run; install Debian's python3 (as root this script does)"
    have="$(cat "$VENV/.cdi-gen-key" 2>/dev/null || true)"
    if [ "$have" != "$key" ] || [ ! -x "$VENV/bin/python" ]; then
        [ -e "$VENV" ] && say "pyproject.toml or the interpreter changed: making $VENV anew"
        rm -rf "$VENV"
        say "creating $VENV with $PYTHON"
        "$PYTHON" -m venv "$VENV" >&2 \
            || fail "$PYTHON -m venv failed; on Debian install python3-venv (as root this script does)"
        date -u +%Y-%m-%dT%H:%M:%SZ >"$VENV/.cdi-gen-created"
        printf '%s\n' "$key" >"$VENV/.cdi-gen-key"
    fi
    have="$(cat "$VENV/.cdi-gen-set" 2>/dev/null || true)"
    if [ "$(set_rank "$have")" -ge "$(set_rank "$set")" ]; then
        return 0
    fi
    local files file reqs=() uv
    files="$(set_files "$set")"
    for file in $files; do
        [ -f "$file" ] || fail "$file missing: the lock is part of the checkout (make lock makes it)"
        reqs+=(-r "$file")
    done
    # The lock first, every file checked against its hash; then the package itself, editable,
    # with the locked build backend (no build isolation, which would fetch the newest hatchling).
    if uv="$(installer)"; then
        say "uv pip install --require-hashes $files, then -e . into $VENV"
        # Compiled ahead, in parallel: a process that runs with PYTHONDONTWRITEBYTECODE set (as
        # CI shells may) would otherwise compile pydantic, grpc and the rest again every time.
        install_locked "$files" "$uv" pip install -q --python "$VENV/bin/python" --compile-bytecode \
            --require-hashes "${reqs[@]}"
        "$uv" pip install -q --python "$VENV/bin/python" --compile-bytecode --no-deps \
            --no-build-isolation -e . >&2 || fail "uv pip install -e . into $VENV failed (see above)"
    else
        say "pip install --require-hashes $files, then -e . into $VENV (uv could not be installed, see above)"
        install_locked "$files" "$VENV/bin/python" -m pip install -q --no-warn-script-location \
            --require-hashes "${reqs[@]}"
        "$VENV/bin/python" -m pip install -q --no-warn-script-location --no-deps \
            --no-build-isolation -e . >&2 || fail "pip install -e . into $VENV failed (see above)"
    fi
    # What `cdi-gen --version` names (src/cdi_gen/cli/main.py), as the image records it.
    mkdir -p "$VENV/share/cdi-gen"
    lock_id >"$VENV/share/cdi-gen/lock"
    printf '%s\n' "$set" >"$VENV/.cdi-gen-set"
}

# uv installs the package's environment in about 2 s where pip takes about 25 (most of a fresh
# clone's `make test-fast` setup). It is a tool of the setup, not of the package, so it lives in
# an environment of its own outside the checkout, pinned, made once per machine and user; the
# project's .venv keeps only what pyproject.toml asks for, and pip, which the suite's wheelhouse
# uses. Prints uv's path; fails (and setup falls back to pip) when it cannot be installed. Made
# with .venv's pip where there is one; `--uv` (scripts/lock.sh, before any lock) gives uv's
# environment a pip of its own.
UV_VERSION=0.13.9
installer() {
    local home="${XDG_CACHE_HOME:-$HOME/.cache}/cdi-gen/uv-$UV_VERSION" pip
    if [ ! -x "$home/bin/uv" ]; then
        rm -rf "$home"
        if [ -x "$VENV/bin/python" ]; then
            "$PYTHON" -m venv --without-pip "$home" >&2 || return 1
            pip=("$VENV/bin/python" -m pip --python "$home/bin/python")
        else
            "$PYTHON" -m venv "$home" >&2 || return 1
            pip=("$home/bin/python" -m pip)
        fi
        "${pip[@]}" install -q --no-warn-script-location "uv==$UV_VERSION" >&2 \
            || { rm -rf "$home"; return 1; }
    fi
    printf '%s\n' "$home/bin/uv"
}

# --- the parts the suite runs against -------------------------------------------------------
check_test_machine() {
    local tool missing=()
    for tool in podman runc conmon unshare mount go busybox udevadm; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ "${#missing[@]}" -eq 0 ] || fail "programs missing after the install: ${missing[*]}"
    test -d /usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface/schema \
        || fail "the Go CDI library (and its schema) is missing under /usr/share/gocode"
    test -e /dev/loop-control || fail "/dev/loop-control missing: the kernel has no loop support"
    # podman 4.3 reads /etc/cdi and /var/run/cdi only; the e2e tests bind-mount test folders
    # over them in a private mount namespace, which needs the mount points to exist.
    mkdir -p /etc/cdi /var/run/cdi
}

check_fast_machine() {
    local tool missing=()
    for tool in unshare mount udevadm; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ -x /lib/systemd/systemd-udevd ] || missing+=(/lib/systemd/systemd-udevd)
    [ "${#missing[@]}" -eq 0 ] || fail "programs missing after the install: ${missing[*]}"
    test -d /usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface/schema \
        || fail "the upstream CDI schema is missing under /usr/share/gocode (Debian's Go CDI library package)"
    test -e /dev/loop-control || fail "/dev/loop-control missing: the kernel has no loop support"
}

ensure_wheelhouse() {
    # The wheel test installs offline from these (tests/wheelhouse.py).
    "$VENV/bin/python" tests/wheelhouse.py >&2 || fail "the run-time dependencies' wheels could not be downloaded (output above)"
}

ensure_containerd() {
    # Debian 12's containerd 1.6 has no CDI; the fixture unpacks Debian 13's 1.7 into a cache
    # outside the checkout (tests/e2e/containerd/fetch.py). Done here so a network problem fails
    # setup by name instead of the tests.
    local root
    root="$(cd tests/e2e && "$VENV/bin/python" -c 'from containerd.fetch import fetch; print(fetch())')" \
        || fail "could not fetch containerd 1.7 from Debian 13 (see the apt output above)"
    "$root/usr/bin/containerd" --version >&2
}

ensure_cluster() {
    # The real nodes (tests/cluster): etcd from Debian 13 and every lane, Kubernetes 1.37 with
    # containerd 2.3, Kubernetes 1.35 with containerd 1.7 and Kubernetes 1.36 with CRI-O 1.36,
    # built from their Go modules (cold about 20, 15 and 35 minutes on 2 busy cores; cached per
    # lane outside the checkout), runc 1.5 for two of them (1 to 3 minutes), then the agent image from deploy/Containerfile on a base made
    # from Debian's packages. Both scripts check their caches first and print what they found.
    "$VENV/bin/python" tests/cluster/setup.py >&2 || fail "the Kubernetes node could not be prepared (output above)"
    "$VENV/bin/python" tests/cluster/image.py >&2 || fail "the agent image could not be built (output above)"
}

if $list_only; then
    case "$mode" in
        run) printf '%s\n' "${run_packages[@]}" ;;
        test) printf '%s\n' "${run_packages[@]}" "${test_packages[@]}" ;;
        fast) printf '%s\n' "${run_packages[@]}" "${fast_packages[@]}" ;;
        lint) printf '%s\n' "${run_packages[@]}" ;;
    esac
    exit 0
fi

case "$mode" in
    uv)
        installer || fail "uv $UV_VERSION could not be installed (output above)"
        ;;
    lock-id)
        lock_id
        ;;
    run)
        if ! is_root && [ -n "$(missing_packages "${run_packages[@]}")" ]; then
            fail "missing Debian packages: $(missing_packages "${run_packages[@]}" | xargs); the agent also needs root to write /var/run/cdi"
        fi
        ensure_packages "${run_packages[@]}"
        ensure_venv base
        ;;
    test)
        is_root || fail "the suite needs root (loop devices, mount namespaces, containers): run make test as root"
        ensure_packages "${run_packages[@]}" "${test_packages[@]}"
        check_test_machine
        ensure_venv dev
        # helm comes with the cluster's parts (tests/cluster/setup.py).
        ensure_wheelhouse
        ensure_containerd
        ensure_cluster
        ;;
    fast)
        is_root || fail "the integration tests need root (loop devices, mount namespaces): run make test-fast as root"
        ensure_packages "${run_packages[@]}" "${fast_packages[@]}"
        check_fast_machine
        ensure_venv test
        ensure_wheelhouse
        ;;
    lint)
        ensure_packages "${run_packages[@]}"
        ensure_venv dev
        ;;
esac
