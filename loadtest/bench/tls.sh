# `bash loadtest/bench.sh tls`: TLS handshakes and keep-alive requests, Tern and nginx.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

# TLS: full and resumed handshakes per core-second (ECDSA P-256, TLS 1.3), and keep-alive
# requests over TLS against cleartext; Tern and nginx, each with one worker pinned to core 0 and
# the clients pinned to core 1.
tls() {
    need wrk wrk
    need nginx nginx
    need openssl openssl
    build
    local dir=$WORK/tls hz name=bench.test
    hz=$(getconf CLK_TCK)
    mkdir -p "$dir"
    bash "$ROOT/loadtest/self-signed.sh" "$dir" "$name"
    local handshakes=$ROOT/target/release/tls-handshakes
    # measure PID PORT MODE -> "handshakes/s cpu-seconds handshakes-per-core-second resumed"
    measure() {
        local before after out
        before=$(process_ticks "$1")
        out=$(taskset -c 1 "$handshakes" "127.0.0.1:$2" "$name" "$dir/cert.pem" "$3" "$SECS" "$CONNS")
        after=$(process_ticks "$1")
        read -r rate n resumed <<<"$out"
        awk -v r="$rate" -v n="$n" -v t=$((after - before)) -v hz="$hz" -v res="$resumed" \
            'BEGIN { cpu = t / hz; printf "%s %.2f %.0f %s/%s\n", r, cpu, (cpu > 0 ? n / cpu : 0), res, n }'
    }
    # keepalive URL PID -> "rps cpu-µs-per-request"
    keepalive() {
        local before after rps
        before=$(process_ticks "$2")
        rps=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" -s loadtest/latency.lua "$1" | awk '/^RESULT/ {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } print v["rps"] }')
        after=$(process_ticks "$2")
        awk -v rps="$rps" -v t=$((after - before)) -v hz="$hz" -v s="$SECS" \
            'BEGIN { printf "%s %.1f\n", rps, (rps > 0 ? t / hz * 1e6 / (rps * s) : 0) }'
    }
    local config
    config=$(hello_config "[server]\nworker_threads = 1\ntls_listen = \"127.0.0.1:18443\"\n[[certificate]]\ncert = \"$dir/cert.pem\"\nkey = \"$dir/key.pem\"\n")
    PIN=0 start_tern "$config" TERN_LOG=warn
    local tern=$TERN_PID
    declare -A r
    r[tern_full]=$(measure "$tern" 18443 full)
    r[tern_resumed]=$(measure "$tern" 18443 resumed)
    r[tern_tls]=$(keepalive "https://127.0.0.1:18443/hello" "$tern")
    r[tern_plain]=$(keepalive "http://127.0.0.1:$TERN_PORT/hello" "$tern")
    stop "$tern"
    {
        nginx_preamble "$dir"
        cat <<NGINX
    server {
        listen 127.0.0.1:18444 ssl;
        listen 127.0.0.1:18445;
        ssl_certificate $dir/cert.pem;
        ssl_certificate_key $dir/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:SSL:10m;
        ssl_session_tickets on;
        location / { return 200 "Hello, world!\n"; }
    }
}
NGINX
    } >"$dir/nginx.conf"
    taskset -c 0 nginx -c "$dir/nginx.conf" -e "$dir/nginx-error.log" &
    local master=$!
    PIDS+=("$master")
    wait_http "http://127.0.0.1:18445/"
    local worker
    worker=$(pgrep -P "$master" | head -1)
    r[nginx_full]=$(measure "$worker" 18444 full)
    r[nginx_resumed]=$(measure "$worker" 18444 resumed)
    r[nginx_tls]=$(keepalive "https://127.0.0.1:18444/" "$worker")
    r[nginx_plain]=$(keepalive "http://127.0.0.1:18445/" "$worker")
    stop "$master"
    {
        header "TLS: handshakes and keep-alive requests, Tern and nginx" "bash loadtest/bench.sh tls"
        echo "One server worker pinned to core 0, the clients to core 1 (\`taskset\`). ECDSA P-256"
        echo "certificate, TLS 1.3 (key exchange: each side's default). Handshakes: \`$CONNS\` clients"
        echo "(\`target/release/tls-handshakes\`, rustls + aws-lc-rs) connect, handshake and close in a"
        echo "loop; per core = handshakes / the server's CPU seconds (\`/proc/PID/stat\`). Keep-alive:"
        echo "\`wrk -t1 -c$CONNS\` on Tern's demo \`hello\` (a fresh guest per request) and nginx's"
        echo "\`return 200\` (no guest), HTTP/1.1. nginx $(nginx -v 2>&1 | awk -F/ '{print $2}'), OpenSSL $(openssl version | awk '{print $2}')."
        echo
        echo "| server | full handshakes/s | per core-second | resumed handshakes/s | per core-second | resumed/total |"
        echo "|---|---|---|---|---|---|"
        for s in tern nginx; do
            read -r fr _ fc _ <<<"${r[${s}_full]}"
            read -r rr _ rc rs <<<"${r[${s}_resumed]}"
            echo "| $s | $fr | $fc | $rr | $rc | $rs |"
        done
        echo
        echo "| server | HTTPS keep-alive req/s | server CPU µs/req | HTTP keep-alive req/s | server CPU µs/req | TLS / cleartext |"
        echo "|---|---|---|---|---|---|"
        for s in tern nginx; do
            read -r tr tc <<<"${r[${s}_tls]}"
            read -r pr pc <<<"${r[${s}_plain]}"
            echo "| $s | $tr | $tc | $pr | $pc | $(ratio "$tr" "$pr") |"
        done
        echo
        read -r tf _ tfc _ <<<"${r[tern_full]}"; read -r nf _ nfc _ <<<"${r[nginx_full]}"
        echo "- Full handshakes per core-second, Tern / nginx: **$(ratio "$tfc" "$nfc")**"
    } | tee "$RESULTS/tls.md"
}
