//! Where tenants' variables come from (the manifest's [`Stored`] ones, a config file's
//! [`Declared`] ones), the [`Table`] every tenant's guests read, following the registry, and
//! a tenant's [`Grant`] of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use super::seal::{self, SecretsKey};
use super::value::{MAX_VARIABLES, Secret, Value, Values, check_name, check_value};

/// A variable as the manifest keeps it (an API tenant's): a plain value, or a secret sealed
/// under the secrets key with its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Stored {
    /// A plain value.
    Plain {
        /// The value.
        value: String,
        /// When it was set (Unix seconds).
        updated_at: u64,
    },
    /// A secret.
    Secret {
        /// The value sealed ([`SecretsKey::seal`]).
        sealed: String,
        /// [`SecretsKey::digest`] of the value.
        digest: String,
        /// When it was set (Unix seconds).
        updated_at: u64,
    },
}

/// A variable in a config file's `[tenant.variables]`: a plain value, or a secret read from
/// the server's environment or a file when the tenant is loaded.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Declared {
    /// `name = "value"`.
    Plain(String),
    /// `name = { secret_env = "VAR" }` or `name = { secret_file = "/run/secrets/x" }`.
    Secret(SecretFrom),
}

/// Where a config file's secret comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretFrom {
    /// An environment variable of the server.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// A file (relative to the config file), its content without a final newline.
    #[serde(default)]
    pub secret_file: Option<String>,
}

/// Checks a config file's declarations (names, count, one source per secret, plain sizes).
///
/// # Errors
/// The first problem, in words for the operator.
pub fn check_declared(declared: &BTreeMap<String, Declared>) -> Result<(), String> {
    if declared.len() > MAX_VARIABLES {
        return Err(format!(
            "{} variables; a tenant has at most {MAX_VARIABLES}",
            declared.len()
        ));
    }
    for (name, d) in declared {
        check_name(name)?;
        match d {
            Declared::Plain(v) => check_value(name, v)?,
            Declared::Secret(from) => {
                if from.secret_env.is_some() == from.secret_file.is_some() {
                    return Err(format!(
                        "variable {name:?}: a secret names one of secret_env or secret_file"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A config file's declarations read into values (secrets from the environment or files).
pub(super) fn resolve_declared(
    declared: &BTreeMap<String, Declared>,
    base_dir: &std::path::Path,
) -> Values {
    let mut values = BTreeMap::new();
    let mut unreadable = Vec::new();
    for (name, d) in declared {
        let value = match d {
            Declared::Plain(v) => Value::Plain(v.as_str().into()),
            Declared::Secret(SecretFrom {
                secret_env: Some(var),
                ..
            }) => match std::env::var(var) {
                Ok(v) => Value::Secret(Secret::new(v)),
                Err(_) => {
                    unreadable.push(format!("{name:?}: the server's environment has no {var}"));
                    continue;
                }
            },
            Declared::Secret(SecretFrom {
                secret_file: Some(file),
                ..
            }) => match std::fs::read_to_string(base_dir.join(file)) {
                Ok(mut v) => {
                    if v.ends_with('\n') {
                        v.pop();
                    }
                    Value::Secret(Secret::new(v))
                }
                Err(e) => {
                    unreadable.push(format!("{name:?}: cannot read {file}: {e}"));
                    continue;
                }
            },
            Declared::Secret(_) => continue,
        };
        values.insert(name.clone(), value);
    }
    Values {
        values,
        unreadable: (!unreadable.is_empty())
            .then(|| format!("secrets missing on this server: {}", unreadable.join("; "))),
    }
}

/// An API tenant's stored variables opened with `key` (none: secrets cannot be opened).
fn open_stored(
    tenant: &str,
    stored: &BTreeMap<String, Stored>,
    key: Option<&SecretsKey>,
) -> Values {
    let mut values = BTreeMap::new();
    let mut unreadable = None;
    for (name, s) in stored {
        match s {
            Stored::Plain { value, .. } => {
                values.insert(name.clone(), Value::Plain(value.as_str().into()));
            }
            Stored::Secret { sealed, .. } => match key
                .ok_or_else(|| seal::NO_KEY.to_string())
                .and_then(|k| k.open(tenant, name, sealed))
            {
                Ok(secret) => {
                    values.insert(name.clone(), Value::Secret(secret));
                }
                Err(why) => unreadable = Some(why),
            },
        }
    }
    Values { values, unreadable }
}

/// Where a tenant's variables come from, as the table last read them.
#[derive(PartialEq, Eq)]
enum Source {
    File(BTreeMap<String, Declared>),
    Api(BTreeMap<String, Stored>),
}

/// A tenant's variables as the registry holds them now, compared with what the table last
/// read before anything is copied.
enum Borrowed<'a> {
    File(&'a BTreeMap<String, Declared>),
    Api(&'a BTreeMap<String, Stored>),
}

impl Borrowed<'_> {
    fn is_empty(&self) -> bool {
        match self {
            Self::File(d) => d.is_empty(),
            Self::Api(s) => s.is_empty(),
        }
    }

    fn is_file(&self) -> bool {
        matches!(self, Self::File(_))
    }

    /// Whether the table last read exactly this.
    fn is(&self, known: &Source) -> bool {
        match (self, known) {
            (Self::File(d), Source::File(k)) => *d == k,
            (Self::Api(s), Source::Api(k)) => *s == k,
            _ => false,
        }
    }

    fn owned(&self) -> Source {
        match self {
            Self::File(d) => Source::File((*d).clone()),
            Self::Api(s) => Source::Api((*s).clone()),
        }
    }
}

/// Every tenant's variables, as their guests read them; replaced as a whole when one
/// changes (a change is rare, a read is one atomic load and one lookup).
#[derive(Default)]
pub struct Table {
    tenants: ArcSwap<HashMap<String, Arc<Values>>>,
    /// What each tenant's values were made from, so only changed ones are made again.
    sources: std::sync::Mutex<HashMap<String, Source>>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("tenants", &self.tenants.load().len())
            .finish()
    }
}

/// The tenants whose variables the table follows: the config file's (declared) and the
/// API's (stored).
pub struct Sources<'a> {
    /// Config-file tenants and their declarations.
    pub file: Vec<(&'a str, &'a BTreeMap<String, Declared>)>,
    /// Where the config file's relative paths start.
    pub base_dir: &'a std::path::Path,
    /// API tenants and their stored variables: each tenant's data key (its name and id:
    /// a tenant created again under a deleted one's name reads none of its variables, not
    /// even from a request of the deleted one still running), its name (its secrets are
    /// sealed to it), its variables.
    pub api: Vec<(std::sync::Arc<str>, &'a str, &'a BTreeMap<String, Stored>)>,
    /// Read the config file's secrets again even if their declarations did not change (a
    /// reload of the config file).
    pub reread_file: bool,
}

impl Table {
    /// The values of the tenant whose data key is `tenant` (none: an empty set).
    pub fn of(&self, tenant: &str) -> Option<Arc<Values>> {
        self.tenants.load().get(tenant).cloned()
    }

    /// Makes the table follow `sources`: tenants whose variables changed get new values,
    /// tenants no longer there are dropped. Returns the tenants whose secrets cannot be
    /// opened here, with why.
    pub fn follow(&self, sources: &Sources<'_>, key: Option<&SecretsKey>) -> Vec<(String, String)> {
        let mut known = self
            .sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = self.tenants.load();
        let mut next = HashMap::new();
        let mut next_sources = HashMap::new();
        let mut unreadable = Vec::new();
        let mut changed = false;
        // Borrowed until a tenant's variables prove changed: an unchanged tenant's are not
        // copied at each change of the registry.
        let file = (sources.file.iter()).map(|(n, d)| (*n, *n, Borrowed::File(d)));
        let api = (sources.api.iter()).map(|(k, n, s)| (&**k, *n, Borrowed::Api(s)));
        for (at, name, borrowed) in file.chain(api) {
            if borrowed.is_empty() {
                continue;
            }
            let kept = known
                .remove(at)
                .filter(|k| borrowed.is(k) && !(sources.reread_file && borrowed.is_file()));
            let same = kept.is_some();
            let source = kept.unwrap_or_else(|| borrowed.owned());
            let values = match (same, old.get(at)) {
                (true, Some(v)) => v.clone(),
                _ => {
                    changed = true;
                    Arc::new(match &source {
                        Source::File(d) => resolve_declared(d, sources.base_dir),
                        Source::Api(s) => open_stored(name, s, key),
                    })
                }
            };
            if let Some(why) = &values.unreadable {
                unreadable.push((name.to_string(), why.clone()));
            }
            next.insert(at.to_string(), values);
            next_sources.insert(at.to_string(), source);
        }
        if changed || next.len() != old.len() {
            self.tenants.store(Arc::new(next));
        }
        *known = next_sources;
        unreadable
    }
}

/// What a tenant's guests read their variables through (its grant, prepared at load).
#[derive(Debug, Clone)]
pub struct Grant {
    tenant: Arc<str>,
    table: Arc<Table>,
}

impl Grant {
    /// `p`'s tenant's variables in the server's `table` (by its data key).
    pub fn prepare(p: &crate::prepare::Preparing<'_>, table: &Arc<Table>) -> Self {
        Self::new(p.data, table.clone())
    }

    /// The variables in `table` of the tenant whose data key is `tenant`.
    pub fn new(tenant: &str, table: Arc<Table>) -> Self {
        Self {
            tenant: tenant.into(),
            table,
        }
    }

    /// The tenant's variables now (empty when it has none).
    pub fn values(&self) -> Arc<Values> {
        static NONE: std::sync::LazyLock<Arc<Values>> = std::sync::LazyLock::new(Arc::default);
        // A tenant without variables (most) costs no allocation per request.
        self.table.of(&self.tenant).unwrap_or_else(|| NONE.clone())
    }
}
