# `bash loadtest/bench.sh density`: requests spread over 1, 100 and 10,000 tenants.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

density() {
    need wrk wrk
    build
    # The dense row: memory slots for every tenant in each worker's share of the pool (one
    # share per core, up to 16), as many as the address space holds (~20,000 slots) and
    # vm.max_map_count allows (3 mappings per module and per used slot, 2 per stack).
    local shards slots maps big=10000
    shards=$(nproc); [ "$shards" -gt 16 ] && shards=16
    slots=$(( (big + 1023) / 1024 * 1024 * shards )); [ "$slots" -gt 20480 ] && slots=20480
    maps=$(cat /proc/sys/vm/max_map_count)
    local fit=$(( (maps - 3 * big - 2 * 256 - 2000) / 3 / 1024 * 1024 ))
    local note=""
    if [ "$fit" -lt "$slots" ]; then
        note="vm.max_map_count is $maps: the dense row has $fit memory slots, not $slots (\`sysctl -w vm.max_map_count=262144\` for all of them)"
        slots=$fit
    fi
    local rows="" spec n s
    local -A rss_of=() warm_of=()
    for spec in ${DENSITY:-1:0 100:0 $big:0 $big:$slots}; do
        n=${spec%%:*} s=${spec#*:}
        local dir=$WORK/density-$n
        rm -rf "$dir"
        target/release/startup write-store "$dir/data" "$n" >/dev/null
        printf '[server]\nadmin_token = "x"\n[pool]\nmemory_slots = %s\n' "$s" >"$dir/tern.toml"
        printf 'local n = %s\nrequest = function() return wrk.format("GET", "/t" .. math.random(0, n - 1)) end\n' \
            "$n" >"$dir/spread.lua"
        cat loadtest/latency.lua >>"$dir/spread.lua"
        local cold warm mapped
        env TERN_CACHE_DIR="$dir/cache" target/release/tern serve --config "$dir/tern.toml" \
            --data-dir "$dir/data" --listen 127.0.0.1:$TERN_PORT --admin-listen 127.0.0.1:$ADMIN_PORT \
            >>"$WORK/tern.log" 2>&1 &
        TERN_PID=$!
        wait_http "http://127.0.0.1:$ADMIN_PORT/readyz"
        cold=$(h1 http://127.0.0.1:$TERN_PORT/ "$CONNS" "$dir/spread.lua")
        warm=$(h1 http://127.0.0.1:$TERN_PORT/ "$CONNS" "$dir/spread.lua")
        rss_of[$spec]=$(awk '/VmRSS/ { print $2 }' /proc/$TERN_PID/status)
        mapped=$(wc -l <"/proc/$TERN_PID/maps")
        stop "$TERN_PID"
        read -r crps _ cp99 _ cerr <<<"$cold"
        read -r wrps _ wp99 _ werr <<<"$warm"
        warm_of[$spec]=$wrps
        [ "$s" = 0 ] && s="256 (default)"
        rows+="| $n | $s | $crps | $cp99 µs | $wrps | $wp99 µs | $((cerr + werr)) | $(( (rss_of[$spec] + 512) / 1024 )) MiB | $mapped |"$'\n'
    done
    {
        header "Tenant density: requests spread over many tenants" "bash loadtest/bench.sh density"
        echo "N tenants deployed through the data directory (as \`tern deploy\` leaves it), each with its"
        echo "own module (a minimal ABI v1 guest with one host call; \`target/release/startup write-store\`)"
        echo "and its own path \`/tI\`; every request goes to a random tenant. *Cold* is the first run"
        echo "after start (every module's first instantiation maps its image), *warm* the run after it."
        echo "*Memory slots*: \`[pool] memory_slots\` (docs/configuration.md, \"Many tenants\"); *mappings*:"
        echo "lines of \`/proc/PID/maps\` after the runs (vm.max_map_count here: $maps)."
        echo
        echo "| tenants | memory slots | cold req/s | cold p99 | warm req/s | warm p99 | errors | RSS after | mappings |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        printf '%s' "$rows"
        echo
        if [ -n "$note" ]; then echo "- $note"; fi
        local one=${warm_of[1:0]:-} k
        for k in "$big:0" "$big:$slots"; do
            [ -n "$one" ] && [ -n "${warm_of[$k]:-}" ] || continue
            echo "- $big tenants, memory slots ${k#*:} (0: the default): warm requests/s / one tenant's: **$(ratio "${warm_of[$k]}" "$one")** (goal ≥ 0.7); RSS per tenant over the one-tenant server: **$(( (rss_of[$k] - rss_of[1:0]) / (big - 1) )) KiB**"
        done
    } | tee "$RESULTS/density.md"
}
