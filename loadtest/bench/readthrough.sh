# `bash loadtest/bench.sh readthrough`: the `aggregate` example in front of two backends,
# without and with readthrough (`cache = true`): requests/s, Tern's CPU per request (pinned)
# and backend requests per client request. Sourced by loadtest/bench.sh after loadtest/lib.sh.

readthrough() {
    need wrk wrk
    need taskset util-linux
    need nginx nginx
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh readthrough needs 2 cores (server on one, load and backends on the other)" >&2
        exit 1
    fi
    build
    local backends=$WORK/backends backend_port=18187
    mkdir -p "$backends"
    # Two small JSON answers, fresh for a minute (what a users or orders service might send).
    printf '{"users":[{"id":1,"name":"ada"},{"id":2,"name":"grace"}],"total":2}' >"$backends/users"
    printf '{"orders":[{"id":17,"user":1,"items":3}],"total":1}' >"$backends/orders"
    # nginx serves both, its worker on core 1 beside the load generator (Tern has core 0).
    cat >"$WORK/nginx.conf" <<NGINX
user root;
worker_processes 1;
worker_cpu_affinity 10;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 4096; }
http {
    access_log off;
    default_type application/json;
    server {
        listen 127.0.0.1:$backend_port;
        root $backends;
        add_header Cache-Control "max-age=60";
    }
}
NGINX
    nginx -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log" &
    local nginx_pid=$!
    PIDS+=("$nginx_pid")
    wait_http "http://127.0.0.1:$backend_port/users" || { cat "$WORK/nginx-error.log" >&2; exit 1; }
    local b=127.0.0.1:$backend_port
    cat >"$WORK/tern.toml" <<TOML
[server]
worker_threads = 1
[[tenant]]
name = "direct"
module = "builtin:aggregate"
paths = ["/direct"]
[tenant.outbound.backends.users]
url = "http://$b"
[tenant.outbound.backends.orders]
url = "http://$b"
[[tenant]]
name = "cached"
module = "builtin:aggregate"
paths = ["/cached"]
[tenant.cache]
enabled = true
front = false
[tenant.outbound.backends.users]
url = "http://$b"
cache = true
[tenant.outbound.backends.orders]
url = "http://$b"
cache = true
TOML
    # Backend requests of tenant $1 so far (every status).
    sent() {
        curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v t="$1" '
            /^tern_outbound_requests_total\{/ && index($0, "tenant=\"" t "\"") { n += $2 }
            END { printf "%d\n", n }'
    }
    local -A r=() per=()
    local n tenant before line
    PIN=0 start_tern "$WORK/tern.toml" TERN_LOG=warn
    for tenant in direct cached; do
        curl -fs -o /dev/null "http://127.0.0.1:$TERN_PORT/$tenant/" || { echo "$tenant does not answer" >&2; exit 1; }
    done
    for n in $(seq 1 "$ROUNDS"); do
        for tenant in direct cached; do
            before=$(sent "$tenant")
            line=$(pinned_h1 "http://127.0.0.1:$TERN_PORT/$tenant/" "$TERN_PID")
            r[$tenant]+="$line"$'\n'
            per[$tenant]+="$(awk -v a="$before" -v b="$(sent "$tenant")" -v n="$(echo "$line" | cut -d' ' -f6)" \
                'BEGIN { printf "%.4f", (n > 0 ? (b - a) / n : 0) }')"$'\n'
        done
    done
    stop "$TERN_PID"
    stop "$nginx_pid"
    local all_direct=${r[direct]} all_cached=${r[cached]}
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | least_cpu); done
    row_of() { # label tenant
        read -r rps p50 p99 _ err reqs us <<<"${r[$2]}"
        local range
        range=$(printf '%s' "${per[$2]}" | grep . | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END {
            if (lo == hi) printf "%s", lo; else printf "%s-%s", lo, hi }')
        echo "| $1 | $rps | **$us µs** | $range | $p50 µs | $p99 µs | $err |"
    }
    range_of() { # all-lines field
        printf '%s' "$1" | grep . | awk -v f="$2" '{ print $f }' | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }'
    }
    {
        header "Readthrough: the aggregate example with and without its backends' answers cached" "bash loadtest/bench.sh readthrough"
        echo "The \`aggregate\` example (\`builtin:aggregate\`: asks \`users\` and \`orders\` at once, answers"
        echo "one JSON object) in front of nginx $(nginx -v 2>&1 | awk -F/ '{print $2}') serving both (small JSON, \`Cache-Control: max-age=60\`),"
        echo "as two tenants of one Tern: \`direct\` (plain backends) and \`cached\` (\`cache = true\` on both,"
        echo "\`[tenant.cache] front = false\`, so the guest still runs for every request). Tern on core 0"
        echo "(one worker); \`wrk -t1 -c$CONNS\` and nginx on core 1; CPU: Tern's user + system time per"
        echo "request (\`/proc/PID/stat\`), the least disturbed of $ROUNDS alternating rounds of ${SECS} s;"
        echo "backend requests per client request from \`tern_outbound_requests_total\`, range over the rounds."
        echo
        echo "| tenant | req/s | Tern CPU per request | backend requests per client request | p50 | p99 | errors |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        row_of "direct (no readthrough)" direct
        row_of "cached (readthrough)" cached
        echo
        echo "Over all rounds: direct $(range_of "$all_direct" 1) req/s, $(range_of "$all_direct" 7) µs;"
        echo "cached $(range_of "$all_cached" 1) req/s, $(range_of "$all_cached" 7) µs."
    } | tee "$RESULTS/readthrough.md"
}
