//! Size budgets of the futures on the request path, checked when the server is compiled.
//!
//! A future is moved whole — every byte of its largest state, not only what it starts with —
//! when it is boxed and when hyper takes a request's future in, once per request. A few
//! kilobytes more of it cost more than the copy: the stack and cache lines it touches (a
//! `hello` spent ~4 µs more CPU with a 15.8 KB run future than with 3.3 KB,
//! loadtest/results/hotpath.md). A future over its budget fails the release build (error
//! E0080, "... outgrew its budget"); the fix is to box its largest await apart. Debug builds,
//! which lay futures out otherwise and are neither served nor measured, are not checked.

use std::future::Future;
use std::pin::Pin;

/// `future` itself, refused at compile time when it is over `MAX` bytes.
pub fn sized<const MAX: usize, F: Future>(future: F) -> F {
    #[cfg(not(debug_assertions))]
    const {
        assert!(
            size_of::<F>() <= MAX,
            "a future on the request path outgrew its budget: box its largest await apart"
        );
    }
    future
}

/// `future` in a box, refused at compile time when it is over `MAX` bytes.
pub fn boxed<const MAX: usize, F: Future>(future: F) -> Pin<Box<F>> {
    Box::pin(sized::<MAX, F>(future))
}
