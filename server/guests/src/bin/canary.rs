//! Checks that its statics, heap and stack start clean, then leaves canaries in all three:
//! `200` "clean" while no state crosses requests; `500` (a panic) the first time any does.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

const CANARY: u64 = 0x5EED_CAFE_F00D_D00D;
const WORDS: usize = 128 * 1024;
static STATIC: AtomicU64 = AtomicU64::new(0);

/// The shadow stack (in linear memory) below the current frame: unused by this request so far.
fn stack_below(frame: &[u8; 16]) -> impl Iterator<Item = *mut u64> {
    let top = (frame.as_ptr() as usize - 1024) & !7;
    (0..2048).map(move |i| (top - i * 8) as *mut u64)
}

fn main() {
    let dirty_static = STATIC.swap(CANARY, Ordering::Relaxed) != 0;

    // Fresh heap pages are assumed zero by the allocator: a canary here means memory leaked.
    let mut heap = vec![0u64; WORDS];
    let dirty_heap = heap.contains(&CANARY);
    heap.fill(CANARY);
    std::hint::black_box(&heap);
    std::mem::forget(heap);

    let frame = std::hint::black_box([0u8; 16]);
    // SAFETY: addresses below the live frame inside the shadow stack region of linear memory;
    // reads and writes there are in bounds and touch no live data.
    let dirty_stack = stack_below(&frame).any(|p| unsafe { p.read_volatile() } == CANARY);
    for p in stack_below(&frame) {
        // SAFETY: as above.
        unsafe { p.write_volatile(CANARY) };
    }

    if dirty_static || dirty_heap || dirty_stack {
        panic!(
            "state from an earlier request: static={dirty_static} heap={dirty_heap} stack={dirty_stack}"
        );
    }
    tern_test_guests::reply("clean");
}
