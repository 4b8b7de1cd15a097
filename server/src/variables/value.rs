//! A variable's value as guests read it: plain or [`Secret`] (never shown), a tenant's
//! [`Values`], and the rules on names and values.

use std::collections::BTreeMap;

/// Most variables (plain and secret) of one tenant.
pub const MAX_VARIABLES: usize = 256;
/// Largest value of a variable, in bytes.
pub const MAX_VALUE_BYTES: usize = 32 * 1024;
/// Longest variable name.
pub const MAX_NAME_BYTES: usize = 64;

/// A secret's value: shown by nothing but [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<str>);

impl Secret {
    /// Holds `value`.
    pub fn new(value: String) -> Self {
        Self(value.into_boxed_str())
    }

    /// The value, for the guest that asked for it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A variable's value, ready for guests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Shown to operators.
    Plain(Box<str>),
    /// Shown to no one but the tenant's guests.
    Secret(Secret),
}

impl Value {
    fn text(&self) -> &str {
        match self {
            Self::Plain(v) => v,
            Self::Secret(s) => s.expose(),
        }
    }
}

/// A tenant's variables as its guests read them.
#[derive(Debug, Default)]
pub struct Values {
    pub(super) values: BTreeMap<String, Value>,
    /// Why some of its secrets cannot be opened here (then no read answers a value).
    pub(super) unreadable: Option<String>,
}

/// What a guest's read of a variable finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Found<'a> {
    /// Its value.
    Value(&'a str),
    /// No variable of that name.
    Undefined,
    /// The tenant's secrets cannot be opened on this server (why, in words).
    Unavailable(&'a str),
}

impl Values {
    /// The value of `name`.
    pub fn get(&self, name: &str) -> Found<'_> {
        if let Some(why) = &self.unreadable {
            return Found::Unavailable(why);
        }
        match self.values.get(name) {
            Some(v) => Found::Value(v.text()),
            None => Found::Undefined,
        }
    }

    /// Every name and value, by name.
    ///
    /// # Errors
    /// Why the tenant's secrets cannot be opened here.
    pub fn all(&self) -> Result<Vec<(String, String)>, String> {
        if let Some(why) = &self.unreadable {
            return Err(why.clone());
        }
        Ok(self
            .values
            .iter()
            .map(|(k, v)| (k.clone(), v.text().to_string()))
            .collect())
    }
}

/// Checks a variable's name: Spin's rule, lower-case ASCII letters, digits and `_`, starting
/// with a letter, no `__`, not ending in `_`, at most 64 bytes.
///
/// # Errors
/// What is wrong with it, in words for the operator.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= MAX_NAME_BYTES
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.contains("__")
        && !name.ends_with('_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a variable name: lower-case letters, digits and '_', starting \
             with a letter, no '__', not ending in '_', at most {MAX_NAME_BYTES} bytes \
             (Spin's rule)"
        ))
    }
}

/// Checks a value's size.
///
/// # Errors
/// A value over [`MAX_VALUE_BYTES`].
pub fn check_value(name: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "the value of {name:?} is {} bytes; a variable holds at most {MAX_VALUE_BYTES}",
            value.len()
        ));
    }
    Ok(())
}
