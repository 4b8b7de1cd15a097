//! The composition root of the guest kinds' linkers: what each kind links of its own (in its
//! module's `linker`) and, here, the host APIs of a request's capabilities
//! ([`crate::capabilities`]), one line per kind for each. A new host API is a line in each of
//! [`core_capabilities`] and [`component_capabilities`].

use wasmtime::{Engine, Linker};

use super::{module, wasi_http};

/// The host APIs of the capabilities, for core modules (the `tern` ABI's; CGI programs link
/// them too).
fn core_capabilities(linker: &mut Linker<module::GuestState>) -> wasmtime::Result<()> {
    module::tern::outbound::add_to_linker(linker)?;
    module::tern::kv::add_to_linker(linker)?;
    module::tern::config::add_to_linker(linker)?;
    module::tern::cache::add_to_linker(linker)?;
    module::tern::rate::add_to_linker(linker)?;
    module::tern::websocket::add_to_linker(linker)
}

/// The host APIs of the capabilities, for components (their outgoing requests are
/// `wasi:http`'s own, through the outbound session: see `wasi_http::hooks`).
fn component_capabilities(
    linker: &mut wasmtime::component::Linker<wasi_http::HttpState>,
    wasi_p3: bool,
) -> wasmtime::Result<()> {
    wasi_http::kv::add_to_linker(linker, wasi_http::HttpState::kv)?;
    wasi_http::variables::add_to_linker(linker, wasi_p3, wasi_http::HttpState::variables)?;
    wasi_http::cache::add_to_linker(linker, wasi_http::HttpState::cache)?;
    wasi_http::rate::add_to_linker(linker, wasi_http::HttpState::rate)
}

/// The linkers every tenant is pre-linked against, by guest kind and whether it has assets.
#[derive(Clone)]
pub struct Linkers {
    /// Core modules: WASI preview1 (no files at all) and the `tern` ABI; the same with the
    /// read-only in-memory `/assets`; and both with stdin and stdout as CGI's request body and
    /// response. Indexed by [`Self::module`].
    modules: [Linker<module::GuestState>; 4],
    /// WASI preview2 and `wasi:http` for components (and WASI 0.3 where the engine has it).
    pub http: wasmtime::component::Linker<wasi_http::HttpState>,
}

impl Linkers {
    /// Builds them all; `wasi_p3` if the engine serves WASI 0.3 components (`pool.wasi_p3`).
    ///
    /// # Errors
    /// Only if wasmtime rejects a definition (a bug).
    pub fn new(engine: &Engine, wasi_p3: bool) -> wasmtime::Result<Self> {
        let core = |assets: bool, cgi: bool| {
            let mut linker = module::linker(engine, assets, cgi)?;
            core_capabilities(&mut linker)?;
            Ok::<_, wasmtime::Error>(linker)
        };
        let mut http = wasi_http::linker(engine, wasi_p3)?;
        component_capabilities(&mut http, wasi_p3)?;
        Ok(Self {
            modules: [
                core(false, false)?,
                core(true, false)?,
                core(false, true)?,
                core(true, true)?,
            ],
            http,
        })
    }

    /// The linker for a core module of a tenant with or without assets, CGI or not.
    pub fn module(&self, assets: bool, cgi: bool) -> &Linker<module::GuestState> {
        &self.modules[usize::from(assets) + 2 * usize::from(cgi)]
    }
}
