# `bash loadtest/bench.sh cache`: CPU per cache hit, pinned: Tern's cache in front of a guest,
# nginx `proxy_cache` and Varnish in front of the same origin, the native hyper hello beside.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

cache() {
    need wrk wrk
    need taskset util-linux
    need nginx nginx
    need varnishd varnish
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh cache needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    # The origin's guest, as the e2e tests build it.
    local guests=$ROOT/target/test-guests
    cargo build --quiet -p tern-test-guests --bins --target wasm32-wasip1 --profile guest \
        --target-dir "$guests"
    cp "$guests/wasm32-wasip1/guest/cache_headers.wasm" "$WORK/"
    # A 1 KB and a 100 KB object (the latter streams past the guest's 64 KiB buffer).
    local small="/obj?n=1000&h=cache-control:max-age%3D3600"
    local large="/obj?n=100000&h=cache-control:max-age%3D3600"
    local object=$small
    # What a browser sends (Chromium's Accept-Encoding).
    local browser="gzip, deflate, br, zstd"
    # What the cache adds to a miss: the same guest and answer behind the cache but never
    # stored (`no-store`), against the tenant without a cache.
    local pass="/obj?n=1000&h=cache-control:no-store"
    local origin_port=18187 nginx_port=18188 varnish_port=18189
    # The origin: Tern, its tenant not cached, on its own port (idle once the caches are warm).
    printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:18197"\n[[tenant]]\nname = "origin"\nmodule = "%s"\n' \
        "$origin_port" "$WORK/cache_headers.wasm" >"$WORK/origin.toml"
    TERN_DATA_DIR="$WORK/origin-data" TERN_CACHE_DIR="$WORK/cache" target/release/tern serve \
        --config "$WORK/origin.toml" >>"$WORK/origin.log" 2>&1 &
    PIDS+=("$!")
    wait_http "http://127.0.0.1:$origin_port$object"
    # Tern with the cache, one worker pinned to core 0.
    local config=$WORK/cached.toml
    printf '[server]\nworker_threads = 1\n[[tenant]]\nname = "obj"\nmodule = "%s"\n[tenant.cache]\nenabled = true\n[[tenant]]\nname = "miss"\nmodule = "%s"\npaths = ["/miss"]\n' \
        "$WORK/cache_headers.wasm" "$WORK/cache_headers.wasm" >"$config"
    {
        # (Its worker writes the cache under the work directory, which only root may enter.)
        echo "user root;"
        nginx_preamble "$WORK"
        cat <<NGINX
    proxy_cache_path $WORK/nginx-cache levels=1:2 keys_zone=edge:10m max_size=100m inactive=60m use_temp_path=off;
    upstream origin { server 127.0.0.1:$origin_port; keepalive 16; }
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache edge;
        }
    }
}
NGINX
    } >"$WORK/nginx.conf"
    printf 'vcl 4.1;\nbackend default { .host = "127.0.0.1"; .port = "%s"; }\n' "$origin_port" >"$WORK/default.vcl"
    local -A r=()
    # Both objects stored at the server on `port`, then each asked again and again, the CPU
    # counted of `pid` (the process that serves); the rows are `key` and `key_large`.
    hits() { # key port pid
        curl -fs -o /dev/null "http://127.0.0.1:$2$small"
        curl -fs -o /dev/null "http://127.0.0.1:$2$large"
        r[$1]+="$(pinned_h1 "http://127.0.0.1:$2$small" "$3")"$'\n'
        r[$1_large]+="$(pinned_h1 "http://127.0.0.1:$2$large" "$3")"$'\n'
    }
    local n
    for n in $(seq 1 "$ROUNDS"); do
        start_pinned_native
        r[native]+="$(pinned_h1 "http://127.0.0.1:$NATIVE_PORT/" "$NATIVE_PID")"$'\n'
        stop "$NATIVE_PID"
        PIN=0 start_tern "$config" TERN_LOG=warn
        hits tern_hit "$TERN_PORT" "$TERN_PID"
        # As a browser asks (Chrome's Accept-Encoding): the hit's compressed copy.
        r[tern_hit_enc]+="$(pinned_h1 "http://127.0.0.1:$TERN_PORT$small" "$TERN_PID" -H "Accept-Encoding: $browser")"$'\n'
        r[tern_miss]+="$(pinned_h1 "http://127.0.0.1:$TERN_PORT/miss$pass" "$TERN_PID")"$'\n'
        r[tern_pass]+="$(pinned_h1 "http://127.0.0.1:$TERN_PORT$pass" "$TERN_PID")"$'\n'
        curl -fsI "http://127.0.0.1:$TERN_PORT$small" | grep -i '^cache-status' >"$WORK/tern-status"
        curl -fsI "http://127.0.0.1:$TERN_PORT$large" | grep -i '^cache-status' >"$WORK/tern-status-large"
        curl -fsI -H "Accept-Encoding: $browser" "http://127.0.0.1:$TERN_PORT$small" |
            grep -i -e '^content-encoding' -e '^content-length' | tr -d '\r' | paste -sd ' ' >"$WORK/tern-encoded"
        stop "$TERN_PID"
        taskset -c 0 nginx -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log" &
        local master=$!
        PIDS+=("$master")
        wait_http "http://127.0.0.1:$nginx_port$object" || { cat "$WORK/nginx-error.log" >&2; exit 1; }
        hits nginx "$nginx_port" "$(pgrep -P "$master" | head -1)"
        stop "$master"
        taskset -c 0 varnishd -F -j none -n "$WORK/varnish" -a "127.0.0.1:$varnish_port" \
            -f "$WORK/default.vcl" -s malloc,64m -p thread_pools=1 >>"$WORK/varnish.log" 2>&1 &
        local varnish=$!
        PIDS+=("$varnish")
        wait_http "http://127.0.0.1:$varnish_port$object"
        # The child process serves; the manager only watches it.
        hits varnish "$varnish_port" "$(pgrep -P "$varnish" | head -1)"
        stop "$varnish"
    done
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | least_cpu); done
    row() { # label line
        read -r rps p50 p99 p999 err reqs us <<<"$2"
        echo "| $1 | **$us µs** | $rps | $p50 µs | $p99 µs | $err |"
    }
    {
        header "The edge cache: CPU per hit, Tern against nginx proxy_cache and Varnish" "bash loadtest/bench.sh cache"
        echo "A 1 KB and a 100 KB answer (\`Cache-Control: max-age=3600\`) from the \`cache_headers\` test"
        echo "guest on an origin Tern (not cached, idle once the caches hold the objects), asked again and"
        echo "again. The miss rows run the guest for every request: behind the cache with \`no-store\`"
        echo "(looked up, not stored) and on a tenant without a cache; their difference is what the cache"
        echo "adds to a miss."
        echo "Each server runs pinned to core 0 (Tern \`[server] worker_threads = 1\`, nginx"
        echo "\`worker_processes 1\`, Varnish \`thread_pools=1\`, the native hello one worker);"
        echo "\`wrk -t1 -c$CONNS\` pinned to core 1. CPU: the serving process's user + system time"
        echo "(\`/proc/PID/stat\`; nginx's worker, Varnish's child) over the run per request; the least"
        echo "disturbed of $ROUNDS alternating rounds. nginx $(nginx -v 2>&1 | awk -F/ '{print $2}'), $(varnishd -V 2>&1 | head -1 | awk '{print $1, $2}' | tr -d '(')."
        echo "Tern's hits said: \`$(tr -d '\r' <"$WORK/tern-status")\` and \`$(tr -d '\r' <"$WORK/tern-status-large")\`."
        echo "The compressed row: the 1 KB hit asked with \`Accept-Encoding: $browser\` (a browser's),"
        echo "answered from the entry's compressed copy: \`$(cat "$WORK/tern-encoded")\`."
        echo
        echo "| server | CPU per request | req/s | p50 | p99 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        row "Tern, cache hit, 1 KB" "${r[tern_hit]}"
        row "Tern, cache hit, 1 KB, compressed (a browser's Accept-Encoding)" "${r[tern_hit_enc]}"
        row "nginx proxy_cache, hit, 1 KB" "${r[nginx]}"
        row "Varnish, hit, 1 KB" "${r[varnish]}"
        row "Tern, cache hit, 100 KB" "${r[tern_hit_large]}"
        row "nginx proxy_cache, hit, 100 KB" "${r[nginx_large]}"
        row "Varnish, hit, 100 KB" "${r[varnish_large]}"
        row "native hyper hello (no cache, no guest)" "${r[native]}"
        row "Tern, miss behind the cache (no-store, a guest per request)" "${r[tern_pass]}"
        row "Tern, the same guest on a tenant without a cache" "${r[tern_miss]}"
    } | tee "$RESULTS/cache.md"
}
