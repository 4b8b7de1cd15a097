//! Outbound HTTP: which backends and hosts a tenant's guests may call, and the client that
//! calls them.
//!
//! **Deny by default.** A tenant's guests may send requests only to its named backends
//! (`[tenant.outbound.backends.NAME]`, any address the operator wrote down, private ones
//! included) and, by URL, to hosts matching its `allowed_hosts`. A URL request's host is
//! resolved here and every address must be public (not loopback, private, link-local, shared,
//! multicast, documentation or otherwise special), and the connection's own lookup checks again,
//! so a DNS answer that changes between check and connect cannot redirect it inside (SSRF).
//!
//! **Loops.** Every outbound request carries `CDN-Loop: tern` (RFC 8586) appended to what the
//! incoming request carried; a request that already passed through Tern [`MAX_HOPS`] times
//! cannot go out again, so a tenant calling itself stops.
//!
//! **Connections** are pooled per worker thread and reused (HTTP/1.1 keep-alive, HTTP/2 when
//! a TLS backend offers it). TLS is rustls, verifying against the platform's roots or a
//! backend's `ca_file`. Redirects are never followed: the guest sees the `3xx`.
//!
//! **Readthrough.** A backend with `cache = true` has its answers kept in the tenant's cache
//! by their own headers ([`readthrough`]); a guest's request may say otherwise (`Tern-Cache`).

mod body;
mod cached;
mod calls;
mod client;
mod policy;
mod readthrough;
mod send;
mod session;
mod tls;

pub use body::{ComponentCalls, OutBody};
pub use cached::{CACHE_OVERRIDE, CacheOverride, Readthrough};
pub use calls::{CDN_LOOP, Grant, NoHead, Passing, Refused, TRACEPARENT, TRACESTATE};
pub use client::{BoxError, Counted, HttpClient, Resolver, client};
pub use policy::*;
pub use send::{HeadError, send};
pub use session::Session;
pub use tls::Tls;
