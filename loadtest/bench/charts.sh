# `bash loadtest/bench.sh charts`: PNG charts from the results (gnuplot).
# Sourced by loadtest/bench.sh after loadtest/lib.sh.

charts() {
    need gnuplot gnuplot-nox
    bash loadtest/charts.sh
}
