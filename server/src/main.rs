//! The `tern` command: `tern serve`, `tern compile`, and the admin client commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tern::config::Config;

/// Tern: an edge request server running one fresh WebAssembly guest per HTTP request.
#[derive(Debug, Parser)]
#[command(name = "tern", version, about, long_about = None)]
struct Cli {
    /// Log format on stderr: `text` (human-readable) or `json` (one object per line).
    /// The level comes from `TERN_LOG` (default `info`; e.g. `TERN_LOG=tern=debug`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the tenants of a config file (with none: the built-in demo tenants on
    /// 127.0.0.1:8080 at /hello, /echo, /json, /counter and /visits).
    #[command(
        after_help = "Traces: OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 exports \
        every request as an OpenTelemetry trace (OTLP/HTTP); OTEL_TRACES_SAMPLER, \
        OTEL_TRACES_SAMPLER_ARG, OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are honoured, \
        or set [tracing] in the config (docs/configuration.md)."
    )]
    Serve {
        /// Configuration file (TOML); see config/tern.toml.
        #[arg(short, long, env = "TERN_CONFIG")]
        config: Option<PathBuf>,
        /// Public listen address, overriding the config's `server.listen`.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Admin listen address (/metrics, /healthz, /admin/v1), overriding
        /// `server.admin_listen`.
        #[arg(long)]
        admin_listen: Option<SocketAddr>,
        /// Data directory: deployed modules, compiled artifacts, assets, the tenant manifest
        /// and the generated admin token. Default: `server.data_dir`, else
        /// `$XDG_DATA_HOME/tern` or `~/.local/share/tern`.
        #[arg(long, env = "TERN_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Without --config: serve the built-in defaults without the demo tenants (only
        /// tenants deployed through the admin API).
        #[arg(long, conflicts_with = "config")]
        no_demo: bool,
        /// The registry a fleet of replicas shares (`registry.url`): `s3://bucket/prefix`, with
        /// the `AWS_*` settings from the environment. Every replica serves what is deployed
        /// on any of them.
        #[arg(long, env = "TERN_REGISTRY_URL")]
        registry: Option<String>,
        /// Also serve HTTPS on this address (`server.tls_listen`), with --tls-cert and --tls-key
        /// as the default certificate.
        #[arg(long, requires_all = ["tls_cert", "tls_key"])]
        tls_listen: Option<SocketAddr>,
        /// PEM file: the certificate (then its chain) served by --tls-listen to clients whose
        /// name no `[[certificate]]` of the config serves.
        #[arg(long, requires = "tls_listen")]
        tls_cert: Option<PathBuf>,
        /// PEM file: the private key of --tls-cert.
        #[arg(long, requires = "tls_listen")]
        tls_key: Option<PathBuf>,
        /// Also serve HTTP/3 (QUIC over UDP) on the TLS listener's address, advertised with
        /// `Alt-Svc` (`server.http3`; off by default).
        #[arg(long)]
        http3: bool,
    },
    /// Create a handler project in ./NAME that builds with one command: for Tern's ABI, Rust
    /// with a copy of the SDK, C with tern.h, or Zig; a wasi:http component in Rust; a CGI
    /// program in Rust or C.
    New {
        /// The project's name (a-z, 0-9, '-', '_').
        name: String,
        /// Its guest kind.
        #[arg(long, value_enum, default_value_t = tern::config::GuestKind::Tern)]
        kind: tern::config::GuestKind,
        /// Its language.
        #[arg(long, value_enum, default_value_t = tern::scaffold::Lang::Rust)]
        lang: tern::scaffold::Lang,
    },
    /// Serve one module at / on a local port for development: no config, no token; it is
    /// reloaded when the file changes, and error responses show the guest's stderr (a panic's
    /// message). Not for production: use `tern serve`.
    Dev {
        /// The .wasm module (or .cwasm artifact) to serve.
        module: PathBuf,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// The guest's time limit per request, in ms.
        #[arg(long, default_value_t = 10_000)]
        timeout_ms: u64,
        /// A variable its guest reads (Spin's variables, wasi:config, `tern_sdk::config`, a
        /// CGI program's environment), NAME=VALUE (repeatable).
        #[arg(long = "var", value_name = "NAME=VALUE", value_parser = name_value)]
        vars: Vec<(String, String)>,
        /// A secret variable, NAME=ENV: its value is this process's environment variable ENV
        /// (so it is in no command line, file or output), e.g. `--secret api_key=API_KEY`
        /// (repeatable).
        #[arg(long = "secret", value_name = "NAME=ENV", value_parser = name_value)]
        secrets: Vec<(String, String)>,
    },
    /// Deploy a module to a tenant on a running server (creating the tenant, routed at
    /// /<tenant>, if it does not exist).
    Deploy {
        #[command(flatten)]
        deploy: tern::cli::Deploy,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Watch a tenant's requests: the ones the server kept, then (-f) each as it ends, on
    /// every replica of a fleet: time, replica, version, method, path, status, outcome,
    /// duration, client, request id, what the guest wrote to stdout and stderr, a trap's
    /// message and backtrace. Filters run on the server. Needs the operator's token or a
    /// token with the `logs` scope for the tenant.
    Logs {
        #[command(flatten)]
        logs: tern::cli::Logs,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List the tenants of a running server (or show one as JSON).
    Tenants {
        /// Show only this tenant, in full.
        name: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Make a tenant's candidate (deployed with --percent or --stages) its current version,
    /// serving every client.
    Promote {
        /// The tenant's name.
        tenant: String,
        /// Promote only if the tenant is still at this ETag; default: as read just before.
        #[arg(long, value_name = "ETAG")]
        if_match: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Roll a tenant back: drop its candidate if it has one (its current version then serves
    /// every client), else return to its previous version (a second rollback undoes the
    /// first).
    ///
    /// The rollback is conditional on the tenant as read just before it (If-Match), so it is
    /// never applied twice: to retry one whose answer was lost, pass the ETag it printed.
    Rollback {
        /// The tenant's name.
        tenant: String,
        /// Roll back only if the tenant is still at this ETag (as `tern tenants NAME` shows
        /// it, or as a failed attempt printed it); default: as read just before.
        #[arg(long, value_name = "ETAG")]
        if_match: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Delete a tenant deployed through the admin API (only as it was just read: a tenant
    /// changed meanwhile is not deleted).
    Delete {
        /// The tenant's name.
        tenant: String,
        /// Delete only if the tenant is still at this ETag; default: as read just before.
        #[arg(long, value_name = "ETAG")]
        if_match: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A tenant's cache on a running server (`[tenant.cache]`).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// A tenant's plain variables on a running server (its guests read them through Spin's
    /// variables, wasi:config or a CGI program's environment; the next request sees a change).
    Var {
        #[command(subcommand)]
        action: VarAction,
    },
    /// A tenant's secret variables on a running server: sealed at rest, never shown again
    /// (listed with a digest), read by its guests as variables are.
    Secret {
        #[command(subcommand)]
        action: SecretAction,
    },
    /// Scoped admin tokens on a running server: each reaches some tenants (names or patterns
    /// `team-a-*`) with some scopes (read, deploy, variables, secrets, purge, logs); made,
    /// listed and revoked with the operator's token. A token is shown once and kept only as a
    /// digest.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Manage the certificates a running server's TLS listener serves, kept in its data
    /// directory beside the tenants (config-file certificates are changed in the file).
    Cert {
        #[command(subcommand)]
        action: CertAction,
    },
    /// The registry a fleet of replicas shares on object storage.
    Registry {
        #[command(subcommand)]
        action: RegistryAction,
    },
    /// The admin API's audit log, oldest first: who changed what, from where, when, and how
    /// it ended (refused attempts too; never a token or a variable's value). In a fleet,
    /// every replica's records in time order. Operator's token only.
    Audit {
        /// Only this tenant's records.
        #[arg(long)]
        tenant: Option<String>,
        /// Only the records of the last span: 90s, 30m, 12h, 7d (default: all kept).
        #[arg(long)]
        since: Option<String>,
        /// The last this many records (1 to 10000).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A tenant's schedules ([[tenant.schedule]]): their next times and last runs, a run
    /// now.
    Schedule {
        #[command(subcommand)]
        action: ScheduleAction,
    },
    /// Make a running server re-read its config file (as SIGHUP does).
    Reload {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Compile a .wasm module ahead of time into a sealed .cwasm artifact that `tern serve`
    /// loads by mmap, with the same engine configuration the server uses. The module is
    /// checked against the Tern ABI as a deploy would check it. Use the artifact as a config
    /// file's `module = "x.cwasm"`; `tern deploy` takes the .wasm instead (the server compiles
    /// and caches it itself, and refuses artifacts).
    Compile {
        /// The WebAssembly module to compile.
        input: PathBuf,
        /// Where to write the artifact (written atomically).
        #[arg(short, long)]
        output: PathBuf,
        /// For a server with `[pool] wasi_p3 = true`: WASI 0.3 components compile, and the
        /// artifact matches that server's engine (an artifact made without it is not loaded
        /// there, nor the other way).
        #[arg(long)]
        wasi_p3: bool,
    },
}

/// `tern token ...`.
#[derive(Debug, clap::Subcommand)]
enum TokenAction {
    /// Make a token; it is printed once, alone on the last line (or in the JSON with --json).
    Create {
        /// A tenant it reaches, or a pattern `team-a-*` (repeatable; it may create tenants
        /// only inside its patterns).
        #[arg(long = "tenant", required = true)]
        tenants: Vec<String>,
        /// Its scopes, comma-separated: read, deploy, variables, secrets, purge, logs (every
        /// scope includes read).
        #[arg(long, value_delimiter = ',', required = true)]
        scope: Vec<String>,
        /// Its lifetime: 90s, 30m, 12h, 30d (default: until revoked).
        #[arg(long)]
        expires: Option<String>,
        /// A name for people, e.g. ci-deploy.
        #[arg(long, default_value = "token")]
        name: String,
        /// Print the server's JSON answer (with "token").
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List the tokens: id, name, tenants, scopes, created, last used, expiry (never a
    /// secret).
    List {
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Give a token a new secret (same id, name, tenants and scopes); the old secret is
    /// refused from the next request. The new one is printed once, alone on the last line.
    Rotate {
        /// Its id (`tern token list`).
        id: String,
        /// A new lifetime from now: 90s, 30m, 12h, 30d (default: its expiry stays).
        #[arg(long)]
        expires: Option<String>,
        /// Print the server's JSON answer (with "token").
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Revoke a token by its id: refused from the next request.
    Revoke {
        /// Its id (`tern token list`).
        id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// `tern registry ...`.
#[derive(Debug, clap::Subcommand)]
enum RegistryAction {
    /// Check that an object store keeps the promises a shared registry rests on: a second
    /// create of a name is refused (If-None-Match: *), an update of a changed object is refused
    /// (If-Match), a conditional read of an unchanged one answers 304, and of writers racing to
    /// create or update one object exactly one wins. Writes and removes a few small objects
    /// under the prefix. Credentials and endpoint come from the AWS_* environment variables
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL,
    /// AWS_ALLOW_HTTP=true for a plain-HTTP endpoint). Exits 1 if any check fails.
    Probe {
        /// The store: `s3://bucket[/prefix]`.
        url: String,
    },
}

/// `tern cache ...`.
#[derive(Debug, clap::Subcommand)]
enum CacheAction {
    /// Drop stored answers from a tenant's cache (one of --all, --prefix, --tag), on every
    /// replica of a fleet; the next requests for them run its guest.
    Purge {
        /// The tenant's name.
        tenant: String,
        /// Every stored answer.
        #[arg(long, conflicts_with_all = ["prefixes", "tags"])]
        all: bool,
        /// Answers whose path starts with this (repeat for more), e.g. `/blog/`.
        #[arg(long = "prefix", value_name = "PATH", conflicts_with = "tags")]
        prefixes: Vec<String>,
        /// Answers stored with this tag (`Surrogate-Key` or `Cache-Tag`; repeat for more).
        #[arg(long = "tag", value_name = "TAG")]
        tags: Vec<String>,
        /// Mark them stale instead of dropping them: the next request asks the guest with
        /// their validators, and a `304` keeps the stored body.
        #[arg(long)]
        soft: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// `tern schedule ...`.
#[derive(Debug, clap::Subcommand)]
enum ScheduleAction {
    /// Each schedule of a tenant (or of every tenant that has some): its next time and its
    /// last runs (outcome, status, time, replica), in a fleet whoever ran them.
    List {
        /// The tenant's name; every tenant the token reaches when left out.
        tenant: Option<String>,
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The next five times of a tenant's schedules, or of an expression (--cron, without a
    /// server): check one before you deploy it.
    Next {
        /// The tenant's name (leave out with --cron).
        #[arg(required_unless_present = "cron")]
        tenant: Option<String>,
        /// A cron expression: 5 fields (minute hour day-of-month month day-of-week), 6
        /// (seconds first) or 7 (a year last); L, W, #, names; weekdays 1-7 with Sunday = 1.
        #[arg(long, conflicts_with = "tenant")]
        cron: Option<String>,
        /// The time zone the expression is read in (IANA name: Europe/Berlin); UTC by default.
        #[arg(long, requires = "cron")]
        timezone: Option<String>,
        /// How many times to show.
        #[arg(long, default_value_t = 5)]
        count: usize,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Run one of a tenant's schedules now, on the server asked, and wait for its end (as a
    /// tick would run it; recorded among its runs as one by hand).
    Run {
        /// The tenant's name.
        tenant: String,
        /// The schedule's name (its cron expression when it has no `name`).
        schedule: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// A tenant, on a running server.
#[derive(Debug, clap::Args)]
struct OfTenant {
    /// The tenant's name.
    tenant: String,
    #[command(flatten)]
    admin: AdminArgs,
}

/// One of a tenant's variables, on a running server.
#[derive(Debug, clap::Args)]
struct TenantVariable {
    /// The tenant's name.
    tenant: String,
    /// The variable's name: lower-case letters, digits and `_`, starting with a letter.
    name: String,
    #[command(flatten)]
    admin: AdminArgs,
}

/// `tern var ...`.
#[derive(Debug, clap::Subcommand)]
enum VarAction {
    /// Set a plain variable (shown by `tern var list`; for a value to keep hidden use
    /// `tern secret set`).
    Set {
        #[command(flatten)]
        var: TenantVariable,
        /// Its value.
        value: String,
    },
    /// List a tenant's variables: plain ones with their values, secrets with a digest.
    List(OfTenant),
    /// Delete a variable (plain or secret).
    Delete(TenantVariable),
}

/// `tern secret ...`.
#[derive(Debug, clap::Subcommand)]
enum SecretAction {
    /// Set a secret, its value read from standard input (one final newline dropped) or a
    /// file; never from the command line, where other users and shell history see it.
    Set {
        #[command(flatten)]
        var: TenantVariable,
        /// Read the value from this file instead of standard input.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// List a tenant's secrets: names, digests and when they were set, never values.
    List(OfTenant),
    /// Delete a secret.
    Delete(TenantVariable),
    /// Seal every secret again under the server's current secrets key: the step of a key
    /// rotation after every replica runs with the new key and the old one as
    /// TERN_SECRETS_KEY_PREVIOUS.
    Reseal {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// `tern cert ...`.
#[derive(Debug, clap::Subcommand)]
enum CertAction {
    /// Upload a certificate and its key (PEM), served from the next TLS handshake; replaces
    /// a stored certificate of the same name.
    Put {
        /// A name for it (shown by `tern cert list`, used by `tern cert delete`).
        name: String,
        /// The certificate, then its chain (PEM file).
        #[arg(long)]
        cert: PathBuf,
        /// Its private key (PEM file).
        #[arg(long)]
        key: PathBuf,
        /// A host name it serves, exact or `*.wildcard` (repeat for more); none: the default
        /// certificate, for clients asking for a name no other certificate serves.
        #[arg(long = "host")]
        hosts: Vec<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List every certificate served: config file, uploaded, obtained by ACME.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Remove an uploaded certificate (or an ACME one, which is ordered again if still wanted).
    Delete {
        /// Its name.
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// How the client commands reach the admin API.
#[derive(Debug, clap::Args)]
struct AdminArgs {
    /// The admin listener's URL.
    #[arg(long, env = "TERN_ADMIN_URL", default_value = "http://127.0.0.1:9090")]
    server: String,
    /// The admin token; by default read from <data-dir>/admin-token, which `tern serve` writes.
    #[arg(long, env = "TERN_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The server's data directory (to find the admin token file).
    #[arg(long, env = "TERN_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

impl AdminArgs {
    /// Resolves the server and token, then runs a client command on a small runtime.
    fn run<F>(self, command: impl FnOnce(tern::cli::AdminClient) -> F) -> anyhow::Result<()>
    where
        F: std::future::Future<Output = anyhow::Result<()>>,
    {
        let target = self.target()?;
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(command(target))
    }

    fn target(self) -> anyhow::Result<tern::cli::AdminClient> {
        let dir = self.data_dir.unwrap_or_else(tern::config::default_data_dir);
        tern::cli::AdminClient::resolve(self.server, self.token, &dir)
    }
}

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: tern::allocator::Mimalloc = tern::allocator::Mimalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Log lines wait in a bounded buffer that one thread writes to stderr every few
    // milliseconds: a worker never waits on stderr, and under a flood lines are dropped rather
    // than requests slowed.
    let (writer, _flush_on_exit) = tern::logwriter::start(std::io::stderr());
    let filter = std::env::var("TERN_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "info".into());
    let json = matches!(cli.log_format, LogFormat::Json);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs =
        tern::logwriter::subscriber(&filter, json, ansi, writer.clone()).unwrap_or_else(|e| {
            eprintln!("tern: TERN_LOG={filter:?} is not a log filter ({e}); logging at info");
            tern::logwriter::subscriber("info", json, ansi, writer).expect("a valid filter")
        });
    // (`init` also routes the `log` records of dependencies into these logs.)
    tracing_subscriber::util::SubscriberInitExt::init(logs);
    let result = match cli.command {
        Command::Serve {
            config,
            listen,
            admin_listen,
            data_dir,
            no_demo,
            registry,
            tls_listen,
            tls_cert,
            tls_key,
            http3,
        } => {
            let tls = tls_listen.zip(tls_cert.zip(tls_key));
            let places = Places {
                listen,
                admin_listen,
                data_dir,
                registry,
                http3,
            };
            serve(config, places, no_demo, tls)
        }
        Command::Compile {
            input,
            output,
            wasi_p3,
        } => compile(&input, &output, wasi_p3),
        Command::New { name, kind, lang } => {
            tern::scaffold::create(std::path::Path::new("."), &name, kind, lang).map(|dir| {
                let (build, wasm) = tern::scaffold::build_hint(kind, lang, &name);
                println!(
                    "created {}\n  cd {name} && {build}\n  tern dev {wasm}",
                    dir.display()
                );
            })
        }
        Command::Dev {
            module,
            listen,
            timeout_ms,
            vars,
            secrets,
        } => {
            let variables = tern::dev::DevVariables {
                plain: vars,
                secrets,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(tern::dev::run(&module, listen, timeout_ms, &variables)))
        }
        Command::Deploy { deploy, admin } => {
            admin.run(|t| async move { tern::cli::deploy(&t, &deploy).await })
        }
        Command::Tenants { name, json, admin } => {
            admin.run(|t| async move { tern::cli::tenants(&t, name.as_deref(), json).await })
        }
        Command::Rollback {
            tenant,
            if_match,
            admin,
        } => admin.run(|t| async move { tern::cli::rollback(&t, &tenant, if_match).await }),
        Command::Promote {
            tenant,
            if_match,
            admin,
        } => admin.run(|t| async move { tern::cli::promote(&t, &tenant, if_match).await }),
        Command::Delete {
            tenant,
            if_match,
            admin,
        } => admin.run(|t| async move { tern::cli::delete(&t, &tenant, if_match).await }),
        Command::Cache {
            action:
                CacheAction::Purge {
                    tenant,
                    all,
                    prefixes,
                    tags,
                    soft,
                    admin,
                },
        } => admin.run(|t| async move {
            let purge = tern::cache::Purge {
                all,
                prefixes,
                tags,
                soft,
            };
            tern::cli::cache_purge(&t, &tenant, &purge).await
        }),
        Command::Schedule { action } => {
            match action {
                ScheduleAction::List {
                    tenant,
                    json,
                    admin,
                } => admin.run(|t| async move {
                    tern::cli::schedule_list(&t, tenant.as_deref(), json).await
                }),
                ScheduleAction::Next {
                    tenant,
                    cron,
                    timezone,
                    count,
                    admin,
                } => match (cron, tenant) {
                    (Some(cron), _) => tern::cli::cron_next(&cron, timezone.as_deref(), count),
                    (None, Some(tenant)) => {
                        admin.run(|t| async move { tern::cli::schedule_next(&t, &tenant).await })
                    }
                    (None, None) => Err(anyhow::anyhow!("name a tenant, or give --cron")),
                },
                ScheduleAction::Run {
                    tenant,
                    schedule,
                    admin,
                } => admin
                    .run(|t| async move { tern::cli::schedule_run(&t, &tenant, &schedule).await }),
            }
        }
        Command::Var { action } => match action {
            VarAction::Set { var, value } => set_variable(var, false, || Ok(value)),
            VarAction::List(OfTenant { tenant, admin }) => {
                admin.run(|t| async move { tern::cli::list_variables(&t, &tenant, None).await })
            }
            VarAction::Delete(var) => delete_variable(var),
        },
        Command::Secret { action } => match action {
            SecretAction::Set { var, file } => {
                set_variable(var, true, || tern::cli::read_secret(file.as_deref()))
            }
            SecretAction::List(OfTenant { tenant, admin }) => admin
                .run(|t| async move { tern::cli::list_variables(&t, &tenant, Some(true)).await }),
            SecretAction::Delete(var) => delete_variable(var),
            SecretAction::Reseal { admin } => {
                admin.run(|t| async move { tern::cli::reseal(&t).await })
            }
        },
        Command::Token { action } => match action {
            TokenAction::Create {
                tenants,
                scope,
                expires,
                name,
                json,
                admin,
            } => admin.run(|t| async move {
                let create = tern::cli::TokenCreate {
                    name,
                    tenants,
                    scopes: scope,
                    expires,
                    json,
                };
                tern::cli::create_token(&t, &create).await
            }),
            TokenAction::List { json, admin } => {
                admin.run(|t| async move { tern::cli::list_tokens(&t, json).await })
            }
            TokenAction::Rotate {
                id,
                expires,
                json,
                admin,
            } => admin.run(|t| async move {
                tern::cli::rotate_token(&t, &id, expires.as_deref(), json).await
            }),
            TokenAction::Revoke { id, admin } => {
                admin.run(|t| async move { tern::cli::revoke_token(&t, &id).await })
            }
        },
        Command::Cert { action } => match action {
            CertAction::Put {
                name,
                cert,
                key,
                hosts,
                admin,
            } => admin
                .run(|t| async move { tern::cli::cert_put(&t, &name, &cert, &key, &hosts).await }),
            CertAction::List { json, admin } => {
                admin.run(|t| async move { tern::cli::cert_list(&t, json).await })
            }
            CertAction::Delete { name, admin } => {
                admin.run(|t| async move { tern::cli::cert_delete(&t, &name).await })
            }
        },
        Command::Registry {
            action: RegistryAction::Probe { url },
        } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(tern::cli::registry_probe(&url))),
        Command::Audit {
            tenant,
            since,
            limit,
            json,
            admin,
        } => admin.run(|t| async move {
            let q = tern::cli::AuditQuery {
                tenant,
                since,
                limit,
                json,
            };
            tern::cli::audit(&t, &q).await
        }),
        Command::Reload { admin } => admin.run(|t| async move { tern::cli::reload(&t).await }),
        Command::Logs { logs, admin } => {
            admin.run(|t| async move { tern::cli::logs(&t, &logs).await })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tern: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where `tern serve` listens and keeps its tenants, as given on the command line.
struct Places {
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    registry: Option<String>,
    /// `--http3`.
    http3: bool,
}

/// `tern var delete` / `tern secret delete`.
/// Sets a tenant's variable (`secret`: a secret) to what `value` gives.
fn set_variable(
    var: TenantVariable,
    secret: bool,
    value: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<()> {
    let TenantVariable {
        tenant,
        name,
        admin,
    } = var;
    admin.run(|t| async move {
        let value = value()?;
        tern::cli::set_variable(&t, &tenant, &name, &value, secret).await
    })
}

fn delete_variable(var: TenantVariable) -> anyhow::Result<()> {
    let TenantVariable {
        tenant,
        name,
        admin,
    } = var;
    admin.run(|t| async move { tern::cli::delete_variable(&t, &tenant, &name).await })
}

fn serve(
    config_path: Option<PathBuf>,
    places: Places,
    no_demo: bool,
    tls: Option<(SocketAddr, (PathBuf, PathBuf))>,
) -> anyhow::Result<()> {
    let Places {
        listen,
        admin_listen,
        data_dir,
        registry,
        http3,
    } = places;
    let mut config = match &config_path {
        Some(path) => Config::load(path)?,
        None => Config::demo(),
    };
    if no_demo {
        config.tenants.clear();
    }
    if let Some(a) = listen {
        config.server.listen = Some(a);
    }
    if let Some(a) = admin_listen {
        config.server.admin_listen = a;
    }
    if let Some(url) = registry.filter(|u| !u.is_empty()) {
        config.set_registry(url)?;
    }
    if let Some((at, (cert, key))) = tls {
        config.serve_tls_from_command_line(at, &cert, &key)?;
    }
    if http3 {
        anyhow::ensure!(
            config.server.tls_listen.is_some(),
            "--http3 serves QUIC on the TLS listener's address: give --tls-listen (or set \
             server.tls_listen)"
        );
        config.server.http3 = true;
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    // With per-core workers this runtime only runs the admin listener and signal handling.
    rt.worker_threads(match config.server.runtime {
        tern::config::RuntimeMode::PerCore => 1,
        tern::config::RuntimeMode::Shared => config.server.workers(),
    });
    // Per core, this runtime's thread is not a request worker (those are `tern-worker-N`): its
    // name says so in `top -H` and in per-thread CPU figures (the trace exporter runs here).
    let rt = rt
        .enable_all()
        .thread_name(match config.server.runtime {
            tern::config::RuntimeMode::PerCore => "tern-control",
            tern::config::RuntimeMode::Shared => "tern-worker",
        })
        .build()?;
    rt.block_on(async {
        let opts = tern::server::StartOptions {
            config_path,
            data_dir,
        };
        let running = tern::server::start_with(config, opts).await?;
        running.shutdown.on_signals()?;
        running.reload_on_sighup()?;
        running.wait().await;
        tracing::info!("stopped");
        Ok(())
    })
}

fn compile(input: &std::path::Path, output: &std::path::Path, wasi_p3: bool) -> anyhow::Result<()> {
    let done = tern::tenant::compile_file(input, output, wasi_p3)?;
    eprintln!(
        "compiled {} ({} bytes, kind {}) -> {} ({} bytes) in {:.0} ms",
        input.display(),
        done.wasm_bytes,
        done.kind.name(),
        output.display(),
        done.artifact_bytes,
        done.took.as_secs_f64() * 1e3
    );
    Ok(())
}

/// `NAME=VALUE` of `tern dev --var` / `--secret`.
fn name_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}
