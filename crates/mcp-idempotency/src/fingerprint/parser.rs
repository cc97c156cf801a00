//! Strict RFC 8259 parser that appends each value's canonical encoding, in input
//! order, to an output buffer after the digest's header, and has
//! [`order`](super::order) put the members of each object in order as it closes.

use sha2::{Digest, Sha256};

use super::bytes::extend_short;
use super::order::{key_prefix, Layout, Sink};
use super::{malformed, number, ArgumentsError, DOMAIN_TAG, MAX_DEPTH};

/// Buffers reused across calls on the same thread.
pub(super) struct Buffers {
    out: Vec<u8>,
    /// Length of the header at the start of `out`.
    header_len: usize,
    layout: Layout,
    stage: Vec<u8>,
}

impl Buffers {
    pub(super) const fn new() -> Self {
        Self {
            out: Vec::new(),
            header_len: 0,
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
        canonical.split_off(self.header_len)
    }
}

/// Hashes the domain tag, `tool_name` encoded as a string and the canonical encoding
/// of `arguments` (`{}` when absent or `null`).
pub(super) fn hash(
    bufs: &mut Buffers,
    tool_name: &str,
    arguments: Option<&str>,
) -> Result<[u8; 32], ArgumentsError> {
    match arguments {
        Some(text) => parse(tool_name, text, bufs)?,
        None => start(tool_name, bufs),
    }
    let header_len = bufs.header_len;
    let out = &mut bufs.out;
    if out.len() == header_len || out[header_len..] == *b"n" {
        out.truncate(header_len);
        out.extend_from_slice(b"{}");
    }
    if !bufs.layout.any_reordered() {
        // Every object is in order already: the buffer is the whole input to the digest.
        return Ok(Sha256::digest(&bufs.out).into());
    }
    let mut sink = Sink::new(&mut bufs.stage);
    bufs.layout.write_canonical(&bufs.out, &mut sink);
    Ok(sink.finish())
}

/// Clears `bufs` and writes the digest's header to `bufs.out`: the domain tag and
/// `tool_name` encoded as a string.
fn start(tool_name: &str, bufs: &mut Buffers) {
    let out = &mut bufs.out;
    out.clear();
    out.extend_from_slice(DOMAIN_TAG);
    out.push(b's');
    let mut len = [0u8; 10];
    match leb128(tool_name.len() as u64, &mut len) {
        &[byte] => out.push(byte),
        varint => out.extend_from_slice(varint),
    }
    out.extend_from_slice(tool_name.as_bytes());
    bufs.header_len = out.len();
    bufs.layout.clear();
}

/// Parses `text` as exactly one JSON value, leaving the header (see [`start`]) followed
/// by the value's parse-order encoding in `bufs.out` and its object layout in
/// `bufs.layout`.
pub(super) fn parse(tool_name: &str, text: &str, bufs: &mut Buffers) -> Result<(), ArgumentsError> {
    start(tool_name, bufs);
    let mut parser = Parser {
        src: text.as_bytes(),
        out: std::mem::take(&mut bufs.out),
        layout: &mut bufs.layout,
        error: None,
    };
    let parsed = parser.value(0, 0).and_then(|end| {
        let end = parser.skip_ws(end);
        if end == parser.src.len() {
            Ok(())
        } else {
            Err(parser.fail(end, "trailing characters"))
        }
    });
    let Parser { out, error, .. } = parser;
    bufs.out = out;
    // Every `Stop` comes with an error; the fallback is never used.
    parsed.map_err(|Stop| error.unwrap_or_else(|| malformed(0, "invalid JSON")))
}

/// Parsing stopped; the reason is in [`Parser::error`]. Keeping the error out of the
/// return value keeps the hot path's `Result` in registers.
struct Stop;

/// The position in the input just past what was parsed.
type Parsed = Result<usize, Stop>;

/// The parser's state, apart from the input position: that is passed along in local
/// variables and return values, which keeps it in a register rather than in memory.
struct Parser<'a> {
    src: &'a [u8],
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

    /// The position of the first byte at or after `at` that is not whitespace.
    fn skip_ws(&self, mut at: usize) -> usize {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.src.get(at) {
            at += 1;
        }
        at
    }

    /// Skips whitespace from `at`; returns the byte after it (if any) and its position.
    #[inline(always)]
    fn token(&self, at: usize) -> (Option<u8>, usize) {
        match self.src.get(at) {
            // Every whitespace byte is at most b' '.
            Some(&c) if c > b' ' => (Some(c), at),
            _ => {
                let at = self.skip_ws(at);
                (self.src.get(at).copied(), at)
            }
        }
    }

    /// Like [`Self::token`], checking first for `expected` right at `at`.
    #[inline(always)]
    fn token_expecting(&self, at: usize, expected: u8) -> (Option<u8>, usize) {
        if self.src.get(at) == Some(&expected) {
            (Some(expected), at)
        } else {
            self.token(at)
        }
    }

    /// Parses the value at `at`. `depth` counts the arrays and objects enclosing it.
    /// Inlined into the container loops so that scalars cost no extra call.
    #[inline(always)]
    fn value(&mut self, at: usize, depth: usize) -> Parsed {
        match self.token(at) {
            (Some(b'"'), at) => self.string(at + 1).map(|(_, end)| end),
            (Some(b'-' | b'0'..=b'9'), at) => match number::encode(self.src, at, &mut self.out) {
                Some(end) => Ok(end),
                None => Err(self.fail_with(number::error(self.src, at))),
            },
            (Some(b'{'), at) => self.object(at, depth + 1),
            (Some(b'['), at) => self.array(at, depth + 1),
            (Some(b't'), at) => self.literal(at, b"true", b't'),
            (Some(b'f'), at) => self.literal(at, b"false", b'f'),
            (Some(b'n'), at) => self.literal(at, b"null", b'n'),
            (Some(_), at) => Err(self.fail(at, "expected value")),
            (None, _) => Err(self.fail_at_end()),
        }
    }

    fn literal(&mut self, at: usize, word: &[u8], tag: u8) -> Parsed {
        if !self.src[at..].starts_with(word) {
            return Err(self.fail(at, "invalid literal"));
        }
        self.out.push(tag);
        Ok(at + word.len())
    }

    /// Checks the nesting depth and consumes the bracket at `at` and any whitespace.
    fn enter(&mut self, at: usize, depth: usize) -> Parsed {
        if depth > MAX_DEPTH {
            return Err(self.fail_with(ArgumentsError::TooDeep { max: MAX_DEPTH }));
        }
        Ok(self.skip_ws(at + 1))
    }

    /// After a container element: consumes `,` (returning `true`) or `close` (`false`).
    fn separator(
        &mut self,
        at: usize,
        close: u8,
        expected: &'static str,
    ) -> Result<(bool, usize), Stop> {
        if self.src.get(at) == Some(&b',') {
            return Ok((true, at + 1));
        }
        match self.token(at) {
            (Some(b','), at) => Ok((true, at + 1)),
            (Some(c), at) if c == close => Ok((false, at + 1)),
            (Some(_), at) => Err(self.fail(at, expected)),
            (None, _) => Err(self.fail_at_end()),
        }
    }

    #[inline(never)]
    fn array(&mut self, at: usize, depth: usize) -> Parsed {
        let mut at = self.enter(at, depth)?;
        self.out.push(b'[');
        if self.src.get(at) == Some(&b']') {
            at += 1;
        } else {
            loop {
                at = self.value(at, depth)?;
                let (more, next) = self.separator(at, b']', "expected ',' or ']'")?;
                at = next;
                if !more {
                    break;
                }
            }
        }
        self.out.push(b']');
        Ok(at)
    }

    #[inline(never)]
    fn object(&mut self, at: usize, depth: usize) -> Parsed {
        let mut at = self.enter(at, depth)?;
        let handle = self.layout.open_object(self.out.len());
        self.out.push(b'{');
        if self.src.get(at) == Some(&b'}') {
            at += 1;
        } else {
            loop {
                at = match self.token_expecting(at, b'"') {
                    (Some(b'"'), at) => at + 1,
                    (Some(_), at) => return Err(self.fail(at, "expected string key")),
                    (None, _) => return Err(self.fail_at_end()),
                };
                let start = self.out.len();
                let (key_start, prefix, next) = self.key(at)?;
                let key = key_start..self.out.len();
                at = match self.token_expecting(next, b':') {
                    (Some(b':'), at) => at + 1,
                    (Some(_), at) => return Err(self.fail(at, "expected ':'")),
                    (None, _) => return Err(self.fail_at_end()),
                };
                at = self.value(at, depth)?;
                self.layout.add_member(&self.out, start, key, prefix);
                let (more, next) = self.separator(at, b'}', "expected ',' or '}'")?;
                at = next;
                if !more {
                    break;
                }
            }
        }
        self.out.push(b'}');
        self.layout.close_object(&mut self.out, handle, depth);
        Ok(at)
    }

    /// Parses the string body at `at` (after the opening quote) and writes its
    /// encoding. Returns the position in `out` where the string's bytes start and the
    /// position in the input after the closing quote.
    #[inline(always)]
    fn string(&mut self, at: usize) -> Result<(usize, usize), Stop> {
        match self.scan_plain_string(at) {
            Some((len, first)) => Ok((self.copy_plain_string(at, len, first), at + len + 1)),
            None => self
                .escaped_or_long_string(at)
                .map(|(content, _, end)| (content, end)),
        }
    }

    /// [`Self::string`] for a member name; also returns the name's [`key_prefix`].
    #[inline(always)]
    fn key(&mut self, at: usize) -> Result<(usize, u64, usize), Stop> {
        match self.scan_plain_string(at) {
            Some((len, first)) => {
                // The prefix comes from the word already loaded rather than from `out`,
                // whose bytes were only just stored and would stall the load.
                let prefix = first.swap_bytes();
                let prefix = if len >= 8 {
                    prefix
                } else {
                    prefix & !(u64::MAX >> (8 * len))
                };
                Ok((self.copy_plain_string(at, len, first), prefix, at + len + 1))
            }
            None => self.escaped_or_long_string(at),
        }
    }

    /// The length of the string body at `at` and its first eight bytes (as a
    /// little-endian word), when it is the common case: no escapes and shorter than
    /// 128 bytes, so that its length is one LEB128 byte.
    #[inline(always)]
    fn scan_plain_string(&self, at: usize) -> Option<(usize, u64)> {
        let first = load_word(self.src, at).unwrap_or_else(|| load_tail(self.src, at));
        let hits = special_bytes(first);
        let len = if hits != 0 {
            (hits.trailing_zeros() / 8) as usize
        } else {
            plain_run_end(self.src, at + 8) - at
        };
        (self.src.get(at + len) == Some(&b'"') && len < 0x80).then_some((len, first))
    }

    /// Writes the encoding of the string [`Self::scan_plain_string`] found at `at` (of
    /// `len` bytes, starting with the word `first`); returns the position in `out`
    /// where its bytes start.
    #[inline(always)]
    fn copy_plain_string(&mut self, at: usize, len: usize, first: u64) -> usize {
        let content = self.out.len() + 2;
        if len <= 8 {
            // One store for the whole encoding.
            let encoding = u128::from(first) << 16 | u128::from(len as u8) << 8 | u128::from(b's');
            self.out.extend_from_slice(&encoding.to_le_bytes());
            self.out.truncate(content + len);
        } else {
            self.out.extend_from_slice(&[b's', len as u8]);
            extend_short::<32>(&mut self.out, self.src, at, len);
        }
        content
    }

    /// [`Self::key`] for strings with escapes or of 128 bytes or more.
    #[inline(never)]
    fn escaped_or_long_string(&mut self, mut at: usize) -> Result<(usize, u64, usize), Stop> {
        let len_at = self.out.len() + 1;
        self.out.extend_from_slice(b"s\0");
        let content = len_at + 1;
        loop {
            let end = plain_run_end(self.src, at);
            extend_short::<32>(&mut self.out, self.src, at, end - at);
            at = end;
            match self.src.get(at) {
                Some(b'"') => {
                    at += 1;
                    break;
                }
                Some(b'\\') => match unescape(self.src, at, &mut self.out) {
                    Ok(next) => at = next,
                    Err(error) => return Err(self.fail_with(error)),
                },
                Some(_) => return Err(self.fail(at, "control character in string")),
                None => return Err(self.fail(self.src.len(), "unterminated string")),
            }
        }
        let len = self.out.len() - content;
        let content = if len < 0x80 {
            self.out[len_at] = len as u8;
            content
        } else {
            let mut varint = [0u8; 10];
            let varint = leb128(len as u64, &mut varint);
            self.out[len_at] = varint[0];
            self.out
                .splice(content..content, varint[1..].iter().copied());
            content + varint.len() - 1
        };
        Ok((content, key_prefix(&self.out, content, len), at))
    }
}

/// Writes `value` as minimal unsigned LEB128 into `buf`; returns the bytes used.
fn leb128(mut value: u64, buf: &mut [u8; 10]) -> &[u8] {
    let mut n = 0;
    while value >= 0x80 {
        buf[n] = (value as u8) | 0x80;
        value >>= 7;
        n += 1;
    }
    buf[n] = value as u8;
    &buf[..=n]
}

/// The eight bytes at `src[i..]` as a little-endian word, if there are that many.
#[inline]
fn load_word(src: &[u8], i: usize) -> Option<u64> {
    let mut word = [0u8; 8];
    word.copy_from_slice(src.get(i..i + 8)?);
    Some(u64::from_le_bytes(word))
}

/// Like [`load_word`] for fewer than eight bytes at `src[i..]`, padded with `"`.
#[cold]
fn load_tail(src: &[u8], i: usize) -> u64 {
    let mut tail = [b'"'; 8];
    let rest = src.get(i..).unwrap_or_default();
    tail[..rest.len()].copy_from_slice(rest);
    u64::from_le_bytes(tail)
}

/// The index of the first `"`, `\\` or control character in `src[i..]` (or `src.len()`),
/// found eight bytes per step.
fn plain_run_end(src: &[u8], mut i: usize) -> usize {
    while let Some(word) = load_word(src, i) {
        let hits = special_bytes(word);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    // The padding quotes stop the scan at `src.len()`.
    i + (special_bytes(load_tail(src, i)).trailing_zeros() / 8) as usize
}

/// A word whose high bit is set in the lane of each `"`, `\\` or control character
/// of the little-endian word `v`; lanes above the first such byte may hold false positives.
#[inline]
fn special_bytes(v: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    const SPACES: u64 = ONES * 0x20;
    let q = v ^ QUOTES;
    let b = v ^ BACKSLASHES;
    (q.wrapping_sub(ONES) & !q | b.wrapping_sub(ONES) & !b | v.wrapping_sub(SPACES) & !v) & HIGHS
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
