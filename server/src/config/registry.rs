//! `[registry]`: where API-deployed tenants live (this data directory, or a fleet's object store).

use serde::Deserialize;

use super::invalid::Invalid;

/// `[registry]`: where the tenants deployed through the admin API are kept. Without `url`, in
/// the data directory (one server). With `url`, in an object store every replica of a fleet
/// shares: a deploy on any replica is served by all of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// The shared registry: `s3://bucket/prefix` (AWS S3, Cloudflare R2, Ceph RGW, versitygw,
    /// MinIO, ... with the usual `AWS_*` settings from the environment: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`). Empty: the
    /// data directory alone. `TERN_REGISTRY_URL` and `tern serve --registry` override it.
    pub url: String,
    /// How often each replica checks the registry for changes (one conditional read, which
    /// costs no body when nothing changed).
    pub poll_interval_ms: u64,
    /// This replica's name in the registry's fleet view; empty: `TERN_REPLICA`, else the host
    /// name (a Kubernetes pod's name).
    pub replica: String,
    /// The URL of this replica's admin listener as the other replicas reach it
    /// (`http://10.0.0.5:9090`): a replica that writes a change tells the others at once, so
    /// they read it before their next poll. Empty: `TERN_ADVERTISE_URL`, else the admin address
    /// if it is not a wildcard (0.0.0.0), else the others notice at their next poll.
    pub advertise: String,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            poll_interval_ms: 1000,
            replica: String::new(),
            advertise: String::new(),
        }
    }
}

impl RegistryConfig {
    /// The shared registry's URL, if there is one.
    pub fn shared_url(&self) -> Option<&str> {
        (!self.url.is_empty()).then_some(self.url.as_str())
    }

    /// The admin URL the other replicas reach this one at, if it has one (`admin`: where the
    /// admin listener is bound).
    pub fn advertise_url(&self, admin: std::net::SocketAddr) -> Option<String> {
        [
            Some(self.advertise.clone()),
            std::env::var("TERN_ADVERTISE_URL").ok(),
        ]
        .into_iter()
        .flatten()
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .find(|u| !u.is_empty())
        .or_else(|| (!admin.ip().is_unspecified()).then(|| format!("http://{admin}")))
    }

    /// This replica's name.
    pub fn replica_name(&self) -> String {
        let name = [
            Some(self.replica.clone()),
            std::env::var("TERN_REPLICA").ok(),
            std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
        ]
        .into_iter()
        .flatten()
        .map(|n| n.trim().to_string())
        .find(|n| !n.is_empty())
        .unwrap_or_else(|| "replica".into());
        // A name safe as an object name.
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    }
}

impl RegistryConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// What is wrong.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let r = self;
        let bad = |message: String| {
            Err(Invalid {
                span: None,
                message,
            })
        };
        if r.poll_interval_ms == 0 {
            return bad("registry.poll_interval_ms must be > 0".into());
        }
        if !(r.advertise.is_empty() || r.advertise.starts_with("http://")) {
            return bad(format!(
                "registry.advertise: {:?} is not an http:// URL of this replica's admin listener",
                r.advertise
            ));
        }
        if !(r.url.is_empty() || r.url.starts_with("s3://")) {
            return bad(format!(
                "registry.url: {:?} is not an s3://bucket/prefix URL (leave it empty for the \
                 data directory alone)",
                r.url
            ));
        }
        Ok(())
    }
}
