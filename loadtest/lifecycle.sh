#!/usr/bin/env bash
# The instance lifecycle table next to Lucet's published figures, the heap-size and teardown
# curves, and p50/p99 per phase of the demo `hello`. Runs the criterion bench (~4 minutes) and
# `server/examples/phases.rs`, then writes loadtest/results/lifecycle.md and the .tsv files
# that `bash loadtest/bench.sh charts` draws.
#
# Usage: bash loadtest/lifecycle.sh [--no-bench]   (--no-bench: reuse target/criterion)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--no-bench" ]; then
    cargo bench -p tern --bench lifecycle -- --noplot
fi
cargo build --release --quiet -p tern --example phases
phases_hello=$(target/release/examples/phases builtin:hello 200000)
phases_min=$(target/release/examples/phases loadtest/guests/min.wat 200000)

python3 - "$phases_hello" "$phases_min" "$(git rev-parse --short HEAD)" "$(nproc)" "$(uname -r | cut -d- -f1)" <<'EOF'
import json, os, sys, datetime
hello, minimal, commit, cores, kernel = sys.argv[1:]
crit = "target/criterion"
def median_us(path):
    with open(os.path.join(crit, path, "new", "estimates.json")) as f:
        return json.load(f)["median"]["point_estimate"] / 1000.0
def p(text):
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[1].endswith("µs"):
            out[f[0]] = [float(x[:-2]) for x in f[1:]]
    return out
ph, pm = p(hello), p(minimal)
lc = lambda b: median_us(f"lifecycle/{b}")
fmt = lambda us: f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.2f} µs"
rows = [
    ("load module + create region + instantiate + run `hello` (cold)", 52, lc("cold_start_hello")),
    ("instantiate from a warm pool (`hello`)", 30, ph["instantiate"][0]),
    ("call a trivial function (context switch in and out, `nop`)", 0.5, lc("call_trivial_nop")),
    ("teardown (reset memory and table, zero the stack, return the slot)", 23, ph["teardown"][0]),
    ("total per request, `hello` (instantiate + run + teardown)", 60, ph["total"][0]),
]
res = "loadtest/results"
def write_tsv(name, header, table):
    with open(f"{res}/{name}.tsv", "w") as f:
        f.write("# " + "\t".join(header) + "\n")
        for r in table:
            f.write("\t".join(str(x) for x in r) + "\n")
sizes = [64, 1024, 4096, 16384, 65536]
heap = [(k, median_us(f"instantiate_vs_heap/dense/{k}KiB"), median_us(f"instantiate_vs_heap/sparse/{k}KiB")) for k in sizes]
td = [(k, median_us(f"teardown_vs_touched/{k}KiB"), 23 + 37.5 * k / 1024) for k in sizes]
write_tsv("lifecycle", ("phase", "Lucet_us", "Tern_us"),
          [(name.split(" (")[0].replace("`", ""), lucet, round(tern, 3)) for name, lucet, tern in rows[1:]])
write_tsv("heap", ("heap_KiB", "dense_us", "sparse_us"), [(k, round(d, 3), round(sp, 3)) for k, d, sp in heap])
write_tsv("teardown", ("touched_KiB", "Tern_us", "Lucet_us"), [(k, round(t, 3), round(l, 1)) for k, t, l in td])

L = []
L.append("# Instance lifecycle: Tern against Lucet's published figures\n")
L.append(f"- Command: `bash loadtest/lifecycle.sh` (criterion medians from `cargo bench -p tern --bench lifecycle`;")
L.append("  p50/p99 from `server/examples/phases.rs`, 200,000 requests each, no HTTP).")
L.append(f"- Machine: {cores} cores (shared, noisy), Linux {kernel}, wasmtime 48.0.8; {datetime.date.today()}; commit `{commit}`.")
L.append("- Guests: `hello` is the Rust SDK example (`guest-sdk/examples/hello.rs`); `min` is")
L.append("  `loadtest/guests/min.wat` (one host call); `nop` returns at once; heap guests are generated per size.\n")
L.append("| phase | Lucet | Tern | Lucet / Tern |")
L.append("|---|---:|---:|---:|")
for name, lucet, tern in rows:
    L.append(f"| {name} | {fmt(lucet)} | {fmt(tern)} | {lucet / tern:.1f}x |")
L.append("")
L.append("Target: `hello` instantiate + run + teardown **≤ 5 µs p50**. The cold row includes creating the")
L.append("engine, which reserves the whole pool's virtual memory and pre-links; it happens once per process.\n")
L.append("## Per-phase percentiles\n")
L.append("| guest | phase | p50 | p90 | p99 |")
L.append("|---|---|---:|---:|---:|")
for g, d in (("hello", ph), ("min", pm)):
    for k in ("instantiate", "run", "teardown", "total"):
        a, b, c = d[k]
        L.append(f"| {g} | {k} | {a:.2f} µs | {b:.2f} µs | {c:.2f} µs |")
L.append("")
L.append("## Instantiation against initial heap size (copy-on-write images)\n")
L.append("| initial heap | dense | sparse (one page in eight) |")
L.append("|---:|---:|---:|")
for k, d, sp in heap:
    L.append(f"| {k} KiB | {d:.2f} µs | {sp:.2f} µs |")
L.append(f"\n64 MiB / 64 KiB (dense): **{heap[-1][1] / heap[0][1]:.2f}x** (target: within 2x; Lucet's grew linearly).")
L.append("![heap](heap.png)\n")
L.append("## Teardown against memory the guest touched\n")
L.append("| touched | Tern | Lucet (23 µs + 37.5 µs per MiB) |")
L.append("|---:|---:|---:|")
for k, t, l in td:
    L.append(f"| {k} KiB | {t:.1f} µs | {l:.0f} µs |")
slope = (td[-1][1] - td[-2][1]) / ((td[-1][0] - td[-2][0]) / 1024)
L.append(f"\nTern: about {slope:.1f} µs per MiB touched beyond what is kept resident (Lucet: 35-40).")
L.append("![teardown](teardown.png)\n")
L.append("## Pool reset settings (total per `hello` request, criterion median)\n")
L.append("| setting | total |")
L.append("|---|---:|")
base = os.path.join(crit, "reset_settings_total_hello")
for b in sorted(os.listdir(base)) if os.path.isdir(base) else []:
    if b == "report":
        continue
    default = " (default)" if b == "keep1024KiB_scanon_stack16KiB" else ""
    L.append(f"| `{b}`{default} | {median_us('reset_settings_total_hello/' + b):.2f} µs |")
L.append("\n![lifecycle](lifecycle.png)")
open(f"{res}/lifecycle.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
