//! The command line's client of the admin API: where it is, the token, and its calls.

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use std::path::Path;

/// Where the admin API is and how to authenticate.
#[derive(Debug, Clone)]
pub struct AdminClient {
    /// Base URL of the admin listener, e.g. `http://127.0.0.1:9090`.
    pub server: String,
    /// The bearer token.
    pub token: String,
    /// Where the token came from, for a `401`'s message.
    pub token_source: String,
    /// The entity tag a change is conditional on (`If-Match`), if any.
    pub if_match: Option<String>,
}

impl AdminClient {
    /// The server from `--server` (default `http://127.0.0.1:9090`), the token from `--token`,
    /// else the token file in `data_dir` that `tern serve` wrote.
    ///
    /// # Errors
    /// If no token is given and the token file cannot be read.
    pub fn resolve(server: String, token: Option<String>, data_dir: &Path) -> anyhow::Result<Self> {
        let (token, token_source) = match token.filter(|t| !t.is_empty()) {
            Some(t) => (t, "--token or TERN_ADMIN_TOKEN".to_string()),
            None => {
                let file = data_dir.join("admin-token");
                let token = std::fs::read_to_string(&file)
                    .map(|t| t.trim().to_string())
                    .with_context(|| {
                        format!(
                            "no admin token: pass --token or set TERN_ADMIN_TOKEN, or run where \
                             `tern serve` wrote {}",
                            file.display()
                        )
                    })?;
                (token, format!("the token file {}", file.display()))
            }
        };
        Ok(Self {
            server,
            token,
            token_source,
            if_match: None,
        })
    }

    /// This target, with its requests conditional on the entity tag `tag` (`If-Match`).
    pub(super) fn conditional(&self, tag: Option<String>) -> Self {
        Self {
            if_match: tag,
            ..self.clone()
        }
    }

    /// `GET path`: the answer's head, its body to be read as it comes (a stream).
    pub(super) async fn open(
        &self,
        path: &str,
    ) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
        self.request(Method::GET, path, Bytes::new(), "").await
    }

    /// Sends one request and returns the status and the JSON answer.
    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let resp = self.request(method, path, body, content_type).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!({ "error": String::from_utf8_lossy(&bytes).trim() }));
        Ok((status, value))
    }

    /// Sends one request: the answer's head, its body unread.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
        let url: Uri = format!("{}{path}", self.server.trim_end_matches('/'))
            .parse()
            .with_context(|| format!("bad server URL {:?}", self.server))?;
        if url.scheme_str() != Some("http") {
            bail!(
                "the server URL must start with http:// (got {:?})",
                self.server
            );
        }
        let host = url
            .host()
            .context("the server URL has no host")?
            .to_string();
        let port = url.port_u16().unwrap_or(80);
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .with_context(|| format!("cannot reach the admin API at {}", self.server))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(url.path_and_query().map_or("/", |p| p.as_str()))
            .header(http::header::HOST, format!("{host}:{port}"))
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(http::header::CONTENT_TYPE, content_type);
        let req = match &self.if_match {
            Some(tag) => req.header(http::header::IF_MATCH, tag),
            None => req,
        }
        .body(Full::new(body))?;
        Ok(send.send_request(req).await?)
    }

    /// A call without a body; its answer if it succeeded (see [`AdminClient::ok`]).
    pub(super) async fn send(&self, method: Method, path: &str) -> anyhow::Result<Value> {
        self.ok(method, path, Bytes::new(), "").await
    }

    /// A call with `body` as JSON; its answer if it succeeded (see [`AdminClient::ok`]).
    pub(super) async fn send_json(
        &self,
        method: Method,
        path: &str,
        body: &impl serde::Serialize,
    ) -> anyhow::Result<Value> {
        let body = Bytes::from(serde_json::to_vec(body)?);
        self.ok(method, path, body, "application/json").await
    }

    /// [`call`](Self::call), with any non-2xx answer turned into an error with its message.
    pub(super) async fn ok(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> anyhow::Result<Value> {
        let (status, value) = self.call(method, path, body, content_type).await?;
        if !status.is_success() {
            let msg = value["error"].as_str().unwrap_or("(no message)");
            let hint = if status == StatusCode::UNAUTHORIZED {
                format!(
                    " (the token came from {}; the server's is its admin_token setting, \
                     TERN_ADMIN_TOKEN, or the admin-token file in its data directory)",
                    self.token_source
                )
            } else {
                String::new()
            };
            bail!(
                "{} {}: {msg}{hint}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            );
        }
        Ok(value)
    }
}
