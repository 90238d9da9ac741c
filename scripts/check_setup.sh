#!/usr/bin/env bash
# `make check-setup`: are the Debian packages `scripts/setup.sh test` installs all that the suite
# needs? A machine that has run anything else cannot answer that, so this builds a root file
# system from nothing but Debian's minimal base and that list (mmdebstrap), copies the checkout
# into it, and there, with Debian's own python3 and none of this machine's tools:
#   - scripts/setup.sh lint makes the project's virtual environment (python3-venv, pip, PyPI);
#   - scripts/setup_probe.py imports every module, starts every program the suite starts, builds
#     the Go CDI checker offline and fetches containerd 1.7 as the e2e tests do;
#   - the unit tests run.
# It needs root and the network (Debian's mirror, PyPI) and takes minutes: it is not part of
# `make test`. Exit 0 when everything was found, 1 naming what was not.
set -Eeuo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
[ "$(id -u)" -eq 0 ] || {
    echo "check-setup: needs root (mmdebstrap, chroot, mounts)" >&2
    exit 1
}
command -v mmdebstrap >/dev/null || {
    echo "check-setup: needs mmdebstrap (apt-get install mmdebstrap; scripts/setup.sh test installs it)" >&2
    exit 1
}

release=bookworm
mirror=http://deb.debian.org/debian
work="$(mktemp -d /var/tmp/cdi-gen-check-setup.XXXXXX)"
root="$work/root"
trap 'rm -rf "$work"' EXIT
mapfile -t packages < <(scripts/setup.sh --packages test)
echo "check-setup: Debian $release minbase + ${#packages[@]} packages: ${packages[*]}"

# The machine's CA bundle, as the image build does: PyPI and the mirror may be reached through
# a proxy this machine trusts.
ca=/etc/ssl/certs/ca-certificates.crt
start=$SECONDS
mmdebstrap --mode=root --variant=minbase --quiet \
    --include="$(IFS=,; echo "${packages[*]}")" \
    --customize-hook="mkdir -p \"\$1/etc/ssl/certs\" && cp $ca \"\$1$ca\"" \
    --customize-hook="cp /etc/resolv.conf \"\$1/etc/resolv.conf\"" \
    "$release" "$root" "$mirror"
echo "check-setup: root file system in $((SECONDS - start)) s ($(du -sh "$root" | cut -f1))"

mkdir -p "$root/cdi-gen"
git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - -cf - | tar -xf - -C "$root/cdi-gen"

# Only what a fresh machine would have in its environment: the variables pip and the TLS
# libraries need to reach PyPI through this machine's proxy, and nothing naming a tool.
passthrough=()
for var in PIP_CERT PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_DEFAULT_TIMEOUT SSL_CERT_FILE \
    REQUESTS_CA_BUNDLE HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
    if [ -n "${!var:-}" ]; then passthrough+=("$var=${!var}"); fi
done

cat >"$root/check-setup-inside.sh" <<'INSIDE'
set -Eeuo pipefail
cd /cdi-gen
echo "check-setup: inside: $(. /etc/os-release && echo "$PRETTY_NAME"), $(python3 --version)"
PYTHON=/usr/bin/python3 scripts/setup.sh lint
.venv/bin/python scripts/setup_probe.py
.venv/bin/python -m pytest -q -p no:cacheprovider -x tests/unit
INSIDE
# A private mount namespace: the kernel's file systems mounted for the chroot vanish with it.
unshare --mount --propagation private -- sh -c '
    mount -t proc proc "$1/proc" && mount -t sysfs sysfs "$1/sys" && mount --rbind /dev "$1/dev" &&
    shift && exec chroot "$@"
' sh "$root" "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "${passthrough[@]}" /bin/bash /check-setup-inside.sh || {
    echo "check-setup: FAILED: the suite needs something scripts/setup.sh test does not install (output above)" >&2
    exit 1
}
echo "check-setup: OK in $((SECONDS - start)) s: the packages of scripts/setup.sh test are enough"
