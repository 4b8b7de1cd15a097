//! The request path's front end, as named steps ([`handle`]): `route` (framing, the normal
//! path, the host, ACME challenges, the router), `check` (the tenant's redirect to HTTPS, a
//! declared body over its limit, what the client takes in compression), `look_up` (the
//! tenant's cache: a stored answer ends the exchange here), `run` (`admit`: a pool slot and
//! the tenant's concurrency; the guest; `store`: its answer to the cache's fill), then for
//! every answer, whoever made it, `respond` (the tenant's policy on answers: compression,
//! HSTS) and `finish` (records only: request id, `Server-Timing`, counts, trace, access line).
//! Each step may end the exchange early with an answer of its own ([`exchange::Early`]). A
//! new step (a rate limit) is one more function between two of them; a policy on answers is
//! one more line in `respond`; what a step needs per tenant is prepared in
//! [`crate::tenant::front::Front`] when the tenant loads.
//!
//! One request context goes through the steps: [`exchange::Exchange`] (the connection, the
//! client, the routed tenant, ids, timings, trace, access line). The request body is Tern's
//! own [`RequestBody`], which every listener (TCP through hyper, QUIC through h3) hands the
//! same steps; `request` holds what the front end reads of a request (framing, host, ids,
//! redirects).
//!
//! [`handle`] never fails: every error becomes a short plain-text response with its own status,
//! an `x-request-id`, and a `Server-Timing` header with the phases the request reached.

use std::sync::Arc;
use std::time::Instant;

use http::header::CONNECTION;
use http::{HeaderValue, Method, Request, Response, StatusCode};

use crate::app::App;
use crate::body::{ResponseBody, declared_length, plain, plain_owned};
use crate::context::{Connection, Present, RequestContext};
use crate::execute::{self, Answer, Phases, Rest};
use crate::guest::{GuestRequest, Head, RequestBody};
use crate::metrics::{Phase, Timings};
use crate::outcome::{self, ExecError, Outcome};
use crate::pool::Admitted;
use crate::ratelimit::RateLimits;
use crate::rollout;
use crate::tenant::TenantRef;

pub mod exchange;
pub mod request;

use exchange::{Early, Exchange, Routed, error_response};
pub use request::{X_REQUEST_ID, client_request_id, new_request_id};
use request::{asterisk, authority, framing, https_location, redirect, with_path};

/// Where HTTP-01 challenge answers are asked for (RFC 8555 §8.3).
const ACME_CHALLENGE_PATH: &str = "/.well-known/acme-challenge/";

/// Serves one request that came on `conn`. Infallible: failures become responses.
///
/// The steps, in order: `route` (the tenant), `check` (what is decided before the cache and a
/// slot), `limit` (the tenant's rate limits), `look_up` (the tenant's cache), then `run` (`admit`, the guest, and the answer to the
/// cache's `store`); every answer then goes through `respond` and `finish` ([`Exchange`]).
/// Each step may end the exchange early with an answer of its own.
pub async fn handle(
    app: Arc<App>,
    mut req: Request<RequestBody>,
    conn: Connection,
) -> Response<ResponseBody> {
    // The client: the peer, or whom a trusted proxy in front says it forwards; one spelling
    // of each address (an IPv4 client of a `[::]` listener is `::ffff:a.b.c.d`), so that
    // its rate limits, failure counts, split and logs are one client's.
    let client = crate::context::canonical(if app.trusted_proxies.is_empty() {
        conn.peer
    } else {
        app.trusted_proxies.client(conn.peer, req.headers())
    });
    let mut ex = Exchange::begin(&app, &req, conn, client);
    let _in_flight = app.metrics.in_flight.enter();

    let routed = route(&app, &mut req, &ex.conn, client.ip(), ex.present).await;
    ex.lap(Phase::Route);
    match routed {
        Ok(routed) => ex.route_to(routed, &req),
        Err(early) => return ex.early(&app, early),
    }
    if let Err(early) = check(&app, &mut req, &mut ex) {
        return ex.early(&app, early);
    }
    // A WebSocket opening: checked, and its connection taken off the request (every guest
    // sees one shape of it).
    // (HTTP/1.1 opens with `Upgrade`, HTTP/2 with an extended `CONNECT`.)
    let may_open = ex.present.has(Present::UPGRADE) || req.method() == Method::CONNECT;
    let opening = match may_open
        .then(|| crate::websocket::opening(&mut req))
        .flatten()
    {
        None => None,
        Some(Ok(opening)) => Some(opening),
        Some(Err(bad)) => return ex.early(&app, bad_opening(&bad)),
    };
    match limit(&app, &req, &mut ex).await {
        Ok(wait) if wait.is_zero() => {}
        Ok(wait) => {
            tokio::time::sleep(wait).await;
            ex.waited_unphased();
        }
        Err(early) => return ex.early(&app, early),
    }
    // The guest's run and a WebSocket's life are awaited in boxes of their own: their state
    // (tens of KB with the lifecycle's) would otherwise be part of every request's future,
    // which hyper moves whole when a request comes in, a cache hit's too.
    if let Some(opening) = opening {
        return Box::pin(websocket(&app, ex, req, opening)).await;
    }
    let fill = match look_up(&app, &mut ex, &mut req).await {
        Looked::Guest(fill) => fill,
        // A hit comes compressed from the stored answer's copy (`Cache::lookup`).
        Looked::Cached(hit) => return ex.cached(&app, hit, false, false),
        Looked::Stale(stale, mut fill) => {
            // Served stale now; the guest is asked for a new answer in the background.
            let refresh = fill.refresh(&req);
            tokio::spawn(refresh_stale(app.clone(), refresh, *fill, &ex));
            return ex.cached(&app, *stale, false, true);
        }
    };
    match crate::budget::boxed::<2048, _>(run(&app, &mut ex, req, fill)).await {
        Ok((resp, reached)) => ex.answered(&app, resp, reached),
        // A stale answer the guest was to revalidate stands in for an overload, within its
        // `stale-if-error`.
        Err((_, Some(stale))) => ex.cached(&app, stale, true, true),
        Err((early, None)) => ex.early(&app, early),
    }
}

/// Runs `tenant`'s guest for a scheduled run ([`crate::scheduler`]): `req` (its path under
/// one of the tenant's paths) as if a client on this host had sent it, routed to the tenant's
/// current version, without the rate limits or the cache a client's request meets: a slot
/// (`admit`), the guest within `timeout` (the tenant's limit when `None`), and the records
/// every request gets (`/metrics`, `Server-Timing`, its trace, its live log, its access line).
pub async fn scheduled(
    app: &Arc<App>,
    tenant: TenantRef,
    req: Request<RequestBody>,
    timeout: Option<std::time::Duration>,
) -> Response<ResponseBody> {
    let here = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
    let mut ex = Exchange::begin(app, &req, crate::context::Connection::plain(here), here);
    ex.scheduled(timeout);
    let paths: Vec<&str> = tenant.paths.iter().map(String::as_str).collect();
    let prefix_len = crate::schedule::prefix_len(&paths, req.uri().path()).unwrap_or(0);
    let routed = Routed {
        tenant,
        prefix_len,
        host: request::HostFrom::Header,
        role: rollout::Role::Current,
        rollout: None,
        chosen: true,
    };
    ex.route_to(routed, &req);
    match run(app, &mut ex, req, None).await {
        Ok((resp, reached)) => ex.answered(app, resp, reached),
        Err((early, _)) => ex.early(app, early),
    }
}

/// A WebSocket opening: a place within the connection limits (`503` without one), the
/// guest's run (never the cache), and the handoff its answer asks for, or its answer as it is
/// (a `401`, say) when it asks for none.
async fn websocket(
    app: &Arc<App>,
    mut ex: Exchange,
    req: Request<RequestBody>,
    opening: crate::websocket::Opening,
) -> Response<ResponseBody> {
    let tenant = ex.tenant().clone();
    let refused = |why| {
        app.metrics
            .websocket_refused
            .with_label_values(&[tenant.label.as_str(), why])
            .inc();
    };
    let mode = tenant.front.websocket.mode;
    let place = match app.sockets.take(
        &tenant.data,
        &tenant.label,
        mode,
        tenant.front.websocket.max_connections,
    ) {
        Ok(place) => place,
        Err(full) => {
            let (why, message) = match full {
                crate::websocket::Full::Tenant => (
                    "tenant",
                    "this tenant has as many WebSocket connections open as it may \
                     (websocket.max_connections)",
                ),
                crate::websocket::Full::Server => (
                    "server",
                    "the server has as many WebSocket connections open as it may \
                     (max_websockets)",
                ),
            };
            refused(why);
            let e = ExecError::new(Outcome::Overload, message);
            return ex.early(app, Early::Refused(e, Phase::Route));
        }
    };
    if mode == crate::websocket::Mode::Events {
        return events(app, ex, req, opening, place).await;
    }
    // What the backend is sent: the request as the guest saw it.
    let (uri, headers) = (req.uri().clone(), req.headers().clone());
    let (mut resp, reached) = match run(app, &mut ex, req, None).await {
        Ok(answered) => answered,
        Err((early, _)) => return ex.early(app, early),
    };
    let Some(to) = crate::websocket::Handoff::asked(&mut resp) else {
        return ex.answered(app, resp, reached);
    };
    let backend = to.backend.clone();
    let client = crate::websocket::Client {
        opening,
        place,
        uri,
        headers,
        address: ex.client.ip(),
        tls: ex.conn.tls.is_some(),
    };
    let of = crate::websocket::Tenant {
        policy: &tenant.grants.outbound.policy,
        label: &tenant.label,
        limits: &tenant.front.websocket,
        max_request_bytes: tenant.limits.max_request_bytes,
    };
    match crate::websocket::handoff(of, &app.sockets, client, to).await {
        Ok(resp) => ex.answered(app, resp, reached),
        Err(failed) => {
            refused("backend");
            tracing::warn!(
                tenant = %tenant.name,
                request_id = ex.request_id.to_str().unwrap_or("-"),
                backend,
                "WebSocket handoff failed: {}",
                failed.why
            );
            let text = format!(
                "the WebSocket could not be handed on ({})\nrequest id: {}\n",
                failed.status.canonical_reason().unwrap_or("error"),
                ex.ids()
            );
            ex.answered(app, plain_owned(failed.status, text), reached)
        }
    }
}

/// An events-mode opening: the guest is sent the `OPEN` event (a `POST` of the opening's
/// path, in this exchange), and the connection is accepted when its answer is; each later
/// batch of the connection's events is a request of its own ([`EventsOrigin`]).
async fn events(
    app: &Arc<App>,
    mut ex: Exchange,
    req: Request<RequestBody>,
    opening: crate::websocket::Opening,
    place: crate::websocket::Place,
) -> Response<ResponseBody> {
    let routed = ex.routed.clone().expect("a routed request");
    let tenant = routed.tenant.clone();
    let (parts, _) = req.into_parts();
    let origin = Arc::new(EventsOrigin {
        app: app.clone(),
        conn: ex.conn.clone(),
        client: ex.client,
        channels: tenant.grants.channels.clone(),
        version: tenant.version_label.clone(),
        chosen: routed.chosen,
        prefix_len: routed.prefix_len,
        host: routed.host,
    });
    let mut headers = parts.headers;
    if let Some(t) = &ex.trace {
        // The batches' spans are the connection's children.
        t.active.stamp(&mut headers, t.active.server_span);
    }
    let session = crate::websocket::Session::new(origin, parts.uri, headers);
    // The opening's own exchange runs the guest on the `OPEN` event.
    let (resp, reached) = match run(app, &mut ex, session.opening_request(), None).await {
        Ok(answered) => answered,
        Err((early, _)) => return ex.early(app, early),
    };
    match session.accept(resp).await {
        Ok(accepted) => {
            let of = crate::websocket::Tenant {
                policy: &tenant.grants.outbound.policy,
                label: &tenant.label,
                limits: &tenant.front.websocket,
                max_request_bytes: tenant.limits.max_request_bytes,
            };
            let resp = crate::websocket::start_events(
                accepted,
                opening,
                place,
                &app.sockets,
                &tenant.grants.channels,
                of,
            );
            ex.answered(app, resp, reached)
        }
        Err(crate::websocket::Refused::Guest(resp)) => {
            app.metrics
                .websocket_refused
                .with_label_values(&[tenant.label.as_str(), "guest"])
                .inc();
            ex.answered(app, resp, reached)
        }
        Err(crate::websocket::Refused::Bad(why)) => {
            app.metrics
                .websocket_refused
                .with_label_values(&[tenant.label.as_str(), "guest"])
                .inc();
            tracing::warn!(
                tenant = %tenant.name,
                request_id = ex.request_id.to_str().unwrap_or("-"),
                "an events WebSocket was not opened: the guest {why}"
            );
            let text = format!(
                "the WebSocket could not be opened (the handler's answer to OPEN is not \
                 valid: {why})\nrequest id: {}\n",
                ex.ids()
            );
            ex.answered(app, plain_owned(StatusCode::BAD_GATEWAY, text), reached)
        }
    }
}

/// What an events connection's batches run on: its tenant's guest (as it is deployed when
/// the batch comes), each batch an exchange of its own (counted, traced, in the access log),
/// with the opening's connection and client.
struct EventsOrigin {
    app: Arc<App>,
    conn: Connection,
    client: std::net::SocketAddr,
    /// The tenant's channels when the connection opened: a tenant deleted and made again
    /// under its name has others (another key), and the connection's batches never reach it.
    channels: Arc<crate::websocket::channels::Grant>,
    /// The version it opened on.
    version: Arc<str>,
    /// Its opening asked for its version (`Tern-Version`): its batches go to that version
    /// while it is the tenant's candidate (an aborted one too, as a request asking for it).
    chosen: bool,
    prefix_len: usize,
    host: request::HostFrom,
}

impl EventsOrigin {
    /// The tenant the connection opened on, as it is deployed now (`None`: gone), and the
    /// version of it a batch with `headers` (the opening's, as every batch carries them) goes
    /// to: the one the tenant's split gives the connection's client now, as to a request of
    /// the client's (a candidate aborted, given a share of 0 or rolled back no longer gets
    /// its connections' events; a new one gets those whose client it gets); or, when the
    /// opening asked for its version, that version while it is the tenant's candidate, else
    /// the current one.
    fn tenant(&self, headers: &http::HeaderMap) -> Option<Picked> {
        let live = self.app.registry.live();
        let name = self.channels.name();
        let current = live.tenants.get(name)?;
        if current.grants.channels.key() != self.channels.key() {
            return None;
        }
        let candidate = live.candidates.get(name);
        let to_candidate = candidate.is_some_and(|c| {
            if self.chosen {
                c.tenant.version_label == self.version
            } else {
                c.split.role(headers, self.client.ip()) == rollout::Role::Candidate
            }
        });
        Some(match candidate {
            Some(c) if to_candidate => (
                c.tenant.clone(),
                rollout::Role::Candidate,
                Some(c.clone()),
                self.chosen,
            ),
            _ => (
                current.clone(),
                rollout::Role::Current,
                candidate.cloned(),
                self.chosen,
            ),
        })
    }
}

impl crate::websocket::Origin for EventsOrigin {
    fn call(
        &self,
        req: Request<RequestBody>,
    ) -> futures_util::future::BoxFuture<'static, Response<ResponseBody>> {
        let app = self.app.clone();
        let mut ex = Exchange::begin(&app, &req, self.conn.clone(), self.client);
        let tenant = self.tenant(req.headers());
        let (prefix_len, host) = (self.prefix_len, self.host);
        Box::pin(async move {
            let Some((tenant, role, rollout, chosen)) = tenant else {
                return plain(StatusCode::NOT_FOUND, "the tenant is gone\n");
            };
            ex.route_to(
                Routed {
                    tenant,
                    prefix_len,
                    host,
                    role,
                    rollout,
                    chosen,
                },
                &req,
            );
            match run(&app, &mut ex, req, None).await {
                Ok((resp, reached)) => ex.answered(&app, resp, reached),
                Err((early, _)) => ex.early(&app, early),
            }
        })
    }

    fn publish(&self, to: crate::websocket::Target, push: crate::websocket::Push) {
        // (Every version of the tenant has its channels.)
        if let Some((tenant, ..)) = self.tenant(&http::HeaderMap::new()) {
            tenant.grants.channels.publish(&[(to, push)], false);
        }
    }
}

/// The answer to an opening refused before any guest runs (`400`, with the version this
/// server speaks when that was what was wrong).
fn bad_opening(bad: &crate::websocket::BadOpening) -> Early {
    let mut e = ExecError::new(Outcome::BadRequest, bad.why);
    if bad.status == StatusCode::UPGRADE_REQUIRED {
        e.headers = Some(Box::new([(
            http::header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        )]));
    }
    Early::Refused(e, Phase::Route)
}

/// What the cache step decided.
enum Looked {
    /// The guest answers (and the cache, if the tenant has one, does what it may with it).
    Guest(Option<crate::cache::Fill>),
    /// Answered from the cache.
    Cached(Response<ResponseBody>),
    /// Answered with a stale stored answer, refreshed in the background by this fill.
    Stale(Box<Response<ResponseBody>>, Box<crate::cache::Fill>),
}

/// The tenant's cache, when it has one (the `cache` phase, which includes waiting for another
/// request filling the same key): a stored answer ends the exchange here; otherwise what the
/// cache does with the guest's answer.
async fn look_up(app: &App, ex: &mut Exchange, req: &mut Request<RequestBody>) -> Looked {
    let tenant = ex.tenant();
    let Some(cache) = tenant.front.cache_in_front() else {
        return Looked::Guest(None);
    };
    // The authority as the guest sees it (its `Host`, `HTTP_HOST`, `SERVER_PORT`, the URL it
    // builds links from), port included: an answer made for `host:1337` is not served to
    // `host`. (Userinfo never gets here: `route` refuses it.)
    let host = crate::context::host(req.uri(), req.headers())
        .and_then(|h| std::str::from_utf8(h).ok())
        .unwrap_or("");
    let asking = crate::cache::Asking {
        https: ex.conn.tls.is_some(),
        host,
        trusted: app.trusted_proxies.contains(ex.conn.peer.ip()),
        space: crate::cache::Space::Front(tenant.cache_version),
        compress: tenant.front.compression.as_ref().zip(ex.asked),
        body: !http_body::Body::is_end_stream(req.body()),
        // The phase's start (route's end) is when it asks: a look at once needs no clock.
        at: ex.mark,
        present: ex.present,
    };
    let looked = cache.lookup(req, asking).await;
    let looked = match looked {
        crate::cache::Lookup::Hit(resp) => Looked::Cached(resp),
        crate::cache::Lookup::Refresh(resp, fill) => Looked::Stale(Box::new(resp), Box::new(fill)),
        crate::cache::Lookup::Miss(mut fill) => {
            fill.take_validators(req);
            Looked::Guest(Some(fill))
        }
    };
    ex.lap(Phase::Cache);
    looked
}

/// The steps from a slot to the answer, shared by a client's request and a stale answer's
/// refresh: `admit` (a slot), the guest's run, and `store` (the answer to the cache's `fill`,
/// which keeps it as the cache allows and hands it on). Refused: why, and the stale answer
/// that may stand in (a `fill` that was to revalidate one, within its `stale-if-error`).
async fn run(
    app: &Arc<App>,
    ex: &mut Exchange,
    req: Request<RequestBody>,
    fill: Option<crate::cache::Fill>,
) -> Result<(Response<ResponseBody>, Phase), (Early, Option<Response<ResponseBody>>)> {
    let admitted = match admit(app, ex).await {
        Ok(admitted) => admitted,
        Err(early) => return Err((early, fill.and_then(crate::cache::Fill::stale_instead))),
    };
    let (resp, reached) = run_guest(app, ex, req, admitted).await;
    // The cache keeps the plain answer; the client gets it compressed (`respond`).
    let resp = match fill {
        Some(fill) => fill.answered(resp),
        None => resp,
    };
    Ok((resp, reached))
}

/// Asks the guest for a new answer to a stale one served (`stale-while-revalidate`): a
/// request of its own (`from`'s connection, client and tenant) through [`run`], its answer
/// given to the cache (and counted as a request of the tenant) and to nobody else.
fn refresh_stale(
    app: Arc<App>,
    req: Request<()>,
    fill: crate::cache::Fill,
    from: &Exchange,
) -> impl std::future::Future<Output = ()> + use<> {
    let req = req.map(|()| RequestBody::Empty);
    let mut ex = Exchange::begin(&app, &req, from.conn.clone(), from.client);
    if let Some(routed) = &from.routed {
        ex.route_to(routed.clone(), &req);
    }
    async move {
        let resp = match run(&app, &mut ex, req, Some(fill)).await {
            Ok((resp, reached)) => ex.answered(&app, resp, reached),
            Err((early, _)) => ex.early(&app, early),
        };
        drop(resp);
    }
}

/// Finds the tenant for `req`, after refusing what a proxy in front might read differently
/// (framing, an ambiguous path or host) and answering what the server answers itself (`OPTIONS
/// *`, an ACME HTTP-01 challenge). The path is put in its normal form: routing, the guest and
/// everything keyed on it see that one.
async fn route(
    app: &App,
    req: &mut Request<RequestBody>,
    conn: &Connection,
    client: std::net::IpAddr,
    present: Present,
) -> Result<Routed, Early> {
    // Framing a proxy in front might read differently, a coding Tern cannot undo: refused
    // before anything reads the body, and the connection closed.
    if present.has(Present::TRANSFER_ENCODING)
        && let Err((status, why)) = framing(req)
    {
        let mut resp = plain_owned(status, format!("{why}\n"));
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return Err(Early::Unrouted(Box::new(resp)));
    }
    // `OPTIONS *` asks about the server itself (RFC 9110 §9.3.7), no tenant.
    if req.uri().path() == "*" {
        return Err(Early::Unrouted(Box::new(asterisk(req.method()))));
    }
    // One meaning of the path for routing, the guest and everything keyed on it later.
    match crate::target::normalize(req.uri().path()) {
        Ok(std::borrow::Cow::Borrowed(_)) => {}
        Ok(std::borrow::Cow::Owned(path)) => match with_path(req.uri(), &path) {
            Some(uri) => *req.uri_mut() = uri,
            None => {
                let resp = plain(StatusCode::BAD_REQUEST, "the request target is not a URI\n");
                return Err(Early::Unrouted(Box::new(resp)));
            }
        },
        Err(why) => {
            return Err(Early::Unrouted(Box::new(plain_owned(
                StatusCode::BAD_REQUEST,
                format!("{why}\n"),
            ))));
        }
    }
    // h2 carries the host in the URI (`:authority`); HTTP/1.1 in the Host header, or in the URI
    // too for an absolute-form target. Where both are given they must agree.
    let (host_from, host) = match authority(req) {
        Ok(from) => from,
        Err(why) => {
            let mut resp = plain_owned(
                StatusCode::BAD_REQUEST,
                format!("ambiguous request: {why}\n"),
            );
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            return Err(Early::Unrouted(Box::new(resp)));
        }
    };
    // An ACME HTTP-01 challenge in progress is answered before any tenant sees the path.
    if conn.tls.is_none()
        && let Some(token) = req.uri().path().strip_prefix(ACME_CHALLENGE_PATH)
        && let Some(answer) = app.certificates().and_then(|c| c.http_challenge(token))
    {
        return Err(Early::Unrouted(Box::new(plain(StatusCode::OK, &answer))));
    }
    let find = || {
        let live = app.registry.live();
        let (serving, prefix_len) = live.router.find(host, req.uri().path())?;
        Some(
            pick(app, serving, req, client).map(|(tenant, role, rollout, chosen)| Routed {
                tenant,
                prefix_len,
                host: host_from,
                role,
                rollout,
                chosen,
            }),
        )
    };
    let mut routed = find();
    if let Some(Ok(r)) = &routed
        && r.tenant.awaits_memset_reset()
    {
        // A swap area was just switched on and the tenants are being moved to the swap-safe
        // reset (milliseconds): route on the moved table.
        app.registry
            .memset_reset_ready(app.pool.queue_timeout())
            .await;
        routed = find();
    }
    // The server's own request headers all begin `tern-`: looked for in one pass over the
    // request's names before any is removed by name (each removal hashes its name).
    let headers = req.headers_mut();
    if headers
        .keys()
        .any(|name| name.as_str().starts_with("tern-"))
    {
        // A token for `Tern-Version` is the server's to read, never a guest's.
        if headers.remove(&rollout::TERN_VERSION_TOKEN).is_some()
            | routed
                .as_ref()
                .is_some_and(|r| r.as_ref().is_ok_and(|r| r.rollout.is_some()))
        {
            headers.remove(&rollout::TERN_VERSION);
        }
        // A scheduled run's headers are the server's to give (`scheduled`): a client cannot
        // pose as the scheduler.
        headers.remove(&crate::schedule::TERN_SCHEDULE);
        headers.remove(&crate::schedule::TERN_SCHEDULE_NAME);
        headers.remove(&crate::schedule::TERN_SCHEDULED_TIME);
    }
    routed.unwrap_or_else(|| {
        Err(Early::Unrouted(Box::new(plain(
            StatusCode::NOT_FOUND,
            "no tenant is routed for this host and path\n",
        ))))
    })
}

/// The version of `serving`'s tenant that serves `req` from `client`: its current one, or
/// while it has a candidate the one its split gives the client, or the one `Tern-Version`
/// asks for (from the rollout's `override_from` networks, or with a token that may deploy the
/// tenant in `Tern-Version-Token`: checked before the version is looked at, so the versions'
/// ids are told only to those). Whether the request chose its version.
fn pick(
    app: &App,
    serving: &crate::registry::Serving,
    req: &Request<RequestBody>,
    client: std::net::IpAddr,
) -> Result<Picked, Early> {
    let Some(candidate) = &serving.candidate else {
        return Ok((serving.current.clone(), rollout::Role::Current, None, false));
    };
    let refuse = |status, text: String| Err(Early::Unrouted(Box::new(plain_owned(status, text))));
    let Some(asked) = req.headers().get(&rollout::TERN_VERSION) else {
        let (tenant, role) = serving.pick(req.headers(), client);
        return Ok((tenant.clone(), role, Some(candidate.clone()), false));
    };
    if !candidate.split.may_override(client) {
        let token = req.headers().get(&rollout::TERN_VERSION_TOKEN);
        let token = token.and_then(|t| t.to_str().ok()).unwrap_or_default();
        if !may_deploy(app, &serving.current.name, token) {
            let now = crate::datadir::now();
            if !token.is_empty() && app.failures.over(client, now) {
                return refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many refused Tern-Version tokens: retry in a second\n".into(),
                );
            }
            return refuse(
                StatusCode::FORBIDDEN,
                "Tern-Version needs Tern-Version-Token: the operator's token or a token with \
                 the deploy scope for this tenant (or a client in the rollout's override_from \
                 networks)\n"
                    .into(),
            );
        }
    }
    let asked = asked.to_str().unwrap_or_default().trim();
    let Some((tenant, role)) = serving.named(asked) else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!(
                "Tern-Version: {asked:?} names no version of tenant {:?}: `current`, \
                 `candidate`, or 8 or more leading digits of {} or {}\n",
                serving.current.name,
                serving.current.short_version().unwrap_or("-"),
                candidate.tenant.short_version().unwrap_or("-"),
            ),
        );
    };
    Ok((tenant.clone(), role, Some(candidate.clone()), true))
}

/// A version of a tenant, which of its versions it is, its candidate, and whether the
/// request chose it.
type Picked = (
    TenantRef,
    rollout::Role,
    Option<Arc<crate::registry::Candidate>>,
    bool,
);

/// Whether `token` may deploy tenant `name`: the operator's, or a scoped token with the
/// `deploy` scope for it.
fn may_deploy(app: &App, name: &str, token: &str) -> bool {
    use crate::access::{Action, Principal, Scope};
    if token.is_empty() {
        return false;
    }
    if crate::access::is_operator(&app.admin_token, token) {
        return true;
    }
    app.registry.scoped_token(token).is_ok_and(|(id, t)| {
        crate::access::decide(
            Principal::Token(&id, &t),
            Action::Tenant(name, Scope::Deploy),
        )
        .is_ok()
    })
}

/// The `check` step: what is decided for a routed request before the cache and a slot: the
/// tenant's redirect of cleartext requests to HTTPS, a declared body over the tenant's limit
/// (refused before any instance is made), what the client takes in compression, and a
/// client's own `Tern-Cache` taken off.
fn check(app: &App, req: &mut Request<RequestBody>, ex: &mut Exchange) -> Result<(), Early> {
    // (The tenant borrowed from its own field: `ex.asked` is set below.)
    let Routed { tenant, host, .. } = ex.routed.as_ref().expect("a routed request");
    // (A request without a host name has nowhere to be sent: it is served.)
    if tenant.front.https_redirect
        && ex.conn.tls.is_none()
        && let Some(&port) = app.https_port.get()
        && let Some(to) = host
            .host(req)
            .and_then(|h| https_location(h, port, req.uri()))
    {
        return Err(Early::Unrouted(Box::new(redirect(&to))));
    }
    if declared_length(req.headers()).is_some_and(|n| n > tenant.limits.max_request_bytes) {
        let e = outcome::body_too_large(tenant.limits.max_request_bytes);
        return Err(Early::Refused(e, Phase::Route));
    }
    // What a tenant's cache does with its backends' answers is for its guests to say: a
    // client's own `Tern-Cache` would pass on with headers a guest forwards.
    if tenant.grants.outbound.readthrough.is_some() {
        req.headers_mut().remove(&crate::outbound::CACHE_OVERRIDE);
    }
    // What the client takes, read before the request goes to the guest.
    let accepts = ex.present.has(Present::ACCEPT_ENCODING);
    ex.asked = tenant.front.compression.as_ref().map(|c| {
        if accepts {
            c.ask(req)
        } else {
            crate::compress::Asked::PLAIN
        }
    });
    Ok(())
}

/// The `limit` step: the server's and the tenant's rate limits ([`crate::ratelimit`]), before
/// its cache and a slot. Refused (`429`, no guest), or how long the request waits first
/// (within a burst, past a limit's `delay`).
async fn limit(
    app: &App,
    req: &Request<RequestBody>,
    ex: &mut Exchange,
) -> Result<std::time::Duration, Early> {
    let tenant = &ex.routed.as_ref().expect("a routed request").tenant;
    let tenant_limits = tenant.front.rate_limits.as_ref();
    if tenant_limits.is_none() && app.rate_limits.is_none() {
        return Ok(std::time::Duration::ZERO);
    }
    let asked = crate::ratelimit::Asked {
        tenant: &tenant.data,
        method: req.method(),
        path: req.uri().path(),
        query: req.uri().query(),
        headers: req.headers(),
        client: ex.client.ip(),
        at: ex.arrived,
    };
    let server_limits = app.rate_limits.as_ref();
    let check = crate::ratelimit::check(server_limits, tenant_limits, &asked);
    let checked = if server_limits.is_some_and(RateLimits::waits)
        || tenant_limits.is_some_and(RateLimits::waits)
    {
        // A shared store's round trip: the check waits, in a box of its own (its state would
        // otherwise grow every request's future, moved whole).
        let checked = Box::pin(check).await;
        ex.waited_unphased();
        checked
    } else {
        // Counted here in memory: ready at once.
        futures_util::FutureExt::now_or_never(check).expect("memory limits never wait")
    };
    checked.map_err(|refused| {
        let mut e = ExecError::new(
            Outcome::RateLimited,
            format!(
                "too many requests (rate limit {:?}): retry in {} s",
                refused.limit.config.name, refused.retry_after
            ),
        );
        e.headers = Some(refused.headers());
        Early::Refused(e, Phase::Route)
    })
}

/// Waits for the tenant's turn on this worker (none of its guests here is cut:
/// [`execute::turn`]), then for a pool slot and a place within the tenant's concurrency (the
/// `queue` phase).
async fn admit(app: &App, ex: &mut Exchange) -> Result<Admitted, Early> {
    let tenant = &ex.routed.as_ref().expect("a routed request").tenant;
    if let Some(t) = &mut ex.trace {
        t.queued = Some(ex.mark);
    }
    let line = execute::turn::wait(execute::turn::key(tenant));
    let admitted = app
        .pool
        .admit(line, &tenant.slots, tenant.limits.max_concurrency)
        .await;
    ex.lap(Phase::Queue);
    admitted.map_err(|overloaded| {
        let e = ExecError::new(Outcome::Overload, overloaded.to_string());
        Early::Refused(e, Phase::Queue)
    })
}

/// Runs the request's guest on its slot and answers with what it gives: a buffered response
/// when the guest has ended, or the head of a streamed one as soon as the guest commits it
/// (the guest then runs on in a task of its own, its phases recorded when it ends).
async fn run_guest(
    app: &Arc<App>,
    ex: &mut Exchange,
    req: Request<RequestBody>,
    admitted: Admitted,
) -> (Response<ResponseBody>, Phase) {
    let Routed {
        tenant,
        prefix_len,
        role,
        ..
    } = ex.routed.as_ref().expect("a routed request");
    let (prefix_len, role) = (*prefix_len, *role);
    let (mut parts, body) = req.into_parts();
    // A `HEAD` response's body is never sent, so it is never counted as undelivered.
    let head_only = parts.method == Method::HEAD;
    let trace = ex.trace.as_ref().map(|t| t.active.clone());
    if let Some(t) = &trace
        && tenant.kind() != crate::config::GuestKind::Tern
    {
        // Components and CGI programs see their own span as the request's `traceparent` (its
        // header, `HTTP_TRACEPARENT`), so their logs and calls join the trace there. A `tern`
        // ABI guest asks `request_info` instead: one more header would cost every guest that
        // parses its headers (the SDK's `request()` does), traced or not.
        t.stamp(&mut parts.headers, t.run_span);
    }
    let context = RequestContext {
        conn: ex.conn.clone(),
        client: ex.client,
        request_id: ex.request_id.clone(),
        prefix_len,
        version: parts.version,
        trace,
        timeout: ex.timeout,
        trigger: ex.trigger,
    };
    let request = GuestRequest::new(
        parts.method,
        parts.uri,
        parts.headers,
        body,
        tenant.limits.max_request_bytes,
        context,
    );
    // Its run begins where its queue ended (`ex.mark`).
    let (resp, phase) = match execute::answer(tenant.clone(), request, admitted, ex.mark).await {
        Answer::Ended {
            response,
            phases,
            output,
        } => {
            let records = (&mut ex.timings, ex.trace.as_mut(), ex.live.as_mut());
            record_run((app, role), records, &phases, &response, output);
            let resp = match response {
                Ok(mut done) => {
                    if let ResponseBody::Forwarded(f) = &mut done.body {
                        f.count_in(tenant.undelivered.clone(), head_only);
                    }
                    let mut resp = Response::new(done.body);
                    *resp.status_mut() = done.status;
                    *resp.headers_mut() = done.headers;
                    if let Some(backend) = done.handoff {
                        resp.extensions_mut()
                            .insert(crate::websocket::HandoffTo(backend));
                    }
                    resp
                }
                Err(e) => error_response(&e, tenant, &ex.ids()),
            };
            (resp, Phase::Teardown)
        }
        // It wrote past the buffer and finished before the head was taken: every phase is
        // known when the head leaves.
        Answer::Streaming {
            head,
            rest: Rest::Ended(out),
        } => {
            if let (Err(_), Some((rollout, role))) = (&out.result, judged(ex.routed.as_ref())) {
                rollout.judge.failed_after_head(role);
            }
            let records = (&mut ex.timings, ex.trace.as_mut(), ex.live.as_mut());
            record_run((app, role), records, &out.phases, &out.result, out.output);
            (streamed(tenant, head, head_only), Phase::Teardown)
        }
        // The body outgrew the buffer while the guest runs: the head leaves now and the guest
        // runs on in its own task, streaming into the body channel.
        Answer::Streaming { head, rest } => {
            let mut after = ex.timings;
            let app2 = Arc::clone(app);
            // Its trace and its live log record end with the guest: taken out of the exchange.
            let mut trace = ex.trace.take();
            let mut live = ex.live.take();
            let (status, arrived) = (head.status.as_u16(), ex.arrived);
            let request_id = ex.request_id.clone();
            // Only a candidate's judge needs the run's end (no clone for other tenants).
            let judged = judged(ex.routed.as_ref());
            tokio::spawn(async move {
                let out = rest.finish().await;
                if let (Err(_), Some((rollout, role))) = (&out.result, judged) {
                    rollout.judge.failed_after_head(role);
                }
                let records = (&mut after, trace.as_mut(), live.as_mut());
                record_run((&app2, role), records, &out.phases, &out.result, out.output);
                let ended = Instant::now();
                if let Some(live) = live {
                    live.finish(crate::livelog::Answered {
                        request_id: &request_id,
                        status,
                        headers: None,
                        timings: &after,
                        reached: Phase::Teardown,
                        total: ended.saturating_duration_since(arrived),
                    });
                }
                if let Some(t) = trace {
                    t.end(&app2, (arrived, ended), &after, (status, None), &request_id);
                }
            });
            // Only route and queue are known when the head leaves; the rest reaches /metrics.
            (streamed(tenant, head, head_only), Phase::Queue)
        }
    };
    (resp, phase)
}

/// The candidate whose abort rule judges a routed request, and the version that serves it
/// (none: no candidate, or a request that chose its version): a streamed answer whose guest
/// fails after its head is one more failure of that version (the head's status, counted in
/// `finish`, said nothing of it).
fn judged(routed: Option<&Routed>) -> Option<(Arc<crate::registry::Candidate>, rollout::Role)> {
    let r = routed.filter(|r| !r.chosen)?;
    Some((r.rollout.clone()?, r.role))
}

/// A run that ended: its phases into the exchange's timings and `/metrics`, its end into the
/// request's trace and live log record.
fn record_run<T>(
    (app, role): (&App, rollout::Role),
    (timings, trace, live): RunRecords<'_>,
    phases: &Phases,
    result: &Result<T, crate::outcome::ExecError>,
    output: Option<crate::guest::Output>,
) {
    record_phases(timings, phases);
    app.metrics.observe(timings, Phase::Teardown, role);
    if let Some(t) = trace {
        t.ran(phases.start, result);
    }
    if let Some(live) = live {
        live.ran(result, output);
    }
}

/// Where a run's end is recorded: the exchange's timings, its trace, its live log record.
type RunRecords<'a> = (
    &'a mut Timings,
    Option<&'a mut exchange::Traced>,
    Option<&'a mut crate::livelog::Pending>,
);

fn record_phases(t: &mut Timings, out: &Phases) {
    t.set(Phase::Instantiate, out.instantiate);
    t.set(Phase::Run, out.run);
    t.set(Phase::Teardown, out.teardown);
    t.set(Phase::Outbound, out.outbound);
    t.set(Phase::Kv, out.kv);
    t.set(Phase::Ready, out.ready);
}

/// The response of a guest whose body streams: its head, and its body from the channel.
fn streamed(tenant: &TenantRef, head: Head, head_only: bool) -> Response<ResponseBody> {
    let body = ResponseBody::stream(
        head.body,
        head.aborted,
        tenant.undelivered.clone(),
        head_only,
    );
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.headers_mut() = head.headers;
    resp
}
