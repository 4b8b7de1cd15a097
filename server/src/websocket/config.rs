//! `[tenant.websocket]`: the limits of a tenant's WebSocket connections.

use serde::{Deserialize, Serialize};

/// `[tenant.websocket]`: how many WebSocket connections a tenant holds open and what each may
/// do. Every value has a default; a connection past a limit is closed with the code that
/// says why.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebsocketConfig {
    /// `handoff` (the default): the guest sees the opening and hands the connection to a
    /// backend. `events`: Tern holds the connection and sends its events to the guest, a
    /// batch per request (Pushpin's WebSocket-over-HTTP).
    pub mode: Mode,
    /// Open connections at once; an upgrade past it is answered `503` before any guest runs.
    pub max_connections: u32,
    /// A connection with no frame either way for this long is closed (`1001`). Clients that
    /// stay open for long send pings.
    pub idle_timeout_ms: u64,
    /// A connection is closed (`1001`) this long after it opened, whatever it does.
    pub max_lifetime_ms: u64,
    /// Largest message either way, all its frames together; a larger one closes the
    /// connection (`1009`) before it is forwarded.
    pub max_message_bytes: u64,
    /// Frames a client may send in one second (pings included); past it the connection is
    /// closed (`1008`).
    pub max_frames_per_second: u32,
}

/// What Tern does with a tenant's WebSocket openings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The guest hands the connection to a backend (`tern-handoff`); Tern relays frames.
    #[default]
    Handoff,
    /// Tern terminates the connection and sends its events to the guest as requests.
    Events,
}

impl Mode {
    /// Its name (a metrics label).
    pub fn name(self) -> &'static str {
        match self {
            Self::Handoff => "handoff",
            Self::Events => "events",
        }
    }
}

/// Ceilings of the settings (each a plain mistake past it).
const MAX_CONNECTIONS: u32 = 1_000_000;
const MAX_MESSAGE: u64 = 64 << 20;
const MAX_LIFETIME_MS: u64 = 7 * 24 * 3_600_000;

impl Default for WebsocketConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Handoff,
            max_connections: 1_000,
            idle_timeout_ms: 60_000,
            max_lifetime_ms: 24 * 3_600_000,
            max_message_bytes: 1 << 20,
            max_frames_per_second: 1_000,
        }
    }
}

impl WebsocketConfig {
    /// Whether every setting is its default (the section is then left out of the tenant's
    /// settings as the API shows them).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the ranges.
    ///
    /// # Errors
    /// The setting out of range and its range.
    pub fn check(&self) -> Result<(), String> {
        let in_range = |name: &str, v: u64, min: u64, max: u64| {
            if (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(format!("websocket.{name} must be {min} to {max}, not {v}"))
            }
        };
        in_range(
            "max_connections",
            self.max_connections.into(),
            1,
            MAX_CONNECTIONS.into(),
        )?;
        in_range(
            "idle_timeout_ms",
            self.idle_timeout_ms,
            1_000,
            MAX_LIFETIME_MS,
        )?;
        in_range(
            "max_lifetime_ms",
            self.max_lifetime_ms,
            1_000,
            MAX_LIFETIME_MS,
        )?;
        in_range(
            "max_message_bytes",
            self.max_message_bytes,
            125,
            MAX_MESSAGE,
        )?;
        in_range(
            "max_frames_per_second",
            self.max_frames_per_second.into(),
            1,
            1_000_000,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_edge_is_named() {
        assert_eq!(WebsocketConfig::default().check(), Ok(()));
        let with = |f: &dyn Fn(&mut WebsocketConfig)| {
            let mut c = WebsocketConfig::default();
            f(&mut c);
            c.check()
        };
        assert!(with(&|c| c.max_message_bytes = 125).is_ok());
        assert_eq!(
            with(&|c| c.max_message_bytes = 124),
            Err("websocket.max_message_bytes must be 125 to 67108864, not 124".into())
        );
        assert!(with(&|c| c.max_message_bytes = 64 << 20).is_ok());
        assert!(with(&|c| c.max_message_bytes = (64 << 20) + 1).is_err());
        assert!(with(&|c| c.max_connections = 0).is_err());
        assert!(with(&|c| c.idle_timeout_ms = 999).is_err());
        assert!(with(&|c| c.max_frames_per_second = 0).is_err());
        let parsed: WebsocketConfig = toml::from_str("idle_timeout_ms = 5000").unwrap();
        assert_eq!(parsed.idle_timeout_ms, 5000);
        assert_eq!(parsed.max_connections, 1000);
        assert!(toml::from_str::<WebsocketConfig>("idle = 5").is_err());
        let events: WebsocketConfig = toml::from_str("mode = \"events\"").unwrap();
        assert_eq!(events.mode, Mode::Events);
        assert!(toml::from_str::<WebsocketConfig>("mode = \"relay\"").is_err());
    }
}
