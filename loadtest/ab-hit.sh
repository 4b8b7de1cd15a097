#!/usr/bin/env bash
# Cache hits of two tern binaries side by side, and the native hyper hello in the same run:
# server CPU per request, pinned, in alternating rounds.
#
#   bash loadtest/ab-hit.sh BEFORE_BIN AFTER_BIN
#
# Each binary serves the suite's `cache_headers` guest with `[tenant.cache]` on, one worker
# pinned to core 0; a 1 KB answer (`Cache-Control: max-age=3600`) is stored by a first request,
# then asked again and again by `wrk -t1 -c32` pinned to core 1 (every request a hit). CPU:
# utime + stime of the server (/proc/PID/stat) over the run. The native hello
# (`target/release/native-hello`, one tokio worker) runs in each round too, twice: as the hello
# (17 bytes), and answering what the hit answers (`native-hello ADDR 1000`: the same 1,000 bytes
# kept once, with the stored answer's headers) — the floor for serving that answer with hyper.
#
# Settings (environment): SECS=5, ROUNDS=3, HEADERS=2 (8: a stored answer with 8 headers), NATIVE=target/release/native-hello (another build of
# it, e.g. the profile-guided one of loadtest/results/pgo.md), PIPELINE=0 (N > 0: each connection sends N requests
# at once, loadtest/pipeline.lua, so the load generator is woken once per N answers, not once per
# answer: the servers' CPU per request without most of the closed loop's wake-ups). Needs wrk, taskset, 2 cores, and the guest built
# (`cargo build -p tern-test-guests --bins --target wasm32-wasip1 --profile guest
# --target-dir target/test-guests`, as the e2e tests and `bench.sh cache` do).
set -euo pipefail

if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: bash loadtest/ab-hit.sh BEFORE_BIN AFTER_BIN (two executable tern binaries)" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GUEST=$ROOT/target/test-guests/wasm32-wasip1/guest/cache_headers.wasm
NATIVE=${NATIVE:-$ROOT/target/release/native-hello}
[ -f "$GUEST" ] || { echo "build the test guests first (see the header)" >&2; exit 2; }
[ -x "$NATIVE" ] || { echo "build native-hello first: cargo build --release -p tern-loadtest" >&2; exit 2; }
SECS=${SECS:-5} ROUNDS=${ROUNDS:-3} PORT=18280 NATIVE_PORT=18281
OBJECT="/obj?n=1000&h=cache-control:max-age%3D3600"
# HEADERS=8: the stored answer has 8 headers (as loadtest/instructions.sh's), not 2.
if [ "${HEADERS:-2}" = 8 ]; then
    OBJECT+="&h=etag:%22v1-5f2a%22&h=last-modified:Mon,%2007%20Dec%202026%2009:00:00%20GMT"
    OBJECT+="&h=x-content-type-options:nosniff&h=strict-transport-security:max-age%3D63072000"
    OBJECT+="&h=access-control-allow-origin:*&h=x-frame-options:DENY"
fi
WORK=$(mktemp -d)
trap 'kill "${PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
printf '[server]\nworker_threads = 1\n[[tenant]]\nname = "obj"\nmodule = "%s"\n[tenant.cache]\nenabled = true\n' \
    "$GUEST" >"$WORK/tern.toml"

PIPELINE=${PIPELINE:-0}
WRK_ARGS=()
[ "$PIPELINE" -gt 0 ] && WRK_ARGS=(-s "$ROOT/loadtest/pipeline.lua")
measure() { # pid url -> "µs/request req/s"
    taskset -c 1 wrk "${WRK_ARGS[@]}" -t1 -c32 -d2s "$2" -- "$PIPELINE" >/dev/null
    local t0 t1 out
    t0=$(awk '{ print $14 + $15 }' "/proc/$1/stat")
    out=$(taskset -c 1 wrk "${WRK_ARGS[@]}" -t1 -c32 -d"${SECS}"s "$2" -- "$PIPELINE")
    t1=$(awk '{ print $14 + $15 }' "/proc/$1/stat")
    echo "$out" | awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '/requests in/ { n = $1 } /Requests\/sec/ { r = $2 }
        END { printf "%.2f %d\n", t / hz * 1e6 / n, r }'
}
wait_up() { for _ in $(seq 100); do curl -fs -o /dev/null "$1" && return; sleep 0.1; done; echo "not up: $1" >&2; exit 1; }

for round in $(seq "$ROUNDS"); do
    for label in native native-1k; do
        size=; [ $label = native-1k ] && size=1000
        TOKIO_WORKER_THREADS=1 taskset -c 0 "$NATIVE" 127.0.0.1:$NATIVE_PORT $size 2>/dev/null &
        PID=$!
        wait_up "http://127.0.0.1:$NATIVE_PORT/"
        echo "round $round $label $(measure $PID "http://127.0.0.1:$NATIVE_PORT/")"
        kill $PID; wait $PID 2>/dev/null || true
    done
    for label in before after; do
        bin=$1; [ $label = after ] && bin=$2
        env TERN_CACHE_DIR="$WORK/cache" TERN_DATA_DIR="$WORK/data-$label" TERN_LOG=warn \
            taskset -c 0 "$bin" serve --config "$WORK/tern.toml" --listen 127.0.0.1:$PORT \
            --admin-listen 127.0.0.1:$((PORT + 10)) >>"$WORK/$label.log" 2>&1 &
        PID=$!
        wait_up "http://127.0.0.1:$PORT$OBJECT"
        curl -fsI "http://127.0.0.1:$PORT$OBJECT" | grep -qi '^cache-status: tern; hit' ||
            { echo "$label: the object is not a hit" >&2; exit 1; }
        echo "round $round $label $(measure $PID "http://127.0.0.1:$PORT$OBJECT")"
        kill $PID; wait $PID 2>/dev/null || true
    done
done | tee "$WORK/rounds"
for label in native native-1k before after; do
    awk -v l=$label '$3 == l { v = $4; if (min == "" || v < min) min = v; if (v > max) max = v }
        END { printf "%-9s %.2f-%.2f µs CPU per request\n", l, min, max }' "$WORK/rounds"
done
