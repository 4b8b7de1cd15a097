//! The admin listener: `/metrics` (Prometheus), `/healthz`, `/readyz`. Never on the public port.

use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::body::ResponseBody;
use crate::http::{App, plain};
use crate::metrics;

/// Serves one admin request.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<ResponseBody> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "admin endpoints take GET\n");
    }
    match req.uri().path() {
        "/metrics" => {
            // Rendering walks every metric; keep it off the reactor's critical path.
            let app2 = app.clone();
            let body = tokio::task::spawn_blocking(move || app2.metrics.render(&app2.engine))
                .await
                .unwrap_or_default();
            let mut resp = Response::new(ResponseBody::full(body));
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            resp
        }
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if app.pool.available() == 0 {
                plain(StatusCode::SERVICE_UNAVAILABLE, "pool exhausted\n")
            } else {
                plain(StatusCode::OK, "ready\n")
            }
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "admin endpoints: /metrics /healthz /readyz\n",
        ),
    }
}
