//! Tern: an edge request server that runs one fresh, pooled WebAssembly guest per request.
//!
//! # Layout
//! The modules follow a request from the socket to teardown:
//!
//! - [`listener`]: accept loop, hyper (HTTP/1.1 + h2c), graceful drain.
//! - [`http`]: request ids, routing, admission, the response and its `Server-Timing`.
//! - [`router`]: `Host` / path prefix → tenant.
//! - [`pool`]: admission to the preallocated instance pool (the `queue` phase).
//! - [`execute`]: a fresh `Store`, `instantiate_async`, the handler on its own fiber.
//! - [`hostcalls`]: the `tern` host functions of guest ABI v1 (request in, response out).
//! - [`teardown`]: the store is dropped and its slot reset and returned.
//! - [`tenant`]: loaded tenants: pre-linked modules, limits, env, metric handles.
//! - [`artifact`]: ahead-of-time compilation, sealed artifacts, the artifact cache (the one
//!   module with `unsafe`).
//! - [`engine`]: the wasmtime `Config` shared by `tern serve` and `tern compile`, epoch ticker.
//! - [`metrics`], [`admin`]: Prometheus metrics and the admin listener.
//! - [`config`]: the TOML schema, defaults and validation.
//! - [`server`], [`shutdown`]: start-up and signal handling.
//! - [`body`], [`demo`]: the response body type; the embedded demo guests.

pub mod admin;
pub mod artifact;
pub mod body;
pub mod config;
pub mod demo;
pub mod engine;
pub mod execute;
pub mod hostcalls;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod pool;
pub mod router;
pub mod server;
pub mod shutdown;
pub mod teardown;
pub mod tenant;
