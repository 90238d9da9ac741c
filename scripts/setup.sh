#!/usr/bin/env bash
# Sets up this machine for one purpose, idempotently: `run` (the agent alone), `test` (the
# whole suite: the real runtimes, udev, the Go CDI library, containerd 1.7, a Kubernetes node
# and the agent's image) or `lint`. `make run`, `make test`, `make lint` and .ci/run all call it, so CI proves
# the very path a newcomer takes.
#
# Each part is checked first and installed only when missing, so a second run costs about a
# second. When something is missing and cannot be installed here (not root, no network), it
# stops before anything runs, with one message listing what is missing and how to get it.
set -Eeuo pipefail

mode="${1:-}"
case "$mode" in
    run | test | lint) ;;
    *)
        echo "usage: scripts/setup.sh run|test|lint" >&2
        exit 2
        ;;
esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
PYTHON="${PYTHON:-python3}"
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# Debian 12's python3 is externally managed (PEP 668): the project installs into the
# interpreter the Makefile runs on purpose, not into a venv those commands would miss.
export PIP_BREAK_SYSTEM_PACKAGES=1

say() { printf 'setup (%s): %s\n' "$mode" "$*" >&2; }
fail() {
    printf 'setup (%s): %s\n' "$mode" "$*" >&2
    exit 1
}
is_root() { [ "$(id -u)" -eq 0 ]; }

# --- Debian packages -----------------------------------------------------------------------
# What each mode needs from Debian, as package names (checked with dpkg, installed with apt).
run_packages=(python3 python3-pip libudev1)
test_packages=(
    ca-certificates make git util-linux mount udev busybox-static iptables
    podman runc conmon containernetworking-plugins catatonit mmdebstrap
    golang-go golang-github-container-orchestrated-devices-container-device-interface-dev
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

# --- the Python package ---------------------------------------------------------------------
# pip is slow even when it has nothing to do, so a stamp under .work/ records what was
# installed from which pyproject.toml, for which interpreter and checkout.
ensure_python_package() {
    local extras="$1" stamp want
    stamp="$repo/.work/setup/pip-${extras:-base}.stamp"
    want="$("$PYTHON" -c 'import sys; print(sys.executable)') $repo $(sha256sum pyproject.toml | cut -c1-64)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$PYTHON" -c 'import cdi_gen' 2>/dev/null; then
        return 0
    fi
    "$PYTHON" -m pip --version >/dev/null 2>&1 \
        || fail "$PYTHON has no pip; install Debian's python3-pip (as root this script does)"
    local target="." user=()
    [ -n "$extras" ] && target=".[$extras]"
    # Not root: into the user's site-packages (the Makefile runs `python3 -m cdi_gen`, so
    # ~/.local/bin need not be on PATH).
    is_root || user=(--user)
    say "pip install ${user[*]} -e '$target'"
    "$PYTHON" -m pip install -q --no-warn-script-location "${user[@]}" -e "$target" >&2 \
        || fail "pip install ${user[*]} -e '$target' failed"
    mkdir -p "$(dirname "$stamp")"
    printf '%s\n' "$want" >"$stamp"
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

ensure_containerd() {
    # Debian 12's containerd 1.6 has no CDI; the fixture unpacks Debian 13's 1.7 into a cache
    # outside the checkout (tests/e2e/containerd/fetch.py). Done here so a network problem fails
    # setup by name instead of the tests.
    local root
    root="$(cd tests/e2e && "$PYTHON" -c 'from containerd.fetch import fetch; print(fetch())')" \
        || fail "could not fetch containerd 1.7 from Debian 13 (see the apt output above)"
    "$root/usr/bin/containerd" --version >&2
}

ensure_cluster() {
    # The real node (tests/cluster): etcd from Debian 13, Kubernetes built from its Go module
    # (about 10 minutes cold on 2 cores, cached outside the checkout), then the agent image
    # from deploy/Containerfile on a base made from Debian's packages. Both scripts check
    # their caches first and print what they found.
    "$PYTHON" tests/cluster/setup.py >&2 || fail "the Kubernetes node could not be prepared (output above)"
    "$PYTHON" tests/cluster/image.py >&2 || fail "the agent image could not be built (output above)"
}

case "$mode" in
    run)
        if ! is_root && [ -n "$(missing_packages "${run_packages[@]}")" ]; then
            fail "missing Debian packages: $(missing_packages "${run_packages[@]}" | xargs); the agent also needs root to write /var/run/cdi"
        fi
        ensure_packages "${run_packages[@]}"
        ensure_python_package ""
        ;;
    test)
        is_root || fail "the suite needs root (loop devices, mount namespaces, containers): run make test as root"
        ensure_packages "${run_packages[@]}" "${test_packages[@]}"
        check_test_machine
        ensure_python_package "test"
        ensure_containerd
        ensure_cluster
        ;;
    lint)
        ensure_python_package "lint"
        ;;
esac
