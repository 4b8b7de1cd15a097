//! The registry's state: what is served ([`Live`]), what was last read or written
//! ([`State`]), and the [`Registry`] holding them, with the checks a change passes first. Its
//! operations are the sibling files' `impl Registry` blocks, one subject each.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use super::error::internal;
use super::loader::Loader;
use super::serving::{Candidate, Serving};
use crate::access::Principal;
use crate::access::StoredToken;
use crate::change::ChangeError;
use crate::config::Config;
use crate::datadir::{Manifest, StoredTenant, TenantSpec, Version};
use crate::engine::EpochTicker;
use crate::fleet::Fleet;
use crate::router::{Clash, HostPattern, Route, Router, deeper};
use crate::tenant::{Carried, Tenant, TenantRef};
use object_store::UpdateVersion;

/// What requests read: the routing table, the tenants by name and their candidates.
#[derive(Debug, Default)]
pub struct Live {
    /// Host/path → the tenant's versions.
    pub router: Router<Arc<Serving>>,
    /// Every routed tenant (the version serving what a candidate does not).
    pub tenants: BTreeMap<String, TenantRef>,
    /// The tenants' candidates in rollout, by tenant.
    pub candidates: BTreeMap<String, Arc<Candidate>>,
}

/// What one tenant serves: its current version and its candidate, if any.
pub(super) type Served = (TenantRef, Option<Arc<Candidate>>);

impl Live {
    /// The table serving `tenants` and the `candidates` of those tenants, with their routes
    /// (refused if two routes clash).
    pub(super) fn build(
        tenants: impl IntoIterator<Item = TenantRef>,
        mut candidates: BTreeMap<String, Arc<Candidate>>,
    ) -> Result<Live, Clash> {
        let tenants: BTreeMap<String, TenantRef> =
            tenants.into_iter().map(|t| (t.name.clone(), t)).collect();
        candidates.retain(|n, _| tenants.contains_key(n));
        let router = Router::build(tenants.values().map(|t| {
            Route::new(
                &t.name,
                t.hosts.iter().map(String::as_str),
                t.paths.iter().map(String::as_str),
                Arc::new(Serving {
                    current: t.clone(),
                    candidate: candidates.get(&t.name).cloned(),
                }),
            )
        }))?;
        Ok(Live {
            router,
            tenants,
            candidates,
        })
    }

    /// This table with tenant `name` served by `served`, or not served at all (`None`).
    pub(super) fn with(&self, name: &str, served: Option<Served>) -> Result<Live, Clash> {
        let (mut tenants, mut candidates) = (self.tenants.clone(), self.candidates.clone());
        candidates.remove(name);
        match served {
            Some((t, c)) => {
                tenants.insert(name.to_string(), t);
                if let Some(c) = c {
                    candidates.insert(name.to_string(), c);
                }
            }
            None => {
                tenants.remove(name);
            }
        }
        Self::build(tenants.into_values(), candidates)
    }

    /// What a new version of tenant `name` carries over from the one serving (its counters).
    pub(super) fn carried(&self, name: &str) -> Carried {
        self.tenants
            .get(name)
            .map(|t| Carried::from(t))
            .unwrap_or_default()
    }
}

/// What a deploy did.
#[derive(Debug, Clone)]
pub struct Deployed {
    /// The version now serving.
    pub version: Version,
    /// The version it replaced.
    pub previous: Option<Version>,
    /// What the module's author should know (e.g. a module that cannot answer requests).
    pub warnings: Vec<String>,
    /// The guest kind it serves as.
    pub kind: crate::config::GuestKind,
    /// The tenant's entity tag after the change (`StoredTenant::etag`).
    pub etag: String,
    /// The rollout it was deployed under, as a candidate (`previous` is then the current
    /// version it serves beside).
    pub rollout: Option<crate::rollout::Plan>,
    /// The candidate a rollback dropped (the current version then stays).
    pub dropped: Option<Version>,
}

/// Everything that changes only under the change lock.
pub(super) struct State {
    /// The config in effect (its tenants are the config-owned ones).
    pub(super) config: Config,
    /// The file it came from (`None`: the built-in demo config).
    pub(super) config_path: Option<PathBuf>,
    /// The API tenants this process serves, as saved in the data directory (with a shared
    /// registry: the snapshot a restart serves from while the registry cannot be reached).
    pub(super) manifest: Manifest,
    /// With a shared registry: its manifest as last read, and its version; `None` until it
    /// has been read.
    pub(super) shared: Option<Read>,
    /// With a shared registry: when tenants that failed to load from it are tried again.
    pub(super) retry_at: Option<Instant>,
}

impl State {
    /// The manifest changes start from: the shared registry's, else the data directory's.
    pub(super) fn truth(&self) -> &Manifest {
        self.shared.as_ref().map_or(&self.manifest, |r| &r.manifest)
    }
}

/// One change to the manifest, as the change functions hand it to [`Registry::commit`]: to one
/// API tenant, or to one scoped token. Each names the entry it was computed from (`base`), so a
/// change that lost the race to a fleet's registry is made again on top of the winner's only if
/// the winner left that entry as it was.
#[allow(clippy::large_enum_variant)] // one per admin change, moved once: its size costs nothing
pub(super) enum Change {
    /// One API tenant's record.
    Tenant {
        /// The tenant.
        name: String,
        /// Its entry the change was computed from (`None`: there was none).
        base: Option<StoredTenant>,
        /// Its entry after the change (`None`: deleted).
        entry: Option<StoredTenant>,
        /// What serves it after the change: `None` leaves the table as it is, `Some(None)`
        /// stops routing it.
        serve: Option<Option<Served>>,
    },
    /// One scoped token: made, rotated or revoked.
    Token {
        /// Its id.
        id: String,
        /// Its record the change was computed from (`None`: a new token).
        base: Option<StoredToken>,
        /// Its record after the change (`None`: revoked).
        entry: Option<StoredToken>,
    },
}

impl Change {
    /// Makes this change in `manifest`.
    pub(super) fn apply_to(&self, manifest: &mut Manifest) {
        match self {
            Self::Tenant { name, entry, .. } => manifest.set(name, entry.clone()),
            Self::Token { id, entry, .. } => {
                match entry {
                    Some(t) => manifest.tokens.insert(id.clone(), t.clone()),
                    None => manifest.tokens.remove(id),
                };
            }
        }
    }

    /// Whether `manifest` (another replica's newer one) still holds the entry this change was
    /// computed from.
    ///
    /// # Errors
    /// `409` it does not; `409` past [`crate::access::MAX_TOKENS`] for a new token.
    pub(super) fn still_applies(&self, manifest: &Manifest) -> Result<(), ChangeError> {
        match self {
            Self::Tenant { name, base, .. } if manifest.tenants.get(name) != base.as_ref() => {
                Err(ChangeError::Conflict(format!(
                    "tenant {name:?} was changed on another replica at the same time; nothing \
                     was written: read it again and retry"
                )))
            }
            Self::Token { id, base, .. } if manifest.tokens.get(id) != base.as_ref() => {
                Err(ChangeError::Conflict(format!(
                    "token {id} was changed on another replica at the same time; nothing was \
                     written: list the tokens again and retry"
                )))
            }
            Self::Token { base: None, .. } => crate::access::check_room(&manifest.tokens),
            _ => Ok(()),
        }
    }
}

/// The live tenants and the way to change them.
pub struct Registry {
    pub(super) live: ArcSwap<Live>,
    pub(super) state: tokio::sync::Mutex<State>,
    /// The engine, linkers, store and limits every load uses (shared with blocking threads).
    pub(super) loader: Arc<Loader>,
    /// The epoch tickers of the engines in use: the current one's, and any replaced one's
    /// until its last guest is gone.
    pub(super) tickers: Mutex<Vec<EpochTicker>>,
    /// Whether every tenant is linked on an engine with the `memset` reset (sent once the
    /// switch of [`Registry::use_memset_reset`] is published).
    pub(super) memset: tokio::sync::watch::Sender<bool>,
    /// The fleet's shared registry, if there is one.
    pub(super) fleet: Option<Arc<Fleet>>,
    /// Whether there is something consistent to serve: always on a single server; with a
    /// shared registry, once it was read or a snapshot of it was loaded.
    pub(super) ready: std::sync::atomic::AtomicBool,
    /// Whether this replica's report in the shared registry is behind what it serves.
    pub(super) report_due: std::sync::atomic::AtomicBool,
    /// How far this replica applied the shared registry's purge log.
    pub(super) purges: tokio::sync::Mutex<Applied>,
    /// When it started (Unix seconds): purges logged before then concern none of its answers.
    pub(super) started_at: u64,
    /// What seals and opens tenants' secret variables (none: a fleet's replica not given
    /// the fleet's key, which neither sets nor reads secrets).
    pub(super) secrets: Option<Arc<crate::variables::SecretsKey>>,
    /// The scoped admin tokens (as the manifest holds them), read by every admin request
    /// without the state's lock; replaced whole by each change of them.
    pub(super) tokens: ArcSwap<crate::access::Tokens>,
    /// When each scoped token was last used here (Unix seconds), by id.
    pub(super) used: Mutex<std::collections::HashMap<String, u64>>,
    /// Whether `used` changed since it was last saved.
    pub(super) used_dirty: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tenants", &self.live.load().tenants.len())
            .field("store", &self.loader.store.root())
            .finish()
    }
}

/// Runs `f` over `items` on one thread per core (module loading is CPU- and mmap-bound).
pub(super) fn parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(items.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item was processed")
        })
        .collect()
}

/// The loaded tenants by name, or one error naming every tenant that failed.
pub(super) fn collect<E: std::fmt::Display>(
    results: Vec<Result<Tenant, E>>,
    what: &str,
) -> anyhow::Result<BTreeMap<String, TenantRef>> {
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(t) => {
                out.insert(t.name.clone(), Arc::new(t));
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if !errors.is_empty() {
        anyhow::bail!("{} {what}:\n  {}", errors.len(), errors.join("\n  "));
    }
    Ok(out)
}

/// Refuses a tenant declared in the config file that was also deployed through the API (on
/// this server, or in the fleet's registry at `registry`): each tenant has one owner.
pub(super) fn one_owner(
    config: &Config,
    manifest: &Manifest,
    registry: Option<&str>,
) -> Result<(), ChangeError> {
    let through = registry.map_or_else(
        || "the admin API".to_string(),
        |url| format!("the admin API to the fleet's registry {url}"),
    );
    match config
        .tenants
        .iter()
        .find(|t| manifest.tenants.contains_key(t.name.get_ref()))
    {
        Some(t) => Err(ChangeError::Conflict(format!(
            "tenant {:?} is declared in the config file and was also deployed through \
             {through}; delete it through the API or rename it in the file",
            t.name.get_ref()
        ))),
        None => Ok(()),
    }
}

/// Checks that the cache share `name` asks for with `spec` fits in the server's cache budget
/// beside the others' (the config file's tenants and the API's). In a fleet it is checked by
/// the replica that takes the change, against its own budget.
pub(super) fn check_cache_budget(
    state: &State,
    name: &str,
    spec: &TenantSpec,
) -> Result<(), ChangeError> {
    use crate::config::ServerConfig;
    let budget = state.config.server.cache_max_mib;
    let others = ServerConfig::cache_shares(state.config.tenants.iter().map(|t| &t.settings))
        + ServerConfig::cache_shares(
            state
                .truth()
                .tenants
                .iter()
                .filter(|(n, _)| *n != name)
                .map(|(_, t)| &t.spec),
        );
    let asked = ServerConfig::cache_shares([spec]);
    let held = ServerConfig::cache_shares(state.truth().tenants.get(name).map(|t| &t.spec));
    // A change that does not grow the share is never refused (the budget may have been
    // lowered since it was reserved).
    if asked > held && others + asked > budget {
        return Err(ChangeError::Conflict(format!(
            "cache.max_mib = {asked} does not fit in this server's cache budget: other tenants \
             reserve {others} of its {budget} MiB (server.cache_max_mib); ask for at most {}",
            budget.saturating_sub(others)
        )));
    }
    Ok(())
}

/// Checks that `name` with `spec` claims no route another tenant has: a serving one, or one of
/// the API's that does not serve here (no module yet, or one this replica could not load):
/// its routes are reserved too. Asked by a scoped token (`who`), a clash does not name a
/// tenant the token does not reach, and no request such a tenant serves may go to `name`
/// after the change ([`check_takes_none`]).
pub(super) fn check_routes(
    live: &Live,
    manifest: &Manifest,
    name: &str,
    spec: &TenantSpec,
    who: Principal<'_>,
) -> Result<(), ChangeError> {
    let reaches = |other: &str| match who {
        Principal::Operator => true,
        Principal::Token(_, token) => token.reaches(other),
    };
    let serving = live
        .tenants
        .values()
        .filter(|t| t.name != name)
        .map(|t| route(&t.name, &t.hosts, &t.paths));
    let pending = manifest
        .tenants
        .iter()
        .filter(|(n, _)| *n != name && !live.tenants.contains_key(n.as_str()))
        .map(|(n, t)| route(n, &t.spec.hosts, &t.spec.paths));
    let others: Vec<Route<'_, &str>> = serving.chain(pending).collect();
    let this = route(name, &spec.hosts, &spec.paths);
    let after = match Router::build(others.iter().cloned().chain([this.clone()])) {
        Ok(after) => after,
        // A token never learns which tenants it does not reach, nor from a clash.
        Err(c) if !reaches(&c.existing) => {
            return Err(ChangeError::Conflict(format!(
                "tenant {name:?}: route host={:?} path={:?} is another tenant's; choose other \
                 hosts or paths",
                c.host, c.prefix
            )));
        }
        Err(c) => return Err(c.into()),
    };
    if let Principal::Operator = who {
        return Ok(());
    }
    let now = (manifest.tenants.get(name)).map(|t| route(name, &t.spec.hosts, &t.spec.paths));
    let before = Router::build(others.iter().cloned().chain(now)).map_err(internal)?;
    let unreached: Vec<&Route<'_, &str>> = others.iter().filter(|o| !reaches(o.name)).collect();
    check_takes_none(&this, &unreached, &before, &after)
}

/// `name`'s route to the target `name`.
fn route<'a>(name: &'a str, hosts: &'a [String], paths: &'a [String]) -> Route<'a, &'a str> {
    Route::new(
        name,
        hosts.iter().map(String::as_str),
        paths.iter().map(String::as_str),
        name,
    )
}

/// Refuses a change of `this` (routed by `after`, instead of `before`) that takes a request
/// from one of the `unreached` tenants (a scoped token's change; the token does not reach
/// them): one that goes to it before and to `this` after. But for a host `this` names over a
/// route of theirs for any host: hosts no tenant names fall to routes for any host, and a team
/// claims its own host by naming it. Each pair of routes (one of `this`, one of theirs) is
/// tried with the least specific request to both ([`HostPattern::meet`], [`deeper`]): a
/// request taken from them is routed as that one is, so these find every one.
fn check_takes_none(
    this: &Route<'_, &str>,
    unreached: &[&Route<'_, &str>],
    before: &Router<&str>,
    after: &Router<&str>,
) -> Result<(), ChangeError> {
    let theirs: Vec<(&str, HostPattern, String)> = (unreached.iter())
        .flat_map(|r| r.pairs().into_iter().map(move |(_, h, p)| (r.name, h, p)))
        .collect();
    for (shown, host, prefix) in this.pairs() {
        for (other, their_host, their_prefix) in &theirs {
            let (Some(asked), Some(path)) = (host.meet(their_host), deeper(&prefix, their_prefix))
            else {
                continue;
            };
            let (Some((was, _, was_by_host)), Some((is, _, is_by_host))) = (
                before.find_by(asked.as_deref(), path),
                after.find_by(asked.as_deref(), path),
            ) else {
                continue;
            };
            if *was == *other && *is == this.name && (was_by_host || !is_by_host) {
                return Err(ChangeError::Conflict(format!(
                    "tenant {:?}: route host={shown:?} path={prefix:?} would take requests \
                     another tenant serves (a token changes only what its own tenants serve); \
                     choose other hosts or paths",
                    this.name
                )));
            }
        }
    }
    Ok(())
}

/// The shared registry's manifest as last read.
#[derive(Debug, Clone)]
pub(super) struct Read {
    pub(super) manifest: Manifest,
    /// Its version (`None`: the registry has no manifest yet).
    pub(super) version: Option<UpdateVersion>,
}

/// How far this replica has applied the log.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// The log's version as last read.
    pub(super) version: Option<UpdateVersion>,
    /// The number of the last purge applied (`None`: the log was not read yet).
    pub(super) through: Option<u64>,
}
