//! The ceiling of every per-tenant setting, in one place, and the one check against them.
//!
//! Every limit has a ceiling: a limit of "practically unbounded" is no limit. The config file,
//! the admin API and the outbound policy all validate through [`check`], so a setting means the
//! same wherever it is given.

/// Ceiling of every timeout a tenant sets (`limits.timeout_ms`, `outbound.*_timeout_ms`):
/// 15 minutes.
pub const MAX_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// Ceiling of every body size a tenant sets (`limits.max_request_bytes`,
/// `limits.max_response_bytes`, `outbound.max_request_bytes`, `outbound.max_response_bytes`):
/// 4 GiB.
pub const MAX_BODY_BYTES: u64 = 4 << 30;
/// Ceiling of `limits.stdio_bytes` (captured in memory per request and stream): 16 MiB.
pub const MAX_STDIO_BYTES: u64 = 16 << 20;
/// Ceiling of `limits.log_lines_per_sec`.
pub const MAX_LOG_LINES_PER_SEC: u64 = 100_000;
/// Ceiling of `limits.max_response_headers`.
pub const MAX_RESPONSE_HEADERS: u64 = 10_000;
/// Ceiling of `outbound.max_requests` (per guest run).
pub const MAX_OUTBOUND_REQUESTS: u64 = 1_000;
/// Ceiling of `outbound.max_concurrent` (per backend, per tenant).
pub const MAX_OUTBOUND_CONCURRENT: u64 = 10_000;
/// Ceiling of `limits.max_kv_ops` (per guest run).
pub const MAX_KV_OPS: u64 = 100_000;
/// Ceiling of `server.http3_max_streams` (request streams per HTTP/3 connection).
pub const MAX_HTTP3_STREAMS: u64 = 10_000;
/// Ceiling of `server.http3_socket_buffer_kib`: 1 GiB.
pub const MAX_SOCKET_BUFFER_KIB: u64 = 1 << 20;
/// Ceiling of `server.http3_alt_svc_max_age_secs`: a year.
pub const MAX_ALT_SVC_MAX_AGE_SECS: u64 = 365 * 24 * 3600;
/// Most custom error pages per tenant.
pub const MAX_ERROR_PAGES: usize = 64;
/// Largest custom error page, in bytes.
pub const MAX_ERROR_PAGE_BYTES: usize = 64 * 1024;

/// A setting (its key as the user writes it), its value and the range it must lie in.
pub type Bounded<'a> = (&'a str, u64, u64, u64);

/// Checks each setting against its range.
///
/// # Errors
/// The first setting out of range: `KEY must be between MIN and MAX, not VALUE`.
pub fn check(settings: &[Bounded<'_>]) -> Result<(), String> {
    match settings
        .iter()
        .find(|(_, value, min, max)| value < min || value > max)
    {
        Some((key, value, min, max)) => Err(format!(
            "{key} must be between {min} and {max}, not {value}"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn settings_are_checked_at_both_ends_of_their_range() {
        for (value, ok) in [(0, false), (1, true), (10, true), (11, false)] {
            assert_eq!(check(&[("a", 5, 0, 10), ("k", value, 1, 10)]).is_ok(), ok);
        }
        assert_eq!(
            check(&[("limits.timeout_ms", 0, 1, 9)]).unwrap_err(),
            "limits.timeout_ms must be between 1 and 9, not 0"
        );
    }
}
