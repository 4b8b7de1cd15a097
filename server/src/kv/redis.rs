//! The shared backend: a Redis (or Valkey) server, one store for every server of a fleet
//! pointed at it.
//!
//! Operations go out on one multiplexed connection per store (the `redis` crate's connection
//! manager: connected on first use, reconnected after a failure, its queue bounded), so a guest
//! waiting for one is suspended and the reactor only moves bytes. A server that cannot be
//! reached fails the operation with `Unavailable` (nothing written); a write sent and never
//! answered (the connection lost, no answer within `timeout_ms`) with `Unknown`: it may have
//! been applied. The next operation tries again.
//!
//! Each tenant's keys live in three Redis keys under the store's prefix, hash-tagged by tenant
//! (one cluster slot): `PREFIX{TENANT}:v`, a hash of its keys and values; `PREFIX{TENANT}:k`, a
//! sorted set of its keys (score 0: listed in bytewise order, a page after a key with
//! `ZRANGEBYLEX`); `PREFIX{TENANT}:b`, the bytes it holds. Reads are single commands; writes
//! are one Lua script (`WRITE`) that checks the tenant's quotas and updates all three
//! atomically, so concurrent replicas never overrun a quota or lose an increment. Values that
//! count are decimal text, as Redis's own `HINCRBY` reads and writes them (exact 64-bit
//! arithmetic, never Lua's floating point).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::config::StoreConfig;
use super::op::{KvError, Op, Reply};

/// Operations that may queue for the connection before a guest's call waits to queue (the
/// SQLite store's queue is as long).
const QUEUE: usize = 1024;

/// Every write, one script: `KEYS` are the tenant's values hash, keys sorted set and bytes
/// counter; `ARGV` the operation, the key, the tenant's limits (keys, bytes) and the
/// operation's own arguments. Answers `{'ok'[, value]}`, `{'no'}` (a compare-and-swap whose
/// value did not match), `{'keys', held}` or `{'bytes', total}` (a quota) or
/// `{'invalid', old value, Redis's error}` (an increment).
const WRITE: &str = r"
local h, z, u = KEYS[1], KEYS[2], KEYS[3]
local op, key = ARGV[1], ARGV[2]
local max_keys, max_bytes = tonumber(ARGV[3]), tonumber(ARGV[4])
local old = redis.call('HGET', h, key)
local function room(keys, bytes)
  if keys > 0 then
    local held = redis.call('HLEN', h)
    if held + keys > max_keys then return {'keys', tostring(held)} end
  end
  if bytes > 0 then
    local held = tonumber(redis.call('GET', u) or '0')
    if held + bytes > max_bytes then return {'bytes', tostring(held + bytes)} end
  end
  return nil
end
local function grow(value)
  if old then return 0, #value - #old end
  return 1, #key + #value
end
local function put(value)
  local keys, bytes = grow(value)
  local full = room(keys, bytes)
  if full then return full end
  redis.call('HSET', h, key, value)
  if keys > 0 then redis.call('ZADD', z, 0, key) end
  if bytes ~= 0 then redis.call('INCRBY', u, bytes) end
  return {'ok'}
end
if op == 'set' then
  return put(ARGV[5])
elseif op == 'delete' then
  if old then
    redis.call('HDEL', h, key)
    redis.call('ZREM', z, key)
    redis.call('INCRBY', u, -(#key + #old))
  end
  return {'ok'}
elseif op == 'cas' then
  if ARGV[5] == 'absent' then
    if old then return {'no'} end
  elseif old ~= ARGV[6] then
    return {'no'}
  end
  return put(ARGV[7])
elseif op == 'incr' then
  if not old then
    local full = room(1, 0)
    if full then return full end
  end
  local r = redis.pcall('HINCRBY', h, key, ARGV[5])
  if type(r) == 'table' and r.err then return {'invalid', old or '', r.err} end
  local new = redis.call('HGET', h, key)
  local keys, bytes = grow(new)
  local full = room(0, bytes)
  if full then
    if old then redis.call('HSET', h, key, old) else redis.call('HDEL', h, key) end
    return full
  end
  if keys > 0 then redis.call('ZADD', z, 0, key) end
  if bytes ~= 0 then redis.call('INCRBY', u, bytes) end
  return {'ok', new}
end
return redis.error_reply('unknown operation ' .. op)
";

/// Whether `url` names a Redis server this build can reach.
///
/// # Errors
/// What is wrong with it.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.starts_with("rediss://") || url.starts_with("valkeys://") {
        return Err(format!(
            "{url:?}: TLS to Redis (rediss://) is not supported: use redis:// on a private \
             network"
        ));
    }
    let client = redis::Client::open(url).map_err(|e| format!("{url:?}: {e}"))?;
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(..) | redis::ConnectionAddr::Unix(_) => Ok(()),
        _ => Err(format!("{url:?}: use redis://HOST:PORT")),
    }
}

/// Whether a command failed after it may have reached the server: no answer in time, or the
/// connection lost while waiting for it. (A refused connection, or an error the server
/// answered, means it was not applied.)
fn sent_unanswered(e: &redis::RedisError) -> bool {
    !refused(e) && (e.is_timeout() || e.is_connection_dropped() || e.is_io_error())
}

/// Whether the connection to the server was refused (nothing was sent). The connection
/// manager hands on a failed reconnection's error as text (its I/O error cannot be cloned),
/// which then says so only in words: the OS's "Connection refused".
fn refused(e: &redis::RedisError) -> bool {
    e.is_connection_refusal() || e.to_string().contains("Connection refused")
}

/// What Redis answered: a read's reply, or a write script's raw reply.
enum Raw {
    Done(Reply),
    Script(Vec<Vec<u8>>),
}

/// One request accounted to a shared rate limit, nginx's `limit_req` arithmetic
/// ([`crate::ratelimit::table`]) on the Redis server's clock: `KEYS[1]` the key's hash of
/// excess (`e`, milli-requests) and last time (`l`, ms); `ARGV` the rate (milli-requests a
/// second), the burst (milli-requests), `1` to charge a request (or `r`: give one back, `n`:
/// give back the one that made the key, which is forgotten unless others were charged to it
/// since) and how long the key lives (ms, until it has drained). Answers the key's excess
/// with this request (stored if it is within the burst) and `1` if the key was new; a refund
/// answers `{0, 0}`.
const LEAKY_BUCKET: &str = r"
local rate, burst, commit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
if commit == 'n' or commit == 'r' then
  local e = redis.call('HGET', KEYS[1], 'e')
  if commit == 'n' and e and tonumber(e) == 0 then
    redis.call('DEL', KEYS[1])
  elseif e then
    e = math.max(tonumber(e) - 1000, 0)
    redis.call('HSET', KEYS[1], 'e', string.format('%d', e))
  end
  return {0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HMGET', KEYS[1], 'e', 'l')
local excess, last, new = 0, now, 1
if v[1] then
  new = 0
  local e, l = tonumber(v[1]), tonumber(v[2])
  local drained = math.floor(rate * math.max(now - l, 0) / 1000)
  excess = math.max(e + 1000 - drained, 0)
  last = math.max(now, l)
end
if excess <= burst then
  redis.call('HSET', KEYS[1], 'e', string.format('%d', excess), 'l', string.format('%d', last))
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {excess, new}
";

/// A compare-and-swap of one value (`KEYS[1]`): set to `ARGV[2]` if it holds `ARGV[1]` (its
/// bytes; an empty `ARGV[1]`: if it does not exist). Answers `1` when it was set, `0` when the
/// value was another.
const SWAP: &str = r"
local now = redis.call('GET', KEYS[1])
if (now == false and ARGV[1] == '') or now == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// A store on a Redis server.
pub struct Redis {
    name: String,
    client: redis::Client,
    timeout: Duration,
    prefix: String,
    max_keys: u64,
    max_bytes: u64,
    script: redis::Script,
    leaky_bucket: redis::Script,
    swap: redis::Script,
    /// Made on first use (it needs the runtime); it connects and reconnects by itself.
    conn: OnceLock<Result<ConnectionManager, String>>,
}

impl Redis {
    /// The store `name` on the server of `config.url` (not connected until first used).
    /// `Stores::open` has checked `config` first (the URL with [`check_url`]).
    ///
    /// # Errors
    /// A URL that is not a Redis server's.
    pub fn new(name: &str, config: &StoreConfig) -> Result<Self, String> {
        let url = config.url.as_deref().unwrap_or_default();
        let client = redis::Client::open(url).map_err(|e| format!("kv.{name}.url: {e}"))?;
        Ok(Self {
            name: name.to_string(),
            client,
            timeout: Duration::from_millis(config.timeout_ms),
            prefix: config
                .prefix
                .clone()
                .unwrap_or_else(|| format!("tern:{name}:")),
            max_keys: config.max_keys_per_tenant,
            max_bytes: config.max_bytes_per_tenant,
            script: redis::Script::new(WRITE),
            leaky_bucket: redis::Script::new(LEAKY_BUCKET),
            swap: redis::Script::new(SWAP),
            conn: OnceLock::new(),
        })
    }

    fn connection(&self) -> Result<ConnectionManager, KvError> {
        let conn = self.conn.get_or_init(|| {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout))
                // One quick retry: a guest waits for the server at most a few timeouts, and
                // the next operation starts a new attempt.
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(100))
                .set_pipeline_buffer_size(QUEUE)
                .set_concurrency_limit(QUEUE);
            ConnectionManager::new_lazy_with_config(self.client.clone(), config)
                .map_err(|e| e.to_string())
        });
        conn.clone().map_err(|e| self.unavailable(&e))
    }

    fn unavailable(&self, why: &dyn std::fmt::Display) -> KvError {
        KvError::Unavailable(format!("key-value store {:?} (Redis): {why}", self.name))
    }

    /// Runs `op` on `tenant`'s keys.
    ///
    /// A call the server never received is tried once more: after Redis comes back, the
    /// connection's last (refused) reconnection is what the first call meets, and trying again
    /// reconnects. A read is also tried again after the connection dropped; a write is not
    /// (it may have been applied).
    ///
    /// # Errors
    /// [`KvError`]: a limit, an invalid value, or the server failing or not answering.
    pub async fn run(&self, tenant: &Arc<str>, op: Op) -> Result<Reply, KvError> {
        let mut conn = self.connection()?;
        let base = format!("{}{{{tenant}}}:", self.prefix);
        let read = matches!(op, Op::Get(_) | Op::Exists(_) | Op::List { .. });
        let reply = match self.attempt(&mut conn, &base, &op).await {
            Err(e) if refused(&e) || (read && e.is_connection_dropped()) => {
                self.attempt(&mut conn, &base, &op).await
            }
            reply => reply,
        };
        match reply {
            Ok(Raw::Done(a)) => Ok(a),
            Ok(Raw::Script(reply)) => self.answer(&op, reply),
            // A write that may have reached the server: it says so, so that a guest can tell
            // it from one refused before it was sent.
            Err(e) if !read && sent_unanswered(&e) => Err(KvError::Unknown(format!(
                "outcome unknown: the write was sent to key-value store {:?} (Redis) and no \
                 answer came ({}): it may have been applied",
                self.name,
                if e.is_timeout() {
                    format!("none within {} ms (timeout_ms)", self.timeout.as_millis())
                } else {
                    e.to_string()
                }
            ))),
            Err(e) if e.is_timeout() => Err(self.unavailable(&format_args!(
                "no answer within {} ms (timeout_ms)",
                self.timeout.as_millis()
            ))),
            Err(e) => Err(self.unavailable(&e)),
        }
    }

    /// Accounts one request of a shared rate limit's key `key` (under the store's prefix):
    /// its excess with this request, in milli-requests, and whether the key was new (see
    /// [`LEAKY_BUCKET`]); with `refund` (whether the request made the key), gives one back
    /// instead.
    ///
    /// # Errors
    /// The server failing or not answering, in words for the log.
    pub async fn leaky_bucket(
        &self,
        key: &str,
        rate: u64,
        burst: u64,
        refund: Option<bool>,
    ) -> Result<(u64, bool), String> {
        let mut conn = self.connection().map_err(|e| e.to_string())?;
        // Until a key has drained all it can hold, a second past it.
        let ttl_ms = (burst + 1000).saturating_mul(1000) / rate.max(1) + 1000;
        let mut call = self.leaky_bucket.prepare_invoke();
        call.key(format!("{}{key}", self.prefix))
            .arg(rate)
            .arg(burst)
            .arg(match refund {
                None => "1",
                Some(false) => "r",
                Some(true) => "n",
            })
            .arg(ttl_ms);
        let answer = match call.invoke_async(&mut conn).await {
            Err(e) if refused(&e) => call.invoke_async(&mut conn).await,
            answer => answer,
        };
        answer
            .map(|(excess, new): (u64, u8)| (excess, new == 1))
            .map_err(|e: redis::RedisError| self.said(&e))
    }

    /// The value of the server's own key `key` (under the store's prefix; none of a tenant's),
    /// if it has one.
    ///
    /// # Errors
    /// The server failing or not answering, in words for the log.
    pub async fn get_own(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let mut conn = self.connection().map_err(|e| e.to_string())?;
        let key = format!("{}{key}", self.prefix);
        let answer: redis::RedisResult<Option<Vec<u8>>> =
            match redis::cmd("GET").arg(&key).query_async(&mut conn).await {
                Err(e) if refused(&e) || e.is_connection_dropped() => {
                    redis::cmd("GET").arg(&key).query_async(&mut conn).await
                }
                answer => answer,
            };
        answer.map_err(|e| self.said(&e))
    }

    /// Sets the server's own key `key` to `new` if it holds `expected` (`None`: if it has
    /// none): whether it did.
    ///
    /// # Errors
    /// The server failing or not answering (a swap sent and not answered may have been
    /// applied), in words for the log.
    pub async fn swap_own(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<bool, String> {
        let mut conn = self.connection().map_err(|e| e.to_string())?;
        let mut call = self.swap.prepare_invoke();
        call.key(format!("{}{key}", self.prefix))
            .arg(expected.unwrap_or_default())
            .arg(new);
        let answer = match call.invoke_async(&mut conn).await {
            Err(e) if refused(&e) => call.invoke_async(&mut conn).await,
            answer => answer,
        };
        answer.map(|set: u8| set == 1).map_err(|e| self.said(&e))
    }

    /// The server's own keys that start with `dir` (without the store's prefix; `dir` holds
    /// no glob characters).
    ///
    /// # Errors
    /// The server failing or not answering, in words for the log.
    pub async fn own_keys_under(&self, dir: &str) -> Result<Vec<String>, String> {
        let mut conn = self.connection().map_err(|e| e.to_string())?;
        let pattern = format!("{}{dir}*", self.prefix);
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(100)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.said(&e))?;
            keys.extend(batch.into_iter().filter_map(|k| {
                let k = String::from_utf8(k).ok()?;
                Some(k.strip_prefix(self.prefix.as_str())?.to_string())
            }));
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// A failure of the server's own keys, in words.
    fn said(&self, e: &redis::RedisError) -> String {
        if e.is_timeout() {
            format!(
                "Redis store {:?}: no answer within {} ms (timeout_ms)",
                self.name,
                self.timeout.as_millis()
            )
        } else {
            format!("Redis store {:?}: {e}", self.name)
        }
    }

    /// Sends `op` for the tenant whose Redis keys start with `base`.
    async fn attempt(
        &self,
        conn: &mut ConnectionManager,
        base: &str,
        op: &Op,
    ) -> redis::RedisResult<Raw> {
        let values = format!("{base}v");
        let write = |op: &str, key: &[u8]| {
            let mut call = self.script.prepare_invoke();
            call.key(&values)
                .key(format!("{base}k"))
                .key(format!("{base}b"))
                .arg(op)
                .arg(key)
                .arg(self.max_keys)
                .arg(self.max_bytes);
            call
        };
        // A read of one key's field in the values hash.
        let field = |command: &str, key: &[u8]| {
            let mut call = redis::cmd(command);
            call.arg(&values).arg(key);
            call
        };
        Ok(match op {
            Op::Forget => {
                let keys = [values.clone(), format!("{base}k"), format!("{base}b")];
                let () = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
                Raw::Done(Reply::Done)
            }
            Op::Get(key) => Raw::Done(Reply::Value(field("HGET", key).query_async(conn).await?)),
            Op::Exists(key) => {
                Raw::Done(Reply::Bool(field("HEXISTS", key).query_async(conn).await?))
            }
            Op::List { after, limit } => {
                let from = match after {
                    Some(k) => [b"(".as_slice(), k].concat(),
                    None => b"-".to_vec(),
                };
                Raw::Done(Reply::Keys(
                    redis::cmd("ZRANGEBYLEX")
                        .arg(format!("{base}k"))
                        .arg(from)
                        .arg("+")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(*limit)
                        .query_async(conn)
                        .await?,
                ))
            }
            Op::Set(key, value) => {
                Raw::Script(write("set", key).arg(value).invoke_async(conn).await?)
            }
            Op::Delete(key) => Raw::Script(write("delete", key).invoke_async(conn).await?),
            Op::Increment(key, delta) => {
                Raw::Script(write("incr", key).arg(*delta).invoke_async(conn).await?)
            }
            Op::CompareAndSwap { key, expected, new } => {
                let mut call = write("cas", key);
                match expected {
                    None => call.arg("absent").arg(""),
                    Some(v) => call.arg("value").arg(v),
                };
                Raw::Script(call.arg(new).invoke_async(conn).await?)
            }
        })
    }

    /// The script's reply to `op` as an answer.
    fn answer(&self, op: &Op, reply: Vec<Vec<u8>>) -> Result<Reply, KvError> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match reply.first().map(Vec::as_slice) {
            Some(b"ok") => Ok(match op {
                Op::Increment(..) => {
                    let n = reply.get(1).and_then(|v| std::str::from_utf8(v).ok());
                    Reply::Integer(n.and_then(|n| n.parse().ok()).ok_or_else(|| {
                        self.unavailable(&format_args!("the increment answered {reply:?}"))
                    })?)
                }
                Op::CompareAndSwap { .. } => Reply::Bool(true),
                _ => Reply::Done,
            }),
            Some(b"no") => Ok(Reply::Bool(false)),
            Some(b"keys") => Err(KvError::Limit(format!(
                "the tenant holds {} keys in store {:?}, its max_keys_per_tenant",
                reply.get(1).map(|v| text(v)).unwrap_or_default(),
                self.name
            ))),
            Some(b"bytes") => Err(KvError::Limit(format!(
                "the tenant would hold {} bytes in store {:?}, over its max_bytes_per_tenant ({})",
                reply.get(1).map(|v| text(v)).unwrap_or_default(),
                self.name,
                self.max_bytes
            ))),
            Some(b"invalid") => {
                let why = reply.get(2).map(|v| text(v)).unwrap_or_default();
                Err(KvError::Invalid(match op {
                    Op::Increment(_, delta) if why.contains("overflow") => format!(
                        "increment: {} + {delta} overflows a 64-bit integer",
                        reply.get(1).map(|v| text(v)).unwrap_or_default()
                    ),
                    _ => "increment: the key's value is not a decimal 64-bit integer".into(),
                }))
            }
            _ => Err(self.unavailable(&format_args!("the store answered {reply:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::{Read, Write};
    use std::process::{Child, Command};

    use super::*;
    use crate::kv::{Backend, Store, Stores, conformance};

    /// A real `redis-server` on 127.0.0.1 (Debian's; `bash scripts/test` installs it), nothing
    /// saved to disk.
    struct Server {
        child: Child,
        port: u16,
        dir: tempfile::TempDir,
    }

    impl Server {
        fn start() -> Self {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let dir = tempfile::tempdir().expect("tempdir");
            let child = Self::spawn(port, &dir);
            Self { child, port, dir }
        }

        fn spawn(port: u16, dir: &tempfile::TempDir) -> Child {
            let mut child = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no", "--dir"])
                .arg(dir.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server (apt-get install redis-server; bash scripts/test does)");
            for _ in 0..200 {
                if ping(port) {
                    return child;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-server did not answer on port {port}");
        }

        fn stop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }

        fn restart(&mut self) {
            self.stop();
            self.child = Self::spawn(self.port, &self.dir);
        }

        fn signal(&self, signal: &str) {
            let status = Command::new("kill")
                .args([signal, &self.child.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success());
        }

        fn store(&self, config: StoreConfig) -> Arc<Store> {
            let config = StoreConfig {
                backend: Backend::Redis,
                url: Some(format!("redis://127.0.0.1:{}", self.port)),
                ..config
            };
            let configs = BTreeMap::from([("s".to_string(), config)]);
            let counter = prometheus::IntCounterVec::new(
                prometheus::Opts::new("ops", "ops"),
                &["store", "result"],
            )
            .expect("metric");
            let stores = Stores::open(&configs, std::path::Path::new("/nonexistent"), &counter)
                .expect("stores");
            stores.get("s").expect("store").clone()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.stop();
        }
    }

    fn ping(port: u16) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn operations_tenants_and_limits() {
        let server = Server::start();
        let s = server.store(StoreConfig {
            max_keys_per_tenant: 2,
            max_bytes_per_tenant: 20,
            max_key_bytes: 4,
            max_value_bytes: 8,
            ..StoreConfig::default()
        });
        rt().block_on(conformance::operations(&s));
    }

    #[test]
    fn parallel_increments_all_count() {
        let server = Server::start();
        let s = server.store(StoreConfig::default());
        rt().block_on(conformance::parallel_increments(s));
    }

    /// What Redis could get wrong where SQLite does not: 64-bit integers past a double's
    /// precision, binary keys and values, listing in bytewise order, and replicas (two stores
    /// on one server) sharing keys and quotas.
    #[test]
    fn integers_bytes_order_and_replicas() {
        let server = Server::start();
        let config = StoreConfig {
            max_keys_per_tenant: 5,
            ..StoreConfig::default()
        };
        let (one, two) = (server.store(config.clone()), server.store(config));
        let t: Arc<str> = "t".into();
        rt().block_on(async {
            let big = i64::MAX - 1;
            let set = Op::Set(b"n".to_vec(), (big - 1).to_string().into_bytes());
            one.run(&t, set).await.expect("set");
            let got = one.run(&t, Op::Increment(b"n".to_vec(), 1)).await;
            assert_eq!(got.expect("increment"), Reply::Integer(big));
            let got = two.run(&t, Op::Increment(b"n".to_vec(), 1)).await;
            assert_eq!(got.expect("increment"), Reply::Integer(i64::MAX));
            match one.run(&t, Op::Increment(b"n".to_vec(), 1)).await {
                Err(KvError::Invalid(m)) => {
                    assert!(m.contains("9223372036854775807 + 1 overflows"), "{m}");
                }
                other => panic!("{other:?}"),
            }
            let got = one.run(&t, Op::Get(b"n".to_vec())).await.expect("get");
            assert_eq!(got, Reply::Value(Some(i64::MAX.to_string().into_bytes())));

            let odd: &[&[u8]] = &[b"a\xff", b"a\x00b", b"a"];
            for k in odd {
                let op = Op::Set(k.to_vec(), [k, &b"\x00\xfe"[..]].concat());
                one.run(&t, op).await.expect("set");
            }
            let got = two.run(&t, Op::Get(b"a\x00b".to_vec())).await.expect("get");
            assert_eq!(got, Reply::Value(Some(b"a\x00b\x00\xfe".to_vec())));
            let list = |after: Option<&[u8]>| Op::List {
                after: after.map(<[u8]>::to_vec),
                limit: 10,
            };
            let want: Vec<Vec<u8>> = vec![
                b"a".to_vec(),
                b"a\x00b".to_vec(),
                b"a\xff".to_vec(),
                b"n".to_vec(),
            ];
            assert_eq!(
                two.run(&t, list(None)).await.expect("list"),
                Reply::Keys(want.clone())
            );
            let got = two.run(&t, list(Some(b"a\x00b"))).await.expect("list");
            assert_eq!(got, Reply::Keys(want[2..].to_vec()));

            // Five keys per tenant, counted across both replicas.
            two.run(&t, Op::Set(b"e".to_vec(), b"1".to_vec()))
                .await
                .expect("fifth key");
            match one.run(&t, Op::Set(b"f".to_vec(), b"1".to_vec())).await {
                Err(KvError::Limit(m)) => assert!(m.contains("holds 5 keys"), "{m}"),
                other => panic!("{other:?}"),
            }
            // An increment of a new key is a new key too: refused, and nothing left behind.
            match two.run(&t, Op::Increment(b"g".to_vec(), 1)).await {
                Err(KvError::Limit(m)) => assert!(m.contains("max_keys_per_tenant"), "{m}"),
                other => panic!("{other:?}"),
            }
            let got = one
                .run(&t, Op::Exists(b"g".to_vec()))
                .await
                .expect("exists");
            assert_eq!(got, Reply::Bool(false));
            one.run(&t, Op::Delete(b"e".to_vec()))
                .await
                .expect("delete");
            two.run(&t, Op::Increment(b"g".to_vec(), 1))
                .await
                .expect("room again");
        });
    }

    /// A server that stops answering fails a write with `Unknown` within the timeout (never a
    /// hung guest): it was sent, and it is applied when the server goes on. A server that is
    /// gone fails operations with `Unavailable`; once it is back the store works again by
    /// itself.
    #[test]
    fn a_server_down_or_silent_fails_operations_and_is_used_again_when_back() {
        let mut server = Server::start();
        let s = server.store(StoreConfig {
            timeout_ms: 300,
            ..StoreConfig::default()
        });
        let t: Arc<str> = "t".into();
        let rt = rt();
        let set = |v: &str| Op::Set(b"k".to_vec(), v.as_bytes().to_vec());
        rt.block_on(s.run(&t, set("1"))).expect("set");

        server.signal("-STOP");
        let started = std::time::Instant::now();
        match rt.block_on(s.run(&t, set("2"))) {
            Err(KvError::Unknown(m)) => {
                assert!(
                    m.contains("\"s\" (Redis)")
                        && m.contains("300 ms")
                        && m.contains("may have been applied"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        server.signal("-CONT");
        // The write the guest was told may have been applied was.
        let got = rt.block_on(s.run(&t, Op::Get(b"k".to_vec()))).expect("get");
        assert_eq!(got, Reply::Value(Some(b"2".to_vec())));

        server.stop();
        match rt.block_on(s.run(&t, Op::Get(b"k".to_vec()))) {
            Err(KvError::Unavailable(m)) => assert!(m.contains("(Redis)"), "{m}"),
            other => panic!("{other:?}"),
        }
        // Back (empty: it saved nothing): the first operation reconnects and succeeds.
        server.restart();
        assert_eq!(rt.block_on(s.run(&t, set("3"))).expect("set"), Reply::Done);
        let got = rt.block_on(s.run(&t, Op::Get(b"k".to_vec()))).expect("get");
        assert_eq!(got, Reply::Value(Some(b"3".to_vec())));
    }
}
