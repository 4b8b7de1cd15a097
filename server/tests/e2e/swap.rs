//! Zero state whatever the kernel does with the pages: a guest's memory that was swapped out
//! while it ran, or dirtied in many scattered pieces, never reaches the next guest of its slot.
//!
//! The swap test needs root and a swap area: it makes a swap file under the target directory,
//! switches it on, and pushes the live guest's pages out with `MADV_PAGEOUT`. Where swap cannot
//! be switched on it fails, saying why; leave it out by name there (`-- --skip swap`).
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use http::StatusCode;

use crate::support::{Conn, TernProcess, TestServer, metric_value, test_component, wat_file};

/// Swap is machine-wide: the tests that switch it on or need it off take turns.
static SWAP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The secret: every byte of 512 KiB of a guest's heap.
const SECRET: u8 = 0xA5;
const SECRET_BYTES: u32 = 512 * 1024;

/// Grows to 24 pages (1.5 MiB), answers how many secret bytes it finds there (4 bytes, little
/// endian), then fills [512 KiB, 1 MiB) with the secret and reads its whole request body before
/// it ends: a client that holds the body back holds the secret in a live guest.
fn keeper() -> String {
    format!(
        r#"(module
  (import "tern" "request_body_read" (func $read (param i32 i32) (result i32)))
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  {COUNT}
  (func (export "_start")
    (drop (memory.grow (i32.const 23)))
    (i32.store (i32.const 0) (call $count))
    (memory.fill (i32.const 524288) (i32.const 0xA5) (i32.const 524288))
    (loop $more (br_if $more (i32.gt_s (call $read (i32.const 16) (i32.const 32)) (i32.const 0))))
    (drop (call $write (i32.const 0) (i32.const 4)))))"#,
        COUNT = count_fn(SECRET, 64)
    )
}

/// Another module: grows to 24 pages and answers how many secret bytes it finds.
fn seeker() -> String {
    format!(
        r#"(module
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  {COUNT}
  (func (export "_start")
    (drop (memory.grow (i32.const 23)))
    (i32.store (i32.const 0) (call $count))
    (drop (call $write (i32.const 0) (i32.const 4)))))"#,
        COUNT = count_fn(SECRET, 64)
    )
}

/// WAT for `$count`: how many bytes equal `byte` in `[from, 1.5 MiB)`.
fn count_fn(byte: u8, from: u32) -> String {
    format!(
        r#"(func $count (result i32) (local $i i32) (local $n i32)
    (local.set $i (i32.const {from}))
    (block $done (loop $scan
      (br_if $done (i32.ge_u (local.get $i) (i32.const 1572864)))
      (if (i32.eq (i32.load8_u (local.get $i)) (i32.const {byte}))
        (then (local.set $n (i32.add (local.get $n) (i32.const 1)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $scan)))
    (local.get $n))"#
    )
}

/// A swap file switched on for as long as this lives.
struct SwapFile(PathBuf);

impl SwapFile {
    /// Switches on a 256 MiB swap file, or says why it cannot.
    fn on() -> Result<Self, String> {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tern-test-swapfile");
        let _ = Command::new("swapoff").arg(&path).output();
        let mut f = std::fs::File::create(&path).map_err(|e| format!("create: {e}"))?;
        let mib = vec![0u8; 1 << 20];
        for _ in 0..256 {
            f.write_all(&mib).map_err(|e| format!("write: {e}"))?;
        }
        f.sync_all().map_err(|e| format!("sync: {e}"))?;
        drop(f);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("chmod: {e}"))?;
        let swap = Self(path);
        for cmd in ["mkswap", "swapon"] {
            let out = Command::new(cmd)
                .arg(&swap.0)
                .output()
                .map_err(|e| format!("{cmd}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "{cmd}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(swap)
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The writable mappings next to a reservation of 1 GiB or more: the pool's linear memories.
fn guest_memories() -> Vec<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let vmas: Vec<(usize, usize, bool)> = maps
        .lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            Some((a, b, rest.starts_with("rw")))
        })
        .collect();
    let big_guard = |i: usize| vmas.get(i).is_some_and(|v| !v.2 && v.1 - v.0 >= 1 << 30);
    let mut out = Vec::new();
    for (i, &(a, b, rw)) in vmas.iter().enumerate() {
        if !rw {
            continue;
        }
        // Walk to the end of this run of writable mappings: a memory ends at its guard.
        let mut j = i;
        while j + 1 < vmas.len() && vmas[j + 1].2 && vmas[j + 1].0 == vmas[j].1 {
            j += 1;
        }
        if j + 1 < vmas.len() && vmas[j + 1].0 == vmas[j].1 && big_guard(j + 1) {
            out.push((a, b));
        }
    }
    out
}

/// How many pages of `[a, b)` are swapped out (`/proc/self/pagemap` bit 62).
fn swapped_pages(a: usize, b: usize) -> usize {
    let pagemap = std::fs::File::open("/proc/self/pagemap").expect("open pagemap");
    let mut entries = vec![0u8; (b - a) / 4096 * 8];
    std::os::unix::fs::FileExt::read_exact_at(&pagemap, &mut entries, (a / 4096 * 8) as u64)
        .expect("read pagemap");
    entries
        .chunks(8)
        .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) & (1 << 62) != 0)
        .count()
}

/// Asks the kernel to push `[a, b)` to swap.
fn page_out(a: usize, b: usize) {
    // SAFETY: advice only; MADV_PAGEOUT never changes what the memory reads.
    unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_PAGEOUT) };
}

/// Pushes the pool's memories to swap; returns how many of their pages are swapped out.
fn page_out_guest_memories() -> usize {
    guest_memories()
        .into_iter()
        .map(|(a, b)| {
            page_out(a, b);
            swapped_pages(a, b)
        })
        .sum()
}

/// A raw HTTP/1.1 request whose body is sent only when the returned sender is used.
fn held_request(addr: SocketAddr, path: &str) -> (std::net::TcpStream, String) {
    let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\n");
    tcp.write_all(head.as_bytes()).expect("send head");
    (tcp, path.to_string())
}

/// Sends the held body and reads the 4-byte count the guest answers.
fn release(mut held: (std::net::TcpStream, String)) -> u32 {
    held.0.write_all(b"x").expect("send body");
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    let body_at = loop {
        let n = held.0.read(&mut buf).expect("read reply");
        assert!(n > 0, "{}: connection closed", held.1);
        reply.extend_from_slice(&buf[..n]);
        if let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n")
            && reply.len() >= end + 8
        {
            break end + 4;
        }
    };
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 200"), "{}: {text}", held.1);
    u32::from_le_bytes(reply[body_at..body_at + 4].try_into().unwrap())
}

/// The count of secret bytes `path` answers with.
async fn count(conn: &mut Conn, path: &str) -> u32 {
    let r = conn.get(path).await;
    assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
    u32::from_le_bytes(r.body[..4].try_into().expect("4 bytes"))
}

/// A one-slot server with the keeper at `/keep`, the seeker at `/seek`, and the test
/// component (whose `/c/keep` and `/c/seek` do the same) at `/c`.
async fn one_slot_server() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "keeper.wasm", &keeper());
    wat_file(dir.path(), "seeker.wasm", &seeker());
    test_component(dir.path(), "component");
    let config = "[pool]\ninstances = 1\nmax_memory_mib = 64\n\
                  [[tenant]]\nname = \"keeper\"\nmodule = \"keeper.wasm\"\npaths = [\"/keep\"]\n\
                  [tenant.limits]\ntimeout_ms = 30000\n\
                  [[tenant]]\nname = \"seeker\"\nmodule = \"seeker.wasm\"\npaths = [\"/seek\"]\n\
                  [[tenant]]\nname = \"component\"\nmodule = \"component.wasm\"\npaths = [\"/c\"]\n\
                  [tenant.limits]\ntimeout_ms = 30000\n";
    TestServer::try_start_in(dir, config).await.expect("start")
}

/// Keeps the secret in a live guest at `keep`, pushes its pages to swap, lets it finish, and
/// returns how many secret bytes the next guests (`seek`, then `keep` again) find in the slot.
async fn leak_after_swap(s: &TestServer, keep: &str, seek: &str) -> (u32, u32) {
    let held = held_request(s.addr(), keep);
    // The guest fills its memory in microseconds; page out until its secret is in swap.
    let mut swapped = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        swapped = page_out_guest_memories();
        if swapped * 4096 >= SECRET_BYTES as usize {
            break;
        }
    }
    assert!(
        swapped * 4096 >= SECRET_BYTES as usize,
        "only {swapped} guest pages reached swap: the experiment did not happen"
    );
    let seen_before = tokio::task::spawn_blocking(move || release(held))
        .await
        .unwrap();
    assert_eq!(seen_before, 0, "the keeper started dirty");
    let mut conn = Conn::open(s.addr()).await;
    let other_module = count(&mut conn, seek).await;
    let (seen, _) = {
        let held = held_request(s.addr(), keep);
        (
            tokio::task::spawn_blocking(move || release(held))
                .await
                .unwrap(),
            (),
        )
    };
    (other_module, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapped_out_guest_memory_never_reaches_the_next_guest() {
    let _turn = SWAP.lock().await;
    // Both sides of the start-up decision: a server started without swap (dirty-page reset,
    // swap switched on under it), and one started with swap on (memset reset).
    let before = one_slot_server().await;
    let swap = match SwapFile::on() {
        Ok(swap) => swap,
        Err(why) => panic!(
            "cannot switch on a swap file ({why}); this test needs root and a filesystem that \
             takes swap files. Where there is none, leave the swap tests out by name \
             (`-- --skip swap`): then they are counted as filtered out, not as passed."
        ),
    };
    assert_eq!(
        leak_after_swap(&before, "/keep", "/seek").await,
        (0, 0),
        "started without swap"
    );
    // Components too: their memories cannot be swept, so the server moves every tenant to an
    // engine with the swap-safe reset (requests wait for the move rather than fail).
    let mut conn = Conn::open(before.addr()).await;
    let r = conn.get("/c/hello").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let after = one_slot_server().await;
    for (server, keep, seek, what) in [
        (&before, "/c/keep", "/c/seek", "component, swap on later"),
        (&before, "/keep", "/seek", "swap on later, after the move"),
        (&after, "/keep", "/seek", "started with swap"),
        (&after, "/c/keep", "/c/seek", "component, with swap"),
    ] {
        assert_eq!(leak_after_swap(server, keep, seek).await, (0, 0), "{what}");
    }
    drop(swap);
}

/// The sweep itself, on memory of this test: swapped-out pages read as zeros afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_discards_swapped_pages() {
    let _turn = SWAP.lock().await;
    let _swap = SwapFile::on().unwrap_or_else(|why| {
        panic!(
            "cannot switch on a swap file ({why}); see \
             swapped_out_guest_memory_never_reaches_the_next_guest"
        )
    });
    let sweep = tern::teardown::Sweep::new(1 << 20).expect("PAGEMAP_SCAN on this kernel");
    let mut memory = vec![SECRET; 2 << 20];
    let page_aligned = memory.as_ptr().align_offset(4096);
    let region = &mut memory[page_aligned..page_aligned + (1 << 20)];
    let (a, b) = (
        region.as_ptr() as usize,
        region.as_ptr() as usize + region.len(),
    );
    for _ in 0..50 {
        page_out(a, b);
        if swapped_pages(a, b) == 256 {
            break;
        }
    }
    assert_eq!(swapped_pages(a, b), 256, "the pages did not reach swap");
    let swept = sweep.run(region, false);
    assert_eq!(swept.discarded, 1 << 20, "{swept:?}");
    assert!(region.iter().all(|&b| b == 0), "swapped pages survived");
}

/// Dirties one byte in every other page of 1 MiB (128 separate regions), after answering how
/// many such bytes it found (4 bytes, little endian).
fn scatter() -> String {
    format!(
        r#"(module
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  {COUNT}
  (func (export "_start") (local $i i32)
    (drop (memory.grow (i32.const 23)))
    (i32.store (i32.const 0) (call $count))
    (local.set $i (i32.const 524288))
    (block $done (loop $dirty
      (br_if $done (i32.ge_u (local.get $i) (i32.const 1572864)))
      (i32.store8 (local.get $i) (i32.const 0x5A))
      (local.set $i (i32.add (local.get $i) (i32.const 8192)))
      (br $dirty)))
    (drop (call $write (i32.const 0) (i32.const 4)))))"#,
        COUNT = count_fn(0x5A, 524288)
    )
}

/// A guest whose table of 4,096 funcrefs (8 pages) starts empty: each request counts the
/// entries it finds set at the first slot of every page, then sets them.
fn table_setter() -> String {
    r#"(module
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (table $t 4096 funcref)
  (func $f)
  (elem declare func $f)
  (func (export "_start") (local $i i32) (local $set i32)
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $i) (i32.const 4096)))
      (if (i32.eqz (ref.is_null (table.get $t (local.get $i))))
        (then (local.set $set (i32.add (local.get $set) (i32.const 1)))))
      (table.set $t (local.get $i) (ref.func $f))
      (local.set $i (i32.add (local.get $i) (i32.const 512)))
      (br $each)))
    (i32.store (i32.const 0) (local.get $set))
    (drop (call $write (i32.const 0) (i32.const 4)))))"#
        .to_string()
}

/// A server process in `dir` with one instance slot and `module` (a file in `dir`) at `path`:
/// the process, its address and its admin address.
fn one_slot_process(
    dir: &std::path::Path,
    module: &str,
    path: &str,
) -> (TernProcess, SocketAddr, SocketAddr) {
    let config = dir.join("tern.toml");
    std::fs::write(
        &config,
        format!(
            "[pool]\ninstances = 1\nmax_memory_mib = 64\n\
             [[tenant]]\nname = \"t\"\nmodule = \"{module}\"\npaths = [\"{path}\"]\n"
        ),
    )
    .unwrap();
    let tern = TernProcess::serve(&["--config", config.to_str().unwrap()], &dir.join("cache"));
    let (addr, admin) = (tern.addr.parse().unwrap(), tern.admin.parse().unwrap());
    (tern, addr, admin)
}

/// Five requests to `path` in a row, none of which may find the bytes the last one left.
async fn each_starts_clean(conn: &mut Conn, path: &str) {
    for i in 0..5 {
        assert_eq!(
            count(conn, path).await,
            0,
            "request {i} to {path} saw the last one's bytes"
        );
    }
}

/// The bytes the pool's freed slots of `kind` (`memories`, `tables`) keep resident (`/metrics`).
async fn resident(admin: SocketAddr, kind: &str) -> f64 {
    let m = crate::support::get_at(admin, "/metrics").await.text();
    metric_value(&m, &format!(r#"tern_pool_resident_bytes{{kind="{kind}"}}"#))
}

/// The bytes of `kind` a one-slot process (its own: another test's swap would change how its
/// slots are reset) keeps resident after five requests to the module `wat`, each of which
/// started clean.
async fn kept_after_clean_requests(wat: &str, kind: &str) -> f64 {
    let _turn = SWAP.lock().await;
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "guest.wasm", wat);
    let (_tern, addr, admin) = one_slot_process(dir.path(), "guest.wasm", "/");
    each_starts_clean(&mut Conn::open(addr).await, "/").await;
    resident(admin, kind).await
}

/// More than 32 dirty regions: every request starts clean, and the slot keeps the scattered
/// pages resident (reset by `memset`) instead of decommitting all but 32 regions, after which
/// every request would fault them in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scattered_dirty_pages_are_reset_and_stay_resident() {
    let resident = kept_after_clean_requests(&scatter(), "memories").await;
    // 128 dirtied pages of 4 KiB, kept for the next request (wasmtime alone keeps 32).
    assert!(
        resident >= 128.0 * 4096.0,
        "only {resident} bytes stayed resident"
    );
}

/// A guest that dirties 8 pages of its table: every request finds the table as its module
/// declares it (empty), and the slot keeps the 8 pages resident (zeroed in place) instead of
/// returning all past the first 4 to the kernel, which the next request would fault in again
/// (what a JavaScript component's lazily filled funcref table did on every request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tables_dirty_pages_are_reset_and_stay_resident() {
    let resident = kept_after_clean_requests(&table_setter(), "tables").await;
    assert!(
        resident >= 8.0 * 4096.0,
        "only {resident} bytes of tables stayed resident"
    );
}

/// The same for a component, whose memory Tern reaches through the probe it appends before
/// compiling (`server/src/teardown/probe.rs`): every request starts clean, and the slot keeps the
/// scattered pages resident. Without the probe the component's memory is not swept, and
/// wasmtime keeps 32 of its 128 regions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_components_scattered_dirty_pages_are_reset_and_stay_resident() {
    let _turn = SWAP.lock().await;
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let (_tern, addr, admin) = one_slot_process(dir.path(), "component.wasm", "/c");
    let mut conn = Conn::open(addr).await;
    assert_eq!(conn.get("/c/hello").await.status, StatusCode::OK);
    let before = resident(admin, "memories").await;
    each_starts_clean(&mut conn, "/c/scatter").await;
    // 128 dirtied pages of 4 KiB more than the component keeps for its hello.
    let after = resident(admin, "memories").await;
    assert!(
        after >= before + 128.0 * 4096.0,
        "only {after} bytes stayed resident (after hello: {before})"
    );
}
