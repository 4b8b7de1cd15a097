//! Teardown: the guest's store is dropped, which resets its slot and returns it to the pool.
//!
//! The pooling allocator restores the memory to the module's initial image (a `memset` of the
//! dirtied pages up to `linear_memory_keep_resident`, `madvise` beyond), resets the table and
//! zeroes the fiber stack, so the next guest in this slot sees only its own module's initial
//! state. What the guest printed is logged here, with its tenant and request id.

use std::time::{Duration, Instant};

use crate::hostcalls::{GuestState, Stdio};
use wasmtime::Store;

/// Drops `store` and returns how long it took.
pub fn teardown(store: Store<GuestState>) -> Duration {
    let start = Instant::now();
    drop(store);
    start.elapsed()
}

/// Logs what a guest wrote to stdout and stderr (each capped at the tenant's `stdio_bytes`):
/// one line per stream with the output escaped (a newline stays `\n`), so a guest cannot forge
/// log lines.
pub fn log_stdio(tenant: &crate::tenant::Tenant, request_id: &str, stdio: &Stdio) {
    let (limit, name) = (tenant.limits.stdio_bytes, tenant.name.as_str());
    for (stream, pipe) in [("stdout", &stdio.stdout), ("stderr", &stdio.stderr)] {
        let bytes = pipe.contents();
        if !bytes.is_empty() && tenant.log_budget.allow() {
            let output = String::from_utf8_lossy(&bytes);
            let truncated = bytes.len() >= limit;
            tracing::info!(
                target: "tern::guest",
                tenant = name,
                request_id,
                stream,
                truncated,
                output = ?output,
                "guest output"
            );
        }
    }
}
