//! Autobahn|Testsuite's cases for a WebSocket server, sections 1-7 and 9 (framing, pings,
//! reserved bits, opcodes, fragmentation, UTF-8, close handling, limits), ported to raw frames
//! (the suite itself runs on Python 2 only) and run against both modes: the `ws_events` echo
//! guest, where Tern ends the socket itself, and the `ws_gate` guest handing the socket to
//! Python's `websockets` echo server, where Tern copies frames and its limits apply. Each case
//! writes what a client would (masked frames, maybe cut into pieces or with pauses), then
//! reads every message back and the server's close; it passes only with Autobahn's "OK"
//! outcome (the "NON-STRICT" one, a fragmented message's echo lost, fails here).

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TestServer, test_guest};

const FIN: u8 = 0x80;
const CONT: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;
const MASK: [u8; 4] = [0x9c, 0x21, 0x5e, 0x07];
/// A close frame without a code, as a code (RFC 6455 §7.4.1: "no status received").
const NO_CODE: u16 = 1005;

/// A client's frame: `b0` is FIN, RSV and opcode; the payload masked.
pub(crate) fn frame(b0: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![b0];
    match payload.len() {
        n @ 0..=125 => f.push(0x80 | u8::try_from(n).unwrap()),
        n @ 126..=0xFFFF => {
            f.push(0x80 | 126);
            f.extend(u16::try_from(n).unwrap().to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend((n as u64).to_be_bytes());
        }
    }
    f.extend(MASK);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    f
}

fn text(payload: impl AsRef<[u8]>) -> Vec<u8> {
    frame(FIN | TEXT, payload.as_ref())
}

fn binary(payload: impl AsRef<[u8]>) -> Vec<u8> {
    frame(FIN | BINARY, payload.as_ref())
}

fn ping(payload: impl AsRef<[u8]>) -> Vec<u8> {
    frame(FIN | PING, payload.as_ref())
}

fn close(code: u16, reason: impl AsRef<[u8]>) -> Vec<u8> {
    let mut p = code.to_be_bytes().to_vec();
    p.extend_from_slice(reason.as_ref());
    frame(FIN | CLOSE, &p)
}

/// `payload` cut into frames of `size` bytes (a text or binary message's fragments).
fn fragments(opcode: u8, payload: &[u8], size: usize) -> Vec<u8> {
    let chunks: Vec<&[u8]> = if payload.is_empty() {
        vec![&[]]
    } else {
        payload.chunks(size).collect()
    };
    let last = chunks.len() - 1;
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let op = if i == 0 { opcode } else { CONT };
        out.extend(frame(if i == last { FIN | op } else { op }, c));
    }
    out
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// What a case writes: bytes (one write each), or a pause.
#[derive(Clone)]
enum Step {
    Write(Vec<u8>),
    Pause(u64),
}

/// What comes back from the server before its close: a whole message, or a pong.
#[derive(Clone, PartialEq)]
enum Got {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Pong(Vec<u8>),
}

impl fmt::Debug for Got {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = |b: &[u8]| {
            let s = String::from_utf8_lossy(&b[..b.len().min(40)]).into_owned();
            if b.len() > 40 {
                format!("{s:?}... ({} bytes)", b.len())
            } else {
                format!("{s:?}")
            }
        };
        match self {
            Got::Text(b) => write!(f, "Text({})", short(b)),
            Got::Binary(b) => write!(f, "Binary({})", short(b)),
            Got::Pong(b) => write!(f, "Pong({})", short(b)),
        }
    }
}

struct Case {
    id: String,
    steps: Vec<Step>,
    /// The messages and pongs back, in order, before the close.
    expect: Vec<Got>,
    /// The close codes the server may answer with.
    codes: Vec<u16>,
    /// Whether the client closes (`1000`) once it has what it expects, as Autobahn's does.
    closes: bool,
}

/// A case the server must answer with `expect`, then close normally when the client does.
fn ok(id: &str, steps: Vec<Step>, expect: Vec<Got>) -> Case {
    Case {
        id: id.into(),
        steps,
        expect,
        codes: vec![1000],
        closes: true,
    }
}

/// A case the server must answer with `expect`, then fail with one of `codes`.
fn fails(id: &str, steps: Vec<Step>, expect: Vec<Got>, codes: &[u16]) -> Case {
    Case {
        id: id.into(),
        steps,
        expect,
        codes: codes.to_vec(),
        closes: false,
    }
}

fn w(bytes: Vec<u8>) -> Step {
    Step::Write(bytes)
}

/// `bytes` written in pieces of `size`.
fn chopped(bytes: &[u8], size: usize) -> Vec<Step> {
    bytes
        .chunks(size)
        .map(|c| Step::Write(c.to_vec()))
        .collect()
}

fn t(s: impl AsRef<[u8]>) -> Got {
    Got::Text(s.as_ref().to_vec())
}

/// Sections 1-7 and 9, case by case (ids as Autobahn numbers them; `9.x.limit+1` and the
/// like are this suite's own, at the tenant's 1 MiB message limit).
fn cases() -> Vec<Case> {
    let mut c = Vec::new();
    // 1: framing. Text and binary of lengths around the two length encodings' edges.
    let lengths = [0, 125, 126, 127, 128, 65535, 65536];
    for (i, n) in lengths.iter().enumerate() {
        let p = vec![b'*'; *n];
        c.push(ok(
            &format!("1.1.{}", i + 1),
            vec![w(text(&p))],
            vec![t(&p)],
        ));
        let b = vec![0xfe; *n];
        c.push(ok(
            &format!("1.2.{}", i + 1),
            vec![w(binary(&b))],
            vec![Got::Binary(b)],
        ));
    }
    let p = vec![b'*'; 65536];
    c.push(ok("1.1.8", chopped(&text(&p), 997), vec![t(&p)]));
    let b = vec![0xfe; 65536];
    c.push(ok("1.2.8", chopped(&binary(&b), 997), vec![Got::Binary(b)]));

    // 2: pings and pongs.
    let pong = |p: &[u8]| Got::Pong(p.to_vec());
    c.push(ok("2.1", vec![w(ping(""))], vec![pong(b"")]));
    c.push(ok(
        "2.2",
        vec![w(ping("Hello, world!"))],
        vec![pong(b"Hello, world!")],
    ));
    let bin = hex("00 ff fe fd fc fb 00 ff");
    c.push(ok("2.3", vec![w(ping(&bin))], vec![pong(&bin)]));
    let p125 = vec![0xfe; 125];
    c.push(ok("2.4", vec![w(ping(&p125))], vec![pong(&p125)]));
    c.push(fails(
        "2.5",
        vec![w(ping(vec![0xfe; 126]))],
        vec![],
        &[1002],
    ));
    c.push(ok("2.6", chopped(&ping(&p125), 1), vec![pong(&p125)]));
    c.push(ok("2.7", vec![w(frame(FIN | PONG, b""))], vec![]));
    c.push(ok(
        "2.8",
        vec![w(frame(FIN | PONG, b"unsolicited pong payload"))],
        vec![],
    ));
    c.push(ok(
        "2.9",
        vec![
            w(frame(FIN | PONG, b"unsolicited pong payload")),
            w(ping("ping payload")),
        ],
        vec![pong(b"ping payload")],
    ));
    for (id, pause) in [("2.10", 0), ("2.11", 1)] {
        let mut steps = Vec::new();
        let mut expect = Vec::new();
        for i in 0..10 {
            let p = format!("payload-{i}");
            steps.push(w(ping(&p)));
            if pause > 0 {
                steps.push(Step::Pause(pause));
            }
            expect.push(pong(p.as_bytes()));
        }
        c.push(ok(id, steps, expect));
    }

    // 3: reserved bits set, nothing negotiated: fail (after answering what came before).
    let hello = "Hello, world!";
    c.push(fails(
        "3.1",
        vec![w(frame(FIN | 0x10 | TEXT, hello.as_bytes()))],
        vec![],
        &[1002],
    ));
    for (id, rsv, pause) in [("3.2", 0x20, 0), ("3.3", 0x30, 100)] {
        let mut steps = vec![w(text(hello))];
        if pause > 0 {
            steps.push(Step::Pause(pause));
        }
        steps.push(w(frame(FIN | rsv | TEXT, hello.as_bytes())));
        steps.push(w(ping("")));
        c.push(fails(id, steps, vec![t(hello)], &[1002]));
    }
    c.push(fails(
        "3.4",
        vec![
            w(text(hello)),
            Step::Pause(100),
            w(frame(FIN | 0x40 | TEXT, hello.as_bytes())),
            w(ping("")),
        ],
        vec![t(hello)],
        &[1002],
    ));
    c.push(fails(
        "3.5",
        vec![w(frame(
            FIN | 0x50 | BINARY,
            &hex("00 ff fe fd fc fb 00 ff"),
        ))],
        vec![],
        &[1002],
    ));
    c.push(fails(
        "3.6",
        vec![w(frame(FIN | 0x60 | PING, hello.as_bytes()))],
        vec![],
        &[1002],
    ));
    c.push(fails(
        "3.7",
        vec![w(frame(FIN | 0x70 | CLOSE, &1000u16.to_be_bytes()))],
        vec![],
        &[1002],
    ));

    // 4: opcodes nobody defined (data 3-7, control 11-15).
    for (section, opcodes) in [("4.1", [3u8, 4, 5, 6, 7]), ("4.2", [11, 12, 13, 14, 15])] {
        for (i, op) in opcodes.into_iter().enumerate() {
            let id = format!("{section}.{}", i + 1);
            let (steps, expect) = match i {
                0 => (vec![w(frame(FIN | op, b""))], vec![]),
                1 => (vec![w(frame(FIN | op, b"reserved opcode payload"))], vec![]),
                _ => (
                    vec![
                        w(text(hello)),
                        w(frame(FIN | op, if i == 2 { b"" } else { b"payload" })),
                        w(ping("")),
                    ],
                    vec![t(hello)],
                ),
            };
            c.push(fails(&id, steps, expect, &[1002]));
        }
    }

    // 5: fragmentation.
    let (f1, f2) = (b"fragment1".as_slice(), b"fragment2".as_slice());
    c.push(fails(
        "5.1",
        vec![w(frame(PING, f1)), w(frame(FIN | CONT, f2))],
        vec![],
        &[1002],
    ));
    c.push(fails(
        "5.2",
        vec![w(frame(PONG, f1)), w(frame(FIN | CONT, f2))],
        vec![],
        &[1002],
    ));
    let frags = [frame(TEXT, f1), frame(FIN | CONT, f2)].concat();
    c.push(ok(
        "5.3",
        vec![w(frags.clone())],
        vec![t("fragment1fragment2")],
    ));
    c.push(ok(
        "5.4",
        vec![w(frame(TEXT, f1)), w(frame(FIN | CONT, f2))],
        vec![t("fragment1fragment2")],
    ));
    c.push(ok(
        "5.5",
        vec![
            w(frame(TEXT, f1)),
            Step::Pause(100),
            w(frame(FIN | CONT, f2)),
        ],
        vec![t("fragment1fragment2")],
    ));
    let with_ping = [frame(TEXT, f1), ping("ping payload"), frame(FIN | CONT, f2)];
    let answer = vec![pong(b"ping payload"), t("fragment1fragment2")];
    c.push(ok("5.6", vec![w(with_ping.concat())], answer.clone()));
    c.push(ok(
        "5.7",
        with_ping
            .iter()
            .flat_map(|f| [w(f.clone()), Step::Pause(100)])
            .collect(),
        answer.clone(),
    ));
    c.push(ok("5.8", chopped(&with_ping.concat(), 1), answer));
    // A continuation with nothing to continue.
    for (id, first_fin) in [("5.9", FIN), ("5.12", 0)] {
        let bad = [frame(first_fin | CONT, f1), text(f2)];
        c.push(fails(id, vec![w(bad.concat())], vec![], &[1002]));
        let next = |n: u32| format!("{}.{}", &id[..1], id[2..].parse::<u32>().unwrap() + n);
        c.push(fails(
            &next(1),
            bad.iter().map(|f| w(f.clone())).collect(),
            vec![],
            &[1002],
        ));
        c.push(fails(&next(2), chopped(&bad.concat(), 1), vec![], &[1002]));
    }
    c.push(fails(
        "5.15",
        vec![w([
            frame(TEXT, f1),
            frame(FIN | CONT, f2),
            frame(CONT, b"fragment3"),
            frame(FIN | TEXT, b"fragment4"),
        ]
        .concat())],
        vec![t("fragment1fragment2")],
        &[1002],
    ));
    for (id, fin) in [("5.16", 0), ("5.17", FIN)] {
        let once = [
            frame(fin | CONT, f1),
            frame(TEXT, f2),
            frame(FIN | CONT, b"fragment3"),
        ]
        .concat();
        c.push(fails(
            id,
            vec![w([once.clone(), once].concat())],
            vec![],
            &[1002],
        ));
    }
    c.push(fails(
        "5.18",
        vec![w([frame(TEXT, f1), frame(FIN | TEXT, f2)].concat())],
        vec![],
        &[1002],
    ));
    for (id, pause) in [("5.19", 0), ("5.20", 1000)] {
        let steps = vec![
            w(frame(TEXT, f1)),
            w(frame(CONT, f2)),
            w(ping("pongme 1!")),
            w(frame(CONT, b"fragment3")),
            Step::Pause(pause.max(1)),
            w(frame(CONT, b"fragment4")),
            w(ping("pongme 2!")),
            w(frame(FIN | CONT, b"fragment5")),
        ];
        c.push(ok(
            id,
            steps,
            vec![
                pong(b"pongme 1!"),
                pong(b"pongme 2!"),
                t("fragment1fragment2fragment3fragment4fragment5"),
            ],
        ));
    }

    // 6: UTF-8 in text messages, whole and cut into fragments at every byte.
    c.push(ok("6.1.1", vec![w(text(""))], vec![t("")]));
    c.push(ok(
        "6.1.2",
        vec![w([
            frame(TEXT, b""),
            frame(CONT, b""),
            frame(FIN | CONT, b""),
        ]
        .concat())],
        vec![t("")],
    ));
    c.push(ok(
        "6.1.3",
        vec![w([
            frame(TEXT, b""),
            frame(CONT, b"middle frame payload"),
            frame(FIN | CONT, b""),
        ]
        .concat())],
        vec![t("middle frame payload")],
    ));
    let valid = "Hello-\u{b5}@\u{df}\u{f6}\u{e4}\u{fc}\u{e0}\u{e1}-UTF-8!!";
    c.push(ok("6.2.1", vec![w(text(valid))], vec![t(valid)]));
    c.push(ok(
        "6.2.2",
        vec![w([
            frame(TEXT, &valid.as_bytes()[..7]),
            frame(FIN | CONT, &valid.as_bytes()[7..]),
        ]
        .concat())],
        vec![t(valid)],
    ));
    c.push(ok(
        "6.2.3",
        vec![w(fragments(TEXT, valid.as_bytes(), 1))],
        vec![t(valid)],
    ));
    let kosme = hex("ce ba e1 bd b9 cf 83 ce bc ce b5");
    c.push(ok(
        "6.2.4",
        vec![w(fragments(TEXT, &kosme, 1))],
        vec![t(&kosme)],
    ));
    let edited = [kosme.clone(), hex("ed a0 80"), b"edited".to_vec()].concat();
    c.push(fails("6.3.1", vec![w(text(&edited))], vec![], &[1007]));
    c.push(fails(
        "6.3.2",
        vec![w(fragments(TEXT, &edited, 1))],
        vec![],
        &[1007],
    ));
    // Fail fast: the invalid bytes come before the message ends.
    for (id, first, bad) in [
        ("6.4.1", kosme.clone(), hex("f4 90 80 80")),
        (
            "6.4.2",
            [kosme.clone(), hex("f4")].concat(),
            hex("90 80 80"),
        ),
        ("6.4.3", kosme.clone(), hex("f4 90 80 80")),
        ("6.4.4", kosme.clone(), hex("f4 90")),
    ] {
        c.push(fails(
            id,
            vec![
                w(frame(TEXT, &first)),
                w(frame(CONT, &bad)),
                Step::Pause(500),
                w(frame(FIN | CONT, b"edited")),
            ],
            vec![],
            &[1007],
        ));
    }
    for (i, size) in [1, 2, 3, 4, 5].into_iter().enumerate() {
        c.push(ok(
            &format!("6.5.{}", i + 1),
            vec![w(fragments(TEXT, &kosme, size))],
            vec![t(&kosme)],
        ));
    }
    // Each prefix of "κόσμε": whole characters pass, cut ones fail.
    let whole = [2, 5, 7, 9, 11];
    for n in 1..=kosme.len() {
        let id = format!("6.6.{n}");
        let p = &kosme[..n];
        c.push(if whole.contains(&n) {
            ok(&id, vec![w(text(p))], vec![t(p)])
        } else {
            fails(&id, vec![w(text(p))], vec![], &[1007])
        });
    }
    // 6.7-6.23: Markus Kuhn's UTF-8 decoder stress test, one message each.
    let stress: &[(&str, &[&str], bool)] = &[
        ("6.7", &["00", "c2 80", "e0 a0 80", "f0 90 80 80"], true),
        ("6.8", &["f8 88 80 80 80", "fc 84 80 80 80 80"], false),
        ("6.9", &["7f", "df bf", "ef bf bf", "f4 8f bf bf"], true),
        (
            "6.10",
            &["f7 bf bf bf", "fb bf bf bf bf", "fd bf bf bf bf bf"],
            false,
        ),
        (
            "6.11",
            &["ed 9f bf", "ee 80 80", "ef bf bd", "f4 8f bf bf"],
            true,
        ),
        ("6.11.5", &["f4 90 80 80"], false),
        (
            "6.12",
            &[
                "80",
                "bf",
                "80 bf",
                "80 bf 80",
                "80 bf 80 bf",
                "80 bf 80 bf 80",
                "80 bf 80 bf 80 bf",
                "80 81 82 83 84 85 86 87 88 89 8a 8b 8c 8d 8e 8f",
            ],
            false,
        ),
        (
            "6.13",
            &[
                "c0 20 c1 20 c2 20",
                "e0 20 e1 20",
                "f0 20 f1 20",
                "f8 20",
                "fc 20",
            ],
            false,
        ),
        (
            "6.14",
            &[
                "c0",
                "e0 80",
                "f0 80 80",
                "f8 80 80 80",
                "fc 80 80 80 80",
                "df",
                "ef bf",
                "f7 bf bf",
                "fb bf bf bf",
                "fd bf bf bf bf",
            ],
            false,
        ),
        (
            "6.15",
            &[
                "c0 e0 80 f0 80 80 f8 80 80 80 fc 80 80 80 80 df ef bf f7 bf bf fb bf bf bf fd bf bf bf bf",
            ],
            false,
        ),
        ("6.16", &["fe", "ff", "fe fe ff ff"], false),
        (
            "6.17",
            &[
                "c0 af",
                "e0 80 af",
                "f0 80 80 af",
                "f8 80 80 80 af",
                "fc 80 80 80 80 af",
            ],
            false,
        ),
        (
            "6.18",
            &[
                "c1 bf",
                "e0 9f bf",
                "f0 8f bf bf",
                "f8 87 bf bf bf",
                "fc 83 bf bf bf bf",
            ],
            false,
        ),
        (
            "6.19",
            &[
                "c0 80",
                "e0 80 80",
                "f0 80 80 80",
                "f8 80 80 80 80",
                "fc 80 80 80 80 80",
            ],
            false,
        ),
        (
            "6.20",
            &[
                "ed a0 80", "ed ad bf", "ed ae 80", "ed af bf", "ed b0 80", "ed be 80", "ed bf bf",
            ],
            false,
        ),
        (
            "6.21",
            &[
                "ed a0 80 ed b0 80",
                "ed a0 80 ed bf bf",
                "ed ad bf ed b0 80",
                "ed ad bf ed bf bf",
                "ed ae 80 ed b0 80",
                "ed ae 80 ed bf bf",
                "ed af bf ed b0 80",
                "ed af bf ed bf bf",
            ],
            false,
        ),
        (
            "6.22",
            &[
                "ef bf be",
                "ef bf bf",
                "f0 9f bf be",
                "f0 9f bf bf",
                "f0 af bf be",
                "f4 8f bf be",
                "f4 8f bf bf",
                "ef b7 90",
                "ef b7 af",
            ],
            true,
        ),
        (
            "6.23",
            &[
                "ef bf bd",
                "61 ef bf bd 62",
                "ce ba e1 bd b9 cf 83 ce bc ce b5 ef bf bd",
            ],
            true,
        ),
    ];
    for (section, samples, good) in stress {
        for (i, s) in samples.iter().enumerate() {
            let id = format!("{section}.{}", i + 1);
            let p = hex(s);
            c.push(if *good {
                ok(&id, vec![w(text(&p))], vec![t(&p)])
            } else {
                fails(&id, vec![w(text(&p))], vec![], &[1007])
            });
        }
    }

    // 7: the closing handshake.
    c.push(ok("7.1.1", vec![w(text(hello))], vec![t(hello)]));
    c.push(fails(
        "7.1.2",
        vec![w(close(1000, "")), w(close(1000, ""))],
        vec![],
        &[1000],
    ));
    c.push(fails(
        "7.1.3",
        vec![w(close(1000, "")), w(ping(""))],
        vec![],
        &[1000],
    ));
    c.push(fails(
        "7.1.4",
        vec![w(close(1000, "")), w(text(hello))],
        vec![],
        &[1000],
    ));
    c.push(fails(
        "7.1.5",
        vec![
            w(frame(TEXT, f1)),
            w(close(1000, "")),
            w(frame(FIN | CONT, f2)),
        ],
        vec![],
        &[1000],
    ));
    c.push(fails(
        "7.3.1",
        vec![w(frame(FIN | CLOSE, b""))],
        vec![],
        &[NO_CODE, 1000],
    ));
    c.push(fails(
        "7.3.2",
        vec![w(frame(FIN | CLOSE, b"a"))],
        vec![],
        &[1002],
    ));
    c.push(fails("7.3.3", vec![w(close(1000, ""))], vec![], &[1000]));
    c.push(fails(
        "7.3.4",
        vec![w(close(1000, "Hello World!"))],
        vec![],
        &[1000],
    ));
    c.push(fails(
        "7.3.5",
        vec![w(close(1000, vec![b'*'; 123]))],
        vec![],
        &[1000],
    ));
    c.push(fails(
        "7.3.6",
        vec![w(close(1000, vec![b'*'; 124]))],
        vec![],
        &[1002],
    ));
    c.push(fails(
        "7.5.1",
        vec![w(close(1000, &edited))],
        vec![],
        &[1007],
    ));
    let valid_codes = [
        1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999,
    ];
    for (i, code) in valid_codes.into_iter().enumerate() {
        c.push(fails(
            &format!("7.7.{}", i + 1),
            vec![w(close(code, ""))],
            vec![],
            &[code, 1000],
        ));
    }
    let invalid_codes = [0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999];
    for (i, code) in invalid_codes.into_iter().enumerate() {
        c.push(fails(
            &format!("7.9.{}", i + 1),
            vec![w(close(code, ""))],
            vec![],
            &[1002],
        ));
    }
    for (i, code) in [5000u16, 65535].into_iter().enumerate() {
        c.push(fails(
            &format!("7.13.{}", i + 1),
            vec![w(close(code, ""))],
            vec![],
            &[1002],
        ));
    }

    // 9: big messages, many frames, many messages (Autobahn's sizes up to the tenant's 1 MiB
    // message limit, then one byte past it).
    let mib = 1 << 20;
    for (i, n) in [64 << 10, 256 << 10, mib].into_iter().enumerate() {
        let p = vec![b'*'; n];
        c.push(ok(
            &format!("9.1.{}", i + 1),
            vec![w(text(&p))],
            vec![t(&p)],
        ));
        let b = vec![0xfe; n];
        c.push(ok(
            &format!("9.2.{}", i + 1),
            vec![w(binary(&b))],
            vec![Got::Binary(b)],
        ));
    }
    c.push(fails(
        "9.1.limit+1",
        vec![w(text(vec![b'*'; mib + 1]))],
        vec![],
        &[1009],
    ));
    c.push(fails(
        "9.2.limit+1",
        vec![w(binary(vec![0xfe; mib + 1]))],
        vec![],
        &[1009],
    ));
    c.push(fails(
        "9.3.limit+1",
        vec![w(fragments(TEXT, &vec![b'*'; mib + 1], 64 << 10))],
        vec![],
        &[1009],
    ));
    let frag_sizes = [
        64,
        256,
        1 << 10,
        4 << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        mib,
    ];
    for (i, size) in frag_sizes.into_iter().enumerate() {
        let p = vec![b'*'; mib];
        c.push(ok(
            &format!("9.3.{}", i + 1),
            vec![w(fragments(TEXT, &p, size))],
            vec![t(&p)],
        ));
        let b = vec![0xfe; mib];
        c.push(ok(
            &format!("9.4.{}", i + 1),
            vec![w(fragments(BINARY, &b, size))],
            vec![Got::Binary(b)],
        ));
    }
    for (i, chop) in [64, 128, 256, 512, 1024, 2048].into_iter().enumerate() {
        let p = vec![b'*'; mib];
        c.push(ok(
            &format!("9.5.{}", i + 1),
            chopped(&text(&p), chop),
            vec![t(&p)],
        ));
    }
    for (i, n) in [0, 16, 64, 256, 1 << 10, 4 << 10].into_iter().enumerate() {
        let p = vec![b'*'; n];
        let b = vec![0xfe; n];
        c.push(ok(
            &format!("9.7.{}", i + 1),
            vec![w(text(&p).repeat(1000))],
            vec![t(&p); 1000],
        ));
        c.push(ok(
            &format!("9.8.{}", i + 1),
            vec![w(binary(&b).repeat(1000))],
            vec![Got::Binary(b); 1000],
        ));
    }
    c
}

/// A frame from the server, checked as a client must (unmasked, no reserved bits, control
/// frames whole and short); `None` at the end of the stream.
pub(crate) async fn read_frame(
    io: &mut (impl AsyncReadExt + Unpin),
    buf: &mut Vec<u8>,
) -> Result<Option<(bool, u8, Vec<u8>)>, String> {
    loop {
        if buf.len() >= 2 {
            let (b0, b1) = (buf[0], buf[1]);
            let (len, at) = match b1 & 0x7F {
                126 if buf.len() >= 4 => (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
                127 if buf.len() >= 10 => (u64::from_be_bytes(buf[2..10].try_into().unwrap()), 10),
                126 | 127 => (u64::MAX, 0),
                n => (u64::from(n), 2),
            };
            if len != u64::MAX && buf.len() as u64 >= at as u64 + len {
                if b1 & 0x80 != 0 {
                    return Err("a masked frame from the server".into());
                }
                if b0 & 0x70 != 0 {
                    return Err(format!("reserved bits from the server: {b0:#x}"));
                }
                let opcode = b0 & 0x0F;
                if opcode >= 8 && (b0 & FIN == 0 || len > 125) {
                    return Err(format!(
                        "a bad control frame from the server: {b0:#x} {len}"
                    ));
                }
                let end = at + usize::try_from(len).unwrap();
                let payload = buf[at..end].to_vec();
                buf.drain(..end);
                return Ok(Some((b0 & FIN != 0, opcode, payload)));
            }
        }
        let mut chunk = [0u8; 65536];
        let n = match tokio::time::timeout(Duration::from_secs(10), io.read(&mut chunk)).await {
            Err(_) => return Err(format!("nothing for 10 s ({} bytes unread)", buf.len())),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(n)) => n,
        };
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(format!(
                    "the stream ended inside a frame ({} bytes)",
                    buf.len()
                ))
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Opens `path` with an HTTP/1.1 upgrade and reads the greeting every test guest sends.
pub(crate) async fn open(addr: SocketAddr, path: &str) -> Result<(TcpStream, Vec<u8>), String> {
    open_with(addr, path, "").await
}

/// [`open`] with more header lines (each ending `\r\n`).
pub(crate) async fn open_with(
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> Result<(TcpStream, Vec<u8>), String> {
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let end = loop {
        let mut chunk = [0u8; 4096];
        let n = tcp.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("closed during the opening: {buf:?}"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    if !head.starts_with("HTTP/1.1 101 ") {
        return Err(format!("not switched: {head}"));
    }
    buf.drain(..end);
    match read_frame(&mut tcp, &mut buf).await? {
        Some((true, TEXT, _)) => Ok((tcp, buf)),
        other => Err(format!("no greeting: {other:?}")),
    }
}

/// Runs one case: what came back, or how it went wrong.
async fn run(addr: SocketAddr, path: &str, case: &Case) -> Result<(), String> {
    let (tcp, mut buf) = open(addr, path).await?;
    let (mut rd, mut wr) = tcp.into_split();
    let steps = case.steps.clone();
    // Told when the expected answers have come (or the server closed): the client's close.
    let (done, answered) = tokio::sync::oneshot::channel::<()>();
    let mut done = Some(done);
    let closes = case.closes;
    // (Written while the answers are read: a server echoing as it reads never waits on us.)
    let writer = tokio::spawn(async move {
        for s in steps {
            match s {
                Step::Write(b) => {
                    if wr.write_all(&b).await.is_err() {
                        break;
                    }
                }
                Step::Pause(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            }
        }
        if closes {
            let _ = tokio::time::timeout(Duration::from_secs(10), answered).await;
            let _ = wr.write_all(&close(1000, "")).await;
        }
        wr
    });
    if case.expect.is_empty() {
        done.take().map(|d| d.send(()));
    }
    let mut got = Vec::new();
    let mut message: Option<(u8, Vec<u8>)> = None;
    let code = loop {
        let Some((fin, opcode, payload)) = read_frame(&mut rd, &mut buf)
            .await
            .map_err(|e| format!("{e}; got {got:?}"))?
        else {
            return Err(format!("closed without a close frame; got {got:?}"));
        };
        match opcode {
            TEXT | BINARY if message.is_none() => message = Some((opcode, payload)),
            CONT if message.is_some() => message.as_mut().unwrap().1.extend(payload),
            PONG => got.push(Got::Pong(payload)),
            PING => {}
            CLOSE => {
                break match payload.len() {
                    0 => NO_CODE,
                    1 => return Err("a close payload of one byte".into()),
                    _ => u16::from_be_bytes([payload[0], payload[1]]),
                };
            }
            _ => return Err(format!("an unexpected frame {opcode:#x}; got {got:?}")),
        }
        if fin && opcode < 8 {
            let (op, p) = message.take().unwrap();
            got.push(if op == TEXT {
                Got::Text(p)
            } else {
                Got::Binary(p)
            });
        }
        if got.len() >= case.expect.len() {
            done.take().map(|d| d.send(()));
        }
    };
    drop(done);
    // The client's part of the closing handshake, unless it had sent its close; then the
    // server ends the stream and sends nothing more.
    let mut wr = writer.await.unwrap();
    let sent_close = case.closes
        || case.steps.iter().any(|s| match s {
            Step::Write(b) => b.first().is_some_and(|b0| b0 & 0x0F == CLOSE),
            Step::Pause(_) => false,
        });
    if !sent_close {
        let _ = wr.write_all(&close(1000, "")).await;
    }
    match read_frame(&mut rd, &mut buf).await {
        Ok(None) => {}
        Ok(Some(f)) => return Err(format!("a frame after the close: {f:?}")),
        Err(e) if e.starts_with("read: ") => {}
        Err(e) => return Err(format!("after the close: {e}")),
    }
    if got != case.expect || !case.codes.contains(&code) {
        return Err(mismatch(&got, code, case));
    }
    Ok(())
}

/// How a case went wrong when `got` came back before a close `code`.
fn mismatch(got: &[Got], code: u16, case: &Case) -> String {
    format!(
        "got {got:?} then close {code}; expected {:?} then close {:?}",
        case.expect, case.codes
    )
}

/// Whether the case writes a message and, right after it (no pause) or in the same write, a
/// frame the protocol forbids: a server that fails fast answers the message or not depending
/// on whether the two came in one read — `websockets` alone, and through a relay that passes
/// the message on and closes as soon as it reads the error. (That the relay itself passes the
/// message and then the backend's answer on is `relay.rs`'s unit test
/// `a_clients_protocol_error_goes_to_the_backend_whose_answers_still_reach_the_client`.)
fn answer_races_error(id: &str) -> bool {
    matches!(
        id,
        "3.2" | "4.1.3" | "4.1.4" | "4.1.5" | "4.2.3" | "4.2.4" | "4.2.5" | "5.15"
    )
}

/// Every case against `path`, eight at a time: each case's id and how it went.
async fn outcomes(addr: SocketAddr, path: &str) -> Vec<(String, Result<(), String>)> {
    use futures_util::StreamExt;
    let cases = cases();
    assert!(cases.len() > 250, "{}", cases.len());
    futures_util::stream::iter(cases.iter())
        .map(|case| async move { (case.id.clone(), run(addr, path, case).await) })
        .buffer_unordered(8)
        .collect()
        .await
}

/// Fails with every failure listed.
fn no_failures(failed: &[String], of: usize) {
    assert!(
        failed.is_empty(),
        "{} of {of} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

const LIMITS: &str = "max_frames_per_second = 1000000\n";

/// Events mode: Tern is the WebSocket's server, and every case passes with Autobahn's strict
/// outcome (what the client sent before an error it makes is answered before the close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autobahn_cases_pass_against_an_events_guest() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "ws_events");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"echo\"\nmodule = \"ws_events.wasm\"\n\
         [tenant.websocket]\nmode = \"events\"\n{LIMITS}"
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let all = outcomes(s.addr(), "/?grip=no").await;
    let failed: Vec<String> = all
        .iter()
        .filter_map(|(id, r)| r.as_ref().err().map(|e| format!("{id}: {e}")))
        .collect();
    no_failures(&failed, all.len());
}

/// Handoff: the backend (Python's `websockets`) is the WebSocket's server and Tern relays.
/// Each case passes through Tern, or fails exactly as it does against the backend alone (what
/// the backend does is its own: `websockets` fails fast without answering a message that came
/// with the error or right before it, 5.15, 3.2 and 4.x.3-5 — alone it may answer those in
/// some runs and not in others, see [`answer_races_error`] — and fails a close inside a
/// fragmented message, 7.1.5);
/// past the tenant's message limit Tern closes `1009` where the backend alone has no limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autobahn_cases_pass_through_a_handoff_or_fail_as_the_backend_alone_does() {
    let echo = crate::websocket::echo_server();
    let alone: std::collections::HashMap<String, Result<(), String>> = outcomes(
        format!("127.0.0.1:{}", echo.port).parse().unwrap(),
        "/rooms",
    )
    .await
    .into_iter()
    .collect();
    let s = crate::websocket::gate(&echo, &format!("[tenant.websocket]\n{LIMITS}")).await;
    let all = outcomes(s.addr(), "/?token=good").await;
    let cases = cases();
    let mut failed = Vec::new();
    let mut backends_own = Vec::new();
    for (id, r) in &all {
        match (r, &alone[id]) {
            (Ok(()), _) => {}
            (Err(e), Err(same)) if e == same && !id.contains("limit") => {
                backends_own.push(id.as_str());
            }
            // Failing fast without the answer: the backend's own in a race it may win or
            // lose alone as well as behind Tern.
            (Err(e), _)
                if answer_races_error(id) && {
                    let case = cases.iter().find(|c| &c.id == id).unwrap();
                    case.codes.iter().any(|&c| *e == mismatch(&[], c, case))
                } =>
            {
                backends_own.push(id.as_str());
            }
            (Err(e), reference) => {
                failed.push(format!("{id}: {e} (the backend alone: {reference:?})"));
            }
        }
    }
    no_failures(&failed, all.len());
    // (Most pass: a relay that broke everything the same way as a broken backend would not.)
    assert!(
        backends_own.len() <= 12,
        "the backend's own failures: {backends_own:?}"
    );
}
