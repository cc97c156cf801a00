//! Strict JSON number grammar and exact decimal normalisation.

use std::ops::Range;

use super::encode::{extend_short, malformed};
use super::ArgumentsError;

/// Exponent parts with more significant digits than this are refused.
const MAX_EXPONENT_DIGITS: usize = 18;

/// Parses the number starting at `src[start]` (a `-` or a digit), appends its canonical
/// encoding to `out` and returns the position just past it.
pub(super) fn encode(src: &[u8], start: usize, out: &mut Vec<u8>) -> Result<usize, ArgumentsError> {
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
    if !matches!(src.get(pos), Some(b'.' | b'e' | b'E')) {
        write_integer(out, negative, src, int_start..pos);
        return Ok(pos);
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

    write_canonical(out, negative, src, int, frac, exponent);
    Ok(pos)
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
    if exponent != 0 {
        out.push(b'e');
        if exponent < 0 {
            out.push(b'-');
        }
        let magnitude = exponent.unsigned_abs();
        if magnitude < 10 {
            out.push(b'0' + magnitude as u8);
        } else {
            write_decimal(out, magnitude);
        }
    }
    out.push(b';');
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
