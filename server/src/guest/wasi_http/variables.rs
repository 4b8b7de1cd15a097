//! Variables for components: Spin's `fermyon:spin/variables` (`spin_sdk::variables::get`,
//! spin-sdk 3.x and 5.x), `spin:variables@3.0.0` (spin-sdk 7's WASI 0.3 components, where the
//! engine serves WASI 0.3) and `wasi:config/store` (Spin's 2024-09-27 draft and the draft
//! wasmtime's wasi-config binds), both over the tenant's variables ([`crate::variables`]).
//!
//! A name with no variable is Spin's `undefined` and `wasi:config`'s `none`, never a trap; a
//! tenant whose secrets this server cannot open answers Spin's `provider` and
//! `wasi:config`'s `upstream` error with why (and no value).

use wasmtime::component::{Accessor, HasData, Linker};

use crate::variables::{Found, check_name};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit/variables",
        world: "tern:host/variables",
        require_store_data_send: true,
    });
}

mod bindings_p3 {
    wasmtime::component::bindgen!({
        path: "wit/variables",
        world: "tern:host/variables-p3",
        require_store_data_send: true,
    });
}

use bindings::fermyon::spin::variables as spin;
use bindings::wasi::config0_2_0_draft::store as config_draft;
use bindings::wasi::config0_2_0_draft_2024_09_27::store as config_spin;
use bindings_p3::spin::variables::variables as spin3;

/// Adds the interfaces to `linker`; with `wasi_p3` (the engine serves WASI 0.3) also
/// `spin:variables@3.0.0`.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    wasi_p3: bool,
    view: fn(&mut T) -> VariablesHost<'_>,
) -> wasmtime::Result<()> {
    bindings::Variables::add_to_linker::<T, HasVariables>(linker, view)?;
    if wasi_p3 {
        bindings_p3::VariablesP3::add_to_linker::<T, HasVariables>(linker, view)?;
    }
    Ok(())
}

/// What these interfaces reach of a request's store: its tenant's variables.
pub struct VariablesHost<'a> {
    /// The tenant's variables ([`crate::capabilities::Capabilities::variables`]).
    pub variables: &'a crate::variables::Grant,
}

/// The [`HasData`] of [`VariablesHost`].
struct HasVariables;

impl HasData for HasVariables {
    type Data<'a> = VariablesHost<'a>;
}

/// Why Spin's `get` has no value, in the terms both versions of the interface share.
enum Missing {
    InvalidName(String),
    Undefined(String),
    Provider(String),
}

/// Spin's `get` (either version): the value, or which of its errors.
fn spin_get(state: &VariablesHost<'_>, name: &str) -> Result<String, Missing> {
    check_name(name).map_err(Missing::InvalidName)?;
    match state.variables.values().get(name) {
        Found::Value(v) => Ok(v.to_string()),
        Found::Undefined => Err(Missing::Undefined(format!(
            "no variable {name:?} (tern var set / tern secret set)"
        ))),
        Found::Unavailable(why) => Err(Missing::Provider(why.to_string())),
    }
}

impl spin::Host for VariablesHost<'_> {
    fn get(&mut self, name: String) -> Result<String, spin::Error> {
        spin_get(self, &name).map_err(|m| match m {
            Missing::InvalidName(s) => spin::Error::InvalidName(s),
            Missing::Undefined(s) => spin::Error::Undefined(s),
            Missing::Provider(s) => spin::Error::Provider(s),
        })
    }
}

impl spin3::Host for VariablesHost<'_> {}

/// WASI 0.3's `get` is an async function; the value is at hand, so it answers at once.
impl<U> spin3::HostWithStore<U> for HasVariables {
    async fn get(accessor: &Accessor<U, Self>, name: String) -> Result<String, spin3::Error> {
        accessor.with(|mut view| {
            spin_get(&view.get(), &name).map_err(|m| match m {
                Missing::InvalidName(s) => spin3::Error::InvalidName(s),
                Missing::Undefined(s) => spin3::Error::Undefined(s),
                Missing::Provider(s) => spin3::Error::Provider(s),
            })
        })
    }
}

/// `wasi:config/store`'s `get`, whichever version: the value, `None`, or why it is unavailable.
fn config_get(state: &VariablesHost<'_>, key: &str) -> Result<Option<String>, String> {
    match state.variables.values().get(key) {
        Found::Value(v) => Ok(Some(v.to_string())),
        Found::Undefined => Ok(None),
        Found::Unavailable(why) => Err(why.to_string()),
    }
}

/// The config interface as both packages spell it (the same functions, each with its own
/// error type).
macro_rules! config_host {
    ($api:ident) => {
        impl $api::Host for VariablesHost<'_> {
            fn get(&mut self, key: String) -> Result<Option<String>, $api::Error> {
                config_get(self, &key).map_err($api::Error::Upstream)
            }

            fn get_all(&mut self) -> Result<Vec<(String, String)>, $api::Error> {
                let values = self.variables.values();
                values.all().map_err($api::Error::Upstream)
            }
        }
    };
}

config_host!(config_draft);
config_host!(config_spin);
