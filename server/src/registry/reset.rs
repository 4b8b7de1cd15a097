//! Moving every tenant to an engine with the swap-safe `memset` reset, when a swap area is
//! switched on under a server that resets freed memory with the dirty-page scan (which misses
//! swapped-out pages: see [`crate::teardown`]).
//!
//! The move is a change like a deploy: under the change lock, each serving tenant is linked
//! again, with the same code (re-homed, not compiled) and the same spec, counters and
//! concurrency permits, on a new engine whose pool resets with `memset`; then the engine and the
//! whole table are swapped in at once. Requests that started on the old engine finish there
//! (its epoch ticker runs until its last guest is gone); a deploy that compiled on the old
//! engine is loaded on the new one when it commits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::loader::Runtime;
use super::state::{Live, Registry, State, collect, parallel};
use crate::artifact::Compiled;
use crate::change::ChangeError;
use crate::config::TenantConfig;
use crate::engine::EpochTicker;
use crate::tenant::{Origin, TenantRef};

impl Registry {
    /// Moves every tenant to a new engine that resets freed memory with `memset`, unless they
    /// are on one already. Returns whether it moved them.
    ///
    /// # Errors
    /// If the new engine cannot be built (the host cannot reserve a second pool) or a tenant
    /// cannot be linked on it; the tenants then keep serving on the old one.
    pub async fn use_memset_reset(&self) -> anyhow::Result<bool> {
        let mut state = self.state.lock().await;
        let old = self.loader.runtime();
        if !old.pool.pagemap_scan {
            return Ok(false);
        }
        let started = Instant::now();
        let mut pool = old.pool.clone();
        pool.pagemap_scan = false;
        let live = self.live.load_full();
        let items = live
            .tenants
            .values()
            .map(|t| Ok((t.clone(), config_of(&state, t)?)))
            .collect::<anyhow::Result<Vec<(TenantRef, TenantConfig)>>>()?;
        let loader = self.loader();
        let (rt, results) = tokio::task::spawn_blocking(move || {
            let engine = crate::engine::build(&pool)?;
            let rt = Runtime::new(engine, pool)?;
            // Tenants that share a module share its new copy too (one image, one mapping).
            let mut unique: Vec<&Compiled> = Vec::new();
            for (t, _) in &items {
                if !unique
                    .iter()
                    .any(|c| c.image_start() == t.compiled.image_start())
                {
                    unique.push(&t.compiled);
                }
            }
            let homed = parallel(&unique, |c| c.rehome(&rt.engine));
            let homes: HashMap<usize, _> =
                unique.iter().map(|c| c.image_start()).zip(homed).collect();
            let results = parallel(&items, |(t, config)| {
                match &homes[&t.compiled.image_start()] {
                    Ok(compiled) => loader.respec(&rt, t, compiled, config),
                    Err(e) => Err(ChangeError::Internal(format!("{}: {e}", t.name))),
                }
            });
            anyhow::Ok((rt, results))
        })
        .await??;
        let tenants = collect(results, "tenant(s) could not be linked on the new engine")?;
        let moved = tenants.len();
        self.tickers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(EpochTicker::start(&rt.engine));
        self.loader.runtime.store(Arc::new(rt));
        // The candidates follow, loaded on the new engine beside their moved current versions.
        let wanted = Self::wanted(&state.manifest, &tenants);
        let (candidates, unloaded) = self.load_candidates(wanted, &live).await;
        if !unloaded.is_empty() && self.fleet.is_some() {
            // Tried again as after any sync that could not load them (logged).
            state.retry_at = Some(Instant::now() + super::shared::RETRY_FAILED);
        }
        let table = Live::build(tenants.into_values(), candidates)?;
        self.live.store(Arc::new(table));
        self.memset.send_replace(true);
        drop(state);
        tracing::warn!(
            tenants = moved,
            "a swap area became active after start-up: every tenant now runs on an engine that \
             resets freed guest memory with memset (swap-safe, slower for large heaps) — moved in \
             {:.1} ms; restart Tern without swap for the dirty-page reset",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(true)
    }

    /// Waits up to `within` for [`Self::use_memset_reset`] to have moved every tenant; returns
    /// whether it has.
    pub async fn memset_reset_ready(&self, within: Duration) -> bool {
        let mut ready = self.memset.subscribe();
        matches!(
            tokio::time::timeout(within, ready.wait_for(|&moved| moved)).await,
            Ok(Ok(_))
        )
    }
}

/// The spec `tenant` serves with: its `[[tenant]]` table, or its stored spec.
fn config_of(state: &State, tenant: &TenantRef) -> anyhow::Result<TenantConfig> {
    let config = match &tenant.origin {
        Origin::Config => state
            .config
            .tenants
            .iter()
            .find(|c| *c.name.get_ref() == tenant.name)
            .cloned(),
        Origin::Api { version } => state
            .manifest
            .tenants
            .get(&tenant.name)
            .map(|t| t.to_config(&tenant.name, &format!("sha256:{}", version.module))),
    };
    config.ok_or_else(|| anyhow::anyhow!("tenant {:?} serves without a spec", tenant.name))
}
