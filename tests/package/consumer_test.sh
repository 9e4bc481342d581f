#!/usr/bin/env bash
# The client library as another project gets it: `cmake --install BUILD_DIR --component dev` into a scratch prefix,
# then tests/package/consumer is built against that prefix twice, with find_package(cake CONFIG) and with
# pkg-config's cake-client, and each build connects to a caked of BUILD_DIR, pings it and maps a region.
# Usage: tests/package/consumer_test.sh BUILD_DIR CAKED CAKECTL. Needs neither root nor the network.
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${1:?usage: consumer_test.sh BUILD_DIR CAKED CAKECTL}
caked=${2:?}
cakectl=${3:?}

work=$(mktemp -d)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
prefix=$work/prefix

echo "== cmake --install $build_dir --component dev --prefix $prefix"
cmake --install "$build_dir" --component dev --prefix "$prefix" >"$work/install.log"
# Nothing of the tree but what the package promises: headers under include/cake, libraries, the two configs.
find "$prefix" -type f | sed "s#^$prefix/##" | sort

echo "== a caked of this build"
socket=$work/run/caked.sock
"$caked" --run-dir "$work/run" --dram-capacity-mib 64 --no-cuda >"$work/caked.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  "$cakectl" --socket "$socket" ping >/dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/caked.log"; exit 1; }
  sleep 0.2
done

echo "== find_package(cake CONFIG)"
cmake -S "$source_dir/tests/package/consumer" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer"
"$work/consumer/cake_consumer" "$socket" | tee "$work/cmake.out"
grep -q 'mapped and released' "$work/cmake.out"

echo "== pkg-config cake-client"
pc_dir=$(dirname "$(find "$prefix" -name cake-client.pc)")
export PKG_CONFIG_PATH=$pc_dir
g++ -std=c++20 -O1 -DCAKE_CONSUMER_VERSION="\"$(pkg-config --modversion cake-client)\"" \
  "$source_dir/tests/package/consumer/main.cc" -o "$work/pc" $(pkg-config --cflags --libs cake-client)
"$work/pc" "$socket" | tee "$work/pc.out"
grep -q 'mapped and released' "$work/pc.out"

kill "$daemon_pid"
wait "$daemon_pid"
daemon_pid=
echo "passed"
