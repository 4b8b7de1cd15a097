//! `[kv.NAME]`: a store's settings, their defaults and checks.

use serde::{Deserialize, Serialize};

/// The store every tenant may be granted without configuring one.
pub const DEFAULT_STORE: &str = "default";

/// `[kv.NAME]`: one store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite` (the default): a file in the data directory, or at `path`.
    #[serde(default)]
    pub backend: Backend,
    /// The SQLite file (absolute, or relative to the data directory). Default:
    /// `kv/NAME.sqlite` in the data directory. `sqlite` only.
    #[serde(default)]
    pub path: Option<String>,
    /// The Redis (or Valkey) server: `redis://[:PASSWORD@]HOST[:PORT][/DB]`. `redis` only,
    /// and required there.
    #[serde(default)]
    pub url: Option<String>,
    /// What the store's keys start with on the Redis server (several stores, or several
    /// fleets, may share one server). Default: `tern:NAME:`. `redis` only.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Longest wait for the Redis server to answer one operation (or to connect), in ms;
    /// past it the guest gets an error. `redis` only.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Longest key, in bytes.
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
    /// Largest value, in bytes.
    #[serde(default = "default_max_value_bytes")]
    pub max_value_bytes: usize,
    /// Most keys one tenant may hold in this store.
    #[serde(default = "default_max_keys")]
    pub max_keys_per_tenant: u64,
    /// Most bytes (keys and values) one tenant may hold in this store.
    #[serde(default = "default_max_bytes")]
    pub max_bytes_per_tenant: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: Backend::default(),
            path: None,
            url: None,
            prefix: None,
            timeout_ms: default_timeout_ms(),
            max_key_bytes: default_max_key_bytes(),
            max_value_bytes: default_max_value_bytes(),
            max_keys_per_tenant: default_max_keys(),
            max_bytes_per_tenant: default_max_bytes(),
        }
    }
}

fn default_timeout_ms() -> u64 {
    1000
}

fn default_max_key_bytes() -> usize {
    1024
}

fn default_max_value_bytes() -> usize {
    1 << 20
}

fn default_max_keys() -> u64 {
    100_000
}

fn default_max_bytes() -> u64 {
    256 << 20
}

/// Where a store keeps its data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Embedded SQLite (WAL), nothing to set up; each server has its own.
    #[default]
    Sqlite,
    /// A Redis or Valkey server: one store shared by every server pointed at it (a fleet).
    Redis,
}

/// Largest key the ABI lets a store be configured with (a listing buffer of this plus two bytes
/// always holds one key).
pub const KEY_BYTES_CEILING: usize = 65_535;

/// Whether `name` may name a store: 1-64 of `a-z 0-9 - _`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}
