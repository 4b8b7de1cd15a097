# `bash loadtest/bench.sh rollout`: what a gradual deployment costs a request, pinned, side by
# side in one run. Two Tern servers pinned to core 0 (`worker_threads = 1`), each with the API
# tenant `hello` (the SDK's `hello` example, deployed through the admin API): one serving that
# version alone, the other with a candidate (the same guest, another version id) at 50 %, split
# by an `x-user` header; and a third with that candidate at 100 % (the same route through a
# candidate, one module serving: what two modules serving in turn cost, apart from the split).
# All are offered the same paced load (loadtest/paced.lua, each request with a random `x-user`,
# on core 1), alternated over ROLLOUT_ROUNDS rounds; CPU per request from /proc/PID/stat. Then
# the share each version got, from `tern_requests_total{deployment}`.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

rollout() {
    need wrk wrk
    need taskset util-linux
    need curl curl
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh rollout needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    cargo build --quiet -p tern-sdk --example hello --target wasm32-wasip1 --profile guest
    local hello=$ROOT/target/wasm32-wasip1/guest/examples/hello.wasm
    local variant=$WORK/hello-candidate.wasm
    # The same guest with a custom section: its own module hash, so its own version.
    python3 - "$hello" "$variant" <<'PY'
import sys
wasm = open(sys.argv[1], "rb").read()
name = b"bench-candidate"
payload = bytes([len(name)]) + name + b"2"
open(sys.argv[2], "wb").write(wasm + b"\x00" + bytes([len(payload)]) + payload)
PY
    local token=bench-token rounds=${ROLLOUT_ROUNDS:-6} paced_secs=${PACED_SECS:-5} paced_ms=${PACED_MS:-4}
    local config
    config=$WORK/rollout.toml
    printf '[server]\nworker_threads = 1\n' >"$config"
    local -A port=() admin=() pid=()
    local k i=0
    local -A share=([candidate]=50 [full]=100)
    for k in one candidate full; do
        mkdir -p "$WORK/$k"
        TERN_PORT=$((18400 + i)) ADMIN_PORT=$((18410 + i))
        WORK=$WORK/$k PIN=0 start_tern "$config" TERN_LOG=warn TERN_ADMIN_TOKEN=$token
        port[$k]=$TERN_PORT admin[$k]=$ADMIN_PORT pid[$k]=$TERN_PID
        local api="http://127.0.0.1:$ADMIN_PORT/admin/v1/tenants/hello"
        curl -sf -H "authorization: Bearer $token" -X PUT -d '{"paths": ["/hello"]}' "$api" >/dev/null
        curl -sf -H "authorization: Bearer $token" -X PUT --data-binary @"$hello" "$api/module" >/dev/null
        if [ "$k" != one ]; then
            curl -sf -H "authorization: Bearer $token" -X PUT --data-binary @"$variant" \
                "$api/module?percent=${share[$k]}&key=header%3Ax-user" >/dev/null
        fi
        wait_http "http://127.0.0.1:$TERN_PORT/hello"
        i=$((i + 1))
    done
    # One paced run against server $1 -> "cpu_us_per_request requests/s"
    paced_cpu() { # server
        paced_cpu_of "${pid[$1]}" "http://127.0.0.1:${port[$1]}/hello" "$paced_secs" "$paced_ms" - keyed
    }
    for k in one candidate full; do paced_cpu "$k" >/dev/null; done
    local -A got=()
    local round
    local order
    for round in $(seq 0 $((rounds - 1))); do
        # Alternated, each round starting with another server.
        case $((round % 3)) in
            0) order="one candidate full" ;;
            1) order="candidate full one" ;;
            *) order="full one candidate" ;;
        esac
        for k in $order; do got[$k]+="$(paced_cpu "$k")"$'\n'; done
    done
    local m cur cand
    m=$(curl -s "http://127.0.0.1:${admin[candidate]}/metrics")
    cur=$(echo "$m" | awk '/^tern_requests_total\{deployment="current",status="2xx",tenant="hello"/ { s += $2 } END { print s + 0 }')
    cand=$(echo "$m" | awk '/^tern_requests_total\{deployment="candidate",status="2xx",tenant="hello"/ { s += $2 } END { print s + 0 }')
    for k in one candidate full; do stop "${pid[$k]}"; done
    # Per round: candidate - one (the rounds alternate which ran first).
    deltas() { # server -> its CPU per request minus one version's, round by round
        paste <(printf '%s' "${got[one]}" | grep . | awk '{ print $1 }') \
            <(printf '%s' "${got[$1]}" | grep . | awk '{ print $1 }') |
            awk '{ printf "%+.2f ", $2 - $1 }'
    }
    {
        header "Gradual deployments: what a 50 % candidate costs a request" "bash loadtest/bench.sh rollout"
        echo "Two Tern servers (\`[server] worker_threads = 1\`) pinned to core 0, each with the API tenant"
        echo "\`hello\` (the SDK's \`hello\` example): one version alone, or with a candidate (the same guest as"
        echo "another version) at 50 % split by \`x-user\`. Each offered the same paced load (\`wrk -t1 -c$CONNS"
        echo "-s loadtest/paced.lua -- $paced_ms - keyed\`: every request with a random \`x-user\`, ${paced_secs} s a run, on"
        echo "core 1), alternated over $rounds rounds. CPU: the server's user + system time (\`/proc/PID/stat\`)"
        echo "per request: the range over the rounds and its median."
        echo
        echo "| tenant | CPU per request | req/s (median round) |"
        echo "|---|---:|---:|"
        echo "| one version | $(cpu_spread "${got[one]}") |"
        echo "| a candidate at 50 % | $(cpu_spread "${got[candidate]}") |"
        echo "| a candidate at 100 % (one module serving) | $(cpu_spread "${got[full]}") |"
        echo
        for k in candidate full; do
            echo "- ${share[$k]} % − one version, round by round (µs): $(deltas "$k"); medians: $(awk -v a="$(cpu_median "${got[$k]}")" -v b="$(cpu_median "${got[one]}")" 'BEGIN { printf "%+.2f", a - b }') µs."
        done
        echo
        echo "The split the candidate server made over the whole run (\`tern_requests_total{deployment}\`):"
        echo "current $cur, candidate $cand ($(awk -v a="$cand" -v b="$cur" 'BEGIN { if (a + b > 0) printf "%.1f", a * 100 / (a + b) }') % to the candidate)."
    } | tee "$RESULTS/rollout.md"
}
