//! One request's outbound calls, whatever its guest's kind: what the tenant may call, what the
//! client's request hands on, how many requests were made and how long the guest waited.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::body::ComponentCalls;
use super::calls::{Grant, Passing};

/// One request's outbound calls (see the module docs).
pub struct Session {
    /// What the tenant's guests may call, with the metric handles of those calls.
    pub grant: Arc<Grant>,
    /// What the client's request hands on, worked out at the first request (see
    /// [`Session::passing`]).
    passing: Option<Passing>,
    /// Requests made so far.
    pub sent: usize,
    /// Time the guest spent waiting in its own outbound calls.
    pub waited: Duration,
    /// Shared with requests whose bodies outlive the call that made them (a component's): the
    /// time waited for their heads, and whether the run failed. Made by the first.
    pub shared: Option<Arc<ComponentCalls>>,
    /// The client's request, in log lines.
    pub request_id: HeaderValue,
}

impl Session {
    /// No request made yet, under the tenant's `grant`, for the request of `context`.
    pub fn new(grant: Arc<Grant>, context: &crate::context::RequestContext) -> Self {
        Self {
            grant,
            passing: None,
            sent: 0,
            waited: Duration::ZERO,
            shared: None,
            request_id: context.request_id.clone(),
        }
    }

    /// What the client's request (its `headers`, its trace) hands on to the guest's requests,
    /// worked out once, at the first call that asks.
    pub fn passing(
        &mut self,
        headers: &HeaderMap,
        trace: Option<&Arc<crate::trace::Active>>,
    ) -> &Passing {
        self.passing
            .get_or_insert_with(|| Passing::of(headers, trace))
    }

    /// Time waited for answers, the guest's own calls and those of bodies it left streaming.
    pub fn waited(&self) -> Duration {
        let shared = self.shared.as_ref();
        self.waited
            + Duration::from_nanos(shared.map_or(0, |s| s.waited_ns.load(Ordering::Relaxed)))
    }

    /// Marks the guest's run as failed (a trap, its deadline): request bodies still streaming
    /// fail toward their backends when the store is dropped, rather than ending as if
    /// complete.
    pub fn run_failed(&self) {
        if let Some(shared) = &self.shared {
            shared.failed.store(true, Ordering::Release);
        }
    }
}
