//! A value the config's checks refused, and where it is.

/// A value validation refused: what is wrong, and where in the config file (when it came from
/// one) so the message can name the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Byte range of the offending value in the file, if known.
    pub span: Option<std::ops::Range<usize>>,
    /// What is wrong.
    pub message: String,
}
