//! The handles' state machine, driven as the linker drives it, without a guest: usage errors,
//! the policy's refusals and the limits on headers and bodies.

use super::*;
use crate::body::RequestBody;
use crate::context::{Connection, RequestContext};
use crate::logwriter::LogBudget;
use crate::metrics::Metrics;
use crate::outbound::{Grant, OutboundConfig, Policy};

/// A guest's outbound handles and its request's session.
struct Guest {
    session: Session,
    table: Outbound,
}

impl Guest {
    fn calls(&mut self) -> OutboundCalls<'_> {
        self.table.with(&mut self.session)
    }

    fn last_error(&self) -> &str {
        self.table.last_error()
    }
}

/// A guest's outbound calls under `[tenant.outbound]` keys `toml`, with its tenant's metrics.
fn outbound(toml: &str) -> (Guest, Metrics) {
    let config: OutboundConfig = toml::from_str(toml).unwrap();
    let metrics = Metrics::new(10);
    let calls = Grant {
        policy: Policy::from_config(&config).unwrap(),
        label: "t".into(),
        requests: metrics.outbound_requests.clone(),
        duration: metrics.outbound_duration.with_label_values(&["t"]),
        opened: metrics.outbound_connections.clone(),
        log_budget: Arc::new(LogBudget::new(10, metrics.log_dropped.clone())),
        readthrough: None,
    };
    let session = Session::new(Arc::new(calls), &context());
    let table = Outbound::default();
    (Guest { session, table }, metrics)
}

/// What the server knows of the client's request.
fn context() -> RequestContext {
    let peer = "127.0.0.1:40000".parse().unwrap();
    RequestContext {
        conn: Connection::plain(peer),
        client: peer,
        request_id: HeaderValue::from_static("r1"),
        prefix_len: 0,
        version: http::Version::HTTP_11,
        trace: None,
        timeout: None,
        trigger: crate::trigger::Trigger::Request,
    }
}

/// The client's request the guest is answering.
fn incoming() -> GuestRequest {
    let context = context();
    let (method, uri) = (Method::GET, "/".parse().unwrap());
    GuestRequest::new(
        method,
        uri,
        HeaderMap::new(),
        RequestBody::Empty,
        1024,
        context,
    )
}

const ORIGIN: &str = "[backends.origin]\nurl = \"http://127.0.0.1:9\"\n";

fn counted(metrics: &Metrics, backend: &str, status: &str) -> u64 {
    metrics
        .outbound_requests
        .with_label_values(&["t", backend, status])
        .get()
}

/// `code` is `expected`, and the reason kept for `outbound_last_error` says `says`.
fn assert_refused(out: &Guest, code: i32, expected: i32, says: &str) {
    assert_eq!(code, expected, "{}", out.last_error());
    assert!(out.last_error().contains(says), "{}", out.last_error());
}

/// A request of `method` to the `origin` backend, made; its handle.
async fn made(out: &mut Guest, method: &[u8]) -> i32 {
    out.calls()
        .request(&incoming(), method, b"origin".to_vec(), b"/".to_vec())
        .await
}

/// The headers of the request being built in `handle`.
fn draft_headers(out: &mut Guest, handle: i32) -> HeaderMap {
    match out.calls().get(handle) {
        Ok(Call::Building(draft)) => draft.headers.clone(),
        _ => panic!("handle {handle} is not being built"),
    }
}

#[tokio::test]
async fn a_handle_never_made_is_a_usage_error_with_its_reason() {
    let (mut out, _) = outbound(ORIGIN);
    assert_eq!(
        out.calls().header_append(3, b"x-a", b"1"),
        errno::INVALID_ARGUMENT
    );
    assert_eq!(out.last_error(), "3 is not an outbound request handle");
    assert_eq!(
        out.calls().body_write(-1, b"x".to_vec()).await,
        errno::INVALID_ARGUMENT
    );
    assert_eq!(out.calls().body_finish(0).await, errno::INVALID_ARGUMENT);
    assert_eq!(
        out.calls().response_status(0).await,
        errno::INVALID_ARGUMENT
    );
    assert_eq!(out.calls().close(0), errno::INVALID_ARGUMENT);
}

#[tokio::test]
async fn requests_go_to_named_backends_and_others_are_denied_and_counted() {
    let (mut out, metrics) = outbound(ORIGIN);
    let req = incoming();
    assert_eq!(
        out.calls()
            .request(&req, b"GET", b"origin".to_vec(), b"/x".to_vec())
            .await,
        0
    );
    assert_eq!(
        out.calls()
            .request(&req, b"GET", b"origin".to_vec(), b"/y".to_vec())
            .await,
        1
    );
    let code = out
        .calls()
        .request(&req, b"GET", b"elsewhere".to_vec(), b"/".to_vec())
        .await;
    assert_refused(&out, code, errno::DENIED, "elsewhere");
    assert_eq!(counted(&metrics, "unknown", "denied"), 1);
    // Nothing was made for the refused request: the next handle is 2.
    assert_eq!(
        out.calls()
            .request(&req, b"GET", b"origin".to_vec(), b"/".to_vec())
            .await,
        2
    );
}

#[tokio::test]
async fn malformed_arguments_are_usage_errors() {
    let (mut out, _) = outbound(ORIGIN);
    let req = incoming();
    let code = out
        .calls()
        .request(&req, b"GET", vec![0xff], b"/".to_vec())
        .await;
    assert_eq!(code, errno::INVALID_ARGUMENT);
    assert_eq!(out.last_error(), "the backend name and URL must be UTF-8");
    let code = out
        .calls()
        .request(&req, b"G T", b"origin".to_vec(), b"/".to_vec())
        .await;
    assert_eq!(
        (code, out.last_error()),
        (errno::INVALID_ARGUMENT, "not an HTTP method")
    );
    let code = out
        .calls()
        .request(&req, b"GET", Vec::new(), Vec::new())
        .await;
    assert_eq!(code, errno::INVALID_ARGUMENT);
    let h = out
        .calls()
        .request(&req, b"GET", b"origin".to_vec(), b"/".to_vec())
        .await;
    assert_eq!(
        out.calls().header_append(h, b"bad name", b"1"),
        errno::INVALID_ARGUMENT
    );
    assert_eq!(
        out.calls().header_append(h, b"x-a", b"bad\nvalue"),
        errno::INVALID_ARGUMENT
    );
}

#[tokio::test]
async fn more_requests_than_max_requests_are_refused_and_counted() {
    let (mut out, metrics) = outbound(&format!("max_requests = 2\n{ORIGIN}"));
    let req = incoming();
    for expected in [0, 1] {
        let h = out
            .calls()
            .request(&req, b"GET", b"origin".to_vec(), b"/".to_vec())
            .await;
        assert_eq!(h, expected);
    }
    let code = out
        .calls()
        .request(&req, b"GET", b"origin".to_vec(), b"/".to_vec())
        .await;
    assert_refused(&out, code, errno::LIMIT_EXCEEDED, "max_requests");
    assert_eq!(counted(&metrics, "origin", "limit"), 1);
}

#[tokio::test]
async fn headers_tern_sets_are_dropped_and_their_number_is_bounded() {
    let (mut out, _) = outbound(ORIGIN);
    let h = made(&mut out, b"POST").await;
    for name in [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "cdn-loop",
    ] {
        assert_eq!(
            out.calls().header_append(h, name.as_bytes(), b"x"),
            0,
            "{name}"
        );
    }
    assert!(draft_headers(&mut out, h).is_empty());
    for i in 0..MAX_HEADERS {
        assert_eq!(
            out.calls()
                .header_append(h, b"x-n", i.to_string().as_bytes()),
            0
        );
    }
    assert_eq!(
        out.calls().header_append(h, b"x-n", b"one more"),
        errno::LIMIT_EXCEEDED
    );
    assert_eq!(draft_headers(&mut out, h).len(), MAX_HEADERS);
}

#[tokio::test]
async fn a_body_is_kept_up_to_max_request_bytes_and_refused_past_it() {
    let (mut out, _) = outbound(&format!("max_request_bytes = 10\n{ORIGIN}"));
    let h = made(&mut out, b"POST").await;
    assert_eq!(out.calls().body_write(h, vec![b'a'; 6]).await, 6);
    assert_eq!(out.calls().body_write(h, vec![b'b'; 4]).await, 4); // exactly the limit
    assert_eq!(
        out.calls().body_write(h, vec![b'c'; 1]).await,
        errno::LIMIT_EXCEEDED
    );
    assert!(
        out.last_error().contains("larger than 10 bytes"),
        "{}",
        out.last_error()
    );
    match out.calls().get(h) {
        Ok(Call::Building(draft)) => assert_eq!(&draft.body[..], b"aaaaaabbbb"),
        _ => panic!("the request is still being built"),
    }
}

#[tokio::test]
async fn a_closed_handle_answers_usage_errors_and_finishing_an_unsent_body_is_one() {
    let (mut out, _) = outbound(ORIGIN);
    let h = made(&mut out, b"GET").await;
    assert_eq!(out.calls().body_finish(h).await, errno::INVALID_ARGUMENT);
    assert_eq!(
        out.last_error(),
        "the request has not been sent (call outbound_send)"
    );
    // Still being built: headers may be added after the refused finish.
    assert_eq!(out.calls().header_append(h, b"x-a", b"1"), 0);
    assert_eq!(out.calls().close(h), 0);
    assert_eq!(
        out.calls().header_append(h, b"x-a", b"2"),
        errno::INVALID_ARGUMENT
    );
    assert_eq!(
        out.calls().body_write(h, b"x".to_vec()).await,
        errno::INVALID_ARGUMENT
    );
    assert_eq!(
        out.calls().response_status(h).await,
        errno::INVALID_ARGUMENT
    );
}
