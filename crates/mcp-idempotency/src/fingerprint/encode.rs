//! Strict RFC 8259 parser that appends each value's canonical encoding, in input
//! order, to an output buffer, and records the object layout for [`order`](super::order).

use super::order::{key_prefix, Layout, Output, Sink};
use super::{number, ArgumentsError, MAX_DEPTH};

/// Buffers reused across calls on the same thread.
pub(super) struct Buffers {
    out: Vec<u8>,
    layout: Layout,
    stage: Vec<u8>,
}

impl Buffers {
    pub(super) const fn new() -> Self {
        Self {
            out: Vec::new(),
            layout: Layout::new(),
            stage: Vec::new(),
        }
    }

    /// Releases all buffers if together they hold more than `max_bytes`, so that one
    /// huge request does not pin its memory for the life of the thread.
    pub(super) fn trim(&mut self, max_bytes: usize) {
        if self.held_bytes() > max_bytes {
            *self = Self::new();
        }
    }

    pub(super) fn held_bytes(&self) -> usize {
        self.out.capacity() + self.stage.capacity() + self.layout.capacity_bytes()
    }

    /// The canonical encoding of the last successfully parsed value.
    #[cfg(test)]
    pub(super) fn canonical(&self) -> Vec<u8> {
        let mut canonical = Vec::new();
        self.layout.write_canonical(&self.out, &mut canonical);
        canonical
    }
}

/// Hashes `header` followed by the canonical encoding of `arguments` (`{}` when absent or `null`).
pub(super) fn hash(
    bufs: &mut Buffers,
    header: &[&[u8]],
    arguments: Option<&str>,
) -> Result<[u8; 32], ArgumentsError> {
    if let Some(text) = arguments {
        parse(text, bufs)?;
    } else {
        bufs.out.clear();
    }
    let mut sink = Sink::new(&mut bufs.stage, header);
    if bufs.out.is_empty() || bufs.out == b"n" {
        sink.write(b"{}");
    } else {
        bufs.layout.write_canonical(&bufs.out, &mut sink);
    }
    Ok(sink.finish())
}

/// Parses `text` as exactly one JSON value, leaving its parse-order encoding in
/// `bufs.out` and its object layout in `bufs.layout`.
pub(super) fn parse(text: &str, bufs: &mut Buffers) -> Result<(), ArgumentsError> {
    let mut out = std::mem::take(&mut bufs.out);
    out.clear();
    bufs.layout.clear();
    let mut parser = Parser {
        src: text.as_bytes(),
        pos: 0,
        out,
        layout: &mut bufs.layout,
        error: None,
    };
    let parsed = parser.value(0).and_then(|()| {
        parser.skip_ws();
        if parser.pos == parser.src.len() {
            Ok(())
        } else {
            Err(parser.fail(parser.pos, "trailing characters"))
        }
    });
    let Parser {
        out, error, pos, ..
    } = parser;
    bufs.out = out;
    parsed.map_err(|Stop| error.unwrap_or_else(|| malformed(pos, "invalid JSON")))
}

pub(super) fn malformed(offset: usize, reason: &'static str) -> ArgumentsError {
    ArgumentsError::Malformed { offset, reason }
}

/// Parsing stopped; the reason is in [`Parser::error`]. Keeping the error out of the
/// return value keeps the hot path's `Result` in a register.
struct Stop;

type Step = Result<(), Stop>;

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    out: Vec<u8>,
    layout: &'a mut Layout,
    error: Option<ArgumentsError>,
}

impl Parser<'_> {
    #[cold]
    fn fail_with(&mut self, error: ArgumentsError) -> Stop {
        self.error = Some(error);
        Stop
    }

    #[cold]
    fn fail(&mut self, offset: usize, reason: &'static str) -> Stop {
        self.fail_with(malformed(offset, reason))
    }

    #[cold]
    fn fail_at_end(&mut self) -> Stop {
        self.fail(self.src.len(), "unexpected end of input")
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.src.get(self.pos) {
            self.pos += 1;
        }
    }

    /// `depth` counts the arrays and objects enclosing this value. Inlined into the
    /// container loops so that scalars cost no extra call.
    #[inline(always)]
    fn value(&mut self, depth: usize) -> Step {
        self.skip_ws();
        match self.peek() {
            Some(b'"') => {
                self.pos += 1;
                self.string().map(drop)
            }
            Some(b'-' | b'0'..=b'9') => match number::encode(self.src, self.pos, &mut self.out) {
                Ok(end) => {
                    self.pos = end;
                    Ok(())
                }
                Err(error) => Err(self.fail_with(error)),
            },
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b't') => self.literal(b"true", b't'),
            Some(b'f') => self.literal(b"false", b'f'),
            Some(b'n') => self.literal(b"null", b'n'),
            Some(_) => Err(self.fail(self.pos, "expected value")),
            None => Err(self.fail_at_end()),
        }
    }

    fn literal(&mut self, word: &[u8], tag: u8) -> Step {
        if !self.src[self.pos..].starts_with(word) {
            return Err(self.fail(self.pos, "invalid literal"));
        }
        self.pos += word.len();
        self.out.push(tag);
        Ok(())
    }

    fn enter(&mut self, depth: usize) -> Step {
        if depth > MAX_DEPTH {
            return Err(self.fail_with(ArgumentsError::TooDeep { max: MAX_DEPTH }));
        }
        self.pos += 1;
        self.skip_ws();
        Ok(())
    }

    /// After a container element: consumes `,` (returning `true`) or `close` (`false`).
    fn separator(&mut self, close: u8, expected: &'static str) -> Result<bool, Stop> {
        self.skip_ws();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                Ok(true)
            }
            Some(c) if c == close => {
                self.pos += 1;
                Ok(false)
            }
            Some(_) => Err(self.fail(self.pos, expected)),
            None => Err(self.fail_at_end()),
        }
    }

    #[inline(never)]
    fn array(&mut self, depth: usize) -> Step {
        self.enter(depth)?;
        self.out.push(b'[');
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                self.value(depth)?;
                if !self.separator(b']', "expected ',' or ']'")? {
                    break;
                }
            }
        }
        self.out.push(b']');
        Ok(())
    }

    #[inline(never)]
    fn object(&mut self, depth: usize) -> Step {
        self.enter(depth)?;
        let handle = self.layout.open_object(self.out.len());
        self.out.push(b'{');
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                self.skip_ws();
                match self.peek() {
                    Some(b'"') => self.pos += 1,
                    Some(_) => return Err(self.fail(self.pos, "expected string key")),
                    None => return Err(self.fail_at_end()),
                }
                let start = self.out.len();
                let src_start = self.pos;
                let key_start = self.string()?;
                let key = key_start..self.out.len();
                let key_len = key.len();
                // Read the prefix from the input when the name had no escapes: the
                // output bytes were only just stored and would stall the load.
                let prefix = if self.pos - 1 - src_start == key_len {
                    key_prefix(self.src, src_start, key_len)
                } else {
                    key_prefix(&self.out, key_start, key_len)
                };
                self.skip_ws();
                match self.peek() {
                    Some(b':') => self.pos += 1,
                    Some(_) => return Err(self.fail(self.pos, "expected ':'")),
                    None => return Err(self.fail_at_end()),
                }
                let first_object = self.layout.next_object();
                self.value(depth)?;
                self.layout
                    .add_member(&self.out, start, key, prefix, first_object);
                if !self.separator(b'}', "expected ',' or '}'")? {
                    break;
                }
            }
        }
        self.out.push(b'}');
        self.layout.close_object(&self.out, handle, depth);
        Ok(())
    }

    /// Parses a string body (the opening quote already consumed), writes its encoding
    /// and returns the position in `out` where the string's bytes start.
    fn string(&mut self) -> Result<usize, Stop> {
        let len_at = self.out.len() + 1;
        self.out.extend_from_slice(b"s\0");
        let content = len_at + 1;
        loop {
            self.pos = copy_plain_run(self.src, self.pos, &mut self.out);
            match self.src.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') => match unescape(self.src, self.pos, &mut self.out) {
                    Ok(next) => self.pos = next,
                    Err(error) => return Err(self.fail_with(error)),
                },
                Some(_) => return Err(self.fail(self.pos, "control character in string")),
                None => return Err(self.fail(self.src.len(), "unterminated string")),
            }
        }
        let len = self.out.len() - content;
        if len < 0x80 {
            self.out[len_at] = len as u8;
            return Ok(content);
        }
        let mut varint = [0u8; 10];
        let varint = leb128(len as u64, &mut varint);
        self.out[len_at] = varint[0];
        self.out
            .splice(content..content, varint[1..].iter().copied());
        Ok(content + varint.len() - 1)
    }
}

/// Writes `value` as minimal unsigned LEB128 into `buf`; returns the bytes used.
pub(super) fn leb128(mut value: u64, buf: &mut [u8; 10]) -> &[u8] {
    let mut n = 0;
    while value >= 0x80 {
        buf[n] = (value as u8) | 0x80;
        value >>= 7;
        n += 1;
    }
    buf[n] = value as u8;
    &buf[..=n]
}

/// Copies bytes from `src[i..]` to `out` up to the first `"`, `\` or control character
/// and returns that byte's index (or `src.len()`), working eight bytes per step.
fn copy_plain_run(src: &[u8], mut i: usize, out: &mut Vec<u8>) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    const SPACES: u64 = ONES * 0x20;
    while let Some(chunk) = src.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        out.extend_from_slice(&word);
        let v = u64::from_le_bytes(word);
        let q = v ^ QUOTES;
        let b = v ^ BACKSLASHES;
        let hits =
            (q.wrapping_sub(ONES) & !q | b.wrapping_sub(ONES) & !b | v.wrapping_sub(SPACES) & !v)
                & HIGHS;
        if hits != 0 {
            let plain = (hits.trailing_zeros() / 8) as usize;
            out.truncate(out.len() - 8 + plain);
            return i + plain;
        }
        i += 8;
    }
    while let Some(&c) = src.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        out.push(c);
        i += 1;
    }
    i
}

/// Decodes the escape sequence at `src[at]` (a backslash) into `out`; returns the position after it.
fn unescape(src: &[u8], at: usize, out: &mut Vec<u8>) -> Result<usize, ArgumentsError> {
    let byte = match src.get(at + 1) {
        None => return Err(malformed(src.len(), "unterminated string")),
        Some(b'"') => b'"',
        Some(b'\\') => b'\\',
        Some(b'/') => b'/',
        Some(b'b') => 0x08,
        Some(b'f') => 0x0c,
        Some(b'n') => b'\n',
        Some(b'r') => b'\r',
        Some(b't') => b'\t',
        Some(b'u') => return unescape_unicode(src, at, out),
        Some(_) => return Err(malformed(at, "invalid escape")),
    };
    out.push(byte);
    Ok(at + 2)
}

fn unescape_unicode(src: &[u8], at: usize, out: &mut Vec<u8>) -> Result<usize, ArgumentsError> {
    let unit = hex4(src, at)?;
    let (code_point, next) = match unit {
        0xD800..=0xDBFF => {
            if src.get(at + 6..at + 8) != Some(b"\\u") {
                return Err(malformed(at, "lone surrogate in \\u escape"));
            }
            let low = hex4(src, at + 6)?;
            if !(0xDC00..=0xDFFF).contains(&low) {
                return Err(malformed(at, "lone surrogate in \\u escape"));
            }
            (0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00), at + 12)
        }
        0xDC00..=0xDFFF => return Err(malformed(at, "lone surrogate in \\u escape")),
        _ => (unit, at + 6),
    };
    let c = char::from_u32(code_point).ok_or(malformed(at, "invalid \\u escape"))?;
    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
    Ok(next)
}

/// Reads the four hex digits of the `\u` escape at `src[at]`.
fn hex4(src: &[u8], at: usize) -> Result<u32, ArgumentsError> {
    let digits = src
        .get(at + 2..at + 6)
        .ok_or(malformed(at, "invalid \\u escape"))?;
    digits.iter().try_fold(0u32, |acc, &c| {
        let nibble = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return Err(malformed(at, "invalid \\u escape")),
        };
        Ok((acc << 4) | u32::from(nibble))
    })
}
