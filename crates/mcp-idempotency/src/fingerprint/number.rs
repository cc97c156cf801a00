//! Strict JSON number grammar and exact decimal normalisation.

use std::ops::Range;

use super::bytes::extend_short;
use super::{malformed, ArgumentsError};

/// Exponent parts with more significant digits than this are refused.
const MAX_EXPONENT_DIGITS: usize = 18;

/// A number split by [`scan`] into its parts, as positions in the input.
struct Parts {
    negative: bool,
    /// The integer digits: `0` or digits without a leading zero.
    int: Range<usize>,
    /// The fraction digits; empty without a fraction.
    frac: Range<usize>,
    /// The value of the written exponent; 0 without an exponent.
    exponent: i64,
    /// The position just past the number.
    end: usize,
}

/// Parses the number starting at `src[start]` (a `-` or a digit), appends its canonical
/// encoding to `out` and returns the position just past it; `None`, when the number is
/// malformed or out of range, which [`error`] then explains. Returning no error keeps
/// the result in registers.
pub(super) fn encode(src: &[u8], start: usize, out: &mut Vec<u8>) -> Option<usize> {
    let parts = scan(src, start).ok()?;
    if parts.frac.is_empty() && parts.exponent == 0 {
        write_integer(out, parts.negative, src, parts.int);
    } else {
        write_canonical(
            out,
            parts.negative,
            src,
            parts.int,
            parts.frac,
            parts.exponent,
        );
    }
    Some(parts.end)
}

/// Why [`encode`] refused the number starting at `src[start]`.
#[cold]
pub(super) fn error(src: &[u8], start: usize) -> ArgumentsError {
    match scan(src, start) {
        Err(error) => error,
        Ok(_) => malformed(start, "invalid number"),
    }
}

/// Splits the number starting at `src[start]` into its parts by the strict grammar.
#[inline(always)]
fn scan(src: &[u8], start: usize) -> Result<Parts, ArgumentsError> {
    let mut pos = start;
    let negative = src[pos] == b'-';
    if negative {
        pos += 1;
    }
    let int_start = pos;
    match src.get(pos) {
        Some(b'0') => {
            pos += 1;
            if src.get(pos).is_some_and(u8::is_ascii_digit) {
                return Err(malformed(pos, "leading zero in number"));
            }
        }
        Some(b'1'..=b'9') => pos = digits_end(src, pos + 1),
        _ => return Err(malformed(pos, "expected digit")),
    }
    let int = int_start..pos;

    let mut frac = pos..pos;
    if src.get(pos) == Some(&b'.') {
        pos += 1;
        let frac_start = pos;
        pos = digits_end(src, pos);
        if pos == frac_start {
            return Err(malformed(pos, "expected digit after decimal point"));
        }
        frac = frac_start..pos;
    }

    let mut exponent = 0i64;
    if let Some(b'e' | b'E') = src.get(pos) {
        pos += 1;
        let exp_negative = src.get(pos) == Some(&b'-');
        if let Some(b'-' | b'+') = src.get(pos) {
            pos += 1;
        }
        let exp_start = pos;
        pos = digits_end(src, pos);
        if pos == exp_start {
            return Err(malformed(pos, "expected digit in exponent"));
        }
        let digits = &src[exp_start..pos];
        let significant = &digits[digits.iter().take_while(|&&d| d == b'0').count()..];
        if significant.len() > MAX_EXPONENT_DIGITS {
            return Err(ArgumentsError::NumberOutOfRange { offset: start });
        }
        let magnitude = significant
            .iter()
            .fold(0i64, |acc, &d| acc * 10 + i64::from(d - b'0'));
        exponent = if exp_negative { -magnitude } else { magnitude };
    }
    Ok(Parts {
        negative,
        int,
        frac,
        exponent,
        end: pos,
    })
}

fn digits_end(src: &[u8], mut pos: usize) -> usize {
    while src.get(pos).is_some_and(u8::is_ascii_digit) {
        pos += 1;
    }
    pos
}

/// Writes `±int.frac × 10^exponent` as sign, significant digits and adjusted exponent.
///
/// `int` is `0` or has no leading zero, as the grammar guarantees.
/// Writes an integer without fraction or exponent; `int` is `0` or has no leading zero.
fn write_integer(out: &mut Vec<u8>, negative: bool, src: &[u8], int: Range<usize>) {
    let Some(last) = src[int.clone()].iter().rposition(|&d| d != b'0') else {
        out.extend_from_slice(ZERO);
        return;
    };
    if negative {
        out.push(b'-');
    }
    extend_short::<16>(out, src, int.start, last + 1);
    let trailing_zeros = int.len() - 1 - last;
    if trailing_zeros == 0 {
        out.push(b';');
    } else {
        write_exponent(out, trailing_zeros as i128);
    }
}

const ZERO: &[u8] = b"0;";

/// Writes `±int.frac × 10^exponent` as sign, significant digits and adjusted exponent,
/// where `int` and `frac` are ranges of `src`.
///
/// `int` is `0` or has no leading zero, as the grammar guarantees.
fn write_canonical(
    out: &mut Vec<u8>,
    negative: bool,
    src: &[u8],
    int: Range<usize>,
    frac: Range<usize>,
    exponent: i64,
) {
    let frac_last = src[frac.clone()].iter().rposition(|&d| d != b'0');
    let exponent = i128::from(exponent);
    let (head, tail, exponent) = if src[int.clone()] != *b"0" {
        match frac_last {
            Some(last) => (
                int,
                frac.start..frac.start + last + 1,
                exponent - (last as i128 + 1),
            ),
            None => {
                let last = src[int.clone()]
                    .iter()
                    .rposition(|&d| d != b'0')
                    .unwrap_or(0);
                (
                    int.start..int.start + last + 1,
                    0..0,
                    exponent + (int.len() - 1 - last) as i128,
                )
            }
        }
    } else {
        match frac_last {
            None => {
                out.extend_from_slice(ZERO);
                return;
            }
            Some(last) => {
                let first = src[frac.clone()]
                    .iter()
                    .position(|&d| d != b'0')
                    .unwrap_or(last);
                (
                    frac.start + first..frac.start + last + 1,
                    0..0,
                    exponent - (last as i128 + 1),
                )
            }
        }
    };
    if negative {
        out.push(b'-');
    }
    extend_short::<16>(out, src, head.start, head.len());
    extend_short::<16>(out, src, tail.start, tail.len());
    write_exponent(out, exponent);
}

/// Writes `e<exponent>;`, or just `;` for a zero exponent.
fn write_exponent(out: &mut Vec<u8>, exponent: i128) {
    // One-digit exponents, the common case, are written with one store.
    match exponent {
        0 => out.push(b';'),
        1..=9 => out.extend_from_slice(&[b'e', b'0' + exponent as u8, b';']),
        -9..=-1 => out.extend_from_slice(&[b'e', b'-', b'0' + exponent.unsigned_abs() as u8, b';']),
        _ => {
            out.push(b'e');
            if exponent < 0 {
                out.push(b'-');
            }
            write_decimal(out, exponent.unsigned_abs());
            out.push(b';');
        }
    }
}

fn write_decimal(out: &mut Vec<u8>, mut n: u128) {
    let mut buf = [0u8; 39];
    let mut i = buf.len();
    while n != 0 {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.extend_from_slice(&buf[i..]);
}
