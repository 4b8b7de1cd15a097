//! The read-only `/assets` directory of WASI preview1, served from a tenant's in-memory
//! [`Assets`].
//!
//! Tenants with assets are linked against a linker in which these functions replace
//! wasmtime-wasi's file functions: `fd_prestat_get` announces fd 3 as the preopened directory
//! `/assets`, `path_open` resolves paths inside the tree (never outside it), and `fd_read`,
//! `fd_seek`, `fd_readdir`, the `*_filestat_get`s and friends read from memory on the worker
//! thread running the guest. Anything that would write is refused with `EROFS`. Stdin, stdout
//! and stderr keep their meaning: stdin is empty and stdout/stderr are the captured pipes
//! (writes still go through wasmtime-wasi's `fd_write`). Tenants without assets use
//! wasmtime-wasi's functions unchanged.
//!
//! Bad pointers get `EFAULT` (these are POSIX-style calls, so the guest decides what to do),
//! and no call can reach the host's file system.

use std::sync::Arc;

use wasmtime::{Caller, Linker};

use super::memory::GuestMemory;
use crate::assets::{Assets, GUEST_DIR, Lookup, NodeKind};

const MODULE: &str = "wasi_snapshot_preview1";
/// The preopened `/assets` directory (the first fd after stdio, where WASI libcs look).
const PREOPEN: u32 = 3;
/// Files opened by the guest get fds from here up.
const FIRST_FD: u32 = 4;
/// Most files one request may have open.
const MAX_OPEN: usize = 256;

/// WASI preview1 errno values used here.
pub(in crate::guest) mod errno {
    pub const SUCCESS: i32 = 0;
    pub const BADF: i32 = 8;
    pub const FAULT: i32 = 21;
    pub const INVAL: i32 = 28;
    pub const ISDIR: i32 = 31;
    pub const MFILE: i32 = 33;
    pub const NAMETOOLONG: i32 = 37;
    pub const NOENT: i32 = 44;
    pub const NOTDIR: i32 = 54;
    pub const ROFS: i32 = 69;
    pub const SPIPE: i32 = 70;
    pub const NOTCAPABLE: i32 = 76;
}

/// WASI file types.
mod filetype {
    pub const UNKNOWN: u8 = 0;
    pub const DIRECTORY: u8 = 3;
    pub const REGULAR_FILE: u8 = 4;
}

/// WASI rights bits.
mod rights {
    pub const FD_READ: u64 = 1 << 1;
    pub const FD_SEEK: u64 = 1 << 2;
    pub const FD_TELL: u64 = 1 << 5;
    pub const FD_WRITE: u64 = 1 << 6;
    pub const FD_ADVISE: u64 = 1 << 7;
    pub const PATH_OPEN: u64 = 1 << 13;
    pub const FD_READDIR: u64 = 1 << 14;
    pub const PATH_FILESTAT_GET: u64 = 1 << 18;
    pub const FD_FILESTAT_GET: u64 = 1 << 21;
    pub const POLL_FD_READWRITE: u64 = 1 << 27;
    pub const FILE: u64 =
        FD_READ | FD_SEEK | FD_TELL | FD_ADVISE | FD_FILESTAT_GET | POLL_FD_READWRITE;
    pub const DIR: u64 = PATH_OPEN | FD_READDIR | PATH_FILESTAT_GET | FD_FILESTAT_GET;
}

const OFLAGS_CREAT: i32 = 1;
const OFLAGS_DIRECTORY: i32 = 2;
const OFLAGS_TRUNC: i32 = 8;
/// `append`, `dsync`, `sync`: only meaningful for writing.
const FDFLAGS_WRITING: i32 = 1 | 2 | 16;

/// One request's view of its tenant's assets: the tree and the files it has open.
#[derive(Debug, Default)]
pub struct Files {
    assets: Option<Arc<Assets>>,
    open: Vec<Option<Open>>,
}

#[derive(Debug, Clone, Copy)]
struct Open {
    node: usize,
    pos: u64,
}

/// What an fd refers to.
enum FdTarget {
    Stdio(u32),
    /// A node of the tree (the preopen is the root) and, for opened files, their slot.
    Node(usize, Option<usize>),
}

impl Files {
    /// A fresh view with nothing open.
    pub fn new(assets: Option<Arc<Assets>>) -> Self {
        Self {
            assets,
            open: Vec::new(),
        }
    }

    fn target(&self, fd: i32) -> Result<FdTarget, i32> {
        let fd = fd as u32;
        match fd {
            0..=2 => Ok(FdTarget::Stdio(fd)),
            PREOPEN if self.assets.is_some() => Ok(FdTarget::Node(0, None)),
            _ => {
                let slot = fd.checked_sub(FIRST_FD).ok_or(errno::BADF)? as usize;
                match self.open.get(slot) {
                    Some(Some(o)) => Ok(FdTarget::Node(o.node, Some(slot))),
                    _ => Err(errno::BADF),
                }
            }
        }
    }

    fn assets(&self) -> Result<&Assets, i32> {
        self.assets.as_deref().ok_or(errno::BADF)
    }

    /// The directory node an `*at` call starts from.
    fn dir(&self, fd: i32) -> Result<usize, i32> {
        match self.target(fd)? {
            FdTarget::Node(n, _) if matches!(self.assets()?.node(n).kind, NodeKind::Dir(_)) => {
                Ok(n)
            }
            FdTarget::Node(..) => Err(errno::NOTDIR),
            FdTarget::Stdio(_) => Err(errno::NOTDIR),
        }
    }

    /// The directory and the path of an `*at` call: `dirfd`, and `len` bytes at `ptr`.
    fn at(&self, data: &mut [u8], dirfd: i32, ptr: i32, len: i32) -> Result<(usize, String), i32> {
        let dir = self.dir(dirfd)?;
        Ok((dir, guest_str(data, ptr, len)?))
    }

    /// The node `path` names from directory `dir`, and the tree it is in.
    fn resolve(&self, dir: usize, path: &str) -> Result<(&Assets, usize), i32> {
        let assets = self.assets()?;
        let node = assets.resolve(dir, path).map_err(|l| match l {
            Lookup::NotFound => errno::NOENT,
            Lookup::NotDir => errno::NOTDIR,
            Lookup::Escape => errno::NOTCAPABLE,
        })?;
        Ok((assets, node))
    }
}

/// What these functions reach of a request's store: the tenant's `/assets` and the files the
/// request opened.
pub trait FilesView: GuestMemory {
    /// The request's files.
    fn files(&mut self) -> &mut Files;
}

/// The contents of file `node` (`EISDIR` for a directory). Takes the tree rather than `Files`
/// so the caller can still update its open file.
fn file_bytes(assets: Option<&Assets>, node: usize) -> Result<&[u8], i32> {
    match &assets.ok_or(errno::BADF)?.node(node).kind {
        NodeKind::File(bytes) => Ok(bytes),
        NodeKind::Dir(_) => Err(errno::ISDIR),
    }
}

/// Runs `f` with the guest's memory and the request's files; its `Err` is the errno returned.
fn call<T: FilesView>(
    caller: &mut Caller<'_, T>,
    f: impl FnOnce(&mut [u8], &mut Files) -> Result<(), i32>,
) -> i32 {
    let Some(memory) = caller.data().memory() else {
        return errno::FAULT;
    };
    let (data, state) = memory.data_and_store_mut(caller);
    match f(data, state.files()) {
        Ok(()) => errno::SUCCESS,
        Err(e) => e,
    }
}

pub(in crate::guest) fn slice(data: &mut [u8], ptr: i32, len: usize) -> Result<&mut [u8], i32> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len).ok_or(errno::FAULT)?;
    data.get_mut(start..end).ok_or(errno::FAULT)
}

pub(in crate::guest) fn put(data: &mut [u8], ptr: i32, bytes: &[u8]) -> Result<(), i32> {
    slice(data, ptr, bytes.len())?.copy_from_slice(bytes);
    Ok(())
}

pub(in crate::guest) fn get_u32(data: &mut [u8], ptr: i32) -> Result<u32, i32> {
    let b = slice(data, ptr, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn guest_str(data: &mut [u8], ptr: i32, len: i32) -> Result<String, i32> {
    let b = slice(data, ptr, len as u32 as usize)?;
    std::str::from_utf8(b)
        .map(str::to_string)
        .map_err(|_| errno::INVAL)
}

/// A WASI `filestat` (64 bytes).
fn filestat(filetype: u8, ino: u64, size: u64) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[8..16].copy_from_slice(&ino.to_le_bytes());
    s[16] = filetype;
    s[24..32].copy_from_slice(&1u64.to_le_bytes());
    s[32..40].copy_from_slice(&size.to_le_bytes());
    s
}

fn node_stat(assets: &Assets, n: usize) -> [u8; 64] {
    match &assets.node(n).kind {
        NodeKind::Dir(c) => filestat(filetype::DIRECTORY, n as u64 + 1, c.len() as u64),
        NodeKind::File(d) => filestat(filetype::REGULAR_FILE, n as u64 + 1, d.len() as u64),
    }
}

/// `fd_read` of an assets file (stdin reads as empty).
///
/// # Errors
/// The WASI errno.
pub(in crate::guest) fn read(
    data: &mut [u8],
    files: &mut Files,
    fd: i32,
    iovs: i32,
    iovs_len: i32,
    nread: i32,
) -> Result<(), i32> {
    let n = match files.target(fd)? {
        FdTarget::Stdio(0) => 0, // stdin is empty
        FdTarget::Stdio(_) => return Err(errno::BADF),
        FdTarget::Node(node, slot) => {
            let slot = slot.ok_or(errno::ISDIR)?;
            let bytes = file_bytes(files.assets.as_deref(), node)?;
            let open = files.open[slot].as_mut().ok_or(errno::BADF)?;
            let from = usize::try_from(open.pos).unwrap_or(usize::MAX);
            let n = scatter(data, iovs, iovs_len, bytes.get(from..).unwrap_or(&[]))?;
            open.pos += n as u64;
            n
        }
    };
    put(data, nread, &(n as u32).to_le_bytes())
}

/// Copies `src` into the guest's iovec list and returns how much was copied.
pub(in crate::guest) fn scatter(
    data: &mut [u8],
    iovs: i32,
    iovs_len: i32,
    src: &[u8],
) -> Result<usize, i32> {
    let mut done = 0;
    for i in 0..iovs_len as u32 {
        let at = (iovs as u32).checked_add(i * 8).ok_or(errno::FAULT)? as i32;
        let (ptr, len) = (get_u32(data, at)?, get_u32(data, at + 4)? as usize);
        let n = len.min(src.len() - done);
        slice(data, ptr as i32, n)?.copy_from_slice(&src[done..done + n]);
        done += n;
        if done == src.len() {
            break;
        }
    }
    Ok(done)
}

/// Defines one WASI function whose body runs through [`call`]:
/// `hostcall!(linker, "name", |data, files, arg: i32, ...| -> Result<(), errno>)`.
macro_rules! hostcall {
    ($linker:ident, $name:expr, |$data:tt, $files:tt $(, $arg:tt : $ty:ty)* $(,)?| $body:expr) => {
        $linker.func_wrap(MODULE, $name, |mut c: Caller<'_, T>, $($arg: $ty),*| {
            call(&mut c, |$data, $files| $body)
        })?
    };
}

/// Adds the `/assets` functions to `linker`, replacing wasmtime-wasi's file functions.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: FilesView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    hostcall!(
        linker,
        "fd_prestat_get",
        |data, files, fd: i32, buf: i32| {
            if fd as u32 != PREOPEN || files.assets.is_none() {
                return Err(errno::BADF);
            }
            let mut prestat = [0u8; 8]; // tag 0 = directory, then the name's length
            prestat[4..].copy_from_slice(&(GUEST_DIR.len() as u32).to_le_bytes());
            put(data, buf, &prestat)
        }
    );
    hostcall!(
        linker,
        "fd_prestat_dir_name",
        |data, files, fd: i32, ptr: i32, len: i32| {
            if fd as u32 != PREOPEN || files.assets.is_none() {
                return Err(errno::BADF);
            }
            if (len as u32 as usize) < GUEST_DIR.len() {
                return Err(errno::NAMETOOLONG);
            }
            put(data, ptr, GUEST_DIR.as_bytes())
        }
    );
    hostcall!(
        linker,
        "path_open",
        |data,
         files,
         dirfd: i32,
         _lookup: i32,
         path: i32,
         path_len: i32,
         oflags: i32,
         rights_base: i64,
         _inheriting: i64,
         fdflags: i32,
         out: i32| {
            let (dir, path) = files.at(data, dirfd, path, path_len)?;
            if oflags & (OFLAGS_CREAT | OFLAGS_TRUNC) != 0
                || rights_base as u64 & rights::FD_WRITE != 0
                || fdflags & FDFLAGS_WRITING != 0
            {
                return Err(errno::ROFS);
            }
            let (assets, node) = files.resolve(dir, &path)?;
            if oflags & OFLAGS_DIRECTORY != 0 && !matches!(assets.node(node).kind, NodeKind::Dir(_))
            {
                return Err(errno::NOTDIR);
            }
            let open = Some(Open { node, pos: 0 });
            let slot = match files.open.iter().position(Option::is_none) {
                Some(s) => {
                    files.open[s] = open;
                    s
                }
                None if files.open.len() < MAX_OPEN => {
                    files.open.push(open);
                    files.open.len() - 1
                }
                None => return Err(errno::MFILE),
            };
            put(data, out, &(FIRST_FD + slot as u32).to_le_bytes())
        }
    );
    hostcall!(
        linker,
        "path_filestat_get",
        |data, files, dirfd: i32, _flags: i32, path: i32, len: i32, buf: i32| {
            let (dir, path) = files.at(data, dirfd, path, len)?;
            let (assets, node) = files.resolve(dir, &path)?;
            put(data, buf, &node_stat(assets, node))
        }
    );
    hostcall!(
        linker,
        "fd_read",
        |data, files, fd: i32, iovs: i32, iovs_len: i32, nread: i32| {
            read(data, files, fd, iovs, iovs_len, nread)
        }
    );
    hostcall!(
        linker,
        "fd_pread",
        |data, files, fd: i32, iovs: i32, iovs_len: i32, at: i64, nread: i32| {
            let FdTarget::Node(node, Some(_)) = files.target(fd)? else {
                return Err(errno::SPIPE);
            };
            let bytes = file_bytes(files.assets.as_deref(), node)?;
            let from = usize::try_from(at as u64).unwrap_or(usize::MAX);
            let n = scatter(data, iovs, iovs_len, bytes.get(from..).unwrap_or(&[]))?;
            put(data, nread, &(n as u32).to_le_bytes())
        }
    );
    hostcall!(
        linker,
        "fd_seek",
        |data, files, fd: i32, offset: i64, whence: i32, out: i32| {
            let FdTarget::Node(node, Some(slot)) = files.target(fd)? else {
                return Err(errno::SPIPE);
            };
            let bytes = file_bytes(files.assets.as_deref(), node)?;
            let len = bytes.len() as i64;
            let open = files.open[slot].as_mut().ok_or(errno::BADF)?;
            let base = match whence {
                0 => 0,
                1 => open.pos as i64,
                2 => len,
                _ => return Err(errno::INVAL),
            };
            let pos = base.checked_add(offset).filter(|p| *p >= 0);
            open.pos = pos.ok_or(errno::INVAL)? as u64;
            put(data, out, &open.pos.to_le_bytes())
        }
    );
    hostcall!(linker, "fd_tell", |data, files, fd: i32, out: i32| {
        let FdTarget::Node(_, Some(slot)) = files.target(fd)? else {
            return Err(errno::SPIPE);
        };
        let pos = files.open[slot].map_or(0, |o| o.pos);
        put(data, out, &pos.to_le_bytes())
    });
    hostcall!(
        linker,
        "fd_close",
        |_, files, fd: i32| match files.target(fd)? {
            FdTarget::Node(_, Some(slot)) => {
                files.open[slot] = None;
                Ok(())
            }
            // Closing stdio or the preopen is allowed and changes nothing for the host.
            _ => Ok(()),
        }
    );
    hostcall!(
        linker,
        "fd_filestat_get",
        |data, files, fd: i32, buf: i32| {
            let stat = match files.target(fd)? {
                FdTarget::Stdio(_) => filestat(filetype::UNKNOWN, 0, 0),
                FdTarget::Node(n, _) => node_stat(files.assets()?, n),
            };
            put(data, buf, &stat)
        }
    );
    hostcall!(linker, "fd_fdstat_get", |data, files, fd: i32, buf: i32| {
        let (ft, base, inheriting) = match files.target(fd)? {
            FdTarget::Stdio(0) => (filetype::UNKNOWN, rights::FD_READ, 0),
            FdTarget::Stdio(_) => (filetype::UNKNOWN, rights::FD_WRITE, 0),
            FdTarget::Node(n, _) => match files.assets()?.node(n).kind {
                NodeKind::Dir(_) => (filetype::DIRECTORY, rights::DIR, rights::DIR | rights::FILE),
                NodeKind::File(_) => (filetype::REGULAR_FILE, rights::FILE, 0),
            },
        };
        let mut s = [0u8; 24];
        s[0] = ft;
        s[8..16].copy_from_slice(&(base | rights::POLL_FD_READWRITE).to_le_bytes());
        s[16..24].copy_from_slice(&inheriting.to_le_bytes());
        put(data, buf, &s)
    });
    hostcall!(
        linker,
        "fd_advise",
        |_, files, fd: i32, _off: i64, _len: i64, _advice: i32| match files.target(fd)? {
            FdTarget::Node(..) => Ok(()),
            FdTarget::Stdio(_) => Err(errno::SPIPE),
        }
    );
    hostcall!(
        linker,
        "fd_readdir",
        |data, files, fd: i32, buf: i32, len: i32, cookie: i64, used: i32| {
            let dir = files.dir(fd)?;
            let assets = files.assets()?;
            let NodeKind::Dir(children) = &assets.node(dir).kind else {
                return Err(errno::NOTDIR);
            };
            // `.`, `..`, then the entries; the cookie is the index of the next one.
            let parent = assets.node(dir).parent;
            let entries = [(".", dir), ("..", parent)]
                .into_iter()
                .chain(children.iter().map(|&i| (assets.node(i).name.as_str(), i)));
            let mut out = Vec::new();
            let cap = len as u32 as usize;
            for (k, (name, node)) in entries.enumerate().skip(cookie.max(0) as usize) {
                if out.len() >= cap {
                    break;
                }
                let ft = match assets.node(node).kind {
                    NodeKind::Dir(_) => filetype::DIRECTORY,
                    NodeKind::File(_) => filetype::REGULAR_FILE,
                };
                out.extend_from_slice(&(k as u64 + 1).to_le_bytes());
                out.extend_from_slice(&(node as u64 + 1).to_le_bytes());
                out.extend_from_slice(&(name.len() as u32).to_le_bytes());
                out.extend_from_slice(&[ft, 0, 0, 0]);
                out.extend_from_slice(name.as_bytes());
            }
            // A full buffer tells the guest to call again; the last entry may be cut.
            out.truncate(cap);
            put(data, buf, &out)?;
            put(data, used, &(out.len() as u32).to_le_bytes())
        }
    );
    // Writes through an asset fd, or creating anything, are refused as on a read-only mount.
    for name in [
        "path_create_directory",
        "path_remove_directory",
        "path_unlink_file",
    ] {
        hostcall!(linker, name, |_, files, fd: i32, _p: i32, _l: i32| {
            files.dir(fd)?;
            Err(errno::ROFS)
        });
    }
    linker.allow_shadowing(false);
    Ok(())
}
