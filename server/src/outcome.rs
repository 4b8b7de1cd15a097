//! How a request's guest run ended: the outcome every layer counts and maps to a status.
//!
//! Its own small module so that the front end, the lifecycle, the tenants and the host calls
//! can all name an outcome without depending on one another.

use http::StatusCode;

/// How a guest run ended; also the `outcome` label of `tern_guest_outcomes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The handler returned (or exited with status 0).
    Ok = 0,
    /// The wall-clock deadline passed.
    Timeout,
    /// Wasm stack overflow.
    TrapStackOverflow,
    /// Out-of-bounds (or misaligned atomic) memory access.
    TrapOutOfBounds,
    /// `unreachable` (also Rust panics with `panic = "abort"`).
    TrapUnreachable,
    /// Integer division by zero or overflow, or a bad float conversion.
    TrapArithmetic,
    /// A call through a function pointer naming no function: a null or mistyped table entry,
    /// or an index past the table (any table access past it: wasmtime does not tell them apart).
    TrapBadIndirectCall,
    /// Any other trap.
    TrapOther,
    /// A host call got a pointer outside guest memory.
    BadPointer,
    /// `proc_exit` with a non-zero status.
    Exit,
    /// Memory or table growth was refused by the tenant's limit.
    MemoryLimit,
    /// The response exceeded the tenant's body or header limits.
    ResponseLimit,
    /// The request body exceeded the tenant's limit.
    BodyTooLarge,
    /// The client's request body was malformed or cut off (e.g. bad chunked framing): the
    /// client's fault, whatever the guest made of the read error.
    BadRequest,
    /// No pool slot came free in time.
    Overload,
    /// Over one of the tenant's rate limits: refused before any guest ran.
    RateLimited,
    /// Instantiation failed for another reason.
    Error,
    /// The guest's answer was not a valid response: a CGI program's malformed header block,
    /// a component that set no response or an error.
    BadOutput,
    /// The tenant serves no requests: its component exports only Spin's `handle-cron-event`
    /// (it runs on its schedules). `404`.
    NotServed,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 19] = [
        Outcome::Ok,
        Outcome::Timeout,
        Outcome::TrapStackOverflow,
        Outcome::TrapOutOfBounds,
        Outcome::TrapUnreachable,
        Outcome::TrapArithmetic,
        Outcome::TrapBadIndirectCall,
        Outcome::TrapOther,
        Outcome::BadPointer,
        Outcome::Exit,
        Outcome::MemoryLimit,
        Outcome::ResponseLimit,
        Outcome::BodyTooLarge,
        Outcome::BadRequest,
        Outcome::Overload,
        Outcome::RateLimited,
        Outcome::Error,
        Outcome::BadOutput,
        Outcome::NotServed,
    ];

    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Timeout => "timeout",
            Outcome::TrapStackOverflow => "trap_stack_overflow",
            Outcome::TrapOutOfBounds => "trap_out_of_bounds",
            Outcome::TrapUnreachable => "trap_unreachable",
            Outcome::TrapArithmetic => "trap_arithmetic",
            Outcome::TrapBadIndirectCall => "trap_bad_indirect_call",
            Outcome::TrapOther => "trap_other",
            Outcome::BadPointer => "bad_pointer",
            Outcome::Exit => "exit",
            Outcome::MemoryLimit => "memory_limit",
            Outcome::ResponseLimit => "response_limit",
            Outcome::BodyTooLarge => "body_too_large",
            Outcome::BadRequest => "bad_request",
            Outcome::Overload => "overload",
            Outcome::RateLimited => "rate_limited",
            Outcome::Error => "error",
            Outcome::BadOutput => "bad_output",
            Outcome::NotServed => "not_served",
        }
    }

    /// Whether the guest's own code ended the request this way (a trap, an exit, its deadline,
    /// its limits), so its output in the log may say why.
    pub fn is_guests(self) -> bool {
        !matches!(
            self,
            Outcome::Ok
                | Outcome::Overload
                | Outcome::RateLimited
                | Outcome::BodyTooLarge
                | Outcome::BadRequest
                | Outcome::Error
                | Outcome::NotServed
        )
    }

    /// The status a client gets for this outcome.
    pub fn status(self) -> StatusCode {
        match self {
            Outcome::Ok => StatusCode::OK,
            Outcome::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Outcome::Overload => StatusCode::SERVICE_UNAVAILABLE,
            Outcome::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Outcome::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Outcome::BadRequest => StatusCode::BAD_REQUEST,
            Outcome::BadOutput => StatusCode::BAD_GATEWAY,
            Outcome::NotServed => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A failed guest run: what to count and what to tell the client.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExecError {
    /// The outcome (never [`Outcome::Ok`]).
    pub outcome: Outcome,
    /// A short message for the client; details go to the log.
    pub message: String,
    /// Headers the answer carries (a rate limit's `Retry-After` and `RateLimit` fields).
    pub headers: Option<Box<[(http::HeaderName, http::HeaderValue)]>>,
    /// A trap's Wasm backtrace, one frame a line (innermost first), for the tenant's live
    /// logs; never sent to the client.
    pub backtrace: Option<Box<str>>,
}

impl ExecError {
    /// A failure with a client-facing message.
    pub fn new(outcome: Outcome, message: impl Into<String>) -> Self {
        Self {
            outcome,
            message: message.into(),
            headers: None,
            backtrace: None,
        }
    }
}

/// The `413` for a request body over `max` bytes.
pub fn body_too_large(max: u64) -> ExecError {
    ExecError::new(
        Outcome::BodyTooLarge,
        format!("request body is larger than this tenant accepts ({max} bytes)"),
    )
}

/// What clients of a tenant see when a request fails: the reason or only the status, or the
/// tenant's own page for that status.
#[derive(Debug, Default)]
pub struct ErrorPages {
    minimal: bool,
    /// Show the guest's stderr in error responses (`errors = "dev"`).
    pub dev: bool,
    pages: std::collections::HashMap<u16, (String, http::HeaderValue)>,
}

impl ErrorPages {
    /// From a tenant's `errors` and `error_pages` (keys already checked to be statuses).
    pub fn new(
        detail: crate::config::ErrorDetail,
        pages: &std::collections::BTreeMap<String, String>,
    ) -> Self {
        let pages = pages
            .iter()
            .filter_map(|(status, body)| {
                let kind = if body.trim_start().starts_with('<') {
                    "text/html; charset=utf-8"
                } else {
                    "text/plain; charset=utf-8"
                };
                Some((
                    status.parse().ok()?,
                    (body.clone(), http::HeaderValue::from_static(kind)),
                ))
            })
            .collect();
        Self {
            minimal: detail == crate::config::ErrorDetail::Minimal,
            dev: detail == crate::config::ErrorDetail::Dev,
            pages,
        }
    }

    /// The body and content type of the error response for `e` to request `request_id`; `None`
    /// for the plain-text message.
    pub fn body(&self, e: &ExecError, request_id: &str) -> (String, Option<http::HeaderValue>) {
        let status = e.outcome.status();
        if let Some((page, kind)) = self.pages.get(&status.as_u16()) {
            return (page.replace("{request_id}", request_id), Some(kind.clone()));
        }
        if self.minimal {
            let reason = status.canonical_reason().unwrap_or("error");
            return (
                format!("{} {reason}\nrequest id: {request_id}\n", status.as_u16()),
                None,
            );
        }
        if e.outcome.is_guests() {
            // The guest's own words (a panic message, stderr) are in the server log.
            return (
                format!(
                    "{}\nrequest id: {request_id} (the guest's output is in the server log)\n",
                    e.message
                ),
                None,
            );
        }
        (format!("{}\n", e.message), None)
    }
}

/// The `500` for a guest past its response size or header limit.
pub fn response_limit() -> ExecError {
    ExecError::new(
        Outcome::ResponseLimit,
        "guest exceeded its response size or header limit",
    )
}
