# `bash loadtest/bench.sh cpu`: server CPU per `hello` request, pinned, next to native and the lifecycle's p50; what tracing adds.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

cpu() {
    need wrk wrk
    need taskset util-linux
    need perf linux-perf
    need h2load nghttp2-client
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
        # The same two over h2 (cleartext, prior knowledge).
        start_pinned_native
        r[native_h2]+="$(pinned_h2 http://127.0.0.1:$NATIVE_PORT/ "$NATIVE_PID")"$'\n'
        stop "$NATIVE_PID"
        PIN=0 start_tern "$config" TERN_LOG=info,tern::access=off
        r[nolog_h2]+="$(pinned_h2 http://127.0.0.1:$TERN_PORT/hello "$TERN_PID")"$'\n'
        stop "$TERN_PID"
        lifecycle+="$(taskset -c 0 target/release/examples/phases builtin:hello 100000 |
            awk '$1 == "total" { gsub("µs", ""); print $2, $5 }')"$'\n'
    done
    local k
    local -A spread=()
    for k in "${!r[@]}"; do
        spread[$k]=$(printf '%s' "${r[$k]}" | grep . | cpu_range)
        r[$k]=$(printf '%s' "${r[$k]}" | grep . | least_cpu)
    done
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
    local n2cpu l2cpu
    n2cpu=$(echo "${r[native_h2]}" | cut -d' ' -f7)
    l2cpu=$(echo "${r[nolog_h2]}" | cut -d' ' -f7)
    cpu_row() { # label key
        read -r rps p50 p99 p999 err reqs us <<<"${r[$2]}"
        echo "| $1 | **$us µs** | ${spread[$2]} µs | $rps | $p50 µs | $p99 µs | $p999 µs | $err |"
    }
    {
        header "CPU per request: Tern \`hello\` against native hyper, one pinned worker" "bash loadtest/bench.sh cpu"
        echo "Each server runs one worker pinned to core 0 (\`taskset -c 0\`; Tern with"
        echo "\`[server] worker_threads = 1\`, native with \`TOKIO_WORKER_THREADS=1\`); \`wrk -t1 -c$CONNS\` runs"
        echo "pinned to core 1, so no load generator shares the server's core. CPU is the server"
        echo "process's user + system time (\`/proc/PID/stat\`, all its threads) over the run divided by"
        echo "the requests answered; the least disturbed of $ROUNDS alternating rounds is shown. The"
        echo "lifecycle p50 is \`phases builtin:hello\` (instantiate + run + teardown of the same guest,"
        echo "no server) pinned to core 0 in the same run. The h2 rows: \`h2load -c$CONNS -m1 -t1\` pinned"
        echo "to core 1 (cleartext HTTP/2 with prior knowledge, one stream in flight per connection)."
        echo
        echo "| server | CPU per request | over the rounds | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|"
        cpu_row "native hyper hello" native
        cpu_row "Tern \`hello\` (defaults: access log on)" tern
        cpu_row "Tern \`hello\`, access log off" nolog
        cpu_row "native hyper hello, h2 (\`h2load -c$CONNS -m1\`)" native_h2
        cpu_row "Tern \`hello\`, access log off, h2" nolog_h2
        echo
        echo "- lifecycle p50 of \`hello\` (instantiate + run + teardown): **$life µs** (mean $mean µs: one request in 16 also returns 16 slots' pages to the kernel)"
        echo "- Tern − native: **$(awk -v a="$tcpu" -v b="$ncpu" 'BEGIN { printf "%.1f", a - b }') µs** per request (access log off: $(awk -v a="$lcpu" -v b="$ncpu" 'BEGIN { printf "%.1f", a - b }') µs = $(awk -v a="$lcpu" -v b="$ncpu" -v l="$life" 'BEGIN { printf "%.2f", (a - b) / l }') × the lifecycle p50; h2: $(awk -v a="$l2cpu" -v b="$n2cpu" 'BEGIN { printf "%.1f", a - b }') µs = $(awk -v a="$l2cpu" -v b="$n2cpu" -v l="$life" 'BEGIN { printf "%.2f", (a - b) / l }') ×); goal ≤ 1.2 × the lifecycle p50"
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

# The mean time per iteration, in ns, of criterion bench $1's functions matching $2, run pinned
# to core 0 (short warm-up and measurement: a reference figure, not a study).
criterion_ns() { # bench filter
    taskset -c 0 cargo bench --quiet -p tern --bench "$1" -- --warm-up-time 1 --measurement-time 3 "$2" 2>/dev/null |
        awk '{ for (i = 1; i <= NF; i++) if ($i == "time:") {
                   v = $(i + 3); u = $(i + 4)
                   if (u == "µs") v *= 1000; else if (u == "ms") v *= 1e6
                   printf "%.0f\n", v; exit } }'
}
