//! The admin listener: `/metrics` (Prometheus), `/healthz`, `/readyz`, and the admin API
//! under `/admin/v1/` (bearer token). Never served on the public listener.
//!
//! | method and path | what it does |
//! |---|---|
//! | `GET /admin/v1/tenants` | every tenant: routes, limits, versions, request counts |
//! | `GET /admin/v1/tenants/{name}` | one tenant |
//! | `PUT /admin/v1/tenants/{name}` | create a tenant, or replace its spec (JSON; every field the tenant has set must be named) |
//! | `PATCH /admin/v1/tenants/{name}` | change only the named fields of its spec (JSON merge patch, RFC 7396: `null` resets a field) |
//! | `PUT /admin/v1/tenants/{name}/module[?assets=HASH][&kind=KIND]` | deploy a `.wasm` (the body): a module or component; `kind` = `tern`, `wasi-http` or `cgi` (else detected) |
//! | `PUT /admin/v1/tenants/{name}/module?percent=10[&stages=...][&key=...][&abort=5][&abort_min_requests=100][&override_from=NETS]` | deploy the `.wasm` as the tenant's candidate: it serves `percent` of the clients (split by `key`: `client`, `header:NAME`, `cookie:NAME`) beside the current version; `stages` (`5%:5m,25%:10m,100%`) move the share by time; `abort` (percentage points) aborts it when its 5xx rate is that much above the current version's over `abort_min_requests` |
//! | `POST /admin/v1/tenants/{name}/rollout` | give the candidate another share: JSON `{"percent": 50}` (its stages end; an aborted candidate serves again) |
//! | `POST /admin/v1/tenants/{name}/promote` | make the candidate the current version |
//! | `POST /admin/v1/tenants/{name}/rollback` | drop the candidate, if there is one; else back to the previous version |
//! | `DELETE /admin/v1/tenants/{name}` | remove a tenant |
//! | `GET /admin/v1/tenants/{name}/schedules` | its schedules (`[[tenant.schedule]]`): each one's next five times and last runs (in a fleet, every replica's) |
//! | `POST /admin/v1/tenants/{name}/schedules/run` | run a schedule now, on this server: JSON `{"schedule": "NAME"}`; answers when the run ends, with its status |
//! | `POST /admin/v1/tenants/{name}/cache/purge` | drop stored answers from its cache on this server: JSON `{"all": true}`, `{"prefixes": [...]}` or `{"tags": [...]}` |
//! | `POST /admin/v1/tenants/{name}/publish` | send messages to its events-mode WebSocket connections subscribed to a channel (or to one connection), on every replica: Pushpin's publish JSON `{"items": [{"channel": "room", "formats": {"ws-message": {"content": "hi"}}}]}` |
//! | `GET /admin/v1/tenants/{name}/logs?follow=1&status=5xx&...` | its requests as live log records, one JSON object a line (NDJSON; server-sent events with `Accept: text/event-stream` or `format=sse`): those kept (`since`), then as they come (`follow`); filters `status`, `outcome`, `method`, `path`, `search`, `version`, `sample`; in a fleet, every replica's merged (`local=1`: this one's) |
//! | `GET /admin/v1/tenants/{name}/variables` | its variables: plain ones with their values, secrets with a digest only |
//! | `PUT /admin/v1/tenants/{name}/variables/{var}` | set a variable: JSON `{"value": "...", "secret": true}` (`secret` false or left out: plain); the next request reads it |
//! | `DELETE /admin/v1/tenants/{name}/variables/{var}` | delete a variable |
//! | `POST /admin/v1/secrets/reseal` | seal every secret again under the current secrets key (after a rotation) |
//! | `POST /admin/v1/assets` | store a tar archive of assets; returns its hash |
//! | `POST /admin/v1/reload` | re-read the config file (as `SIGHUP` does) |
//! | `GET /admin/v1/certificates` | every certificate the TLS listener serves: config file, uploaded, ACME |
//! | `PUT /admin/v1/certificates/{name}` | upload a certificate (JSON `hosts`, `cert`, `key` PEM); served from the next handshake |
//! | `DELETE /admin/v1/certificates/{name}` | remove an uploaded or ACME certificate |
//! | `POST /admin/v1/tokens` | make a scoped token (JSON `name`, `tenants`, `scopes`, `expires`); the token is in the answer, once |
//! | `GET /admin/v1/tokens` | the scoped tokens (never a secret) |
//! | `DELETE /admin/v1/tokens/{id}` | revoke a scoped token |
//! | `GET /admin/v1/audit?since=UNIX&tenant=NAME&limit=N` | the audit log's records, oldest first (in a fleet, every replica's) |
//! | `POST /admin/v1/tokens/{id}/rotate` | a new secret for a scoped token (JSON `expires`, optional); the old one is refused |
//!
//! Who may call each is decided in one place ([`action`] and [`crate::access::decide`]): the
//! operator's token everything, a scoped token its tenants with its scopes.

use std::sync::Arc;
use std::time::Instant;

use http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::access::{self, Action, Principal, Refusal, Scope};
use crate::app::App;
use crate::body::plain;
use crate::body::{RequestBody, ResponseBody};
use crate::metrics;
use crate::registry::{ChangeError, NewToken, Precondition, SpecChange, TokenRefused};

/// Largest JSON body the admin API reads (tenant specs).
const MAX_JSON_BYTES: u64 = 1024 * 1024;

/// Serves one admin-listener request.
pub async fn handle(
    app: Arc<App>,
    req: Request<RequestBody>,
    client: std::net::SocketAddr,
) -> Response<ResponseBody> {
    if req.uri().path().starts_with("/admin/") {
        return api(app, req, client.ip()).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "this endpoint takes GET\n");
    }
    match req.uri().path() {
        "/metrics" => {
            // With traces on, a scraper asking for OpenMetrics (Prometheus does) gets it, with
            // the trace ids of kept requests as exemplars on the latency histograms.
            let openmetrics = app.tracer.is_some()
                && req
                    .headers()
                    .get(http::header::ACCEPT)
                    .is_some_and(|a| metrics::Metrics::openmetrics_wanted(a.as_bytes()));
            // Rendering walks every metric; keep it off the reactor's critical path.
            let app2 = app.clone();
            let body = tokio::task::spawn_blocking(move || {
                let engine = app2.registry.engine();
                if openmetrics {
                    app2.metrics.render_openmetrics(&engine)
                } else {
                    app2.metrics.render(&engine)
                }
            })
            .await
            .unwrap_or_default();
            let mut resp = Response::new(ResponseBody::full(body));
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(if openmetrics {
                    metrics::OPENMETRICS_CONTENT_TYPE
                } else {
                    metrics::CONTENT_TYPE
                }),
            );
            resp
        }
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if app.pool.available() == 0 {
                plain(StatusCode::SERVICE_UNAVAILABLE, "pool exhausted\n")
            } else if !app.registry.ready() {
                plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the shared registry has not been read yet and there is no snapshot of it \
                     to serve\n",
                )
            } else {
                plain(StatusCode::OK, "ready\n")
            }
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "admin endpoints: /metrics /healthz /readyz /admin/v1/tenants\n",
        ),
    }
}

/// What the audit log is told of one admin request ([`crate::audit`]).
struct Audited<'a> {
    app: &'a App,
    client: std::net::IpAddr,
    method: &'a str,
    path: &'a str,
    tenant: Option<&'a str>,
    /// Refused by the one decision (a tenant a token does not reach reads as `404`).
    refused: bool,
    /// The request's id (`x-request-id`).
    request_id: &'a str,
}

impl Audited<'_> {
    /// Writes its line: who (`None`: a refused bearer, `named` the token id it names), how it
    /// ended, the version it made current and the spec fields it named.
    fn write(
        &self,
        who: Option<&Who>,
        named: Option<&str>,
        status: StatusCode,
        version: Option<&str>,
        token_made: Option<&str>,
        fields: &[String],
    ) {
        let (kind, token, token_name) = match who {
            None => ("unknown", named, None),
            Some(Who::Operator) => ("operator", None, None),
            Some(Who::Token(id, t)) => ("token", Some(id.as_str()), Some(t.name.as_str())),
        };
        let outcome = if status.is_success() {
            "done"
        } else if self.refused || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
        {
            "refused"
        } else {
            "failed"
        };
        let time_ms = crate::audit::now_ms();
        self.app.audit.record(crate::audit::Record {
            time: time_ms / 1000,
            time_ms,
            replica: None,
            request_id: self.request_id,
            who: kind,
            token,
            token_name,
            client: self.client,
            method: self.method,
            path: self.path,
            tenant: self.tenant,
            status: status.as_u16(),
            outcome,
            version,
            token_made,
            fields,
            step: None,
        });
    }
}

/// The bearer token `headers` carry, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Who an admin request comes from: the operator, or a scoped token ([`access`]).
enum Who {
    Operator,
    Token(String, access::StoredToken),
}

impl Who {
    fn principal(&self) -> Principal<'_> {
        match self {
            Self::Operator => Principal::Operator,
            Self::Token(id, t) => Principal::Token(id, t),
        }
    }

    /// A tenant listing with only the tenants this caller reaches.
    fn only_reached(&self, mut listing: Value) -> Value {
        if let (Self::Token(_, t), Some(tenants)) = (self, listing["tenants"].as_array_mut()) {
            tenants.retain(|tenant| tenant["name"].as_str().is_some_and(|n| t.reaches(n)));
        }
        listing
    }
}

/// Who the bearer token in `headers` is, or why it is refused (`401`).
fn who(app: &App, headers: &HeaderMap) -> Result<Who, &'static str> {
    const MISSING: &str = "missing or wrong admin token (Authorization: Bearer <token>)";
    let bearer = bearer(headers).ok_or(MISSING)?;
    if access::is_operator(&app.admin_token, bearer) {
        return Ok(Who::Operator);
    }
    match app.registry.scoped_token(bearer) {
        Ok((id, token)) => Ok(Who::Token(id, token)),
        Err(TokenRefused::Expired) => Err("this admin token has expired"),
        Err(TokenRefused::Unknown) => Err(MISSING),
    }
}

/// What an endpoint does, as far as who may do it goes: the scope it needs on which tenant.
/// Setting and deleting a variable need `variables` or `secrets` by the variable, decided
/// once it is known; an unknown endpoint is left to answer `404` to any valid token.
fn action<'a>(method: &Method, parts: &[&'a str]) -> Action<'a> {
    match (method, parts) {
        (&Method::GET, ["tenants"]) => Action::Any(Scope::Read),
        (&Method::GET, ["tenants", name]) => Action::Tenant(name, Scope::Read),
        (
            _,
            ["tenants", name]
            | [
                "tenants",
                name,
                "module" | "rollback" | "rollout" | "promote",
            ],
        ) => Action::Tenant(name, Scope::Deploy),
        (_, ["tenants", name, "cache", "purge"]) => Action::Tenant(name, Scope::Purge),
        (_, ["tenants", name, "schedules", "run"]) => Action::Tenant(name, Scope::Deploy),
        (_, ["tenants", name, "publish"]) => Action::Tenant(name, Scope::Publish),
        (_, ["tenants", name, "logs"]) => Action::Tenant(name, Scope::Logs),
        (&Method::GET, ["tenants", name, "variables"]) => Action::Tenant(name, Scope::Variables),
        (_, ["tenants", name, ..]) => Action::Tenant(name, Scope::Read),
        (_, ["assets"]) => Action::Any(Scope::Deploy),
        (
            _,
            ["secrets", ..]
            | ["reload"]
            | ["fleet", ..]
            | ["certificates", ..]
            | ["tokens", ..]
            | ["audit"],
        ) => Action::Operator,
        _ => Action::Any(Scope::Read),
    }
}

/// The answer to a refused request.
fn refusal(r: Refusal) -> ChangeError {
    match r {
        Refusal::NoTenant(words) => ChangeError::NotFound(words),
        Refusal::Scope(scope) => ChangeError::Forbidden(format!(
            "this token lacks the scope {:?} for this tenant",
            scope.name()
        )),
        Refusal::OperatorOnly => {
            ChangeError::Forbidden("only the operator's token may do this".into())
        }
    }
}

/// Whether the request carries the admin token. Both sides are hashed first, so the
/// comparison takes the same time whatever the token's length or where it differs.
fn json_response(status: StatusCode, value: &Value) -> Response<ResponseBody> {
    let mut text = serde_json::to_vec_pretty(value).unwrap_or_default();
    text.push(b'\n');
    let mut resp = Response::new(ResponseBody::full(text));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_response(e: &ChangeError) -> Response<ResponseBody> {
    json_response(e.status(), &json!({ "error": e.to_string() }))
}

/// How long the rest of an upload past the limit is read (and discarded) before the `413`.
const DISCARD_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// The schedule a `schedules/run` body names: `{"schedule": "NAME"}`.
fn schedule_named(body: &[u8]) -> Result<String, ChangeError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ChangeError::Invalid(format!("the body must be JSON: {e}")))?;
    v["schedule"].as_str().map(str::to_string).ok_or_else(|| {
        ChangeError::Invalid(
            "the body must name the schedule: {\"schedule\": \"NAME\"} (its `name`, or its \
             cron expression when it has none)"
                .into(),
        )
    })
}

/// Reads a body of at most `limit` bytes.
///
/// A larger body is refused with `413`, but only after the rest of it has been read and
/// discarded (up to twice the limit, for at most [`DISCARD_FOR`]): a client still sending when
/// the connection closed would get a reset instead of the answer.
async fn read_body(req: Request<RequestBody>, limit: u64) -> Result<bytes::Bytes, ChangeError> {
    let too_large = || {
        ChangeError::TooLarge(format!(
            "the upload is larger than this server accepts ({limit} bytes; \
             server.max_upload_bytes)"
        ))
    };
    let unreadable = |e: crate::body::BodyFailure| {
        ChangeError::Invalid(format!("could not read the request body: {e}"))
    };
    let declared = crate::body::declared_length(req.headers());
    let mut body = req.into_body();
    let mut seen = 0u64;
    if declared.is_none_or(|n| n <= limit) {
        let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0) as usize);
        loop {
            let Some(frame) = body.frame().await else {
                return Ok(buf.freeze());
            };
            let Ok(data) = frame.map_err(unreadable)?.into_data() else {
                continue;
            };
            seen += data.len() as u64;
            if seen > limit {
                break;
            }
            buf.extend_from_slice(&data);
        }
    }
    let bound = limit.saturating_mul(2).max(1 << 20);
    let discard = async {
        while seen <= bound {
            match body.frame().await {
                Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len() as u64),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_FOR, discard).await;
    Err(too_large())
}

/// The rollout a deploy's query asks for (`percent`, `stages`, `key`, `abort`,
/// `abort_min_requests`, `override_from`, percent-encoded), `None` for a deploy of a new
/// current version.
///
/// # Errors
/// `400`: a value that does not read, or rollout settings without a share or stages.
fn rollout_of(query: Option<&str>) -> Result<Option<crate::rollout::Plan>, ChangeError> {
    use crate::rollout::{Abort, Key, Plan, now_ms, parse_percent, parse_stages};
    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let named = ["key", "abort", "abort_min_requests", "override_from"];
    let (percent, stages) = (get("percent"), get("stages"));
    if percent.is_none() && stages.is_none() {
        return match named.iter().find(|k| get(k).is_some()) {
            Some(k) => Err(ChangeError::Invalid(format!(
                "{k} is a rollout's: deploy as a candidate with percent or stages"
            ))),
            None => Ok(None),
        };
    }
    let share = percent
        .map(parse_percent)
        .transpose()
        .map_err(ChangeError::Invalid)?;
    let stages = stages
        .map(parse_stages)
        .transpose()
        .map_err(ChangeError::Invalid)?;
    let mut plan =
        Plan::new(share, stages.unwrap_or_default(), now_ms()).map_err(ChangeError::Invalid)?;
    if let Some(key) = get("key") {
        plan.key = Key::parse(key).map_err(ChangeError::Invalid)?;
    }
    let number = |k: &str| {
        get(k)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite() && *n >= 0.0)
                    .ok_or_else(|| {
                        ChangeError::Invalid(format!("{k}={v:?}: a number of 0 or more"))
                    })
            })
            .transpose()
    };
    let margin = number("abort")?;
    let min = number("abort_min_requests")?;
    if margin.is_some() || min.is_some() {
        plan.abort = Some(Abort {
            margin: margin.unwrap_or(Abort::MARGIN),
            min_requests: min.map_or(Abort::MIN_REQUESTS, |n| n as u64),
        });
    }
    if let Some(nets) = get("override_from") {
        plan.override_from = nets
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        crate::context::TrustedProxies::parse(&plan.override_from)
            .map_err(|e| ChangeError::Invalid(format!("override_from: {e}")))?;
    }
    Ok(Some(plan))
}

/// The share a `POST .../rollout` asks for: JSON `{"percent": 50}` (a number or a string).
fn share_of(body: &bytes::Bytes) -> Result<u16, ChangeError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ChangeError::Invalid(format!("not JSON: {e}")))?;
    let text = match &v["percent"] {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => {
            return Err(ChangeError::Invalid(
                "JSON {\"percent\": N}: the candidate's share, 0-100".into(),
            ));
        }
    };
    crate::rollout::parse_percent(&text).map_err(ChangeError::Invalid)
}

/// The answer to a change of a rollout: the tenant as it is now.
async fn rollout_answer(
    app: &App,
    name: &str,
    changed: &crate::registry::RolloutChanged,
) -> Result<(StatusCode, Value), ChangeError> {
    let mut v = app.registry.describe(Some(name)).await?;
    v["etag"] = json!(changed.etag);
    v["version"] = json!(changed.entry.current.as_ref().map(|c| &c.id));
    Ok((StatusCode::OK, v))
}

fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// An admin API request, answered with its `x-request-id` (the client's, else a new one),
/// which its audit line carries too.
async fn api(
    app: Arc<App>,
    req: Request<RequestBody>,
    client: std::net::IpAddr,
) -> Response<ResponseBody> {
    let id =
        crate::http::client_request_id(req.headers()).unwrap_or_else(crate::http::new_request_id);
    let mut resp = answer(app, req, client, id.to_str().unwrap_or("-")).await;
    resp.headers_mut()
        .insert(crate::http::X_REQUEST_ID.clone(), id);
    resp
}

async fn answer(
    app: Arc<App>,
    req: Request<RequestBody>,
    client: std::net::IpAddr,
    request_id: &str,
) -> Response<ResponseBody> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut audited = Audited {
        app: &app,
        client,
        method: method.as_str(),
        path: &path,
        tenant: None,
        refused: false,
        request_id,
    };
    let who = match who(&app, req.headers()) {
        Ok(who) => who,
        Err(why) => {
            if app.failures.over(client, crate::datadir::now()) {
                app.metrics.admin_throttled.inc();
                let mut resp = json_response(
                    StatusCode::TOO_MANY_REQUESTS,
                    &json!({ "error": "too many failed admin attempts from this address: retry in a second" }),
                );
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
                return resp;
            }
            let named = bearer(req.headers()).and_then(access::id_of);
            audited.write(None, named, StatusCode::UNAUTHORIZED, None, None, &[]);
            let mut resp = json_response(StatusCode::UNAUTHORIZED, &json!({ "error": why }));
            resp.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tern-admin\""),
            );
            return resp;
        }
    };
    let started = Instant::now();
    let query = req.uri().query().map(str::to_string);
    let Some(rest) = path.strip_prefix("/admin/v1/") else {
        return error_response(&ChangeError::NotFound(
            "the admin API lives under /admin/v1/".into(),
        ));
    };
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    if let ["tenants", name, ..] = parts.as_slice() {
        audited.tenant = Some(name);
    }
    if let Err(refused) = access::decide(who.principal(), action(&method, &parts)) {
        let e = refusal(refused);
        audited.refused = true;
        audited.write(Some(&who), None, e.status(), None, None, &[]);
        return error_response(&e);
    }
    // A live log streams: answered here, not as one JSON value.
    if let (&Method::GET, ["tenants", name, "logs"]) = (&method, parts.as_slice()) {
        return logs(&app, name, query.as_deref(), req.headers());
    }
    // The spec fields a change of a tenant names (for the audit log: names only).
    let mut fields: Vec<String> = Vec::new();
    let registry = &app.registry;
    // `If-Match` / `If-None-Match` on a tenant change: refused with 412 unless the tenant is
    // in the state they name.
    let pre = match Precondition::from_headers(req.headers()) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    // Whose tenant a replica's request about one is ([`crate::fleet::TENANT_KEY`]).
    let tenant_key = req.headers().get(crate::fleet::TENANT_KEY).cloned();
    let result: Result<(StatusCode, Value), ChangeError> = match (&method, parts.as_slice()) {
        (&Method::GET, ["tenants"]) => registry
            .describe(None)
            .await
            .map(|v| (StatusCode::OK, who.only_reached(v))),
        (&Method::GET, ["tenants", name]) => registry
            .describe(Some(name))
            .await
            .map(|v| (StatusCode::OK, v)),
        (&Method::PUT | &Method::PATCH, ["tenants", name]) => {
            let name = name.to_string();
            let merge = method == Method::PATCH;
            match read_body(req, MAX_JSON_BYTES).await.and_then(|b| {
                serde_json::from_slice::<Value>(&b).map_err(|e| {
                    ChangeError::Invalid(format!("the tenant spec is not valid JSON: {e}"))
                })
            }) {
                Err(e) => Err(e),
                Ok(body) => {
                    fields = body
                        .as_object()
                        .map(|o| o.keys().cloned().collect())
                        .unwrap_or_default();
                    let change = if merge {
                        SpecChange::Merge(body)
                    } else {
                        SpecChange::Replace(body)
                    };
                    match registry
                        .put_spec(&name, change, &pre, who.principal())
                        .await
                    {
                        Ok((created, etag)) => registry.describe(Some(&name)).await.map(|mut v| {
                            let status = if created {
                                StatusCode::CREATED
                            } else {
                                StatusCode::OK
                            };
                            // This change's own tag (another may have followed it already).
                            v["etag"] = json!(etag);
                            (status, v)
                        }),
                        Err(e) => Err(e),
                    }
                }
            }
        }
        (&Method::DELETE, ["tenants", name]) => {
            let deleted = registry.delete(name, &pre).await;
            if let Ok(data) = &deleted {
                // Its schedules' runs go with it (a new tenant of the name starts anew).
                crate::scheduler::Scheduler::forget(&app, name, data).await;
            }
            deleted.map(|_| (StatusCode::OK, json!({ "deleted": name })))
        }
        (&Method::PUT, ["tenants", name, "module"]) => {
            let name = name.to_string();
            let assets = query_param(query.as_deref(), "assets").map(str::to_string);
            let kind = query_param(query.as_deref(), "kind")
                .map(str::parse::<crate::config::GuestKind>)
                .transpose()
                .map_err(ChangeError::Invalid);
            match kind.and_then(|k| Ok((k, rollout_of(query.as_deref())?))) {
                Err(e) => Err(e),
                Ok((kind, rollout)) => match read_body(req, registry.max_upload()).await {
                    Err(e) => Err(e),
                    Ok(wasm) => registry
                        .deploy(&name, wasm, (assets, kind), rollout, &pre)
                        .await
                        .map(|d| {
                            let v = &d.version;
                            (
                                StatusCode::OK,
                                json!({
                                    "tenant": name,
                                    "version": v.id,
                                    "module": v.module,
                                    "module_bytes": v.module_bytes,
                                    "assets": v.assets,
                                    "compile_ms": v.compile_ms,
                                    "deploy_ms": started.elapsed().as_secs_f64() * 1e3,
                                    "previous": d.previous.map(|p| p.id),
                                    "kind": d.kind.name(),
                                    "warnings": d.warnings,
                                    "etag": d.etag,
                                    "candidate": d.rollout.as_ref().map(|p| json!({
                                        "percent": p.percent(),
                                        "plan": p,
                                    })),
                                }),
                            )
                        }),
                },
            }
        }
        (&Method::POST, ["tenants", name, "rollback"]) => {
            registry.rollback(name, &pre).await.map(|d| {
                (
                    StatusCode::OK,
                    json!({
                        "tenant": name,
                        "version": d.version.id,
                        "previous": d.previous.map(|p| p.id),
                        "dropped_candidate": d.dropped.map(|c| c.id),
                        "etag": d.etag,
                    }),
                )
            })
        }
        (&Method::POST, ["tenants", name, "rollout"]) => {
            let share = read_body(req, MAX_JSON_BYTES)
                .await
                .and_then(|body| share_of(&body));
            match share {
                Err(e) => Err(e),
                Ok(share) => match registry.set_share(name, share, &pre).await {
                    Err(e) => Err(e),
                    Ok(changed) => rollout_answer(&app, name, &changed).await,
                },
            }
        }
        (&Method::POST, ["tenants", name, "promote"]) => match registry.promote(name, &pre).await {
            Err(e) => Err(e),
            Ok(changed) => rollout_answer(&app, name, &changed).await,
        },
        (&Method::GET, ["tenants", name, "schedules"]) => {
            crate::scheduler::Scheduler::list(&app, name)
                .await
                .map(|v| (StatusCode::OK, v))
        }
        (&Method::POST, ["tenants", name, "schedules", "run"]) => {
            match read_body(req, MAX_JSON_BYTES)
                .await
                .and_then(|b| schedule_named(&b))
            {
                Err(e) => Err(e),
                Ok(schedule) => crate::scheduler::Scheduler::run_now(&app, name, &schedule)
                    .await
                    .map(|ran| {
                        (
                            StatusCode::OK,
                            json!({ "tenant": name, "schedule": schedule, "run": ran }),
                        )
                    }),
            }
        }
        (&Method::POST, ["tenants", name, "cache", "purge"]) => {
            purge(&app, name, read_body(req, MAX_JSON_BYTES).await).await
        }
        (&Method::POST, ["tenants", name, "publish"]) => {
            publish(&app, name, read_body(req, MAX_JSON_BYTES * 2).await, None)
        }
        (&Method::POST, ["fleet", "publish", name]) => publish(
            &app,
            name,
            read_body(req, MAX_JSON_BYTES * 2).await,
            Some(tenant_key.as_ref()),
        ),
        (&Method::GET, ["tenants", name, "variables"]) => registry
            .variables(name)
            .await
            .map(|vars| (StatusCode::OK, json!({ "tenant": name, "variables": vars }))),
        (&Method::PUT, ["tenants", name, "variables", var]) => {
            set_variable(&app, &who, name, var, read_body(req, MAX_JSON_BYTES).await).await
        }
        (&Method::DELETE, ["tenants", name, "variables", var]) => {
            delete_variable(&app, &who, name, var).await
        }
        (&Method::POST, ["tokens"]) => {
            create_token(&app, read_body(req, MAX_JSON_BYTES).await).await
        }
        (&Method::GET, ["tokens"]) => Ok((
            StatusCode::OK,
            json!({ "tokens": registry.list_tokens().await }),
        )),
        (&Method::POST, ["tokens", id, "rotate"]) => {
            rotate_token(&app, id, read_body(req, MAX_JSON_BYTES).await).await
        }
        (&Method::DELETE, ["tokens", id]) => registry
            .revoke_token(id)
            .await
            .map(|()| (StatusCode::OK, json!({ "revoked": id }))),
        (&Method::POST, ["secrets", "reseal"]) => registry.reseal().await.map(|n| {
            (
                StatusCode::OK,
                json!({ "resealed": n, "key": registry.secrets_key_id() }),
            )
        }),
        (&Method::POST, ["assets"]) => match read_body(req, registry.max_upload()).await {
            Err(e) => Err(e),
            Ok(archive) => registry.put_assets(archive).await.map(|(hash, a)| {
                (
                    StatusCode::CREATED,
                    json!({ "assets": hash, "entries": a.entries(), "bytes": a.bytes() }),
                )
            }),
        },
        (_, ["certificates"] | ["certificates", _]) => {
            certificates(&app, &method, &parts, req).await
        }
        (&Method::POST, ["reload"]) => app
            .reload()
            .await
            .map(|n| (StatusCode::OK, json!({ "config_tenants": n }))),
        (&Method::GET, ["audit"]) => audit(&app, query.as_deref()).await,
        (&Method::GET, ["fleet"]) => registry.fleet_view().await.map(|v| (StatusCode::OK, v)),
        (&Method::POST, ["fleet", "sync"]) => registry
            .nudged(
                req.headers()
                    .get(crate::fleet::NUDGE_FROM)
                    .and_then(|v| v.to_str().ok()),
            )
            .map(|()| (StatusCode::ACCEPTED, json!({ "sync": "started" }))),
        (
            _,
            ["tenants"]
            | ["tenants", _]
            | ["tenants", _, "module" | "rollback" | "rollout" | "promote"]
            | ["tenants", _, "cache", "purge"]
            | ["tenants", _, "schedules"]
            | ["tenants", _, "schedules", "run"]
            | ["tenants", _, "publish"]
            | ["tenants", _, "logs"]
            | ["tenants", _, "variables"]
            | ["tenants", _, "variables", _],
        )
        | (
            _,
            ["assets"]
            | ["reload"]
            | ["fleet"]
            | ["fleet", "sync"]
            | ["fleet", "publish", _]
            | ["secrets", "reseal"]
            | ["tokens"]
            | ["tokens", _]
            | ["tokens", _, "rotate"]
            | ["audit"],
        ) => Err(ChangeError::MethodNotAllowed(format!(
            "{method} is not allowed on {path}"
        ))),
        _ => Err(ChangeError::NotFound(format!(
            "no admin endpoint {path}; see GET /admin/v1/tenants"
        ))),
    };
    let (status, version, made) = match &result {
        Ok((status, v)) => (
            *status,
            v["version"].as_str(),
            (parts.as_slice() == ["tokens"])
                .then(|| v["id"].as_str())
                .flatten(),
        ),
        Err(e) => (e.status(), None, None),
    };
    // Every change (a nudge or a publish passed on between replicas is none, nor is a
    // publish: messages, not changes), and every refusal.
    let nudge = matches!(
        parts.as_slice(),
        ["fleet", "sync" | "publish", ..] | ["tenants", _, "publish"]
    );
    if (method != Method::GET && method != Method::HEAD && !nudge)
        || status == StatusCode::FORBIDDEN
    {
        audited.write(Some(&who), None, status, version, made, &fields);
    }
    match result {
        Ok((status, v)) => {
            let mut resp = json_response(status, &v);
            // A tenant's entity tag, for a conditional change later (`If-Match`).
            if let Some(tag) = v["etag"]
                .as_str()
                .and_then(|t| HeaderValue::from_str(t).ok())
            {
                resp.headers_mut().insert(http::header::ETAG, tag);
            }
            resp
        }
        Err(e) => error_response(&e),
    }
}

/// `GET /admin/v1/tenants/{name}/logs`: the tenant's live log as a stream (NDJSON, or
/// server-sent events), on this replica or, in a fleet, every replica's merged. `429` past
/// the tenant's tailers; `409` when live logs are off.
fn logs(app: &App, name: &str, query: Option<&str>, headers: &HeaderMap) -> Response<ResponseBody> {
    use crate::livelog::{filter::Asked, stream};
    let sse = headers
        .get(http::header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    let asked = match Asked::parse(query, sse, crate::livelog::now_ms()) {
        Ok(asked) => asked,
        Err(why) => return error_response(&ChangeError::Invalid(why)),
    };
    let live = app.registry.live();
    let Some(tenant) = live.tenants.get(name) else {
        return error_response(&ChangeError::NotFound(format!("no tenant named {name:?}")));
    };
    if let Err(e) = crate::app::asked_of(tenant, headers.get(crate::fleet::TENANT_KEY)) {
        return error_response(&e);
    }
    if !tenant.logs.is_on() {
        return error_response(&ChangeError::Conflict(
            "live logs are off on this server (server.live_logs.history = 0)".into(),
        ));
    }
    let Some(attached) = tenant.logs.attach() else {
        let mut resp = json_response(
            StatusCode::TOO_MANY_REQUESTS,
            &json!({ "error": format!(
                "tenant {name:?} has as many live log readers as it may on this server \
                 (server.live_logs.max_tailers); close one and retry"
            ) }),
        );
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
        return resp;
    };
    let readers = &app.live_logs;
    let writer = stream::Writer {
        replica: readers.replica.clone(),
        tenant: name.into(),
        with_query: app.access_log_query,
        sse: asked.sse,
    };
    let (local, sse) = (asked.local, asked.sse);
    let reader = stream::Reader::new(attached, asked, readers.shutdown.clone());
    let body = match app.registry.fleet() {
        Some(fleet) if !local => {
            crate::livelog::fleet::merged(fleet, (name, &tenant.data), reader, writer, query)
        }
        _ => stream::body(reader, writer),
    };
    let mut resp = Response::new(body);
    let kind = if sse {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    // A proxy in front must pass each record on as it comes.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// `POST /admin/v1/tenants/{name}/cache/purge`: drops (or with `soft` makes stale) the stored
/// answers the JSON `body` names from the tenant's cache, here and on every replica of a fleet.
async fn purge(
    app: &App,
    name: &str,
    body: Result<bytes::Bytes, ChangeError>,
) -> Result<(StatusCode, Value), ChangeError> {
    let purge: crate::cache::Purge = serde_json::from_slice(&body?)
        .map_err(|e| ChangeError::Invalid(format!("the purge is not valid: {e}")))?;
    app.registry
        .purge(name, &purge)
        .await
        .map(|v| (StatusCode::OK, v))
}

/// `POST /admin/v1/tenants/{name}/publish`: sends the messages of the JSON `body` (Pushpin's
/// publish format) to the tenant's events-mode WebSocket connections here and, unless it was
/// `forwarded` by another replica, on every other replica of a fleet.
fn publish(
    app: &App,
    name: &str,
    body: Result<bytes::Bytes, ChangeError>,
    forwarded: Option<Option<&HeaderValue>>,
) -> Result<(StatusCode, Value), ChangeError> {
    let items = crate::websocket::channels::Publish::read(&body?).map_err(ChangeError::Invalid)?;
    let forwarded = forwarded.map(|key| key.map(HeaderValue::as_bytes));
    let done = app.publish(name, &items, forwarded)?;
    let forwarded = forwarded.is_some();
    let fleet = app.registry.fleet().is_some() && !forwarded;
    Ok((
        StatusCode::OK,
        json!({
            "tenant": name,
            "items": items.len(),
            "delivered": done.delivered,
            "dropped": done.dropped,
            "replicas": if fleet { "this one, and sent on to the others" } else { "this one" },
        }),
    ))
}

/// What `PUT /admin/v1/tenants/{name}/variables/{var}` reads.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SetVariable {
    value: String,
    #[serde(default)]
    secret: bool,
}

/// `PUT /admin/v1/tenants/{name}/variables/{var}`: sets a variable from the JSON `body`. A
/// malformed body is described by where it is wrong, never by what it holds (it may be a
/// secret).
async fn set_variable(
    app: &App,
    who: &Who,
    name: &str,
    var: &str,
    body: Result<bytes::Bytes, ChangeError>,
) -> Result<(StatusCode, Value), ChangeError> {
    let set: SetVariable = serde_json::from_slice(&body?).map_err(|e| {
        ChangeError::Invalid(format!(
            "a variable is JSON {{\"value\": \"...\", \"secret\": true|false}} (this body is \
             not, at line {} column {})",
            e.line(),
            e.column()
        ))
    })?;
    let scope = Scope::for_variable(set.secret);
    access::decide(who.principal(), Action::Tenant(name, scope)).map_err(refusal)?;
    if let Principal::Token(..) = who.principal() {
        // Setting a variable replaces the one of its name: a secret with a plain value (or
        // the other way round) needs the scope of what it replaces too.
        let was_secret = stored_secret(app, name, var).await?;
        if let Some(was_secret) = was_secret.filter(|was| *was != set.secret) {
            let replaced = Scope::for_variable(was_secret);
            access::decide(who.principal(), Action::Tenant(name, replaced)).map_err(refusal)?;
        }
    }
    let listed = app
        .registry
        .set_variable(name, var, &set.value, set.secret)
        .await?;
    Ok((
        StatusCode::OK,
        json!({ "tenant": name, "variable": listed }),
    ))
}

/// Whether tenant `name`'s variable `var` is a secret; `None` if it has none of that name.
async fn stored_secret(app: &App, name: &str, var: &str) -> Result<Option<bool>, ChangeError> {
    let variables = app.registry.variables(name).await?;
    Ok(variables.iter().find(|v| v.name == var).map(|v| v.secret))
}

/// `DELETE /admin/v1/tenants/{name}/variables/{var}`: a secret needs the `secrets` scope, a
/// plain variable `variables`.
async fn delete_variable(
    app: &App,
    who: &Who,
    name: &str,
    var: &str,
) -> Result<(StatusCode, Value), ChangeError> {
    if let Principal::Token(..) = who.principal() {
        let secret = stored_secret(app, name, var).await?;
        let scope = Scope::for_variable(secret.unwrap_or(false));
        access::decide(who.principal(), Action::Tenant(name, scope)).map_err(refusal)?;
    }
    app.registry
        .delete_variable(name, var)
        .await
        .map(|()| (StatusCode::OK, json!({ "tenant": name, "deleted": var })))
}

/// `POST /admin/v1/tokens`: makes a scoped token from the JSON `body`; the answer holds the
/// token, shown this once.
async fn create_token(
    app: &App,
    body: Result<bytes::Bytes, ChangeError>,
) -> Result<(StatusCode, Value), ChangeError> {
    let new: NewToken = serde_json::from_slice(&body?).map_err(|e| {
        ChangeError::Invalid(format!(
            "a token is JSON {{\"name\": \"...\", \"tenants\": [...], \"scopes\": [...], \
             \"expires\": \"30d\"}}: {e}"
        ))
    })?;
    let (token, listed) = app.registry.create_token(&new).await?;
    let mut v = json!(listed);
    v["token"] = json!(token);
    Ok((StatusCode::CREATED, v))
}

/// `GET /admin/v1/audit?since=UNIX&tenant=NAME&limit=N`: the audit's records, oldest first
/// (in a fleet, every replica's).
async fn audit(app: &App, query: Option<&str>) -> Result<(StatusCode, Value), ChangeError> {
    let number = |key: &str| -> Result<Option<u64>, ChangeError> {
        query_param(query, key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ChangeError::Invalid(format!("{key}={v:?} is not a whole number")))
            })
            .transpose()
    };
    let q = crate::audit::Query {
        since: number("since")?,
        tenant: query_param(query, "tenant").map(str::to_string),
        limit: number("limit")?.map_or(1000, |n| n as usize),
    };
    if q.limit == 0 || q.limit > crate::audit::MAX_READ {
        return Err(ChangeError::Invalid(format!(
            "limit is 1 to {}, not {}",
            crate::audit::MAX_READ,
            q.limit
        )));
    }
    let remote = app.registry.fleet().map(|f| &f.remote);
    let found = app.audit.read(remote, &q).await.map_err(|e| {
        ChangeError::Unavailable(format!("the shared registry cannot be read: {e}"))
    })?;
    Ok((StatusCode::OK, json!(found)))
}

/// `POST /admin/v1/tokens/{id}/rotate`: a new secret for token `id`, in the answer once; the
/// body is empty or JSON `{"expires": "30d"}`.
async fn rotate_token(
    app: &App,
    id: &str,
    body: Result<bytes::Bytes, ChangeError>,
) -> Result<(StatusCode, Value), ChangeError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rotate {
        expires: Option<String>,
    }
    let body = body?;
    let rotate: Rotate = if body.iter().all(u8::is_ascii_whitespace) {
        Rotate { expires: None }
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ChangeError::Invalid(format!(
                "a rotation is empty or JSON {{\"expires\": \"30d\"}}: {e}"
            ))
        })?
    };
    let (token, listed) = app
        .registry
        .rotate_token(id, rotate.expires.as_deref())
        .await?;
    let mut v = json!(listed);
    v["token"] = json!(token);
    Ok((StatusCode::OK, v))
}

/// `/admin/v1/certificates[/{name}]`.
async fn certificates(
    app: &App,
    method: &Method,
    parts: &[&str],
    req: Request<RequestBody>,
) -> Result<(StatusCode, Value), ChangeError> {
    use crate::tls::uploads::Upload;
    let Some(certificates) = app.certificates() else {
        return Err(ChangeError::Conflict(
            "this server has no TLS listener: set server.tls_listen (and restart) to serve \
             certificates"
                .into(),
        ));
    };
    match (method, parts) {
        (&Method::GET, ["certificates"]) => {
            certificates.describe().await.map(|v| (StatusCode::OK, v))
        }
        (&Method::PUT, ["certificates", name]) => {
            let body = read_body(req, MAX_JSON_BYTES).await?;
            let upload: Upload = serde_json::from_slice(&body).map_err(|e| {
                ChangeError::Invalid(format!(
                    "a certificate upload is JSON {{\"hosts\": [...], \"cert\": PEM, \"key\": \
                     PEM}}: {e}"
                ))
            })?;
            let created = certificates.put_uploaded(name, upload).await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((status, json!({ "certificate": name, "created": created })))
        }
        (&Method::DELETE, ["certificates", name]) => certificates
            .delete_stored(name)
            .await
            .map(|()| (StatusCode::OK, json!({ "deleted": name }))),
        _ => Err(ChangeError::MethodNotAllowed(format!(
            "{method} is not allowed on /admin/v1/{}",
            parts.join("/")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `headers` carry the operator's `token`, as `who` reads them.
    fn authorised(token: &str, headers: &HeaderMap) -> bool {
        bearer(headers).is_some_and(|given| access::is_operator(token, given))
    }

    #[test]
    fn tokens_are_compared_whole() {
        let mut h = HeaderMap::new();
        assert!(!authorised("secret", &h));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer secret"));
        assert!(authorised("secret", &h));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer secre"));
        assert!(!authorised("secret", &h));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic secret"));
        assert!(!authorised("secret", &h));
        for padded in ["Bearer  secret", "Bearer \tsecret", "Bearer secret "] {
            h.insert(AUTHORIZATION, HeaderValue::from_str(padded).unwrap());
            assert!(!authorised("secret", &h), "{padded:?}");
        }
    }
}
