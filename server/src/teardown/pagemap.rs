//! What wasmtime 48's dirty-page reset misses, mended before each teardown.
//!
//! With `pagemap_scan` on, wasmtime resets a freed linear memory by asking Linux's
//! `PAGEMAP_SCAN` for the pages the guest dirtied and restoring only those. It asks only for
//! *present* pages, so a dirty page the kernel swapped out while the guest ran is neither
//! restored nor discarded, and the next guest in that slot (of any tenant) reads it. It also
//! takes at most 32 regions and decommits everything after the 32nd, so a guest that dirties
//! many scattered pages faults its heap back in on every request.
//!
//! [`Sweep::run`] scans the memory once more, just before the store is dropped, for pages that
//! are private to this instance (written or swapped, not the zero page, not the image file;
//! `teardown` decides when it runs and in which mode):
//! - swapped-out pages (and, in `discard_all` mode, every such page) are discarded
//!   (`MADV_DONTNEED`): they read as the image or zeros again, which is exactly their reset
//!   state, and wasmtime's scan then rightly skips them;
//! - when the dirty pages form more regions than wasmtime takes, the smallest gaps between them
//!   are made private too (`MADV_POPULATE_WRITE`, which changes no byte), as long as the result
//!   fits in `memory_keep_resident_kib`, so wasmtime's scan sees few regions and resets them all
//!   with `memset` instead of decommitting the tail.
//!
//! Besides `artifact` and `host`, this is the only module with `unsafe`.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// How many regions wasmtime 48's reset takes from one scan (`MAX_REGIONS` in its
/// `sys/unix/pagemap.rs`); past that it decommits the rest of the memory.
pub const WASMTIME_REGIONS: usize = 32;

/// Regions one scan reports at most; more mean further scans from where the last one stopped.
const SCAN_REGIONS: usize = 64;

/// Dirty regions remembered for joining; a memory dirtied in more pieces is left to wasmtime
/// (which then decommits its tail: correct, only slower).
const MAX_JOINED: usize = 256;

// `PAGEMAP_SCAN` (Linux 6.7, `include/uapi/linux/fs.h`).
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = (3 << 30)
    | ((size_of::<ScanArg>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 16;
/// `MADV_POPULATE_WRITE` (Linux 5.14): fault pages in writable, as a write would, without
/// changing their contents.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// `struct pm_scan_arg`.
#[repr(C)]
struct ScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Bytes of pages discarded (swapped out, or every private page in `discard_all` mode).
    pub discarded: usize,
    /// Bytes of gaps made resident to join dirty regions.
    pub joined: usize,
    /// Regions of present private (dirty) pages found, before joining.
    pub regions: usize,
}

/// `/proc/self/pagemap`, opened once, if the kernel has `PAGEMAP_SCAN`.
fn pagemap() -> Option<&'static File> {
    static PAGEMAP: OnceLock<Option<File>> = OnceLock::new();
    PAGEMAP
        .get_or_init(|| {
            let file = File::open("/proc/self/pagemap").ok()?;
            // An empty scan tells whether the kernel has the ioctl.
            scan(&file, 0, 0, &mut [PageRegion::default(); 1]).ok()?;
            Some(file)
        })
        .as_ref()
}

/// Scans `[start, end)` into `regions`; returns how many were filled and where the walk
/// stopped.
fn scan(
    pagemap: &File,
    start: u64,
    end: u64,
    regions: &mut [PageRegion],
) -> std::io::Result<(usize, u64)> {
    let mut arg = ScanArg {
        size: size_of::<ScanArg>() as u64,
        flags: 0,
        start,
        end,
        walk_end: 0,
        vec: regions.as_mut_ptr() as u64,
        vec_len: regions.len() as u64,
        max_pages: 0,
        // Pages private to this mapping: neither the shared zero page nor a page of the image
        // file (both unchanged by definition), and present or swapped out.
        category_inverted: PAGE_IS_PFNZERO | PAGE_IS_FILE,
        category_mask: PAGE_IS_PFNZERO | PAGE_IS_FILE,
        category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        return_mask: PAGE_IS_SWAPPED,
    };
    // SAFETY: the ioctl reads `arg` and writes at most `vec_len` regions into `regions`, which
    // outlives the call; it only reads this process's page tables.
    let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((n as usize, arg.walk_end))
}

/// The sweep's settings (see the module docs); the pagemap file is the process's.
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    keep_resident: usize,
    page: usize,
}

impl Sweep {
    /// A sweep for memories that keep up to `keep_resident` bytes resident, or `None` where
    /// `PAGEMAP_SCAN` is not available (wasmtime then resets without it, which is safe).
    pub fn new(keep_resident: usize) -> Option<Self> {
        Self::available()?;
        // SAFETY: `sysconf` has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        Some(Self {
            keep_resident,
            page,
        })
    }

    /// Whether the kernel has `PAGEMAP_SCAN`.
    pub fn available() -> Option<()> {
        pagemap().map(|_| ())
    }

    /// The host page size.
    pub fn page(&self) -> usize {
        self.page
    }

    /// Sweeps a guest's linear memory before its store is dropped. With `discard_all`, every
    /// page the guest made private is discarded, not only swapped-out ones.
    ///
    /// `memory` is the accessible memory of an instance that no longer runs. Afterwards its
    /// bytes are unchanged, except that discarded pages read as their reset state (the image
    /// or zeros), which is what wasmtime's reset would have made of them.
    pub fn run(&self, memory: &mut [u8], discard_all: bool) -> Swept {
        self.run_span(memory.as_mut_ptr() as usize, memory.len(), discard_all)
    }

    /// [`run`](Self::run) for the `len` bytes of linear memory at `start`, as the memory probe
    /// reports a component's memory ([`crate::teardown::probe`]): memory of an instance that is alive
    /// (its store not dropped) and no longer runs, which nothing else reads or writes meanwhile.
    pub fn run_span(&self, start: usize, len: usize, discard_all: bool) -> Swept {
        let mut swept = Swept::default();
        let Some(pagemap) = pagemap() else {
            return swept;
        };
        // A Wasm memory is page-aligned; a slice given by a test need not be.
        let skip = (start as *const u8).align_offset(self.page).min(len);
        let len = (len - skip) - (len - skip) % self.page;
        let base = (start + skip) as u64;
        let end = base + len as u64;
        let mut dirty = [(0u64, 0u64); MAX_JOINED];
        let mut n_dirty = 0;
        let mut too_scattered = false;
        let mut from = base;
        let mut regions = [PageRegion::default(); SCAN_REGIONS];
        while from < end {
            // No scan, no sweep: wasmtime's own scan fails the same way and falls back to its
            // full reset.
            let Ok((n, walk_end)) = scan(pagemap, from, end, &mut regions) else {
                return swept;
            };
            for r in &regions[..n] {
                let swapped = r.categories & PAGE_IS_SWAPPED != 0;
                if swapped || discard_all {
                    let len = (r.end - r.start) as usize;
                    self.discard(r.start as usize, len, swapped);
                    swept.discarded += len;
                } else {
                    swept.regions += 1;
                    if n_dirty < MAX_JOINED {
                        dirty[n_dirty] = (r.start, r.end);
                        n_dirty += 1;
                    } else {
                        too_scattered = true;
                    }
                }
            }
            if n < regions.len() || walk_end <= from {
                break;
            }
            from = walk_end;
        }
        if n_dirty > WASMTIME_REGIONS && !too_scattered {
            swept.joined = self.join(&dirty[..n_dirty]);
        }
        swept
    }

    /// Discards `pages` (`MADV_DONTNEED`): they read as the image or zeros again. Should that
    /// fail for swapped-out pages, they are read back in instead, so that wasmtime's reset,
    /// which sees present pages, restores them.
    fn discard(&self, start: usize, len: usize, swapped: bool) {
        // SAFETY: these pages lie in guest memory that nothing else uses meanwhile (see
        // `run_span`); discarding private pages of this private mapping changes them to their
        // reset state, as writing those bytes would.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if rc != 0 && swapped {
            for page in (start..start + len).step_by(self.page) {
                // SAFETY: as above; reading a byte of each page brings it back in.
                std::hint::black_box(unsafe { std::ptr::read_volatile(page as *const u8) });
            }
        }
    }

    /// Makes the smallest gaps between `dirty` regions resident, so that at most
    /// [`WASMTIME_REGIONS`] remain, if all of it fits in `keep_resident`. Returns the bytes
    /// joined.
    fn join(&self, dirty: &[(u64, u64)]) -> usize {
        let dirty_bytes: u64 = dirty.iter().map(|(s, e)| e - s).sum();
        let mut gaps = [(0u64, 0usize); MAX_JOINED];
        for (i, w) in dirty.windows(2).enumerate() {
            gaps[i] = (w[1].0 - w[0].1, i);
        }
        let gaps = &mut gaps[..dirty.len() - 1];
        gaps.sort_unstable();
        let fill = &gaps[..dirty.len() - WASMTIME_REGIONS];
        let gap_bytes: u64 = fill.iter().map(|(len, _)| len).sum();
        if dirty_bytes + gap_bytes > self.keep_resident as u64 {
            return 0;
        }
        for &(len, i) in fill {
            // SAFETY: the gap lies between two dirty regions of the memory the caller holds
            // exclusively; populating it writable copies or zero-fills its pages without
            // changing a byte. A failure only leaves the gap as it was.
            unsafe {
                libc::madvise(
                    dirty[i].1 as *mut libc::c_void,
                    len as usize,
                    MADV_POPULATE_WRITE,
                );
            }
        }
        gap_bytes as usize
    }
}

/// Waits until the set of swap areas changes or `timeout` passes. The kernel wakes pollers of
/// `/proc/swaps` (opened before the last look at it) on every `swapon` and `swapoff`.
pub fn wait_for_swap_change(swaps: &File, timeout: std::time::Duration) {
    let mut fd = libc::pollfd {
        fd: swaps.as_raw_fd(),
        events: libc::POLLPRI | libc::POLLERR,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid `pollfd` that outlives the call.
    let rc = unsafe { libc::poll(&mut fd, 1, ms) };
    if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
        std::thread::sleep(timeout);
    }
}
