# `bash loadtest/bench.sh proxy`: the `proxy` example in front of the native hello, against HAProxy and a native proxy.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

proxy() {
    need wrk wrk
    need haproxy haproxy
    build
    local config
    config=$WORK/proxy.toml
    printf '[[tenant]]\nname = "proxy"\nmodule = "builtin:proxy"\n[tenant.outbound.backends.origin]\nurl = "http://127.0.0.1:%s"\n' \
        "$NATIVE_PORT" >"$config"
    "$(native_bin)" 127.0.0.1:$NATIVE_PORT 2>/dev/null &
    PIDS+=("$!")
    wait_http "http://127.0.0.1:$NATIVE_PORT/"
    # HAProxy as a plain reverse proxy: HTTP mode, keep-alive both sides, no logging.
    cat >"$WORK/haproxy.cfg" <<CFG
global
    nbthread 2
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
frontend in
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend out
backend out
    server native 127.0.0.1:$NATIVE_PORT
CFG
    haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
    local haproxy_pid=$!
    PIDS+=("$haproxy_pid")
    wait_http "http://127.0.0.1:$HAPROXY_PORT/"
    # The same stack as Tern's proxy path without WebAssembly: hyper's server and pooled client.
    target/release/native-proxy 127.0.0.1:$NATIVE_PROXY_PORT 127.0.0.1:$NATIVE_PORT 2>/dev/null &
    local native_proxy_pid=$!
    PIDS+=("$native_proxy_pid")
    wait_http "http://127.0.0.1:$NATIVE_PROXY_PORT/"
    local -A r=()
    local n lifecycle=""
    for n in $(seq 1 "$ROUNDS"); do
        r[native]+="$(h1 http://127.0.0.1:$NATIVE_PORT/)"$'\n'
        r[haproxy]+="$(h1_cpu http://127.0.0.1:$HAPROXY_PORT/ "$haproxy_pid")"$'\n'
        r[hyper]+="$(h1_cpu http://127.0.0.1:$NATIVE_PROXY_PORT/ "$native_proxy_pid")"$'\n'
        start_tern "$config" TERN_LOG=info,tern::access=off
        local phases_before
        phases_before=$(phase_sums)
        r[tern]+="$(h1_cpu http://127.0.0.1:$TERN_PORT/ "$TERN_PID")"$'\n'
        # instantiate + teardown per request (the run phase also waits for the backend)
        lifecycle+="$(phase_since "$phases_before" | awk '{ printf "%.2f", $1 + $3 }')"$'\n'
        stop "$TERN_PID"
    done
    local k life
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | best); done
    life=$(printf '%s' "$lifecycle" | grep . | sort -n | head -1)
    added() { # "rps p50 ..." of the proxy -> p50 added to native's, in µs
        awk -v a="$(echo "$1" | cut -d' ' -f2)" -v b="$(echo "${r[native]}" | cut -d' ' -f2)" 'BEGIN { printf "%d", a - b }'
    }
    {
        header "Proxy: the \`proxy\` example in front of a backend, against HAProxy" "bash loadtest/bench.sh proxy"
        echo "The backend is \`native-hello\` (tokio + hyper 1). Tern runs \`builtin:proxy\` (guest-sdk/examples/proxy.rs:"
        echo "a fresh instance per request that forwards method, path, headers and body to the backend"
        echo "\`origin\` over a pooled keep-alive connection, adds \`x-forwarded-*\` and \`cache-control\`, and"
        echo "forwards the answer; both bodies are streamed by the server, not the guest), access log off; HAProxy $(haproxy -v 2>/dev/null | head -1 | awk '{print $3}') is a plain HTTP-mode reverse"
        echo "proxy with keep-alive on both sides. All share the machine's $(nproc) cores with \`wrk\`."
        echo
        echo "| path | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---|---|---|---|---|"
        row "client → native hello" "${r[native]}"
        row "client → HAProxy → native hello" "${r[haproxy]}"
        row "client → native hyper proxy → native hello" "${r[hyper]}"
        row "client → Tern \`proxy\` guest → native hello" "${r[tern]}"
        echo
        echo "- Tern proxy / HAProxy, requests/s: **$(ratio "${r[tern]%% *}" "${r[haproxy]%% *}")**; Tern proxy / backend alone: $(ratio "${r[tern]%% *}" "${r[native]%% *}")"
        echo "- Native hyper proxy / HAProxy, requests/s: $(ratio "${r[hyper]%% *}" "${r[haproxy]%% *}") (the ceiling of hyper's server + client stack, which Tern's proxy path is built on)"
        echo "- CPU per proxied request, the proxy process alone (\`/proc/PID/stat\` over the run ÷ requests): Tern **$(echo "${r[tern]}" | cut -d' ' -f6) µs**, native hyper proxy $(echo "${r[hyper]}" | cut -d' ' -f6) µs, HAProxy **$(echo "${r[haproxy]}" | cut -d' ' -f6) µs**"
        echo "- p50 added to the backend's: Tern $(added "${r[tern]}") µs, HAProxy $(added "${r[haproxy]}") µs (at $CONNS connections, so this includes queueing)"
        local hyper_cpu ha_cpu
        hyper_cpu=$(echo "${r[hyper]}" | cut -d' ' -f6)
        ha_cpu=$(echo "${r[haproxy]}" | cut -d' ' -f6)
        echo "- The floor under Tern's CPU per proxied request: the native hyper proxy's $hyper_cpu µs (the same server and client stack, no guest) + the guest's instantiation and teardown as the server times them during its run ($life µs, \`tern_request_phase_duration_seconds\`; the guest's own run is not counted) = **$(awk -v a="$hyper_cpu" -v b="$life" 'BEGIN { printf "%.1f", a + b }') µs**, against the $(awk -v a="$ha_cpu" 'BEGIN { printf "%.1f", a / 0.8 }') µs (HAProxy's ÷ 0.8) that 0.8× HAProxy's requests/s would allow on the same cores"
        echo "- \`wrk -t$WRK_THREADS -c$CONNS -d${SECS}s\`, best of $ROUNDS alternating rounds; latencies in µs"
    } | tee "$RESULTS/proxy.md"
}
