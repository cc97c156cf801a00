//! Text from a server or a store, made safe to print.

/// `text` with control characters escaped (`\n`, `\u{1b}`), so that text from a store or a server
/// can neither drive the terminal nor end a TOML comment.
pub(crate) fn escape_controls(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
