# `bash loadtest/bench.sh kv`: what a key-value round trip adds to a request, SQLite and Redis.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

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
