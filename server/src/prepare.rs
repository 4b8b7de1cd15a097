//! Who a tenant's parts are prepared for when it is loaded: its name, label, log budget and
//! metrics. Each capability's grant (`outbound::Grant`, `kv::Grant`, `variables::Grant`,
//! `cache::guest::Grant`, composed in [`crate::capabilities::Grants`]) and its front-end
//! features ([`crate::tenant::front::Front`]) are made from one [`Preparing`], with their own section
//! of its settings and the server resource each needs beside it
//! ([`crate::capabilities::Resources`]). A request's sessions are then made from the grants
//! and its [`crate::context::RequestContext`].

/// Who a tenant's per-tenant parts are prepared for when it is loaded.
pub struct Preparing<'a> {
    /// The tenant's name.
    pub tenant: &'a str,
    /// Whose key-value data its guests reach ([`crate::config::TenantConfig::data`]).
    pub data: &'a std::sync::Arc<str>,
    /// Its metrics label.
    pub label: &'a str,
    /// Its budget of guest log lines (denied calls are logged within it).
    pub log_budget: &'a std::sync::Arc<crate::logwriter::LogBudget>,
    /// Where its metric handles come from.
    pub metrics: &'a crate::metrics::Metrics,
}
