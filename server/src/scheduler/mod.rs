//! The runner of scheduled runs: it watches the live tenants' schedules
//! ([`crate::schedule`]), takes each tick through the schedule's ledger (so one replica of a
//! fleet runs it), and runs the tenant's guest through the front end
//! ([`crate::http::scheduled`]): a `POST` to the schedule's path with `Tern-Schedule`,
//! `Tern-Schedule-Name` and `Tern-Scheduled-Time`.
//!
//! - A tick is taken while it is the schedule's latest: a replica that cannot reach the
//!   registry tries again every second until the next tick is due, then counts it `missed`
//!   (so an outage of the registry ends in at most one late run per schedule, not a burst).
//! - A tick another replica holds is looked at again when its lease ends: still `running`
//!   then, its holder is taken for dead and the tick runs once more ([`crate::schedule::ledger`]).
//! - Ticks that passed while no replica served (a full outage, a restart) are not run, unless
//!   `catch_up = true`: then the last one missed runs once, when the schedule is seen again.
//! - Only the current version of a tenant runs its schedules (a candidate in rollout never
//!   does).
//! - At shutdown no tick is taken any more; runs under way end (within the shutdown grace) and
//!   their ends are recorded; a replica waiting out another's lease stops waiting.

mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{HeaderValue, Method, Request};
use http_body_util::BodyExt;

use crate::body::ResponseBody;
use crate::guest::RequestBody;
use crate::metrics::Metrics;
use crate::schedule::{Claim, Clock, Ledger, Schedule, State};
use crate::shutdown::Shutdown;
use crate::tenant::TenantRef;
pub use store::{Store, StoreError};

/// The longest the runner sleeps before it looks at the schedules again (a new deploy's
/// schedule is seen within it).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long after a tick's holder's lease passes the tick is looked at again.
const LEASE_MARGIN_MS: i64 = 1000;

/// Added to a run's longest time for its lease.
const LEASE_SLACK_MS: i64 = 5000;

/// What the runner needs of the server it runs in (the server's `App`; kept apart so that
/// the runner does not depend on the front end it hands runs to).
pub trait Host: Send + Sync + Sized + 'static {
    /// The runner's state.
    fn scheduler(&self) -> &Scheduler;
    /// The live tenants.
    fn live(&self) -> Arc<crate::registry::Live>;
    /// The server's metrics.
    fn metrics(&self) -> &Metrics;
    /// The longest a run waits for a pool slot.
    fn queue_timeout(&self) -> Duration;
    /// Runs `req` for `tenant`'s guest as a scheduled run, within `timeout` (the tenant's
    /// when `None`), through the front end.
    fn fire(
        this: &Arc<Self>,
        tenant: TenantRef,
        req: Request<RequestBody>,
        timeout: Option<Duration>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = http::Response<ResponseBody>> + Send>>;
}

/// What a run did, as `tern schedule run` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ran {
    /// `ok` or `failed`.
    pub state: &'static str,
    /// The status its guest answered.
    pub status: u16,
    /// How long it took (milliseconds).
    pub took_ms: u64,
}

/// The runner: the ledgers' store, the clock, this replica's name, and what it has seen.
#[derive(Debug)]
pub struct Scheduler {
    store: Store,
    clock: Clock,
    replica: String,
    /// How long runs under way may take to end at shutdown.
    grace: Duration,
    /// Each schedule's last tick this replica looked at, by tenant (its
    /// [`crate::tenant::Tenant::data`]: a tenant created again under a deleted one's name
    /// starts anew) and schedule (with the expression it was computed from: a changed
    /// expression starts from now).
    seen: Mutex<Seen>,
}

/// The runner's last look at each schedule: by `(tenant's data key, schedule)`, the expression
/// (and zone) and the tick last looked at.
type Seen = HashMap<(Arc<str>, String), (String, i64)>;

/// Whether a schedule is this tick's to take.
struct Tick {
    tenant: String,
    /// Whose tenant ([`crate::tenant::Tenant::data`]).
    data: Arc<str>,
    schedule: String,
    at_ms: i64,
    /// Until when it may be taken (its next tick), or `None` after a lease (no limit).
    until_ms: Option<i64>,
}

impl Scheduler {
    /// A runner keeping ledgers in `store`, firing by `clock`, named `replica`, giving runs
    /// under way `grace` to end at shutdown.
    pub fn new(store: Store, clock: Clock, replica: String, grace: Duration) -> Self {
        Self {
            store,
            clock,
            replica,
            grace,
            seen: Mutex::default(),
        }
    }

    /// Runs the schedules of `app`'s tenants until `shutdown`, then waits (at most the grace)
    /// for the runs under way to end and be recorded.
    pub async fn run_until<H: Host>(app: Arc<H>, shutdown: Shutdown) {
        let me = app.scheduler();
        let mut first = true;
        let mut takes = tokio::task::JoinSet::new();
        loop {
            while takes.try_join_next().is_some() {}
            let now = me.clock.now_ms();
            let mut wake = now.saturating_add(LOOK_EVERY.as_millis() as i64);
            let due = me.due(app.as_ref(), now, &mut wake, first);
            first = false;
            for (tick, tenant) in due {
                let (app, shutdown) = (app.clone(), shutdown.clone());
                takes.spawn(async move { take(&app, tenant, tick, &shutdown).await });
            }
            tokio::select! {
                () = me.clock.sleep_until(wake, LOOK_EVERY) => {}
                () = shutdown.wait() => break,
            }
        }
        if !takes.is_empty() {
            tracing::info!(
                runs = takes.len(),
                "shutdown: waiting for scheduled runs under way"
            );
        }
        if tokio::time::timeout(me.grace, async {
            while takes.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            tracing::warn!(
                runs = takes.len(),
                "shutdown: scheduled runs still under way after the grace are cut off (their \
                 ticks run once more elsewhere after their lease)"
            );
        }
    }

    /// The ticks due at `now` of every live tenant's schedules (and `wake` moved to the
    /// earliest next one); on the runner's `first` look, the ticks to catch up on. Schedules
    /// gone since the last look are forgotten (one added again starts anew).
    fn due<H: Host>(
        &self,
        app: &H,
        now: i64,
        wake: &mut i64,
        first: bool,
    ) -> Vec<(Tick, TenantRef)> {
        let live = app.live();
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut due = Vec::new();
        let mut present = std::collections::HashSet::new();
        for (name, tenant) in &live.tenants {
            for s in tenant.schedules.iter() {
                let Some(next) = s.cron.next_after(now) else {
                    continue;
                };
                *wake = (*wake).min(next);
                let Some(last) = s.cron.last_at_or_before(now) else {
                    continue;
                };
                let ident = format!("{}\u{0} {}", s.cron.expression(), s.cron.zone());
                let key = (tenant.data.clone(), s.name.clone());
                present.insert(key.clone());
                let tick = Tick {
                    tenant: name.clone(),
                    data: tenant.data.clone(),
                    schedule: s.name.clone(),
                    at_ms: last,
                    until_ms: Some(next),
                };
                match seen.get_mut(&key) {
                    Some((was, at)) if *was == ident => {
                        if last > *at {
                            let passed = passed_between(&s.cron, *at, last);
                            if passed > 0 {
                                // This runner did not look for longer than a period (the
                                // clock jumped, the process stood still): only the last tick
                                // is tried. (Not counted missed: in a fleet another replica
                                // may have run them.)
                                tracing::info!(
                                    tenant = %name,
                                    schedule = %s.name,
                                    passed,
                                    "scheduled ticks passed unseen by this replica's runner \
                                     (the clock jumped or the process stood still); the last \
                                     one is tried"
                                );
                            }
                            *at = last;
                            due.push((tick, tenant.clone()));
                        }
                    }
                    _ => {
                        // First seen (start-up, a new schedule, a changed expression): its
                        // last tick is past, run only to catch up on one missed while no
                        // replica ran (at this process's start).
                        seen.insert(key, (ident, last));
                        if s.catch_up && first {
                            due.push((
                                Tick {
                                    until_ms: None,
                                    ..tick
                                },
                                tenant.clone(),
                            ));
                        }
                    }
                }
            }
        }
        seen.retain(|k, _| present.contains(k));
        due
    }

    /// Runs tenant `tenant`'s schedule `name` now (`tern schedule run`), recorded in its
    /// ledger as a run by hand; what it did.
    ///
    /// # Errors
    /// No such schedule (`404`), the ledger cannot be written (`503`).
    pub async fn run_now<H: Host>(
        app: &Arc<H>,
        tenant: &str,
        name: &str,
    ) -> Result<Ran, crate::change::ChangeError> {
        use crate::change::ChangeError;
        let me = app.scheduler();
        let live = app.live();
        let t = live
            .tenants
            .get(tenant)
            .ok_or_else(|| ChangeError::NotFound(format!("no tenant {tenant:?}")))?
            .clone();
        let s = find(&t, name)?;
        let key = store::key(tenant, name);
        let now = me.clock.now_ms();
        let lease = lease_ms(app.as_ref(), &t, s);
        let skip = s.overlap == crate::schedule::Overlap::Skip;
        let at = me
            .store
            .update((&key, &t.data), |l| {
                let running = l
                    .runs
                    .iter()
                    .any(|r| r.state == State::Running && r.lease_until_ms > now);
                if running && skip {
                    return (None, false);
                }
                (Some(l.manual(now, &me.replica, lease)), true)
            })
            .await
            .map_err(|e| {
                // (The store's own words, which may name its address, stay in the log.)
                tracing::warn!(tenant, schedule = %name, "a run by hand: its ledger: {e}");
                ChangeError::Unavailable(
                    "the schedule's ledger cannot be written now (the server log says why)".into(),
                )
            })?
            .ok_or_else(|| {
                ChangeError::Conflict(format!(
                    "schedule {name:?} of tenant {tenant:?} is running now and does not \
                     overlap (overlap = \"skip\"): try again when it ends"
                ))
            })?;
        Ok(fire(app, &t, s, (at, true, 1), &key).await)
    }

    /// Removes deleted tenant `tenant`'s runs (its key `data`'s) from the ledgers of every
    /// schedule its name ever had (a failure is logged: they then stay, unseen by any other
    /// tenant of its name, each reading only its own runs: [`Ledger::of`]).
    pub async fn forget<H: Host>(app: &Arc<H>, tenant: &str, data: &str) {
        if let Err(e) = app.scheduler().store.remove_tenant(tenant, data).await {
            tracing::warn!(
                tenant,
                "the deleted tenant's schedule runs stay in their ledgers: {e}"
            );
        }
    }

    /// Tenant `tenant`'s schedules: each one's settings, next five times and last runs
    /// (newest first), as the admin API gives them.
    ///
    /// # Errors
    /// No such tenant (`404`).
    pub async fn list<H: Host>(
        app: &Arc<H>,
        tenant: &str,
    ) -> Result<serde_json::Value, crate::change::ChangeError> {
        use crate::change::ChangeError;
        let me = app.scheduler();
        let t = app
            .live()
            .tenants
            .get(tenant)
            .cloned()
            .ok_or_else(|| ChangeError::NotFound(format!("no tenant {tenant:?}")))?;
        let now = me.clock.now_ms();
        let watched: Vec<bool> = {
            let seen = me.seen.lock().unwrap_or_else(PoisonError::into_inner);
            t.schedules
                .iter()
                .map(|s| seen.contains_key(&(t.data.clone(), s.name.clone())))
                .collect()
        };
        let mut out = Vec::new();
        for (s, watched) in t.schedules.iter().zip(watched) {
            let (runs, error) = match me.store.read(&store::key(tenant, &s.name), &t.data).await {
                Ok(l) => (runs_json(&l), None),
                Err(e) => {
                    // (The store's own words, which may name its address, stay in the log.)
                    tracing::warn!(tenant, schedule = %s.name, "reading a schedule's ledger: {e}");
                    (
                        Vec::new(),
                        Some("the schedule's ledger cannot be read now (the server log says why)"),
                    )
                }
            };
            out.push(serde_json::json!({
                "name": s.name,
                "cron": s.cron.expression(),
                "timezone": s.cron.zone(),
                "path": s.path,
                "overlap": s.overlap,
                "catch_up": s.catch_up,
                "next": s.cron.next_n(now, 5).into_iter().map(|t| s.cron.local_text(t)).collect::<Vec<_>>(),
                "runs": runs,
                "runs_error": error,
                "watched_here": watched,
            }));
        }
        Ok(
            serde_json::json!({ "tenant": tenant, "now": crate::schedule::rfc3339(now), "schedules": out }),
        )
    }
}

/// Ticks of `cron` strictly between `from` and `to` (at most [`PASSED_COUNTED`]).
fn passed_between(cron: &crate::schedule::Cron, from: i64, to: i64) -> u64 {
    let mut n = 0;
    let mut at = from;
    while n < PASSED_COUNTED {
        match cron.next_after(at) {
            Some(next) if next < to => {
                n += 1;
                at = next;
            }
            _ => break,
        }
    }
    n
}

/// The most ticks counted missed at once after the clock jumped.
const PASSED_COUNTED: u64 = 10_000;

/// Tenant `t`'s schedule `name`.
fn find<'t>(t: &'t TenantRef, name: &str) -> Result<&'t Schedule, crate::change::ChangeError> {
    t.schedules.iter().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = t.schedules.iter().map(|s| s.name.as_str()).collect();
        crate::change::ChangeError::NotFound(format!(
            "tenant {:?} has no schedule {name:?} (its schedules: {names:?})",
            t.name
        ))
    })
}

/// A ledger's runs, newest first, as JSON.
fn runs_json(l: &Ledger) -> Vec<serde_json::Value> {
    l.runs
        .iter()
        .rev()
        .map(|r| {
            serde_json::json!({
                "tick": crate::schedule::rfc3339(r.tick_ms),
                "manual": r.manual,
                "replica": r.replica,
                "attempt": r.attempt,
                "started": crate::schedule::rfc3339(r.started_ms),
                "state": r.state.name(),
                "status": r.status,
                "took_ms": r.took_ms,
            })
        })
        .collect()
}

/// How long a run of `s` may hold its tick: the longest its guest can take (its time limit
/// times the server's wall-time factor, and the wait for a slot), and a margin.
fn lease_ms<H: Host>(app: &H, t: &TenantRef, s: &Schedule) -> i64 {
    let limit = s.timeout.unwrap_or(t.limits.timeout);
    let longest = limit * crate::execute::WALL_FACTOR + app.queue_timeout();
    i64::try_from(longest.as_millis()).unwrap_or(i64::MAX / 2) + LEASE_SLACK_MS
}

/// Takes `tick` of its schedule through the ledger and runs it when it is this replica's;
/// a tick another replica holds is looked at again when its lease ends (unless the server
/// shuts down meanwhile).
async fn take<H: Host>(app: &Arc<H>, tenant: TenantRef, mut tick: Tick, shutdown: &Shutdown) {
    let me = app.scheduler();
    let mut tenant = tenant;
    while let Some(until) = take_once(app, &tenant, &tick, shutdown).await {
        while me.clock.now_ms() < until + LEASE_MARGIN_MS {
            tokio::select! {
                () = me.clock.sleep_until(until + LEASE_MARGIN_MS, Duration::from_secs(60)) => {}
                () = shutdown.wait() => return,
            }
        }
        tick.until_ms = Some(i64::MAX);
        // The tenant as it serves now (redeployed meanwhile: its new version; deleted, made
        // again under its name, or the schedule gone: nothing to run).
        match app.live().tenants.get(&tick.tenant) {
            Some(now) if now.data == tick.data && find(now, &tick.schedule).is_ok() => {
                tenant = now.clone();
            }
            _ => return,
        }
    }
}

/// Takes `tick` of its schedule through the ledger and runs it when it is this replica's;
/// tries again while the registry cannot be reached, until the tick's time to be taken ends.
/// Held by another replica: until when.
async fn take_once<H: Host>(
    app: &Arc<H>,
    tenant: &TenantRef,
    tick: &Tick,
    shutdown: &Shutdown,
) -> Option<i64> {
    let me = app.scheduler();
    let Ok(s) = find(tenant, &tick.schedule) else {
        return None;
    };
    // One token for every try of this take: a try whose write reached the ledger but whose
    // answer was lost is recognised by the next.
    let token = crate::hex::random_id::<8>();
    // (Past shutdown nothing is taken; a take already written still runs, and ends within
    // the grace.)
    if shutdown.is_triggered() {
        return None;
    }
    let key = store::key(&tick.tenant, &tick.schedule);
    let runs = &app.metrics().schedule_runs;
    let lease = lease_ms(app.as_ref(), tenant, s);
    loop {
        let catching_up = tick.until_ms.is_none();
        let until = tick.until_ms.unwrap_or(i64::MAX);
        let claimed = me
            .store
            .update((&key, &tick.data), |l| {
                // This take's own write, whose answer was lost: nothing to write again.
                if let Some(own) = l.mine(tick.at_ms, &token) {
                    return (Some(own), false);
                }
                if catching_up && l.last_tick().is_none_or(|last| last >= tick.at_ms) {
                    // Nothing missed: a new schedule, or its last tick was taken.
                    return (Some(Claim::Taken(None)), false);
                }
                // Read after a long wait for the registry: not taken once its time is over
                // (missed, unless another replica took it or a later tick).
                let now = me.clock.now_ms();
                if now >= until {
                    let taken = l.runs.iter().any(|r| !r.manual && r.tick_ms >= tick.at_ms);
                    return (taken.then_some(Claim::Taken(None)), false);
                }
                let c = l.claim(tick.at_ms, now, (&me.replica, &token), lease, s.overlap);
                let changed = matches!(c, Claim::Run(_) | Claim::Skipped);
                (Some(c), changed)
            })
            .await;
        let claimed = match claimed {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(StoreError::Unreachable(
                "its time to be taken passed while the registry was read".into(),
            )),
            Err(e) => Err(e),
        };
        match claimed {
            Ok(Claim::Run(attempt) | Claim::Resumed(attempt)) => {
                if attempt > 1 {
                    // The first run's holder let its lease pass (it died, or could not record
                    // the end): counted by the replica that runs the tick again.
                    runs.with_label_values(&[&tenant.label, "lost"]).inc();
                    tracing::warn!(
                        tenant = %tick.tenant,
                        schedule = %tick.schedule,
                        tick = %crate::schedule::rfc3339(tick.at_ms),
                        "a scheduled run's holder let its lease pass without recording its \
                         end: the tick runs once more here"
                    );
                }
                let ran = fire(app, tenant, s, (tick.at_ms, false, attempt), &key).await;
                tracing::debug!(tenant = %tick.tenant, schedule = %tick.schedule, ?ran, "scheduled run ended");
                return None;
            }
            Ok(Claim::Skipped) => {
                runs.with_label_values(&[&tenant.label, "skipped"]).inc();
                tracing::info!(
                    tenant = %tick.tenant,
                    schedule = %tick.schedule,
                    tick = %crate::schedule::rfc3339(tick.at_ms),
                    "scheduled tick skipped: the last run still runs (overlap = \"skip\")"
                );
                return None;
            }
            // Held by another replica: looked at again when its lease ends.
            Ok(Claim::Taken(Some(until))) => return Some(until),
            Ok(Claim::Taken(None)) => return None,
            Err(e) => {
                if me.clock.now_ms() >= until {
                    runs.with_label_values(&[&tenant.label, "missed"]).inc();
                    tracing::warn!(
                        tenant = %tick.tenant,
                        schedule = %tick.schedule,
                        tick = %crate::schedule::rfc3339(tick.at_ms),
                        "scheduled tick missed: its ledger could not be written before the \
                         next tick ({e})"
                    );
                    return None;
                }
                tokio::select! {
                    () = me.clock.sleep_until(me.clock.now_ms() + 1000, Duration::from_secs(1)) => {}
                    () = shutdown.wait() => return None,
                }
            }
        }
    }
}

/// Runs `s` of `tenant` for `(tick, manual, attempt)` and records its end in the ledger `key`.
async fn fire<H: Host>(
    app: &Arc<H>,
    tenant: &TenantRef,
    s: &Schedule,
    run: (i64, bool, u8),
    key: &str,
) -> Ran {
    let me = app.scheduler();
    let (tick_ms, manual, _) = run;
    if !manual {
        let lag = (me.clock.now_ms() - tick_ms).max(0);
        app.metrics().schedule_lag.observe(lag as f64 / 1000.0);
    }
    let started = Instant::now();
    let req = request(tenant, s, tick_ms);
    let resp = H::fire(app, tenant.clone(), req, s.timeout).await;
    let status = resp.status().as_u16();
    // The body is read to its end (a streamed answer ends with its guest) and dropped.
    let mut body = resp.into_body();
    let mut whole = true;
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            whole = false;
            break;
        }
    }
    let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let state = if whole && status < 400 {
        State::Ok
    } else {
        State::Failed
    };
    if state == State::Failed {
        tracing::warn!(
            tenant = %tenant.name,
            schedule = %s.name,
            status,
            took_ms,
            "scheduled run failed"
        );
    }
    let mut tries = 0;
    loop {
        let ended = me
            .store
            .update((key, &tenant.data), |l| {
                let found = l.end(run, &me.replica, state, Some(status), took_ms);
                ((), found)
            })
            .await;
        match ended {
            Ok(()) => break,
            Err(e) if tries < 10 => {
                tries += 1;
                tracing::debug!(tenant = %tenant.name, schedule = %s.name, "recording a run's end: {e}");
                tokio::time::sleep(Duration::from_millis(200 << tries.min(5))).await;
            }
            Err(e) => {
                tracing::warn!(
                    tenant = %tenant.name,
                    schedule = %s.name,
                    "a scheduled run's end could not be recorded (after its lease another \
                     replica may run its tick once more): {e}"
                );
                break;
            }
        }
    }
    // Counted once its end is in the ledger (a replica reading the ledger then sees it ended).
    app.metrics()
        .schedule_runs
        .with_label_values(&[&tenant.label, state.name()])
        .inc();
    Ran {
        state: state.name(),
        status,
        took_ms,
    }
}

/// The request a scheduled run of `s` sends its guest for `tick_ms`.
fn request(tenant: &TenantRef, s: &Schedule, tick_ms: i64) -> Request<RequestBody> {
    let host = tenant
        .hosts
        .iter()
        .find(|h| !h.contains('*'))
        .map_or("localhost", String::as_str);
    let mut req = Request::new(if s.body.is_empty() {
        RequestBody::Empty
    } else {
        RequestBody::Full(s.body.clone())
    });
    *req.method_mut() = Method::POST;
    *req.uri_mut() = s.path.parse().expect("checked when the schedule was read");
    let h = req.headers_mut();
    for (k, v) in &s.headers {
        h.append(k.clone(), v.clone());
    }
    let text = |t: &str| HeaderValue::from_str(t).unwrap_or(HeaderValue::from_static("-"));
    h.insert(http::header::HOST, text(host));
    h.insert(&crate::schedule::TERN_SCHEDULE, text(s.cron.expression()));
    h.insert(&crate::schedule::TERN_SCHEDULE_NAME, text(&s.name));
    h.insert(
        &crate::schedule::TERN_SCHEDULED_TIME,
        text(&crate::schedule::rfc3339(tick_ms)),
    );
    h.insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(s.body.len()),
    );
    if !s.body.is_empty() && !h.contains_key(http::header::CONTENT_TYPE) {
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    req
}
