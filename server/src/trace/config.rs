//! `[tracing]` and the standard `OTEL_*` environment variables, resolved once at start.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;

/// `[tracing]`: export every request's phases as OpenTelemetry spans over OTLP/HTTP. Off
/// unless an endpoint is set here or in `OTEL_EXPORTER_OTLP_ENDPOINT` /
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`. A key set here wins over its environment variable.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL (`http://otel-collector:4318`); spans are posted
    /// to its `/v1/traces`. Empty: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the whole URL), else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL), else tracing is off.
    pub endpoint: String,
    /// Head sampling, as `OTEL_TRACES_SAMPLER` names it: `parentbased_always_on` (the
    /// default), `parentbased_traceidratio`, `parentbased_always_off`, `always_on`,
    /// `always_off`, `traceidratio`. Empty: `OTEL_TRACES_SAMPLER`.
    pub sampler: String,
    /// The ratio of the `traceidratio` samplers, 0 to 1. Unset: `OTEL_TRACES_SAMPLER_ARG`,
    /// else 1.
    pub sampler_arg: Option<f64>,
    /// Keep every request that failed (a 5xx, or a guest that trapped, passed its deadline or
    /// a limit), whatever the head sampling decided.
    pub keep_errors: bool,
    /// Keep every request that took at least this long (0: off), whatever the head sampling
    /// decided.
    pub keep_slower_than_ms: u64,
    /// `service.name` of the spans. Empty: `OTEL_SERVICE_NAME`, else `tern`.
    pub service_name: String,
    /// Headers sent with every export (a vendor's API key). Added to
    /// `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,key2=value2`).
    pub headers: BTreeMap<String, String>,
    /// Most finished requests waiting for export; past it, requests' spans are dropped and
    /// counted (`tern_trace_spans_dropped_total{reason="queue_full"}`). Unset:
    /// `OTEL_BSP_MAX_QUEUE_SIZE`, else 2048.
    pub max_queue: Option<usize>,
    /// Most requests per export. Unset: `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, else 512.
    pub max_batch: Option<usize>,
    /// How often queued spans are exported, in milliseconds (earlier when the queue is half
    /// full). Unset: `OTEL_BSP_SCHEDULE_DELAY`, else 1000.
    pub batch_delay_ms: Option<u64>,
    /// How long one export may take, in milliseconds. Unset:
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, `OTEL_EXPORTER_OTLP_TIMEOUT`, else 10000.
    pub timeout_ms: Option<u64>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            sampler: String::new(),
            sampler_arg: None,
            keep_errors: true,
            keep_slower_than_ms: 0,
            service_name: String::new(),
            headers: BTreeMap::new(),
            max_queue: None,
            max_batch: None,
            batch_delay_ms: None,
            timeout_ms: None,
        }
    }
}

/// Head sampling: parent-based or not, and the ratio of new traces kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// A caller's sampled flag decides.
    pub parent_based: bool,
    /// Of traces decided here, those whose id's last 8 bytes (as a number, top bit cleared)
    /// fall below this are kept: the ratio of 2^63.
    pub threshold: u64,
}

impl Sampler {
    /// A sampler keeping `ratio` (0 to 1) of the traces it decides.
    pub fn new(parent_based: bool, ratio: f64) -> Self {
        let threshold = if ratio >= 1.0 {
            u64::MAX
        } else {
            (ratio.max(0.0) * (1u64 << 63) as f64) as u64
        };
        Self {
            parent_based,
            threshold,
        }
    }

    /// Whether trace `id` is sampled, given the caller's flag if it sent one.
    pub fn decide(&self, id: &[u8; 16], parent_sampled: Option<bool>) -> bool {
        match parent_sampled {
            Some(s) if self.parent_based => s,
            _ => {
                let low = u64::from_be_bytes(id[8..].try_into().expect("8 bytes")) >> 1;
                low < self.threshold
            }
        }
    }
}

/// What tracing runs with, resolved from `[tracing]` and the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where spans are posted.
    pub url: Uri,
    /// Sent with every export.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Head sampling.
    pub sampler: Sampler,
    /// Keep failed requests.
    pub keep_errors: bool,
    /// Keep requests at least this slow.
    pub keep_slower_than: Option<Duration>,
    /// Resource attributes: `service.name` first, then `OTEL_RESOURCE_ATTRIBUTES`' and the
    /// server's own.
    pub resource: Vec<(String, String)>,
    /// Queue bound, in requests.
    pub max_queue: usize,
    /// Requests per export.
    pub max_batch: usize,
    /// Export period.
    pub batch_delay: Duration,
    /// Time limit of one export.
    pub timeout: Duration,
}

impl TracingConfig {
    /// The settings tracing runs with, `None` when it is off; `env` reads an environment
    /// variable (`std::env::var`), `instance` is this server's `service.instance.id`.
    ///
    /// # Errors
    /// A value that makes no sense, named with where it came from.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
        instance: &str,
    ) -> Result<Option<Settings>, String> {
        let env = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(e) = env("OTEL_TRACES_EXPORTER") {
            match e.as_str() {
                "none" => return Ok(None),
                "otlp" => {}
                other => {
                    return Err(format!(
                        "OTEL_TRACES_EXPORTER={other}: Tern exports traces by OTLP only (otlp, \
                         or none for no traces)"
                    ));
                }
            }
        }
        let url = if !self.endpoint.is_empty() {
            traces_url(&self.endpoint, "tracing.endpoint")?
        } else if let Some(u) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            parse_url(&u, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?
        } else if let Some(u) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
            traces_url(&u, "OTEL_EXPORTER_OTLP_ENDPOINT")?
        } else {
            return Ok(None);
        };
        for k in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(p) = env(k) {
                if p != "http/protobuf" {
                    return Err(format!(
                        "{k}={p}: Tern exports by OTLP/HTTP with protobuf only (http/protobuf; \
                         a collector's OTLP receiver takes it on port 4318)"
                    ));
                }
                break;
            }
        }
        let (sampler, from) = if self.sampler.is_empty() {
            (
                env("OTEL_TRACES_SAMPLER").unwrap_or_else(|| "parentbased_always_on".into()),
                "OTEL_TRACES_SAMPLER",
            )
        } else {
            (self.sampler.clone(), "tracing.sampler")
        };
        let ratio = match self.sampler_arg {
            Some(r) => Some((r, "tracing.sampler_arg")),
            None => match env("OTEL_TRACES_SAMPLER_ARG") {
                Some(a) => Some((
                    a.parse::<f64>().map_err(|_| {
                        format!("OTEL_TRACES_SAMPLER_ARG={a}: not a number between 0 and 1")
                    })?,
                    "OTEL_TRACES_SAMPLER_ARG",
                )),
                None => None,
            },
        };
        if let Some((r, from)) = ratio
            && !(0.0..=1.0).contains(&r)
        {
            return Err(format!(
                "{from}: the ratio must be between 0 and 1 (it is {r})"
            ));
        }
        let ratio = ratio.map_or(1.0, |(r, _)| r);
        let sampler = match sampler.as_str() {
            "always_on" => Sampler::new(false, 1.0),
            "always_off" => Sampler::new(false, 0.0),
            "traceidratio" => Sampler::new(false, ratio),
            "parentbased_always_on" => Sampler::new(true, 1.0),
            "parentbased_always_off" => Sampler::new(true, 0.0),
            "parentbased_traceidratio" => Sampler::new(true, ratio),
            other => {
                return Err(format!(
                    "{from}={other}: not a sampler Tern knows (parentbased_always_on, \
                     parentbased_traceidratio, parentbased_always_off, always_on, always_off, \
                     traceidratio)"
                ));
            }
        };
        let mut headers = Vec::new();
        let env_headers = env("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .map(|h| (h, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"))
            .or_else(|| {
                env("OTEL_EXPORTER_OTLP_HEADERS").map(|h| (h, "OTEL_EXPORTER_OTLP_HEADERS"))
            });
        let mut pairs: Vec<(String, String, &str)> = Vec::new();
        if let Some((list, from)) = &env_headers {
            for (k, v) in key_values(list, from)? {
                pairs.push((k, v, from));
            }
        }
        for (k, v) in &self.headers {
            pairs.push((k.clone(), v.clone(), "tracing.headers"));
        }
        for (k, v, from) in pairs {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("{from}: {k:?} is not a header name"))?;
            let value = HeaderValue::from_str(&v)
                .map_err(|_| format!("{from}: the value of {k:?} is not a header value"))?;
            headers.retain(|(n, _)| *n != name);
            headers.push((name, value));
        }
        let number = |set: Option<u64>, var: &str, default: u64, what: &str| {
            let (n, from) = match set {
                Some(n) => (n, format!("tracing.{what}")),
                None => match env(var) {
                    Some(v) => (
                        v.parse::<u64>()
                            .map_err(|_| format!("{var}={v}: not a whole number"))?,
                        var.to_string(),
                    ),
                    None => (default, String::new()),
                },
            };
            if n == 0 {
                return Err(format!("{from}: must be at least 1"));
            }
            Ok(n)
        };
        let max_queue = number(
            self.max_queue.map(|n| n as u64),
            "OTEL_BSP_MAX_QUEUE_SIZE",
            2048,
            "max_queue",
        )?;
        if max_queue > 1_000_000 {
            return Err("tracing.max_queue: at most 1000000 requests".into());
        }
        let max_batch = number(
            self.max_batch.map(|n| n as u64),
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            512,
            "max_batch",
        )?;
        let batch_delay = number(
            self.batch_delay_ms,
            "OTEL_BSP_SCHEDULE_DELAY",
            1000,
            "batch_delay_ms",
        )?;
        let timeout = match self.timeout_ms {
            Some(t) => number(Some(t), "", 0, "timeout_ms")?,
            None => match env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
                Some(_) => number(None, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000, "")?,
                None => number(None, "OTEL_EXPORTER_OTLP_TIMEOUT", 10_000, "")?,
            },
        };
        let service = if self.service_name.is_empty() {
            env("OTEL_SERVICE_NAME").unwrap_or_else(|| "tern".into())
        } else {
            self.service_name.clone()
        };
        let mut resource = vec![("service.name".to_string(), service)];
        if let Some(list) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for (k, v) in key_values(&list, "OTEL_RESOURCE_ATTRIBUTES")? {
                if k != "service.name" {
                    resource.push((k, v));
                }
            }
        }
        for (k, v) in [
            ("service.version", env!("CARGO_PKG_VERSION")),
            ("service.instance.id", instance),
        ] {
            if !resource.iter().any(|(have, _)| have == k) {
                resource.push((k.to_string(), v.to_string()));
            }
        }
        Ok(Some(Settings {
            url,
            headers,
            sampler,
            keep_errors: self.keep_errors,
            keep_slower_than: (self.keep_slower_than_ms > 0)
                .then(|| Duration::from_millis(self.keep_slower_than_ms)),
            resource,
            max_queue: max_queue as usize,
            max_batch: max_batch as usize,
            batch_delay: Duration::from_millis(batch_delay),
            timeout: Duration::from_millis(timeout),
        }))
    }
}

/// An `http://` or `https://` URL.
fn parse_url(text: &str, from: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|_| format!("{from}: {text:?} is not a URL"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(format!(
            "{from}: {text:?} is not an http:// or https:// URL (the collector's OTLP/HTTP \
             receiver, e.g. http://127.0.0.1:4318)"
        )),
    }
}

/// A base URL with the signal's path (`/v1/traces`) appended, as OTLP exporters do.
fn traces_url(base: &str, from: &str) -> Result<Uri, String> {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        return parse_url(base, from);
    }
    parse_url(&format!("{base}/v1/traces"), from)
}

/// `key=value,key2=value2` with percent-encoded values (the OTel environment's lists).
fn key_values(list: &str, from: &str) -> Result<Vec<(String, String)>, String> {
    list.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("{from}: {pair:?} is not key=value"))?;
            let v = url::form_urlencoded::parse(format!("v={}", v.trim()).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            Ok((k.trim().to_string(), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn off_without_an_endpoint_and_when_disabled() {
        let c = TracingConfig::default();
        assert!(c.resolve(env(&[]), "i").unwrap().is_none());
        let e = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        assert!(c.resolve(env(&e), "i").unwrap().is_some());
        let off = [e[0], ("OTEL_SDK_DISABLED", "true")];
        assert!(c.resolve(env(&off), "i").unwrap().is_none());
        let none = [e[0], ("OTEL_TRACES_EXPORTER", "none")];
        assert!(c.resolve(env(&none), "i").unwrap().is_none());
    }

    #[test]
    fn the_environment_fills_what_the_file_leaves_unset() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_SERVICE_NAME", "edge"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,x=1"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ];
        let s = TracingConfig::default()
            .resolve(env(&vars), "pod-1")
            .unwrap()
            .unwrap();
        assert_eq!(s.url, "http://c:4318/v1/traces");
        assert_eq!(s.sampler, Sampler::new(true, 0.25));
        assert_eq!(s.batch_delay, Duration::from_millis(200));
        assert_eq!(s.headers[0].1, "a b");
        assert_eq!(
            s.resource,
            [
                ("service.name", "edge"),
                ("deployment.environment", "prod"),
                ("service.version", env!("CARGO_PKG_VERSION")),
                ("service.instance.id", "pod-1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        // The file's keys win; a whole traces URL is taken as it is.
        let c = TracingConfig {
            sampler: "always_off".into(),
            service_name: "mine".into(),
            ..TracingConfig::default()
        };
        let vars = [(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://vendor.example/otlp",
        )];
        let s = c.resolve(env(&vars), "i").unwrap().unwrap();
        assert_eq!(s.url, "https://vendor.example/otlp");
        assert_eq!(s.sampler, Sampler::new(false, 0.0));
        assert_eq!(s.resource[0].1, "mine");
    }

    #[test]
    fn bad_values_are_named() {
        let with = |vars: &[(&str, &str)]| {
            let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
            all.extend_from_slice(vars);
            TracingConfig::default()
                .resolve(env(&all), "i")
                .unwrap_err()
        };
        assert!(with(&[("OTEL_TRACES_SAMPLER", "sometimes")]).contains("OTEL_TRACES_SAMPLER"));
        assert!(with(&[("OTEL_TRACES_SAMPLER_ARG", "2")]).contains("between 0 and 1"));
        assert!(with(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).contains("http/protobuf"));
        assert!(with(&[("OTEL_TRACES_EXPORTER", "zipkin")]).contains("OTLP only"));
        assert!(with(&[("OTEL_BSP_MAX_QUEUE_SIZE", "0")]).contains("at least 1"));
        let c = TracingConfig {
            endpoint: "collector:4318".into(),
            ..TracingConfig::default()
        };
        assert!(
            c.resolve(env(&[]), "i")
                .unwrap_err()
                .contains("tracing.endpoint")
        );
    }

    #[test]
    fn ratios_keep_their_share_of_trace_ids() {
        let s = Sampler::new(false, 0.25);
        let kept = (0..20_000u64)
            .filter(|_| s.decide(&super::super::trace_id(), None))
            .count();
        assert!(
            (4_000..6_000).contains(&kept),
            "{kept} of 20000 kept at 0.25"
        );
        assert!(Sampler::new(false, 1.0).decide(&[0xff; 16], None));
        assert!(!Sampler::new(false, 0.0).decide(&[0; 16], None));
        // Parent-based: the caller's flag decides, either way.
        assert!(Sampler::new(true, 0.0).decide(&[0; 16], Some(true)));
        assert!(!Sampler::new(true, 1.0).decide(&[0; 16], Some(false)));
    }
}
