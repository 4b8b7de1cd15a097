# `bash loadtest/bench.sh scaling`: requests/s and per-worker CPU for 1..N worker threads.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

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
        TOKIO_WORKER_THREADS=$w "$(native_bin)" 127.0.0.1:$NATIVE_PORT 2>/dev/null &
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
