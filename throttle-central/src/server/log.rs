//! Log helpers of the server.

/// At most the first 80 bytes of `s`, for a log line about a name from
/// outside.
pub(crate) fn truncate(s: &str) -> &str {
    let mut end = s.len().min(80);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
