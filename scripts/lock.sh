#!/usr/bin/env bash
# Moves the lock forward (`make lock`): every distribution that `make run`, `make test`,
# `make lint`, the wheel and the image install is resolved anew to the newest release that
# pyproject.toml allows, and written, pinned and hashed, to requirements/:
#
#   run.txt    what the package needs at run time (the image, the wheel test's wheelhouse)
#   build.txt  the build backend (editable installs, the image's wheel)
#   test.txt   run-time, test extra and build backend (make test-fast)
#   dev.txt    run-time, test and lint extras and build backend (make test, make lint)
#
# The files are one resolution (uv lock on a scratch copy of pyproject.toml, for Linux) exported
# per set, so a distribution has one version in all of them. Then, in the same step, the
# project's environment is made anew from the new lock, the protos are generated again with the
# locked grpcio-tools, and pyproject.toml's grpcio and protobuf floors are raised to what the
# generated modules need at import (their GRPC_GENERATED_VERSION and protobuf gencode version);
# if a floor moved, the lock is exported again from the same resolution. Needs the network;
# commit everything it changed in one commit (tests/unit/test_lock.py holds them together).
set -Eeuo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
say() { printf 'lock: %s\n' "$*" >&2; }

uv="$(scripts/setup.sh --uv)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The sets as uv export's selections (the project itself is never in a set: setup.sh installs
# it editable, the Containerfile from its wheel).
declare -A selection=(
    [run]=""
    [build]="--only-group build"
    [test]="--extra test --group build"
    [dev]="--extra test --extra lint --group build"
)

resolve() {
    # uv reads the project's static metadata only: pyproject.toml and the readme it names.
    cp pyproject.toml README.md "$work/"
    (cd "$work" && "$uv" lock --quiet "$@") || { say "uv lock failed (output above)"; exit 1; }
    local set
    for set in run build test dev; do
        {
            printf '# requirements/%s.txt: made by `make lock` (scripts/lock.sh) from pyproject.toml; never edit.\n' "$set"
            # shellcheck disable=SC2086 # the selection is several flags
            (cd "$work" && "$uv" export --quiet --frozen --no-header --no-emit-project \
                --format requirements.txt ${selection[$set]})
        } >"requirements/$set.txt.new"
        mv "requirements/$set.txt.new" "requirements/$set.txt"
    done
}

# The version a generated module was made for: what a floor must be at least.
generated_versions() {
    local grpc protobuf
    grpc="$(sed -n "s/^GRPC_GENERATED_VERSION = '\(.*\)'$/\1/p" src/cdi_gen/_proto/dra/v1/api_pb2_grpc.py)"
    protobuf="$(sed -n 's/^# Protobuf Python Version: \(.*\)$/\1/p' src/cdi_gen/_proto/dra/v1/api_pb2.py)"
    [ -n "$grpc" ] && [ -n "$protobuf" ] || { say "no generated versions in src/cdi_gen/_proto/dra/v1"; exit 1; }
    printf '%s %s\n' "$grpc" "$protobuf"
}

say "resolving every set anew"
resolve --upgrade
scripts/setup.sh lint
say "generating the protos with the locked grpcio-tools"
PYTHON="$repo/.venv/bin/python" proto/generate.sh
read -r grpc protobuf < <(generated_versions)
before="$(sha256sum pyproject.toml)"
sed -i -E "s/^(  \"grpcio)>=[^\"]*\"/\1>=$grpc\"/; s/^(  \"protobuf)>=[^\"]*\"/\1>=$protobuf\"/" pyproject.toml
if [ "$(sha256sum pyproject.toml)" != "$before" ]; then
    say "floors raised to what the generated modules need: grpcio>=$grpc, protobuf>=$protobuf"
    resolve
    scripts/setup.sh lint
fi
say "done: $(cat requirements/*.txt | sha256sum | cut -c1-12) (commit requirements/, pyproject.toml and src/cdi_gen/_proto together)"
git status --short -- requirements pyproject.toml src/cdi_gen/_proto >&2 || true
