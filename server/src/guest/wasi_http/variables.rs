//! Variables for components: Spin's `fermyon:spin/variables` (`spin_sdk::variables::get`,
//! spin-sdk 3.x and 5.x) and `wasi:config/store` (Spin's 2024-09-27 draft and the draft
//! wasmtime's wasi-config binds), both over the tenant's variables ([`crate::variables`]).
//!
//! A name with no variable is Spin's `undefined` and `wasi:config`'s `none`, never a trap; a
//! tenant whose secrets this server cannot open answers Spin's `provider` and
//! `wasi:config`'s `upstream` error with why (and no value).

use wasmtime::component::{HasSelf, Linker};

use super::HttpState;
use crate::variables::{Found, check_name};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit/variables",
        world: "tern:host/variables",
        require_store_data_send: true,
    });
}

use bindings::fermyon::spin::variables as spin;
use bindings::wasi::config0_2_0_draft::store as config_draft;
use bindings::wasi::config0_2_0_draft_2024_09_27::store as config_spin;

/// Adds the interfaces to `linker`.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker(linker: &mut Linker<HttpState>) -> wasmtime::Result<()> {
    bindings::Variables::add_to_linker::<HttpState, HasSelf<HttpState>>(linker, |s| s)
}

impl spin::Host for HttpState {
    fn get(&mut self, name: String) -> Result<String, spin::Error> {
        check_name(&name).map_err(spin::Error::InvalidName)?;
        match self.host.variables.values().get(&name) {
            Found::Value(v) => Ok(v.to_string()),
            Found::Undefined => Err(spin::Error::Undefined(format!(
                "no variable {name:?} (tern var set / tern secret set)"
            ))),
            Found::Unavailable(why) => Err(spin::Error::Provider(why.to_string())),
        }
    }
}

/// `wasi:config/store`'s `get`, whichever version: the value, `None`, or why it is unavailable.
fn config_get(state: &HttpState, key: &str) -> Result<Option<String>, String> {
    match state.host.variables.values().get(key) {
        Found::Value(v) => Ok(Some(v.to_string())),
        Found::Undefined => Ok(None),
        Found::Unavailable(why) => Err(why.to_string()),
    }
}

impl config_draft::Host for HttpState {
    fn get(&mut self, key: String) -> Result<Option<String>, config_draft::Error> {
        config_get(self, &key).map_err(config_draft::Error::Upstream)
    }

    fn get_all(&mut self) -> Result<Vec<(String, String)>, config_draft::Error> {
        self.host
            .variables
            .values()
            .all()
            .map_err(config_draft::Error::Upstream)
    }
}

impl config_spin::Host for HttpState {
    fn get(&mut self, key: String) -> Result<Option<String>, config_spin::Error> {
        config_get(self, &key).map_err(config_spin::Error::Upstream)
    }

    fn get_all(&mut self) -> Result<Vec<(String, String)>, config_spin::Error> {
        self.host
            .variables
            .values()
            .all()
            .map_err(config_spin::Error::Upstream)
    }
}
