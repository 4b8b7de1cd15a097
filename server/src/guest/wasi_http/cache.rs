//! `tern:cache` for components: a guest's own entries in its tenant's cache
//! ([`crate::cache::guest`]), as the `tern` ABI's `cache_*` calls keep them. An entry is a
//! resource of the request's table; dropping it (or the instance) gives up a turn to insert.

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use crate::cache::guest::{CacheError, Entry, Write, request_headers};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit/cache",
        world: "tern:cache/host",
        imports: { default: async | trappable },
        with: {
            "tern:cache/cache.entry": crate::cache::guest::Entry,
        },
        require_store_data_send: true,
    });
}

use bindings::tern::cache::cache::{self as api, LookupOptions, LookupState, WriteOptions};

/// What a lookup gives a guest: an entry of its table, or why not.
type Looked = wasmtime::Result<Result<Resource<Entry>, api::Error>>;

/// Adds `tern:cache` to `linker`.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> CacheHost<'_>,
) -> wasmtime::Result<()> {
    bindings::Host_::add_to_linker::<T, HasCache>(linker, view)
}

/// What this interface reaches of a request's store: its cache session and the resource
/// table its entries live in.
pub struct CacheHost<'a> {
    /// The request's cache session ([`crate::capabilities::Capabilities::cache`]).
    pub session: &'a mut crate::cache::guest::Session,
    /// The store's resource table.
    pub table: &'a mut ResourceTable,
}

/// The [`HasData`] of [`CacheHost`].
struct HasCache;

impl HasData for HasCache {
    type Data<'a> = CacheHost<'a>;
}

impl From<CacheError> for api::Error {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::Invalid(why) => Self::InvalidArgument(why),
            CacheError::Limit(why) => Self::LimitExceeded(why),
            CacheError::Unavailable(why) => Self::Unsupported(why),
        }
    }
}

impl From<WriteOptions> for Write {
    fn from(o: WriteOptions) -> Self {
        Self {
            max_age: o.max_age_seconds,
            stale_while_revalidate: o.stale_while_revalidate_seconds,
            tags: o.surrogate_keys,
            vary: o.vary_rule,
        }
    }
}

impl CacheHost<'_> {
    /// Looks `key` up for `options`' headers, as a new entry of the table.
    async fn cache_lookup(
        &mut self,
        key: &[u8],
        options: &LookupOptions,
        transaction: bool,
    ) -> Result<Entry, api::Error> {
        let pairs = options
            .request_headers
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_slice()));
        let headers = request_headers(pairs)?;
        Ok(self.session.lookup(key, headers, transaction).await?)
    }

    /// [`Self::cache_lookup`], its entry pushed to the table.
    async fn cache_entry(
        &mut self,
        key: &[u8],
        options: &LookupOptions,
        transaction: bool,
    ) -> Looked {
        match self.cache_lookup(key, options, transaction).await {
            Ok(entry) => Ok(Ok(self.table.push(entry)?)),
            Err(e) => Ok(Err(e)),
        }
    }

    fn entry(&mut self, entry: &Resource<Entry>) -> wasmtime::Result<&mut Entry> {
        Ok(self.table.get_mut(entry)?)
    }
}

impl api::Host for CacheHost<'_> {
    async fn insert(
        &mut self,
        key: Vec<u8>,
        body: Vec<u8>,
        lookup: LookupOptions,
        options: WriteOptions,
    ) -> wasmtime::Result<Result<(), api::Error>> {
        Ok(match self.cache_lookup(&key, &lookup, false).await {
            Ok(mut entry) => entry
                .insert(body.into(), &options.into())
                .map_err(Into::into),
            Err(e) => Err(e),
        })
    }

    async fn purge_surrogate_key(
        &mut self,
        key: String,
        soft: bool,
    ) -> wasmtime::Result<Result<u64, api::Error>> {
        Ok(self.session.purge_tag(&key, soft).map_err(Into::into))
    }
}

impl api::HostEntry for CacheHost<'_> {
    async fn lookup(&mut self, key: Vec<u8>, options: LookupOptions) -> Looked {
        self.cache_entry(&key, &options, false).await
    }

    async fn transaction_lookup(&mut self, key: Vec<u8>, options: LookupOptions) -> Looked {
        self.cache_entry(&key, &options, true).await
    }

    async fn get_state(&mut self, entry: Resource<Entry>) -> wasmtime::Result<LookupState> {
        let s = self.entry(&entry)?.state();
        let flag = |on: bool, flag: LookupState| if on { flag } else { LookupState::empty() };
        Ok(flag(s.found, LookupState::FOUND)
            | flag(s.stale, LookupState::STALE)
            | flag(s.must_insert, LookupState::MUST_INSERT_OR_UPDATE))
    }

    async fn get_body(&mut self, entry: Resource<Entry>) -> wasmtime::Result<Option<Vec<u8>>> {
        Ok(self.entry(&entry)?.body().map(|b| b.to_vec()))
    }

    async fn get_age_seconds(&mut self, entry: Resource<Entry>) -> wasmtime::Result<Option<u64>> {
        Ok(self.entry(&entry)?.age().map(|a| a.as_secs()))
    }

    async fn transaction_insert(
        &mut self,
        entry: Resource<Entry>,
        body: Vec<u8>,
        options: WriteOptions,
    ) -> wasmtime::Result<Result<(), api::Error>> {
        let entry = self.entry(&entry)?;
        Ok(entry
            .insert(body.into(), &options.into())
            .map_err(Into::into))
    }

    async fn transaction_cancel(&mut self, entry: Resource<Entry>) -> wasmtime::Result<()> {
        self.entry(&entry)?.give_up();
        Ok(())
    }

    async fn drop(&mut self, entry: Resource<Entry>) -> wasmtime::Result<()> {
        self.table.delete(entry)?;
        Ok(())
    }
}
