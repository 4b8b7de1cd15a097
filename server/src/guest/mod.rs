//! Guest kinds: one module per kind with its linker and its host side, and what the kinds share.
//!
//! A guest kind is how a compiled module or component takes a request and answers it:
//!
//! - [`tern`](module::tern): Tern's own ABI v1 (`tern::request_*`, `tern::response_*`, `tern::outbound_*`).
//! - [`cgi`](module::cgi): WASI programs answering on stdout (RFC 3875), the request in their environment.
//! - [`wasi_http`]: `wasi:http` components (WASI 0.2 `proxy`, WASI 0.3 `service`; core
//!   modules that export the handler are made components first, by [`crate::adapter`]).
//!
//! `tern` and `cgi` guests are core modules: [`module`] holds their store state (WASI preview1,
//! the in-memory `/assets` directory, the bounds-checked guest memory) and composes their
//! linker from its parts, the host side of each of the two kinds among them.
//!
//! What the kinds share lives here: the request a guest reads ([`request`]: its body within the
//! tenant's limit, typed read errors), the response it writes ([`response`]: buffered, then
//! streamed, typed write errors), the limits and the captured output. Each kind maps those
//! errors to its own (`tern` errnos, WASI errnos for CGI's stdio, `wasi:http` error codes).
//!
//! Kinds sit below tenants (a [`crate::tenant::Tenant`] holds its pre-linked [`Guest`]); each
//! kind's driver sits above them, in [`crate::execute`], beside the lifecycle every kind
//! shares. A new kind is a module here, a variant of [`Guest`] with its line in [`link`], and a
//! [`crate::execute`] driver (its `Driver` impl) with its line in `execute::run`.

pub mod limits;
pub mod link;
pub mod module;
pub mod request;
pub mod response;
pub mod slice;
pub mod stdio;
pub mod wasi_http;

pub use limits::GuestLimits;
pub use link::Linkers;
pub use stdio::{Output, Stdio, WasiSpec};

use crate::artifact::{Code, Compiled};
use crate::config::GuestKind;

pub use request::{GuestRequest, RequestBody};
pub use response::{ForwardError, GuestResponse, Head, HeaderError, WriteError};

/// A tenant's guest, pre-linked for its kind (the one place the kinds are listed).
pub enum Guest {
    /// A core module on Tern's ABI v1.
    Tern(module::CoreGuest),
    /// A core module run as a CGI program (stdin and stdout are the request body and response).
    Cgi(module::CoreGuest),
    /// A `wasi:http` component.
    WasiHttp(wasi_http::Handler),
}

impl Guest {
    /// Its kind, as configs and the admin API name it.
    pub fn kind(&self) -> GuestKind {
        match self {
            Self::Tern(_) => GuestKind::Tern,
            Self::Cgi(_) => GuestKind::Cgi,
            Self::WasiHttp(_) => GuestKind::WasiHttp,
        }
    }
}

/// A module or component checked and pre-linked for its kind.
pub struct Linked {
    /// The pre-linked guest.
    pub guest: Guest,
    /// Something its author should know.
    pub warning: Option<String>,
}

/// Decides the kind of `compiled` (`asked`, else detected), checks it against what that kind
/// needs and pre-links it (a core module with the `/assets` functions if `assets`).
///
/// # Errors
/// What the module or component lacks or imports wrongly, or why it is not of the kind asked
/// for, in words for its author.
pub fn link(
    linkers: &Linkers,
    compiled: &Compiled,
    asked: Option<GuestKind>,
    assets: bool,
) -> Result<Linked, String> {
    let kind = kind_of(compiled, asked)?;
    let linked = |guest| Linked {
        guest,
        warning: None,
    };
    Ok(match (compiled.code(), kind) {
        (Code::Component(component), _) => linked(Guest::WasiHttp(wasi_http::Handler::link(
            &linkers.http,
            component,
        )?)),
        (Code::Module(module), GuestKind::Cgi) => linked(Guest::Cgi(module::link(
            linkers.module(assets, true),
            module,
        )?)),
        (Code::Module(module), _) => Linked {
            guest: Guest::Tern(module::link(linkers.module(assets, false), module)?),
            warning: module::tern_kind_warning(module),
        },
    })
}

/// The kind of `compiled`: `asked` if given (and possible), else detected: a component is
/// `wasi-http`; a core module importing from `tern` is `tern`, any other is `cgi`.
///
/// # Errors
/// Why `compiled` cannot be of the kind asked for.
pub fn kind_of(compiled: &Compiled, asked: Option<GuestKind>) -> Result<GuestKind, String> {
    match (compiled.code(), asked) {
        (Code::Component(_), None | Some(GuestKind::WasiHttp)) => Ok(GuestKind::WasiHttp),
        (Code::Component(_), Some(k)) => Err(format!(
            "kind `{}` needs a core module, but this is a component (components are served as \
             `wasi-http`)",
            k.name()
        )),
        (Code::Module(_), Some(GuestKind::WasiHttp)) => Err(
            "kind `wasi-http` needs a component exporting `wasi:http/incoming-handler`, but this \
             is a core module (build it with `--target wasm32-wasip2`, or deploy it as `tern` or \
             `cgi`)"
                .into(),
        ),
        (Code::Module(_), Some(k)) => Ok(k),
        (Code::Module(m), None) => Ok(if module::imports_tern_abi(m) {
            GuestKind::Tern
        } else {
            GuestKind::Cgi
        }),
    }
}
