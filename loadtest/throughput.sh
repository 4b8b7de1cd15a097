#!/usr/bin/env bash
# Tern's demo `hello` against a native hyper hello-world, side by side in one run, with the same
# wrk load (HTTP/1.1 keep-alive). Prints a table with Tern/native ratios and writes it to
# loadtest/results/throughput.md.
#
# Usage: bash loadtest/throughput.sh [DURATION_SECONDS] [CONNECTIONS]   (defaults: 10 64)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-64}
command -v wrk >/dev/null || { echo "wrk is required (Debian: apt-get install wrk)" >&2; exit 1; }
cargo build --release --quiet -p tern -p tern-loadtest

cache=$(mktemp -d)
export TERN_CACHE_DIR=$cache
target/release/tern serve --listen 127.0.0.1:18180 --admin-listen 127.0.0.1:18190 \
    >"$cache/tern.log" 2>&1 & tern=$!
target/release/native-hello 127.0.0.1:18181 2>/dev/null & native=$!
trap 'kill $tern $native 2>/dev/null; rm -rf "$cache"' EXIT
for _ in $(seq 1 100); do
    curl -fs -o /dev/null http://127.0.0.1:18180/hello && curl -fs -o /dev/null http://127.0.0.1:18181/ && break
    sleep 0.1
done

run() { # name url -> "rps p50 p99 p999 errors"
    wrk -t2 -c"$conns" -d"${secs}s" -s loadtest/latency.lua "$2" | awk '/^RESULT/ {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        print v["rps"], v["p50"], v["p99"], v["p999"], v["errors"] }'
}
# Alternate the two servers so drift on a shared machine hits both alike.
native1=$(run native http://127.0.0.1:18181/)
tern1=$(run tern http://127.0.0.1:18180/hello)
native2=$(run native http://127.0.0.1:18181/)
tern2=$(run tern http://127.0.0.1:18180/hello)

best() { printf '%s\n%s\n' "$1" "$2" | sort -k1,1nr | head -1; }
read -r n_rps n_p50 n_p99 n_p999 n_err <<<"$(best "$native1" "$native2")"
read -r t_rps t_p50 t_p99 t_p999 t_err <<<"$(best "$tern1" "$tern2")"
ratio=$(awk -v a="$t_rps" -v b="$n_rps" 'BEGIN { printf "%.2f", a / b }')
phases=$(curl -s http://127.0.0.1:18190/metrics | awk '
    /^tern_request_phase_duration_seconds_sum/ { match($0, /phase="[a-z]+"/); p = substr($0, RSTART + 7, RLENGTH - 8); s[p] = $2 }
    /^tern_request_phase_duration_seconds_count/ { match($0, /phase="[a-z]+"/); p = substr($0, RSTART + 7, RLENGTH - 8); c[p] = $2 }
    END { for (p in s) if (c[p] > 0) printf "%s %.1f µs, ", p, s[p] / c[p] * 1e6 }')

out=loadtest/results/throughput.md
mkdir -p loadtest/results
{
    echo "# Throughput: Tern \`hello\` against native hyper"
    echo
    echo "- Command: \`bash loadtest/throughput.sh $secs $conns\` (wrk -t2 -c$conns -d${secs}s, HTTP/1.1 keep-alive; best of two alternating runs each)"
    echo "- Machine: $(nproc) cores, shared with the load generator; $(date -u +%F); commit \`$(git rev-parse --short HEAD)\`"
    echo
    echo "| server | requests/s | p50 | p99 | p99.9 | errors |"
    echo "|---|---|---|---|---|---|"
    echo "| native hyper hello | $n_rps | ${n_p50} µs | ${n_p99} µs | ${n_p999} µs | $n_err |"
    echo "| Tern \`hello\` (fresh instance per request) | $t_rps | ${t_p50} µs | ${t_p99} µs | ${t_p999} µs | $t_err |"
    echo
    echo "Tern / native requests/s: **$ratio**"
    echo
    echo "Tern's mean phases during the run: ${phases%, }"
} | tee "$out"
