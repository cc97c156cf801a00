//! Reading newline-delimited messages without holding more than a bounded prefix of any line.

use std::io;

use serde::de::{DeserializeOwned, IgnoredAny};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// The stream ended before any byte of a new line.
    Eof,
    /// A line of at most the limit (without its line ending) is in the buffer, with its `\n` unless
    /// the stream ended first.
    Whole,
    /// The line is longer than the limit: the buffer holds its first `limit` bytes, the rest is
    /// still unread ([`skip_rest`], [`next_piece`]).
    TooLong,
}

/// Capacity a line buffer keeps from one line to the next: one long message does not hold its
/// memory for the rest of the run.
const KEPT_CAPACITY: usize = 64 * 1024;

/// Reads the next line into `line` (cleared first), holding at most `limit` bytes of it.
pub(crate) async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    limit: usize,
) -> io::Result<Line> {
    line.clear();
    line.shrink_to(KEPT_CAPACITY);
    read_more(reader, line, limit).await
}

/// [`read_line`] without clearing `line` first: it goes on with the bytes a cancelled read left
/// in it, so a read cancelled (in a `select!`) and started again loses nothing.
pub(crate) async fn read_more<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    limit: usize,
) -> io::Result<Line> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if line.is_empty() {
                Line::Eof
            } else {
                Line::Whole
            });
        }
        let room = limit.saturating_sub(line.len());
        match available.iter().position(|&b| b == b'\n') {
            Some(end) if end <= room => {
                line.extend_from_slice(&available[..=end]);
                reader.consume(end + 1);
                return Ok(Line::Whole);
            }
            None if available.len() <= room => {
                let taken = available.len();
                line.extend_from_slice(available);
                reader.consume(taken);
            }
            _ => {
                line.extend_from_slice(&available[..room]);
                reader.consume(room);
                return Ok(Line::TooLong);
            }
        }
    }
}

/// Discards the rest of the current line, its `\n` included; returns how many bytes that was.
pub(crate) async fn skip_rest<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<u64> {
    let mut skipped = 0u64;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(skipped);
        }
        let (taken, done) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        reader.consume(taken);
        skipped += taken as u64;
        if done {
            return Ok(skipped);
        }
    }
}

/// The next piece of the rest of the current line, into `piece` (cleared first); returns whether
/// the line is over (the piece ends with its `\n`, or the stream ended).
pub(crate) async fn next_piece<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    piece: &mut Vec<u8>,
) -> io::Result<bool> {
    piece.clear();
    let available = reader.fill_buf().await?;
    if available.is_empty() {
        return Ok(true);
    }
    let (taken, done) = match available.iter().position(|&b| b == b'\n') {
        Some(end) => (end + 1, true),
        None => (available.len(), false),
    };
    piece.extend_from_slice(&available[..taken]);
    reader.consume(taken);
    Ok(done)
}

/// The `id` of the JSON-RPC message that `prefix` starts, as JSON, when it is a number or a string
/// found among the top-level members the prefix holds whole (`"id"` usually comes before `params`).
pub(crate) fn id_in_prefix(prefix: &[u8]) -> Option<String> {
    let mut pos = skip_whitespace(prefix, 0);
    if prefix.get(pos) != Some(&b'{') {
        return None;
    }
    pos += 1;
    loop {
        pos = skip_whitespace(prefix, pos);
        let (name, after) = value_at::<String>(prefix, pos)?;
        pos = skip_whitespace(prefix, after);
        if prefix.get(pos) != Some(&b':') {
            return None;
        }
        pos = skip_whitespace(prefix, pos + 1);
        if name == "id" {
            let (id, after) = value_at::<serde_json::Value>(prefix, pos)?;
            // A number cut off by the end of the prefix would read as a different number.
            let next = skip_whitespace(prefix, after);
            let ended = matches!(prefix.get(next), Some(b',' | b'}'));
            return (ended && (id.is_number() || id.is_string())).then(|| id.to_string());
        }
        let (IgnoredAny, after) = value_at::<IgnoredAny>(prefix, pos)?;
        pos = skip_whitespace(prefix, after);
        match prefix.get(pos) {
            Some(b',') => pos += 1,
            _ => return None,
        }
    }
}

fn value_at<T: DeserializeOwned>(bytes: &[u8], pos: usize) -> Option<(T, usize)> {
    let mut values = serde_json::Deserializer::from_slice(bytes.get(pos..)?).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, pos + values.byte_offset()))
}

fn skip_whitespace(bytes: &[u8], mut pos: usize) -> usize {
    while bytes.get(pos).is_some_and(|b| b" \t\r\n".contains(b)) {
        pos += 1;
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], limit: usize) -> Vec<(Line, Vec<u8>, u64)> {
        let mut reader = tokio::io::BufReader::with_capacity(3, input);
        let mut out = Vec::new();
        let mut line = Vec::new();
        loop {
            let read = read_line(&mut reader, &mut line, limit).await.unwrap();
            let skipped = match read {
                Line::Eof => return out,
                Line::Whole => 0,
                Line::TooLong => skip_rest(&mut reader).await.unwrap(),
            };
            out.push((read, line.clone(), skipped));
        }
    }

    #[tokio::test]
    async fn lines_up_to_the_limit_are_whole() {
        let got = lines(b"12345\n123456\n1234567\n\n12", 6).await;
        assert_eq!(
            got,
            [
                (Line::Whole, b"12345\n".to_vec(), 0),
                (Line::Whole, b"123456\n".to_vec(), 0),
                (Line::TooLong, b"123456".to_vec(), 2),
                (Line::Whole, b"\n".to_vec(), 0),
                (Line::Whole, b"12".to_vec(), 0),
            ]
        );
    }

    #[tokio::test]
    async fn the_rest_of_a_long_line_comes_in_pieces() {
        let mut reader = tokio::io::BufReader::with_capacity(4, &b"abcdefghij\nnext\n"[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_line(&mut reader, &mut line, 3).await.unwrap(),
            Line::TooLong
        );
        let mut rest = Vec::new();
        let mut piece = Vec::new();
        while !next_piece(&mut reader, &mut piece).await.unwrap() {
            rest.extend_from_slice(&piece);
        }
        rest.extend_from_slice(&piece);
        assert_eq!([line, rest].concat(), b"abcdefghij\n");
        let mut line = Vec::new();
        assert_eq!(
            read_line(&mut reader, &mut line, 4).await.unwrap(),
            Line::Whole
        );
        assert_eq!(line, b"next\n");
    }

    #[tokio::test]
    async fn a_long_line_does_not_keep_its_buffer() {
        let long = vec![b'x'; 4 * KEPT_CAPACITY];
        let input = [&long[..], b"\nshort\n"].concat();
        let mut reader = tokio::io::BufReader::new(&input[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_line(&mut reader, &mut line, usize::MAX).await.unwrap(),
            Line::Whole
        );
        assert_eq!(line.len(), long.len() + 1);
        assert_eq!(
            read_line(&mut reader, &mut line, usize::MAX).await.unwrap(),
            Line::Whole
        );
        assert_eq!(line, b"short\n");
        assert!(line.capacity() <= KEPT_CAPACITY, "{}", line.capacity());
    }

    #[test]
    fn id_is_found_before_a_long_member() {
        let id = |s: &str| id_in_prefix(s.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"a":"xxx"#).as_deref(),
            Some("7")
        );
        assert_eq!(
            id(r#" { "jsonrpc" : "2.0" , "id" : "a\"b" , "params""#).as_deref(),
            Some(r#""a\"b""#)
        );
        assert_eq!(
            id(r#"{"method":"x","meta":{"id":1},"id":2,"p"#).as_deref(),
            Some("2")
        );
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":12"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":null,"#), None);
        assert_eq!(id(r#"{"params":{"a":"xxxxxxx"#), None);
        assert_eq!(id(r#"["id",1]"#), None);
        assert_eq!(id("\u{0}garbage"), None);
    }
}
