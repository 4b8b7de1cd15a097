//! End-to-end tests: real servers on 127.0.0.1:0, real HTTP, real guests.
//!
//! One test binary; a module per feature; [`support`] holds the `TestServer` builder and the
//! HTTP client.

mod abi;
mod access;
mod acme;
mod admin_input;
mod artifacts;
mod cache;
mod clients;
mod compression;
mod config;
mod conformance;
mod demo;
mod errors;
mod faults;
mod fleet;
mod guest_cache;
mod guest_ratelimit;
mod host_limits;
mod hostile;
mod http3;
mod isolation;
mod kinds;
mod kv;
mod logs;
mod metrics;
mod observability;
mod outbound;
mod poisoning;
mod ratelimit;
mod readthrough;
mod rollout;
mod routing;
mod schedules;
mod shutdown;
mod slow_clients;
mod streaming;
mod support;
mod swap;
mod tenants;
mod tls;
mod tokens;
mod toolchains;
mod traces;
mod variables;
mod websocket;
mod websocket_autobahn;
mod websocket_browser;
mod websocket_events;
