//! The host capabilities of one request, prepared once whatever its guest's kind: what its
//! tenant is granted (outbound calls, key-value stores), bound to this request (its id, its
//! trace, what it hands on, the operations it made, the time it waited).
//!
//! Every kind's store state holds one [`Capabilities`] and gives it out through [`HostView`];
//! each host API reaches its part there, and only its handles (the `tern` ABI's) or bindings
//! (the components') are the kind's own. A new host API is a part here, a module of its own
//! with its link functions, and one line in each kind's linker (`guest::module::linker`,
//! `guest::wasi_http::linker`).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

/// One request's host capabilities (see the module docs).
pub struct Capabilities {
    /// Outbound HTTP under the tenant's policy.
    pub outbound: crate::outbound::Session,
    /// The tenant's key-value stores.
    pub kv: crate::kv::Session,
}

impl Capabilities {
    /// Nothing used yet: the tenant's outbound `calls` and key-value `grants`, for the request
    /// `request_id` (with its `trace`, when tracing is on).
    pub fn new(
        calls: Arc<crate::outbound::Calls>,
        grants: Arc<crate::kv::Grants>,
        request_id: HeaderValue,
        trace: Option<Arc<crate::trace::Active>>,
    ) -> Self {
        Self {
            outbound: crate::outbound::Session::new(calls, request_id),
            kv: crate::kv::Session::new(grants, trace),
        }
    }

    /// Time the guest waited for outbound requests and for key-value stores.
    pub fn waited(&self) -> (Duration, Duration) {
        (self.outbound.waited(), self.kv.waited)
    }
}

/// A store state that holds its request's [`Capabilities`].
pub trait HostView {
    /// The request's capabilities.
    fn host(&mut self) -> &mut Capabilities;
}
