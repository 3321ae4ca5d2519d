#!/usr/bin/env bash
# Installs everything rigsmith and its test suite need on a fresh Debian 12 machine (run as root).
# Idempotent; used by the README's two commands and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
apt_pkgs=(podman catatonit conmon runc docker.io docker-registry skopeo lxc busybox-static shellcheck curl python3-pip
  debootstrap systemd-container zstd iproute2 openssh-server bubblewrap)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e '.[dev]'

# podman makes its machine-wide lock file (/dev/shm/libpod_lock) on its first use; make it here, as the engine's
# own state, so that .ci/leftovers on a brand-new machine sees only what the tests leave.
podman info >/dev/null

# Tools the tests check generated artifacts with (quadlet generator, podman-compose 1.0.6), cached.
bash .ci/fetch-test-tools

# The Debian trixie rootfs (systemd, podman 5.4) the tests boot with systemd-nspawn, built once and cached.
python3 -c 'from tests.support.systemd_guest import ensure_rootfs; print("systemd guest rootfs:", ensure_rootfs())'
