//! Tern as a process of its own: `tern serve` (with its log lines) and `tern dev`.

use std::net::SocketAddr;
use std::path::Path;

use super::*;

/// The `tern` binary built with these tests.
pub fn tern_bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_tern"))
}

/// A `tern serve` process and the lines of its log.
pub struct TernProcess {
    pub child: std::process::Child,
    pub log: std::sync::mpsc::Receiver<String>,
    /// The public address it announced.
    pub addr: String,
    /// The admin address it announced.
    pub admin: String,
    /// The HTTPS address it announced, if it serves HTTPS.
    pub tls: Option<String>,
    /// Every log line read so far (by [`Self::wait_for`]).
    pub lines: std::cell::RefCell<Vec<String>>,
}

impl TernProcess {
    /// Starts `tern serve` with `args` (plus ephemeral ports) and waits until it listens.
    pub fn serve(args: &[&str], cache: &Path) -> Self {
        Self::serve_with(args, cache, |_| {})
    }

    /// [`Self::serve`] with more settings of the command (`env`: a shared registry's).
    pub fn serve_with(
        args: &[&str],
        cache: &Path,
        env: impl FnOnce(&mut std::process::Command),
    ) -> Self {
        Self::launch(tern_bin(), args, cache, env)
    }

    /// [`Self::serve_with`] in a process that may open at most `limit` files (soft and hard).
    pub fn serve_with_open_files(
        limit: usize,
        args: &[&str],
        cache: &Path,
        env: impl FnOnce(&mut std::process::Command),
    ) -> Self {
        let mut sh = std::process::Command::new("sh");
        sh.arg("-c")
            .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_tern"));
        Self::launch(sh, args, cache, env)
    }

    fn launch(
        mut cmd: std::process::Command,
        args: &[&str],
        cache: &Path,
        env: impl FnOnce(&mut std::process::Command),
    ) -> Self {
        use std::io::BufRead;
        cmd.arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env("TERN_CACHE_DIR", cache)
            .env("TERN_DATA_DIR", cache.join("data"))
            .env_remove("TERN_ADMIN_TOKEN")
            .env("TERN_LOG", "info")
            .stderr(std::process::Stdio::piped());
        env(&mut cmd);
        let mut child = cmd.spawn().expect("start tern");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut p = Self {
            child,
            log,
            addr: String::new(),
            admin: String::new(),
            tls: None,
            lines: std::cell::RefCell::default(),
        };
        let line = p.wait_for("serving tenants on http://");
        p.addr = line
            .split("serving tenants on http://")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .expect("address in log")
            .to_string();
        p.tls = line
            .split(", https://")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .map(str::to_string);
        p.admin = line
            .split("metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .expect("admin address in log")
            .to_string();
        p
    }

    /// Its metrics, as the admin listener serves them (a blocking GET).
    pub fn metrics(&self) -> String {
        let reply = raw_exchange(
            self.admin.parse().expect("the admin address"),
            b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            std::time::Duration::from_secs(20),
        );
        String::from_utf8_lossy(&reply).into_owned()
    }

    /// Waits until the series `series` of its metrics is `at_least` (panics after 20 s).
    pub fn wait_metric(&self, series: &str, at_least: f64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let m = self.metrics();
            if metric_value_or_zero(&m, series) >= at_least {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{series} never reached {at_least}: {m}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The next log line containing `needle` (panics after 20 s, or if the process exits).
    pub fn wait_for(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    self.lines.borrow_mut().push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no log line with {needle:?}: {e}; its log so far:\n{}",
                    self.lines.borrow().join("\n")
                ),
            }
        }
    }

    /// A line containing `needle` among those read so far.
    pub fn logged(&self, needle: &str) -> Option<String> {
        self.lines
            .borrow()
            .iter()
            .find(|l| l.contains(needle))
            .cloned()
    }
}

impl Drop for TernProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `tern dev FILE.wasm` process and the lines of its output.
pub struct TernDev {
    child: std::process::Child,
    log: std::sync::mpsc::Receiver<String>,
    /// Where it serves.
    pub addr: SocketAddr,
}

impl TernDev {
    /// Starts `tern dev module` on an ephemeral port and waits until it serves.
    pub fn start(module: &Path, cache: &Path) -> Self {
        Self::start_with(module, cache, &[], &[])
    }

    /// [`Self::start`] with more arguments and environment variables.
    pub fn start_with(module: &Path, cache: &Path, args: &[&str], envs: &[(&str, &str)]) -> Self {
        use std::io::BufRead;
        let mut child = tern_bin()
            .args(["dev", module.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(args)
            .env("TERN_CACHE_DIR", cache)
            .env("TERN_LOG", "info")
            .envs(envs.iter().copied())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start tern dev");
        let (tx, log) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let mut dev = Self {
            child,
            log,
            addr: "127.0.0.1:0".parse().unwrap(),
        };
        // Serving follows the first compile: minutes for a JavaScript component on a busy
        // 2-core machine.
        let line = dev.wait_within("tern dev: serving", std::time::Duration::from_secs(300));
        dev.addr = line
            .split("at http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .and_then(|a| a.parse().ok())
            .expect("address in the output");
        dev
    }

    /// The next output line containing `needle` (panics after 30 s).
    pub fn wait_for(&self, needle: &str) -> String {
        self.wait_within(needle, std::time::Duration::from_secs(30))
    }

    /// The next output line containing `needle` (panics after `within`).
    pub fn wait_within(&self, needle: &str, within: std::time::Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let line = self
                .log
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                .unwrap_or_else(|e| panic!("no {needle:?} in the output: {e}"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// A GET of `path` on a new connection: the raw reply.
    pub fn get(&self, path: &str) -> String {
        let reply = raw_exchange(
            self.addr,
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
            std::time::Duration::from_secs(20),
        );
        String::from_utf8_lossy(&reply).into_owned()
    }
}

impl TernDev {
    /// Stops it as Ctrl-C does (SIGTERM: its log is flushed and its temporary directory
    /// removed), killing it if it is still running 10 s later.
    fn terminate(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops it ([`Self::terminate`]); every output line not read yet.
    pub fn stop(mut self) -> Vec<String> {
        self.terminate();
        let mut lines = Vec::new();
        while let Ok(line) = self.log.recv_timeout(std::time::Duration::from_secs(5)) {
            lines.push(line);
        }
        lines
    }
}

impl Drop for TernDev {
    fn drop(&mut self) {
        self.terminate();
    }
}
