//! Purges against fills in flight: a purge sent while a guest (or a backend) is still making
//! an answer for a key it names must not see that answer stored afterwards, for its whole
//! freshness, as if the purge had never been asked for.
//!
//! Every purge takes a generation and is kept in a short log; a fill notes the generation
//! when its request is looked up, and when its answer is to be stored, a purge since then
//! that names it (or a gap in the log: more purges than it keeps) leaves it unstored. A purge
//! is logged, and an answer checked and stored, under the log's lock (moments: the purge then
//! goes through the entries without it), so an answer stored before a purge is logged is
//! there for the purge to find, and one stored after it sees the purge.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::space::Space;

/// Purges remembered for the fills in flight; a fill older than all of them is not stored.
const KEPT: usize = 64;

/// What one purge names.
#[derive(Debug, Clone)]
pub(super) struct Named {
    pub(super) all: bool,
    /// Path prefixes, in the normal form keys are in.
    pub(super) prefixes: Vec<String>,
    pub(super) tags: Vec<String>,
    /// It makes what it names stale rather than dropping it.
    pub(super) soft: bool,
}

impl Named {
    /// Whether it names an entry of `space` (its tag) for `target` whose answers carry `tags`.
    /// The guests' own entries are not paths: no prefix names them.
    pub(super) fn names<'a>(
        &self,
        space: u8,
        target: &str,
        mut tags: impl Iterator<Item = &'a str>,
    ) -> bool {
        self.all
            || (space != Space::GUEST && self.prefixes.iter().any(|p| target.starts_with(p)))
            || tags.any(|t| self.tags.iter().any(|n| n == t))
    }
}

/// What purges since a generation did to what a fill or a copy names: each as the
/// generation of the latest purge of its kind that named it (for a soft one, what was stored
/// before it, a variant's `begun` below it, is told from what was asked for after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Since {
    /// A hard purge dropped it (or may have: the log no longer reaches back that far, and
    /// this is then the latest generation).
    pub(super) dropped: Option<u64>,
    /// A soft purge made it stale.
    pub(super) staled: Option<u64>,
}

impl Since {
    /// No purge since named it.
    pub(super) fn is_nothing(self) -> bool {
        self == Self::default()
    }
}

/// The purges of one cache, in order.
#[derive(Debug, Default)]
pub(super) struct Purges {
    /// The generation of the latest purge (read without the lock when a fill begins).
    latest: AtomicU64,
    log: Mutex<VecDeque<(u64, Named)>>,
}

impl Purges {
    /// The generation a fill beginning now notes.
    pub(super) fn generation(&self) -> u64 {
        self.latest.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<(u64, Named)>> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs the purge `named` as the next generation, then runs it (`run` drops or marks
    /// what it names, given that generation).
    pub(super) fn purge<T>(&self, named: Named, run: impl FnOnce(&Named, u64) -> T) -> T {
        let generation = {
            let mut log = self.lock();
            let generation = self.latest.load(Ordering::Acquire) + 1;
            if log.len() == KEPT {
                log.pop_front();
            }
            log.push_back((generation, named.clone()));
            self.latest.store(generation, Ordering::Release);
            generation
        };
        run(&named, generation)
    }

    /// What the purges since generation `since` that name what `named` says it names did to
    /// it (dropped, if the log no longer reaches back that far).
    pub(super) fn since(&self, since: u64, named: impl Fn(&Named) -> bool) -> Since {
        Self::in_log(
            &self.lock(),
            self.latest.load(Ordering::Acquire),
            since,
            named,
        )
    }

    fn in_log(
        log: &VecDeque<(u64, Named)>,
        latest: u64,
        since: u64,
        named: impl Fn(&Named) -> bool,
    ) -> Since {
        let mut did = Since::default();
        if latest == since {
            return did;
        }
        // Generations since+1 ..= latest must all be in the log to be weighed.
        let complete = log.front().is_some_and(|(g, _)| *g <= since + 1);
        if !complete {
            did.dropped = Some(latest);
            return did;
        }
        for (g, n) in log.iter().filter(|(g, _)| *g > since) {
            if named(n) {
                *(if n.soft {
                    &mut did.staled
                } else {
                    &mut did.dropped
                }) = Some(*g);
            }
        }
        did
    }

    /// Runs `put` (storing an answer whose fill began at generation `since`) unless a purge
    /// since then names it (`named`); whether it ran.
    pub(super) fn store(
        &self,
        since: u64,
        named: impl Fn(&Named) -> bool,
        put: impl FnOnce(),
    ) -> bool {
        let log = self.lock();
        // (A soft purge leaves it unstored too: made before the purge, it is not fresh.)
        let latest = self.latest.load(Ordering::Acquire);
        if !Self::in_log(&log, latest, since, named).is_nothing() {
            return false;
        }
        put();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(prefixes: &[&str], tags: &[&str]) -> Named {
        Named {
            all: false,
            prefixes: prefixes.iter().map(|s| (*s).to_string()).collect(),
            tags: tags.iter().map(|s| (*s).to_string()).collect(),
            soft: false,
        }
    }

    #[test]
    fn purges_since_a_generation_say_what_they_did_to_what_they_name() {
        let p = Purges::default();
        let soft = |prefix: &str| Named {
            soft: true,
            ..named(&[prefix], &[])
        };
        let since = |g: u64| p.since(g, |n| n.names(0, "/a/b", std::iter::empty()));
        let did = |dropped, staled| Since { dropped, staled };
        assert!(since(0).is_nothing());
        p.purge(named(&["/x"], &[]), |_, _| ()); // 1: names another path
        assert!(since(0).is_nothing());
        p.purge(soft("/a"), |_, _| ()); // 2
        assert_eq!(since(0), did(None, Some(2)));
        assert!(since(2).is_nothing());
        p.purge(soft("/a/"), |_, _| ()); // 3: the latest soft one is told
        assert_eq!(since(1), did(None, Some(3)));
        p.purge(named(&["/a"], &[]), |_, _| ()); // 4: a hard one
        assert_eq!(since(0), did(Some(4), Some(3)));
        assert_eq!(since(3), did(Some(4), None));
        p.purge(soft("/a"), |_, _| ()); // 5: a soft one after it
        assert_eq!(since(3), did(Some(4), Some(5)));
        assert_eq!(since(4), did(None, Some(5)));
        p.purge(named(&["/a/b"], &[]), |_, _| ()); // 6: the latest hard one is told
        assert_eq!(since(0), did(Some(6), Some(5)));
        // More purges than are kept: all the fill can be told is that it may have been dropped
        // by any of them.
        for _ in 0..KEPT {
            p.purge(named(&["/other/"], &[]), |_, _| ());
        }
        let latest = p.generation();
        assert_eq!(since(6), did(None, None), "every purge since is kept");
        assert_eq!(
            since(5),
            did(Some(latest), None),
            "one purge since is forgotten"
        );
    }

    #[test]
    fn a_fill_is_stored_unless_a_purge_since_it_began_names_it() {
        let p = Purges::default();
        let stores = |since: u64, target: &str, tags: &[&str]| {
            p.store(since, |n| n.names(0, target, tags.iter().copied()), || {})
        };
        let before = p.generation();
        assert!(stores(before, "/a", &[]), "no purge since");
        p.purge(named(&["/news/"], &[]), |_, _| ());
        assert!(!stores(before, "/news/1", &[]), "its prefix was purged");
        assert!(stores(before, "/sport/1", &[]), "another prefix");
        assert!(
            stores(p.generation(), "/news/1", &[]),
            "began after the purge"
        );
        p.purge(named(&[], &["t1"]), |_, _| ());
        assert!(!stores(before, "/x", &["t0", "t1"]), "a tag was purged");
        assert!(stores(before, "/x", &["t2"]));
        // Guests' entries are not paths: a prefix never names them.
        assert!(p.store(
            before,
            |n| n.names(Space::GUEST, "/news/1", [].into_iter()),
            || {}
        ));
        // More purges than are kept: an older fill cannot tell, and is not stored.
        let old = p.generation();
        for _ in 0..KEPT {
            p.purge(named(&["/other/"], &[]), |_, _| ());
        }
        assert!(stores(old, "/a", &[]), "every purge since is kept");
        p.purge(named(&["/other/"], &[]), |_, _| ());
        assert!(!stores(old, "/a", &[]), "one purge since is forgotten");
    }
}
