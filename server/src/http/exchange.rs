//! One request as the front end carries it through its steps ([`Exchange`]: the connection,
//! the client, the tenant it was routed to, its ids, phase timings, trace and access line),
//! and the last two steps every answer takes, whatever made it: `respond` (the tenant's
//! policy on the answer: compression, HSTS) and `finish` (records only: the request id and
//! `Server-Timing` on the response, the counts, the trace's end, the access line when the body
//! ends).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{CONNECTION, HOST, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};

use super::request::{X_REQUEST_ID, client_request_id, new_request_id};
use crate::app::App;
use crate::body::{ResponseBody, plain_owned};
use crate::context::Connection;
use crate::metrics::{Phase, Timings};
use crate::outcome::{ExecError, Outcome};
use crate::tenant::TenantRef;

/// `Server-Timing`: each phase the request reached, and the total.
static SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// How a step of the front end ends an exchange before the guest runs.
pub(super) enum Early {
    /// Answered with this response by the server itself: before a tenant was chosen, or for
    /// one (a redirect to HTTPS); counted as no tenant's.
    Unrouted(Box<Response<ResponseBody>>),
    /// Refused for the routed tenant at this phase: its error page, its outcome counted.
    Refused(ExecError, Phase),
}

/// The tenant a request is for (the version of it that serves the request), and the length
/// of the route prefix it matched.
#[derive(Clone)]
pub(super) struct Routed {
    pub(super) tenant: TenantRef,
    pub(super) prefix_len: usize,
    /// Where the request's host is (checked once, in `route`).
    pub(super) host: super::request::HostFrom,
    /// Which of the tenant's versions `tenant` is.
    pub(super) role: crate::rollout::Role,
    /// The tenant's candidate, while it has one: its judge counts this request's answer
    /// unless the request asked for its version (`Tern-Version`).
    pub(super) rollout: Option<Arc<crate::registry::Candidate>>,
    /// It asked for its version (`Tern-Version`): not one of the split's, not judged.
    pub(super) chosen: bool,
}

impl Routed {
    /// The deployment `routed` serves (current for an unrouted request).
    pub(super) fn role_of(routed: Option<&Self>) -> crate::rollout::Role {
        routed.map_or(crate::rollout::Role::Current, |r| r.role)
    }
}

/// One request as the front end carries it: the connection it came on and the client, the
/// tenant once routed, when it came, its id, how long each phase took, and its trace when
/// tracing is on.
pub(super) struct Exchange {
    /// The connection it came on.
    pub(super) conn: Connection,
    /// The client: the peer, or whom a trusted proxy in front says it forwards.
    pub(super) client: SocketAddr,
    /// The tenant it is for, once routed.
    pub(super) routed: Option<Routed>,
    /// What the client takes, read before the request goes on (`[tenant.compression]`).
    pub(super) asked: Option<crate::compress::Asked>,
    /// Which of the headers the front end looks up the request came with.
    pub(super) present: crate::context::Present,
    pub(super) arrived: Instant,
    /// The last phase boundary read off the clock: where the next phase begins ([`Self::lap`]).
    pub(super) mark: Instant,
    pub(super) request_id: HeaderValue,
    /// The HTTP version it came in (a label of `tern_requests_total`).
    version: http::Version,
    pub(super) timings: Timings,
    pub(super) trace: Option<Traced>,
    /// Its access line, when access lines are on: written when the response ends.
    access: Option<crate::logwriter::AccessRecord>,
    /// Its live log record, once routed to a tenant whose live log is on: kept when the
    /// answer's head is made (or, for a streamed answer, when its guest ends).
    pub(super) live: Option<crate::livelog::Pending>,
    /// A time limit other than the tenant's for its guest (a scheduled run's).
    pub(super) timeout: Option<std::time::Duration>,
    /// What made it: a client's request, or a schedule ([`Self::scheduled`]).
    pub(super) trigger: crate::trigger::Trigger,
}

impl Exchange {
    /// Begins the exchange of `req`, which came on `conn` from `client`: its id (the
    /// client's, its trace's, or a new one), its trace when tracing is on, and its access
    /// line, gathered as the request came (before its path is normalised) when access lines
    /// are on.
    pub(super) fn begin<B>(
        app: &App,
        req: &Request<B>,
        conn: Connection,
        client: SocketAddr,
    ) -> Self {
        let arrived = Instant::now();
        let trace = app
            .tracer
            .as_ref()
            .map(|t| Traced::begin(t, req, &conn, client));
        let present = crate::context::Present::of(req.headers());
        let asked_id = if present.has(crate::context::Present::REQUEST_ID) {
            client_request_id(req.headers())
        } else {
            None
        };
        let request_id = match (asked_id, &trace) {
            (Some(id), _) => id,
            // A traced request's id is its trace id: logs, error pages and traces join on it.
            (None, Some(t)) => t.active.trace_id_header(),
            (None, None) => new_request_id(),
        };
        let access = crate::logwriter::access_enabled().then(|| crate::logwriter::AccessRecord {
            request_id: request_id.clone(),
            tenant: None,
            method: req.method().clone(),
            target: req.uri().clone(),
            with_query: app.access_log_query,
            version: req.version(),
            host: match req.uri().authority() {
                Some(a) => HeaderValue::from_str(a.as_str()).ok(),
                None => req.headers().get(HOST).cloned(),
            },
            remote: conn.peer,
            client: client.ip(),
            user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
            referer: req.headers().get(http::header::REFERER).cloned(),
            trace_id: trace.as_ref().map(|t| *t.active.trace_id_hex()),
            arrived,
            status: 0,
            trigger: crate::trigger::Trigger::Request,
        });
        Self {
            conn,
            client,
            routed: None,
            asked: None,
            present,
            arrived,
            mark: arrived,
            request_id,
            version: req.version(),
            timings: Timings::default(),
            trace,
            access,
            live: None,
            timeout: None,
            trigger: crate::trigger::Trigger::Request,
        }
    }

    /// It is a run of its tenant's schedule, not a client's request, with `timeout` its
    /// guest's limit: counted, logged and traced as such (before it is routed).
    pub(super) fn scheduled(&mut self, timeout: Option<std::time::Duration>) {
        let trigger = crate::trigger::Trigger::Schedule;
        self.trigger = trigger;
        self.timeout = timeout;
        if let Some(a) = &mut self.access {
            a.trigger = trigger;
        }
        if let Some(t) = &mut self.trace {
            t.trigger = trigger;
        }
    }

    /// Ends `phase` now: its time is from the last boundary ([`Self::mark`]), and now is the
    /// next phase's start. One clock read per boundary: a phase begins where the one before it
    /// ended, so what lies between two (the checks and rate limits after `route`, say) is
    /// counted in the later one.
    pub(super) fn lap(&mut self, phase: Phase) {
        let now = Instant::now();
        self.timings
            .set(phase, now.saturating_duration_since(self.mark));
        self.mark = now;
    }

    /// It waited in no phase (for a rate limit: its delay, or its shared store's answer): the
    /// next phase begins now.
    pub(super) fn waited_unphased(&mut self) {
        self.mark = Instant::now();
    }

    /// The request `req` is for `routed` (and so are its trace and its live log record).
    pub(super) fn route_to<B>(&mut self, routed: Routed, req: &Request<B>) {
        if let Some(t) = &mut self.trace {
            t.tenant = Some((routed.tenant.clone(), routed.prefix_len));
        }
        let tenant = (&routed.tenant.logs, &routed.tenant.version_label);
        self.live = crate::livelog::Pending::begin(tenant, req, self.client.ip(), self.trigger);
        self.routed = Some(routed);
    }

    /// The routed tenant.
    ///
    /// # Panics
    /// Before [`Self::route_to`]: the steps after `route` only run for a routed request.
    pub(super) fn tenant(&self) -> &TenantRef {
        &self.routed.as_ref().expect("a routed request").tenant
    }

    /// Ends the exchange the way a step said: answered by the server, or refused for the
    /// routed tenant.
    pub(super) fn early(mut self, app: &App, early: Early) -> Response<ResponseBody> {
        match early {
            Early::Unrouted(resp) => {
                let role = Routed::role_of(self.routed.as_ref());
                app.metrics.observe(&self.timings, Phase::Route, role);
                self.routed = None;
                self.live = None;
                self.finish(app, *resp, Phase::Route)
            }
            Early::Refused(e, reached) => self.reject(app, &e, reached),
        }
    }

    /// The request id as error pages give it: with the trace id when the client chose the
    /// request id (otherwise a traced request's id is its trace id).
    pub(super) fn ids(&self) -> String {
        let id = self.request_id.to_str().unwrap_or("-");
        match &self.trace {
            Some(t) => {
                let trace_id = t.active.trace_id_text();
                if id == trace_id {
                    id.to_string()
                } else {
                    format!("{id}, trace id {trace_id}")
                }
            }
            None => id.to_string(),
        }
    }

    /// Answers a routed request from its tenant's cache (no guest ran): `plain`, a stored
    /// answer given as it was stored (standing in for a guest that could not run), is
    /// compressed for the client; a hit comes compressed from the cache's own copies. `stale`:
    /// a stale answer (refreshed in the background, or standing in for an error).
    pub(super) fn cached(
        mut self,
        app: &App,
        resp: Response<ResponseBody>,
        plain: bool,
        stale: bool,
    ) -> Response<ResponseBody> {
        let role = Routed::role_of(self.routed.as_ref());
        app.metrics.observe(&self.timings, Phase::Route, role);
        if let Some(live) = &mut self.live {
            live.cached(stale);
        }
        let resp = self.respond(resp, plain);
        self.finish(app, resp, Phase::Route)
    }

    /// Answers with what the guest made (its phases recorded up to `reached`).
    pub(super) fn answered(
        self,
        app: &App,
        resp: Response<ResponseBody>,
        reached: Phase,
    ) -> Response<ResponseBody> {
        let resp = self.respond(resp, true);
        self.finish(app, resp, reached)
    }

    /// Refuses a routed request before its guest runs, recording the phases it reached and
    /// counting the outcome.
    fn reject(mut self, app: &App, e: &ExecError, reached: Phase) -> Response<ResponseBody> {
        let role = Routed::role_of(self.routed.as_ref());
        app.metrics.observe(&self.timings, reached, role);
        let tenant = self.tenant().clone();
        tenant.count_outcome(e.outcome);
        if let Some(live) = &mut self.live {
            live.refused(e);
        }
        if let Some(t) = &mut self.trace {
            t.failure = Some((e.outcome.name(), e.message.clone()));
            t.guest_failed = e.outcome.is_guests();
        }
        let resp = error_response(e, &tenant, &self.ids());
        let resp = self.respond(resp, false);
        self.finish(app, resp, reached)
    }

    /// The `respond` step: what the routed tenant's front end does to every answer it gives,
    /// the guest's, the cache's or a refusal: compression (of a `plain` answer: the guest's,
    /// or a stored one given as stored) and HSTS over TLS. A new policy on answers is one more
    /// line here.
    fn respond(&self, mut resp: Response<ResponseBody>, plain: bool) -> Response<ResponseBody> {
        let Some(Routed { tenant, .. }) = &self.routed else {
            return resp;
        };
        let front = &tenant.front;
        if plain && let (Some(compression), Some(asked)) = (&front.compression, self.asked) {
            resp = compression.apply(asked, resp);
        }
        if self.conn.tls.is_some()
            && let Some(hsts) = &front.hsts
        {
            resp.headers_mut()
                .insert(http::header::STRICT_TRANSPORT_SECURITY, hsts.clone());
        }
        resp
    }

    /// The `finish` step, which only records: adds the request id and `Server-Timing`, counts
    /// the response (as the routed tenant's, or no tenant's), ends the trace, and has the
    /// access line written when the response's body ends.
    fn finish(
        self,
        app: &App,
        mut resp: Response<ResponseBody>,
        reached: Phase,
    ) -> Response<ResponseBody> {
        let tenant = self.routed.as_ref().map(|r| &r.tenant);
        let ended = Instant::now();
        let total = ended - self.arrived;
        app.metrics.observe_total(total);
        let status = resp.status().as_u16();
        match &self.routed {
            Some(r) => {
                r.tenant
                    .requests
                    .count(status, self.version, r.role, self.trigger);
                r.tenant.served.count(status);
                if let Some(rollout) = r.rollout.as_ref().filter(|_| !r.chosen) {
                    rollout.judge.count(r.role, status);
                }
            }
            None => {
                let role = crate::rollout::Role::Current;
                let trigger = crate::trigger::Trigger::Request;
                app.metrics
                    .unrouted()
                    .count(status, self.version, role, trigger);
            }
        }
        // A WebSocket's access line and span are written when it closes.
        let later = resp
            .extensions_mut()
            .remove::<crate::websocket::WhenClosed>();
        let mut access_later = None;
        let mut resp = match self.access {
            Some(mut record) => {
                record.status = status;
                record.tenant = tenant.map(|t| t.clone() as Arc<dyn crate::logwriter::Named>);
                let no_body = record.method == Method::HEAD
                    || matches!(status, 204 | 304)
                    || (100..200).contains(&status);
                if later.is_some() {
                    access_later = Some(record);
                    resp
                } else {
                    resp.map(|body| body.logged(record, no_body))
                }
            }
            None => resp,
        };
        let headers: &mut HeaderMap = resp.headers_mut();
        // Written on the stack, then one allocation of its length (a `Bytes` of a longer
        // buffer would allocate its share count).
        let version = tenant.and_then(|t| t.short_version());
        if let Some(mut v) = self.timings.server_timing_value(total, reached, version) {
            // Its value and the request id's are this answer's own: in HTTP/2's header table
            // (HPACK) they would only be searched for, added and evict what does repeat, so
            // they are sent never indexed.
            v.set_sensitive(true);
            headers.insert(SERVER_TIMING.clone(), v);
        }
        if let Some(live) = self.live {
            live.finish(crate::livelog::Answered {
                request_id: &self.request_id,
                status,
                headers: Some(resp.headers()),
                timings: &self.timings,
                reached,
                total,
            });
        }
        let kept = self.trace.and_then(|t| {
            t.kept(
                app,
                (self.arrived, ended),
                &self.timings,
                (status, resp.headers().get(&crate::cache::CACHE_STATUS)),
                &self.request_id,
            )
        });
        // Moved, not cloned, after its last reader: a clone would allocate its share count.
        let mut id = self.request_id;
        id.set_sensitive(true);
        resp.headers_mut().insert(X_REQUEST_ID.clone(), id);
        let traced = app.tracer.as_ref().zip(kept);
        match later {
            Some(later) => later.send(access_later, traced.map(|(t, r)| (t.clone(), r))),
            None => {
                if let Some((tracer, record)) = traced {
                    tracer.submit(&record);
                }
            }
        }
        resp
    }
}

/// What a traced request's spans say, gathered as it goes (nothing is formatted until the
/// tracer keeps it).
pub(super) struct Traced {
    pub(super) active: Arc<crate::trace::Active>,
    method: Method,
    uri: Uri,
    version: http::Version,
    scheme: &'static str,
    client: SocketAddr,
    user_agent: Option<HeaderValue>,
    /// The tenant it was routed to, and the length of the prefix it matched.
    pub(super) tenant: Option<(TenantRef, usize)>,
    /// When it began waiting for a slot.
    pub(super) queued: Option<Instant>,
    /// When its run began.
    run_start: Option<Instant>,
    /// The outcome's name and message, when the request failed.
    failure: Option<(&'static str, String)>,
    /// The guest failed (a trap, its deadline, a limit): an error kept whatever the sampling
    /// said, like a 5xx. A client's malformed or oversized body (a 4xx) is not.
    guest_failed: bool,
    /// What made the request (a schedule's run says so on its span).
    trigger: crate::trigger::Trigger,
}

impl Traced {
    fn begin<B>(
        tracer: &crate::trace::Tracer,
        req: &Request<B>,
        conn: &Connection,
        client: SocketAddr,
    ) -> Self {
        Self {
            active: tracer.begin(req.headers()),
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            scheme: conn.scheme(),
            client,
            user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
            tenant: None,
            queued: None,
            run_start: None,
            failure: None,
            guest_failed: false,
            trigger: crate::trigger::Trigger::Request,
        }
    }

    /// The guest's run, begun at `start`, ended with `result`.
    pub(super) fn ran<T>(&mut self, start: Instant, result: &Result<T, ExecError>) {
        self.run_start = Some(start);
        if let Err(e) = result {
            self.failure = Some((e.outcome.name(), e.message.clone()));
            self.guest_failed = e.outcome.is_guests();
        }
    }

    /// The request (arrived, ended) ended with `status`: queued for export if the tracer keeps
    /// it.
    pub(super) fn end(
        self,
        app: &App,
        ended: (Instant, Instant),
        timings: &Timings,
        status: (u16, Option<&HeaderValue>),
        request_id: &HeaderValue,
    ) {
        if let Some((tracer, record)) = app
            .tracer
            .as_ref()
            .zip(self.kept(app, ended, timings, status, request_id))
        {
            tracer.submit(&record);
        }
    }

    /// The request (arrived, ended) ended with `status`: its record, if the tracer keeps it
    /// (submitted by the caller: at once, or when its WebSocket closes).
    pub(super) fn kept(
        self,
        app: &App,
        (arrived, end): (Instant, Instant),
        timings: &Timings,
        (status, cache_status): (u16, Option<&HeaderValue>),
        request_id: &HeaderValue,
    ) -> Option<crate::trace::Record> {
        let tracer = app.tracer.as_ref()?;
        if !tracer.keeps(&self.active, status, self.guest_failed, end - arrived) {
            return None;
        }
        let took = |p: Phase| timings.0[p as usize];
        let since = |i: Instant| i.saturating_duration_since(arrived);
        let queue = self
            .queued
            .map(|q| (since(q), since(q) + took(Phase::Queue)));
        let phases = match self.run_start {
            Some(s) => {
                let s = since(s);
                let ran_from = s + took(Phase::Instantiate);
                let ran_until = ran_from + took(Phase::Run);
                [
                    queue,
                    Some((s, ran_from)),
                    Some((ran_from, ran_until)),
                    Some((ran_until, ran_until + took(Phase::Teardown))),
                ]
            }
            None => [queue, None, None, None],
        };
        let wall = std::time::SystemTime::now();
        app.metrics
            .exemplars
            .record(self.active.trace_id, timings, end - arrived, wall);
        let tenant = self
            .tenant
            .map(|(t, prefix_len)| (t as Arc<dyn crate::trace::SpanTenant>, prefix_len));
        // A request id other than the trace id (a client's own) goes with the spans.
        let own_id =
            (request_id.as_bytes() != self.active.trace_id_hex()).then(|| request_id.clone());
        Some(crate::trace::Record {
            active: self.active,
            arrived,
            end: (end - arrived, wall),
            method: self.method,
            uri: self.uri,
            version: self.version,
            scheme: self.scheme,
            client: self.client,
            user_agent: self.user_agent,
            status,
            request_id: own_id,
            tenant,
            phases,
            failure: self.failure,
            cache_status: cache_status.cloned(),
            websocket: None,
            trigger: self.trigger,
        })
    }
}

/// The response for a failure: its status, the body the tenant's error settings give it (`ids`:
/// the request id, and the trace id when it differs), and the headers its outcome calls for.
pub(super) fn error_response(
    e: &ExecError,
    tenant: &TenantRef,
    ids: &str,
) -> Response<ResponseBody> {
    let (body, kind) = tenant.front.errors.body(e, ids);
    let mut resp = plain_owned(e.outcome.status(), body);
    if let Some(kind) = kind {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, kind);
    }
    for (name, value) in e.headers.iter().flat_map(|h| h.iter()) {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    match e.outcome {
        Outcome::Overload => {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // The unread rest of the body would otherwise be drained (or cannot be framed); close.
        Outcome::BodyTooLarge | Outcome::BadRequest => {
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        _ => {}
    }
    resp
}
