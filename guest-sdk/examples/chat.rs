//! `chat`: a chat room over WebSockets, on a tenant with `[tenant.websocket] mode = "events"`.
//!
//! The server holds each client's WebSocket; this guest runs afresh for each batch of its
//! events and keeps nothing itself: the room is a channel the connection is subscribed to, the
//! nickname is the connection's metadata (sent back as `Meta-Nick` with every batch), and a
//! message said is published to the room, reaching everyone in it on every replica.
//!
//! `ws://HOST/chat?room=NAME&nick=NAME` (both optional); send text to say it, `/nick NEW` to
//! change your name.
//!
//! Build: `cargo build -p tern-sdk --example chat --target wasm32-wasip1 --profile guest`

use std::io::Read;

use tern_sdk::Body;
use tern_sdk::http::{Request, Response};
use tern_sdk::websocket::{self, Event};

/// The value of `name=` in the query, if any (letters, digits, `-` and `_` kept).
fn query(req: &Request<Body>, name: &str) -> Option<String> {
    let q = req.uri().query()?;
    let v = q
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?;
    let v: String = v
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(32)
        .collect();
    (!v.is_empty()).then_some(v)
}

fn chat(req: Request<Body>) -> Response<Vec<u8>> {
    let room = query(&req, "room").unwrap_or_else(|| "lobby".into());
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let id = header("connection-id").unwrap_or_default();
    let mut nick = header("meta-nick")
        .or_else(|| query(&req, "nick"))
        .unwrap_or_else(|| format!("guest-{}", &id[..id.len().min(4)]));
    // Anything but the server's events (a plain GET of the path, say) is not a WebSocket.
    if header("content-type").as_deref() != Some(websocket::MEDIA_TYPE) {
        return Response::builder()
            .status(400)
            .body(b"this path takes WebSockets: ws://HOST/chat\n".to_vec())
            .unwrap();
    }
    let mut body = Vec::new();
    let events = match req.into_body().read_to_end(&mut body) {
        Ok(_) => websocket::parse(&body).unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let mut out = Vec::new();
    for event in events {
        match event {
            Event::Open => {
                out.push(Event::Open);
                out.push(websocket::subscribe(&room));
                out.push(websocket::set_meta("nick", &nick));
                out.push(websocket::message(&format!(
                    "welcome to {room}, {nick} (/nick NAME to change your name)"
                )));
                out.push(websocket::publish(&room, &format!("{nick} joined")));
            }
            Event::Text(text) => {
                if let Some(new) = text.strip_prefix("/nick ") {
                    let new: String = new.trim().chars().take(32).collect();
                    out.push(websocket::publish(&room, &format!("{nick} is now {new}")));
                    out.push(websocket::set_meta("nick", &new));
                    nick = new;
                } else {
                    out.push(websocket::publish(&room, &format!("{nick}: {text}")));
                }
            }
            Event::Close(code, _) => {
                out.push(websocket::publish(&room, &format!("{nick} left")));
                out.push(Event::Close(code, String::new()));
            }
            Event::Disconnect => out.push(websocket::publish(&room, &format!("{nick} left"))),
            Event::Binary(_) | Event::Ping(_) | Event::Pong(_) => {}
        }
    }
    websocket::answer(&out, true)
}

fn main() {
    tern_sdk::serve(chat);
}
