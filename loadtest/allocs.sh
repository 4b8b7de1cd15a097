#!/usr/bin/env bash
# Heap allocations per request of a tern binary under load: uprobes on the allocator's entry
# points, counted while `wrk` runs, divided by the requests answered.
#
#   bash loadtest/allocs.sh BIN hit|hello [OUT.data]
#
# `hit`: the suite's `cache_headers` guest with `[tenant.cache]` on, every request a hit of a
# 1 KB answer (as loadtest/ab-hit.sh); `hello`: `builtin:hello` (access log off). One worker
# pinned to core 0, `wrk -t1 -c32` on core 1, after 2 s of the same load. With OUT.data, the
# allocations' call stacks are recorded there too (`perf script --no-inline -i OUT.data`).
# Counts are exact; the probes make each allocation slow, so the rate is not a speed.
# Needs root, perf with uprobes, wrk, and the binary built with mimalloc (the default).
set -euo pipefail

if [ $# -lt 2 ] || [ ! -x "$1" ] || { [ "$2" != hit ] && [ "$2" != hello ]; }; then
    echo "usage: bash loadtest/allocs.sh BIN hit|hello [OUT.data]" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "$1") KIND=$2 OUT=${3:-}
PORT=18480
WORK=$(mktemp -d)
GROUP=ternallocs
trap 'kill "${PID:-}" 2>/dev/null || true; perf probe -q -d "$GROUP:*" 2>/dev/null || true; rm -rf "$WORK"' EXIT
case $KIND in
hit)
    GUEST=$ROOT/target/test-guests/wasm32-wasip1/guest/cache_headers.wasm
    [ -f "$GUEST" ] || { echo "build the test guests first (see loadtest/ab-hit.sh)" >&2; exit 2; }
    printf '[server]\nworker_threads = 1\n[[tenant]]\nname = "obj"\nmodule = "%s"\n[tenant.cache]\nenabled = true\n' \
        "$GUEST" >"$WORK/tern.toml"
    URL="http://127.0.0.1:$PORT/obj?n=1000&h=cache-control:max-age%3D3600"
    ;;
hello)
    printf '[server]\nworker_threads = 1\n[[tenant]]\nname = "hello"\nmodule = "builtin:hello"\npaths = ["/hello"]\n' \
        >"$WORK/tern.toml"
    URL="http://127.0.0.1:$PORT/hello"
    ;;
esac
# mimalloc's entry points as the `mimalloc` crate calls them (zalloc: alloc_zeroed).
for f in malloc zalloc realloc; do
    perf probe -q -x "$BIN" "$GROUP:$f=mi_${f}_aligned"
done
env TERN_CACHE_DIR="$WORK/cache" TERN_DATA_DIR="$WORK/data" TERN_LOG=warn,tern::access=off \
    taskset -c 0 "$BIN" serve --config "$WORK/tern.toml" --listen 127.0.0.1:$PORT \
    --admin-listen 127.0.0.1:$((PORT + 10)) >"$WORK/server.log" 2>&1 &
PID=$!
for _ in $(seq 100); do curl -fs -o /dev/null "$URL" && break; sleep 0.1; done
curl -fs -o /dev/null "$URL" || { echo "not up: $URL" >&2; cat "$WORK/server.log" >&2; exit 1; }
taskset -c 1 wrk -t1 -c32 -d2s "$URL" >/dev/null
if [ -n "$OUT" ]; then
    perf record -q -e "$GROUP:*" --call-graph dwarf,8192 -p "$PID" -o "$OUT" -- sleep 2 &
else
    perf stat -x, -e "$GROUP:*" -p "$PID" -o "$WORK/stat" -- sleep 4 &
fi
PERF=$!
sleep 0.3
requests=$(taskset -c 1 wrk -t1 -c32 -d"$([ -n "$OUT" ] && echo 1 || echo 3)"s "$URL" | awk '/requests in/ { print $1 }')
wait "$PERF"
if [ -n "$OUT" ]; then
    echo "$requests requests; stacks in $OUT"
    exit 0
fi
awk -F, -v n="$requests" '$3 ~ /:/ { split($3, e, ":"); printf "%-8s %6.2f per request\n", e[2], $1 / n }' "$WORK/stat"
