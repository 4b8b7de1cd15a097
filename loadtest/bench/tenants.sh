# `bash loadtest/bench.sh tenants`: CPU per request of one server with 1, 3 and 10 tenants
# (the same `hello` loaded as that many modules), their requests interleaved request by request.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

# "MIN MAX" of the 2xx answers of tenants t0..t(K-1) so far (MIN 0 when one has none).
tenant_counts() { # k
    curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v k="$1" '
        /^tern_requests_total\{/ && /status="2xx"/ && match($0, /tenant="t[0-9]+"/) {
            n[substr($0, RSTART + 8, RLENGTH - 9)] += $NF }
        END { min = -1; max = 0; c = 0
              for (t in n) { c++; if (min < 0 || n[t] < min) min = n[t]; if (n[t] > max) max = n[t] }
              if (c < k) min = 0
              printf "%d %d\n", min, max }'
}

tenants() {
    need wrk wrk
    need taskset util-linux
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh tenants needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    local k n i cfg lo hi least
    local -a paths
    local -A c=()
    for n in $(seq 1 "$ROUNDS"); do
        for k in 1 3 10; do
            cfg=$WORK/tenants-$k.toml
            paths=()
            {
                printf '[server]\nworker_threads = 1\n'
                for i in $(seq 0 $((k - 1))); do
                    printf '[[tenant]]\nname = "t%d"\nmodule = "builtin:hello"\npaths = ["/t%d"]\n' "$i" "$i"
                    paths+=("/t$i")
                done
            } >"$cfg"
            PIN=0 start_tern "$cfg" TERN_LOG=info,tern::access=off
            taskset -c 1 wrk -t1 -c"$CONNS" -d"${WARM_SECS}s" -s loadtest/rotate.lua \
                "http://127.0.0.1:$TERN_PORT/" -- "${paths[@]}" >/dev/null
            c[$k]+="$(pinned_h1 "http://127.0.0.1:$TERN_PORT/" "$TERN_PID" -s loadtest/rotate.lua -- "${paths[@]}")"$'\n'
            # Every tenant was asked its share (the turns went where they were meant to).
            read -r lo hi <<<"$(tenant_counts "$k")"
            if [ "$lo" -eq 0 ] || [ $((lo * 11)) -lt $((hi * 10)) ]; then
                echo "bench.sh tenants: the $k tenants' answers are uneven ($lo to $hi)" >&2
                exit 1
            fi
            stop "$TERN_PID"
        done
    done
    {
        header "One server, 1, 3 and 10 tenants: CPU per request, interleaved" "bash loadtest/bench.sh tenants"
        echo "Tern with \`worker_threads = 1\` pinned to core 0 serves k tenants, each \`builtin:hello\` (the"
        echo "same bytes loaded as k modules, so k modules share the pool's slots); \`wrk -t1 -c$CONNS\`"
        echo "pinned to core 1 asks them in turn, request by request (\`loadtest/rotate.lua\`: each request"
        echo "goes to the next tenant), after ${WARM_SECS} s of the same load. CPU: the server's user + system"
        echo "time (\`/proc/PID/stat\`) over the requests answered; $ROUNDS rounds, k = 1, 3, 10 in each."
        echo
        echo "| tenants | CPU per request (least) | over the rounds | k ÷ 1, paired by round | requests/s | p50 | p99 | errors |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
        for k in 1 3 10; do
            least=$(printf '%s' "${c[$k]}" | grep . | least_cpu)
            read -r rps p50 p99 _ err _ us <<<"$least"
            echo "| $k | **$us µs** | $(printf '%s' "${c[$k]}" | grep . | cpu_range) µs | $(round_ratios "${c[$k]}" "${c[1]}" 3) | $rps | $p50 µs | $p99 µs | $err |"
        done
        echo
        echo "- Goal (issue 77): a server with several tenants pays no more per request for one of them"
        echo "  than a server with that tenant alone (k ÷ 1 ≈ 1 within the rounds' noise)."
    } | tee "$RESULTS/tenants.md"
}
