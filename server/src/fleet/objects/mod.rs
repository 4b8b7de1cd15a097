//! Object storage for a registry shared by a fleet (`s3://bucket/prefix`: AWS S3, Cloudflare R2,
//! Ceph RGW, versitygw, MinIO, ...) through the `object_store` crate, and the probe that checks
//! a store keeps the promises the registry rests on before anything is written to it.
//!
//! A fleet's registry is safe only if the store refuses a write whose precondition fails: a
//! create of a name that exists (`If-None-Match: *`) and an update of an object that changed
//! since it was read (`If-Match: <etag>`). Stores that accept such writes silently (some
//! S3-compatible servers ignore the headers) would let two admins deploying at once lose one of
//! the deploys without an error; [`probe()`] finds that out and says so.
//!
//! This file opens a store; [`mod@probe`] checks it; [`remote`] is the registry's objects in it
//! ([`Remote`]: the index, records, blobs and artifacts, compare-and-swap writes with change
//! ids read back after a lost reply).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;

pub mod probe;
pub mod remote;

pub use probe::{Check, probe};
pub use remote::{CHANGES_KEPT, Remote, RemoteError, Written, change_id, record_change};

/// Opens the store a registry URL names: `s3://bucket[/prefix]` with the usual AWS settings from
/// the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
/// `AWS_ENDPOINT_URL` for a non-AWS store, `AWS_ALLOW_HTTP=true` for a plain-HTTP one), or
/// `memory://` (in this process only; for trials). Returns the store and the prefix under
/// which the registry's objects live.
///
/// # Errors
/// An unparsable URL, an unknown scheme, or settings the S3 client refuses.
pub fn open(url: &str) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    open_with(url, &[])
}

/// [`open`] with S3 settings given as object_store's keys (`aws_endpoint`, `aws_access_key_id`,
/// ...) over those of the environment.
///
/// # Errors
/// See [`open`]; also an unknown key.
pub fn open_with(
    url: &str,
    options: &[(&str, &str)],
) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let prefix = Path::parse(parsed.path().trim_start_matches('/'))
        .map_err(|e| format!("{url}: not a valid object prefix: {e}"))?;
    let store: Arc<dyn ObjectStore> = match parsed.scheme() {
        "s3" | "s3a" => {
            // A store that cannot be reached is reported in seconds (a deploy answers 503, a
            // replica keeps serving what it has), not after minutes of retries.
            let retry = object_store::RetryConfig {
                max_retries: 2,
                retry_timeout: std::time::Duration::from_secs(5),
                ..object_store::RetryConfig::default()
            };
            let connect = object_store::ClientConfigKey::ConnectTimeout;
            let mut builder = object_store::aws::AmazonS3Builder::from_env()
                .with_url(url)
                .with_retry(retry)
                .with_config(object_store::aws::AmazonS3ConfigKey::Client(connect), "2s");
            for (key, value) in options {
                let key = key.parse().map_err(|e| format!("{key}: {e}"))?;
                builder = builder.with_config(key, *value);
            }
            Arc::new(builder.build().map_err(|e| format!("{url}: {e}"))?)
        }
        "memory" => Arc::new(object_store::memory::InMemory::new()),
        other => {
            // Other object_store schemes (file://, ...) are opened only to be probed: the
            // registry on one machine is the data directory, not one of them.
            let (store, _) = object_store::parse_url(&parsed)
                .map_err(|e| format!("{url}: the scheme {other:?} is not supported: {e}"))?;
            Arc::from(store)
        }
    };
    Ok((store, prefix))
}
