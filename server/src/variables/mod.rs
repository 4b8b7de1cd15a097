//! Tenants' variables: configuration and secrets their guests read through the APIs they
//! already use (Spin's variables, `wasi:config/store`, a CGI program's environment).
//!
//! A variable is plain or secret. Plain ones are shown by the admin API; a secret never is:
//! the API lists its name, a digest and when it was set. Secrets are sealed at rest (in the
//! data directory's manifest and a fleet's registry) under the secrets key ([`seal`]), held
//! in memory as [`Secret`] (whose `Debug` and `Display` show no value), and opened only for
//! the guest that asks. A config-file tenant's secrets come from the server's environment or
//! files (`{ secret_env = "NAME" }`, `{ secret_file = "path" }`), never from the file itself.
//!
//! Setting a variable changes no version: the [`Table`] every tenant's guests read follows
//! the registry, so the next request sees it (on every replica of a fleet once it has read
//! the registry). A tenant whose secrets this server cannot open (another key) still serves,
//! and its guests' reads fail with a provider error that says so (never a wrong value).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

pub mod env;
pub mod seal;

pub use env::{Env, EnvValue};
pub use seal::SecretsKey;

/// Most variables (plain and secret) of one tenant.
pub const MAX_VARIABLES: usize = 256;
/// Largest value of a variable, in bytes.
pub const MAX_VALUE_BYTES: usize = 32 * 1024;
/// Longest variable name.
pub const MAX_NAME_BYTES: usize = 64;

/// A secret's value: shown by nothing but [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<str>);

impl Secret {
    /// Holds `value`.
    pub fn new(value: String) -> Self {
        Self(value.into_boxed_str())
    }

    /// The value, for the guest that asked for it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A variable's value, ready for guests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Shown to operators.
    Plain(Box<str>),
    /// Shown to no one but the tenant's guests.
    Secret(Secret),
}

impl Value {
    fn text(&self) -> &str {
        match self {
            Self::Plain(v) => v,
            Self::Secret(s) => s.expose(),
        }
    }
}

/// A tenant's variables as its guests read them.
#[derive(Debug, Default)]
pub struct Values {
    values: BTreeMap<String, Value>,
    /// Why some of its secrets cannot be opened here (then no read answers a value).
    unreadable: Option<String>,
}

/// What a guest's read of a variable finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Found<'a> {
    /// Its value.
    Value(&'a str),
    /// No variable of that name.
    Undefined,
    /// The tenant's secrets cannot be opened on this server (why, in words).
    Unavailable(&'a str),
}

impl Values {
    /// The value of `name`.
    pub fn get(&self, name: &str) -> Found<'_> {
        if let Some(why) = &self.unreadable {
            return Found::Unavailable(why);
        }
        match self.values.get(name) {
            Some(v) => Found::Value(v.text()),
            None => Found::Undefined,
        }
    }

    /// Every name and value, by name.
    ///
    /// # Errors
    /// Why the tenant's secrets cannot be opened here.
    pub fn all(&self) -> Result<Vec<(String, String)>, String> {
        if let Some(why) = &self.unreadable {
            return Err(why.clone());
        }
        Ok(self
            .values
            .iter()
            .map(|(k, v)| (k.clone(), v.text().to_string()))
            .collect())
    }
}

/// Checks a variable's name: Spin's rule, lower-case ASCII letters, digits and `_`, starting
/// with a letter, no `__`, not ending in `_`, at most 64 bytes.
///
/// # Errors
/// What is wrong with it, in words for the operator.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= MAX_NAME_BYTES
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.contains("__")
        && !name.ends_with('_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a variable name: lower-case letters, digits and '_', starting \
             with a letter, no '__', not ending in '_', at most {MAX_NAME_BYTES} bytes \
             (Spin's rule)"
        ))
    }
}

/// Checks a value's size.
///
/// # Errors
/// A value over [`MAX_VALUE_BYTES`].
pub fn check_value(name: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "the value of {name:?} is {} bytes; a variable holds at most {MAX_VALUE_BYTES}",
            value.len()
        ));
    }
    Ok(())
}

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
fn resolve_declared(declared: &BTreeMap<String, Declared>, base_dir: &std::path::Path) -> Values {
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
    /// API tenants and their stored variables.
    pub api: Vec<(&'a str, &'a BTreeMap<String, Stored>)>,
    /// Read the config file's secrets again even if their declarations did not change (a
    /// reload of the config file).
    pub reread_file: bool,
}

impl Table {
    /// The values of `tenant` (none: an empty set).
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
        let file = sources.file.iter().map(|(n, d)| (*n, Borrowed::File(d)));
        let api = sources.api.iter().map(|(n, s)| (*n, Borrowed::Api(s)));
        for (name, borrowed) in file.chain(api) {
            if borrowed.is_empty() {
                continue;
            }
            let kept = known
                .remove(name)
                .filter(|k| borrowed.is(k) && !(sources.reread_file && borrowed.is_file()));
            let same = kept.is_some();
            let source = kept.unwrap_or_else(|| borrowed.owned());
            let values = match (same, old.get(name)) {
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
            next.insert(name.to_string(), values);
            next_sources.insert(name.to_string(), source);
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
pub struct Granted {
    tenant: Arc<str>,
    table: Arc<Table>,
}

impl Granted {
    /// `tenant`'s variables in `table`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_spins_rule() {
        for ok in ["a", "api_key", "region2", "a_b_c"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "A",
            "1a",
            "_a",
            "a_",
            "a__b",
            "a-b",
            "é",
            &"a".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_value("a", &"x".repeat(MAX_VALUE_BYTES)).is_ok());
        assert!(check_value("a", &"x".repeat(MAX_VALUE_BYTES + 1)).is_err());
    }

    #[test]
    fn secrets_show_no_value() {
        let s = Secret::new("sk-live-1".into());
        assert!(!format!("{s:?} {s} {:?}", Value::Secret(s.clone())).contains("sk-live"));
        assert_eq!(s.expose(), "sk-live-1");
    }

    #[test]
    fn the_table_follows_its_sources_and_says_what_it_cannot_open() {
        let key = SecretsKey::new(&[7; 32], None, "test".into());
        let table = Arc::new(Table::default());
        let granted = Granted::new("t", table.clone());
        assert_eq!(granted.values().get("a"), Found::Undefined);
        let mut stored = BTreeMap::new();
        stored.insert(
            "a".to_string(),
            Stored::Plain {
                value: "1".into(),
                updated_at: 0,
            },
        );
        stored.insert(
            "s".to_string(),
            Stored::Secret {
                sealed: key.seal("t", "s", "hush"),
                digest: key.digest("t", "s", "hush"),
                updated_at: 0,
            },
        );
        let dir = std::path::Path::new("/");
        let sources = |api| Sources {
            file: vec![],
            base_dir: dir,
            api,
            reread_file: false,
        };
        assert!(
            table
                .follow(&sources(vec![("t", &stored)]), Some(&key))
                .is_empty()
        );
        let values = granted.values();
        assert_eq!(values.get("a"), Found::Value("1"));
        assert_eq!(values.get("s"), Found::Value("hush"));
        assert_eq!(values.get("b"), Found::Undefined);
        // Unchanged sources keep their values (nothing is opened again).
        table.follow(&sources(vec![("t", &stored)]), Some(&key));
        assert!(Arc::ptr_eq(&values, &granted.values()));
        // Another key opens nothing and says so.
        let other = SecretsKey::new(&[8; 32], None, "test".into());
        let fresh = Table::default();
        let why = fresh.follow(&sources(vec![("t", &stored)]), Some(&other));
        assert_eq!(why.len(), 1);
        assert!(matches!(
            fresh.of("t").unwrap().get("a"),
            Found::Unavailable(_)
        ));
        // A tenant gone is dropped.
        table.follow(&sources(vec![]), Some(&key));
        // Without a key (a fleet's replica not given one) secrets say why they cannot be read.
        let keyless = Table::default();
        let why = keyless.follow(&sources(vec![("t", &stored)]), None);
        assert!(why[0].1.contains("TERN_SECRETS_KEY"), "{why:?}");
        assert_eq!(granted.values().get("a"), Found::Undefined);
    }

    #[test]
    fn declared_secrets_come_from_the_environment_or_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "from-file\n").unwrap();
        let mut declared = BTreeMap::new();
        declared.insert("plain".to_string(), Declared::Plain("p".into()));
        declared.insert(
            "pw".to_string(),
            Declared::Secret(SecretFrom {
                secret_env: None,
                secret_file: Some("pw".into()),
            }),
        );
        assert!(check_declared(&declared).is_ok());
        let v = resolve_declared(&declared, dir.path());
        assert_eq!(v.get("pw"), Found::Value("from-file"));
        assert_eq!(v.get("plain"), Found::Value("p"));
        declared.insert(
            "gone".to_string(),
            Declared::Secret(SecretFrom {
                secret_env: Some("TERN_TEST_NO_SUCH_VARIABLE".into()),
                secret_file: None,
            }),
        );
        let v = resolve_declared(&declared, dir.path());
        assert!(
            matches!(v.get("plain"), Found::Unavailable(w) if w.contains("TERN_TEST_NO_SUCH_VARIABLE"))
        );
        declared.insert(
            "both".to_string(),
            Declared::Secret(SecretFrom {
                secret_env: Some("A".into()),
                secret_file: Some("b".into()),
            }),
        );
        assert!(check_declared(&declared).is_err());
    }
}
