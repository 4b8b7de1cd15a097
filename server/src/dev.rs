//! `tern dev FILE.wasm`: one module served at `/` on a local port, no config file and no admin
//! token to handle (the admin listener is on a random port, its token in a temporary data
//! directory removed at exit), rebuilt into the server whenever the file changes, with the guest's stderr (a panic's
//! message) in error responses and its output in the terminal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::config::Config;

/// How often the module file is looked at.
const POLL: Duration = Duration::from_millis(250);

/// The variables `tern dev` gives its guest (`--var`, `--secret`).
#[derive(Debug, Default, Clone)]
pub struct DevVariables {
    /// Plain: (name, value).
    pub plain: Vec<(String, String)>,
    /// Secrets: (name, the environment variable of `tern dev` holding the value). Only the
    /// environment variable's name is written in the generated config.
    pub secrets: Vec<(String, String)>,
}

/// The config `tern dev` serves `module` with (written as a file: a reload reads it again).
/// Built as TOML values, so any path is quoted as TOML quotes it.
fn config_text(
    module: &Path,
    listen: SocketAddr,
    timeout_ms: u64,
    variables: &DevVariables,
) -> String {
    let timeout_ms = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
    let mut config = toml::toml! {
        [server]
        listen = (listen.to_string())
        admin_listen = "127.0.0.1:0"
        [pool]
        instances = 16
        [[tenant]]
        name = "dev"
        module = (module.display().to_string())
        errors = "dev"
        [tenant.limits]
        timeout_ms = (timeout_ms)
        log_lines_per_sec = 1000
    };
    let mut declared = toml::Table::new();
    for (name, value) in &variables.plain {
        declared.insert(name.clone(), toml::Value::String(value.clone()));
    }
    for (name, var) in &variables.secrets {
        let mut from = toml::Table::new();
        from.insert("secret_env".into(), toml::Value::String(var.clone()));
        declared.insert(name.clone(), toml::Value::Table(from));
    }
    if !declared.is_empty()
        && let Some(toml::Value::Array(tenants)) = config.get_mut("tenant")
        && let Some(toml::Value::Table(tenant)) = tenants.first_mut()
    {
        tenant.insert("variables".into(), toml::Value::Table(declared));
    }
    toml::to_string(&config).expect("a TOML table serializes")
}

/// What identifies a version of the file: its modification time and size.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Serves `module` at `http://listen/` until Ctrl-C, reloading it when the file changes.
///
/// # Errors
/// If the module cannot be read or loaded at start, or the server cannot start.
pub async fn run(
    module: &Path,
    listen: SocketAddr,
    timeout_ms: u64,
    variables: &DevVariables,
) -> anyhow::Result<()> {
    let module: PathBuf = module
        .canonicalize()
        .with_context(|| format!("cannot read {}", module.display()))?;
    // Taken before the module is loaded: a change made while the server starts (a build
    // finishing) is a change, even if the watcher starts late on a busy machine (it was taken
    // by the watcher itself, which could miss a write made right after the "serving" line).
    let mut seen = stamp(&module);
    let dir = tempfile_dir()?;
    let path = dir.join("tern-dev.toml");
    std::fs::write(&path, config_text(&module, listen, timeout_ms, variables))?;
    let config = Config::load(&path)?;
    let opts = crate::server::StartOptions {
        config_path: Some(path),
        data_dir: Some(dir.join("data")),
    };
    let running = crate::server::start_with(config, opts).await?;
    running.shutdown.on_signals()?;
    eprintln!(
        "tern dev: serving {} at http://{}/ (reloads when the file changes; Ctrl-C stops)",
        module.display(),
        running.addr.expect("tern dev listens in cleartext")
    );
    let app = running.app.clone();
    let shutdown = running.shutdown.clone();
    let watch = tokio::spawn(async move {
        loop {
            if !shutdown.sleep(POLL).await {
                return;
            }
            let now = stamp(&module);
            if now == seen || now.is_none() {
                continue;
            }
            // Wait for the writer (a build) to finish: the same stamp twice in a row.
            tokio::time::sleep(POLL).await;
            if stamp(&module) != now {
                continue;
            }
            seen = now;
            let started = std::time::Instant::now();
            match app.reload().await {
                Ok(_) => eprintln!(
                    "tern dev: reloaded {} in {:.0} ms",
                    module.display(),
                    started.elapsed().as_secs_f64() * 1e3
                ),
                Err(e) => eprintln!(
                    "tern dev: {} was not loaded, the previous version keeps serving: {e}",
                    module.display()
                ),
            }
        }
    });
    running.wait().await;
    watch.abort();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A fresh private directory for the generated config and data.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("tern-dev-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_holds_any_path() {
        let module = Path::new("/tmp/a \"b\"\\c\u{1b}\u{e9}.wasm");
        let variables = DevVariables {
            plain: vec![("region".into(), "eu \"west\"".into())],
            secrets: vec![("api_key".into(), "API_KEY".into())],
        };
        let text = config_text(module, "127.0.0.1:0".parse().unwrap(), 1234, &variables);
        let config = Config::parse(&text, "tern-dev.toml", PathBuf::from("/")).expect(&text);
        let t = &config.tenants[0];
        assert_eq!(t.module.get_ref(), &module.display().to_string());
        assert_eq!(t.settings.limits.timeout_ms, 1234);
        assert_eq!(config.server.admin_listen.port(), 0);
        assert_eq!(
            t.variables["region"],
            crate::variables::Declared::Plain("eu \"west\"".into())
        );
        assert!(matches!(
            &t.variables["api_key"],
            crate::variables::Declared::Secret(from) if from.secret_env.as_deref() == Some("API_KEY")
        ));
    }
}
