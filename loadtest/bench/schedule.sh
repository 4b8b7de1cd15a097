# `bash loadtest/bench.sh schedule`: how punctual scheduled runs are under load. One Tern server
# pinned to core 0 (`worker_threads = 1`) with the `hello` demo and the schedule probe (a test
# guest that records, in its key-value store, the tick it was called for and when it started
# by its own clock) on a 6-field schedule `*/2 * * * * *`, while wrk (on core 1) keeps `hello`
# busy for SCHEDULE_SECS (default 205: about 100 ticks). Reported: ticks run, and the delay from
# each tick to its guest's start (p50, p99, max), from the guest's own records.
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

schedule() {
    need wrk wrk
    need taskset util-linux
    need curl curl
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh schedule needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    cargo build --quiet -p tern-test-guests --bin schedule_probe --target wasm32-wasip1 \
        --profile guest --target-dir "$ROOT/target/test-guests"
    local probe=$ROOT/target/test-guests/wasm32-wasip1/guest/schedule_probe.wasm
    local secs=${SCHEDULE_SECS:-205} config=$WORK/schedule.toml
    cat >"$config" <<TOML
[server]
worker_threads = 1
[[tenant]]
name = "hello"
module = "builtin:hello"
paths = ["/hello"]
[[tenant]]
name = "probe"
module = "$probe"
paths = ["/probe"]
kv = ["default"]
[[tenant.schedule]]
cron = "*/2 * * * * *"
path = "/probe/tick?clock=1"
TOML
    PIN=0 start_tern "$config" TERN_LOG=warn
    local started
    started=$(date +%s)
    taskset -c 1 wrk -t1 -c32 -d"${secs}s" "http://127.0.0.1:$TERN_PORT/hello" >"$WORK/wrk.txt"
    local lines=$WORK/schedule-runs.txt
    curl -sf "http://127.0.0.1:$TERN_PORT/probe" >"$lines"
    stop "$TERN_PID"
    local rps
    rps=$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.txt")
    local out=$ROOT/loadtest/results/schedule.md
    python3 - "$lines" "$rps" "$secs" "$started" >"$out" <<'PY'
import sys, datetime
lines, rps, secs, started = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lags = []
for line in open(lines):
    f = line.rstrip("\n").split("|")
    if len(f) < 6 or f[0] != "/probe/tick":
        continue
    tick = datetime.datetime.fromisoformat(f[3].replace("Z", "+00:00")).timestamp() * 1000
    lags.append(int(f[5]) - tick)
lags.sort()
def q(p):
    return lags[min(len(lags) - 1, int(p * len(lags)))]
print("# Scheduled runs: punctuality under load\n")
print(f"`bash loadtest/bench.sh schedule` on {datetime.date.today()}: one Tern server pinned to core 0 "
      f"(`worker_threads = 1`), wrk `-t1 -c32` on core 1 against `/hello` for {secs} s "
      f"({float(rps):,.0f} requests/s) while the schedule `*/2 * * * * *` runs the probe guest.\n")
print("| ticks run | tick → guest start p50 | p99 | max |")
print("|---|---|---|---|")
print(f"| {len(lags)} | {q(0.5):.0f} ms | {q(0.99):.0f} ms | {lags[-1]:.0f} ms |")
PY
    cat "$out"
}
