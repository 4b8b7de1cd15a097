//! Core modules that are `wasi:http` components in all but their wrapping: built for
//! `wasm32-wasip1` with a component-model toolchain (spin-sdk 3.x and 5.x as Spin's docs build
//! them, wit-bindgen), they export `wasi:http/incoming-handler@0.2.x#handle` by the component
//! model's naming convention and carry their world in `component-type` custom sections. Spin
//! turns them into components when it loads them, with WASI preview1 provided by the
//! preview1-to-preview2 adapter; so does Tern, before compiling, so they serve as the
//! `wasi-http` kind. The stored module stays what was uploaded.

/// The export a `wasi:http` component is served by: `wasi:http/incoming-handler`, any 0.2.x
/// (for a core module: that name, `#handle`).
pub const HANDLER_EXPORT: &str = "wasi:http/incoming-handler@0.2";

/// Whether `wasm` is a core module exporting the `wasi:http` handler by the component naming
/// convention.
pub fn exports_http_handler(wasm: &[u8]) -> bool {
    use wasmparser::Payload;
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        match payload {
            Ok(Payload::Version {
                encoding: wasmparser::Encoding::Component,
                ..
            }) => return false,
            Ok(Payload::ExportSection(exports)) => {
                return exports
                    .into_iter()
                    .flatten()
                    .any(|e| e.name.starts_with(HANDLER_EXPORT) && e.name.ends_with("#handle"));
            }
            Ok(Payload::CodeSectionStart { .. }) | Err(_) => return false,
            _ => {}
        }
    }
    false
}

/// The component made of the core module `wasm` (see the module docs), with WASI preview1
/// adapted to preview2.
///
/// # Errors
/// Why the module cannot be made a component (e.g. it has no `component-type` section, so its
/// world is unknown), said for its author.
pub fn componentize(wasm: &[u8]) -> Result<Vec<u8>, String> {
    let explain = |why: String| {
        format!(
            "this core module exports the wasi:http handler (as spin-sdk and wit-bindgen build \
             them for wasm32-wasip1) but could not be made a component: {why}. Build it for \
             wasm32-wasip2, or make it a component with `wasm-tools component new --adapt`"
        )
    };
    let has_world = wasmparser::Parser::new(0).parse_all(wasm).any(|p| {
        matches!(p, Ok(wasmparser::Payload::CustomSection(c)) if c.name().starts_with("component-type"))
    });
    if !has_world {
        return Err(explain(
            "it has no `component-type` section (the world wit-bindgen embeds), so its imports \
             and exports cannot be typed"
                .into(),
        ));
    }
    let adapter = wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER;
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(wasm)
        .and_then(|e| e.adapter("wasi_snapshot_preview1", adapter))
        .and_then(|mut e| e.encode())
        .map_err(|e| explain(format!("{e:#}")))
}
