#!/usr/bin/env bash
# The packages as an operator meets them: a clean Debian 12 root (debootstrap), `apt-get install ./cake_*.deb
# ./libcake-dev_*.deb` inside it (Depends resolved from the mirror), then what the packages promise: the programs
# run, the user, group, folders and modes, the unit verifies, the man pages render, the Python client imports, a
# daemon started from the package answers, an engine project builds against libcake-dev with CMake and with
# pkg-config and talks to it. Then the root is booted with systemd-nspawn, so the unit runs under a real systemd
# with all its hardening, and an engine under its own user uses the daemon it started. Last, a reinstall keeps an
# edited config, the postinst's fallback without systemd-sysusers makes the user, and a purge leaves nothing.
#
# Usage: tests/package/installed_root_test.sh BUILD_DIR
#   Runs cpack in BUILD_DIR (a build that is already built) unless CAKE_DEB_DIR names a folder with the .debs.
#   The root, with the tools the checks use, is cached as a tarball in ${XDG_CACHE_HOME:-~/.cache}/cake (rebuilt
#   when 30 days old), with apt's downloaded .debs beside it: the first run takes minutes, later ones much less.
# Exit status: 0 passed, 1 failed, 77 skipped (not root, or the Debian mirror cannot be reached).
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${1:?usage: installed_root_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
mirror=${CAKE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${CAKE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
cache_dir=${XDG_CACHE_HOME:-$HOME/.cache}/cake
# What the cached root holds besides minbase: systemd (sysusers, tmpfiles, analyze, and PID 1 for the boot, as on
# any Debian 12 host), man-db, and a compiler and make for the engine build. Everything the packages depend on or
# recommend is left out, so apt has to resolve it from them. A change here names a new tarball.
root_include=systemd,man-db,g++,make
root_recipe=2  # bumped when how the root is made changes: a new tarball
base_tar=$cache_dir/debootstrap-bookworm-$(printf '%s %s' "$root_recipe" "$root_include" | md5sum | cut -c1-8).tar
apt_archives=$cache_dir/apt-archives

skip() { echo "SKIP: $*"; exit 77; }
log() { printf '\n== %s (%ds)\n' "$*" "$SECONDS"; }
[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, chroot, mounts)"

# The mirror answers: otherwise this machine is offline and the test says so instead of failing.
mirror_host=$(printf '%s' "$mirror" | sed -E 's#^[a-z]+://([^/:]+).*#\1#')
if ! timeout 10 bash -c "exec 3<>/dev/tcp/$mirror_host/80" 2>/dev/null; then
  skip "$mirror_host:80 cannot be reached"
fi
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
    skip "debootstrap is missing and apt-get could not install it"
fi

work=$(mktemp -d /var/tmp/cake-installed-root.XXXXXX)
root=$work/root
# Everything mounted under the root, deepest first. (findmnt -R wants a mount point; the root is not one.)
mounts_under_root() { findmnt -n -l -o TARGET | grep -F "$root/" | sort -r || true; }
# Unmount everything under the root before deleting it: rm must never reach the bind-mounted apt cache.
cleanup() {
  local status=$? target
  trap - EXIT
  local pid
  for pid in "${daemon_pid:-}" "${nspawn_pid:-}"; do
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  for target in $(mounts_under_root); do
    umount "$target" 2>/dev/null || umount -l "$target" || true
  done
  if [ -n "$(mounts_under_root)" ]; then
    echo "installed_root_test: still mounted under $root, so it is left in place:" >&2
    mounts_under_root >&2
    status=1
  else
    rm -rf --one-file-system "$work" || status=1
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
  DEBIAN_FRONTEND=noninteractive "$@"; }
mount_root() {
  mkdir -p "$root/proc" "$root/dev/shm" "$root/var/cache/apt/archives"
  mount -t proc proc "$root/proc"
  mount -t tmpfs -o mode=1777,size=256m tmpfs "$root/dev/shm"  # the daemon's regions
  mkdir -p "$apt_archives/partial"
  mount --bind "$apt_archives" "$root/var/cache/apt/archives"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
}

# --- The packages
deb_dir=${CAKE_DEB_DIR:-}
if [ -z "$deb_dir" ]; then
  log "cpack in $build_dir"
  rm -f "$build_dir"/packages/*.deb "$build_dir"/packages/*.ddeb
  (cd "$build_dir" && cpack -G DEB >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; exit 1; }
  deb_dir=$build_dir/packages
fi
cake_deb=$(ls "$deb_dir"/cake_*.deb)
dev_deb=$(ls "$deb_dir"/libcake-dev_*.deb)
version=$(dpkg-deb -f "$cake_deb" Version)
echo "$(basename "$cake_deb"): $(du -k "$cake_deb" | cut -f1) KiB; $(basename "$dev_deb"): $(du -k "$dev_deb" | cut -f1) KiB"
echo "Depends: $(dpkg-deb -f "$cake_deb" Depends)"
echo "libcake-dev Depends: $(dpkg-deb -f "$dev_deb" Depends)"

# --- The clean root: from the cache, or made (and cached) now
mkdir -p "$cache_dir" "$apt_archives" "$root"
find "$apt_archives" -name '*.deb' -mtime +60 -delete  # versions the mirror has long replaced
if [ -f "$base_tar" ] && [ -n "$(find "$base_tar" -mtime -30)" ]; then
  log "root from $base_tar"
  tar -xf "$base_tar" -C "$root" --numeric-owner
  mount_root
else
  log "debootstrap --variant=minbase bookworm"
  # The cached .debs serve debootstrap too when the tarball is rebuilt.
  debootstrap --variant=minbase --include="$root_include" --cache-dir="$apt_archives" bookworm "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; skip "debootstrap failed (mirror?)"; }
  cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security_mirror bookworm-security main
EOF
  # Keep apt's downloads (they live in the bind-mounted cache) and start no service in the root.
  rm -f "$root/etc/apt/apt.conf.d/docker-clean"
  echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >"$root/etc/apt/apt.conf.d/10keep-debs"
  echo 'Dpkg::Use-Pty "0";' >"$root/etc/apt/apt.conf.d/10no-pty"  # no /dev/pts in the root
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  mount_root
  in_root apt-get update -qq
  in_root apt-get -y -qq dist-upgrade >/dev/null
  umount "$root/var/cache/apt/archives" "$root/dev/shm" "$root/proc"
  rm -f "$root"/var/cache/apt/*.bin
  tar -cf "$base_tar.tmp" -C "$root" --numeric-owner . && mv "$base_tar.tmp" "$base_tar"
  mount_root
fi

# --- Install, as an operator would. apt's lists in the tarball may be older than the mirror: update and retry.
log "apt-get install ./cake ./libcake-dev"
mkdir -p "$root/tmp/debs"
cp "$cake_deb" "$dev_deb" "$root/tmp/debs/"
install_debs() { in_root apt-get install -y -q /tmp/debs/"$(basename "$cake_deb")" /tmp/debs/"$(basename "$dev_deb")"; }
if ! install_debs >"$work/apt.log" 2>&1; then
  in_root apt-get update -qq
  install_debs >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; exit 1; }
fi
grep -E '^(Setting up cake|Setting up libcake|cake:)' "$work/apt.log" || true

fail() {
  echo "FAIL: $*" >&2
  if [ -n "${container_pid:-}" ]; then  # the unit's side of it
    nsenter -t "$container_pid" -a journalctl -u caked --no-pager -o short-monotonic 2>&1 | tail -30 >&2 || true
  fi
  exit 1
}
# check WHAT COMMAND...: runs COMMAND (a function below, or in_root ...), says ok or fails the test.
check() { local what=$1; shift; if "$@"; then echo "ok: $what"; else fail "$what"; fi; }
mode_of() { in_root stat -c '%a %U:%G' "$1"; }
upstream=${version%-*}  # 0.1.0-1: the package's revision is not the programs'

version_is() { [ "$(in_root "$1" --version)" = "$1 $upstream" ]; }
not_stripped() { file -L "$root/usr/bin/caked" "$root/usr/bin/cakectl" | grep -q 'not stripped'; }
nologin_user() { in_root getent passwd cake | grep -q ':/usr/sbin/nologin$'; }
is_conffile() { in_root dpkg-query -W -f='${Conffiles}' cake | grep -q ' */etc/cake/caked.toml '; }
installed_disabled() {
  [ -f "$root/lib/systemd/system/caked.service" ] &&
    [ ! -e "$root/etc/systemd/system/multi-user.target.wants/caked.service" ]
}
verify_clean() {
  local out
  out=$(in_root systemd-analyze verify /lib/systemd/system/caked.service 2>&1) || { echo "$out"; return 1; }
  [ -z "$out" ] || { echo "$out"; return 1; }
}
man_renders() { in_root env MANWIDTH=100 man -l "/usr/share/man/$1.gz" 2>/dev/null | grep -q '^NAME'; }
consumer_runs() { in_root "$1" /run/cake/caked.sock | tee "$work/consumer.out" && grep -q 'mapped and released' "$work/consumer.out"; }
pkg_config_build() {
  in_root sh -c 'g++ -std=c++20 -O1 -DCAKE_CONSUMER_VERSION="\"$(pkg-config --modversion cake-client)\"" \
    /tmp/consumer/main.cc -o /tmp/consumer/pc $(pkg-config --cflags --libs cake-client)'
}
reinstall_keeps_config() {
  echo '# an operator was here' >>"$root/etc/cake/caked.toml"
  in_root dpkg --force-confold -i "/tmp/debs/$(basename "$cake_deb")" >/dev/null &&
    grep -q 'an operator was here' "$root/etc/cake/caked.toml" &&
    [ "$(mode_of /etc/cake/caked.toml)" = "640 root:cake" ]
}
# A host without systemd-sysusers and systemd-tmpfiles (a container): the postinst falls back to useradd.
fallback_makes_user() {
  local tool status=0
  in_root userdel cake
  for tool in systemd-sysusers systemd-tmpfiles; do mv "$root/usr/bin/$tool" "$root/usr/bin/$tool.off"; done
  # As dpkg runs it (deb-systemd-helper refuses to run otherwise).
  in_root env DPKG_MAINTSCRIPT_PACKAGE=cake DPKG_MAINTSCRIPT_NAME=postinst \
    /var/lib/dpkg/info/cake.postinst configure "$version" >/dev/null &&
    in_root getent passwd cake >/dev/null &&
    [ "$(mode_of /etc/cake/private)" = "700 cake:cake" ] &&
    [ "$(mode_of /etc/cake/caked.toml)" = "640 root:cake" ] || status=1
  for tool in systemd-sysusers systemd-tmpfiles; do mv "$root/usr/bin/$tool.off" "$root/usr/bin/$tool"; done
  return $status
}
nothing_left() {
  local path
  for path in /usr/bin/caked /usr/bin/cakectl /etc/cake /lib/systemd/system/caked.service /lib/sysusers.d/cake.conf \
    /usr/lib/python3/dist-packages/cake /usr/include/cake /usr/share/doc/cake /var/cache/cake; do
    [ ! -e "$root$path" ] || { echo "left: $path"; return 1; }
  done
}

log "the programs"
check "caked --version says $upstream" version_is caked
check "cakectl --version says $upstream" version_is cakectl
check "caked --check-config accepts /etc/cake/caked.toml (as root)" \
  in_root caked --check-config --config /etc/cake/caked.toml
check "... and as the user cake, who reads it through its group" \
  in_root setpriv --reuid=cake --regid=cake --init-groups caked --check-config --config /etc/cake/caked.toml
check "caked and cakectl are stripped (their debug info is in cake-dbgsym)" eval '! not_stripped'

log "user, group, folders, modes, unit, docs"
check "system user cake, no login" nologin_user
check "group cake" in_root getent group cake
check "/etc/cake/caked.toml is 0640 root:cake" test "$(mode_of /etc/cake/caked.toml)" = "640 root:cake"
check "/etc/cake/private is 0700 cake:cake" test "$(mode_of /etc/cake/private)" = "700 cake:cake"
check "caked.toml is a conffile" is_conffile
check "the unit is installed, and not enabled" installed_disabled
check "systemd-analyze verify caked.service prints nothing (its man:caked(8) included)" verify_clean
check "man -l caked.8 renders" man_renders man8/caked.8
check "man -l cakectl.1 renders" man_renders man1/cakectl.1
check "the docs are in /usr/share/doc/cake" test -f "$root/usr/share/doc/cake/operations.md"
check "the Python client and its stubs import" in_root /usr/bin/python3 -c 'import cake, cake.v1.kv_pb2_grpc, cake.v1.admin_pb2'

log "a daemon from the package, and an engine built against libcake-dev"
# As the unit runs it: the user cake, /run/cake its own. A small DRAM tier.
in_root install -d -m 0750 -o cake -g cake /run/cake
chroot "$root" setpriv --reuid=cake --regid=cake --init-groups caked --config /etc/cake/caked.toml \
  --dram-capacity-mib 64 >"$work/caked.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  in_root cakectl --socket /run/cake/caked.sock ping >/dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/caked.log"; fail "caked exited"; }
  sleep 0.2
done
check "cakectl ping answers" in_root cakectl --socket /run/cake/caked.sock ping
check "the socket is 0660 cake:cake" test "$(mode_of /run/cake/caked.sock)" = "660 cake:cake"
cp -r "$source_dir/tests/package/consumer" "$root/tmp/consumer"
check "the consumer configures with find_package(cake)" \
  in_root cmake -S /tmp/consumer -B /tmp/consumer/build -DCMAKE_BUILD_TYPE=Release
check "... builds" in_root cmake --build /tmp/consumer/build
check "... connects, pings, maps a region" consumer_runs /tmp/consumer/build/cake_consumer
check "the consumer builds with pkg-config's cake-client" pkg_config_build
check "... and runs" consumer_runs /tmp/consumer/pc
kill "$daemon_pid"
wait "$daemon_pid" || { cat "$work/caked.log"; fail "caked did not exit 0 on SIGTERM"; }
daemon_pid=

log "the unit under systemd: the root booted with systemd-nspawn"
# systemd as PID 1 of a container is the one place here where the unit really runs, with every hardening line
# applied (namespaces, seccomp, capabilities, the device policy): an engine under its own user in the group cake
# maps a region, stores, and loads back from the disk tier (io_uring, O_DIRECT in /var/cache/cake) through
# the unit's daemon; metrics answer on loopback; reload and stop work. Where nspawn cannot boot a container (no
# cgroup access, an unprivileged container) this part is skipped, and said so.
in_container() { nsenter -t "$container_pid" -a "$@"; }
unit_prop() { in_container systemctl show -p "$1" --value caked; }
boot_container() {
  command -v systemd-nspawn >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd-container >/dev/null 2>&1 ||
    return 1
  systemd-nspawn -D "$root" -b --register=no --keep-unit --console=pipe --machine=cake-installed-root \
    >"$work/nspawn.log" 2>&1 </dev/null &
  nspawn_pid=$!
  local state=""
  for _ in $(seq 120); do
    container_pid=$(pgrep -P "$nspawn_pid" | head -1 || true)
    if [ -n "$container_pid" ]; then
      state=$(in_container systemctl is-system-running 2>/dev/null || true)
      case $state in running | degraded) return 0 ;; esac
    fi
    kill -0 "$nspawn_pid" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
unit_starts() {
  in_container systemctl start caked || { in_container journalctl -u caked --no-pager -o cat | tail -20; return 1; }
  [ "$(unit_prop ActiveState)" = active ]
}
sandboxed() {
  local status
  status=$(in_container cat "/proc/$(unit_prop MainPID)/status")
  printf '%s\n' "$status" | grep -E '^(Uid|CapEff|CapBnd|NoNewPrivs|Seccomp):'
  printf '%s\n' "$status" | grep -q '^CapEff:[[:space:]]*0*$' && printf '%s\n' "$status" | grep -q '^NoNewPrivs:[[:space:]]*1' &&
    printf '%s\n' "$status" | grep -q '^Seccomp:[[:space:]]*2'
}
engine_round_trip() { in_container setpriv --reuid=engine --regid=engine --init-groups env HOME=/ \
  /usr/bin/python3 /opt/cake-test/engine_round_trip.py /run/cake/caked.sock http://127.0.0.1:9464/metrics; }
reloads() {
  in_container systemctl reload caked && sleep 0.5 &&
    in_container journalctl -u caked --no-pager -o cat | grep -q '^reloaded access'
}
stops_cleanly() {
  in_container systemctl stop caked &&
    [ "$(unit_prop Result)" = success ] && [ "$(unit_prop ExecMainStatus)" = 0 ] &&
    [ -z "$(in_container find /dev/shm -name 'cake-*')" ]
}
# The config an operator would write: the disk tier in the unit's CacheDirectory, metrics on loopback, less DRAM.
sed -i -e 's|^# root = "/var/cache/cake".*|root = "/var/cache/cake"|' \
  -e 's|^# listen = "127.0.0.1:9464"|listen = "127.0.0.1:9464"|' \
  -e 's|^capacity_bytes = 4294967296 .*|capacity_bytes = 67108864|' "$root/etc/cake/caked.toml"
grep -q '^root = "/var/cache/cake"' "$root/etc/cake/caked.toml" || fail "could not set disk.root in caked.toml"
in_root useradd --create-home --groups cake engine
mkdir -p "$root/opt/cake-test"
cp "$source_dir/tests/package/engine_round_trip.py" "$root/opt/cake-test/"
# nspawn mounts its own /proc, /dev and /dev/shm: ours must not sit under them (they would show the host's pids).
for target in $(mounts_under_root); do umount "$target"; done
if boot_container; then
  check "caked.service starts (Type=notify: READY once it listens)" unit_starts
  check "... as the user cake, no capability, no new privileges, seccomp on" sandboxed
  check "an engine in the group cake maps a region, stores, loads it back from disk; metrics answer" engine_round_trip
  check "the journal shows the io_uring disk tier with O_DIRECT" sh -c \
    "nsenter -t $container_pid -a journalctl -u caked --no-pager -o cat | grep -q 'io_uring backend.*O_DIRECT'"
  check "systemctl reload caked re-reads [access]" reloads
  check "systemctl stop caked: exit 0, its regions unlinked" stops_cleanly
  kill "$nspawn_pid"  # SIGTERM: nspawn powers the container off
  wait "$nspawn_pid" || true
  nspawn_pid=
else
  echo "SKIP (this part): systemd-nspawn could not boot the root here; $(tail -3 "$work/nspawn.log" 2>/dev/null)"
  if [ -n "${nspawn_pid:-}" ]; then kill "$nspawn_pid" 2>/dev/null || true; wait "$nspawn_pid" 2>/dev/null || true; fi
  nspawn_pid=
fi
container_pid=
mount_root

log "reinstall, fallback, purge"
check "a reinstall keeps the edited config, and its mode" reinstall_keeps_config
check "without systemd-sysusers the postinst makes the user with useradd" fallback_makes_user
purge() { in_root apt-get purge -y -q cake libcake-dev >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; return 1; }; }
check "apt-get purge cake libcake-dev" purge
check "nothing of the packages is left" nothing_left
log "passed"
