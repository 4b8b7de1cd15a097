#!/usr/bin/env bash
# Two tern binaries side by side: server CPU per request to one tenant (`builtin:hello` unless
# MODULE says otherwise), pinned, in alternating rounds.
# For a change that must not cost CPU (a refactor): build the commit before and the one after,
# then compare them here in one run.
#
#   bash loadtest/ab.sh BEFORE_BIN AFTER_BIN
#
# Each round starts one binary serving MODULE with one worker pinned to core 0, warms it
# for 3 s, then runs `wrk -t1 -c$CONNS -d${SECS}s` (or `h2load -c$CONNS -m1 -D$SECS` with
# PROTO=h2, `h3load` with PROTO=h3) pinned to core 1 and reads the server's CPU
# (utime + stime, /proc/PID/stat) over the run. Rounds alternate BEFORE, AFTER, ... and the order
# is reversed halfway, so drift favours neither. Prints every round, then each binary's range
# and median of µs CPU per request.
#
# Settings (environment): SECS=8, ROUNDS=6 (per binary), CONNS=64, PORT=18080 (and PORT+1 for
# the admin listener), BODY=0 (N > 0: each request is a `POST` with an N-byte body, which the
# listeners hand on as a streaming request body), PIPELINE=0 (N > 0: each connection sends N
# requests at once, loadtest/pipeline.lua: the load generator is woken once per N answers; not
# with BODY; with PROTO=h2 or h3, N streams in flight per connection), MODULE=builtin:hello (any
# tenant module: `builtin:wasi-http` for the Rust `wasi:http` component, a path to a .wasm),
# PROTO=h1 (h2: HTTP/2 over cleartext with prior knowledge, by h2load of nghttp2-client; h3:
# HTTP/3 on the TLS listener's port PORT+2 with a self-signed certificate made for the run, by
# target/release/h3load, as `bench.sh h3` (`cargo build --release -p tern-loadtest`); neither
# with BODY),
# WORKERS=1 (2: the server runs two workers on both cores and the load generator two threads
# on the same two cores; for what workers share, such as metrics every request writes).
# With PROTO=h3 and WORKERS=2, h3load is still one thread (on both cores). A round whose load
# answered nothing, or with errors, is said on stderr (none answered: the run stops).
# Needs wrk (or h2load; or h3load and openssl) and taskset (util-linux) and 2 cores.
set -euo pipefail

if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: bash loadtest/ab.sh BEFORE_BIN AFTER_BIN (two executable tern binaries)" >&2
    exit 2
fi
SECS=${SECS:-8} ROUNDS=${ROUNDS:-6} CONNS=${CONNS:-64} PORT=${PORT:-18080} BODY=${BODY:-0}
MODULE=${MODULE:-builtin:hello} PROTO=${PROTO:-h1} WORKERS=${WORKERS:-1}
case "$WORKERS" in
    1) SERVER_CPUS=0 LOAD_CPUS=1 ;;
    2) SERVER_CPUS=0,1 LOAD_CPUS=0,1 ;;
    *) echo "ab.sh: WORKERS is 1 or 2, not $WORKERS" >&2; exit 2 ;;
esac
case "$PROTO" in
    h1) command -v wrk >/dev/null || { echo "ab.sh needs wrk (apt-get install wrk)" >&2; exit 2; } ;;
    h2)
        command -v h2load >/dev/null || { echo "ab.sh PROTO=h2 needs h2load (apt-get install nghttp2-client)" >&2; exit 2; }
        [ "$BODY" -eq 0 ] || { echo "ab.sh: BODY is for PROTO=h1 only" >&2; exit 2; }
        ;;
    h3)
        H3LOAD=$(cd "$(dirname "$0")/.." && pwd)/target/release/h3load
        [ -x "$H3LOAD" ] || { echo "ab.sh PROTO=h3 needs $H3LOAD (cargo build --release -p tern-loadtest)" >&2; exit 2; }
        [ "$BODY" -eq 0 ] || { echo "ab.sh: BODY is for PROTO=h1 only" >&2; exit 2; }
        ;;
    *) echo "ab.sh: PROTO is h1, h2 or h3, not $PROTO" >&2; exit 2 ;;
esac
case "$MODULE" in
    builtin:*) ;;
    *) [ -f "$MODULE" ] || { echo "ab.sh: MODULE $MODULE: no such file" >&2; exit 2; }
       MODULE=$(realpath "$MODULE") ;;
esac
ADMIN=$((PORT + 1))
WORK=$(mktemp -d)
trap 'kill "${PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
# HTTP/3: a TLS listener on PORT+2 with a certificate made for the run.
TLS_KEYS= CERTIFICATE=
if [ "$PROTO" = h3 ]; then
    bash "$(dirname "$0")/self-signed.sh" "$WORK" bench.test 2
    TLS_KEYS=$(printf 'tls_listen = "127.0.0.1:%s"\nhttp3 = true\n' $((PORT + 2)))
    CERTIFICATE=$(printf '[[certificate]]\ncert = "%s"\nkey = "%s"\n' "$WORK/cert.pem" "$WORK/key.pem")
fi
printf '[server]\nworker_threads = %s\n%s\n[[tenant]]\nname = "hello"\nmodule = "%s"\npaths = ["/hello"]\n%s\n' \
    "$WORKERS" "$TLS_KEYS" "$MODULE" "$CERTIFICATE" >"$WORK/tern.toml"
STREAMS=${PIPELINE:-0}
[ "$STREAMS" -gt 0 ] || STREAMS=1
WRK_ARGS=()
if [ "$BODY" -gt 0 ]; then
    printf 'wrk.method = "POST"\nwrk.body = string.rep("x", %d)\n' "$BODY" >"$WORK/post.lua"
    WRK_ARGS=(-s "$WORK/post.lua")
elif [ "${PIPELINE:-0}" -gt 0 ]; then
    WRK_ARGS=(-s "$(cd "$(dirname "$0")" && pwd)/pipeline.lua")
fi

# One load of $1 seconds against /hello, its summary on stdout (wrk's; or h2load's rate and its
# count of 2xx answers; or h3load's "rate answers errors").
load() { # secs
    if [ "$PROTO" = h3 ]; then
        taskset -c "$LOAD_CPUS" "$H3LOAD" h3 127.0.0.1:$((PORT + 2)) bench.test "$WORK/cert.pem" /hello "$1" "$CONNS" "$STREAMS" keepalive |
            awk '{ print "h3load:", $0 }'
    elif [ "$PROTO" = h2 ]; then
        taskset -c "$LOAD_CPUS" h2load -t"$WORKERS" -c"$CONNS" -m"$STREAMS" -D"$1" "http://127.0.0.1:$PORT/hello" | grep -E '^(finished in|status codes:)'
    else
        taskset -c "$LOAD_CPUS" wrk "${WRK_ARGS[@]}" -t"$WORKERS" -c"$CONNS" -d"$1s" "http://127.0.0.1:$PORT/hello" -- "${PIPELINE:-0}"
    fi
}

round() { # binary label -> "label rps µs/request"
    env TERN_CACHE_DIR="$WORK/cache-$2" TERN_DATA_DIR="$WORK/data-$2" TERN_LOG=warn \
        taskset -c "$SERVER_CPUS" "$1" serve --config "$WORK/tern.toml" --listen 127.0.0.1:$PORT \
        --admin-listen 127.0.0.1:$ADMIN >>"$WORK/$2.log" 2>&1 &
    PID=$!
    local ready=0
    for _ in $(seq 1 300); do
        curl -fs -o /dev/null "http://127.0.0.1:$ADMIN/readyz" && { ready=1; break; }
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    if [ "$ready" = 0 ]; then
        echo "ab.sh: $1 did not become ready; its log:" >&2
        cat "$WORK/$2.log" >&2
        exit 1
    fi
    # (This runs in a pipeline's subshell: the exit trap does not see PID, so a failed load
    # stops the server here.)
    local t0 t1 out
    load 3 >/dev/null || { kill "$PID"; echo "ab.sh: the load generator failed" >&2; exit 1; }
    t0=$(awk '{ print $14 + $15 }' "/proc/$PID/stat")
    out=$(load "$SECS") || { kill "$PID"; echo "ab.sh: the load generator failed" >&2; exit 1; }
    t1=$(awk '{ print $14 + $15 }' "/proc/$PID/stat")
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=
    echo "$out" | awk -v l="$2" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '
        /requests in/ { n = $1 } /Requests\/sec/ { r = $2 }
        /^finished in/ { r = $4 } /^status codes:/ { n = $3 }
        /^h3load:/ { r = $2; n = $3; e = $4 }
        /Non-2xx or 3xx responses:/ { e = $NF } /Socket errors:/ { e = "socket errors" }
        END {
            if (e != "" && e != "0") printf "ab.sh: %s: %s failed requests in this round\n", l, e > "/dev/stderr"
            if (n > 0) printf "%s %.0f %.2f\n", l, r, t / hz * 1e6 / n
            else { printf "ab.sh: %s: no request answered\n", l > "/dev/stderr"; exit 1 }
        }'
}

results=$WORK/results
for i in $(seq 1 "$ROUNDS"); do
    if [ "$i" -le $((ROUNDS / 2)) ]; then order=(before after); else order=(after before); fi
    for label in "${order[@]}"; do
        if [ "$label" = before ]; then bin=$1; else bin=$2; fi
        round "$bin" "$label" | tee -a "$results" | awk '{ printf "%-6s %7s req/s %6s µs CPU/request\n", $1, $2, $3 }'
    done
done
for label in before after; do
    awk -v l="$label" '$1 == l { print $3 }' "$results" | sort -n | awk -v l="$label" '
        { v[NR] = $1 } END {
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%-6s %.2f-%.2f µs CPU per request, median %.2f (%d rounds)\n", l, v[1], v[NR], m, NR }'
done
