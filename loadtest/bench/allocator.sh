# `bash loadtest/bench.sh allocator`: the same load with mimalloc and with the system allocator.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

allocator() {
    need wrk wrk
    cargo build --release --quiet -p tern --no-default-features
    cp target/release/tern "$WORK/tern-system"
    build
    cp target/release/tern "$WORK/tern-mimalloc"
    local config n a
    config=$(hello_config)
    local -A r=()
    for n in $(seq 1 "$ROUNDS"); do
        for a in mimalloc system; do
            TERN_BIN=$WORK/tern-$a start_tern "$config"
            r[$a]+="$(h1 http://127.0.0.1:$TERN_PORT/hello)"$'\n'
            stop "$TERN_PID"
        done
    done
    for a in mimalloc system; do r[$a]=$(printf '%s' "${r[$a]}" | grep . | best); done
    {
        header "Host allocator: mimalloc against the system allocator" "bash loadtest/bench.sh allocator"
        echo "The same Tern build with the default \`mimalloc\` feature and with \`--no-default-features\`"
        echo "(glibc malloc), alternating, under the \`hello\` load."
        echo
        echo "| allocator | requests/s | p50 | p99 | p99.9 | errors |"
        echo "|---|---:|---:|---:|---:|---:|"
        row "mimalloc (default)" "${r[mimalloc]}"
        row "system (glibc)" "${r[system]}"
        echo
        echo "- mimalloc / system: **$(ratio "${r[mimalloc]%% *}" "${r[system]%% *}")**"
    } | tee "$RESULTS/allocator.md"
}
