#!/usr/bin/env bash
# The cost of the admin API's access check: server CPU per `GET /admin/v1/tenants/hello` with the
# operator's token and with a scoped token, side by side in alternating rounds.
#
#   bash loadtest/admin-check.sh [TERN_BIN]     (default: target/release/tern)
#
# Starts the binary with its demo tenants pinned to core 0, makes a scoped token (read, tenant
# hello), then runs `wrk -t1 -c4 -d${SECS}s` pinned to core 1 with each token in turn and reads
# the server's CPU (utime + stime, /proc/PID/stat) over each run. Prints every round and each
# token's range. Settings (environment): SECS=5, ROUNDS=3, PORT=18280 (and PORT+1 for the admin
# listener). Needs wrk, taskset and 2 cores.
set -euo pipefail
BIN=${1:-target/release/tern}
[ -x "$BIN" ] || { echo "usage: bash loadtest/admin-check.sh [TERN_BIN]" >&2; exit 2; }
command -v wrk >/dev/null || { echo "admin-check.sh needs wrk (apt-get install wrk)" >&2; exit 2; }
SECS=${SECS:-5} ROUNDS=${ROUNDS:-3} PORT=${PORT:-18280}
ADMIN=$((PORT + 1))
WORK=$(mktemp -d)
OPERATOR=operator-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
trap 'kill "${PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
TERN_ADMIN_TOKEN=$OPERATOR TERN_DATA_DIR=$WORK/data TERN_CACHE_DIR=$WORK/cache TERN_LOG=warn \
    taskset -c 0 "$BIN" serve --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:$ADMIN \
    >"$WORK/log" 2>&1 &
PID=$!
for _ in $(seq 1 300); do
    curl -fs -o /dev/null "http://127.0.0.1:$ADMIN/readyz" && break
    sleep 0.1
done
SCOPED=$(TERN_ADMIN_TOKEN=$OPERATOR "$BIN" token create --tenant hello --scope read \
    --name admin-check --server "http://127.0.0.1:$ADMIN" | tail -1)
results=$WORK/results
for _ in $(seq 1 "$ROUNDS"); do
    for label in operator scoped; do
        if [ "$label" = operator ]; then token=$OPERATOR; else token=$SCOPED; fi
        t0=$(awk '{ print $14 + $15 }' "/proc/$PID/stat")
        out=$(taskset -c 1 wrk -t1 -c4 -d"${SECS}s" -H "Authorization: Bearer $token" \
            "http://127.0.0.1:$ADMIN/admin/v1/tenants/hello")
        t1=$(awk '{ print $14 + $15 }' "/proc/$PID/stat")
        if echo "$out" | grep -q "Non-2xx"; then echo "$label: answers other than 200" >&2; exit 1; fi
        echo "$out" | awk -v l="$label" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '
            /requests in/ { n = $1 } END { if (n > 0) printf "%s %.2f\n", l, t / hz * 1e6 / n }' |
            tee -a "$results" | awk '{ printf "%-8s %6s µs CPU/request\n", $1, $2 }'
    done
done
for label in operator scoped; do
    awk -v l="$label" '$1 == l { print $2 }' "$results" | sort -n | awk -v l="$label" '
        { v[NR] = $1 } END { printf "%-8s %.2f-%.2f µs CPU per request (%d rounds)\n", l, v[1], v[NR], NR }'
done
