# `bash loadtest/bench.sh mixed`: `hello` p99 alone and next to a CPU-bound tenant.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

mixed() {
    need wrk wrk
    build
    cargo build --quiet -p tern-test-guests --bin cpu_burn --target wasm32-wasip1 --profile guest
    local burn=$ROOT/target/wasm32-wasip1/guest/cpu_burn.wasm config solo mixed fixed burnres fixres
    config=$(hello_config)
    printf '\n[[tenant]]\nname = "burn"\nmodule = "%s"\npaths = ["/burn"]\n' "$burn" >>"$config"
    local -a solos=() mixes=() fixes=()
    local n work=""
    for n in $(seq 1 "$ROUNDS"); do
        start_tern "$config"
        # The fixed amount of work that takes one request alone ~20 ms of run (once per bench).
        if [ -z "$work" ]; then
            local run
            run=$(curl -sfD - -o /dev/null "http://127.0.0.1:$TERN_PORT/burn?work=1000" |
                tr -d '\r' | sed -n 's/.*run;dur=\([0-9.]*\).*/\1/p')
            work=$(awk -v r="${run:-0}" 'BEGIN { print (r > 0) ? int(1000 * 20 / r) : 1800 }')
        fi
        solos+=("$(h1 http://127.0.0.1:$TERN_PORT/hello)")
        # 4 clients keep the CPU-bound tenant busy (each request computes for 20 ms) while the
        # same hello load runs: first computing by the wall clock (`ms=20`: contended, a request
        # uses only 2-3 ms of CPU), then a fixed amount (`work=`, ~20 ms of CPU alone).
        local kind
        for kind in "ms=20" "work=$work"; do
            wrk -t1 -c4 -d"$((SECS + 2))s" -s loadtest/latency.lua "http://127.0.0.1:$TERN_PORT/burn?$kind" >"$WORK/burn.out" &
            local bw=$! hello burned
            sleep 1
            hello=$(h1 http://127.0.0.1:$TERN_PORT/hello)
            wait "$bw" || true
            burned=$(awk '/^RESULT/ { print $2, $4 }' "$WORK/burn.out")
            if [ "$kind" = "ms=20" ]; then
                mixes+=("$hello") burnres=$burned
            else
                fixes+=("$hello") fixres=$burned
            fi
        done
        stop "$TERN_PID"
    done
    solo=$(printf '%s\n' "${solos[@]}" | best)
    mixed=$(printf '%s\n' "${mixes[@]}" | best)
    fixed=$(printf '%s\n' "${fixes[@]}" | best)
    {
        header "Mixed load: \`hello\` next to a CPU-bound tenant" "bash loadtest/bench.sh mixed"
        echo "The CPU-bound tenant (\`server/guests/src/bin/cpu_burn.rs\`, 20 ms of computation per"
        echo "request, 4 clients) yields at every epoch tick (500 µs) after its first slice, which is short"
        echo "(0.5-1 ms) once its requests have kept using up the long one (2-2.5 ms of CPU), so"
        echo "\`hello\` requests are not stuck behind it; its own requests that arrive while one of its"
        echo "guests is cut wait in line (\`server/src/execute/turn.rs\`), which \`hello\`, another tenant,"
        echo "never does. Target: \`hello\`'s p99 within 2x of its solo value."
        echo
        echo "| run | hello req/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        row "hello alone" "$solo"
        row "hello + CPU-bound tenant (20 ms of wall time)" "$mixed"
        row "hello + CPU-bound tenant (work=$work: ~20 ms of CPU)" "$fixed"
        echo
        echo "- hello p99 mixed / solo: **$(ratio "$(echo "$mixed" | cut -d' ' -f3)" "$(echo "$solo" | cut -d' ' -f3)")** (wall time), **$(ratio "$(echo "$fixed" | cut -d' ' -f3)" "$(echo "$solo" | cut -d' ' -f3)")** (fixed work)"
        echo "- the CPU-bound tenant during the last run: ${burnres:-?} (wall time), ${fixres:-?} (fixed work) (requests/s, p99 µs)"
    } | tee "$RESULTS/mixed.md"
}
