#!/usr/bin/env bash
# Runs every measurement in README.md once: LMCache 0.5.6's in-process engine (lmcache_kv_roundtrip.py) on
# local disk and on a private Redis (redis:// and resp://), then LMCache's own L2-adapter benchmark
# (`lmcache bench l2`, the multi-process server's storage tier) on fs and resp. Needs the venv of README.md.
# Usage: bash run_all.sh [OUT.jsonl]   (2 GiB per run; about 3 minutes on the 2-core VM)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${LMCACHE_VENV:-/tmp/lmcache-venv}"
out="${1:-/tmp/lmcache-results.jsonl}"
port="${REDIS_PORT:-6399}"
work="$(mktemp -d /tmp/lmcache-run.XXXXXX)"
export PYTHONHASHSEED=0 LMCACHE_DISABLE_BANNER=1 PYTHONWARNINGS=ignore

redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$work" \
  --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log"
trap 'kill "$(cat "$work/redis.pid")" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

run() {  # one engine round trip; its JSON line goes to $out, LMCache's log to $work/engine.log
  redis-cli -p "$port" flushall >/dev/null
  timeout 400 "$venv/bin/python" "$here/lmcache_kv_roundtrip.py" --dir "$work/disk" "$@" >>"$out" 2>>"$work/engine.log" ||
    echo "run $* exited $?" >&2
}
run --backend disk
run --backend disk --cold
run --backend disk --cold --odirect
run --backend resp --url "resp://127.0.0.1:$port"
run --backend redis --url "redis://127.0.0.1:$port/0?socket_timeout=120"
run --backend redis --url "redis://127.0.0.1:$port" --stall 20  # redis-py's default 5 s socket timeout: fails

for spec in "{\"type\":\"fs\",\"base_path\":\"$work/l2fs\"}" "{\"type\":\"resp\",\"host\":\"127.0.0.1\",\"port\":$port}"; do
  redis-cli -p "$port" flushall >/dev/null
  mkdir -p "$work/l2fs"
  timeout 400 "$venv/bin/lmcache" bench l2 --l2-adapter "$spec" --num-keys 64 --data-size-kb 32768 \
    --in-flight 1 --rounds 1 --warmup-rounds 0 --no-skip-verify --format json --output "$work/l2.json" \
    >"$work/l2.log" 2>&1
  grep -h "Verify" "$work/l2.log" >&2 || true
  "$venv/bin/python" - "$work/l2.json" "$spec" >>"$out" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
ops = {v["operation"]: v for k, v in m.items() if k.startswith("op_")}
print(json.dumps({"bench": "lmcache bench l2", "adapter": json.loads(sys.argv[2])["type"],
                  "keys": m["config"]["num_keys"], "key_MiB": m["config"]["data_size_kb"] / 1024,
                  "store_s": ops["Store"]["duration_avg_ms"] / 1e3, "store_MiBps": ops["Store"]["throughput_avg_mbps"],
                  "load_s": ops["Load"]["duration_avg_ms"] / 1e3, "load_MiBps": ops["Load"]["throughput_avg_mbps"],
                  "stored": ops["Store"]["total_success"], "loaded": ops["Load"]["total_success"]}))
PY
  rm -rf "$work/l2fs"
done
echo "results in $out" >&2
