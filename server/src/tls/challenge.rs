//! ACME challenges in progress, as the certificates' index shares them between processes,
//! and the answers this process gives for them (HTTP-01's key authorization, TLS-ALPN-01's
//! certificate).

use std::collections::BTreeMap;
use std::sync::Arc;

use rustls::pki_types::PrivateKeyDer;
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};

/// The answer to an ACME challenge in progress, for every process sharing the index to give.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Challenge {
    /// HTTP-01: `GET /.well-known/acme-challenge/<token>` answers the key authorization.
    Http01 {
        /// The CA's token.
        token: String,
        /// The body to answer with.
        key_authorization: String,
    },
    /// TLS-ALPN-01: a handshake offering `acme-tls/1` gets a certificate carrying this SHA-256
    /// of the key authorization (hex); each process makes its own such certificate.
    TlsAlpn01 {
        /// The digest.
        digest: String,
    },
}

/// Why a TLS-ALPN-01 answer could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the TLS-ALPN-01 answer: {0}")]
pub struct AnswerError(String);

/// The TLS-ALPN-01 answer for `name`: a self-signed certificate for it carrying the SHA-256 of
/// the key authorization in the `acmeIdentifier` extension (RFC 8737 §3).
pub(super) fn alpn_certificate(
    name: &str,
    digest: &[u8],
) -> Result<Arc<CertifiedKey>, AnswerError> {
    let failed = |e: &dyn std::error::Error| AnswerError(crate::error_chain(e));
    let key = rcgen::KeyPair::generate().map_err(|e| failed(&e))?;
    let mut params =
        rcgen::CertificateParams::new(vec![name.to_string()]).map_err(|e| failed(&e))?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(|e| failed(&e))?;
    let private = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    // Not `CertifiedKey::from_der`: its key check parses the certificate with webpki, which
    // refuses the critical `acmeIdentifier` extension the answer must carry.
    let signer = rustls::crypto::aws_lc_rs::default_provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| failed(&e))?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signer,
    )))
}

/// A change to the challenge answers this process gives, by host.
pub(super) enum AnswerChange {
    /// HTTP-01: the token and its answer (`None`: stop answering).
    Http(String, Option<String>),
    /// TLS-ALPN-01: the certificate to answer with (`None`: stop).
    Alpn(Option<Arc<rustls::sign::CertifiedKey>>),
}

/// What changes in the answers when the index's challenges go from `before` to `now`.
pub(super) fn challenge_answers(
    before: &BTreeMap<String, Challenge>,
    now: &BTreeMap<String, Challenge>,
) -> Vec<(String, AnswerChange)> {
    let mut out = Vec::new();
    for (host, old) in before {
        if now.get(host) != Some(old) {
            out.push((host.clone(), withdraw(old)));
        }
    }
    for (host, new) in now {
        if before.get(host) == Some(new) {
            continue;
        }
        match new {
            Challenge::Http01 {
                token,
                key_authorization,
            } => out.push((
                host.clone(),
                AnswerChange::Http(token.clone(), Some(key_authorization.clone())),
            )),
            Challenge::TlsAlpn01 { digest } => {
                match unhex(digest).map(|d| alpn_certificate(host, &d)) {
                    Some(Ok(cert)) => out.push((host.clone(), AnswerChange::Alpn(Some(cert)))),
                    _ => {
                        tracing::error!(host = %host, "ACME: cannot answer the TLS-ALPN-01 challenge of the index")
                    }
                }
            }
        }
    }
    out
}

fn withdraw(challenge: &Challenge) -> AnswerChange {
    match challenge {
        Challenge::Http01 { token, .. } => AnswerChange::Http(token.clone(), None),
        Challenge::TlsAlpn01 { .. } => AnswerChange::Alpn(None),
    }
}

/// The bytes of lowercase or uppercase hex `text`.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_of_the_index_become_answers_and_are_withdrawn_with_it() {
        let http = |t: &str| Challenge::Http01 {
            token: t.into(),
            key_authorization: format!("{t}.key"),
        };
        let alpn = Challenge::TlsAlpn01 {
            digest: "ab".repeat(32),
        };
        let none = BTreeMap::new();
        let one: BTreeMap<String, Challenge> = [
            ("a.test".to_string(), http("t1")),
            ("b.test".to_string(), alpn.clone()),
        ]
        .into();
        let answers = challenge_answers(&none, &one);
        assert_eq!(answers.len(), 2);
        assert!(answers.iter().any(|(h, a)| h == "a.test"
            && matches!(a, AnswerChange::Http(t, Some(k)) if t == "t1" && k == "t1.key")));
        assert!(
            answers
                .iter()
                .any(|(h, a)| h == "b.test" && matches!(a, AnswerChange::Alpn(Some(_))))
        );
        assert!(challenge_answers(&one, &one).is_empty(), "unchanged");
        // a.test's order made a new challenge; b.test's ended.
        let two: BTreeMap<String, Challenge> = [("a.test".to_string(), http("t2"))].into();
        let answers = challenge_answers(&one, &two);
        let kinds: Vec<String> = answers
            .iter()
            .map(|(h, a)| match a {
                AnswerChange::Http(t, k) => format!("{h} {t} {}", k.is_some()),
                AnswerChange::Alpn(c) => format!("{h} alpn {}", c.is_some()),
            })
            .collect();
        assert_eq!(
            kinds,
            ["a.test t1 false", "b.test alpn false", "a.test t2 true"]
        );
        let bad: BTreeMap<String, Challenge> = [(
            "c.test".to_string(),
            Challenge::TlsAlpn01 {
                digest: "zz".into(),
            },
        )]
        .into();
        assert!(
            challenge_answers(&none, &bad).is_empty(),
            "not hex: no answer"
        );
        assert_eq!(unhex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(unhex("abc"), None);
    }
}
