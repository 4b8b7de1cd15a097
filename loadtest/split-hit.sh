#!/usr/bin/env bash
# Where a cache hit's CPU goes, by object file, next to native hyper serving the same answer:
# the kernel, the program's own code, libc, the vDSO's clock reads.
#
#   bash loadtest/split-hit.sh TERN_BIN
#
# One server at a time, pinned to core 0 (Tern with one worker serving the suite's
# `cache_headers` guest with `[tenant.cache]` on, as loadtest/ab-hit.sh; then
# `native-hello ADDR 1000`, the same 1,000 bytes and headers from hyper alone); `wrk -t1 -c32`
# pinned to core 1 asks for the stored answer again and again. After 2 s unmeasured,
# `perf record -F 2999 -p PID` (no call graph) runs for SECS while the process's CPU is read
# from /proc/PID/stat; printed per round: the CPU per request and each object's share of the
# samples times it. perf's sampling is charged to the process (both servers show ~1.8x their
# unprofiled CPU): read the split, not the totals (those are loadtest/bench.sh cache's).
#
# Settings (environment): SECS=5, ROUNDS=3, NATIVE_BIN (as bench.sh's). Needs perf, wrk,
# taskset, 2 cores, the test guests built (see loadtest/ab-hit.sh) and native-hello
# (`cargo build --release -p tern-loadtest`). Uses loadtest/lib.sh (bench.sh's helpers).
SECS=${SECS:-5} ROUNDS=${ROUNDS:-3}
if [ $# -ne 1 ] || [ ! -x "$1" ]; then
    echo "usage: bash loadtest/split-hit.sh TERN_BIN (an executable tern binary)" >&2
    exit 2
fi
TERN_BIN=$(realpath "$1")
source "$(dirname "$0")/lib.sh"
GUEST=$ROOT/target/test-guests/wasm32-wasip1/guest/cache_headers.wasm
[ -f "$GUEST" ] || { echo "build the test guests first (see loadtest/ab-hit.sh)" >&2; exit 2; }
[ -x "$(native_bin)" ] || { echo "build native-hello first: cargo build --release -p tern-loadtest" >&2; exit 2; }
need perf linux-perf
need wrk wrk
OBJECT="/obj?n=1000&h=cache-control:max-age%3D3600"
printf '[server]\nworker_threads = 1\n[[tenant]]\nname = "obj"\nmodule = "%s"\n[tenant.cache]\nenabled = true\n' \
    "$GUEST" >"$WORK/tern.toml"

split() { # label pid url
    local t0 t1 rps cpu load
    taskset -c 1 wrk -t1 -c32 -d2s "$3" >/dev/null
    taskset -c 1 wrk -t1 -c32 -d"$((SECS + 2))"s "$3" >"$WORK/wrk" &
    load=$!
    sleep 1
    t0=$(process_ticks "$2")
    perf record -q -F 2999 -p "$2" -o "$WORK/perf.data" -- sleep "$SECS" >/dev/null 2>&1
    t1=$(process_ticks "$2")
    wait $load
    rps=$(awk '/Requests\/sec/ { print $2 }' "$WORK/wrk")
    cpu=$(awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v r="$rps" -v s="$SECS" \
        'BEGIN { printf "%.2f", t / hz * 1e6 / (r * s) }')
    echo "$1: $cpu µs CPU per request (profiled), $rps requests/s"
    perf report -i "$WORK/perf.data" --no-children --sort dso --stdio 2>/dev/null |
        awk -v c="$cpu" '/%/ && !/^#/ { s = $1; sub("%", "", s); if (s >= 0.1)
            printf "  %-22s %6.2f %%  %.2f µs\n", $2, s, s / 100 * c }'
}

for round in $(seq "$ROUNDS"); do
    PIN=0 start_tern "$WORK/tern.toml" TERN_LOG=warn
    wait_http "http://127.0.0.1:$TERN_PORT$OBJECT"
    curl -fsI "http://127.0.0.1:$TERN_PORT$OBJECT" | grep -qi '^cache-status: tern; hit' ||
        { echo "the object is not a hit" >&2; exit 1; }
    split "round $round tern hit" "$TERN_PID" "http://127.0.0.1:$TERN_PORT$OBJECT"
    stop "$TERN_PID"
    start_pinned_native 1000
    split "round $round native-1k" "$NATIVE_PID" "http://127.0.0.1:$NATIVE_PORT/"
    stop "$NATIVE_PID"
done
