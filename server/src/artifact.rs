//! Ahead-of-time compiled modules: compile, seal, store atomically, verify and load by mmap.
//!
//! One of the two modules with `unsafe` (with `pagemap`): loading compiled code. wasmtime trusts a `.cwasm`
//! file's contents (it checks only the engine version and configuration), so Tern loads only
//! files it can prove it produced unmodified: every artifact ends with a *seal*
//! (`SHA-256 of the wasmtime artifact` + [`SEAL_MAGIC`]) written by [`compile`], and [`load_cwasm`]
//! refuses a file whose digest does not match. Artifacts are written once, atomically (temp
//! file, fsync, rename, fsync directory), and never rewritten in place, because they are mmapped
//! for as long as a module lives.
//!
//! Loads of one artifact on one engine share the module while it is held ([`Compiled`]): every
//! tenant and version of the same bytes is one mapping, one memory image, one set of warm slots.

#![allow(unsafe_code)]

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Module, Precompiled};

/// A compiled guest: a core module (the `tern` and `cgi` kinds) or a component (`wasi-http`).
pub enum Code {
    /// A core WebAssembly module.
    Module(Module),
    /// A WebAssembly component.
    Component(Component),
}

impl Code {
    /// The engine it was loaded on.
    pub fn engine(&self) -> &Engine {
        match self {
            Self::Module(m) => m.engine(),
            Self::Component(c) => c.engine(),
        }
    }
}

/// A loaded module or component: a handle, cheap to clone, that every tenant and version
/// serving it holds.
///
/// Loads of one sealed artifact on one engine give the same loaded module for as long as a
/// handle of it lives ([`load_cwasm`]): tenants that deploy the same bytes share one mapping
/// of its code, one memory image and the pool's slots warm for it, as a single tenant would.
/// Nothing of a guest's state is in the module: every instance starts from its image in a slot
/// reset after the last one, whichever tenant that served.
#[derive(Clone)]
pub struct Compiled(std::sync::Arc<Shared>);

/// What a [`Compiled`] handle shares.
struct Shared {
    code: Code,
    /// The SHA-256 of the artifact it was loaded from (its seal's digest).
    digest: [u8; 32],
}

impl Compiled {
    /// The module or component.
    pub fn code(&self) -> &Code {
        &self.0.code
    }

    /// The core module, if this is one.
    pub fn module(&self) -> Option<&Module> {
        match self.code() {
            Code::Module(m) => Some(m),
            Code::Component(_) => None,
        }
    }

    /// The engine it was loaded on.
    pub fn engine(&self) -> &Engine {
        self.code().engine()
    }

    /// Where its compiled code lives: the same for every handle of one loaded module.
    pub fn image_start(&self) -> usize {
        match self.code() {
            Code::Module(m) => m.image_range().start as usize,
            Code::Component(c) => c.image_range().start as usize,
        }
    }

    /// Whether two handles are of one loaded module.
    pub fn same(a: &Compiled, b: &Compiled) -> bool {
        std::sync::Arc::ptr_eq(&a.0, &b.0)
    }

    /// The same compiled code, loaded on `engine`: no compiling, since `engine` has the
    /// fingerprint of the engine it was compiled for (only its pool settings may differ).
    /// Shared as [`load_cwasm`] shares: moving two handles of one module gives one module.
    ///
    /// # Errors
    /// [`ArtifactError::Incompatible`] if `engine` compiles differently.
    pub fn rehome(&self, engine: &Engine) -> Result<Compiled, ArtifactError> {
        if engine_fingerprint(engine) != engine_fingerprint(self.engine()) {
            return Err(ArtifactError::Incompatible {
                path: "(a loaded module)".into(),
                reason: "the new engine compiles differently".into(),
            });
        }
        if let Some(loaded) = live::find(engine, &self.0.digest) {
            return Ok(loaded);
        }
        let incompatible = |e: wasmtime::Error| ArtifactError::Incompatible {
            path: "(a loaded module)".into(),
            reason: format!("{e:#}"),
        };
        let code = match self.code() {
            Code::Module(m) => {
                let image = m.serialize().map_err(incompatible)?;
                // SAFETY: `image` is wasmtime's own serialization of a module it loaded (from a
                // sealed artifact, checked before it was loaded), and `engine` has the same
                // compilation fingerprint.
                unsafe { Module::deserialize(engine, image) }
                    .map(Code::Module)
                    .map_err(incompatible)?
            }
            Code::Component(c) => {
                let image = c.serialize().map_err(incompatible)?;
                // SAFETY: as for modules above.
                unsafe { Component::deserialize(engine, image) }
                    .map(Code::Component)
                    .map_err(incompatible)?
            }
        };
        Ok(live::keep(self.0.digest, code))
    }
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.code() {
            Code::Module(_) => "Compiled::Module",
            Code::Component(_) => "Compiled::Component",
        })
    }
}

/// The modules loaded and still held, by the digest of the artifact they came from: what
/// makes two loads of one artifact on one engine one module.
mod live {
    use super::{Code, Compiled, Shared};
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, Weak};
    use wasmtime::Engine;

    #[derive(Default)]
    struct Table {
        /// Per digest, a module per engine it was loaded on (more than one only while the
        /// tenants move to a new engine).
        by_digest: HashMap<[u8; 32], Vec<Weak<Shared>>>,
        /// The table's size after its last sweep of released modules.
        swept_at: usize,
    }

    fn table() -> std::sync::MutexGuard<'static, Table> {
        static TABLE: std::sync::LazyLock<Mutex<Table>> = std::sync::LazyLock::new(Mutex::default);
        // A panic while it was held leaves the table consistent: no step below can leave it
        // half changed.
        TABLE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The modules `held` (those still held), upgraded. Collected into `into`, declared before
    /// the table's guard, so that a module whose last other handle goes meanwhile is dropped
    /// (unmapped) after the guard, not under it.
    fn upgrade(held: &[Weak<Shared>], into: &mut Vec<Arc<Shared>>) {
        into.clear();
        into.extend(held.iter().filter_map(Weak::upgrade));
    }

    fn on(held: &[Arc<Shared>], engine: &Engine) -> Option<Compiled> {
        held.iter()
            .find(|s| Engine::same(s.code.engine(), engine))
            .cloned()
            .map(Compiled)
    }

    /// The module loaded from the artifact with `digest` on `engine`, if one is still held.
    pub(super) fn find(engine: &Engine, digest: &[u8; 32]) -> Option<Compiled> {
        let mut held = Vec::new();
        {
            let t = table();
            upgrade(t.by_digest.get(digest)?, &mut held);
        }
        on(&held, engine)
    }

    /// `code`, loaded from the artifact with `digest`, as the module every later load of that
    /// artifact on its engine gets while it is held; or the one a parallel load of the same
    /// artifact kept first (`code` is then dropped, after the table's guard).
    pub(super) fn keep(digest: [u8; 32], code: Code) -> Compiled {
        let mut held = Vec::new();
        let mut t = table();
        let entry = t.by_digest.entry(digest).or_default();
        upgrade(entry, &mut held);
        if let Some(first) = on(&held, code.engine()) {
            return first;
        }
        entry.retain(|w| w.strong_count() > 0);
        let shared = Arc::new(Shared { code, digest });
        entry.push(Arc::downgrade(&shared));
        // Released modules' entries go in sweeps, each when the table has doubled since the
        // last: a constant cost per load.
        if t.by_digest.len() > 2 * t.swept_at.max(32) {
            t.by_digest.retain(|_, held| {
                held.retain(|w| w.strong_count() > 0);
                !held.is_empty()
            });
            t.swept_at = t.by_digest.len();
        }
        Compiled(shared)
    }

    /// How many modules loaded on `engine` are held.
    pub(super) fn held(engine: &Engine) -> usize {
        let mut held = Vec::new();
        let mut one = Vec::new();
        let t = table();
        let mut n = 0;
        for entry in t.by_digest.values() {
            upgrade(entry, &mut one);
            n += usize::from(on(&one, engine).is_some());
            held.append(&mut one);
        }
        n
    }
}

/// How many compiled modules and components loaded on `engine` are in use (tenants and
/// versions of the same bytes share one).
pub fn loaded_on(engine: &Engine) -> usize {
    live::held(engine)
}

/// What is wrong with `wasm`'s first bytes for a Tern module, if anything, and whether it is
/// WebAssembly Tern cannot run rather than not WebAssembly at all. `empty` is the message for
/// no bytes. Shared by uploads and `tern compile`.
pub fn wasm_header_problem(wasm: &[u8], empty: &str) -> Option<(String, bool)> {
    let invalid = |m: &str| Some((m.to_string(), false));
    if wasm.is_empty() {
        return invalid(empty);
    }
    if wasm.starts_with(b"\x7fELF") {
        return invalid(
            "this is a compiled artifact; give the .wasm module (the server compiles it)",
        );
    }
    if !wasm.starts_with(b"\0asm") {
        return invalid(
            "not a WebAssembly module: it does not start with the `\\0asm` magic bytes",
        );
    }
    if wasm.len() < 8 {
        return invalid("truncated WebAssembly module: no version after the magic bytes");
    }
    // A core module, or a component (version 0x0d of any draft, layer 1).
    if wasm[4..8] == [1, 0, 0, 0] || is_component(wasm) {
        return None;
    }
    invalid("not a valid WebAssembly module: unknown version after the magic bytes")
}

/// Whether `wasm` starts with a component's preamble (version 0x0d of any draft, layer 1)
/// rather than a core module's.
pub fn is_component(wasm: &[u8]) -> bool {
    wasm.len() >= 8 && wasm.starts_with(b"\0asm") && wasm[6..8] == [1, 0]
}

/// Marks the end of a sealed Tern artifact (format version 1).
pub const SEAL_MAGIC: &[u8; 8] = b"TERNAOT1";
const SEAL_LEN: usize = 32 + SEAL_MAGIC.len();

/// Why a module could not be compiled or loaded.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// Reading or writing a file failed.
    #[error(transparent)]
    Io(#[from] FileError),
    /// The bytes are not a valid WebAssembly module.
    #[error("{what}: not a valid WebAssembly module: {reason}")]
    InvalidWasm {
        /// The file or module name.
        what: String,
        /// The validator's or compiler's message.
        reason: String,
    },
    /// A `.cwasm` without a valid Tern seal: modified, truncated, or not made by Tern.
    #[error(
        "{path}: compiled artifact refused: {reason}; only artifacts written by `tern compile` \
         or this server are loaded, unmodified"
    )]
    Tampered {
        /// The file.
        path: String,
        /// What failed: no seal, or a digest mismatch.
        reason: String,
    },
    /// Well-formed, but not something Tern serves: a core module exporting the `wasi:http`
    /// handler that could not be made a component, a WASI 0.3 component.
    #[error("{what}: {reason}")]
    Unsupported {
        /// The file or module name.
        what: String,
        /// Why, for the module's author.
        reason: String,
    },
    /// A module whose compilation would take more memory than Tern allows one compile.
    #[error("{what}: {reason}")]
    TooCostly {
        /// The file or module name.
        what: String,
        /// Which function and how large it is.
        reason: String,
    },
    /// The host has no room for another loaded module: no file descriptor or memory mapping
    /// left (see [`crate::host`]).
    #[error("{path}: cannot load: {}", .limit.advice())]
    HostLimit {
        /// The file.
        path: String,
        /// Which limit.
        limit: crate::os::Exhausted,
    },
    /// A sealed artifact from another wasmtime version or engine configuration.
    #[error(
        "{path}: compiled artifact is incompatible with this server's engine (another Tern \
         version or configuration); recompile it with `tern compile`: {reason}"
    )]
    Incompatible {
        /// The file.
        path: String,
        /// wasmtime's message.
        reason: String,
    },
}

impl ArtifactError {
    /// The host limit this error ran into, if any: no file descriptor or mapping left.
    pub fn exhausted(&self) -> Option<crate::os::Exhausted> {
        match self {
            Self::HostLimit { limit, .. } => Some(*limit),
            Self::Io(e) => crate::os::Exhausted::of_os_error(&e.source)
                .filter(|l| *l == crate::os::Exhausted::OpenFiles),
            _ => None,
        }
    }
}

/// An operation on a file failed: which file, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FileError {
    /// The file or directory.
    pub path: String,
    /// The OS error.
    pub source: std::io::Error,
}

/// For `map_err`: the OS error of an operation on `path`, with the path.
pub fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError {
        path: path.display().to_string(),
        source,
    }
}

/// What Tern adds to what it compiles, hashed into the artifacts' fingerprint beside
/// wasmtime's compatibility: 2 = components carry the memory probe ([`crate::teardown::probe`]), which a
/// server without it cannot link (replicas of two versions sharing a registry keep apart).
const ARTIFACT_REVISION: u32 = 2;

/// A stable fingerprint of everything in `engine` (and in Tern's compiling) that decides
/// whether an artifact loads.
pub fn engine_fingerprint(engine: &Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    ARTIFACT_REVISION.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Compiles `wasm` with `engine` and returns a sealed artifact.
///
/// # Errors
/// [`ArtifactError::InvalidWasm`] if `wasm` does not validate or compile.
pub fn compile(engine: &Engine, wasm: &[u8], what: &str) -> Result<Vec<u8>, ArtifactError> {
    let invalid = |e: wasmtime::Error| ArtifactError::InvalidWasm {
        what: what.to_string(),
        reason: format!("{e:#}"),
    };
    if Engine::detect_precompiled(wasm).is_some() {
        return Err(ArtifactError::InvalidWasm {
            what: what.to_string(),
            reason: "this is already a compiled artifact, not a .wasm file".into(),
        });
    }
    check_compile_cost(wasm).map_err(|reason| ArtifactError::TooCostly {
        what: what.to_string(),
        reason,
    })?;
    let _turn = CompileTurn::take();
    let mut out = if is_component(wasm) {
        precompile_component(engine, wasm).map_err(|e| {
            let text = format!("{e:#}");
            if text.contains("component model async") {
                ArtifactError::Unsupported {
                    what: what.to_string(),
                    reason: format!(
                        "this is a WASI 0.3 component (component-model async: {}), as spin-sdk \
                         6 and later and wit-bindgen's async mode build them; this server serves \
                         WASI 0.2 components: build it with spin-sdk 5.x or the `wasip2` crate \
                         (wasm32-wasip2), or as spin-sdk 3.x/5.x for wasm32-wasip1; or have the \
                         server serve WASI 0.3 with `[pool] wasi_p3 = true` (`tern compile \
                         --wasi-p3`; experimental in wasmtime 48)",
                        text.rsplit(": ").next().unwrap_or(&text)
                    ),
                }
            } else {
                invalid(e)
            }
        })?
    } else if crate::adapter::exports_http_handler(wasm) {
        let component =
            crate::adapter::componentize(wasm).map_err(|reason| ArtifactError::Unsupported {
                what: what.to_string(),
                reason,
            })?;
        precompile_component(engine, &component).map_err(invalid)?
    } else {
        engine.precompile_module(wasm).map_err(invalid)?
    };
    seal(&mut out);
    Ok(out)
}

/// Compiles a component with the memory probe appended ([`crate::teardown::probe`]), or as it is when
/// the probe cannot be added or the component with it does not compile (the error is then the
/// component's own).
fn precompile_component(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Vec<u8>> {
    match crate::teardown::probe::add(wasm) {
        Ok(probed) => match engine.precompile_component(&probed) {
            Ok(artifact) => return Ok(artifact),
            Err(e) => tracing::debug!("component compiled without the memory probe: {e:#}"),
        },
        Err(why) => tracing::debug!("component compiled without the memory probe: {why}"),
    }
    engine.precompile_component(wasm)
}

/// Most control blocks (`block`, `loop`, `if`, `try_table`) one function may have. Compiling
/// takes about 1.1 KiB of memory per block, nested or not (350,000 blocks: 410-430 MiB RSS,
/// `tern compile` under `/usr/bin/time`), so this bounds one compile near 110 MiB, far above
/// what real functions use.
pub const MAX_BLOCKS_PER_FUNCTION: usize = 100_000;

/// Refuses a module with a function whose compilation would take too much memory. Bytes that
/// do not parse are left to the compiler, whose message says why.
fn check_compile_cost(wasm: &[u8]) -> Result<(), String> {
    use wasmparser::{Operator, Payload};
    let mut index = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        let Ok(Payload::CodeSectionEntry(body)) = payload else {
            if payload.is_err() {
                return Ok(());
            }
            continue;
        };
        let Ok(mut ops) = body.get_operators_reader() else {
            return Ok(());
        };
        let mut blocks = 0usize;
        while !ops.eof() {
            match ops.read() {
                Ok(
                    Operator::Block { .. }
                    | Operator::Loop { .. }
                    | Operator::If { .. }
                    | Operator::TryTable { .. },
                ) => blocks += 1,
                Ok(_) => {}
                Err(_) => return Ok(()),
            }
        }
        if blocks > MAX_BLOCKS_PER_FUNCTION {
            return Err(format!(
                "function {index} has {blocks} control blocks, more than Tern compiles in one \
                 function ({MAX_BLOCKS_PER_FUNCTION}); compiling it would take about {} MiB",
                (blocks * 1100) >> 20
            ));
        }
        index += 1;
    }
    Ok(())
}

/// A turn to compile: at most one compile per core runs at once (deploys and start-up alike),
/// so memory for compiling stays bounded however many uploads arrive together. Waiting is on
/// a blocking thread, never the reactor.
struct CompileTurn;

static COMPILES: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

impl CompileTurn {
    fn take() -> Self {
        let most = std::thread::available_parallelism().map_or(1, usize::from);
        let (running, freed) = &COMPILES;
        let mut n = running.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= most {
            n = freed.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        Self
    }
}

impl Drop for CompileTurn {
    fn drop(&mut self) {
        let (running, freed) = &COMPILES;
        *running.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
    }
}

/// Appends the seal (digest + magic) to a wasmtime artifact.
pub fn seal(artifact: &mut Vec<u8>) {
    let digest = Sha256::digest(&artifact[..]);
    artifact.extend_from_slice(&digest);
    artifact.extend_from_slice(SEAL_MAGIC);
}

/// Writes `bytes` to `path` atomically: a crash leaves the old file or the new one, never a
/// torn one, and a file that is mapped somewhere is replaced, never modified.
///
/// # Errors
/// Any I/O failure; the temporary file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ArtifactError> {
    write_atomic_mode(path, bytes, 0o666)
}

/// [`write_atomic`] creating the file with permission bits `mode` (less the umask), e.g.
/// `0o600` for a secret.
///
/// # Errors
/// Any I/O failure; the temporary file is removed.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ArtifactError> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}-{}", std::process::id(), unique()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(result.map_err(io_err(path))?)
}

/// Whether a file name is one of [`write_atomic`]'s temp files (left behind only by a crash).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Loads a sealed `.cwasm` after checking its seal: a module by mmap, a component from the
/// checked bytes.
///
/// # Errors
/// [`ArtifactError::Tampered`] without a valid seal, [`ArtifactError::Incompatible`] if it was
/// compiled by another engine, [`ArtifactError::Io`] if it cannot be read.
pub fn load_cwasm(engine: &Engine, path: &Path) -> Result<Compiled, ArtifactError> {
    let tampered = |reason: &str| ArtifactError::Tampered {
        path: path.display().to_string(),
        reason: reason.to_string(),
    };
    let host_limit = |limit| ArtifactError::HostLimit {
        path: path.display().to_string(),
        limit,
    };
    // One open file for the check and the mapping: the bytes checked are the bytes mapped.
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) => {
            return Err(match crate::os::Exhausted::of_os_error(&e) {
                Some(limit) => host_limit(limit),
                None => io_err(path)(e).into(),
            });
        }
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io_err(path))?;
    if bytes.len() < SEAL_LEN || &bytes[bytes.len() - SEAL_MAGIC.len()..] != SEAL_MAGIC {
        return Err(tampered("it has no Tern seal"));
    }
    let (body, seal) = bytes.split_at(bytes.len() - SEAL_LEN);
    if Sha256::digest(body)[..] != seal[..32] {
        return Err(tampered("its contents do not match its seal"));
    }
    let digest: [u8; 32] = seal[..32].try_into().expect("a seal starts with 32 bytes");
    // Loaded already (another tenant or version of the same bytes) and still held: the same
    // module, not a second mapping of it.
    if let Some(loaded) = live::find(engine, &digest) {
        return Ok(loaded);
    }
    // Mapping the code can fail for want of mappings (or memory): that is not the artifact's
    // fault.
    let incompatible = |e: wasmtime::Error| match crate::os::Exhausted::in_chain(e.chain()) {
        Some(limit) => host_limit(limit),
        None => ArtifactError::Incompatible {
            path: path.display().to_string(),
            reason: format!("{e:#}"),
        },
    };
    match Engine::detect_precompiled(body) {
        Some(Precompiled::Module) => {}
        Some(Precompiled::Component) => {
            // SAFETY: `body` is exactly the bytes whose digest matches the seal that `compile`
            // appended to wasmtime's own `precompile_component` output (checked above, in
            // memory, so no later change to the file matters); wasmtime itself refuses output
            // of another version or configuration. A component is loaded from these bytes
            // rather than mapped: wasmtime offers no way to map an already opened file.
            let component = unsafe { Component::deserialize(engine, body) };
            return component
                .map(|c| live::keep(digest, Code::Component(c)))
                .map_err(incompatible);
        }
        None => return Err(tampered("it is not a compiled module or component")),
    }
    drop(bytes);
    // SAFETY: the file's digest matches the seal that `compile` appended to wasmtime's own
    // output, so these are the unmodified bytes of `Engine::precompile_module`; wasmtime itself
    // refuses output of another version or configuration. Tern writes artifacts only through
    // `write_atomic` (rename, never in place), so the mapped file does not change while the
    // module lives. The seal after the ELF image is ignored by wasmtime's object parser.
    unsafe { Module::deserialize_open_file(engine, file) }
        .map(|m| live::keep(digest, Code::Module(m)))
        .map_err(incompatible)
}

/// Where the compiled form of `wasm` lives in `cache_dir`: keyed by the module's hash and the
/// engine's fingerprint, so another engine never picks up a stale artifact.
pub fn cache_path(engine: &Engine, cache_dir: &Path, wasm: &[u8]) -> PathBuf {
    artifact_path(
        engine,
        cache_dir,
        &crate::hex::encode(&Sha256::digest(wasm)),
    )
}

/// Where the compiled form of the module with SHA-256 `hash` lives in `dir`.
pub fn artifact_path(engine: &Engine, dir: &Path, hash: &str) -> PathBuf {
    dir.join(format!("{hash}-{}.cwasm", engine_fingerprint(engine)))
}

/// A loaded module or component, and how long compiling it took if it was not in the cache.
#[derive(Debug)]
pub struct Loaded {
    /// The module (mapped from its artifact) or component.
    pub module: Compiled,
    /// Compile time on a cache miss; `None` when an existing artifact was mapped.
    pub compiled_in: Option<std::time::Duration>,
}

/// Loads `wasm` bytes through the artifact cache: compiles and stores them on a miss, reuses
/// the mmapped artifact on a hit. Call it off the async reactor: compiling takes a while.
///
/// # Errors
/// If `wasm` is invalid or the cache cannot be written.
pub fn load_wasm(
    engine: &Engine,
    wasm: &[u8],
    what: &str,
    cache_dir: &Path,
) -> Result<Loaded, ArtifactError> {
    let path = cache_path(engine, cache_dir, wasm);
    if path.exists() {
        match load_cwasm(engine, &path) {
            Ok(module) => {
                return Ok(Loaded {
                    module,
                    compiled_in: None,
                });
            }
            // A damaged cache entry is replaced, not trusted.
            Err(e) => tracing::warn!("replacing cached artifact: {e}"),
        }
    }
    let started = std::time::Instant::now();
    let artifact = compile(engine, wasm, what)?;
    let compiled_in = Some(started.elapsed());
    write_atomic(&path, &artifact)?;
    Ok(Loaded {
        module: load_cwasm(engine, &path)?,
        compiled_in,
    })
}

/// Loads a module file: a sealed `.cwasm` directly, a `.wasm` through the cache.
///
/// # Errors
/// See [`load_cwasm`] and [`load_wasm`].
pub fn load_file(engine: &Engine, path: &Path, cache_dir: &Path) -> Result<Loaded, ArtifactError> {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map_err(io_err(path))?;
    match &magic {
        b"\x7fELF" => Ok(Loaded {
            module: load_cwasm(engine, path)?,
            compiled_in: None,
        }),
        b"\0asm" => {
            let wasm = std::fs::read(path).map_err(io_err(path))?;
            load_wasm(engine, &wasm, &path.display().to_string(), cache_dir)
        }
        _ => Err(ArtifactError::InvalidWasm {
            what: path.display().to_string(),
            reason: "the file is neither a .wasm module nor a compiled .cwasm artifact".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;

    fn engine() -> Engine {
        crate::engine::build(&PoolConfig {
            instances: 2,
            max_memory_mib: 16,
            ..PoolConfig::default()
        })
        .expect("engine")
    }

    fn hello() -> &'static [u8] {
        crate::demo::module("hello").expect("the hello demo module")
    }

    /// `wasm` with a custom section naming `tag`: other bytes, the same compiled code
    /// (wasmtime keeps no custom section but `name` and DWARF in an artifact).
    fn tagged(wasm: &[u8], tag: &str) -> Vec<u8> {
        let payload = [&[4u8][..], b"test", tag.as_bytes()].concat();
        let size = u8::try_from(payload.len()).expect("a short tag");
        [wasm, &[0, size], &payload].concat()
    }

    #[test]
    fn loads_of_the_same_code_share_one_module_while_it_is_held() {
        let (dir, engine) = (tempfile::tempdir().unwrap(), engine());
        let first = load_wasm(&engine, hello(), "a", dir.path()).unwrap().module;
        let second = load_wasm(&engine, hello(), "b", dir.path()).unwrap().module;
        assert!(Compiled::same(&first, &second));
        assert_eq!(first.image_start(), second.image_start());
        assert_eq!(loaded_on(&engine), 1);
        // Bytes that differ in a custom section alone compile to the same artifact.
        let tagged = load_wasm(&engine, &tagged(hello(), "x"), "c", dir.path()).unwrap();
        assert!(tagged.compiled_in.is_some(), "other bytes, compiled");
        assert!(Compiled::same(&first, &tagged.module));
        // Another module's code is another module.
        let counter = crate::demo::module("counter").expect("the counter demo module");
        let other = load_wasm(&engine, counter, "d", dir.path()).unwrap().module;
        assert!(!Compiled::same(&first, &other));
        assert_eq!(loaded_on(&engine), 2);
        // The same artifact on another engine is loaded there, and a module moved to that
        // engine is the one already loaded there.
        let elsewhere = self::engine();
        let there = load_wasm(&elsewhere, hello(), "e", dir.path())
            .unwrap()
            .module;
        assert_eq!((loaded_on(&engine), loaded_on(&elsewhere)), (2, 1));
        assert!(Compiled::same(&first.rehome(&elsewhere).unwrap(), &there));
        assert_eq!(loaded_on(&elsewhere), 1);
        // Released by every holder, it is not kept: the next load maps the artifact again.
        drop((first, second, tagged));
        assert_eq!(loaded_on(&engine), 1);
        let again = load_wasm(&engine, hello(), "f", dir.path()).unwrap().module;
        assert_eq!(loaded_on(&engine), 2);
        assert!(!Compiled::same(&again, &there));
    }

    #[test]
    fn of_two_loads_kept_at_once_the_first_is_the_module() {
        let (dir, engine) = (tempfile::tempdir().unwrap(), engine());
        load_wasm(&engine, hello(), "compile", dir.path()).unwrap();
        let path = cache_path(&engine, dir.path(), hello());
        // Two loads that both found nothing held (as two in parallel can) each map the file.
        // SAFETY: the artifact was just written by `load_wasm`; wasmtime ignores the seal.
        let map = || Code::Module(unsafe { Module::deserialize_file(&engine, &path) }.unwrap());
        let digest = [0x5a; 32];
        let kept = live::keep(digest, map());
        let second = live::keep(digest, map());
        assert!(Compiled::same(&kept, &second));
        assert!(Compiled::same(
            &kept,
            &live::find(&engine, &digest).unwrap()
        ));
        drop((kept, second));
        assert!(live::find(&engine, &digest).is_none());
    }

    #[test]
    fn a_tampered_artifact_is_refused_even_while_its_module_is_held() {
        let (dir, engine) = (tempfile::tempdir().unwrap(), engine());
        let held = load_wasm(&engine, hello(), "a", dir.path()).unwrap().module;
        let path = cache_path(&engine, dir.path(), hello());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = load_cwasm(&engine, &path).unwrap_err();
        assert!(matches!(e, ArtifactError::Tampered { .. }), "{e}");
        drop(held);
    }
}
