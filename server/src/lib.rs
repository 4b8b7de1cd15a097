//! Tern: an edge request server that runs one fresh, pooled WebAssembly guest per request.
//!
//! # Layout
//! The modules follow a request from the socket to teardown:
//!
//! - [`listener`]: accept loop, hyper (HTTP/1.1 + h2c), graceful drain; what it knows of a
//!   connection (peer, TLS facts) goes to every request as a
//!   [`context::Connection`].
//! - [`context`]: the request's context, computed once (connection, id, route prefix, HTTP
//!   version) and the values every guest kind renders from it (scheme, host, URL, server name
//!   and port).
//! - [`http`]: request ids, routing, admission, the response and its `Server-Timing`.
//! - [`router`]: `Host` / path prefix → tenant.
//! - [`pool`]: admission to the preallocated instance pool (the `queue` phase).
//! - [`execute`]: a fresh `Store`, `instantiate_async`, the handler on its own fiber: the one
//!   lifecycle of every guest kind (`tern`, `wasi-http`, `cgi`).
//! - [`outcome`]: how a run ended (`Outcome`, `ExecError`) and the status each one gets.
//! - [`hostcalls`]: the `tern` host functions of guest ABI v1 (request in, response out,
//!   outbound requests), and CGI's stdin/stdout for the `cgi` kind.
//! - [`wasi_http`]: the `wasi-http` kind: `wasi:http/proxy` components, their request in and
//!   answer out, their outgoing requests under the tenant's policy; [`adapter`]: core modules
//!   exporting the handler (spin-sdk for wasm32-wasip1) made components before compiling.
//! - [`outbound`]: one room for every guest kind's outgoing requests: `policy` (what a
//!   tenant's guests may call: backends, allowed hosts, SSRF checks, the `[tenant.outbound]`
//!   schema), `calls` (the one path a request takes: admission, loop check, `CDN-Loop` and
//!   trace, budget, timeouts, metrics), `send` (the body and the wait for the head), `client`
//!   (the pooled client per worker). `hostcalls::outbound` and `wasi_http` only map its
//!   errors to their ABI's.
//! - [`teardown`]: the store is dropped and its slot reset and returned; zero state under swap.
//! - [`pagemap`]: what wasmtime's dirty-page reset misses (swapped and scattered pages), mended
//!   before each teardown (with [`artifact`], the only modules with `unsafe`).
//! - [`tenant`]: loaded tenants: the guest kind, pre-linked modules or components, limits,
//!   env, metric handles.
//! - [`registry`]: the live tenant table (swapped atomically) and deploy, rollback, delete,
//!   reload; beside it `loader` (stored versions into pre-linked tenants), `error` (why a
//!   change was refused, its status), `describe` (the admin API's JSON), `upload` (checks on
//!   an upload's first bytes), `reset` (every tenant moved to a swap-safe engine when swap
//!   is switched on).
//! - [`store`]: the data directory: content-addressed modules and assets, the manifest.
//! - [`assets`]: per-tenant read-only files held in memory (the guest's `/assets`).
//! - [`artifact`]: ahead-of-time compilation, sealed artifacts, the artifact cache (`unsafe`:
//!   loading compiled code).
//! - [`engine`]: the wasmtime `Config` shared by `tern serve` and `tern compile`, epoch ticker.
//! - [`metrics`], [`admin`]: Prometheus metrics; the admin listener and API.
//! - [`cli`]: the admin API's client (`tern deploy`, `tern tenants`, ...); [`dev`]: `tern dev`;
//!   [`scaffold`]: `tern new`.
//! - [`config`]: the TOML schema, defaults and validation.
//! - [`server`], [`shutdown`]: start-up and signal handling.
//! - [`logwriter`]: log lines batched to stderr by one thread.
//! - [`app`]: what the request path and the admin listener share.
//! - [`body`], [`demo`]: the response body type and short plain responses; the embedded demo
//!   guests.

pub mod adapter;
pub mod admin;
pub mod app;
pub mod artifact;
pub mod assets;
pub mod body;
pub mod cli;
pub mod config;
pub mod context;
pub mod demo;
pub mod dev;
pub mod engine;
pub mod execute;
pub mod hostcalls;
pub mod http;
pub mod listener;
pub mod logwriter;
pub mod metrics;
pub mod outbound;
pub mod outcome;
pub mod pagemap;
pub mod pool;
pub mod registry;
pub mod router;
pub mod scaffold;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod teardown;
pub mod tenant;
pub mod wasi_http;
