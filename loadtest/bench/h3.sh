# `bash loadtest/bench.sh h3`: HTTP/3 against HTTP/2 over TLS, requests per core and
# handshakes, Tern and Caddy. Sourced by loadtest/bench.sh after loadtest/lib.sh (and
# bench/compression.sh, for find_caddy).

# Each server pinned to core 0, the client (`target/release/h3load`: the same client code for
# both protocols, rustls + aws-lc-rs; quinn + h3 for HTTP/3, hyper for HTTP/2) to core 1.
# Keep-alive: H3_CONNS connections with H3_STREAMS requests in flight each; per core =
# requests / the server's CPU seconds (/proc/PID/stat). Handshakes: CONNS loops of connect,
# one request, close (full handshakes: the client resumes none).
h3() {
    need openssl openssl
    build
    local caddy dir=$WORK/h3 hz name=bench.test conns=${H3_CONNS:-16} streams=${H3_STREAMS:-8}
    caddy=$(find_caddy)
    hz=$(getconf CLK_TCK)
    mkdir -p "$dir"
    bash "$ROOT/loadtest/self-signed.sh" "$dir" "$name"
    local load=$ROOT/target/release/h3load
    # run PID PROTO PORT PATH MODE -> "rate count errors cpu-µs-per-unit units-per-core-second"
    run() {
        local before after out c=$conns s=$streams
        [ "$5" = handshakes ] && c=$CONNS s=1
        before=$(process_ticks "$1")
        out=$(taskset -c 1 "$load" "$2" "127.0.0.1:$3" "$name" "$dir/cert.pem" "$4" "$SECS" "$c" "$s" "$5")
        after=$(process_ticks "$1")
        read -r rate n errors <<<"$out"
        awk -v r="$rate" -v n="$n" -v e="$errors" -v t=$((after - before)) -v hz="$hz" \
            'BEGIN { cpu = t / hz; printf "%s %s %s %.1f %.0f\n", r, n, e, (n > 0 ? cpu * 1e6 / n : 0), (cpu > 0 ? n / cpu : 0) }'
    }
    # thread_ticks PID NAME -> CPU ticks of the process's thread called NAME
    thread_ticks() {
        local t
        for t in /proc/"$1"/task/*; do
            [ "$(cat "$t/comm" 2>/dev/null)" = "$2" ] && awk '{ print $14 + $15; exit }' "$t/stat" && return
        done
        echo 0
    }
    # workers_run PID CORES -> the keep-alive run over HTTP/3 with the client on CORES, then
    # "rate count errors cpu-µs-per-req worker0-share% worker1-share% quic-conns-w0 quic-conns-w1"
    workers_run() {
        local before after w0 w1 w0b w1b out conns_w
        before=$(process_ticks "$1")
        w0b=$(thread_ticks "$1" tern-worker-0)
        w1b=$(thread_ticks "$1" tern-worker-1)
        /usr/bin/time -f "%U %S" -o "$dir/time" taskset -c "$2" "$load" h3 127.0.0.1:18443 "$name" "$dir/cert.pem" /hello "$SECS" "$conns" "$streams" keepalive >"$dir/out" &
        local lpid=$!
        sleep $((SECS / 2))
        conns_w=$(curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^tern_worker_connections_open\{transport="quic",worker="0"\}/ { a = $2 } /^tern_worker_connections_open\{transport="quic",worker="1"\}/ { b = $2 } END { printf "%d %d", a, b }')
        wait "$lpid"
        after=$(process_ticks "$1")
        w0=$(( $(thread_ticks "$1" tern-worker-0) - w0b ))
        w1=$(( $(thread_ticks "$1" tern-worker-1) - w1b ))
        read -r rate n errors <"$dir/out"
        local client
        client=$(awk '{ print $1 + $2 }' "$dir/time")
        awk -v r="$rate" -v n="$n" -v e="$errors" -v t=$((after - before)) -v hz="$hz" -v w0="$w0" -v w1="$w1" -v c="$conns_w" -v cl="$client" -v secs="$SECS" \
            'BEGIN { cpu = t / hz; w = w0 + w1; printf "%s %s %s %.1f %.0f %.0f %s %.1f %.2f\n", r, n, e, (n > 0 ? cpu * 1e6 / n : 0), (w > 0 ? 100 * w0 / w : 0), (w > 0 ? 100 * w1 / w : 0), c, (n > 0 ? cl * 1e6 / n : 0), (cpu + cl) / secs }'
    }
    local config config2
    config=$(hello_config "[server]\nworker_threads = 1\ntls_listen = \"127.0.0.1:18443\"\nhttp3 = true\n[[certificate]]\ncert = \"$dir/cert.pem\"\nkey = \"$dir/key.pem\"\n")
    config2=$(hello_config "[server]\nworker_threads = 2\ntls_listen = \"127.0.0.1:18443\"\nhttp3 = true\n[[certificate]]\ncert = \"$dir/cert.pem\"\nkey = \"$dir/key.pem\"\n")
    cat >"$dir/Caddyfile" <<CADDY
{
	admin off
	auto_https disable_redirects
	servers {
		protocols h1 h2 h3
	}
}
https://$name:18543 {
	tls $dir/cert.pem $dir/key.pem
	respond "Hello, world!" 200
}
CADDY
    declare -A r
    local round
    for round in $(seq "$ROUNDS"); do
        PIN=0 start_tern "$config" TERN_LOG=warn
        local tern=$TERN_PID
        r[tern_h2]+="$(run "$tern" h2 18443 /hello keepalive)"$'\n'
        r[tern_h3]+="$(run "$tern" h3 18443 /hello keepalive)"$'\n'
        r[tern_h2hs]+="$(run "$tern" h2 18443 /hello handshakes)"$'\n'
        r[tern_h3hs]+="$(run "$tern" h3 18443 /hello handshakes)"$'\n'
        stop "$tern"
        # Workers: one (server on core 0, client on core 1), then two (server and client on
        # both cores, as a two-core edge whose clients are elsewhere cannot be shown here).
        PIN=0 start_tern "$config" TERN_LOG=warn
        r[w1]+="$(workers_run "$TERN_PID" 1)"$'\n'
        stop "$TERN_PID"
        PIN=0,1 start_tern "$config2" TERN_LOG=warn
        r[w2]+="$(workers_run "$TERN_PID" 0,1)"$'\n'
        stop "$TERN_PID"
        GOMAXPROCS=1 taskset -c 0 "$caddy" run --config "$dir/Caddyfile" --adapter caddyfile \
            >"$dir/caddy.log" 2>&1 &
        local cpid=$!
        PIDS+=("$cpid")
        local deadline=$((SECONDS + 30))
        until curl -fsk -o /dev/null --resolve "$name:18543:127.0.0.1" "https://$name:18543/"; do
            [ "$SECONDS" -lt "$deadline" ] || { echo "Caddy did not start: $(cat "$dir/caddy.log")" >&2; exit 1; }
            sleep 0.2
        done
        r[caddy_h2]+="$(run "$cpid" h2 18543 / keepalive)"$'\n'
        r[caddy_h3]+="$(run "$cpid" h3 18543 / keepalive)"$'\n'
        r[caddy_h2hs]+="$(run "$cpid" h2 18543 / handshakes)"$'\n'
        r[caddy_h3hs]+="$(run "$cpid" h3 18543 / handshakes)"$'\n'
        stop "$cpid"
    done
    # span KEY COLUMN -> "min-max" over the rounds
    span() { printf '%s' "${r[$1]}" | awk -v c="$2" 'NF { v = $c + 0; if (min == "" || v < min) min = v; if (v > max) max = v }
        END { if (min == max) print min; else print min "-" max }'; }
    # per_core_ratio A B -> min-max of A's per-core rate over B's, round by round
    per_core_ratio() {
        paste <(printf '%s' "${r[$1]}") <(printf '%s' "${r[$2]}") | awk 'NF { q = ($10 > 0 ? $5 / $10 : 0); if (min == "" || q < min) min = q; if (q > max) max = q }
            END { if (min == max) printf "%.2f", min; else printf "%.2f-%.2f", min, max }'
    }
    {
        header "HTTP/3 against HTTP/2 over TLS, Tern and Caddy" "bash loadtest/bench.sh h3"
        echo "One server pinned to core 0 (Tern: one worker; Caddy $CADDY_VERSION: GOMAXPROCS=1), the client"
        echo "to core 1 (\`target/release/h3load\`: one client for both protocols, rustls + aws-lc-rs;"
        echo "quinn + h3 for HTTP/3, hyper for HTTP/2). Keep-alive: $conns connections x $streams requests"
        echo "in flight, $SECS s; per core = requests / the server's CPU seconds (\`/proc/PID/stat\`)."
        echo "Handshakes: $CONNS loops of connect (full handshake, ECDSA P-256, TLS 1.3), one request,"
        echo "close. Tern serves its demo \`hello\` (a fresh guest per request), Caddy a static"
        echo "\`respond\` (no guest). Ranges over $ROUNDS rounds."
        echo
        echo "| server | protocol | req/s | errors | server CPU µs/req | req per core-second |"
        echo "|---|---|---|---|---|---|"
        local s p
        for s in tern caddy; do for p in h2 h3; do
            echo "| $s | $p | $(span "${s}_$p" 1) | $(span "${s}_$p" 3) | $(span "${s}_$p" 4) | $(span "${s}_$p" 5) |"
        done; done
        echo
        echo "| server | protocol | handshakes/s | errors | server CPU µs/handshake | per core-second |"
        echo "|---|---|---|---|---|---|"
        for s in tern caddy; do for p in h2 h3; do
            echo "| $s | $p | $(span "${s}_${p}hs" 1) | $(span "${s}_${p}hs" 3) | $(span "${s}_${p}hs" 4) | $(span "${s}_${p}hs" 5) |"
        done; done
        echo
        echo "- Requests per core, HTTP/3 / HTTP/2: Tern **$(per_core_ratio tern_h3 tern_h2)**, Caddy $(per_core_ratio caddy_h3 caddy_h2) (goal for Tern: ≥ 0.8)"
        echo "- Requests per core over HTTP/3, Tern / Caddy: **$(per_core_ratio tern_h3 caddy_h3)** (Tern runs a guest per request)"
        echo "- Handshakes per core over QUIC, Tern / Caddy: **$(per_core_ratio tern_h3hs caddy_h3hs)**"
        echo
        echo "HTTP/3 on every worker (packets steered by connection ID): the keep-alive run with one"
        echo "worker (server on core 0, client on core 1), then two (server and client on both cores)."
        echo "Worker shares: each worker thread's part of the server's worker CPU (\`/proc/PID/task\`);"
        echo "connections: \`tern_worker_connections_open{transport=\"quic\"}\` halfway through."
        echo
        echo "| workers | req/s | errors | server CPU µs/req | worker 0 share % | worker 1 share % | QUIC connections on worker 0 / 1 | client CPU µs/req | cores busy (server + client) |"
        echo "|---|---|---|---|---|---|---|---|---|"
        echo "| 1 | $(span w1 1) | $(span w1 3) | $(span w1 4) | $(span w1 5) | $(span w1 6) | $(span w1 7) / $(span w1 8) | $(span w1 9) | $(span w1 10) |"
        echo "| 2 | $(span w2 1) | $(span w2 3) | $(span w2 4) | $(span w2 5) | $(span w2 6) | $(span w2 7) / $(span w2 8) | $(span w2 9) | $(span w2 10) |"
        echo
        # Round by round: the measured ratio, and what two workers would serve with the client
        # on other cores (both cores the server's: 2 / its µs per request, over one worker's
        # 1 / its µs per request).
        echo "- req/s, 2 workers / 1, measured: **$(paste <(printf '%s' "${r[w2]}") <(printf '%s' "${r[w1]}") | awk 'NF { q = $1 / $11; if (min == "" || q < min) min = q; if (q > max) max = q } END { printf "%.2f-%.2f", min, max }')** (the client takes its share of the two cores)"
        echo "- server capacity, 2 workers / 1 (2 × µs/req at 1 worker / µs/req at 2): **$(paste <(printf '%s' "${r[w2]}") <(printf '%s' "${r[w1]}") | awk 'NF { q = 2 * $14 / $4; if (min == "" || q < min) min = q; if (q > max) max = q } END { printf "%.2f-%.2f", min, max }')**"
    } | tee "$RESULTS/h3.md"
}
