//! What a guest asks of a store ([`Op`]), what it answers ([`Reply`]), and why it fails
//! ([`KvError`]): the same for every backend and every guest kind.

/// Why a key-value operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KvError {
    /// A key or value the store refuses (empty or too long key, a value that is not an integer
    /// to an increment).
    #[error("{0}")]
    Invalid(String),
    /// A limit: key or value size, the tenant's keys or bytes in the store.
    #[error("{0}")]
    Limit(String),
    /// The store could not do it (its file, its thread, a server refusing the connection):
    /// nothing was written; the guest may try again later.
    #[error("{0}")]
    Unavailable(String),
    /// A write was sent to the store and no answer came (the connection dropped, the answer
    /// was late): it may have been applied or not. Retrying an increment may count it twice.
    #[error("{0}")]
    Unknown(String),
}

/// An operation on one tenant's keys.
#[derive(Debug)]
pub enum Op {
    /// The key's value, if it has one.
    Get(Vec<u8>),
    /// Whether the key has a value.
    Exists(Vec<u8>),
    /// Sets the key's value.
    Set(Vec<u8>, Vec<u8>),
    /// Removes the key (a missing key is no error).
    Delete(Vec<u8>),
    /// Adds to the key's value (decimal text; a missing key counts as 0).
    Increment(Vec<u8>, i64),
    /// Sets the key to the new value if its value is `expected` (`None`: if it is absent).
    CompareAndSwap {
        /// The key.
        key: Vec<u8>,
        /// The value it must have (`None`: it must have none).
        expected: Option<Vec<u8>>,
        /// Its value if it had.
        new: Vec<u8>,
    },
    /// Up to `limit` keys after `after` (bytewise order), from the first with `None`.
    List {
        /// The last key already seen.
        after: Option<Vec<u8>>,
        /// Most keys answered.
        limit: usize,
    },
    /// Removes every key of the tenant: the server's own, for a tenant deleted (no guest asks
    /// for it: [`super::Store::forget`]).
    Forget,
}

impl Op {
    /// Its name in traces.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Get(_) => "get",
            Op::Exists(_) => "exists",
            Op::Set(..) => "set",
            Op::Delete(_) => "delete",
            Op::Increment(..) => "increment",
            Op::CompareAndSwap { .. } => "compare_and_swap",
            Op::List { .. } => "list",
            Op::Forget => "forget",
        }
    }
}

/// What an operation answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// `Get`: the value, if any.
    Value(Option<Vec<u8>>),
    /// `Exists`; `CompareAndSwap`: whether it swapped.
    Bool(bool),
    /// `Set`, `Delete`.
    Done,
    /// `Increment`: the new value.
    Integer(i64),
    /// `List`: the keys, in order.
    Keys(Vec<Vec<u8>>),
}
