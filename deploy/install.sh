#!/usr/bin/env bash
# Installs caked, cakectl, the Python client (with the stubs the build generated), the default configuration and
# the systemd unit from a build in build/.
# Idempotent: an existing /etc/cake/caked.toml is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${PREFIX:-/usr/local}
[ -x build/bin/caked ] || { echo "install.sh: build first (scripts/test or scripts/demo builds into build/)" >&2; exit 1; }
install -d "$prefix/bin" /etc/cake "$prefix/share/doc/cake"
install -m 0755 build/bin/caked build/bin/cakectl "$prefix/bin/"
# The daemon's user and group: engines that use it join the group (the socket is 0660).
if command -v groupadd >/dev/null; then
  getent group cake >/dev/null || groupadd --system cake
  getent passwd cake >/dev/null || useradd --system --gid cake --no-create-home --shell /usr/sbin/nologin cake
fi
[ -f /etc/cake/caked.toml ] || install -m 0640 deploy/caked.toml /etc/cake/caked.toml
# Readable by the daemon (group cake), not by everyone; secrets go in /etc/cake/private, the daemon's alone.
if getent group cake >/dev/null; then
  chown root:cake /etc/cake/caked.toml && chmod 0640 /etc/cake/caked.toml
  install -d -m 0700 -o cake -g cake /etc/cake/private
else
  chmod 0600 /etc/cake/caked.toml
  install -d -m 0700 /etc/cake/private
fi
install -m 0644 docs/*.md "$prefix/share/doc/cake/"
# The Python packages, where Debian's python3 finds them (/usr/local/lib/python3/dist-packages with the default
# prefix); the generated cake.v1 stubs go inside the cake package.
if [ -f build/python/cake/v1/kv_pb2.py ]; then
  pydir="$prefix/lib/python3/dist-packages"
  rm -rf "$pydir/cake" "$pydir/cake_torch_engine"
  install -d "$pydir/cake/v1" "$pydir/cake/testing" "$pydir/cake_torch_engine"
  install -m 0644 python/cake/*.py "$pydir/cake/"
  install -m 0644 python/cake/testing/*.py "$pydir/cake/testing/"
  install -m 0644 build/python/cake/v1/*.py "$pydir/cake/v1/"
  install -m 0644 python/cake_torch_engine/*.py "$pydir/cake_torch_engine/"
fi
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  install -m 0644 deploy/caked.service /etc/systemd/system/caked.service
  systemctl daemon-reload
  echo "installed; start with: systemctl enable --now caked"
else
  echo "installed (no systemd here: run $prefix/bin/caked --config /etc/cake/caked.toml)"
fi
