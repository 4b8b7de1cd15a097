//! A component's outgoing requests (`wasi:http/outgoing-handler`): sent through Tern's one
//! outbound path under the tenant's policy; only its failures are mapped to `wasi:http`'s error
//! codes here.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{RequestOptions, WasiBody, WasiHttpHooks};

use crate::outbound::{self, Denied, NoHead, OutBody, Refused, Session};

/// The future `send_request` returns.
type Sent = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                Response<WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

/// A component's outgoing requests go through its request's outbound session, under the
/// tenant's policy.
impl WasiHttpHooks for Session {
    fn send_request(
        &mut self,
        request: Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Sent {
        self.sent += 1;
        let calls = self.grant.clone();
        // `http://NAME/path` calls the tenant's backend NAME; any other URL must be an
        // allowed public host.
        let uri = request.uri().clone();
        let host = uri.host().unwrap_or_default();
        let backend = match calls.policy.backend_label(host) {
            Some(_) if uri.port().is_none() => host.to_string(),
            _ => String::new(),
        };
        // Worked out when the run was prepared (the request's headers went to the guest).
        let passing = self.passing(&HeaderMap::new(), None).clone();
        let admitted = calls.admit(
            self.sent,
            &passing,
            &calls.label(&backend),
            &self.request_id,
        );
        let shared = self.shared.get_or_insert_with(Arc::default).clone();
        let request_id = self.request_id.clone();
        Box::new(async move {
            use wasmtime_wasi_http::Error;
            match admitted {
                Ok(()) => {}
                Err(Refused::TooMany(_)) => return Err(Error::HttpRequestDenied),
                Err(Refused::Loop(_)) => return Err(Error::LoopDetected),
            }
            let pq = uri.path_and_query().map_or("/", |p| p.as_str());
            let target = if backend.is_empty() {
                calls.policy.destination("", &uri.to_string()).await
            } else {
                calls.policy.destination(&backend, pq).await
            };
            let target = match target {
                Ok(t) => t,
                Err(Denied::Unresolved { host, .. }) => {
                    calls.log_denied(&request_id, &format!("cannot resolve {host}"));
                    calls.count(outbound::URL_LABEL, "error");
                    return Err(Error::DnsError {
                        rcode: Some(format!("cannot resolve {host}")),
                        info_code: None,
                    });
                }
                Err(d) => {
                    calls.log_denied(&request_id, &d.to_string());
                    calls.count(outbound::URL_LABEL, "denied");
                    return Err(Error::HttpRequestDenied);
                }
            };
            let (parts, body) = request.into_parts();
            let body = http_body_util::Limited::new(body, calls.policy.max_request_bytes as usize)
                .map_err(|_| crate::body::BodyAborted)
                .boxed_unsync();
            let req = Request::from_parts(parts, OutBody::component(body, shared.clone()));
            let started = Instant::now();
            // The guest's request options may shorten the wait for the head, never lengthen
            // it. (The connect timeout is the worker's connector's: the tenant's.)
            let first_byte = options
                .and_then(|o| o.first_byte_timeout)
                .map_or(target.timeouts.first_byte, |t| {
                    t.min(target.timeouts.first_byte)
                });
            let sent = calls.exchange(&target, req, first_byte, &passing).await;
            shared
                .waited_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let resp = sent.map_err(|f| match f {
                NoHead::ConnectTimeout(_) => Error::ConnectionTimeout,
                NoHead::Connect(_) => Error::ConnectionRefused,
                NoHead::FirstByte(_) | NoHead::Total(_) => Error::ConnectionReadTimeout,
                NoHead::NoClient(e) => Error::InternalError(Some(e)),
                NoHead::Request(_) => Error::HttpProtocolError,
                NoHead::BadOverride(_) => Error::InternalError(Some(f.to_string())),
            })?;
            let max = calls.policy.max_response_bytes;
            let resp = resp.map(move |b| {
                // (The body holds the backend's in-flight slot until it is dropped.)
                http_body_util::Limited::new(b, max as usize)
                    .map_err(|e| match e.downcast::<hyper::Error>() {
                        Ok(e) => Error::Hyper(*e),
                        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                            Error::HttpResponseBodySize(None)
                        }
                        Err(e) => Error::InternalError(Some(e.to_string())),
                    })
                    .boxed_unsync()
            });
            let done: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
                Box::new(async { Ok(()) });
            Ok((resp, done))
        })
    }
}
