//! The handles of one interface of the `tern` ABI (open key-value stores, cache entries): the
//! objects a request holds, by small numbers valid for that request only, and the message of
//! the interface's last failed call (its `*_last_error`).

use tern_sdk::abi::errno;

/// Objects a request holds through one interface, by handle (`None`: closed).
pub struct Handles<T> {
    open: Vec<Option<T>>,
    /// The message of the interface's last call that failed.
    pub last_error: String,
}

impl<T> Default for Handles<T> {
    fn default() -> Self {
        Self {
            open: Vec::new(),
            last_error: String::new(),
        }
    }
}

impl<T> Handles<T> {
    /// Keeps `message` for the interface's `*_last_error` and gives back `code`, what the
    /// failing call returns.
    pub fn fail(&mut self, code: i32, message: impl Into<String>) -> i32 {
        self.last_error = message.into();
        code
    }

    /// `flags` when they are all among `known`, else `INVALID_ARGUMENT` (with the reason kept).
    pub fn known_flags(&mut self, flags: i32, known: i32) -> Result<i32, i32> {
        if flags & !known == 0 {
            Ok(flags)
        } else {
            Err(self.fail(errno::INVALID_ARGUMENT, format!("unknown flags {flags:#x}")))
        }
    }

    /// Holds `object`; its handle.
    pub fn push(&mut self, object: T) -> i32 {
        self.open.push(Some(object));
        i32::try_from(self.open.len() - 1).unwrap_or(errno::LIMIT_EXCEEDED)
    }

    /// The handle of the first object held that `is` says is the one, if any.
    pub fn find(&self, is: impl Fn(&T) -> bool) -> Option<i32> {
        let h = self.open.iter().position(|o| o.as_ref().is_some_and(&is))?;
        i32::try_from(h).ok()
    }

    /// The object behind `handle`, or `INVALID_ARGUMENT` (with the reason kept).
    pub fn get(&mut self, handle: i32) -> Result<&mut T, i32> {
        let slot = usize::try_from(handle)
            .ok()
            .filter(|h| self.open.get(*h).is_some_and(std::option::Option::is_some));
        match slot {
            Some(h) => Ok(self.open[h].as_mut().expect("checked")),
            None => Err(self.fail(
                errno::INVALID_ARGUMENT,
                format!("{handle} is not an open handle of this request"),
            )),
        }
    }

    /// Drops the object behind `handle` (its handle is not given again), or `INVALID_ARGUMENT`.
    pub fn close(&mut self, handle: i32) -> Result<(), i32> {
        self.get(handle)?;
        self.open[usize::try_from(handle).unwrap_or_default()] = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_given_found_and_closed_once() {
        let mut h = Handles::default();
        assert_eq!((h.push("a"), h.push("b")), (0, 1));
        assert_eq!(h.find(|o| *o == "b"), Some(1));
        assert_eq!(h.get(1).copied(), Ok("b"));
        assert_eq!(h.close(0), Ok(()));
        assert_eq!(h.find(|o| *o == "a"), None);
        for bad in [0, 2, -1] {
            assert_eq!(h.get(bad), Err(errno::INVALID_ARGUMENT));
            assert!(h.last_error.contains(&bad.to_string()));
        }
        assert_eq!(h.close(0), Err(errno::INVALID_ARGUMENT));
        assert_eq!(h.push("c"), 2, "a closed handle is not given again");
        assert_eq!(h.known_flags(3, 3), Ok(3));
        assert_eq!(h.known_flags(4, 3), Err(errno::INVALID_ARGUMENT));
        assert!(h.last_error.contains("0x4"));
    }
}
