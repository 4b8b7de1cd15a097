//! The `Alt-Svc` advertisement of HTTP/3 on a TLS listener's answers.

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::ALT_SVC;
use http::{HeaderMap, HeaderValue};

/// The `Alt-Svc` header of a TLS listener whose port serves HTTP/3 too: sent only while the
/// QUIC listener is up (`clear` always, when the advertisement is withdrawn).
#[derive(Debug)]
pub struct AltSvc {
    value: HeaderValue,
    /// Whether the QUIC listener serves (a `clear` is sent either way).
    up: AtomicBool,
    clear: bool,
}

impl AltSvc {
    /// `h3=":PORT"; ma=MAX_AGE`, or `clear` for a `max_age` of 0.
    pub fn new(port: u16, max_age: u64) -> Self {
        let text = if max_age == 0 {
            "clear".to_string()
        } else {
            format!("h3=\":{port}\"; ma={max_age}")
        };
        Self {
            value: HeaderValue::from_str(&text).expect("ASCII"),
            up: AtomicBool::new(false),
            clear: max_age == 0,
        }
    }

    /// Adds the advertisement to an answer's `headers`, unless the guest set its own.
    pub fn advertise(&self, headers: &mut HeaderMap) {
        if (self.clear || self.up.load(Ordering::Relaxed)) && !headers.contains_key(ALT_SVC) {
            headers.insert(ALT_SVC, self.value.clone());
        }
    }

    pub(super) fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::AltSvc;

    #[test]
    fn alt_svc_is_sent_while_up_never_over_a_guests_own_and_clear_always() {
        let alt = AltSvc::new(443, 86_400);
        let mut headers = http::HeaderMap::new();
        alt.advertise(&mut headers);
        assert!(headers.is_empty(), "advertised before the listener is up");
        alt.set_up(true);
        alt.advertise(&mut headers);
        assert_eq!(headers["alt-svc"], "h3=\":443\"; ma=86400");
        let mut own = http::HeaderMap::new();
        own.insert("alt-svc", "h2=\"alt.example:443\"".parse().unwrap());
        alt.advertise(&mut own);
        assert_eq!(own["alt-svc"], "h2=\"alt.example:443\"");
        alt.set_up(false);
        let mut headers = http::HeaderMap::new();
        alt.advertise(&mut headers);
        assert!(headers.is_empty(), "advertised after the listener stopped");
        let clear = AltSvc::new(443, 0);
        let mut headers = http::HeaderMap::new();
        clear.advertise(&mut headers);
        assert_eq!(headers["alt-svc"], "clear");
    }
}
