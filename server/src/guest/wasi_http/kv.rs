//! Key-value stores for components: Spin's `fermyon:spin/key-value` (spin-sdk 3.x and 5.x,
//! `spin_sdk::key_value::Store`) and `wasi:keyvalue` 0.2.0-draft2 (store, atomics, batch), both
//! over the tenant's granted stores ([`crate::kv`]), as the `tern` ABI's `kv_*` are.
//!
//! A store is opened by its name (Spin's label): one the tenant is not granted answers
//! `access-denied`. Every operation counts against `limits.max_kv_ops` (opening a store too:
//! each open is a handle the request holds) and its wait is the request's `kv` phase. Failures
//! the guest can act on are `other(text)` with the same words the `tern` ABI's `kv_last_error`
//! gives. Keys are strings here; a key written through the `tern` ABI that is not UTF-8 is
//! listed with its invalid bytes replaced.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use crate::kv::{KvError, Op, Reply, Store};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit/keyvalue",
        world: "tern:host/keyvalue",
        imports: { default: async | trappable },
        with: {
            "fermyon:spin/key-value.store": crate::guest::wasi_http::kv::Bucket,
            "wasi:keyvalue/store.bucket": crate::guest::wasi_http::kv::Bucket,
            "wasi:keyvalue/atomics.cas": crate::guest::wasi_http::kv::Cas,
        },
        require_store_data_send: true,
    });
}

use bindings::fermyon::spin::key_value as spin;
use bindings::wasi::keyvalue::{atomics, batch, store as wasi};

/// Keys answered per `list-keys` page.
const LIST_PAGE: usize = 256;

/// Keys fetched per backend call while `get-keys` gathers them all.
const GET_KEYS_BATCH: usize = 1024;

/// An open store.
pub struct Bucket(Arc<Store>);

/// A key's value as a guest read it, to swap only if it is still that value.
pub struct Cas {
    store: Arc<Store>,
    key: String,
    current: Option<Vec<u8>>,
}

/// What these interfaces reach of a request's store: its key-value session, the resource
/// table its open stores live in, and the guest's memory limit.
pub struct KvHost<'a> {
    /// The request's key-value session ([`crate::capabilities::Capabilities::kv`]).
    pub session: &'a mut crate::kv::Session,
    /// The store's resource table.
    pub table: &'a mut ResourceTable,
    /// The guest's memory limit, in bytes (a key list must fit it).
    pub max_memory: usize,
}

/// The [`HasData`] of [`KvHost`].
struct HasKv;

impl HasData for HasKv {
    type Data<'a> = KvHost<'a>;
}

/// Adds both interfaces to `linker`, reaching each request's store through `view`.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> KvHost<'_>,
) -> wasmtime::Result<()> {
    bindings::Keyvalue::add_to_linker::<T, HasKv>(linker, view)
}

impl KvHost<'_> {
    /// Opens the granted store `name` as a new handle (counted as an operation).
    fn kv_open(&mut self, name: &str) -> wasmtime::Result<Result<Resource<Bucket>, Opened>> {
        if let Err(e) = self.session.count() {
            return Ok(Err(Opened::Failed(e.to_string())));
        }
        match self.session.open(name) {
            Ok(store) => Ok(Ok(self.table.push(Bucket(store))?)),
            Err(_) => Ok(Err(Opened::Denied)),
        }
    }

    fn bucket(&self, b: &Resource<Bucket>) -> wasmtime::Result<Arc<Store>> {
        Ok(self.table.get(b)?.0.clone())
    }

    async fn kv_get(&mut self, store: &Store, key: String) -> Result<Option<Vec<u8>>, String> {
        match self.session.run(store, Op::Get(key.into_bytes())).await {
            Ok(Reply::Value(v)) => Ok(v),
            other => Err(failed(other)),
        }
    }

    async fn kv_done(&mut self, store: &Store, op: Op) -> Result<(), String> {
        match self.session.run(store, op).await {
            Ok(Reply::Done) => Ok(()),
            other => Err(failed(other)),
        }
    }

    async fn kv_exists(&mut self, store: &Store, key: String) -> Result<bool, String> {
        match self.session.run(store, Op::Exists(key.into_bytes())).await {
            Ok(Reply::Bool(b)) => Ok(b),
            other => Err(failed(other)),
        }
    }

    /// Up to `limit` keys after `after`.
    async fn kv_list(
        &mut self,
        store: &Store,
        after: Option<Vec<u8>>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, String> {
        match self.session.run(store, Op::List { after, limit }).await {
            Ok(Reply::Keys(keys)) => Ok(keys),
            other => Err(failed(other)),
        }
    }

    /// Every key (Spin's `get-keys`), gathered in batches; no more than the guest's memory
    /// could take.
    async fn kv_all_keys(&mut self, store: &Store) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        let mut bytes = 0usize;
        let mut after = None;
        loop {
            let batch = self.kv_list(store, after.take(), GET_KEYS_BATCH).await?;
            if batch.len() == GET_KEYS_BATCH {
                after = batch.last().cloned();
            }
            for key in batch {
                // A list of strings takes 8 bytes per string beside its bytes.
                bytes += key.len() + 8;
                if bytes > self.max_memory {
                    return Err(format!(
                        "the store's keys take more than the guest's memory ({} bytes); list \
                         them a page at a time (wasi:keyvalue list-keys)",
                        self.max_memory
                    ));
                }
                keys.push(string(key));
            }
            if after.is_none() {
                return Ok(keys);
            }
        }
    }
}

/// Why a store could not be opened.
enum Opened {
    Denied,
    Failed(String),
}

/// The words for a failed operation, what the guest reads in `other(text)` (or, a bug, an
/// answer of the wrong kind).
fn failed(answer: Result<Reply, KvError>) -> String {
    match answer {
        Err(e) => e.to_string(),
        Ok(a) => format!("the store answered {a:?}"),
    }
}

fn string(key: Vec<u8>) -> String {
    String::from_utf8(key).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The operations (and the drop) Spin's store and `wasi:keyvalue`'s bucket share, word for word but for
/// their error type: written once, expanded into both.
macro_rules! bucket_operations {
    ($api:ident) => {
        async fn get(
            &mut self,
            b: Resource<Bucket>,
            key: String,
        ) -> wasmtime::Result<Result<Option<Vec<u8>>, $api::Error>> {
            let store = self.bucket(&b)?;
            Ok(self.kv_get(&store, key).await.map_err($api::Error::Other))
        }

        async fn set(
            &mut self,
            b: Resource<Bucket>,
            key: String,
            value: Vec<u8>,
        ) -> wasmtime::Result<Result<(), $api::Error>> {
            let store = self.bucket(&b)?;
            let op = Op::Set(key.into_bytes(), value);
            Ok(self.kv_done(&store, op).await.map_err($api::Error::Other))
        }

        async fn delete(
            &mut self,
            b: Resource<Bucket>,
            key: String,
        ) -> wasmtime::Result<Result<(), $api::Error>> {
            let store = self.bucket(&b)?;
            let op = Op::Delete(key.into_bytes());
            Ok(self.kv_done(&store, op).await.map_err($api::Error::Other))
        }

        async fn exists(
            &mut self,
            b: Resource<Bucket>,
            key: String,
        ) -> wasmtime::Result<Result<bool, $api::Error>> {
            let store = self.bucket(&b)?;
            Ok(self
                .kv_exists(&store, key)
                .await
                .map_err($api::Error::Other))
        }

        async fn drop(&mut self, b: Resource<Bucket>) -> wasmtime::Result<()> {
            self.table.delete(b)?;
            Ok(())
        }
    };
}

// Spin's key-value (spin-sdk 3.x and 5.x).

impl spin::Host for KvHost<'_> {}

impl spin::HostStore for KvHost<'_> {
    async fn open(
        &mut self,
        label: String,
    ) -> wasmtime::Result<Result<Resource<Bucket>, spin::Error>> {
        Ok(self.kv_open(&label)?.map_err(|e| match e {
            Opened::Denied => spin::Error::AccessDenied,
            Opened::Failed(why) => spin::Error::Other(why),
        }))
    }

    bucket_operations!(spin);

    async fn get_keys(
        &mut self,
        b: Resource<Bucket>,
    ) -> wasmtime::Result<Result<Vec<String>, spin::Error>> {
        let store = self.bucket(&b)?;
        Ok(self.kv_all_keys(&store).await.map_err(spin::Error::Other))
    }
}

// wasi:keyvalue 0.2.0-draft2.

impl wasi::Host for KvHost<'_> {
    async fn open(
        &mut self,
        identifier: String,
    ) -> wasmtime::Result<Result<Resource<Bucket>, wasi::Error>> {
        Ok(self.kv_open(&identifier)?.map_err(|e| match e {
            Opened::Denied => wasi::Error::AccessDenied,
            Opened::Failed(why) => wasi::Error::Other(why),
        }))
    }
}

impl wasi::HostBucket for KvHost<'_> {
    bucket_operations!(wasi);

    async fn list_keys(
        &mut self,
        b: Resource<Bucket>,
        cursor: Option<String>,
    ) -> wasmtime::Result<Result<wasi::KeyResponse, wasi::Error>> {
        let store = self.bucket(&b)?;
        let after = cursor.filter(|c| !c.is_empty()).map(String::into_bytes);
        // One more than a page tells whether there is a next one.
        let mut keys = match self.kv_list(&store, after, LIST_PAGE + 1).await {
            Ok(keys) => keys,
            Err(why) => return Ok(Err(wasi::Error::Other(why))),
        };
        let cursor = (keys.len() > LIST_PAGE).then(|| {
            keys.truncate(LIST_PAGE);
            string(keys[LIST_PAGE - 1].clone())
        });
        Ok(Ok(wasi::KeyResponse {
            keys: keys.into_iter().map(string).collect(),
            cursor,
        }))
    }
}

impl atomics::Host for KvHost<'_> {
    async fn increment(
        &mut self,
        b: Resource<Bucket>,
        key: String,
        delta: i64,
    ) -> wasmtime::Result<Result<i64, wasi::Error>> {
        let store = self.bucket(&b)?;
        Ok(
            match self
                .session
                .run(&store, Op::Increment(key.into_bytes(), delta))
                .await
            {
                Ok(Reply::Integer(n)) => Ok(n),
                other => Err(wasi::Error::Other(failed(other))),
            },
        )
    }

    async fn swap(
        &mut self,
        cas: Resource<Cas>,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), atomics::CasError>> {
        let Cas {
            store,
            key,
            current,
        } = self.table.delete(cas)?;
        let op = Op::CompareAndSwap {
            key: key.clone().into_bytes(),
            expected: current,
            new: value,
        };
        match self.session.run(&store, op).await {
            Ok(Reply::Bool(true)) => Ok(Ok(())),
            Ok(Reply::Bool(false)) => {
                // The value changed since it was read: a fresh read to retry from.
                let current = match self.kv_get(&store, key.clone()).await {
                    Ok(v) => v,
                    Err(why) => return Ok(Err(store_error(why))),
                };
                let cas = self.table.push(Cas {
                    store,
                    key,
                    current,
                })?;
                Ok(Err(atomics::CasError::CasFailed(cas)))
            }
            other => Ok(Err(store_error(failed(other)))),
        }
    }
}

fn store_error(why: String) -> atomics::CasError {
    atomics::CasError::StoreError(wasi::Error::Other(why))
}

impl atomics::HostCas for KvHost<'_> {
    async fn new(
        &mut self,
        b: Resource<Bucket>,
        key: String,
    ) -> wasmtime::Result<Result<Resource<Cas>, wasi::Error>> {
        let store = self.bucket(&b)?;
        let current = match self.kv_get(&store, key.clone()).await {
            Ok(v) => v,
            Err(why) => return Ok(Err(wasi::Error::Other(why))),
        };
        Ok(Ok(self.table.push(Cas {
            store,
            key,
            current,
        })?))
    }

    async fn current(
        &mut self,
        cas: Resource<Cas>,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, wasi::Error>> {
        Ok(Ok(self.table.get(&cas)?.current.clone()))
    }

    async fn drop(&mut self, cas: Resource<Cas>) -> wasmtime::Result<()> {
        self.table.delete(cas)?;
        Ok(())
    }
}

impl batch::Host for KvHost<'_> {
    async fn get_many(
        &mut self,
        b: Resource<Bucket>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<Vec<(String, Option<Vec<u8>>)>, wasi::Error>> {
        let store = self.bucket(&b)?;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            match self.kv_get(&store, key.clone()).await {
                Ok(v) => out.push((key, v)),
                Err(why) => return Ok(Err(wasi::Error::Other(why))),
            }
        }
        Ok(Ok(out))
    }

    async fn set_many(
        &mut self,
        b: Resource<Bucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> wasmtime::Result<Result<(), wasi::Error>> {
        let store = self.bucket(&b)?;
        for (key, value) in key_values {
            let op = Op::Set(key.into_bytes(), value);
            if let Err(why) = self.kv_done(&store, op).await {
                return Ok(Err(wasi::Error::Other(why)));
            }
        }
        Ok(Ok(()))
    }

    async fn delete_many(
        &mut self,
        b: Resource<Bucket>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<(), wasi::Error>> {
        let store = self.bucket(&b)?;
        for key in keys {
            if let Err(why) = self.kv_done(&store, Op::Delete(key.into_bytes())).await {
                return Ok(Err(wasi::Error::Other(why)));
            }
        }
        Ok(Ok(()))
    }
}
