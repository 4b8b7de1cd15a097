//! A native WebSocket echo server (no WebAssembly, no WebSocket library): the backend the
//! `websocket` benchmark hands connections to, the same for Tern and for nginx. Each
//! connection is sent one text message (`hi`) when it opens, then every message comes back
//! as it came (one frame each way; a close is answered and ends it).
//!
//! Usage: ws-echo 127.0.0.1:PORT

use aws_lc_rs::digest::{SHA1_FOR_LEGACY_USE_ONLY, digest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(char::from(T[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn serve(mut s: tokio::net::TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        let mut chunk = [0u8; 2048];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let key = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case("sec-websocket-key")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    let accept =
        base64(digest(&SHA1_FOR_LEGACY_USE_ONLY, format!("{key}{GUID}").as_bytes()).as_ref());
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    s.write_all(answer.as_bytes()).await?;
    s.write_all(&[0x81, 2, b'h', b'i']).await?;
    buf.drain(..head_end);
    let mut out = Vec::with_capacity(4096);
    loop {
        // Whole frames in `buf`, echoed unmasked.
        let mut at = 0;
        loop {
            let b = &buf[at..];
            if b.len() < 2 {
                break;
            }
            let (mut len, mut h) = (u64::from(b[1] & 0x7F), 2usize);
            if len == 126 {
                if b.len() < 4 {
                    break;
                }
                len = u64::from(u16::from_be_bytes([b[2], b[3]]));
                h = 4;
            } else if len == 127 {
                if b.len() < 10 {
                    break;
                }
                len = u64::from_be_bytes(b[2..10].try_into().unwrap());
                h = 10;
            }
            let masked = b[1] & 0x80 != 0;
            let mh = if masked { 4 } else { 0 };
            let total = h + mh + len as usize;
            if b.len() < total {
                break;
            }
            let mask: [u8; 4] = if masked {
                b[h..h + 4].try_into().unwrap()
            } else {
                [0; 4]
            };
            let payload: Vec<u8> = b[h + mh..total]
                .iter()
                .enumerate()
                .map(|(i, x)| x ^ mask[i % 4])
                .collect();
            let opcode = b[0] & 0x0F;
            out.push(0x80 | opcode);
            match payload.len() {
                n if n < 126 => out.push(n as u8),
                n if n <= 0xFFFF => {
                    out.push(126);
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                }
                n => {
                    out.push(127);
                    out.extend_from_slice(&(n as u64).to_be_bytes());
                }
            }
            out.extend_from_slice(&payload);
            at += total;
            if opcode == 0x8 {
                s.write_all(&out).await?;
                return Ok(());
            }
        }
        buf.drain(..at);
        if !out.is_empty() {
            s.write_all(&out).await?;
            out.clear();
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18187".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    loop {
        let (s, _) = listener.accept().await.expect("accept");
        tokio::spawn(async move {
            let _ = serve(s).await;
        });
    }
}
