#!/usr/bin/env bash
# Renders loadtest/results/*.tsv as PNG charts with gnuplot (Debian: gnuplot-nox).
# Called by `bash loadtest/bench.sh charts`; each chart is drawn only if its data exists.
set -euo pipefail
cd "$(dirname "$0")/results"
command -v gnuplot >/dev/null || { echo "gnuplot is required (apt-get install gnuplot-nox)" >&2; exit 1; }

common='set terminal pngcairo size 900,520 font "sans,11"; set grid ytics; set key top left; set datafile separator "\t"'

if [ -f lifecycle.tsv ]; then
    gnuplot <<EOF
$common
set output "lifecycle.png"
set title "Instance lifecycle per request: Tern against Lucet's published figures (µs, log scale)"
set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1
set logscale y; set yrange [0.1:100]; set ylabel "µs"; set xtics rotate by -15
plot "lifecycle.tsv" using 2:xtic(1) title "Lucet" lc rgb "#999999", \
     "" using 3 title "Tern (p50)" lc rgb "#2a7ab0"
EOF
fi

if [ -f heap.tsv ]; then
    gnuplot <<EOF
$common
set output "heap.png"
set title "Instantiation time against initial heap size (copy-on-write images)"
set logscale x 2; set xlabel "initial heap (KiB)"; set ylabel "µs"; set yrange [0:*]
plot "heap.tsv" using 1:2 with linespoints lw 2 title "dense", \
     "" using 1:3 with linespoints lw 2 title "sparse (1 page in 8)"
EOF
fi

if [ -f teardown.tsv ]; then
    gnuplot <<EOF
$common
set output "teardown.png"
set title "Teardown time against memory the guest touched"
set logscale xy; set xlabel "touched (KiB)"; set ylabel "µs"
plot "teardown.tsv" using 1:2 with linespoints lw 2 title "Tern", \
     "" using 1:3 with linespoints lw 2 dt 2 title "Lucet (37.5 µs per MiB)"
EOF
fi

if [ -f throughput.tsv ]; then
    gnuplot <<EOF
$common
set output "throughput.png"
set title "hello, HTTP/1.1 keep-alive, 64 connections: requests/s"
set style data histograms; set style fill solid 0.8 border -1; set yrange [0:*]; set key off
plot "throughput.tsv" using 2:xtic(1) lc rgb "#2a7ab0"
EOF
fi

if [ -f scaling.tsv ]; then
    gnuplot <<EOF
$common
set output "scaling.png"
set title "Requests/s per worker thread count"
set xlabel "worker threads"; set ylabel "requests/s"; set xtics 1; set yrange [0:*]
plot "scaling.tsv" using 1:2 with linespoints lw 2 title "Tern hello", \
     "" using 1:3 with linespoints lw 2 title "native hyper hello"
EOF
fi
ls -1 ./*.png
