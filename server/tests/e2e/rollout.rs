//! Gradual deployments: a candidate serves its share of the clients beside the current
//! version, each key one version (on every look and after a restart), a larger share moving
//! none back; `Tern-Version` reaches a candidate at 0 % only with a token that may deploy the
//! tenant (and never reaches the guest); a candidate that fails is aborted by its rule and
//! gets no request after; the cache never gives one version's answer to the other's clients;
//! stages move the share by time and promote; what would lose a rollout is refused; the CLI.
//! (A fleet's replicas splitting alike and aborting once: `fleet::shared`.)

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::*;

const POOL: &str = "[pool]\ninstances = 16\nmax_memory_mib = 64\n";

/// `wasm` with a custom section named after `tag`: the same guest as another version (its own
/// module hash, so its own version id).
pub fn variant(wasm: &[u8], tag: &str) -> Vec<u8> {
    let name = b"tern-test-variant";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(tag.as_bytes());
    let mut out = wasm.to_vec();
    out.push(0);
    let mut n = payload.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        out.push(if n == 0 { byte } else { byte | 0x80 });
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&payload);
    out
}

/// The version that answered, as `Server-Timing` names it (12 digits).
pub fn version_of(r: &Reply) -> String {
    let timing = r.header("server-timing");
    let at = timing
        .find("version;desc=")
        .unwrap_or_else(|| panic!("no version in Server-Timing: {timing:?}"));
    timing[at + "version;desc=".len()..]
        .split(',')
        .next()
        .unwrap()
        .trim()
        .to_string()
}

/// Creates tenant `name` at `path` with `spec` fields added, and deploys `wasm`: its version.
async fn tenant(s: &TestServer, name: &str, spec: Value, wasm: &[u8]) -> String {
    let mut body = json!({ "paths": [format!("/{name}")] });
    for (k, v) in spec.as_object().unwrap() {
        body[k] = v.clone();
    }
    let path = format!("/admin/v1/tenants/{name}");
    let (status, v) = s.admin_call(Method::PUT, &path, body.to_string()).await;
    assert!(status.is_success(), "{v}");
    let (status, v) = s
        .admin_call(Method::PUT, &format!("{path}/module"), wasm.to_vec())
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["version"].as_str().unwrap()[..12].to_string()
}

/// Deploys `wasm` as `name`'s candidate with the rollout `query` (`percent=10&...`): the
/// answer's status and JSON.
async fn candidate(s: &TestServer, name: &str, wasm: &[u8], query: &str) -> (StatusCode, Value) {
    let path = format!("/admin/v1/tenants/{name}/module?{query}");
    s.admin_call(Method::PUT, &path, wasm.to_vec()).await
}

/// [`candidate`], which must succeed: the candidate's version (12 digits).
async fn deployed_candidate(s: &TestServer, name: &str, wasm: &[u8], query: &str) -> String {
    let (status, v) = candidate(s, name, wasm, query).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["version"].as_str().unwrap()[..12].to_string()
}

async fn set_share(s: &TestServer, name: &str, percent: &str) -> (StatusCode, Value) {
    let path = format!("/admin/v1/tenants/{name}/rollout");
    let body = json!({ "percent": percent }).to_string();
    s.admin_call(Method::POST, &path, body).await
}

/// The version each key (sent as `x-user`) gets for `path`, over 8 keep-alive connections.
pub async fn versions(addr: std::net::SocketAddr, path: &str, keys: &[String]) -> Vec<String> {
    let chunks: Vec<Vec<(usize, String)>> = (0..8)
        .map(|w| {
            keys.iter()
                .enumerate()
                .filter(|(i, _)| i % 8 == w)
                .map(|(i, k)| (i, k.clone()))
                .collect()
        })
        .collect();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let path = path.to_string();
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            let mut out = Vec::new();
            for (i, key) in chunk {
                let r = as_user(&mut conn, &path, &key).await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.text());
                out.push((i, version_of(&r)));
            }
            out
        }));
    }
    let mut all = vec![String::new(); keys.len()];
    for t in tasks {
        for (i, v) in t.await.unwrap() {
            all[i] = v;
        }
    }
    all
}

/// `n` keys as an application names its users (fixed: the shares they give are the same on
/// A GET of `path` on `conn` as user `key` (its `x-user` header, the split key of most tests).
async fn as_user(conn: &mut Conn, path: &str, key: &str) -> Reply {
    conn.send(request(
        Method::GET,
        path,
        None,
        &[("x-user", key)],
        Bytes::new(),
    ))
    .await
}

/// Tenant `site` once its candidate is aborted (within 10 s of `since`).
async fn aborted(s: &TestServer, since: Instant) -> Value {
    loop {
        let (_, t) = s
            .admin_call(Method::GET, "/admin/v1/tenants/site", "")
            .await;
        if t["candidate"]["state"] == "aborted" {
            return t;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "not aborted: {t}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// every run of a build).
pub fn user_keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user-{i:05}")).collect()
}

pub fn share(of: &[String], version: &str) -> usize {
    of.iter().filter(|v| *v == version).count()
}

/// 10,000 random keys at 10 %: the candidate's share is within a point of 10 %; every key
/// gets the same version on 100 repeats (a sample of 100 keys) and after a restart; 10 → 20
/// → 50 % moves no key back; both versions' answers are counted apart in
/// `tern_requests_total{deployment}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_candidate_gets_its_share_and_each_key_keeps_its_version() {
    let s = TestServer::start("").await;
    let echo = demo("echo");
    let current = tenant(&s, "site", json!({}), echo).await;
    let (status, v) = candidate(
        &s,
        "site",
        &variant(echo, "2"),
        "percent=10&key=header%3Ax-user",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["candidate"]["percent"], "10%", "{v}");
    let cand = v["version"].as_str().unwrap()[..12].to_string();
    assert_eq!(v["previous"].as_str().unwrap()[..12], current, "{v}");

    let keys = user_keys(10_000);
    let first = versions(s.addr(), "/site/", &keys).await;
    let n = share(&first, &cand);
    assert_eq!(n + share(&first, &current), keys.len());
    assert!(
        (900..=1100).contains(&n),
        "{n} of 10,000 keys got the candidate at 10 %"
    );
    let m = s.metrics().await;
    let counted = metric_value(
        &m,
        r#"tern_requests_total{deployment="candidate",status="2xx",tenant="site",trigger="request",version="1.1"}"#,
    );
    assert_eq!(
        counted as usize, n,
        "the candidate's answers, counted apart"
    );
    assert!(m.contains(
        r#"tern_request_phase_duration_seconds_count{deployment="candidate",phase="run"}"#
    ));

    // A hundred keys, a hundred times each: never another version.
    let sample: Vec<String> = keys[..100].to_vec();
    let repeated: Vec<String> = (0..100).flat_map(|_| sample.iter().cloned()).collect();
    let again = versions(s.addr(), "/site/", &repeated).await;
    for (i, v) in again.iter().enumerate() {
        assert_eq!(
            *v,
            first[i % 100],
            "key {} changed version",
            sample[i % 100]
        );
    }

    // A larger share only adds keys.
    let mut before = first;
    for (percent, low, high) in [("20", 1850, 2150), ("50", 4800, 5200)] {
        let (status, v) = set_share(&s, "site", percent).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["candidate"]["percent"], format!("{percent}%"), "{v}");
        let now = versions(s.addr(), "/site/", &keys).await;
        for (i, (b, a)) in before.iter().zip(&now).enumerate() {
            assert!(
                *b != cand || *a == cand,
                "key {} moved back at {percent} %",
                keys[i]
            );
        }
        let n = share(&now, &cand);
        assert!((low..=high).contains(&n), "{n} of 10,000 at {percent} %");
        before = now;
    }

    // After a restart (the candidate and its share are in the data directory), the same split.
    let dir = restart_dir(s);
    let s = TestServer::try_start_in(dir, POOL).await.expect("restart");
    let after = versions(s.addr(), "/site/", &keys[..2000]).await;
    assert_eq!(after, before[..2000], "the split after a restart");
}

/// `Tern-Version` at 0 %: refused without a token, with a wrong one, with one that may not
/// deploy the tenant; served with the operator's or a deploy token (neither header reaches
/// the guest), or from a client in the rollout's `override_from`; a version it does not name
/// is `404`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_override_reaches_a_candidate_at_zero_only_with_a_deploy_token() {
    let s = TestServer::start("").await;
    let echo = demo("echo");
    let current = tenant(&s, "site", json!({}), echo).await;
    tenant(&s, "neighbour", json!({}), &variant(echo, "n")).await;
    let cand = deployed_candidate(&s, "site", &variant(echo, "2"), "percent=0").await;
    let srv = &s;
    let token = |body: Value| async move {
        let (status, v) = srv
            .admin_call(Method::POST, "/admin/v1/tokens", body.to_string())
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v["token"].as_str().unwrap().to_string()
    };
    let deploy = token(json!({ "name": "d", "tenants": ["site"], "scopes": ["deploy"] })).await;
    let read = token(json!({ "name": "r", "tenants": ["site"], "scopes": ["read", "logs"] })).await;
    let elsewhere =
        token(json!({ "name": "e", "tenants": ["neighbour"], "scopes": ["deploy"] })).await;
    let mut conn = Conn::open(s.addr()).await;
    let mut ask = async |headers: &[(&str, &str)]| {
        conn.send(request(Method::GET, "/site/", None, headers, Bytes::new()))
            .await
    };
    for _ in 0..50 {
        assert_eq!(
            version_of(&ask(&[]).await),
            current,
            "0 %: nobody gets the candidate"
        );
    }
    for (headers, why) in [
        (vec![("tern-version", "candidate")], "no token"),
        (
            vec![
                ("tern-version", "candidate"),
                ("tern-version-token", "nope"),
            ],
            "a wrong token",
        ),
        (
            vec![
                ("tern-version", "candidate"),
                ("tern-version-token", read.as_str()),
            ],
            "a read token",
        ),
        (
            vec![
                ("tern-version", "candidate"),
                ("tern-version-token", elsewhere.as_str()),
            ],
            "another tenant's",
        ),
        (
            vec![
                ("tern-version", "candidate"),
                ("authorization", "Bearer test-admin-token"),
            ],
            "the token as Authorization",
        ),
    ] {
        let r = ask(&headers).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{why}: {}", r.text());
        assert!(r.text().contains("Tern-Version-Token"), "{}", r.text());
    }
    for t in [deploy.as_str(), ADMIN_TOKEN] {
        for asked in ["candidate", &cand, &cand[..8]] {
            let r = ask(&[("tern-version", asked), ("tern-version-token", t)]).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            assert_eq!(version_of(&r), cand, "Tern-Version: {asked}");
            let seen = r.text().to_ascii_lowercase();
            assert!(!seen.contains("tern-version"), "the guest saw: {seen}");
        }
        let r = ask(&[("tern-version", &current[..10]), ("tern-version-token", t)]).await;
        assert_eq!(version_of(&r), current);
        assert!(
            !r.text().to_ascii_lowercase().contains("tern-version"),
            "{}",
            r.text()
        );
    }
    for asked in ["ffffffffffff", &cand[..7], "latest"] {
        let r = ask(&[("tern-version", asked), ("tern-version-token", ADMIN_TOKEN)]).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{asked}: {}", r.text());
    }
    // A token sent to a tenant without a candidate never reaches its guest either.
    let r = ask(&[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(
        s.addr(),
        Method::GET,
        "/neighbour/",
        None,
        &[("tern-version-token", ADMIN_TOKEN)],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        !r.text().to_ascii_lowercase().contains("tern-version"),
        "{}",
        r.text()
    );
    // Without a token even a version it does not name is refused: no version id is told.
    let r = ask(&[("tern-version", "ffffffffffff")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(!r.text().contains(&current) && !r.text().contains(&cand));

    // From the rollout's override_from networks, no token is needed.
    let third = deployed_candidate(
        &s,
        "site",
        &variant(echo, "3"),
        "percent=0&override_from=127.0.0.1%2F32",
    )
    .await;
    let r = ask(&[("tern-version", "candidate")]).await;
    assert_eq!((r.status, version_of(&r)), (StatusCode::OK, third));
}

/// A candidate that traps on half its requests at 10 %, with an abort rule (5 points over 40
/// requests): aborted within two rounds of the rule's check once the candidate has its 40,
/// after which no request reaches it; the current version's clients never saw an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_candidate_is_aborted_and_gets_no_request_after() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let probe = std::fs::read(test_guest(dir.path(), "log_probe")).unwrap();
    let current = tenant(&s, "site", json!({}), demo("echo")).await;
    let (status, v) = candidate(
        &s,
        "site",
        &probe,
        "percent=10&key=header%3Ax-user&abort=5&abort_min_requests=40",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v["candidate"]["plan"]["abort"],
        json!({"margin": 5.0, "min_requests": 40})
    );
    let cand = v["version"].as_str().unwrap()[..12].to_string();
    let mut conn = Conn::open(s.addr()).await;
    let (mut to_candidate, mut current_errors, mut i) = (0, 0, 0u64);
    // Half the requests ask the candidate to trap (`?trap=1`); the current version answers
    // them all.
    let judged_at = loop {
        i += 1;
        let path = if i % 2 == 0 {
            "/site/x?trap=1"
        } else {
            "/site/x"
        };
        let key = format!("user-{i}");
        let r = as_user(&mut conn, path, &key).await;
        if version_of(&r) == cand {
            to_candidate += 1;
        } else if r.status != StatusCode::OK {
            current_errors += 1;
        }
        if to_candidate >= 40 {
            break (Instant::now(), tern::rollout::now_ms());
        }
        assert!(i < 5000, "the candidate got {to_candidate} of {i}");
    };
    let (judged_at, judged_ms) = judged_at;
    let t = aborted(&s, judged_at).await;
    // The server's own time of the abort: within one round of the rule's check (1 s) and the
    // change's commit after the candidate's 40th answer.
    let at = t["candidate"]["plan"]["aborted"]["at_ms"].as_u64().unwrap();
    assert!(
        at <= judged_ms + 2_000,
        "aborted {} ms after its 40th answer",
        at.saturating_sub(judged_ms)
    );
    let reason = t["candidate"]["plan"]["aborted"]["reason"]
        .as_str()
        .unwrap();
    assert!(
        reason.contains("against the current version's 0 of"),
        "{reason}"
    );
    assert_eq!(t["candidate"]["percent"], "0%");
    // Nobody gets it any more, whatever the key; the current version answers everyone.
    for j in 0..2000 {
        let key = format!("after-{j}");
        let path = if j % 2 == 0 {
            "/site/x?trap=1"
        } else {
            "/site/x"
        };
        let r = as_user(&mut conn, path, &key).await;
        assert_eq!(
            (r.status, version_of(&r)),
            (StatusCode::OK, current.clone()),
            "{key}"
        );
    }
    assert_eq!(
        current_errors, 0,
        "the current version's clients saw errors"
    );
    // A share again serves it again, judged anew (its failures above are forgotten); a
    // rollback drops it.
    let (status, v) = set_share(&s, "site", "10").await;
    assert_eq!(
        (status, &v["candidate"]["state"]),
        (StatusCode::OK, &json!("serving")),
        "{v}"
    );
    assert_eq!(
        v["candidate"]["answered_here"]["candidate"]["requests"], 0,
        "{v}"
    );
    let mut again = 0;
    for j in 0..400 {
        let key = format!("again-{j}");
        let r = as_user(&mut conn, "/site/x", &key).await;
        assert_eq!(r.status, StatusCode::OK);
        again += usize::from(version_of(&r) == cand);
    }
    assert!(
        again > 10,
        "{again} of 400 went to the candidate at 10 % again"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, t) = s
        .admin_call(Method::GET, "/admin/v1/tenants/site", "")
        .await;
    assert_eq!(
        t["candidate"]["state"], "serving",
        "judged on its old failures: {t}"
    );
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/tenants/site/rollback", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["dropped_candidate"].as_str().unwrap()[..12], cand);
    assert_eq!(v["version"].as_str().unwrap()[..12], current);
}

/// The key (`x-user`) of a client tenant `site` answers with `current`, and of one it
/// answers with `cand`.
async fn a_client_of_each(s: &TestServer, current: &str, cand: &str) -> (String, String) {
    let keys = user_keys(64);
    let of = versions(s.addr(), "/site/probe", &keys).await;
    let key_of = |version: &str| keys[of.iter().position(|v| v == version).unwrap()].clone();
    (key_of(current), key_of(cand))
}

/// A tenant with a cache and a candidate at 50 %: a page stored from one version is never
/// given to the other's clients (each version fills and hits its own), a purge reaches both,
/// and after a promotion the candidate's stored page still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_never_gives_one_versions_answer_to_the_others_clients() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let guest = std::fs::read(test_guest(dir.path(), "cache_headers")).unwrap();
    let current = tenant(&s, "site", json!({ "cache": { "enabled": true } }), &guest).await;
    let cand = deployed_candidate(
        &s,
        "site",
        &variant(&guest, "2"),
        "percent=50&key=header%3Ax-user",
    )
    .await;
    let (old_client, new_client) = a_client_of_each(&s, &current, &cand).await;
    let page = "/site/page?h=cache-control:public,max-age%3D60";
    let addr = s.addr();
    let get = |key: String| async move {
        send(
            addr,
            Method::GET,
            page,
            None,
            &[("x-user", &key)],
            Bytes::new(),
        )
        .await
    };
    let first_old = get(old_client.clone()).await;
    assert_eq!(version_of(&first_old), current);
    let hit_old = get(old_client.clone()).await;
    assert!(
        hit_old.header("cache-status").contains("hit"),
        "{:?}",
        hit_old.headers
    );
    assert_eq!(hit_old.body, first_old.body);
    // The candidate's client: its own version runs (a miss), then its own page is a hit.
    let first_new = get(new_client.clone()).await;
    assert_eq!(version_of(&first_new), cand);
    assert!(
        !first_new.header("cache-status").contains("hit"),
        "{:?}",
        first_new.headers
    );
    assert_ne!(first_new.body, first_old.body);
    let hit_new = get(new_client.clone()).await;
    assert!(hit_new.header("cache-status").contains("hit"));
    assert_eq!(hit_new.body, first_new.body);
    assert_eq!(
        get(old_client.clone()).await.body,
        first_old.body,
        "the old page for old clients"
    );
    // A write through one version makes the other's stored page stale too.
    let w = send(
        addr,
        Method::POST,
        page,
        None,
        &[("x-user", &new_client)],
        Bytes::new(),
    )
    .await;
    assert_eq!(version_of(&w), cand);
    assert!(w.status.is_success(), "{}", w.status);
    let r = get(old_client.clone()).await;
    assert!(!r.header("cache-status").contains("hit"), "{:?}", r.headers);
    assert_ne!(
        r.body, first_old.body,
        "the old version's page after a write"
    );
    // A purge empties both versions' pages.
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/site/cache/purge",
            r#"{"all": true}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    for key in [&old_client, &new_client] {
        assert!(
            !get(key.clone())
                .await
                .header("cache-status")
                .contains("hit")
        );
    }
    // Promoted: the candidate's stored page answers everyone, old clients included.
    let stored_new = get(new_client.clone()).await;
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/tenants/site/promote", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["current"]["id"].as_str().unwrap()[..12], cand);
    assert!(v["candidate"].is_null(), "{v}");
    for key in [old_client, new_client] {
        let r = get(key).await;
        assert_eq!(version_of(&r), cand);
        assert!(r.header("cache-status").contains("hit"), "{:?}", r.headers);
        assert_eq!(r.body, stored_new.body);
    }
}

/// Candidates deployed one after another (each replacing the last, as a team trying fixes
/// does): a write through the last one still makes the current version's stored page stale,
/// and one through the current version the candidate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_reaches_the_current_versions_page_after_many_candidates() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let guest = std::fs::read(test_guest(dir.path(), "cache_headers")).unwrap();
    let current = tenant(&s, "site", json!({ "cache": { "enabled": true } }), &guest).await;
    let mut cand = String::new();
    for tag in ["2", "3", "4", "5", "6"] {
        let query = "percent=50&key=header%3Ax-user";
        cand = deployed_candidate(&s, "site", &variant(&guest, tag), query).await;
    }
    let (old_client, new_client) = a_client_of_each(&s, &current, &cand).await;
    let page = "/site/page?h=cache-control:public,max-age%3D60";
    let addr = s.addr();
    let call = |method: Method, key: String| async move {
        send(addr, method, page, None, &[("x-user", &key)], Bytes::new()).await
    };
    for (reader, writer, version) in [
        (&old_client, &new_client, &current),
        (&new_client, &old_client, &cand),
    ] {
        let stored = call(Method::GET, reader.clone()).await;
        assert_eq!(&version_of(&stored), version);
        let hit = call(Method::GET, reader.clone()).await;
        assert!(
            hit.header("cache-status").contains("hit"),
            "{:?}",
            hit.headers
        );
        assert_eq!(hit.body, stored.body);
        let w = call(Method::POST, writer.clone()).await;
        assert!(w.status.is_success(), "{}", w.status);
        assert_ne!(&version_of(&w), version);
        let after = call(Method::GET, reader.clone()).await;
        assert!(
            !after.header("cache-status").contains("hit"),
            "{version}'s page after a write through the other version: {:?}",
            after.headers
        );
        assert_ne!(after.body, stored.body, "{version}'s page after a write");
    }
}

/// `5 s at 50 %, 3 s at 100 %`: the share follows the stages (the tenant's record says which
/// and when the next begins), then the candidate is promoted with the previous version kept
/// for `rollback`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_move_the_share_by_time_and_promote_at_the_end() {
    let s = TestServer::start("").await;
    let echo = demo("echo");
    let current = tenant(&s, "site", json!({}), echo).await;
    let started = Instant::now();
    let cand = deployed_candidate(
        &s,
        "site",
        &variant(echo, "2"),
        "stages=50%25%3A5s%2C100%25%3A3s&key=header%3Ax-user",
    )
    .await;
    let keys = user_keys(400);
    let at_50 = versions(s.addr(), "/site/", &keys).await;
    let n = share(&at_50, &cand);
    assert!((140..=260).contains(&n), "{n} of 400 at 50 %");
    let (_, t) = s
        .admin_call(Method::GET, "/admin/v1/tenants/site", "")
        .await;
    assert_eq!(
        (
            t["candidate"]["percent"].as_str(),
            t["candidate"]["plan"]["stage"].as_u64()
        ),
        (Some("50%"), Some(0)),
        "{t}"
    );
    assert!(t["candidate"]["next_stage_at_ms"].as_u64().is_some(), "{t}");
    let wait_for = async |what: &str, done: &dyn Fn(&Value) -> bool| loop {
        let (_, t) = s
            .admin_call(Method::GET, "/admin/v1/tenants/site", "")
            .await;
        if done(&t) {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{what}: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let first_since = t["candidate"]["plan"]["since_ms"].as_u64().unwrap();
    wait_for("stage 2", &|t| t["candidate"]["plan"]["stage"] == 1).await;
    let (_, t) = s
        .admin_call(Method::GET, "/admin/v1/tenants/site", "")
        .await;
    let second_since = t["candidate"]["plan"]["since_ms"].as_u64().unwrap();
    assert_eq!(
        second_since - first_since,
        5_000,
        "the second stage began when the first ended"
    );
    assert!(
        versions(s.addr(), "/site/", &keys)
            .await
            .iter()
            .all(|v| *v == cand)
    );
    let promoted = wait_for("promotion", &|t| t["candidate"].is_null()).await;
    assert!(
        promoted >= Duration::from_secs(8),
        "promoted after {promoted:?}"
    );
    // Each step is counted right after its audit record is made (once its change is
    // committed, a moment after it serves: the version it replaced is forgotten first):
    // once both are counted, one read of the audit log has both, by the rollout, with the
    // candidate's version (a read waits for the log's writer thread to write what was recorded
    // before it).
    let counted = std::time::Instant::now();
    loop {
        let m = s.metrics().await;
        let steps = ["advance", "promote"].map(|step| {
            metric_value_or_zero(
                &m,
                &format!(r#"tern_rollout_steps_total{{step="{step}",tenant="site"}}"#),
            )
        });
        if steps == [1.0, 1.0] {
            break;
        }
        assert!(
            steps[1] == 0.0 && counted.elapsed() < Duration::from_secs(5),
            "each step counted once: {steps:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, audit) = s
        .admin_call(Method::GET, "/admin/v1/audit?tenant=site", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let steps: Vec<&str> = (audit["records"].as_array().unwrap().iter())
        .filter(|r| r["who"] == "rollout")
        .map(|r| {
            assert!(r["version"].as_str().unwrap().starts_with(&cand), "{r}");
            r["step"].as_str().unwrap()
        })
        .collect();
    assert_eq!(steps, ["advance", "promote"], "{audit}");
    let (_, t) = s
        .admin_call(Method::GET, "/admin/v1/tenants/site", "")
        .await;
    assert_eq!(t["current"]["id"].as_str().unwrap()[..12], cand);
    assert_eq!(t["previous"]["id"].as_str().unwrap()[..12], current);
}

/// A server down for hours in a staged rollout: the stage it finds long ended runs again for
/// its full time (its share served and judged) instead of racing through the stages after it
/// to a promotion no one watched; the step is counted and audited as `restart`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_found_long_ended_after_downtime_runs_again() {
    let s = TestServer::start("").await;
    let echo = demo("echo");
    let current = tenant(&s, "site", json!({}), echo).await;
    let query = "stages=50%25%3A1h%2C100%25%3A1h&key=header%3Ax-user";
    let cand = deployed_candidate(&s, "site", &variant(echo, "2"), query).await;
    // Down for three hours: the stored stage began three hours before the restart.
    let dir = restart_dir(s);
    let manifest = dir.path().join("data/manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let plan = &mut m["tenants"]["site"]["candidate"]["plan"];
    let since = plan["since_ms"].as_u64().unwrap() - 3 * 3_600_000;
    plan["since_ms"] = since.into();
    plan["judged_since_ms"] = since.into();
    std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let now_ms = || {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        u64::try_from(t.unwrap().as_millis()).unwrap()
    };
    let restarted = now_ms();
    let s = TestServer::try_start_in(dir, "").await.expect("restart");
    // (The steps' metric has no series before the first step.)
    let step = |m: &str, step: &str| {
        let series = format!(r#"tern_rollout_steps_total{{step="{step}",tenant="site"}}"#);
        series_value(m, &series).unwrap_or(0.0)
    };
    let waited = Instant::now();
    while step(&s.metrics().await, "restart") == 0.0 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "no restart step"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Three more rounds of the rollouts: the stage holds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m = s.metrics().await;
    let steps = ["restart", "advance", "promote"].map(|name| step(&m, name));
    assert_eq!(
        steps,
        [1.0, 0.0, 0.0],
        "steps taken: restart, advance, promote"
    );
    let (_, t) = s
        .admin_call(Method::GET, "/admin/v1/tenants/site", "")
        .await;
    assert_eq!(t["current"]["id"].as_str().unwrap()[..12], current, "{t}");
    let c = &t["candidate"];
    assert_eq!(c["version"]["id"].as_str().unwrap()[..12], cand, "{t}");
    assert_eq!(
        (c["plan"]["stage"].as_u64(), c["percent"].as_str()),
        (Some(0), Some("50%"))
    );
    let since = c["plan"]["since_ms"].as_u64().unwrap();
    assert!(
        since >= restarted,
        "the stage runs again from the restart: {t}"
    );
    assert_eq!(
        c["next_stage_at_ms"].as_u64(),
        Some(since + 3_600_000),
        "{t}"
    );
    let keys = user_keys(400);
    let n = share(&versions(s.addr(), "/site/", &keys).await, &cand);
    assert!((140..=260).contains(&n), "{n} of 400 at 50 %");
    let (status, audit) = s
        .admin_call(Method::GET, "/admin/v1/audit?tenant=site", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let steps: Vec<&str> = (audit["records"].as_array().unwrap().iter())
        .filter(|r| r["who"] == "rollout")
        .map(|r| r["step"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["restart"], "{audit}");
}

/// What would lose a rollout or makes no sense is refused with a clear error, and leaves the
/// tenant as it was (its entity tag unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_that_would_lose_a_rollout_or_make_no_sense_are_refused() {
    let s = TestServer::start("").await;
    let echo = demo("echo");
    let (status, _) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/empty",
            r#"{"paths": ["/empty"]}"#,
        )
        .await;
    assert!(status.is_success());
    let (status, v) = candidate(&s, "empty", echo, "percent=10").await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("deploy without --percent first"),
        "{v}"
    );
    tenant(&s, "site", json!({}), echo).await;
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/tenants/site/promote", "")
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let (status, _) = set_share(&s, "site", "5").await;
    assert_eq!(status, StatusCode::CONFLICT);
    for (query, says) in [
        ("percent=101", "percentage from 0 to 100"),
        ("percent=-1", "percentage"),
        ("percent=1.234", "percentage"),
        ("stages=5%25%2C50%25%3A1m", "only the last stage"),
        ("stages=50%25%3A1m%2C5%25%3A1m", "shares grow"),
        ("percent=10&stages=5%25%3A1m", "first stage"),
        ("percent=10&key=ip", "split key"),
        ("percent=10&override_from=10.0.0.0%2F33", "override_from"),
        ("percent=10&abort=x", "abort"),
        ("key=client", "percent or stages"),
    ] {
        let (status, v) = candidate(&s, "site", &variant(echo, "2"), query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{query}: {v}");
    }
    let (status, v) = candidate(&s, "site", echo, "percent=10").await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the current version as its own candidate: {v}"
    );
    let (status, v) = candidate(&s, "site", &variant(echo, "2"), "percent=10").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, before) = s
        .admin_call(Method::GET, "/admin/v1/tenants/site", "")
        .await;
    // A new current version while a candidate is in rollout would drop it: refused.
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/site/module",
            variant(echo, "3"),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("tern promote site"),
        "{v}"
    );
    for body in [r#"{"percent": 101}"#, r#"{"share": 5}"#, "nope"] {
        let (status, v) = s
            .admin_call(Method::POST, "/admin/v1/tenants/site/rollout", body)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
    }
    let (_, after) = s
        .admin_call(Method::GET, "/admin/v1/tenants/site", "")
        .await;
    assert_eq!(before["etag"], after["etag"], "refusals changed the tenant");
    assert_eq!(before["candidate"]["plan"], after["candidate"]["plan"]);
}

/// The CLI, as the README shows it: `tern deploy --percent`, `tern tenants`, `tern deploy
/// NAME --percent` (no module), `tern promote`, and `tern rollback` of a candidate; the access
/// line and the live log name the version that answered.
#[test]
fn the_cli_deploys_a_candidate_moves_its_share_and_promotes_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let data = cache.join("data");
    let tern = TernProcess::serve_with(&["--no-demo"], &cache, |cmd| {
        cmd.env("TERN_LOG", "info,tern::access=info");
    });
    let echo = demo_file(dir.path(), "echo");
    let v2 = dir.path().join("echo-v2.wasm");
    std::fs::write(&v2, variant(&std::fs::read(&echo).unwrap(), "2")).unwrap();
    let cli = |args: &[&str]| {
        let out = ran(tern_bin()
            .args(args)
            .args(["--server", &format!("http://{}", tern.admin)])
            .arg("--data-dir")
            .arg(&data));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    cli(&["deploy", "site", echo.to_str().unwrap()]);
    let out = cli(&[
        "deploy",
        "site",
        v2.to_str().unwrap(),
        "--percent",
        "10",
        "--key",
        "cookie:uid",
    ]);
    assert!(
        out.contains("as its candidate") && out.contains("10% of its clients"),
        "{out}"
    );
    assert!(out.contains("tern promote site"), "{out}");
    let list = cli(&["tenants"]);
    assert!(list.contains(" at 10%"), "{list}");
    // The cookie splits the clients: among 200 of them both versions answer, each cookie
    // always the same one.
    let by_cookie = |uid: usize| {
        let req = format!(
            "GET /site/ HTTP/1.1\r\nhost: x\r\ncookie: a=1; uid={uid}\r\nconnection: close\r\n\r\n"
        );
        let reply = raw_exchange(
            tern.addr.parse().unwrap(),
            req.as_bytes(),
            Duration::from_secs(20),
        );
        let reply = String::from_utf8_lossy(&reply).to_string();
        let at = reply
            .find("version;desc=")
            .expect("a version in Server-Timing");
        reply[at + 13..at + 25].to_string()
    };
    let seen: Vec<String> = (0..200).map(by_cookie).collect();
    let mut versions_seen = seen.clone();
    versions_seen.sort();
    versions_seen.dedup();
    assert_eq!(versions_seen.len(), 2, "{versions_seen:?}");
    assert!(
        (1..=60).contains(
            &(seen
                .iter()
                .filter(|v| **v != seen[0])
                .count()
                .min(seen.iter().filter(|v| **v == seen[0]).count()))
        )
    );
    assert!((0..200).step_by(20).all(|uid| by_cookie(uid) == seen[uid]));
    let out = cli(&["deploy", "site", "--percent", "100"]);
    assert!(out.contains("now serves 100% of its clients"), "{out}");
    let t: Value = serde_json::from_str(&cli(&["tenants", "site"])).unwrap();
    let cand = t["candidate"]["version"]["id"].as_str().unwrap()[..12].to_string();
    let reply = raw_exchange(
        tern.addr.parse().unwrap(),
        b"GET /site/ HTTP/1.1\r\nhost: x\r\ncookie: uid=7\r\nconnection: close\r\n\r\n",
        Duration::from_secs(20),
    );
    let reply = String::from_utf8_lossy(&reply).to_string();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains(&format!("version;desc={cand}")), "{reply}");
    // The access line names the version that answered.
    tern.wait_for(&format!("tenant_version=\"{cand}\""));
    let out = cli(&["promote", "site"]);
    assert!(
        out.contains(&format!("version {cand} serves every client")),
        "{out}"
    );
    let out = cli(&["rollback", "site"]);
    assert!(out.contains("rolled site back"), "{out}");
    // A candidate rolled back: the current version stays.
    cli(&["deploy", "site", v2.to_str().unwrap(), "--percent", "5"]);
    let out = cli(&["rollback", "site"]);
    assert!(
        out.contains("candidate") && out.contains("serves every client"),
        "{out}"
    );
}

/// Every guest kind serves as a candidate beside another kind: a `tern` ABI guest's tenant
/// with a `wasi:http` component as its candidate, then a CGI program; each key's answers come
/// from its own version's guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guest_kind_serves_as_a_candidate() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let component = std::fs::read(test_component(dir.path(), "component")).unwrap();
    let cgi = std::fs::read(test_guest(dir.path(), "cgi_probe")).unwrap();
    let current = tenant(&s, "site", json!({}), demo("echo")).await;
    let keys = user_keys(200);
    for (wasm, kind, path, says) in [
        (
            component,
            "wasi-http",
            "/site/hello",
            "Hello from a component!",
        ),
        (cgi, "cgi", "/site/env", "SERVER_PROTOCOL="),
    ] {
        let query = format!("percent=50&key=header%3Ax-user&kind={kind}");
        let (status, v) = candidate(&s, "site", &wasm, &query).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["kind"], kind, "{v}");
        let cand = v["version"].as_str().unwrap()[..12].to_string();
        let mut conn = Conn::open(s.addr()).await;
        let mut of_each = (0, 0);
        for key in &keys {
            let r = as_user(&mut conn, path, key).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            if version_of(&r) == cand {
                assert!(r.text().contains(says), "{kind}: {}", r.text());
                of_each.0 += 1;
            } else {
                assert_eq!(version_of(&r), current);
                assert!(r.text().starts_with(&format!("GET {path}")), "{}", r.text());
                of_each.1 += 1;
            }
        }
        assert!(of_each.0 > 50 && of_each.1 > 50, "{kind}: {of_each:?}");
    }
}

/// A candidate whose streamed answers are cut by a trap after their head (a `200` head, a cut
/// body) fails by the abort rule as a 5xx would: aborted, with every failure counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_failing_after_its_head_is_aborted_too() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let guest = std::fs::read(test_guest(dir.path(), "cache_headers")).unwrap();
    tenant(&s, "site", json!({}), demo("echo")).await;
    let query = "percent=50&key=header%3Ax-user&abort=5&abort_min_requests=20";
    let cand = deployed_candidate(&s, "site", &guest, query).await;
    // Raw requests: a client library would fail on the candidate's cut bodies.
    let mut to_candidate = 0;
    for i in 0..400 {
        let req = format!(
            "GET /site/x?trap_after=200000 HTTP/1.1\r\nhost: x\r\nx-user: u-{i}\r\n\
             connection: close\r\n\r\n"
        );
        let reply = raw(s.addr(), req).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        to_candidate += usize::from(reply.contains(&format!("version;desc={cand}")));
        if to_candidate == 20 {
            break;
        }
    }
    assert_eq!(to_candidate, 20, "the candidate's share of 400 requests");
    let t = aborted(&s, Instant::now()).await;
    let reason = t["candidate"]["plan"]["aborted"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("failed 20 of 20 requests"), "{reason}");
}
