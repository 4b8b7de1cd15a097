//! Channels of events-mode connections: a guest subscribes a connection to channels (a `c:`
//! control message), and a message published to a channel reaches every connection of the
//! tenant subscribed to it on this server (the admin API sends it on to the other replicas of
//! a fleet). A message may also be published to one connection by its `Connection-Id`.
//!
//! The publish format is Pushpin's: `{"items": [{"channel": "room", "formats": {"ws-message":
//! {"content": "hi"}}}]}` (`content-bin`: base64 bytes, a binary message; `"action":
//! "close"` with an optional `code` and `reason` closes the connections).
//!
//! Publishing never waits for a connection: each has a queue of [`QUEUE`] messages, and a
//! message for a full queue (a client that does not read) is dropped and counted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::mpsc;

/// Messages waiting for one connection; past it a publish to it is dropped.
pub const QUEUE: usize = 256;

/// Channels one connection may be subscribed to.
pub const MAX_SUBSCRIPTIONS: usize = 64;

/// Longest channel name.
pub const MAX_CHANNEL: usize = 256;

/// What a publish sends to a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    /// A text message.
    Text(Bytes),
    /// A binary message.
    Binary(Bytes),
    /// Close the connection with this code and reason.
    Close(u16, Bytes),
}

/// Whom a publish is for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub enum Target {
    /// Every connection subscribed to the channel.
    #[serde(rename = "channel")]
    Channel(String),
    /// The connection with this `Connection-Id`.
    #[serde(rename = "connection")]
    Connection(String),
}

/// Publishes a guest may make in one request (each one item or more; in a fleet each is one
/// request to every other replica).
pub const MAX_PUBLISHES: usize = 100;

/// Where a tenant's publishes go beyond this server: the other replicas of a fleet.
pub trait Forward: Send + Sync {
    /// Sends tenant `name`'s publish (its JSON, [`to_json`]) to the other replicas, in the
    /// background, naming whose it is (`data`, [`crate::tenant::Tenant::data`]): a replica
    /// serving another tenant of that name drops it.
    fn forward(&self, name: &str, data: &str, body: Bytes);
}

/// A tenant's channels, prepared with each of its versions: its key in the hub (its name and
/// a lineage carried from one version to the next, new when a tenant of that name is made
/// again, so a tenant made anew under an old name never reaches the old one's connections)
/// and where its publishes go.
pub struct Grant {
    hub: Arc<Hub>,
    key: Arc<str>,
    name: String,
    data: Arc<str>,
    /// Whether the tenant's WebSockets are in events mode (only those have channels).
    events: bool,
    forward: Option<Arc<dyn Forward>>,
    delivered: prometheus::IntCounter,
    dropped: prometheus::IntCounter,
}

impl Grant {
    /// Tenant `p.tenant`'s channels in `hub`, under the key of the version it replaces
    /// (`carried`), else a new one; publishes forwarded through `forward` (a fleet's).
    pub fn prepare(
        p: &crate::prepare::Preparing<'_>,
        mode: super::Mode,
        hub: &Arc<Hub>,
        forward: Option<&Arc<dyn Forward>>,
        carried: Option<&Self>,
    ) -> Self {
        let key = match carried {
            Some(c) if c.name == p.tenant => c.key.clone(),
            _ => Arc::from(format!(
                "{}#{}",
                p.tenant,
                hub.next.fetch_add(1, Ordering::Relaxed)
            )),
        };
        let m = &p.metrics.websocket_published;
        Self {
            hub: hub.clone(),
            key,
            name: p.tenant.to_string(),
            data: p.data.clone(),
            events: mode == super::Mode::Events,
            forward: forward.cloned(),
            delivered: m.with_label_values(&[p.label, "delivered"]),
            dropped: m.with_label_values(&[p.label, "dropped"]),
        }
    }

    /// Whether its WebSockets are in events mode (else it has no channels).
    pub fn events(&self) -> bool {
        self.events
    }

    /// Its key in the hub: another for a tenant made anew under the same name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Joins the tenant's connection `id` ([`Hub::join`]).
    pub fn join(&self, id: &str) -> (Member, mpsc::Receiver<Push>) {
        self.hub.join(&self.key, id)
    }

    /// Queues `items` for the tenant's connections on this server and, unless `forwarded`
    /// (it came from another replica), sends them on to the other replicas.
    pub fn publish(&self, items: &[(Target, Push)], forwarded: bool) -> Published {
        let mut done = Published::default();
        for (to, push) in items {
            let p = self.hub.publish(&self.key, to, push);
            done.delivered += p.delivered;
            done.dropped += p.dropped;
        }
        self.delivered.inc_by(done.delivered);
        self.dropped.inc_by(done.dropped);
        if !forwarded && let Some(f) = &self.forward {
            f.forward(&self.name, &self.data, to_json(items).to_string().into());
        }
        done
    }
}

/// One request's publishes (the `tern` ABI's `websocket_publish`).
pub struct Session {
    grant: Arc<Grant>,
    made: usize,
}

impl Session {
    /// None made yet, under the tenant's `grant`.
    pub fn new(grant: Arc<Grant>) -> Self {
        Self { grant, made: 0 }
    }

    /// Publishes `body` (Pushpin's publish format, as the admin API takes it).
    ///
    /// # Errors
    /// The tenant's WebSockets are not in events mode, the request made [`MAX_PUBLISHES`]
    /// already, or the body is not a valid publish (what is wrong, naming the item).
    pub fn publish(&mut self, body: &[u8]) -> Result<Published, PublishError> {
        if !self.grant.events {
            return Err(PublishError::NotEvents);
        }
        if self.made >= MAX_PUBLISHES {
            return Err(PublishError::Limit);
        }
        let items = Publish::read(body).map_err(PublishError::Invalid)?;
        self.made += 1;
        Ok(self.grant.publish(&items, false))
    }
}

/// Why a guest's publish was refused.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Its tenant has no channels.
    #[error(
        "the tenant's WebSockets are not in events mode (`[tenant.websocket] mode = \"events\"`): \
         it has no channels to publish to"
    )]
    NotEvents,
    /// Past [`MAX_PUBLISHES`].
    #[error("a request may publish {MAX_PUBLISHES} times")]
    Limit,
    /// Not a valid publish.
    #[error("{0}")]
    Invalid(String),
}

/// The tenants' channels on this server.
#[derive(Default)]
pub struct Hub {
    tenants: std::sync::Mutex<HashMap<Arc<str>, Channels>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Channels {
    subscribed: HashMap<String, HashMap<u64, mpsc::Sender<Push>>>,
    connections: HashMap<String, (u64, mpsc::Sender<Push>)>,
}

/// One connection's membership: its queue's sending end, its channels; all given up when it
/// is dropped.
pub struct Member {
    hub: Arc<Hub>,
    tenant: Arc<str>,
    key: u64,
    id: String,
    tx: mpsc::Sender<Push>,
    channels: HashSet<String>,
}

/// What a publish did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Connections the message was queued for.
    pub delivered: u64,
    /// Connections whose queue was full.
    pub dropped: u64,
}

impl Hub {
    /// A new, empty hub.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Joins connection `id` of `tenant`: its membership and the receiving end of its queue.
    pub fn join(self: &Arc<Self>, tenant: &str, id: &str) -> (Member, mpsc::Receiver<Push>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let mut tenants = self.tenants.lock().expect("never poisoned");
        let name: Arc<str> = match tenants.get_key_value(tenant) {
            Some((k, _)) => k.clone(),
            None => Arc::from(tenant),
        };
        tenants
            .entry(name.clone())
            .or_default()
            .connections
            .insert(id.to_string(), (key, tx.clone()));
        drop(tenants);
        let member = Member {
            hub: self.clone(),
            tenant: name,
            key,
            id: id.to_string(),
            tx,
            channels: HashSet::new(),
        };
        (member, rx)
    }

    /// Queues `push` for every connection of `tenant` that `to` names.
    pub fn publish(&self, tenant: &str, to: &Target, push: &Push) -> Published {
        let tenants = self.tenants.lock().expect("never poisoned");
        let mut p = Published::default();
        let Some(c) = tenants.get(tenant) else {
            return p;
        };
        let mut send = |tx: &mpsc::Sender<Push>| match tx.try_send(push.clone()) {
            Ok(()) => p.delivered += 1,
            // (A closed queue is a connection going away: neither.)
            Err(mpsc::error::TrySendError::Full(_)) => p.dropped += 1,
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        };
        match to {
            Target::Channel(name) => {
                for tx in c.subscribed.get(name).into_iter().flat_map(HashMap::values) {
                    send(tx);
                }
            }
            Target::Connection(id) => {
                if let Some((_, tx)) = c.connections.get(id) {
                    send(tx);
                }
            }
        }
        p
    }
}

impl Member {
    /// Subscribes the connection to `channel`.
    ///
    /// # Errors
    /// A name too long or empty, or past [`MAX_SUBSCRIPTIONS`].
    pub fn subscribe(&mut self, channel: &str) -> Result<(), String> {
        check_channel(channel)?;
        if self.channels.contains(channel) {
            return Ok(());
        }
        if self.channels.len() >= MAX_SUBSCRIPTIONS {
            return Err(format!(
                "a connection may be subscribed to {MAX_SUBSCRIPTIONS} channels"
            ));
        }
        self.channels.insert(channel.to_string());
        let mut tenants = self.hub.tenants.lock().expect("never poisoned");
        tenants
            .entry(self.tenant.clone())
            .or_default()
            .subscribed
            .entry(channel.to_string())
            .or_default()
            .insert(self.key, self.tx.clone());
        Ok(())
    }

    /// Unsubscribes the connection from `channel`.
    pub fn unsubscribe(&mut self, channel: &str) {
        if self.channels.remove(channel) {
            let mut tenants = self.hub.tenants.lock().expect("never poisoned");
            if let Some(c) = tenants.get_mut(&self.tenant) {
                leave(c, channel, self.key);
            }
        }
    }

    /// Its `Connection-Id`.
    pub fn id(&self) -> &str {
        &self.id
    }
}

fn leave(c: &mut Channels, channel: &str, key: u64) {
    if let Some(members) = c.subscribed.get_mut(channel) {
        members.remove(&key);
        if members.is_empty() {
            c.subscribed.remove(channel);
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut tenants = self.hub.tenants.lock().expect("never poisoned");
        let Some(c) = tenants.get_mut(&self.tenant) else {
            return;
        };
        for channel in &self.channels {
            leave(c, channel, self.key);
        }
        if c.connections
            .get(&self.id)
            .is_some_and(|(k, _)| *k == self.key)
        {
            c.connections.remove(&self.id);
        }
        if c.connections.is_empty() && c.subscribed.is_empty() {
            tenants.remove(&self.tenant);
        }
    }
}

/// Checks a channel's name.
///
/// # Errors
/// Empty, longer than [`MAX_CHANNEL`] bytes, or with control characters.
pub fn check_channel(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_CHANNEL || name.chars().any(char::is_control) {
        return Err(format!(
            "a channel's name is 1 to {MAX_CHANNEL} bytes without control characters"
        ));
    }
    Ok(())
}

/// A publish request (Pushpin's format, with `connection` as well as `channel`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    items: Vec<Item>,
}

/// One item of a publish.
#[derive(Debug, Deserialize)]
struct Item {
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    connection: Option<String>,
    /// Pushpin's item id (kept for its libraries; not used).
    #[serde(default)]
    #[allow(dead_code)]
    id: Option<String>,
    formats: Formats,
}

/// An item's formats: only `ws-message` means anything to Tern (an item with
/// `http-response` or `http-stream` only is refused).
#[derive(Debug, Deserialize)]
struct Formats {
    #[serde(rename = "ws-message")]
    ws_message: Option<WsMessage>,
}

/// Pushpin's `ws-message` format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default, rename = "content-bin")]
    content_bin: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
}

/// Largest message a publish sends.
pub const MAX_PUBLISHED: usize = 1 << 20;

/// Longest publish a guest may make (a message of [`MAX_PUBLISHED`] bytes in base64, and
/// room for the rest).
pub const MAX_PUBLISH_BODY: usize = 2 << 20;

impl Publish {
    /// The body of a publish read: each item's target and message.
    ///
    /// # Errors
    /// What is wrong, naming the item.
    pub fn read(body: &[u8]) -> Result<Vec<(Target, Push)>, String> {
        let p: Self =
            serde_json::from_slice(body).map_err(|e| format!("the publish is not valid: {e}"))?;
        if p.items.is_empty() {
            return Err("the publish has no items".into());
        }
        p.items
            .into_iter()
            .enumerate()
            .map(|(i, item)| item.read().map_err(|e| format!("items[{i}]: {e}")))
            .collect()
    }
}

impl Item {
    fn read(self) -> Result<(Target, Push), String> {
        let target = match (self.channel, self.connection) {
            (Some(c), None) => {
                check_channel(&c)?;
                Target::Channel(c)
            }
            (None, Some(id)) => Target::Connection(id),
            _ => return Err("name one of `channel` and `connection`".into()),
        };
        let m = self
            .formats
            .ws_message
            .ok_or("no `ws-message` format (the only one WebSockets use)")?;
        Ok((target, m.read()?))
    }
}

impl WsMessage {
    /// The message it sends.
    ///
    /// # Errors
    /// Both or neither content, bad base64, a close code nobody may send, an unknown action.
    pub fn read(self) -> Result<Push, String> {
        match self.action.as_deref() {
            Some("close") => {
                let code = self.code.unwrap_or(1000);
                if !super::endpoint::may_be_sent(code) {
                    return Err(format!("close code {code} may not be sent"));
                }
                let reason = self.reason.unwrap_or_default();
                if reason.len() > 123 {
                    return Err("a close reason is at most 123 bytes".into());
                }
                Ok(Push::Close(code, Bytes::from(reason)))
            }
            None | Some("send") => {
                let push = match (self.content, self.content_bin) {
                    (Some(text), None) => Push::Text(Bytes::from(text)),
                    (None, Some(b64)) => Push::Binary(Bytes::from(
                        base64::engine::general_purpose::STANDARD
                            .decode(b64)
                            .map_err(|e| format!("`content-bin` is not base64: {e}"))?,
                    )),
                    _ => return Err("give one of `content` and `content-bin`".into()),
                };
                let len = match &push {
                    Push::Text(b) | Push::Binary(b) | Push::Close(_, b) => b.len(),
                };
                if len > MAX_PUBLISHED {
                    return Err(format!(
                        "a published message is at most {MAX_PUBLISHED} bytes"
                    ));
                }
                Ok(push)
            }
            Some(other) => Err(format!(
                "action {other:?} is not one of \"send\" and \"close\""
            )),
        }
    }
}

/// `items` in the publish format (sent on to the other replicas of a fleet).
pub fn to_json(items: &[(Target, Push)]) -> serde_json::Value {
    let items: Vec<serde_json::Value> = items
        .iter()
        .map(|(to, push)| {
            let message = match push {
                Push::Text(t) => {
                    serde_json::json!({ "content": String::from_utf8_lossy(t) })
                }
                Push::Binary(b) => serde_json::json!({
                    "content-bin": base64::engine::general_purpose::STANDARD.encode(b)
                }),
                Push::Close(code, reason) => serde_json::json!({
                    "action": "close", "code": code, "reason": String::from_utf8_lossy(reason)
                }),
            };
            let mut item = serde_json::json!({ "formats": { "ws-message": message } });
            match to {
                Target::Channel(c) => item["channel"] = c.clone().into(),
                Target::Connection(c) => item["connection"] = c.clone().into(),
            }
            item
        })
        .collect();
    serde_json::json!({ "items": items })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_reaches_the_subscribed_and_no_one_else() {
        let hub = Hub::new();
        let (mut a, mut rx_a) = hub.join("chat", "a");
        let (mut b, mut rx_b) = hub.join("chat", "b");
        let (mut other, mut rx_o) = hub.join("other", "o");
        a.subscribe("room").unwrap();
        b.subscribe("room").unwrap();
        other.subscribe("room").unwrap();
        let hi = Push::Text(Bytes::from_static(b"hi"));
        let room = Target::Channel("room".into());
        assert_eq!(hub.publish("chat", &room, &hi).delivered, 2);
        assert_eq!(rx_a.try_recv().unwrap(), hi);
        assert_eq!(rx_b.try_recv().unwrap(), hi);
        assert!(
            rx_o.try_recv().is_err(),
            "another tenant's channel of that name"
        );
        b.unsubscribe("room");
        assert_eq!(hub.publish("chat", &room, &hi).delivered, 1);
        let to_b = Target::Connection("b".into());
        assert_eq!(hub.publish("chat", &to_b, &hi).delivered, 1);
        assert_eq!(hub.publish("other", &to_b, &hi).delivered, 0);
        drop(a);
        drop(b);
        assert_eq!(hub.publish("chat", &room, &hi).delivered, 0);
        assert!(hub.tenants.lock().unwrap().get("chat").is_none());
        drop(other);
        assert!(hub.tenants.lock().unwrap().is_empty());
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_subscriptions_are_bounded() {
        let hub = Hub::new();
        let (mut a, _rx) = hub.join("t", "a");
        a.subscribe("c").unwrap();
        let m = Push::Binary(Bytes::from_static(b"x"));
        let c = Target::Channel("c".into());
        for _ in 0..QUEUE {
            assert_eq!(hub.publish("t", &c, &m).delivered, 1);
        }
        assert_eq!(
            hub.publish("t", &c, &m),
            Published {
                delivered: 0,
                dropped: 1
            }
        );
        for i in 1..MAX_SUBSCRIPTIONS {
            a.subscribe(&format!("c{i}")).unwrap();
        }
        assert!(a.subscribe("one-more").is_err());
        assert!(a.subscribe("c").is_ok(), "already subscribed");
        assert!(a.subscribe("").is_err());
        assert!(a.subscribe(&"x".repeat(MAX_CHANNEL + 1)).is_err());
    }

    #[test]
    fn pushpins_publish_format_is_read_and_mistakes_are_named() {
        let items = Publish::read(
            br#"{"items": [
                {"channel": "room", "id": "1", "formats": {"ws-message": {"content": "hi"}}},
                {"connection": "c1", "formats": {"ws-message": {"content-bin": "AAE="}}},
                {"channel": "room", "formats": {"ws-message": {"action": "close", "code": 4000}}}
            ]}"#,
        )
        .unwrap();
        assert_eq!(items[0].1, Push::Text(Bytes::from_static(b"hi")));
        assert_eq!(items[1].0, Target::Connection("c1".into()));
        assert_eq!(items[1].1, Push::Binary(Bytes::from_static(&[0, 1])));
        assert_eq!(items[2].1, Push::Close(4000, Bytes::new()));
        // What is sent on to the other replicas reads back the same.
        let again = Publish::read(to_json(&items).to_string().as_bytes()).unwrap();
        assert_eq!(again, items);
        let bad = |b: &str| Publish::read(b.as_bytes()).unwrap_err();
        assert!(bad(r#"{"items": []}"#).contains("no items"));
        assert!(bad("nope").contains("not valid"));
        assert!(
            bad(r#"{"items": [{"formats": {"ws-message": {"content": "x"}}}]}"#)
                .contains("items[0]: name one of")
        );
        assert!(
            bad(r#"{"items": [{"channel": "c", "formats": {"http-stream": {"content": "x"}}}]}"#)
                .contains("no `ws-message`")
        );
        assert!(
            bad(
                r#"{"items": [{"channel": "c", "formats": {"ws-message": {"content-bin": "!"}}}]}"#
            )
            .contains("not base64")
        );
        assert!(
            bad(r#"{"items": [{"channel": "c", "formats": {"ws-message": {"action": "close", "code": 1005}}}]}"#)
                .contains("1005 may not be sent")
        );
    }
}
