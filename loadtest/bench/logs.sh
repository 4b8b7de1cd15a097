# `bash loadtest/bench.sh logs`: what live logs cost a request, pinned, side by side in one
# run. Three servers pinned to core 0, each serving the demo `hello`: live logs off
# (`history = 0`), on with the defaults (records sampled past 1,000 a second per tenant), and
# on keeping every record (`records_per_second = 0`: every record formatted for every tailer).
# Each is offered the same paced load (loadtest/paced.lua, so the tailers' own CPU on the load
# generator's core does not change the request rate) with 0, 1 and 10 tailers following
# (`curl -N`, on core 1), the cases alternated over LOG_ROUNDS rounds. Then the latency of
# requests under a closed-loop load while a tailer reads nothing, next to none, and whether the
# dropped count it is then told equals what it missed.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

logs() {
    need wrk wrk
    need taskset util-linux
    need curl curl
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh logs needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    local token=bench-token rounds=${LOG_ROUNDS:-4} paced_secs=${PACED_SECS:-5} paced_ms=${PACED_MS:-4}
    local -A config=(
        [off]="$(hello_config '[server]\nworker_threads = 1\n[server.live_logs]\nhistory = 0\n')"
        [on]="$(hello_config '[server]\nworker_threads = 1\n')"
        [every]="$(hello_config '[server]\nworker_threads = 1\n[server.live_logs]\nrecords_per_second = 0\n')"
    )
    local -A port=() admin=() pid=()
    local k i=0
    for k in off on every; do
        mkdir -p "$WORK/$k"
        TERN_PORT=$((18300 + i)) ADMIN_PORT=$((18310 + i))
        WORK=$WORK/$k PIN=0 start_tern "${config[$k]}" TERN_LOG=warn TERN_ADMIN_TOKEN=$token
        port[$k]=$TERN_PORT admin[$k]=$ADMIN_PORT pid[$k]=$TERN_PID
        i=$((i + 1))
    done
    # Starts $2 tailers of server $1 (curl following, on core 1), waits until it counts them.
    tailers() { # server n
        local j url="http://127.0.0.1:${admin[$1]}/admin/v1/tenants/hello/logs?follow=1"
        TAILERS=()
        for ((j = 0; j < $2; j++)); do
            taskset -c 1 curl -sN -H "authorization: Bearer $token" "$url" >/dev/null &
            TAILERS+=($!)
            PIDS+=($!)
        done
        local deadline=$((SECONDS + 20))
        until [ "$(curl -s "http://127.0.0.1:${admin[$1]}/metrics" |
            awk '/^tern_live_log_tailers / { print $2 }')" = "$2" ]; do
            [ "$SECONDS" -lt "$deadline" ] || { echo "tailers never attached" >&2; exit 1; }
            sleep 0.1
        done
    }
    untail() { local p; for p in "${TAILERS[@]}"; do stop "$p"; done; TAILERS=(); }
    # One paced run against server $1 -> "cpu_us_per_request requests/s"
    paced_cpu() { # server
        paced_cpu_of "${pid[$1]}" "http://127.0.0.1:${port[$1]}/hello" "$paced_secs" "$paced_ms"
    }
    local cases=(off on/0 on/1 on/10 every/0 every/1 every/10) c server n round
    for k in off on every; do paced_cpu "$k" >/dev/null; done
    local -A got=()
    for round in $(seq 0 $((rounds - 1))); do
        # Each round in another order (rotated), so drift over the run spreads over the cases.
        for i in "${!cases[@]}"; do
            c=${cases[$(((i + round * 3) % ${#cases[@]}))]}
            server=${c%%/*} n=${c#*/}
            [ "$server" = off ] && n=0
            tailers "$server" "$n"
            got[$c]+="$(paced_cpu "$server")"$'\n'
            untail
        done
    done
    # A tailer that reads nothing, under closed-loop load on the server keeping every record.
    local line stall
    local -A lat=()
    for round in $(seq 1 "$ROUNDS"); do
        TERN_PID=${pid[every]}
        lat[none]+="$(pinned_h1 "http://127.0.0.1:${port[every]}/hello" "${pid[every]}")"$'\n'
        python3 loadtest/stalled-tailer.py "${admin[every]}" hello "$token" $((SECS + 3)) >"$WORK/stalled" &
        stall=$!
        PIDS+=("$stall")
        until grep -q attached "$WORK/stalled" 2>/dev/null; do sleep 0.1; done
        sleep 0.5
        line=$(pinned_h1 "http://127.0.0.1:${port[every]}/hello" "${pid[every]}")
        lat[stalled]+="$line"$'\n'
        wait "$stall" || true
        local got_records dropped sent
        read -r got_records dropped <<<"$(tail -1 "$WORK/stalled")"
        sent=$(echo "$line" | awk '{ print $6 }')
        lat[count]+="$sent requests answered while it read nothing: it then got $got_records records and was told $dropped dropped ($((got_records + dropped)))"$'\n'
    done
    for k in off on every; do stop "${pid[$k]}"; done
    # p50 and p99 over the rounds (µs, min-max).
    latency() { # pinned_h1 lines
        printf '%s' "$1" | grep . | awk '
            NR == 1 { a = b = $2; c = d = $3 }
            { if ($2 < a) a = $2; if ($2 > b) b = $2; if ($3 < c) c = $3; if ($3 > d) d = $3 }
            END { printf "%d-%d µs | %d-%d µs", a, b, c, d }'
    }
    local base
    base=$(cpu_median "${got[off]}")
    {
        header "Live logs: what a record and its tailers cost a request" "bash loadtest/bench.sh logs"
        echo "Three Tern servers (\`[server] worker_threads = 1\`) pinned to core 0, each serving the demo"
        echo "\`hello\`: live logs off, on (defaults: sampled past 1,000 records/s), on keeping every record."
        echo "Each offered the same paced load (\`wrk -t1 -c$CONNS -s loadtest/paced.lua -- $paced_ms\`, ${paced_secs} s a run,"
        echo "on core 1) with 0, 1 or 10 tailers (\`curl -N\` following the tenant's live log, on core 1);"
        echo "the cases alternated over $rounds rounds. CPU: the server's user + system time"
        echo "(\`/proc/PID/stat\`) per request: the range over the rounds, its median, and the median"
        echo "against live logs off."
        echo
        echo "| live logs | tailers | CPU per request | req/s (median round) | median vs off |"
        echo "|---|---:|---:|---:|---:|"
        echo "| off (\`history = 0\`) | - | $(cpu_spread "${got[off]}") | 1.00 |"
        for c in on/0 on/1 on/10 every/0 every/1 every/10; do
            local what="on, sampled past 1,000 records/s (default)"
            [ "${c%%/*}" = every ] && what="on, every record (\`records_per_second = 0\`)"
            echo "| $what | ${c#*/} | $(cpu_spread "${got[$c]}") | $(ratio "$(cpu_median "${got[$c]}")" "$base") |"
        done
        echo
        echo "A tailer that reads nothing (a 4 KiB receive buffer) while \`wrk -t1 -c$CONNS -d${SECS}s\` (closed loop,"
        echo "core 1) loads the server keeping every record, next to no tailer ($ROUNDS rounds; p50 | p99):"
        echo
        echo "| case | p50 | p99 |"
        echo "|---|---:|---:|"
        echo "| no tailer | $(latency "${lat[none]}") |"
        echo "| a tailer that reads nothing | $(latency "${lat[stalled]}") |"
        echo
        echo "What the tailer that read nothing was told once it read again. wrk counts the answers it read"
        echo "within its run; the server also answered the requests in flight when wrk stopped (at most one"
        echo "per connection, $CONNS), so records + dropped exceed wrk's count by that many at most (the"
        echo 'exact equality is checked by the e2e test `logs::a_reader_that_stops_reading...`):'
        echo
        printf '%s' "${lat[count]}" | grep . | sed 's/^/- /'
    } | tee "$RESULTS/logs.md"
}
