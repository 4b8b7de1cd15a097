//! Tern: an edge request server that runs one fresh, pooled WebAssembly guest per request.
//!
//! # Layout
//! The modules follow a request from the socket to teardown:
//!
//! - [`listener`]: every transport hands the front end one request shape,
//!   `Request<RequestBody>`: `listener::tcp` (hyper: HTTP/1.1 + h2c; over TLS, h2 or HTTP/1.1
//!   by ALPN; graceful drain), `listener::quic` (HTTP/3 on the TLS listener's address over UDP:
//!   quinn and h3, the same certificates, limits and front end; advertised with `Alt-Svc`), its
//!   streams as `listener::quic::streams` bounds them for `h3` (frames it would buffer whole held to the
//!   head limit, unknown ones skipped as they come), and what they share
//!   (`listener::options`); what a listener knows of a connection (peer, TLS facts) goes to
//!   every request as a
//!   [`context::Connection`]. [`tls`]: TLS termination: the certificates by host name (SNI),
//!   swapped whole; the handshake under a deadline and a cap, failures counted by reason;
//!   uploaded and ACME certificates kept in the data directory or a fleet's registry.
//! - [`context`]: the request's context, computed once (connection, id, route prefix, HTTP
//!   version) and the values every guest kind renders from it (scheme, host, URL, server name
//!   and port).
//! - [`http`]: the front end as named steps over one request context (`http::exchange`:
//!   connection, client, routed tenant, ids, timings, trace, access line): route, check,
//!   the cache's look-up, run (admit, the guest, store), then for every answer respond
//!   (compression, HSTS) and finish (records only); `http::request` (framing, host, request
//!   ids, the HTTPS redirect).
//! - [`tenant::front`]: what the front end does for each tenant, prepared when it loads
//!   (redirect, HSTS, error pages, its cache, compression), from a [`prepare::Preparing`] like
//!   its guests' grants.
//! - [`cache`]: a tenant's cache in front of its guests (`[tenant.cache]`): lookup before
//!   admission, what may be stored (RFC 9111), variants, validators, `Cache-Status`; the same
//!   cache keeps its backends' answers (readthrough) and its guests' own entries
//!   ([`cache::guest`]), each a space of its own.
//! - [`compress`]: a tenant's answers compressed (zstd, Brotli, gzip) for clients that accept
//!   it (`[tenant.compression]`), as they stream.
//! - [`target`]: the normal form of the request's path, which routing, the guests and
//!   everything keyed on a URL use (dot segments, percent-encodings, ambiguous paths refused).
//! - [`router`]: `Host` / path prefix → tenant, on the normal path.
//! - [`pool`]: admission to the preallocated instance pool (the `queue` phase).
//! - [`execute`]: one lifecycle for every guest kind (a fresh `Store`, `instantiate_async`, the
//!   handler on its own fiber under the deadline, the verdict, the reply, the outcome counts,
//!   teardown) with a small driver per kind for what differs; the front end awaits one answer
//!   from it (whole, or a head whose body streams while the guest runs on).
//! - [`capabilities`]: the host capabilities of one request (outbound, key-value, variables,
//!   the guest's cache entries), one shape each in its own module (a `Grant` prepared with the
//!   tenant from [`prepare::Preparing`] and the server's [`capabilities::Resources`], a
//!   `Session` per request), prepared once whatever the guest's kind. Host functions see a
//!   view of the store (each interface's view trait, `tern::kv::KvView`, or `HasData` struct,
//!   `wasi_http::kv::KvHost`), never the whole state.
//! - [`guest`]: one module per guest kind with its linker and host side: [`guest::module`]
//!   (core modules: their store state and linker, composed from WASI preview1, `/assets`,
//!   the bounds-checked guest memory, and the host side of the `tern` ABI v1
//!   ([`guest::module::tern`]) and of CGI ([`guest::module::cgi`], WASI programs as CGI
//!   scripts)), [`guest::wasi_http`] (`wasi:http` components; [`adapter`] makes core modules
//!   exporting the handler into components before they are compiled). Beside them what every
//!   kind shares: the request a guest reads and the response it writes, with typed errors each
//!   kind maps to its own, the limits, the captured output; [`guest::link`] composes the
//!   kinds' linkers with the host APIs of the capabilities. A new kind is a module here, a
//!   variant of [`guest::Guest`], and its driver in `execute`.
//! - [`outcome`]: how a run ended (`Outcome`, `ExecError`) and the status each one gets.
//! - [`trigger`]: what made a guest run (a client's request or a schedule), as metrics, logs
//!   and traces tell them apart.
//! - [`outbound`]: every guest kind's outgoing requests: `policy` (what a
//!   tenant's guests may call: backends, allowed hosts, SSRF checks, the `[tenant.outbound]`
//!   schema), `calls` (the one path a request takes: admission, loop check, `CDN-Loop` and
//!   trace, budget, timeouts, metrics), `send` (the body and the wait for the head), `client`
//!   (the pooled client per worker). `guest::module::tern::outbound` and `guest::wasi_http` only map
//!   its errors to their ABI's.
//! - [`kv`]: guests' key-value stores: named, granted per tenant, each tenant's keys its own;
//!   [`kv::sqlite`] (embedded, one file per store, worked by a thread of its own behind a
//!   bounded queue, batches committed together) and [`kv::redis`] (a Redis server a fleet
//!   shares; writes as Lua scripts that check quotas on the server). `guest::module::tern::kv`
//!   and `guest::wasi_http::kv` (Spin's key-value, `wasi:keyvalue`) map its errors to theirs.
//! - [`variables`]: tenants' variables and secrets (plain, or sealed at rest under the
//!   secrets key, [`variables::seal`]), the table guests read them from, following the
//!   registry; `guest::wasi_http::variables` (Spin's variables, `wasi:config/store`) and CGI's
//!   environment give them to guests.
//! - [`teardown`]: the store is dropped and its slot reset and returned; zero state under swap;
//!   `teardown::pagemap`: what wasmtime's dirty-page reset misses (swapped and scattered
//!   pages), mended before each teardown (with [`artifact`], [`os`] and `allocator`, the only
//!   modules with `unsafe`, besides one `sched_setscheduler` call in [`kv::sqlite`]);
//!   [`teardown::probe`]: a component's main memory made reachable for that sweep.
//! - [`tenant`]: loaded tenants: the pre-linked guest (its kind), limits, env, metric handles.
//! - [`registry`]: the live tenant table (swapped atomically) and the one path every change is
//!   committed by; beside it `changes` (deploy, rollback, delete, settings, assets), `reload`
//!   (tenants loaded at start-up and on reload), `loader` (stored versions into pre-linked
//!   tenants), `shared` (a fleet's registry), `precondition` (If-Match), `error` (why a change
//!   was refused, its status), `describe` (the admin API's JSON), `upload` (checks on an
//!   upload's first bytes), `reset` (every tenant moved to a swap-safe engine when swap is
//!   switched on).
//! - [`rollout`]: gradual deployments: a tenant's candidate version beside its current one,
//!   the split of its clients (sticky buckets, the `Tern-Version` override), stages and the
//!   abort rule; the registry keeps the candidate, the front end picks the version per request.
//! - [`schedule`]: scheduled runs (`[[tenant.schedule]]`): cron expressions, settings, the
//!   ledger that gives each tick to one replica; [`scheduler`] runs them through the front end.
//! - [`datadir`]: the data directory (`--data-dir`): content-addressed modules and assets, the manifest.
//! - [`fleet`]: a fleet's shared registry on object storage ([`fleet::objects`]: the S3 client,
//!   compare-and-swap writes, the store probe), signed artifacts and sealed secrets, nudges to
//!   the other replicas; used by [`registry`] for tenants and [`tls`] for certificates.
//! - [`assets`]: per-tenant read-only files held in memory (the guest's `/assets`).
//! - [`artifact`]: ahead-of-time compilation, sealed artifacts, the artifact cache (`unsafe`:
//!   loading compiled code).
//! - [`engine`]: the wasmtime `Config` shared by `tern serve` and `tern compile`, epoch ticker.
//!   [`os`]: what the host lets the process hold (open files, memory mappings) against
//!   what modules and pool slots take; the limit named when one is hit (`unsafe`: two
//!   `rlimit` calls).
//! - `allocator` (with the default `mimalloc` feature): the host allocator, mimalloc called
//!   through the entry points its fast paths are on (`unsafe`: a `GlobalAlloc`).
//! - [`metrics`], [`admin`]: Prometheus metrics; the admin listener and API.
//! - [`cli`]: the admin API's client (`tern deploy`, `tern tenants`, ...); [`dev`]: `tern dev`;
//!   [`scaffold`]: `tern new`.
//! - [`change`]: why an admin change (a tenant, a certificate) was refused, and its status.
//! - [`config`]: the TOML schema, defaults and validation; [`ceilings`]: the ceiling of every
//!   per-tenant setting and the one check against them (config, admin API, outbound policy).
//! - [`server`], [`shutdown`]: start-up and signal handling.
//! - [`logwriter`]: log lines batched to stderr by one thread.
//! - [`livelog`]: each tenant's requests as live log records (`tern logs`): a bounded ring
//!   per tenant written by the request path's `finish`, read and followed by the admin API's
//!   `.../logs` stream, merged across a fleet's replicas.
//! - [`trace`]: every request's phases as OpenTelemetry spans (ids and sampling on the request
//!   path, spans encoded where a kept request ends, exported by OTLP/HTTP off it).
//! - [`hex`]: lower-case hex for digests, names and the trace context.
//! - [`hashed`]: maps keyed by keyed hashes take the key as its own hash (the cache, the rate
//!   limiters).
//! - [`decimal`]: unsigned integers in decimal, written on the stack (the request path's
//!   `Server-Timing`, `Age`, metric lines).
//! - [`budget`]: size budgets of the request path's futures, checked at compile time.
//! - [`app`]: what the request path and the admin listener share.
//! - [`body`], [`demo`]: the body types (every response's; a client's request body as a guest
//!   or the server reads it) and short plain responses; the embedded demo guests.

/// `Debug` for a type whose other fields cannot or should not be printed (callbacks, handles,
/// large buffers): its name and the fields named, marked as not all of them.
macro_rules! debug_fields {
    ($ty:ident: $($field:ident),+) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &self.$field))+
                    .finish_non_exhaustive()
            }
        }
    };
}

pub mod access;
pub mod adapter;
pub mod admin;
#[cfg(feature = "mimalloc")]
pub mod allocator;
pub mod app;
pub mod artifact;
pub mod assets;
pub mod audit;
pub mod body;
pub mod budget;
pub mod cache;
pub mod capabilities;
pub mod ceilings;
pub mod change;
pub mod cli;
pub mod compress;
pub mod config;
pub mod context;
pub mod counter;
pub mod datadir;
pub mod decimal;
pub mod demo;
pub mod dev;
pub mod engine;
pub mod execute;
pub mod fleet;
pub mod guest;
pub mod hashed;
pub mod hex;
pub mod http;
pub mod kv;
pub mod listener;
pub mod livelog;
pub mod logwriter;
pub mod metrics;
pub mod os;
pub mod outbound;
pub mod outcome;
pub mod pool;
pub mod prepare;
pub mod ratelimit;
pub mod registry;
pub mod rollout;
pub mod router;
pub mod scaffold;
pub mod schedule;
pub mod scheduler;
pub mod server;
pub mod shutdown;
pub mod target;
pub mod teardown;
pub mod tenant;
pub mod tls;
pub mod trace;
pub mod trigger;
pub mod variables;
pub mod websocket;

/// A random number: a per-thread wyrand generator seeded from the standard library's
/// per-process random keys. For ids and jitter, which need to be unique or spread, not secret.
pub fn random_u64() -> u64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id().into());
            h.finish()
        });
    }
    STATE.with(|s| {
        let x = s.get().wrapping_add(0xa076_1d64_78bd_642f);
        s.set(x);
        let t = u128::from(x) * u128::from(x ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    })
}

/// A random number in `0..n` (0 when `n` is 0): jitter, so that replicas or retries do not all
/// act at the same moment.
pub fn random_below(n: u64) -> u64 {
    if n == 0 { 0 } else { random_u64() % n }
}

/// An error and its causes, `: `-separated (a client's own message alone often says only
/// "client error (Connect)"); a cause its error already quotes is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let c = cause.to_string();
        if !text.ends_with(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_numbers_fall_below_their_bound_and_spread() {
        assert_eq!(super::random_below(0), 0);
        assert_eq!(super::random_below(1), 0);
        let draws: Vec<u64> = (0..1000).map(|_| super::random_below(10)).collect();
        assert!(draws.iter().all(|&d| d < 10));
        for v in 0..10 {
            assert!(draws.contains(&v), "{v} never drawn in 1000");
        }
    }
}
