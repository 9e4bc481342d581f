#!/usr/bin/env bash
# Installs Cake on this machine as the package does, because it installs the package: scripts/package builds the
# .deb files (in build-pkg/), and apt installs them with their dependencies. So the layout is the package's:
# /usr/bin/caked and cakectl, /etc/cake/caked.toml (a conffile: one already there, edited or not, is kept),
# /etc/cake/private, the user and group cake, /lib/systemd/system/caked.service (not enabled), the docs, man pages
# and the Python client in /usr/lib/python3/dist-packages. Idempotent: run it again after a pull to upgrade.
# Usage: deploy/install.sh [--dev]    --dev: libcake-dev too (the C++ client library, for building engines)
set -euo pipefail
cd "$(dirname "$0")/.."
with_dev=false
for arg in "$@"; do
  case $arg in
    --dev) with_dev=true ;;
    *) echo "usage: deploy/install.sh [--dev]" >&2; exit 2 ;;
  esac
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

mapfile -t debs < <(scripts/package)
install_debs=()
for deb in "${debs[@]}"; do
  case $(basename "$deb") in
    cake_*.deb) install_debs+=("$deb") ;;
    libcake-dev_*.deb) $with_dev && install_debs+=("$deb") ;;
  esac
done
[ ${#install_debs[@]} -gt 0 ] || { echo "install.sh: scripts/package made no cake_*.deb" >&2; exit 1; }

# What this script installed before there was a package: /usr/local/bin comes first on PATH and a unit in
# /etc/systemd/system hides the package's, so both go (the config and /etc/cake/private stay, and are kept).
legacy_unit=/etc/systemd/system/caked.service
legacy_enabled=false
if [ -f "$legacy_unit" ] && grep -q '^ExecStart=/usr/local/bin/caked' "$legacy_unit"; then
  echo "install.sh: removing $legacy_unit (from the install before the package)"
  # Its enable link points at it: dropped with it, and made again for the package's unit below.
  if [ -L /etc/systemd/system/multi-user.target.wants/caked.service ]; then
    legacy_enabled=true
    $SUDO rm -f /etc/systemd/system/multi-user.target.wants/caked.service
  fi
  $SUDO rm -f "$legacy_unit"
fi
for legacy in /usr/local/bin/caked /usr/local/bin/cakectl /usr/local/share/doc/cake \
  /usr/local/lib/python3/dist-packages/cake /usr/local/lib/python3/dist-packages/cake_torch_engine; do
  if [ -e "$legacy" ]; then
    echo "install.sh: removing $legacy (from the install before the package)"
    $SUDO rm -rf "$legacy"
  fi
done

# confold: a caked.toml that is already there stays as it is, whoever wrote it.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Options::=--force-confdef \
  -o Dpkg::Options::=--force-confold "${install_debs[@]}"
if $legacy_enabled; then
  $SUDO systemctl enable caked.service  # works without a running systemd too (it makes the link)
fi
if [ -d /run/systemd/system ]; then
  echo "installed; size /etc/cake/caked.toml to this host, then: systemctl enable --now caked"
else
  echo "installed (no systemd running here: run caked --config /etc/cake/caked.toml as the user cake)"
fi
