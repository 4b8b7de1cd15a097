//! An events-mode WebSocket guest (a chat room and an echo): an `OPEN` with `?token=bad` is
//! refused `401`; otherwise accepted with GRIP (unless `?grip=no`), subscribed to `?room=`
//! (`lobby` by default), with the metadata `user` set from `?user=`. Each text message:
//! - `say X`: publishes `USER: X` to the room (every subscriber, this one too);
//! - `whoami`: answers the `Meta-User` header it was sent;
//! - `id`: answers its `Connection-Id`;
//! - `close`: answers `bye`, then closes with `4000 done`; `drop`: `DISCONNECT`;
//! - `trap`: traps (the connection gets `1011`);
//! - `count`: answers how many events came in this batch;
//! - anything else: echoed as it came.
//!
//! Binary messages are echoed. A `CLOSE` is answered with a `CLOSE` of the same code. With
//! GRIP, every `DISCONNECT` and `CLOSE` is published to the channel `gone` as `gone USER`, so a
//! test sees that the guest was told.
//!
//! A request that is not a batch of events (a webhook) publishes its body with the host call:
//! to the channel `?room=` (`lobby`), or the connection `?to=`; as binary with `?binary=1`, a
//! close with `?close=CODE`, the body as it is (Pushpin's JSON) with `?json=1`; `?times=N`
//! times. It answers `delivered N` (the sum), or `400` with the first error's code and message.
use std::io::Read;

use tern_sdk::websocket::{self, Event, Message};
use tern_test_guests::{query_number, query_text};

/// Publishes the request's `body` as the query asks (see the module docs).
fn notify(body: &[u8]) -> tern_sdk::http::Response<Vec<u8>> {
    let text = String::from_utf8_lossy(body);
    let message = if query_text("binary").is_some() {
        Message::Binary(body)
    } else if let Some(code) = query_text("close") {
        Message::Close(code.parse().expect("a close code"), &text)
    } else {
        Message::Text(&text)
    };
    let mut delivered = 0;
    for _ in 0..query_number("times", 1) {
        let done = if query_text("json").is_some() {
            websocket::publish_json(&text)
        } else if let Some(id) = query_text("to") {
            websocket::publish_to_connection(&id, message)
        } else {
            let room = query_text("room").unwrap_or_else(|| "lobby".into());
            websocket::publish_to_channel(&room, message)
        };
        match done {
            Ok(n) => delivered += n,
            Err(e) => {
                return tern_sdk::http::Response::builder()
                    .status(400)
                    .body(
                        format!("{} {}\n", tern_sdk::abi::errno::name(e.code), e.message)
                            .into_bytes(),
                    )
                    .expect("a valid answer");
            }
        }
    }
    tern_sdk::http::Response::new(format!("delivered {delivered}\n").into_bytes())
}

fn main() {
    tern_sdk::serve(|req| {
        if req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            != Some(websocket::MEDIA_TYPE)
        {
            let mut body = Vec::new();
            req.into_body().read_to_end(&mut body).expect("the body");
            return notify(&body);
        }
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        let (user, id) = (header("meta-user"), header("connection-id"));
        let grip = query_text("grip").as_deref() != Some("no");
        let room = query_text("room").unwrap_or_else(|| "lobby".into());
        let mut body = Vec::new();
        let mut r = req.into_body();
        r.read_to_end(&mut body).expect("the body");
        let events = websocket::parse(&body).expect("events");
        let say = |t: &str| {
            if grip {
                websocket::message(t)
            } else {
                Event::Text(t.to_string())
            }
        };
        let mut out = Vec::new();
        let mut resp_user = None;
        let n = events.len();
        for e in events {
            match e {
                Event::Open => {
                    if query_text("token").as_deref() == Some("bad") {
                        return tern_sdk::http::Response::builder()
                            .status(401)
                            .header("content-type", "text/plain")
                            .body(b"bad token\n".to_vec())
                            .expect("a valid answer");
                    }
                    out.push(Event::Open);
                    if grip {
                        out.push(websocket::subscribe(&room));
                    }
                    resp_user = query_text("user");
                    out.push(say("welcome"));
                }
                Event::Text(t) => match t.as_str() {
                    "whoami" => out.push(say(&user)),
                    "id" => out.push(say(&id)),
                    "close" => {
                        out.push(say("bye"));
                        out.push(Event::Close(Some(4000), "done".into()));
                    }
                    "drop" => out.push(Event::Disconnect),
                    "trap" => panic!("asked to trap"),
                    "count" => out.push(say(&n.to_string())),
                    t if t.starts_with("say ") => {
                        out.push(websocket::publish(&room, &format!("{user}: {}", &t[4..])));
                    }
                    _ => out.push(say(&t)),
                },
                Event::Binary(b) => out.push(if grip {
                    let mut m = b"m:".to_vec();
                    m.extend_from_slice(&b);
                    Event::Binary(m)
                } else {
                    Event::Binary(b)
                }),
                Event::Close(code, _) => {
                    if grip {
                        out.push(websocket::publish("gone", &format!("gone {user}")));
                    }
                    out.push(Event::Close(code, String::new()));
                }
                Event::Disconnect if grip => {
                    out.push(websocket::publish("gone", &format!("gone {user}")));
                }
                Event::Disconnect | Event::Ping(_) | Event::Pong(_) => {}
            }
        }
        let mut resp = websocket::answer(&out, grip);
        if let Some(u) = resp_user {
            resp.headers_mut()
                .insert("set-meta-user", u.parse().expect("a header value"));
        }
        resp
    });
}
