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
    # 100/s, burst 50, the client through trusted_proxies' X-Forwarded-For), Tern and nginx
    # (`limit_req` keyed on the real-IP module's address) side by side: the other client paced
    # at 80 requests/s (2 connections, 25 ms apart) for FLOOD_SECS, alone, during a paced flood
    # (64 connections, 4 ms apart: ~14,000 requests/s, 140 times the limit, the core not
    # saturated) and during a closed-loop flood (32 connections as fast as answered: the
    # server's core saturated). Both load generators share core 1.
    local flood_secs=${FLOOD_SECS:-10}
    {
        printf '[server]\nworker_threads = 1\ntrusted_proxies = ["127.0.0.1"]\n'
        printf '[[tenant]]\nname = "flood"\nmodule = "builtin:hello"\npaths = ["/flood"]\n'
        printf '[[tenant.rate_limit]]\nname = "per-client"\nrate = "100/s"\nburst = 50\n'
    } >"$WORK/flood.toml"
    {
        echo "user root;"
        nginx_preamble "$WORK"
        cat <<NGINX
    set_real_ip_from 127.0.0.1;
    real_ip_header X-Forwarded-For;
    limit_req_zone \$binary_remote_addr zone=perclient:1m rate=100r/s;
    limit_req_status 429;
    server {
        listen 127.0.0.1:$nginx_port;
        location /flood/ { alias $WORK/www/; limit_req zone=perclient burst=50 nodelay; }
    }
}
NGINX
    } >"$WORK/nginx-flood.conf"
    local -A other=()
    flood_cases() { # server url
        local url=$2
        paced_other() {
            taskset -c 1 wrk -t1 -c2 -d"${flood_secs}s" -s loadtest/paced.lua \
                -H 'x-forwarded-for: 198.51.100.2' "$url" -- 25 | grep '^RESULT'
        }
        other[$1_idle]=$(paced_other)
        taskset -c 1 wrk -t1 -c64 -d"$((flood_secs + 2))s" -s loadtest/paced.lua \
            -H 'x-forwarded-for: 198.51.100.1' "$url" -- 4 >"$WORK/flood.out" &
        local flooder=$!
        sleep 1
        other[$1_paced]=$(paced_other)
        wait "$flooder"
        other[$1_paced_rate]=$(awk '/Requests\/sec/ { printf "%d", $2 }' "$WORK/flood.out")
        taskset -c 1 wrk -t1 -c32 -d"$((flood_secs + 2))s" \
            -H 'x-forwarded-for: 198.51.100.1' "$url" >"$WORK/flood.out" &
        flooder=$!
        sleep 1
        other[$1_closed]=$(paced_other)
        wait "$flooder"
        other[$1_closed_rate]=$(awk '/Requests\/sec/ { printf "%d", $2 }' "$WORK/flood.out")
    }
    PIN=0 start_tern "$WORK/flood.toml" TERN_LOG=warn
    flood_cases tern "http://127.0.0.1:$TERN_PORT/flood/hello"
    stop "$TERN_PID"
    taskset -c 0 nginx -c "$WORK/nginx-flood.conf" -e "$WORK/nginx-error.log" &
    local master=$!
    PIDS+=("$master")
    wait_http "http://127.0.0.1:$nginx_port/flood/hello" || { cat "$WORK/nginx-error.log" >&2; exit 1; }
    flood_cases nginx "http://127.0.0.1:$nginx_port/flood/hello"
    stop "$master"
    # "p50 p99 errors" of a RESULT line, in µs.
    lat() { echo "$1" | awk '{ sub("p50=", "", $3); sub("p99=", "", $4); sub("errors=", "", $6); printf "%s | %s | %s", $3, $4, $6 }'; }
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
        echo
        echo "Another client of the same tenant while one address floods it (per-client \`100/s\`, burst 50;"
        echo "the other sends 80/s, paced, for ${flood_secs} s: p50 and p99 of its latency as wrk measures it, µs):"
        echo
        echo "| server, flood | flood's requests/s (all but its rate refused) | other client's p50 | p99 | errors |"
        echo "|---|---:|---:|---:|---:|"
        local sv
        for sv in tern nginx; do
            echo "| $sv, none | - | $(lat "${other[${sv}_idle]}") |"
            echo "| $sv, paced | ${other[${sv}_paced_rate]} | $(lat "${other[${sv}_paced]}") |"
            echo "| $sv, closed loop (core saturated) | ${other[${sv}_closed_rate]} | $(lat "${other[${sv}_closed]}") |"
        done
    } | tee "$RESULTS/ratelimit.md"
}
