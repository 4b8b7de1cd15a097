#!/usr/bin/env bash
# Instructions a server executes per request, counted by callgrind: exact and repeatable on a
# noisy machine, where CPU time per request moves by more than a small change saves.
#
#   bash loadtest/instructions.sh BIN hit|hello|native|native-1k [N] [OUT_DIR]
#
# `hit`: the tern binary BIN serves the suite's `cache_headers` guest with `[tenant.cache]` on,
# every request a hit of a 1 KB answer (as loadtest/ab-hit.sh; `HEADERS=8`: an answer with 8
# headers, as an origin's static file often has, instead of 2); `hello`: `builtin:hello`;
# `native` / `native-1k`: BIN is native-hello (`cargo build --release -p tern-loadtest`),
# answering 17 bytes, or the hit's 1,000 bytes with its headers. The server runs under
# `valgrind --tool=callgrind` with collection off; after 200 requests it is switched on, N
# requests (default 2000) are sent by `h2load --h1` over 4 connections, one at a time on
# each, and the counts are dumped. Printed: instructions per request of the thread that served
# them (the busiest; other threads, such as the epoch ticker, tick by the clock, and a
# server under callgrind is ~50x slower, so their counts say nothing per request), and the
# functions with the most inclusive instructions. With OUT_DIR the callgrind files are kept
# there (`callgrind_annotate --inclusive=yes FILE`). PROTO=h2: the requests over cleartext
# HTTP/2 (prior knowledge, one stream in flight per connection) instead of HTTP/1.1.
# PROTO=h3 (`tern` only): over HTTP/3 on a TLS listener with a certificate made for the run,
# sent by `target/release/h3load` (`cargo build --release -p tern-loadtest`) with
# `H3LOAD_REQUESTS`, 4 connections, one request in flight on each. Each run of h3load opens
# its connections (QUIC handshakes are costly), so two are counted, 200 requests and N + 200,
# and the per-request figure is their difference over N: the handshakes cancel; the
# callgrind files kept are the second run's.
#
# Only user-space instructions are counted: not the kernel's TCP, system calls and wake-ups
# (`loadtest/README.md`'s cost ledger has those), and not cycles (a miss costs the same count).
# Needs valgrind and h2load (nghttp2-client). A tern server runs with a small pool (4 slots:
# valgrind cannot reserve the default pool's address space), access log off.
set -euo pipefail

usage() { echo "usage: bash loadtest/instructions.sh BIN hit|hello|native|native-1k [N] [OUT_DIR]" >&2; exit 2; }
[ $# -ge 2 ] && [ -x "$1" ] || usage
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "$1") KIND=$2 N=${3:-2000} OUT=${4:-}
for tool in valgrind callgrind_control h2load curl; do
    command -v $tool >/dev/null || { echo "instructions.sh needs $tool (apt-get install valgrind nghttp2-client curl)" >&2; exit 2; }
done
PORT=18580
case ${PROTO:-h1} in
h1) LOAD=(h2load --h1) ;;
h2) LOAD=(h2load) ;;
h3)
    H3LOAD=$ROOT/target/release/h3load
    [ -x "$H3LOAD" ] || { echo "PROTO=h3 needs $H3LOAD: cargo build --release -p tern-loadtest" >&2; exit 2; }
    case $KIND in native*) echo "PROTO=h3 counts a tern binary (hit or hello)" >&2; exit 2 ;; esac
    ;;
*) echo "PROTO is h1, h2 or h3" >&2; exit 2 ;;
esac
WORK=$(mktemp -d)
trap 'kill "${PID:-}" 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
case $KIND in
hit | hello)
    if [ "$KIND" = hit ]; then
        GUEST=$ROOT/target/test-guests/wasm32-wasip1/guest/cache_headers.wasm
        [ -f "$GUEST" ] || { echo "build the test guests first (see loadtest/ab-hit.sh)" >&2; exit 2; }
        printf '[[tenant]]\nname = "obj"\nmodule = "%s"\n[tenant.cache]\nenabled = true\n' "$GUEST" >"$WORK/tenant.toml"
        URL="http://127.0.0.1:$PORT/obj?n=1000&h=cache-control:max-age%3D3600"
        # HEADERS=8: the stored answer has 8 headers, as an origin's static answer often does
        # (the default: content-type and cache-control).
        if [ "${HEADERS:-2}" = 8 ]; then
            URL+="&h=etag:%22v1-5f2a%22&h=last-modified:Mon,%2007%20Dec%202026%2009:00:00%20GMT"
            URL+="&h=x-content-type-options:nosniff&h=strict-transport-security:max-age%3D63072000"
            URL+="&h=access-control-allow-origin:*&h=x-frame-options:DENY"
        fi
    else
        printf '[[tenant]]\nname = "hello"\nmodule = "builtin:hello"\npaths = ["/hello"]\n' >"$WORK/tenant.toml"
        URL="http://127.0.0.1:$PORT/hello"
    fi
    TLS=
    if [ "${PROTO:-h1}" = h3 ]; then
        bash "$ROOT/loadtest/self-signed.sh" "$WORK" bench.test
        TLS="tls_listen = \"127.0.0.1:$((PORT + 2))\"\nhttp3 = true\n"
        TLS+="[[certificate]]\ncert = \"$WORK/cert.pem\"\nkey = \"$WORK/key.pem\"\n"
    fi
    { printf '[server]\nworker_threads = 1\n%b[pool]\ninstances = 4\n' "$TLS"; cat "$WORK/tenant.toml"; } >"$WORK/tern.toml"
    export TERN_CACHE_DIR="$WORK/cache" TERN_DATA_DIR="$WORK/data" TERN_LOG=warn,tern::access=off
    CMD=("$BIN" serve --config "$WORK/tern.toml" --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:$((PORT + 10)))
    ;;
native | native-1k)
    size=; [ "$KIND" = native-1k ] && size=1000
    URL="http://127.0.0.1:$PORT/"
    export TOKIO_WORKER_THREADS=1
    CMD=("$BIN" 127.0.0.1:$PORT $size)
    ;;
*) usage ;;
esac

valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes \
    --callgrind-out-file="$WORK/cg.out" "${CMD[@]}" >"$WORK/server.log" 2>&1 &
PID=$!
for _ in $(seq 600); do curl -fs -o /dev/null "$URL" 2>/dev/null && break; sleep 0.2; done
curl -fs -o /dev/null "$URL" || { echo "not up: $URL" >&2; tail -20 "$WORK/server.log" >&2; exit 1; }
# The busiest thread's file of dump $1 (one file per thread, -NN suffix): sets best and most.
busiest() {
    best= most=0
    for f in "$WORK"/cg.out."$1"-*; do
        total=$(awk '/^summary:/ { print $2 }' "$f")
        [ -n "$total" ] && [ "$total" -gt "$most" ] && { most=$total; best=$f; }
    done
    [ -n "$best" ] || { echo "no callgrind counts were dumped" >&2; exit 1; }
}
if [ "${PROTO:-h1}" = h3 ]; then
    # `h3load` sends exactly H3LOAD_REQUESTS and prints RATE COUNT ERRORS.
    h3() {
        local out
        out=$(H3LOAD_REQUESTS=$1 "$H3LOAD" h3 127.0.0.1:$((PORT + 2)) bench.test "$WORK/cert.pem" \
            "${URL#http://127.0.0.1:$PORT}" 600 4 1 keepalive)
        read -r _ count errors <<<"$out"
        [ "$count" = "$1" ] && [ "$errors" = 0 ] || { echo "h3load: $count of $1 answered, $errors failed" >&2; exit 1; }
    }
    h3 200
    callgrind_control -i on "$PID" >/dev/null
    h3 200
    sleep 1
    callgrind_control -d "$PID" >/dev/null
    h3 $((N + 200))
    sleep 1
    callgrind_control -d "$PID" >/dev/null
    sleep 1
    kill "$PID"; wait "$PID" 2>/dev/null || true
    # The same thread's counts in both dumps (the busiest of the second).
    busiest 2
    first=$(awk '/^summary:/ { print $2 }' "${best/cg.out.2-/cg.out.1-}")
    most=$((most - first))
    PER=$((N + 200)) # the functions below: the second run's, its handshakes in them
else
    "${LOAD[@]}" -n 200 -c 4 -m 1 "$URL" >/dev/null
    callgrind_control -i on "$PID" >/dev/null
    done_=$("${LOAD[@]}" -n "$N" -c 4 -m 1 "$URL" | awk '/^requests:/ { print $8 }')
    callgrind_control -d "$PID" >/dev/null
    [ "$done_" = "$N" ] || { echo "only $done_ of $N requests succeeded" >&2; exit 1; }
    sleep 1
    kill "$PID"; wait "$PID" 2>/dev/null || true
    busiest 1
    PER=$N
fi
printf '%s %s %s: %d instructions per request (%d requests, thread file %s)\n' \
    "$(basename "$BIN")" "$KIND" "${PROTO:-h1}" $((most / N)) "$N" "$(basename "$best")"
callgrind_annotate --inclusive=yes "$best" 2>/dev/null | awk -v n="$PER" '
    /^-+$/ { dash++; next }
    dash >= 3 && $1 ~ /^[0-9,]+$/ { c = $1; gsub(",", "", c); $1 = ""; $2 = $2;
        if (shown++ < 40) printf "%9.0f  %s\n", c / n, substr($0, 1, 150) }'
if [ -n "$OUT" ]; then mkdir -p "$OUT"; cp "$WORK"/cg.out* "$OUT"/; fi
