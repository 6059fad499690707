//! TOML read with the line of each error: the limits file, the node keys.

/// Parses `text` as TOML of shape `D`; on failure, the 1-based line of
/// the error and what is wrong.
///
/// # Errors
///
/// `(line, message)` for text that is not TOML of that shape.
pub fn parse_toml<D: serde::de::DeserializeOwned>(text: &str) -> Result<D, (usize, String)> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(text, s.start));
        (line, e.message().to_string())
    })
}

/// The 1-based line of byte `offset` of `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
