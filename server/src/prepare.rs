//! What a tenant's parts are prepared from when it is loaded: its name, label and settings,
//! and what the server shares with every tenant. Its guests' grants
//! ([`crate::capabilities::Grants`]) and its front-end features ([`crate::front::Front`]) are
//! each made from one [`Preparing`].

/// What a tenant's per-tenant parts (its guests' [`Grants`](crate::capabilities::Grants), its
/// [`Front`](crate::front::Front)) are prepared from when it is loaded.
pub struct Preparing<'a> {
    /// The tenant's name.
    pub tenant: &'a str,
    /// Its metrics label.
    pub label: &'a str,
    /// Its settings.
    pub settings: &'a crate::config::TenantSettings<toml::Spanned<String>>,
    /// Its budget of guest log lines (denied calls are logged within it).
    pub log_budget: &'a std::sync::Arc<crate::logwriter::LogBudget>,
    /// Where its metric handles come from.
    pub metrics: &'a crate::metrics::Metrics,
    /// The key-value stores the server has.
    pub stores: &'a crate::kv::Stores,
    /// Every tenant's variables.
    pub variables: &'a std::sync::Arc<crate::variables::Table>,
    /// Its cache (`[tenant.cache]`), when it has one: shared by its front and its backends.
    pub cache: Option<std::sync::Arc<crate::cache::Cache>>,
}
