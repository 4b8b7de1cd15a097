# `bash loadtest/bench.sh websocket`: WebSockets, pinned, side by side in one run (the
# servers on core 0, k6 and the backends on core 1), 64 connections each with one 32-byte
# message in flight (loadtest/websocket-echo.js):
# - handoff: Tern (the `ws_gate` guest hands each connection to the backend) and nginx
#   `proxy_pass` with `Upgrade`, in front of the same native echo backend (`ws-echo`);
# - events: Tern in events mode (the `ws_events` guest echoes, a fresh instance per batch)
#   and Pushpin (WebSocket-over-HTTP, GRIP's reference) in front of a native origin answering
#   the same events (`ws-origin`).
# Messages/s, the round trip's p50/p99 (k6's clock, ms) and the server's CPU per message from
# /proc (Pushpin: all its processes; its origin's CPU apart).
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

WS_ECHO_PORT=18187 WS_ORIGIN_PORT=18188 PUSHPIN_PORT=18189 NGINX_WS_PORT=18287

# CPU ticks of process $1 and all its descendants.
tree_ticks() {
    local total p
    total=$(process_ticks "$1" 2>/dev/null || echo 0)
    for p in $(pgrep -P "$1" 2>/dev/null); do
        total=$((total + $(tree_ticks "$p")))
    done
    echo "$total"
}

# k6 on core 1 against URL $1, the CPU of process tree $2 (and $3, reported apart) over the
# run -> "messages/s p50 p99 cpu_us_per_message other_cpu_us_per_message"
ws_run() { # url pid [other-pid]
    local before after obefore=0 oafter=0 out
    before=$(tree_ticks "$2")
    [ -n "${3:-}" ] && obefore=$(tree_ticks "$3")
    out=$(SECS=$SECS URL=$1 taskset -c 1 "$K6" run --quiet --summary-export "$WORK/k6.json" \
        loadtest/websocket-echo.js 2>&1) || { echo "$out" >&2; return 1; }
    after=$(tree_ticks "$2")
    [ -n "${3:-}" ] && oafter=$(tree_ticks "$3")
    python3 - "$WORK/k6.json" "$before" "$after" "$obefore" "$oafter" "$(getconf CLK_TCK)" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
b, a, ob, oa, hz = (float(x) for x in sys.argv[2:7])
n = m["echoed"]["count"]
rate = m["echoed"]["rate"]
rtt = m["rtt"]
cpu = (a - b) / hz * 1e6 / n if n else 0
ocpu = (oa - ob) / hz * 1e6 / n if n else 0
print(f"{rate:.0f} {rtt['med']:.2f} {rtt['p(99)']:.2f} {cpu:.2f} {ocpu:.2f}")
PY
}

websocket() {
    need taskset util-linux
    need nginx nginx
    need pushpin pushpin
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh websocket needs 2 cores (servers on one, load and backends on the other)" >&2
        exit 1
    fi
    K6=${K6:-$TOOLS/k6-1.8.1/k6}
    [ -x "$K6" ] || { echo "k6 1.8.1 is required at $K6 (bash scripts/test installs it)" >&2; exit 1; }
    build
    cargo build --quiet -p tern-test-guests --bins --target wasm32-wasip1 --profile guest \
        --target-dir "$ROOT/target/test-guests"
    local guests=$ROOT/target/test-guests/wasm32-wasip1/guest
    taskset -c 1 target/release/ws-echo 127.0.0.1:$WS_ECHO_PORT &
    PIDS+=($!)
    TOKIO_WORKER_THREADS=1 taskset -c 1 target/release/ws-origin 127.0.0.1:$WS_ORIGIN_PORT &
    local origin=$!
    PIDS+=("$origin")
    local config=$WORK/websocket.toml
    {
        printf '[server]\nworker_threads = 1\n'
        printf '[[tenant]]\nname = "handoff"\nmodule = "%s/ws_gate.wasm"\npaths = ["/handoff"]\n' "$guests"
        printf '[tenant.outbound.backends.echo]\nurl = "http://127.0.0.1:%s"\n' "$WS_ECHO_PORT"
        printf '[tenant.websocket]\nmax_frames_per_second = 1000000\n'
        printf '[[tenant]]\nname = "events"\nmodule = "%s/ws_events.wasm"\npaths = ["/events"]\n' "$guests"
        printf '[tenant.websocket]\nmode = "events"\nmax_frames_per_second = 1000000\n'
    } >"$config"
    {
        nginx_preamble "$WORK"
        cat <<NGINX
    map \$http_upgrade \$connection_upgrade { default upgrade; '' close; }
    server {
        listen 127.0.0.1:$NGINX_WS_PORT;
        location / {
            proxy_pass http://127.0.0.1:$WS_ECHO_PORT;
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_read_timeout 120s;
        }
    }
}
NGINX
    } >"$WORK/nginx-ws.conf"
    # Pushpin with its own run and log directories and ports; its outbound client (zurl) on
    # sockets under the run directory (Debian's internal.conf names the system zurl's).
    local pp=$WORK/pushpin
    mkdir -p "$pp/run" "$pp/log"
    sed 's|ipc:///var/run/zurl/zurl-|ipc://{rundir}/{ipc_prefix}zurl-|' /usr/lib/pushpin/internal.conf >"$pp/internal.conf"
    sed -e "s|^include=.*|include=$pp/internal.conf|; s|^rundir=.*|rundir=$pp/run|" \
        -e "s|^logdir=.*|logdir=$pp/log|; s|^http_port=.*|http_port=$PUSHPIN_PORT|" \
        -e "s|^routesfile=.*|routesfile=$pp/routes|; s|^services=.*|services=condure,zurl,pushpin-proxy,pushpin-handler|" \
        -e "s|^push_in_http_port=.*|push_in_http_port=18199|" /etc/pushpin/pushpin.conf >"$pp/pushpin.conf"
    echo "* 127.0.0.1:$WS_ORIGIN_PORT,over_http" >"$pp/routes"

    local -A r=()
    local n
    for n in $(seq 1 "$ROUNDS"); do
        PIN=0 start_tern "$config" TERN_LOG=warn
        r[tern_handoff]+="$(ws_run "ws://127.0.0.1:$TERN_PORT/handoff/?token=good" "$TERN_PID")"$'\n'
        r[tern_events]+="$(ws_run "ws://127.0.0.1:$TERN_PORT/events/?grip=no" "$TERN_PID")"$'\n'
        stop "$TERN_PID"
        taskset -c 0 nginx -c "$WORK/nginx-ws.conf" -e "$WORK/nginx-error.log" &
        local master=$!
        PIDS+=("$master")
        sleep 0.5
        r[nginx]+="$(ws_run "ws://127.0.0.1:$NGINX_WS_PORT/" "$(pgrep -P "$master" | head -1)")"$'\n'
        stop "$master"
        taskset -c 0 pushpin --config "$pp/pushpin.conf" >"$pp/out.log" 2>&1 &
        local pushpin=$!
        PIDS+=("$pushpin")
        wait_http "http://127.0.0.1:$PUSHPIN_PORT/" 30
        r[pushpin]+="$(ws_run "ws://127.0.0.1:$PUSHPIN_PORT/" "$pushpin" "$origin")"$'\n'
        stop "$pushpin"
        pkill -f "$pp/" 2>/dev/null || true
        sleep 1
    done
    # Memory per idle connection: Tern's resident memory before and with IDLE_CONNS (10,000)
    # connections held open (Python `websockets` on core 1), in each mode (a handoff holds the
    # backend's socket too).
    local idle_conns=${IDLE_CONNS:-10000} idle_config=$WORK/websocket-idle.toml
    {
        printf '[server]\nworker_threads = 1\nmax_websockets = %s\n' "$((idle_conns * 2))"
        sed -n '/^\[\[tenant\]\]/,$p' "$config" | sed "s/^max_frames_per_second = .*/max_frames_per_second = 1000\nmax_connections = $((idle_conns * 2))\nidle_timeout_ms = 600000/"
    } >"$idle_config"
    local -A mem=()
    PIN=0 start_tern "$idle_config" TERN_LOG=warn
    local path
    for path in "events/?grip=no" "handoff/?token=good"; do
        local before after held=$WORK/held.json
        sleep 1
        before=$(awk '/VmRSS/ { print $2 }' "/proc/$TERN_PID/status")
        PYTHONPATH=$TOOLS/websockets-15.0.1 taskset -c 1 python3 server/tests/e2e/wsclient.py \
            hold "ws://127.0.0.1:$TERN_PORT/$path" "$idle_conns" >"$held" &
        local holder=$!
        local deadline=$((SECONDS + 300))
        until grep -q opened "$held" 2>/dev/null || [ "$SECONDS" -gt "$deadline" ]; do sleep 0.5; done
        sleep 1
        after=$(awk '/VmRSS/ { print $2 }' "/proc/$TERN_PID/status")
        mem[${path%%/*}]="$(head -1 "$held" | python3 -c 'import json,sys; print(json.load(sys.stdin)["opened"])') $before $after"
        kill "$holder" 2>/dev/null || true
        wait "$holder" 2>/dev/null || true
        sleep 2
    done
    stop "$TERN_PID"
    # The range over rounds of each figure.
    span() { echo "$1" | awk -v c="$2" 'NF { v = $c + 0; if (min == "" || v < min) min = v; if (v > max) max = v }
        END { if (min == max) printf "%s", min; else printf "%s-%s", min, max }'; }
    {
        header "WebSockets: handoff and events" "bash loadtest/bench.sh websocket"
        echo "Servers pinned to core 0 (Tern: one worker; nginx: one worker; Pushpin: all its"
        echo "processes), k6 1.8.1 and the native backend/origin on core 1. 64 connections, one"
        echo "32-byte message each in flight. Ranges over $ROUNDS rounds."
        echo
        echo "| mode | server | messages/s | p50 ms | p99 ms | server CPU µs/message | origin CPU µs/message |"
        echo "|---|---|---|---|---|---|---|"
        local k
        for k in tern_handoff nginx tern_events pushpin; do
            local mode=handoff label=$k
            case $k in tern_handoff) label=Tern ;; nginx) label="nginx proxy_pass" ;;
                tern_events) mode=events label="Tern (guest per batch)" ;; pushpin) mode=events label="Pushpin 1.36 + native origin" ;; esac
            echo "| $mode | $label | $(span "${r[$k]}" 1) | $(span "${r[$k]}" 2) | $(span "${r[$k]}" 3) | $(span "${r[$k]}" 4) | $(span "${r[$k]}" 5) |"
        done
        echo
        echo "Memory per idle connection: Tern's resident memory (VmRSS) before and with the"
        echo "connections open, one worker (\`IDLE_CONNS\`, Python \`websockets\` clients)."
        echo
        echo "| mode | connections open | RSS before | RSS with them | per connection |"
        echo "|---|---|---|---|---|"
        for k in events handoff; do
            read -r opened before after <<<"${mem[$k]}"
            echo "| $k | $opened | $((before / 1024)) MiB | $((after / 1024)) MiB | $(awk -v a="$after" -v b="$before" -v n="$opened" 'BEGIN { printf "%.1f KiB", (a - b) / n }') |"
        done
    } | tee "$RESULTS/websocket.md"
}
