//! A request's store limits, every guest kind's: memory and table growth, core instances;
//! the peak reached and whether a limit refused the guest.

use wasmtime::ResourceLimiter;

/// Limits memory and table growth per request; remembers the peak and whether a limit was hit.
#[derive(Debug, Clone)]
pub struct GuestLimits {
    /// Largest linear memory, in bytes.
    pub max_memory: usize,
    /// Largest table, in elements.
    pub max_table_elements: usize,
    /// Set when a growth request was refused: a later trap is then reported as the limit.
    pub memory_limit_hit: bool,
    /// Largest memory size the guest reached, in bytes.
    pub peak_memory: usize,
    /// Core instances (and tables) one guest may create: 1 for a module; for a component,
    /// `pool.component_core_instances`.
    pub instances: usize,
}

impl GuestLimits {
    /// Whether growing to `desired` stays within `max`; a refusal is recorded.
    fn allow(&mut self, desired: usize, max: usize) -> bool {
        self.memory_limit_hit |= desired > max;
        desired <= max
    }
}

impl ResourceLimiter for GuestLimits {
    fn memory_growing(
        &mut self,
        _: usize,
        desired: usize,
        _: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = self.allow(desired, self.max_memory);
        if ok {
            self.peak_memory = self.peak_memory.max(desired);
        }
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        _: usize,
        desired: usize,
        _: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.allow(desired, self.max_table_elements))
    }

    fn instances(&self) -> usize {
        self.instances
    }
    fn memories(&self) -> usize {
        1
    }
    fn tables(&self) -> usize {
        self.instances
    }
}
