# `bash loadtest/bench.sh ratelimit`: what a rate limit costs, pinned, side by side in one run:
# Tern `hello` without a limit, with one that never refuses, and refusing every request (429);
# nginx serving a small file without `limit_req`, with one that never refuses, and refusing.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

ratelimit() {
    need wrk wrk
    need taskset util-linux
    need nginx nginx
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh ratelimit needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    local nginx_port=18288
    # One Tern, three tenants with the same guest: no limit, a limit that never refuses (a
    # rate far above what one core serves), a limit that refuses all but the first request.
    local config=$WORK/ratelimit.toml
    {
        printf '[server]\nworker_threads = 1\n'
        printf '[[tenant]]\nname = "plain"\nmodule = "builtin:hello"\npaths = ["/none"]\n'
        printf '[[tenant]]\nname = "open"\nmodule = "builtin:hello"\npaths = ["/open"]\n'
        printf '[[tenant.rate_limit]]\nname = "open"\nrate = "1000000/s"\nburst = 1000000\n'
        printf '[[tenant]]\nname = "shut"\nmodule = "builtin:hello"\npaths = ["/shut"]\n'
        printf '[[tenant.rate_limit]]\nname = "shut"\nrate = "4/h"\n'
    } >"$config"
    mkdir -p "$WORK/www"
    printf 'Hello, world!\n' >"$WORK/www/hello"
    {
        # (Its worker reads the file under the work directory, which only root may enter.)
        echo "user root;"
        nginx_preamble "$WORK"
        cat <<NGINX
    limit_req_zone \$binary_remote_addr zone=open:1m rate=1000000r/s;
    limit_req_zone \$binary_remote_addr zone=shut:1m rate=1r/m;
    limit_req_status 429;
    server {
        listen 127.0.0.1:$nginx_port;
        root $WORK/www;
        location /none/ { alias $WORK/www/; }
        location /open/ { alias $WORK/www/; limit_req zone=open burst=1000000 nodelay; }
        location /shut/ { alias $WORK/www/; limit_req zone=shut; }
    }
}
NGINX
    } >"$WORK/nginx.conf"
    local -A r=() d=()
    local n case
    for n in $(seq 1 "$ROUNDS"); do
        PIN=0 start_tern "$config" TERN_LOG=warn
        local t=() 
        for case in none open shut; do
            curl -s -o /dev/null "http://127.0.0.1:$TERN_PORT/$case/hello"
            local line
            line=$(pinned_h1 "http://127.0.0.1:$TERN_PORT/$case/hello" "$TERN_PID")
            r[tern_$case]+="$line"$'\n'
            t+=("$(echo "$line" | awk '{ print $7 }')")
        done
        d[tern]+="$(awk -v a="${t[1]}" -v b="${t[0]}" 'BEGIN { print a - b }')"$'\n'
        curl -s "http://127.0.0.1:$TERN_PORT/shut/hello" -o /dev/null -w '%{http_code}' >"$WORK/tern-shut"
        stop "$TERN_PID"
        taskset -c 0 nginx -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log" &
        local master=$!
        PIDS+=("$master")
        wait_http "http://127.0.0.1:$nginx_port/none/hello" || { cat "$WORK/nginx-error.log" >&2; exit 1; }
        local worker t2=()
        worker=$(pgrep -P "$master" | head -1)
        for case in none open shut; do
            curl -s -o /dev/null "http://127.0.0.1:$nginx_port/$case/hello"
            line=$(pinned_h1 "http://127.0.0.1:$nginx_port/$case/hello" "$worker")
            r[nginx_$case]+="$line"$'\n'
            t2+=("$(echo "$line" | awk '{ print $7 }')")
        done
        d[nginx]+="$(awk -v a="${t2[1]}" -v b="${t2[0]}" 'BEGIN { print a - b }')"$'\n'
        curl -s "http://127.0.0.1:$nginx_port/shut/hello" -o /dev/null -w '%{http_code}' >"$WORK/nginx-shut"
        stop "$master"
    done
    # Memory: a limit keyed by a header every request gives anew, max_keys 100,000 (the
    # default): resident memory before and after as many distinct keys as wrk sends in
    # KEYS_SECS seconds (a million at ~30,000 requests/s), and the keys tracked.
    local keys_secs=${KEYS_SECS:-40}
    {
        printf '[server]\nworker_threads = 1\n'
        printf '[[tenant]]\nname = "free"\nmodule = "builtin:hello"\npaths = ["/free"]\n'
        printf '[[tenant]]\nname = "keys"\nmodule = "builtin:hello"\npaths = ["/keys"]\n'
        printf '[[tenant.rate_limit]]\nname = "keys"\nkey = "header:x-key"\nrate = "1/s"\n'
    } >"$WORK/keys.toml"
    PIN=0 start_tern "$WORK/keys.toml" TERN_LOG=warn
    curl -s -o /dev/null -H 'x-key: warm' "http://127.0.0.1:$TERN_PORT/keys/hello"
    local rss_start rss_before rss_after sent tracked
    rss_start=$(awk '/VmRSS/ { print $2 }' "/proc/$TERN_PID/status")
    # The same load on a tenant without a limit first: what the connections and requests
    # themselves keep, so the second run's growth is the keys'.
    taskset -c 1 wrk -t1 -c"$CONNS" -d"${keys_secs}s" -s loadtest/distinct-keys.lua \
        "http://127.0.0.1:$TERN_PORT/free/hello" >/dev/null
    rss_before=$(awk '/VmRSS/ { print $2 }' "/proc/$TERN_PID/status")
    sent=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${keys_secs}s" -s loadtest/distinct-keys.lua \
        "http://127.0.0.1:$TERN_PORT/keys/hello" | awk '/requests in/ { print $1 }')
    rss_after=$(awk '/VmRSS/ { print $2 }' "/proc/$TERN_PID/status")
    tracked=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" |
        awk '/^tern_rate_limit_keys\{/ { print $2 }')
    stop "$TERN_PID"
    # Another client's latency while one address floods the same tenant (per-client limit
    # 100/s, burst 50, through trusted_proxies' X-Forwarded-For): the other client paced at
    # 80 requests/s (2 connections, 25 ms apart), alone and during a closed-loop flood; both
    # load generators share core 1.
    {
        printf '[server]\nworker_threads = 1\ntrusted_proxies = ["127.0.0.1"]\n'
        printf '[[tenant]]\nname = "flood"\nmodule = "builtin:hello"\npaths = ["/flood"]\n'
        printf '[[tenant.rate_limit]]\nname = "per-client"\nrate = "100/s"\nburst = 50\n'
    } >"$WORK/flood.toml"
    PIN=0 start_tern "$WORK/flood.toml" TERN_LOG=warn
    local url="http://127.0.0.1:$TERN_PORT/flood/hello" idle busy flood_out
    paced_other() {
        taskset -c 1 wrk -t1 -c2 -d"${SECS}s" -s loadtest/paced.lua \
            -H 'x-forwarded-for: 198.51.100.2' "$url" -- 25 | grep '^RESULT'
    }
    idle=$(paced_other)
    taskset -c 1 wrk -t1 -c32 -d"$((SECS + 2))s" -H 'x-forwarded-for: 198.51.100.1' "$url" \
        >"$WORK/flood.out" &
    local flooder=$!
    sleep 1
    busy=$(paced_other)
    wait "$flooder"
    flood_out=$(awk '/Requests\/sec/ { print $2 }' "$WORK/flood.out")
    stop "$TERN_PID"
    # Each case over the rounds: CPU per request as min-max (median), and its req/s median.
    spread() { # lines
        printf '%s' "$1" | grep . | awk '{ print $7, $1 }' | sort -n | awk '
            { c[NR] = $1; q[NR] = $2 }
            END { m = (NR % 2) ? c[(NR + 1) / 2] : (c[NR / 2] + c[NR / 2 + 1]) / 2
                  printf "%.2f-%.2f µs (median %.2f) | %d", c[1], c[NR], m, q[int((NR + 1) / 2)] }'
    }
    paired() { # differences
        printf '%s' "$1" | grep . | sort -n | awk '
            { v[NR] = $1 }
            END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
                  printf "%+.2f µs (rounds: %+.2f to %+.2f)", m, v[1], v[NR] }'
    }
    {
        header "Rate limits: what a limit costs a request, Tern against nginx limit_req" "bash loadtest/bench.sh ratelimit"
        echo "One server at a time pinned to core 0 (Tern \`[server] worker_threads = 1\` serving the demo"
        echo "\`hello\` guest on three tenants; nginx $(nginx -v 2>&1 | awk -F/ '{print $2}') \`worker_processes 1\` serving a"
        echo "14-byte file from three locations): without a limit, with one that never refuses"
        echo "(1,000,000 requests/s, burst 1,000,000), and with one that refuses every request after the first"
        echo "(Tern \`4/h\`, nginx \`1r/m\`: answered \`$(cat "$WORK/tern-shut")\` and \`$(cat "$WORK/nginx-shut")\`). \`wrk -t1 -c$CONNS -d${SECS}s\` pinned"
        echo "to core 1, one client address (every request is one key). CPU: the serving process's user + system"
        echo "time (\`/proc/PID/stat\`; nginx's worker) per request; $ROUNDS rounds, each running every case"
        echo "of one server in turn: the range over the rounds and its median."
        echo
        echo "| server, case | CPU per request | req/s (median round) |"
        echo "|---|---:|---:|"
        echo "| Tern, no limit | $(spread "${r[tern_none]}") |"
        echo "| Tern, a limit that never refuses | $(spread "${r[tern_open]}") |"
        echo "| Tern, refused (\`429\`, no guest) | $(spread "${r[tern_shut]}") |"
        echo "| nginx, no \`limit_req\` | $(spread "${r[nginx_none]}") |"
        echo "| nginx, \`limit_req\` that never refuses | $(spread "${r[nginx_open]}") |"
        echo "| nginx, refused (\`429\`) | $(spread "${r[nginx_shut]}") |"
        echo
        echo "- What a limit that never refuses adds, paired within each round: Tern $(paired "${d[tern]}"), nginx $(paired "${d[nginx]}")"
        echo "- Memory of one limit's keys (\`key = \"header:x-key\"\`, \`max_keys\` 100,000: 6.4 MB in the table, 10 MB resident documented):"
        echo "  $sent distinct keys in ${keys_secs} s; keys tracked after: $tracked; the server's resident memory"
        awk -v s="$rss_start" -v b="$rss_before" -v a="$rss_after" 'BEGIN {
            printf "  %.1f MiB at start, %.1f MiB after the same load without a limit,\n", s / 1024, b / 1024
            printf "  %.1f MiB after the keys (%+.1f MiB for the keys)\n", a / 1024, (a - b) / 1024 }'
        echo "- Another client during a flood (per-client \`100/s\`, burst 50; it sends 80/s, paced): alone"
        echo "  $(echo "$idle" | awk '{ print $3, $4, $6 }') (µs); while another address floods at $flood_out requests/s (all but"
        echo "  its rate refused): $(echo "$busy" | awk '{ print $3, $4, $6 }')"
    } | tee "$RESULTS/ratelimit.md"
}
