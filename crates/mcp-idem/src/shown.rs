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

/// `text` cut to about `max` characters: its start and its end around a marker naming the size.
pub(crate) fn abridge(text: &str, max: usize) -> String {
    let chars = text.chars().count();
    if chars <= max {
        return text.to_owned();
    }
    let tail = max / 4;
    let head = max - tail;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(chars - tail).collect();
    format!("{start} …({} bytes in all)… {end}", text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abridge_keeps_both_ends() {
        assert_eq!(abridge("short", 10), "short");
        let long = "a".repeat(50) + &"z".repeat(50);
        let cut = abridge(&long, 20);
        assert!(cut.starts_with("aaaaaaaaaaaaaaa "), "{cut}");
        assert!(cut.ends_with(" zzzzz"), "{cut}");
        assert!(cut.contains("(100 bytes in all)"), "{cut}");
    }
}
