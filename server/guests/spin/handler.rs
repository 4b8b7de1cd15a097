//! A Spin HTTP component, as a Spin user writes one: answers with what it read of the
//! request. Built against each spin-sdk version of this workspace (the package name says which).
//!
//! Under `/kv/` it uses key-value stores as Spin's docs show, through Spin's own API
//! (`/kv/spin/STORE/OP/KEY`, `spin_sdk::key_value::Store`) or `wasi:keyvalue`
//! (`/kv/wasi/STORE/OP/KEY`): OP is get, set (the body), delete, exists, keys; `count` (Spin:
//! read, add one, write); incr, cas (add one by compare-and-swap, retrying), list (every key,
//! page by page), many (set-many of the body's `key=value` lines, then get-many) for wasi.
//! A failure answers 500 with the error as the guest sees it.
//!
//! `/var/NAME` reads a variable as Spin's docs show (`spin_sdk::variables::get`), and
//! `/config/NAME` through `wasi:config/store` (`/config/` alone: every name, with get-all):
//! the value, or `404` with Spin's `undefined` / wasi:config's `none`, or `500` with the error.

use spin_sdk::http::{IntoResponse, Request, Response};
use spin_sdk::http_component;
use spin_sdk::key_value::Store;
use spin_sdk::wit::wasi::keyvalue::{atomics, batch, store as wasi};

#[http_component]
fn handle(req: Request) -> anyhow::Result<impl IntoResponse> {
    if let Some((_, name)) = req.path().split_once("/var/") {
        let (status, text) = match spin_sdk::variables::get(name) {
            Ok(value) => (200, value),
            Err(spin_sdk::variables::Error::Undefined(why)) => (404, format!("undefined: {why}")),
            Err(e) => (500, format!("{e:?}")),
        };
        return Ok(Response::new(status, text));
    }
    if let Some((_, name)) = req.path().split_once("/config/") {
        use spin_sdk::wit::wasi::config::store;
        let (status, text) = if name.is_empty() {
            match store::get_all() {
                Ok(all) => {
                    let names: Vec<String> = all.into_iter().map(|(k, _)| k).collect();
                    (200, names.join(","))
                }
                Err(e) => (500, format!("{e:?}")),
            }
        } else {
            match store::get(name) {
                Ok(Some(value)) => (200, value),
                Ok(None) => (404, "none".to_string()),
                Err(e) => (500, format!("{e:?}")),
            }
        };
        return Ok(Response::new(status, text));
    }
    if let Some((_, rest)) = req.path().split_once("/kv/") {
        let (status, text) = match kv(rest, req.body()) {
            Ok(text) => (200, text),
            Err(e) => (500, e),
        };
        return Ok(Response::builder()
            .status(status)
            .header("content-type", "text/plain")
            .body(text)
            .build());
    }
    let text = format!(
        "hello from {}: {} {} body={}\n",
        env!("CARGO_PKG_NAME"),
        req.method(),
        req.path(),
        req.body().len()
    );
    Ok(Response::builder()
        .status(200)
        .header("content-type", "text/plain")
        .header("x-toolchain", env!("CARGO_PKG_NAME"))
        .body(text)
        .build())
}

fn kv(rest: &str, body: &[u8]) -> Result<String, String> {
    let mut parts = rest.splitn(4, '/');
    let api = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or_default();
    let op = parts.next().unwrap_or_default();
    let key = parts.next().unwrap_or_default();
    let body = String::from_utf8_lossy(body).into_owned();
    match api {
        "spin" => spin(name, op, key, body),
        "wasi" => wasi_kv(name, op, key, body),
        _ => Err(format!("unknown api {api:?}")),
    }
}

fn spin(name: &str, op: &str, key: &str, body: String) -> Result<String, String> {
    let e = |e: spin_sdk::key_value::Error| format!("{e:?}");
    let store = Store::open(name).map_err(e)?;
    Ok(match op {
        "get" => match store.get(key).map_err(e)? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None => "none".into(),
        },
        "set" => {
            store.set(key, body.as_bytes()).map_err(e)?;
            "ok".into()
        }
        "delete" => {
            store.delete(key).map_err(e)?;
            "ok".into()
        }
        "exists" => store.exists(key).map_err(e)?.to_string(),
        "keys" => store.get_keys().map_err(e)?.join(","),
        "count" => {
            let n = match store.get(key).map_err(e)? {
                Some(v) => String::from_utf8_lossy(&v)
                    .parse::<u64>()
                    .map_err(|x| x.to_string())?,
                None => 0,
            } + 1;
            store.set(key, n.to_string().as_bytes()).map_err(e)?;
            n.to_string()
        }
        _ => return Err(format!("unknown op {op:?}")),
    })
}

fn wasi_kv(name: &str, op: &str, key: &str, body: String) -> Result<String, String> {
    let e = |e: wasi::Error| format!("{e:?}");
    let bucket = wasi::open(name).map_err(e)?;
    Ok(match op {
        "get" => match bucket.get(key).map_err(e)? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None => "none".into(),
        },
        "set" => {
            bucket.set(key, body.as_bytes()).map_err(e)?;
            "ok".into()
        }
        "delete" => {
            bucket.delete(key).map_err(e)?;
            "ok".into()
        }
        "exists" => bucket.exists(key).map_err(e)?.to_string(),
        "incr" => atomics::increment(&bucket, key, 1).map_err(e)?.to_string(),
        "cas" => {
            let mut cas = atomics::Cas::new(&bucket, key).map_err(e)?;
            let mut tries = 1;
            loop {
                let n = match cas.current().map_err(e)? {
                    Some(v) => String::from_utf8_lossy(&v)
                        .parse::<u64>()
                        .map_err(|x| x.to_string())?,
                    None => 0,
                } + 1;
                match atomics::swap(cas, n.to_string().as_bytes()) {
                    Ok(()) => break format!("{n} after {tries}"),
                    Err(atomics::CasError::CasFailed(again)) => cas = again,
                    Err(atomics::CasError::StoreError(x)) => return Err(e(x)),
                }
                tries += 1;
            }
        }
        "list" => {
            let (mut keys, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
            loop {
                let page = bucket.list_keys(cursor.as_deref()).map_err(e)?;
                pages += 1;
                keys.extend(page.keys);
                cursor = page.cursor;
                if cursor.is_none() {
                    break format!(
                        "{} keys in {pages} pages, first {:?}, last {:?}",
                        keys.len(),
                        keys.first(),
                        keys.last()
                    );
                }
            }
        }
        "many" => {
            let pairs: Vec<(String, Vec<u8>)> = body
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect();
            batch::set_many(&bucket, &pairs).map_err(e)?;
            let mut keys: Vec<String> = pairs.into_iter().map(|(k, _)| k).collect();
            keys.push(key.to_string());
            batch::get_many(&bucket, &keys)
                .map_err(e)?
                .into_iter()
                .map(|(k, v)| {
                    format!(
                        "{k}={}",
                        v.map_or("none".into(), |v| String::from_utf8_lossy(&v).into_owned())
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        }
        _ => return Err(format!("unknown op {op:?}")),
    })
}
