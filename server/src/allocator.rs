//! The host allocator: mimalloc, asked through the entry points its fast paths are on.
//!
//! `unsafe`: a [`GlobalAlloc`] is an unsafe trait, and mimalloc is called through its C API.
//!
//! Why not the `mimalloc` crate's own `MiMalloc`: it hands every allocation to
//! `mi_malloc_aligned(size, align)`, and mimalloc 3's aligned entry takes its fast path only for
//! a block of at most 1 KiB whose size class has a free block at hand. Otherwise it checks
//! whether the block is "naturally aligned", which mimalloc 3 (unlike 2) does not grant an
//! alignment of a machine word, so the request is over-allocated: `size + align - 1` bytes from
//! a larger size class, in a page then marked as holding interior pointers. Measured with
//! `loadtest/instructions.sh` (callgrind), a cache hit made 13.7 allocations that cost 98
//! instructions each on average, four of them over-allocated at ~280. mimalloc's blocks are
//! all word-aligned (size classes are whole words, a page's first block is 16-byte aligned),
//! so a layout asking no more than a word goes to `mi_malloc`, `mi_zalloc` and `mi_realloc`
//! directly, and only a larger alignment to the aligned entry points.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every block mimalloc hands out has.
const WORD: usize = std::mem::size_of::<usize>();

/// mimalloc as the process's allocator (`#[global_allocator]` in `main.rs`).
pub struct Mimalloc;

// SAFETY: mimalloc's entry points return blocks of at least the size asked for (or null),
// aligned to a word at least, or to `align` through the aligned ones; `mi_free` takes any
// block either returned, whatever its alignment.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = if layout.align() <= WORD {
            unsafe { mi::mi_malloc(layout.size()) }
        } else {
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()) }
        };
        p.cast()
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = if layout.align() <= WORD {
            unsafe { mi::mi_zalloc(layout.size()) }
        } else {
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()) }
        };
        p.cast()
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        unsafe { mi::mi_free(ptr.cast::<c_void>()) };
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = if layout.align() <= WORD {
            unsafe { mi::mi_realloc(ptr.cast::<c_void>(), new_size) }
        } else {
            unsafe { mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()) }
        };
        p.cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size and alignment a program asks for comes back aligned as asked, holds what is
    /// written into it, zeroed when asked, and keeps its bytes through a `realloc`.
    #[test]
    fn blocks_are_aligned_as_asked_and_keep_their_bytes() {
        let a = Mimalloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [1, 7, 8, 9, 16, 24, 100, 112, 1000, 1024, 1025, 4096, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null(), "{size} bytes at {align}");
                    assert_eq!(p as usize % align, 0, "{size} bytes at {align}");
                    p.write_bytes(0xa5, size);
                    let q = a.realloc(p, layout, size * 3);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "grown: {size} bytes at {align}");
                    assert!(
                        std::slice::from_raw_parts(q, size)
                            .iter()
                            .all(|b| *b == 0xa5)
                    );
                    a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed: {size} bytes at {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|b| *b == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
