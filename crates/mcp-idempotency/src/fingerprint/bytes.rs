//! Byte copying shared by the parser and the number encoder.

/// Appends `src[start..start + len]`; runs of at most `BLOCK` bytes are copied as one fixed-size
/// block (reading past the run when `src` allows), which avoids a `memcpy` call.
#[inline(always)]
pub(super) fn extend_short<const BLOCK: usize>(
    out: &mut Vec<u8>,
    src: &[u8],
    start: usize,
    len: usize,
) {
    match src.get(start..start + BLOCK) {
        Some(block) if len <= BLOCK => {
            let mut copy = [0u8; BLOCK];
            copy.copy_from_slice(block);
            out.extend_from_slice(&copy);
            out.truncate(out.len() - BLOCK + len);
        }
        _ => out.extend_from_slice(&src[start..start + len]),
    }
}
