//! Live logs: each request of a tenant as one [`Record`] (time, ids, client, phases, status,
//! outcome, the guest's stdout and stderr, a trap's backtrace), kept in a bounded ring per
//! tenant ([`Tail`]) that `GET /admin/v1/tenants/{name}/logs` reads and follows
//! ([`stream`]); in a fleet, every replica's streams merged in time order ([`fleet`]).
//!
//! The request path pays for one record: made of what the exchange holds already, nothing
//! formatted (a record becomes JSON only when a tailer reads it), pushed under the ring's lock.
//! A tailer reads the ring at its own pace: one that falls more than the ring behind loses the
//! oldest records and is told how many (`{"dropped": N}`); no request ever waits for one. Past
//! `records_per_second` a tenant's requests are sampled (each record kept says at what rate);
//! 5xx answers and guest failures are always kept.

pub mod filter;
pub mod fleet;
mod pending;
mod record;
mod ring;
pub mod stream;

pub use filter::Filter;
pub use pending::{Answered, Pending};
pub use record::{Ended, Record, now_ms, utc_millis};
pub use ring::{Attached, Counts, Settings, Tail};
pub use stream::Readers;

#[cfg(test)]
mod tests;
