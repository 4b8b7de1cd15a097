# `bash loadtest/bench.sh compression`: CPU per compressed response and bytes saved, pinned:
# Tern's `[tenant.compression]` against Caddy's `encode` and nginx's `gzip` serving the same
# 20 KB JSON and 200 KB HTML. Sourced by loadtest/bench.sh after loadtest/lib.sh.

CADDY_VERSION=2.11.9

# Caddy $CADDY_VERSION, installed once under the tools cache (`go install`, a few minutes).
find_caddy() {
    local dir=$TOOLS/caddy-$CADDY_VERSION
    if [ ! -x "$dir/caddy" ]; then
        need go golang-go
        GOBIN=$dir go install "github.com/caddyserver/caddy/v2/cmd/caddy@v$CADDY_VERSION" >&2 \
            || { echo "go install of Caddy $CADDY_VERSION failed" >&2; exit 1; }
    fi
    echo "$dir/caddy"
}

# The two bodies, the same bytes for every run: a JSON list of records and an HTML page of
# articles, words drawn from a fixed vocabulary with a fixed seed (text compresses as text
# does, not as one repeated line).
compression_bodies() { # dir
    python3 - "$1" <<'PY'
import json, random, sys
out = sys.argv[1]
rng = random.Random(2026)
words = ("edge server request tenant guest module cache header body stream compress answer "
         "client latency region instance memory table function handler route version deploy "
         "replica registry secret variable config metric trace phase queue worker core "
         "the a of to and in is it for on with as at by from this that be are was").split()
def sentence(n):
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."
records, size = [], 0
i = 0
while True:
    r = {"id": 100000 + i, "name": f"user-{rng.randrange(10**6)}", "email": f"u{rng.randrange(10**6)}@example.com",
         "active": rng.random() < 0.7, "score": round(rng.random() * 1000, 3),
         "region": rng.choice(["eu-west", "us-east", "ap-south", "sa-east"]),
         "tags": rng.sample(words, 3), "bio": sentence(rng.randrange(4, 12))}
    text = json.dumps(records + [r], separators=(",", ":"))
    if len(text) > 20000:
        break
    records.append(r)
    i += 1
open(f"{out}/data.json", "w").write(json.dumps(records, separators=(",", ":")))
parts = ["<!doctype html><html><head><meta charset=utf-8><title>News</title>"
         "<link rel=stylesheet href=/site.css></head><body><main>"]
n = 0
while sum(map(len, parts)) < 200000:
    n += 1
    paras = "".join(f"<p>{' '.join(sentence(rng.randrange(6, 18)) for _ in range(rng.randrange(2, 6)))}</p>"
                    for _ in range(rng.randrange(2, 5)))
    parts.append(f'<article id="a{n}" class="story"><h2><a href="/story/{n}">{sentence(6)}</a></h2>'
                 f'<div class="meta">{rng.choice(words)} &middot; {rng.randrange(1, 28)} Nov 2026</div>{paras}</article>\n')
parts.append("</main></body></html>\n")
open(f"{out}/page.html", "w").write("".join(parts))
PY
}

compression() {
    need wrk wrk
    need taskset util-linux
    need nginx nginx
    if [ "$(nproc)" -lt 2 ]; then
        echo "bench.sh compression needs 2 cores (server on one, load generator on the other)" >&2
        exit 1
    fi
    build
    local caddy
    caddy=$(find_caddy)
    local site=$WORK/site caddy_port=18188 nginx_port=18189
    mkdir -p "$site"
    compression_bodies "$site"
    # Tern: the static demo guest serving the files from memory, one worker on core 0.
    printf '[server]\nworker_threads = 1\n[[tenant]]\nname = "site"\nmodule = "builtin:static"\nassets = "%s"\n' \
        "$site" >"$WORK/tern.toml"
    # Caddy: its file server with `encode` at its defaults (zstd and gzip; it has no Brotli
    # encoder), one OS thread for Go.
    cat >"$WORK/Caddyfile" <<CADDY
{
    admin off
    auto_https off
    persist_config off
}
http://127.0.0.1:$caddy_port {
    root * $site
    encode zstd gzip
    file_server
}
CADDY
    # nginx: `gzip` at Tern's gzip level (3; nginx's own default is 1), the same types.
    {
        # (Its worker reads the files under the work directory, which only root may enter.)
        echo "user root;"
        nginx_preamble "$WORK"
        cat <<NGINX
    types { text/html html; application/json json; }
    gzip on;
    gzip_comp_level 3;
    gzip_min_length 512;
    gzip_types application/json;  # (text/html always is)
    gzip_vary on;
    server {
        listen 127.0.0.1:$nginx_port;
        root $site;
    }
}
NGINX
    } >"$WORK/nginx.conf"
    local -A r=() bytes=()
    # One server at `port` (process `pid`) for each body and encoding it offers: CPU per
    # response, and the bytes it sends.
    measure() { # key port pid encodings...
        local key=$1 port=$2 pid=$3 body encoding
        shift 3
        for body in data.json page.html; do
            for encoding in identity "$@"; do
                r[$key/$body/$encoding]+="$(pinned_h1 "http://127.0.0.1:$port/$body" "$pid" -H "Accept-Encoding: $encoding")"$'\n'
                bytes[$key/$body/$encoding]=$(curl -fs -o /dev/null -w '%{size_download}' \
                    -H "Accept-Encoding: $encoding" "http://127.0.0.1:$port/$body")
            done
        done
    }
    local n
    for n in $(seq 1 "$ROUNDS"); do
        PIN=0 start_tern "$WORK/tern.toml" TERN_LOG=warn
        measure tern "$TERN_PORT" "$TERN_PID" gzip br zstd
        stop "$TERN_PID"
        GOMAXPROCS=1 taskset -c 0 "$caddy" run --config "$WORK/Caddyfile" --adapter caddyfile \
            >>"$WORK/caddy.log" 2>&1 &
        local caddy_pid=$!
        PIDS+=("$caddy_pid")
        wait_http "http://127.0.0.1:$caddy_port/data.json" || { cat "$WORK/caddy.log" >&2; exit 1; }
        measure caddy "$caddy_port" "$caddy_pid" gzip zstd
        stop "$caddy_pid"
        taskset -c 0 nginx -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log" &
        local master=$!
        PIDS+=("$master")
        wait_http "http://127.0.0.1:$nginx_port/data.json" || { cat "$WORK/nginx-error.log" >&2; exit 1; }
        measure nginx "$nginx_port" "$(pgrep -P "$master" | head -1)" gzip
        stop "$master"
    done
    local k
    for k in "${!r[@]}"; do r[$k]=$(printf '%s' "${r[$k]}" | grep . | least_cpu); done
    local plain_json plain_html
    plain_json=$(stat -c %s "$site/data.json")
    plain_html=$(stat -c %s "$site/page.html")
    row() { # label key body encoding
        local line=${r[$2/$3/$4]} plain
        read -r rps p50 p99 p999 err reqs us <<<"$line"
        read -r _ _ _ _ _ _ base <<<"${r[$2/$3/identity]}"
        plain=$plain_json
        [ "$3" = page.html ] && plain=$plain_html
        awk -v l="$1" -v e="$4" -v us="$us" -v base="$base" -v b="${bytes[$2/$3/$4]}" -v p="$plain" \
            -v rps="$rps" -v p99="$p99" -v err="$err" 'BEGIN {
            extra = (e == "identity") ? "-" : sprintf("%.1f µs", us - base)
            printf "| %s | %s | **%.1f µs** | %s | %d | %.2fx | %s | %s µs | %s |\n",
                l, e, us, extra, b, p / b, rps, p99, err }'
    }
    {
        header "Compression at the edge: CPU per compressed response, Tern against Caddy and nginx" "bash loadtest/bench.sh compression"
        echo "A $plain_json-byte JSON list of records and a $plain_html-byte HTML page (generated with a fixed"
        echo "seed by \`compression_bodies\`), served as files: Tern's \`builtin:static\` guest (the files"
        echo "in memory, a fresh instance per request; compression at its defaults: gzip 3, Brotli 4,"
        echo "zstd 3, windows of 512 KiB), Caddy $CADDY_VERSION's \`file_server\` with \`encode zstd gzip\`"
        echo "(its defaults; \`GOMAXPROCS=1\`), nginx $(nginx -v 2>&1 | awk -F/ '{print $2}') with \`gzip_comp_level 3\`."
        echo "Each server pinned to core 0 (one worker), \`wrk -t1 -c$CONNS -H 'Accept-Encoding: E'\` on"
        echo "core 1; CPU: the serving process's user + system time per response (\`/proc/PID/stat\`),"
        echo "the least disturbed of $ROUNDS alternating rounds. *Compression* is the row's CPU minus"
        echo "the same server's plain answer; *ratio* is plain bytes / bytes sent."
        echo
        echo "| server | encoding | CPU per response | compression | bytes sent | ratio | req/s | p99 | errors |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
        local body
        for body in data.json page.html; do
            row "Tern, $body" tern $body identity
            row "Tern, $body" tern $body zstd
            row "Tern, $body" tern $body br
            row "Tern, $body" tern $body gzip
            row "Caddy, $body" caddy $body identity
            row "Caddy, $body" caddy $body zstd
            row "Caddy, $body" caddy $body gzip
            row "nginx, $body" nginx $body identity
            row "nginx, $body" nginx $body gzip
        done
    } | tee "$RESULTS/compression.md"
}
