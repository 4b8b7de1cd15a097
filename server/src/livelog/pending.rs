//! A record being made as its request goes through the front end's steps.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Uri};

use super::record::{Ended, Record, now_ms};
use super::ring::Tail;
use crate::guest::Output;
use crate::metrics::{Phase, Timings};

/// A record being made: what the exchange knew when it was routed, then how its guest ended;
/// kept in its tenant's ring when the answer's head is made ([`Pending::finish`]).
pub struct Pending {
    tail: Arc<Tail>,
    version: Arc<str>,
    method: Method,
    target: Uri,
    http: http::Version,
    client: IpAddr,
    trigger: crate::trigger::Trigger,
    ended: Option<Ended>,
    output: Option<Output>,
    error: Option<Box<(String, Option<Box<str>>)>>,
}

impl Pending {
    /// A record of `req` from `client` (made by `trigger`) for the tenant whose live log is
    /// `tail` (its version serving: `version`), if its live log is on.
    pub fn begin<B>(
        (tail, version): (&Arc<Tail>, &Arc<str>),
        req: &http::Request<B>,
        client: IpAddr,
        trigger: crate::trigger::Trigger,
    ) -> Option<Self> {
        tail.is_on().then(|| Self {
            tail: tail.clone(),
            version: version.clone(),
            method: req.method().clone(),
            target: req.uri().clone(),
            http: req.version(),
            client,
            trigger,
            ended: None,
            output: None,
            error: None,
        })
    }

    /// Its guest ended with `result`, having written `output`.
    pub fn ran<T>(
        &mut self,
        result: &Result<T, crate::outcome::ExecError>,
        output: Option<Output>,
    ) {
        self.output = output;
        match result {
            Ok(_) => self.ended = Some(Ended::Guest(crate::outcome::Outcome::Ok)),
            Err(e) => self.refused(e),
        }
    }

    /// It failed (its guest, or a refusal before one ran) with `e`.
    pub fn refused(&mut self, e: &crate::outcome::ExecError) {
        self.ended = Some(Ended::Guest(e.outcome));
        self.error = Some(Box::new((e.message.clone(), e.backtrace.clone())));
    }

    /// It was answered from its tenant's cache.
    pub fn cached(&mut self, stale: bool) {
        self.ended = Some(Ended::Cached { stale });
    }

    /// Its answer's head is made: the record kept in its tenant's ring, unless sampled out
    /// (then nothing of it is copied).
    pub fn finish(self, answered: Answered<'_>) {
        let outcome = self
            .ended
            .unwrap_or(Ended::Guest(crate::outcome::Outcome::Ok));
        let ended_ms = now_ms();
        // (A scheduled run is rare and wanted: never sampled out.)
        let always = outcome.always_kept(answered.status)
            || self.trigger == crate::trigger::Trigger::Schedule;
        let Some(sample) = self.tail.sample(ended_ms / 1000, always) else {
            return;
        };
        let target = self
            .target
            .path_and_query()
            .map_or_else(|| self.target.path(), |pq| pq.as_str());
        let record = Record {
            seq: 0,
            ended_ms,
            total: answered.total,
            timings: *answered.timings,
            reached: answered.reached,
            request_id: answered.request_id.to_str().unwrap_or("-").into(),
            version: self.version,
            client: self.client,
            trigger: self.trigger,
            method: self.method,
            target: target.into(),
            http: self.http,
            status: answered.status,
            outcome,
            cache: answered
                .headers
                .and_then(|h| h.get(&crate::cache::CACHE_STATUS))
                .cloned(),
            output: self.output,
            error: self.error,
            sample,
            json: std::sync::OnceLock::new(),
        };
        self.tail.keep(record);
    }
}

/// What the answer adds to a record.
pub struct Answered<'a> {
    /// The request's id.
    pub request_id: &'a HeaderValue,
    /// The status answered.
    pub status: u16,
    /// The answer's headers, whose `Cache-Status` (if the tenant's cache gave one) the record
    /// keeps: looked up only for a record that is kept.
    pub headers: Option<&'a http::HeaderMap>,
    /// Its phases, up to `reached`.
    pub timings: &'a Timings,
    /// The last phase it reached.
    pub reached: Phase,
    /// Arrival to answer.
    pub total: Duration,
}
