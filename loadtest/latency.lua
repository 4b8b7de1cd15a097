-- wrk reporter: one machine-readable line with requests/s and latency percentiles in µs.
done = function(summary, latency, requests)
  local secs = summary.duration / 1e6
  io.write(string.format("RESULT rps=%.0f p50=%d p99=%d p999=%d errors=%d\n",
    summary.requests / secs, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9),
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.status + summary.errors.timeout))
end
