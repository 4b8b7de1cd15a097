# `bash loadtest/bench.sh tenants`: CPU per request of one server with 1, 3 and 10 tenants (of
# the same bytes, and each of its own), their requests interleaved request by request.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

# "MIN MAX" of the 2xx answers of tenants t0..t(K-1) so far (MIN 0 when one has none).
tenant_counts() { # k
    curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v k="$1" '
        /^tern_requests_total\{/ && /status="2xx"/ && match($0, /tenant="t[0-9]+"/) {
            n[substr($0, RSTART + 8, RLENGTH - 9)] += $NF }
        END { min = -1; max = 0; c = 0
              for (t in n) { c++; if (min < 0 || n[t] < min) min = n[t]; if (n[t] > max) max = n[t] }
              if (c < k) min = 0
              printf "%d %d\n", min, max }'
}

# Ten modules of their own in $WORK/own-N.wasm: `hello` ($1) with the digit N for the `n` of its
# greeting (the same code, another heap image, so each is loaded, mapped and given slots of
# its own, as distinct tenants' modules are; a custom section alone would not do: it is not
# compiled into the artifact, so the same module would be loaded).
own_modules() { # hello.wasm
    python3 - "$1" "$WORK" <<'PY'
import sys
wasm = open(sys.argv[1], "rb").read()
greeting = b"Hello from Tern!\n"
assert wasm.count(greeting) == 1, "hello's greeting, once, in its data"
for i in range(10):
    with open(f"{sys.argv[2]}/own-{i}.wasm", "wb") as f:
        f.write(wasm.replace(greeting, greeting.replace(b"Tern", b"Ter" + str(i).encode())))
PY
}

tenants() {
    need wrk wrk
    need taskset util-linux
    need python3 python3
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh tenants needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    cargo build --quiet -p tern-sdk --example hello --target wasm32-wasip1 --profile guest
    own_modules "$ROOT/target/wasm32-wasip1/guest/examples/hello.wasm"
    local run k bytes n i cfg lo hi least module loaded want
    local -a paths
    local -A c=()
    # k tenants, and whose bytes: `same` (each `builtin:hello`) or `own` (own-N.wasm).
    local -a runs=(1 3same 10same 3own 10own)
    for n in $(seq 1 "$ROUNDS"); do
        for run in "${runs[@]}"; do
            k=${run%%[a-z]*} bytes=${run#"${run%%[a-z]*}"}
            cfg=$WORK/tenants-$run.toml
            paths=()
            {
                printf '[server]\nworker_threads = 1\n'
                for i in $(seq 0 $((k - 1))); do
                    module=builtin:hello
                    [ "$bytes" = own ] && module=$WORK/own-$i.wasm
                    printf '[[tenant]]\nname = "t%d"\nmodule = "%s"\npaths = ["/t%d"]\n' "$i" "$module" "$i"
                    paths+=("/t$i")
                done
            } >"$cfg"
            PIN=0 start_tern "$cfg" TERN_LOG=info,tern::access=off
            # Tenants of the same bytes share one loaded module; of their own bytes, one each.
            loaded=$(curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^tern_modules_loaded / { print $2 }')
            want=1
            [ "$bytes" = own ] && want=$k
            if [ "$loaded" != "$want" ]; then
                echo "bench.sh tenants: $run: ${loaded:-no} modules loaded, $want expected" >&2
                exit 1
            fi
            taskset -c 1 wrk -t1 -c"$CONNS" -d"${WARM_SECS}s" -s loadtest/rotate.lua \
                "http://127.0.0.1:$TERN_PORT/" -- "${paths[@]}" >/dev/null
            c[$run]+="$(pinned_h1 "http://127.0.0.1:$TERN_PORT/" "$TERN_PID" -s loadtest/rotate.lua -- "${paths[@]}")"$'\n'
            # Every tenant was asked its share (the turns went where they were meant to).
            read -r lo hi <<<"$(tenant_counts "$k")"
            if [ "$lo" -eq 0 ] || [ $((lo * 11)) -lt $((hi * 10)) ]; then
                echo "bench.sh tenants: the $k tenants' answers are uneven ($lo to $hi)" >&2
                exit 1
            fi
            stop "$TERN_PID"
        done
    done
    {
        header "One server, 1, 3 and 10 tenants: CPU per request, interleaved" "bash loadtest/bench.sh tenants"
        echo "Tern with \`worker_threads = 1\` pinned to core 0 serves k tenants; \`wrk -t1 -c$CONNS\`"
        echo "pinned to core 1 asks them in turn, request by request (\`loadtest/rotate.lua\`: each request"
        echo "goes to the next tenant), after ${WARM_SECS} s of the same load. *Same bytes*: every tenant"
        echo "\`builtin:hello\`, so they share one loaded module (\`tern_modules_loaded\` 1, checked); *own"
        echo "bytes*: each tenant \`hello\` with a digit for the \`n\` of its greeting (the same code, another"
        echo "heap image), so a module each (\`tern_modules_loaded\` k), with its own mapping, image and"
        echo "warm slots, as distinct tenants' modules have. CPU: the server's user + system time"
        echo "(\`/proc/PID/stat\`) over the requests answered; $ROUNDS rounds of the five runs."
        echo
        echo "| tenants | CPU per request (least) | over the rounds | k ÷ 1, paired by round | requests/s | p50 | p99 | errors |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|"
        for run in "${runs[@]}"; do
            least=$(printf '%s' "${c[$run]}" | grep . | least_cpu)
            read -r rps p50 p99 _ err _ us <<<"$least"
            k=${run%%[a-z]*} bytes=${run#"${run%%[a-z]*}"}
            echo "| $k${bytes:+, $bytes bytes} | **$us µs** | $(printf '%s' "${c[$run]}" | grep . | cpu_range) µs | $(round_ratios "${c[$run]}" "${c[1]}" 3) | $rps | $p50 µs | $p99 µs | $err |"
        done
        echo
        echo "- Goal (issue 77): a server with several tenants pays no more per request for one of them"
        echo "  than a server with that tenant alone (k ÷ 1 ≈ 1 within the rounds' noise)."
    } | tee "$RESULTS/tenants.md"
}
