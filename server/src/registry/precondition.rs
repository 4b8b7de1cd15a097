//! Conditional changes (RFC 9110 §13.1): a change to a tenant may name the state it was
//! computed from — `If-Match: <ETag>` (the tenant as the client last read it), `If-None-Match:
//! *` (it must not exist yet) — and is refused with `412` when the tenant is not in that state.
//! A client whose change got no clear answer (a lost reply, a registry that could not confirm
//! it) sends the same conditional change again: it is applied if the first was not, and
//! refused if it was, never applied twice (a rollback retried is not undone).

use http::HeaderMap;
use http::header::{IF_MATCH, IF_NONE_MATCH};

use crate::change::ChangeError;
use crate::datadir::StoredTenant;

/// The entity tags one precondition header lists.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tags {
    /// `*`: any current version.
    Any,
    /// These tags (each with its quotes; a weak one with its `W/`).
    List(Vec<String>),
}

/// What a change requires of the tenant's current state; the default requires nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Precondition {
    if_match: Option<Tags>,
    if_none_match: Option<Tags>,
}

/// The tags of one header's values (`"a", W/"b"` or `*`).
fn tags(headers: &HeaderMap, name: &http::HeaderName) -> Result<Option<Tags>, ChangeError> {
    let mut list = Vec::new();
    let mut any = false;
    for value in headers.get_all(name) {
        let text = value.to_str().map_err(|_| {
            ChangeError::Invalid(format!("{name}: not text; an entity tag is \"...\""))
        })?;
        for tag in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let opaque = tag.strip_prefix("W/").unwrap_or(tag);
            if tag == "*" {
                any = true;
            } else if opaque.len() >= 2 && opaque.starts_with('"') && opaque.ends_with('"') {
                list.push(tag.to_string());
            } else {
                return Err(ChangeError::Invalid(format!(
                    "{name}: {tag:?} is not an entity tag: quote it as the ETag header gives \
                     it (e.g. {name}: \"3f2a...\"), or send *"
                )));
            }
        }
    }
    Ok(match (any, list.is_empty()) {
        (false, true) => None,
        (true, true) => Some(Tags::Any),
        (true, false) => {
            return Err(ChangeError::Invalid(format!(
                "{name}: * cannot be listed with entity tags"
            )));
        }
        (false, false) => Some(Tags::List(list)),
    })
}

impl Precondition {
    /// The precondition of a request's `If-Match` and `If-None-Match` headers.
    ///
    /// # Errors
    /// `400` for a value that is not `*` or a list of quoted entity tags.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ChangeError> {
        Ok(Self {
            if_match: tags(headers, &IF_MATCH)?,
            if_none_match: tags(headers, &IF_NONE_MATCH)?,
        })
    }

    /// Whether it requires anything.
    pub fn is_none(&self) -> bool {
        self.if_match.is_none() && self.if_none_match.is_none()
    }

    /// Checks it against tenant `name`'s current entry (`None`: there is none).
    ///
    /// # Errors
    /// `412` if the tenant is not in the state it requires, naming its current ETag.
    pub fn check(&self, name: &str, current: Option<&StoredTenant>) -> Result<(), ChangeError> {
        let etag = current.map(StoredTenant::etag);
        let now = || match &etag {
            Some(tag) => format!("tenant {name:?} is now at ETag {tag}"),
            None => format!("there is no tenant {name:?}"),
        };
        if let Some(wanted) = &self.if_match {
            // Strong comparison (RFC 9110 §13.1.1): a weak tag never matches.
            let matched = match (wanted, &etag) {
                (_, None) => false,
                (Tags::Any, Some(_)) => true,
                (Tags::List(list), Some(tag)) => list.iter().any(|t| t == tag),
            };
            if !matched {
                return Err(ChangeError::PreconditionFailed(format!(
                    "{}, which If-Match does not name: it changed since it was read (perhaps \
                     by an earlier attempt of this same change); nothing was changed. Read it \
                     again (GET /admin/v1/tenants/{name}) and decide",
                    now()
                )));
            }
        }
        if let Some(refused) = &self.if_none_match {
            // Weak comparison (RFC 9110 §13.1.2).
            let weak = |t: &str| t.strip_prefix("W/").unwrap_or(t).to_string();
            let matched = match (refused, &etag) {
                (_, None) => false,
                (Tags::Any, Some(_)) => true,
                (Tags::List(list), Some(tag)) => list.iter().any(|t| weak(t) == weak(tag)),
            };
            if matched {
                return Err(ChangeError::PreconditionFailed(format!(
                    "{}, which If-None-Match refuses: nothing was changed",
                    now()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn tenant(created_at: u64) -> StoredTenant {
        StoredTenant {
            spec: Default::default(),
            current: None,
            previous: None,
            candidate: None,
            created_at,
            id: None,
            variables: std::collections::BTreeMap::new(),
        }
    }

    fn pre(pairs: &[(&http::HeaderName, &str)]) -> Result<Precondition, ChangeError> {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        Precondition::from_headers(&h)
    }

    #[test]
    fn if_match_passes_only_the_tenant_as_it_was_read() {
        let (a, b) = (tenant(1), tenant(2));
        assert_ne!(a.etag(), b.etag(), "every change changes the tag");
        assert_eq!(a.etag(), tenant(1).etag(), "the same entry, the same tag");
        let p = pre(&[(&IF_MATCH, &a.etag())]).unwrap();
        p.check("t", Some(&a)).unwrap();
        let e = p.check("t", Some(&b)).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::PRECONDITION_FAILED);
        assert!(e.to_string().contains(&b.etag()), "{e}");
        assert!(p.check("t", None).is_err(), "deleted meanwhile");
        // One of a list; `*` is any existing tenant; a weak tag never matches strongly.
        let list = format!("\"0000\", {}", a.etag());
        pre(&[(&IF_MATCH, &list)])
            .unwrap()
            .check("t", Some(&a))
            .unwrap();
        let any = pre(&[(&IF_MATCH, "*")]).unwrap();
        any.check("t", Some(&b)).unwrap();
        assert!(any.check("t", None).is_err());
        let weak = pre(&[(&IF_MATCH, &format!("W/{}", a.etag()))]).unwrap();
        assert!(weak.check("t", Some(&a)).is_err());
        // Nothing asked: anything passes.
        let none = pre(&[]).unwrap();
        assert!(none.is_none());
        none.check("t", None).unwrap();
    }

    #[test]
    fn if_none_match_star_passes_only_a_tenant_that_does_not_exist() {
        let p = pre(&[(&IF_NONE_MATCH, "*")]).unwrap();
        p.check("t", None).unwrap();
        let e = p.check("t", Some(&tenant(1))).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::PRECONDITION_FAILED);
        let a = tenant(1);
        let weak = pre(&[(&IF_NONE_MATCH, &format!("W/{}", a.etag()))]).unwrap();
        assert!(weak.check("t", Some(&a)).is_err(), "weak comparison");
        weak.check("t", Some(&tenant(2))).unwrap();
    }

    #[test]
    fn malformed_tags_are_refused_with_400() {
        for bad in ["abc", "\"", "*, \"a\"", "W/abc"] {
            let e = pre(&[(&IF_MATCH, bad)]).unwrap_err();
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{bad}: {e}");
        }
    }
}
