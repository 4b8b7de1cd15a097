//! Readthrough: the answers of a tenant's backends with `cache = true` are kept in the
//! tenant's cache by their own headers, with the same rules, storage, collapsing, budget and
//! purges as the answers of its guests ([`crate::cache`]); a guest's request finds them there
//! before anything is sent. Each backend's answers are a space of their own in the cache, keyed
//! by the backend's name and the path and query sent to it.
//!
//! A guest's request may say what the cache does with it in `Tern-Cache` (taken off before the
//! backend sees it; ignored for a backend without `cache = true`): `pass` (neither looked up
//! nor stored), `ttl=SECONDS` (stored for that long whatever the answer's own `Cache-Control`
//! and `Expires` say, though never one marked `private` or `no-store`), `tag=NAME` (a tag to
//! purge it by, besides the answer's own `Surrogate-Key` and `Cache-Tag`), several
//! comma-separated.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;

use super::body::OutBody;
use super::cached::{CACHE_OVERRIDE, CacheOverride};
use super::calls::{Grant, NoHead, Passing};
use super::policy::Destination;
use crate::body::Fetched;
use crate::cache::{Asking, Fill, Lookup, Space};

impl Grant {
    /// Sends the guest's `req` to `target` ([`Grant::fetch`]), or answers it from the tenant's
    /// cache when the target is a backend with `cache = true` (see the module docs): a fresh
    /// stored answer at once; a stale one within its `stale-while-revalidate`, asking the
    /// backend again in the background; else the backend's answer, stored when it may be
    /// (a miss of a key another request is asking for waits for that answer). The guest reads
    /// what the cache did in `Cache-Status`.
    ///
    /// # Errors
    /// [`NoHead`]; a bad `Tern-Cache` is refused before anything is sent.
    pub async fn exchange(
        self: &Arc<Self>,
        target: &Destination,
        mut req: Request<OutBody>,
        first_byte: Duration,
        passing: &Passing,
    ) -> Result<Response<Fetched>, NoHead> {
        let cached = match &self.readthrough {
            Some(r) if target.cached => r.counts.get(&target.label).map(|c| (&r.cache, c)),
            _ => None,
        };
        let Some((cache, counts)) = cached else {
            // Taken off and not read: it is for a backend's cache.
            req.headers_mut().remove(&CACHE_OVERRIDE);
            return self.fetch(target, req, first_byte, passing).await;
        };
        let asked = match CacheOverride::take(req.headers_mut()) {
            Ok(asked) => asked,
            Err(why) => {
                self.count(&target.label, "denied");
                return Err(NoHead::BadOverride(why));
            }
        };
        if asked.pass {
            counts.bypassed();
            return self.fetch(target, req, first_byte, passing).await;
        }
        // Keyed by what is sent to the backend. (Its head is looked up alone: its body stays
        // out of the wait for another request's answer.)
        *req.uri_mut() = target.uri.clone();
        let (head, body) = req.into_parts();
        let mut req = Request::from_parts(head, ());
        let asking = Asking {
            https: target.uri.scheme() == Some(&http::uri::Scheme::HTTPS),
            host: &target.label,
            trusted: true,
            space: Space::Backend(counts.clone()),
            compress: None,
            body: body.may_have_bytes(),
            at: std::time::Instant::now(),
            present: crate::context::Present::ALL,
        };
        let stored =
            |resp: Response<crate::body::ResponseBody>| resp.map(|body| Fetched::cache(body, None));
        match cache.lookup(&req, asking).await {
            Lookup::Hit(resp) => Ok(stored(resp)),
            Lookup::Refresh(resp, mut fill) => {
                let refresh = fill.refresh(&req).map(|()| OutBody::full(Bytes::new()));
                let (calls, target, passing) = (self.clone(), target.clone(), passing.clone());
                tokio::spawn(async move {
                    calls
                        .refresh(fill, &target, refresh, first_byte, &passing)
                        .await;
                });
                Ok(stored(resp))
            }
            Lookup::Miss(mut fill) => {
                fill.overridden(asked.ttl, &asked.tags);
                fill.take_validators(&mut req);
                let req = Request::from_parts(req.into_parts().0, body);
                match self.fetch(target, req, first_byte, passing).await {
                    Ok(resp) => Ok(answered(fill, resp)),
                    // The backend could not be reached: a stale answer within its
                    // `stale-if-error`, if there is one.
                    Err(no_head) => fill.stale_instead().map(stored).ok_or(no_head),
                }
            }
        }
    }

    /// Asks the backend for a new answer to a stale one served (`stale-while-revalidate`),
    /// for the cache only, within the backend's total timeout.
    async fn refresh(
        &self,
        fill: Fill,
        target: &Destination,
        req: Request<OutBody>,
        first_byte: Duration,
        passing: &Passing,
    ) {
        let total = target.timeouts.total;
        let _ = tokio::time::timeout(total, async {
            if let Ok(resp) = self.fetch(target, req, first_byte, passing).await {
                // A streamed answer is stored when its body has been read to its end.
                let mut body = answered(fill, resp).into_body();
                while let Some(Ok(_)) = body.frame().await {}
            }
        })
        .await;
    }
}

/// The backend's answer `resp` as the cache gives it on (`Fill::answered`).
fn answered(fill: Fill, resp: Response<Fetched>) -> Response<Fetched> {
    let (parts, body) = resp.into_parts();
    let (body, permit) = body.into_response_body();
    fill.answered(Response::from_parts(parts, body))
        .map(|body| Fetched::cache(body, permit))
}
