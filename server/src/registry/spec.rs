//! How an admin request changes a tenant's spec: `PUT` replaces it whole (and must name every
//! field the tenant has set), `PATCH` changes only the fields it names (JSON merge patch,
//! RFC 7396). Nothing a request does not name changes, so no request can silently reroute a
//! tenant or empty its environment.

use serde_json::{Map, Value};

use crate::change::ChangeError;
use crate::datadir::TenantSpec;

/// A request to change (or create) a tenant's spec, as its JSON body.
#[derive(Debug)]
pub enum SpecChange {
    /// `PUT`: the whole spec. Creates the tenant; on an existing one every field the tenant
    /// has set must be named (with its new value, or its default to reset it).
    Replace(Value),
    /// `PATCH`: the fields to change, merged into the current spec (RFC 7396: an object
    /// merges field by field, `null` resets a field to its default, anything else replaces
    /// it). The tenant must exist.
    Merge(Value),
}

impl SpecChange {
    /// The spec this change makes of `current` (`None`: no such tenant yet).
    ///
    /// # Errors
    /// `400` for a body that is not a JSON object or not a spec, `404` for a `PATCH` of a
    /// tenant that does not exist, `409` for a `PUT` that leaves out a field the tenant has set.
    pub fn apply(
        self,
        name: &str,
        current: Option<&TenantSpec>,
    ) -> Result<TenantSpec, ChangeError> {
        let (body, merge) = match self {
            SpecChange::Replace(v) => (v, false),
            SpecChange::Merge(v) => (v, true),
        };
        let Value::Object(body) = body else {
            return Err(ChangeError::Invalid(
                "the tenant spec must be a JSON object".into(),
            ));
        };
        let spec = match (current, merge) {
            (None, true) => {
                return Err(ChangeError::NotFound(format!(
                    "no tenant named {name:?}; PATCH changes an existing tenant (create it with PUT)"
                )));
            }
            (None, false) => parse(Value::Object(body))?,
            (Some(current), false) => {
                let left_out = set_fields(current)
                    .into_iter()
                    .filter(|f| !body.contains_key(*f))
                    .collect::<Vec<_>>();
                if !left_out.is_empty() {
                    return Err(ChangeError::Conflict(format!(
                        "PUT replaces the whole spec of tenant {name:?}, and this one leaves out \
                         {} that the tenant has set: they would be reset{}. Name them in the \
                         body, or send PATCH to change only the fields you name",
                        left_out
                            .iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        if left_out.iter().any(|f| *f == "paths" || *f == "hosts") {
                            " (an empty `paths` or `hosts` routes every path or host to it)"
                        } else {
                            ""
                        },
                    )));
                }
                parse(Value::Object(body))?
            }
            (Some(current), true) => {
                let mut merged = to_value(current);
                merge_patch(&mut merged, Value::Object(body));
                parse(merged)?
            }
        };
        Ok(spec)
    }
}

fn to_value(spec: &TenantSpec) -> Value {
    serde_json::to_value(spec).unwrap_or_else(|_| Value::Object(Map::new()))
}

fn parse(v: Value) -> Result<TenantSpec, ChangeError> {
    serde_json::from_value(v)
        .map_err(|e| ChangeError::Invalid(format!("the tenant spec is not valid JSON for it: {e}")))
}

/// The top-level fields of `spec` that differ from their defaults.
fn set_fields(spec: &TenantSpec) -> Vec<&'static str> {
    let (now, default) = (to_value(spec), to_value(&TenantSpec::default()));
    crate::config::settings_keys()
        .iter()
        .copied()
        .filter(|f| now.get(f) != default.get(f))
        .collect()
}

/// RFC 7396 JSON merge patch: `patch` merged into `target`.
fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(&key);
        } else {
            merge_patch(target.entry(key).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> TenantSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_patch_changes_only_what_it_names() {
        let current = spec(json!({
            "paths": ["/api"],
            "env": { "A": "1" },
            "limits": { "timeout_ms": 500 },
            "outbound": { "backends": { "old": { "url": "http://10.0.0.1" } } }
        }));
        let patch = json!({ "outbound": { "backends": { "new": { "url": "http://10.0.0.2" } } } });
        let s = SpecChange::Merge(patch).apply("t", Some(&current)).unwrap();
        assert_eq!(s.paths, vec!["/api"]);
        assert_eq!(s.env.get("A"), Some(&"1".into()));
        assert_eq!(s.limits.timeout_ms, 500);
        assert!(s.outbound.backends.contains_key("old"));
        assert!(s.outbound.backends.contains_key("new"));
        // `null` resets a field (or removes a map entry); a nested field merges.
        let patch = json!({ "env": null, "limits": { "stdio_bytes": 100 },
                            "outbound": { "backends": { "old": null } } });
        let s = SpecChange::Merge(patch).apply("t", Some(&s)).unwrap();
        assert!(s.env.is_empty());
        assert_eq!((s.limits.timeout_ms, s.limits.stdio_bytes), (500, 100));
        assert_eq!(s.outbound.backends.keys().collect::<Vec<_>>(), ["new"]);
        assert_eq!(s.paths, vec!["/api"]);
    }

    #[test]
    fn a_put_must_name_every_field_the_tenant_has_set() {
        let current = spec(json!({ "paths": ["/api"], "env": { "A": "1" } }));
        let e = SpecChange::Replace(json!({ "outbound": { "max_requests": 2 } }))
            .apply("t", Some(&current))
            .unwrap_err();
        assert!(matches!(e, ChangeError::Conflict(_)), "{e}");
        let text = e.to_string();
        assert!(text.contains("`paths`") && text.contains("`env`"), "{text}");
        assert!(text.contains("PATCH"), "{text}");
        // Named (even as empty: explicit), it replaces.
        let s = SpecChange::Replace(json!({ "paths": [], "env": {} }))
            .apply("t", Some(&current))
            .unwrap();
        assert!(s.paths.is_empty() && s.env.is_empty());
        // A new tenant takes whatever is given, the rest defaults.
        let s = SpecChange::Replace(json!({ "paths": ["/x"] }))
            .apply("t", None)
            .unwrap();
        assert_eq!(s.paths, vec!["/x"]);
    }

    #[test]
    fn bad_bodies_and_missing_tenants_are_refused() {
        let e = SpecChange::Merge(json!({ "paths": ["/x"] }))
            .apply("t", None)
            .unwrap_err();
        assert!(matches!(e, ChangeError::NotFound(_)), "{e}");
        let e = SpecChange::Merge(json!([1]))
            .apply("t", Some(&TenantSpec::default()))
            .unwrap_err();
        assert!(matches!(e, ChangeError::Invalid(_)), "{e}");
        let e = SpecChange::Merge(json!({ "pahts": ["/x"] }))
            .apply("t", Some(&TenantSpec::default()))
            .unwrap_err();
        assert!(e.to_string().contains("pahts"), "{e}");
    }
}
