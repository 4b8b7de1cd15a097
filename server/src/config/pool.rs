//! `[pool]`: the preallocated instance slots.

use serde::Deserialize;

/// `[pool]`: the region of preallocated instance slots every request takes one of.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Instance slots (and memories, tables, fiber stacks): the most guests running at once.
    pub instances: u32,
    /// Memory slots: at least `instances` (0: as many). A freed memory slot keeps its module's
    /// heap image, so that module's next guest maps nothing; more slots than running guests
    /// keep the images of more tenants ready (many-tenant hosts: `docs/configuration.md`).
    pub memory_slots: u32,
    /// Largest linear memory any guest may have, in MiB (a tenant's limit may be lower).
    pub max_memory_mib: u64,
    /// Largest table any guest may have, in elements.
    pub table_elements: usize,
    /// Core instances one `wasi-http` component may create (its modules plus the small shim
    /// modules component tooling adds: a Rust component has 3, JavaScript and Python ones
    /// more). Each slot then reserves this many core instances and tables (address space and
    /// a little bookkeeping; still one memory). A component needing more is refused at deploy.
    pub component_core_instances: u32,
    /// Bytes of each freed memory slot that are reset in place (and kept resident) instead of
    /// returned to the kernel: with the dirty-page reset, the pages a guest dirtied up to this
    /// much (with the gaps the sweep joins between them), so the next request does not fault
    /// them in again. 8 MiB holds what a Python or JavaScript component dirties (1 MiB left a
    /// Python request ~30 % slower); a small guest keeps only what it dirtied. The `memset`
    /// reset copies all of it on every request, so there it is capped at 1 MiB
    /// (`engine::MEMSET_KEEP_RESIDENT_KIB`).
    pub memory_keep_resident_kib: usize,
    /// Likewise for tables: with the dirty-page reset, the table pages a guest dirtied, up to
    /// this much, are zeroed and kept. 256 KiB holds a whole table of 32,768 entries; 16 KiB
    /// left a JavaScript component's lazily filled funcref table faulting 3 pages in (6 faults)
    /// on every request, ~12 % of its CPU.
    pub table_keep_resident_kib: usize,
    /// Bytes at the top of each fiber stack kept resident; the stack is zeroed after every
    /// request, so this part is cleared by `memset` rather than by page faults next time.
    pub stack_keep_resident_kib: usize,
    /// Zero each fiber stack after every request (defence in depth: guest code cannot address
    /// the host stack, so this guards only against a host or compiler bug reading stale stack
    /// memory). It costs more than its `memset`: a zeroed stack also waits in the batched
    /// decommit for the rest of it to be handed back, where an unzeroed one is reused at once
    /// (its measured price: docs/configuration.md).
    pub zero_stacks: bool,
    /// Memory, table and stack pages to hand back to the kernel are queued and returned in
    /// batches of this many slots (one `process_madvise` call); capped at `instances / 8`.
    pub decommit_batch_size: usize,
    /// Find the pages a guest dirtied with Linux's `PAGEMAP_SCAN` ioctl (kernel 6.7+) and reset
    /// only those. One `ioctl` per request: it pays off for guests that dirty a scattered part
    /// of a large `memory_keep_resident_kib`; for small guests a plain `memset` is faster.
    pub pagemap_scan: bool,
    /// Largest stack a guest may use before it traps with a stack overflow, in KiB.
    pub max_wasm_stack_kib: usize,
    /// Size of each guest's fiber stack, in KiB: the guest's stack plus room for host calls,
    /// which must be at least 256 KiB more than `max_wasm_stack_kib`.
    pub async_stack_kib: usize,
    /// How long a request may wait for a free slot before it gets `503`.
    pub queue_timeout_ms: u64,
    /// Serve WASI 0.3 components (component-model async: what spin-sdk 6 and later build).
    /// Off by default: wasmtime 48 marks its WASI 0.3 `wasi:http` experimental (not for
    /// production, no security fixes backported to this release), and the engine's concurrency
    /// support adds bookkeeping to every component request.
    pub wasi_p3: bool,
}

/// The most memory slots a pool may have. Each reserves 4 GiB of address space (and a guard
/// region): what a host can reserve decides the real limit (about 20,000 slots in the 128 TiB
/// of x86-64 with 4-level page tables; engine creation names it when it is exceeded).
pub const MAX_MEMORY_SLOTS: u32 = 1 << 20;

impl PoolConfig {
    /// The memory slots the pool has: `memory_slots`, or `instances` when it is 0.
    pub fn memory_slots(&self) -> u32 {
        self.memory_slots.max(self.instances)
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            instances: 256,
            memory_slots: 0,
            max_memory_mib: 256,
            table_elements: 20_000,
            component_core_instances: 16,
            memory_keep_resident_kib: 8192,
            table_keep_resident_kib: 256,
            stack_keep_resident_kib: 16,
            zero_stacks: true,
            decommit_batch_size: 16,
            pagemap_scan: true,
            max_wasm_stack_kib: 512,
            async_stack_kib: 1024,
            queue_timeout_ms: 1000,
            wasi_p3: false,
        }
    }
}
