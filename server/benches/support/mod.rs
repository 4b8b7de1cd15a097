//! Guests run without HTTP exactly as the server runs them: shared by `benches/lifecycle.rs`
//! and `examples/phases.rs` (included there by path).

use std::path::Path;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, Uri};
use tern::config::{Config, PoolConfig};
use tern::context::{Connection, RequestContext};
use tern::engine::EpochTicker;
use tern::execute::{self, RunOutput};
use tern::guest::Linkers;
use tern::guest::{GuestRequest, RequestBody};
use tern::metrics::Metrics;
use tern::tenant::{self, TenantRef};

/// An engine with its pool and epoch ticker, and the linkers, as `tern serve` builds them.
pub struct Harness {
    /// The engine of `pool`.
    pub engine: wasmtime::Engine,
    linkers: Linkers,
    metrics: Metrics,
    pool: PoolConfig,
    _ticker: EpochTicker,
}

impl Harness {
    /// Creates the engine and reserves the pool.
    pub fn new(pool: PoolConfig) -> anyhow::Result<Self> {
        let engine = tern::engine::build(&pool)?;
        Ok(Self {
            linkers: Linkers::new(&engine, pool.wasi_p3)?,
            _ticker: EpochTicker::start(&engine),
            engine,
            metrics: Metrics::new(1000),
            pool,
        })
    }

    /// Compiles, seals, stores and maps `wasm` as the server does (or maps the artifact `cache`
    /// already holds), then pre-links it as tenant `name`.
    pub fn tenant(&self, name: &str, wasm: &[u8], cache: &Path) -> anyhow::Result<TenantRef> {
        let module = tern::artifact::load_wasm(&self.engine, wasm, name, cache)?.module;
        let config = Config::parse(
            &format!("[[tenant]]\nname = \"{name}\"\nmodule = \"x.wasm\"\n"),
            "harness.toml",
            Path::new(".").to_path_buf(),
        )?;
        let server = tenant::ServerParts {
            linkers: &self.linkers,
            pool: &self.pool,
            metrics: &self.metrics,
            resources: &tern::capabilities::Resources {
                stores: tern::kv::Stores::default(),
                variables: std::sync::Arc::default(),
                hub: tern::websocket::Hub::new(),
                forward: None,
                live_logs: tern::config::LiveLogsConfig::default(),
            },
        };
        Ok(Arc::new(tenant::prepare(
            server,
            &module,
            &config.tenants[0],
            tenant::Origin::Config,
            None,
            Default::default(),
        )?))
    }
}

/// One `GET /` with no headers or body through `execute::answer`, driven to its end.
pub async fn request(tenant: &TenantRef) -> RunOutput {
    let req = GuestRequest::new(
        Method::GET,
        Uri::from_static("/"),
        HeaderMap::new(),
        RequestBody::Empty,
        u64::MAX,
        RequestContext {
            conn: Connection::plain(([127, 0, 0, 1], 1).into()),
            client: ([127, 0, 0, 1], 1).into(),
            request_id: HeaderValue::from_static("harness"),
            prefix_len: 0,
            version: http::Version::HTTP_11,
            trace: None,
            timeout: None,
            trigger: tern::trigger::Trigger::Request,
        },
    );
    execute::answer(tenant.clone(), req, (), std::time::Instant::now())
        .await
        .finish()
        .await
}
