//! Canonical member order without rewriting.
//!
//! The parser appends every value's encoding to one buffer in input order. For each
//! object it records where the object and each member lie; members of an object that
//! is not already in canonical order are sorted (and deduplicated, last one wins) by
//! their index entries alone. The hashing pass then walks the buffer once, emitting
//! such objects' members in sorted order, so every byte is copied at most once however
//! deep the nesting.

use std::cmp::Ordering;
use std::ops::Range;

use sha2::{Digest, Sha256};

/// Member lists up to this length are sorted by insertion sort.
const INSERTION_SORT_MAX: usize = 16;

/// Bytes gathered before they are handed to the hasher.
const STAGE_BYTES: usize = 16 * 1024;

/// One encoded object member, by absolute positions in the output buffer.
#[derive(Clone, Copy)]
struct Member {
    start: usize,
    key_start: usize,
    key_end: usize,
    end: usize,
    /// The name's first eight bytes, big-endian, zero-padded.
    prefix: u64,
    /// Index in `Layout::objects` of the first object inside the value, if any.
    first_object: Option<usize>,
}

/// A member kept in canonical order: what [`Layout::write_range`] needs of it.
#[derive(Clone, Copy)]
struct Placed {
    start: usize,
    end: usize,
    first_object: Option<usize>,
}

impl Member {
    fn key<'a>(&self, out: &'a [u8]) -> &'a [u8] {
        &out[self.key_start..self.key_end]
    }

    fn cmp_key(&self, other: &Self, out: &[u8]) -> Ordering {
        self.prefix
            .cmp(&other.prefix)
            .then_with(|| self.key(out).cmp(other.key(out)))
    }
}

/// One object, by absolute positions in the output buffer; objects are listed in the
/// order their `{` appears.
#[derive(Clone)]
struct Object {
    open: usize,
    close: usize,
    /// Index in `Layout::objects` just past this object's descendants.
    subtree_end: usize,
    /// Sorted, deduplicated members in `Layout::sorted`; `None` when the input
    /// already lists the members in canonical order without duplicates.
    reordered: Option<Range<usize>>,
}

/// Positions of all objects and members of one encoding.
pub(super) struct Layout {
    open_members: Vec<Member>,
    sorted: Vec<Placed>,
    objects: Vec<Object>,
    any_reordered: bool,
    /// One entry per nesting depth: sibling objects at one depth tend to share keys.
    recent: Vec<RecentOrder>,
}

/// The key sequence of the last object (at some depth) that needed sorting and the
/// canonical order found for it. Arrays of records repeat the same keys in the same
/// order, so most such objects reuse this order after a linear comparison instead of
/// being sorted again.
struct RecentOrder {
    /// `(prefix, key_start, key_len)` of each member, in input order.
    keys: Vec<(u64, usize, usize)>,
    /// Indices of the members to keep, in canonical order.
    order: Vec<usize>,
}

impl RecentOrder {
    const fn new() -> Self {
        Self {
            keys: Vec::new(),
            order: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.order.clear();
    }

    fn matches(&self, list: &[Member], out: &[u8]) -> bool {
        list.len() == self.keys.len()
            && list
                .iter()
                .zip(&self.keys)
                .all(|(member, &(prefix, start, len))| {
                    member.prefix == prefix
                        && member.key_end - member.key_start == len
                        && (len <= 8 || member.key(out) == &out[start..start + len])
                })
    }

    fn learn(&mut self, list: &[Member], out: &[u8]) {
        self.keys.clear();
        self.keys.extend(
            list.iter()
                .map(|m| (m.prefix, m.key_start, m.key_end - m.key_start)),
        );
        let order = &mut self.order;
        order.clear();
        // When the names' first eight bytes all differ, they alone decide the order
        // and there can be no duplicates.
        if list.len() <= INSERTION_SORT_MAX {
            let mut packed = [0u128; INSERTION_SORT_MAX];
            let packed = &mut packed[..list.len()];
            for (slot, (i, member)) in packed.iter_mut().zip(list.iter().enumerate()) {
                *slot = (u128::from(member.prefix) << 64) | i as u128;
            }
            packed.sort_unstable();
            if packed.windows(2).all(|pair| pair[0] >> 64 != pair[1] >> 64) {
                order.extend(packed.iter().map(|&p| p as u64 as usize));
                return;
            }
        }
        order.extend(0..list.len());
        if list.len() <= INSERTION_SORT_MAX {
            for i in 1..order.len() {
                let current = order[i];
                let mut j = i;
                while j > 0 && list[order[j - 1]].cmp_key(&list[current], out) == Ordering::Greater
                {
                    order[j] = order[j - 1];
                    j -= 1;
                }
                order[j] = current;
            }
        } else {
            order.sort_unstable_by(|&a, &b| list[a].cmp_key(&list[b], out).then(a.cmp(&b)));
        }
        let mut kept = 0;
        for i in 0..order.len() {
            let overridden = order
                .get(i + 1)
                .is_some_and(|&next| list[next].cmp_key(&list[order[i]], out) == Ordering::Equal);
            if !overridden {
                order[kept] = order[i];
                kept += 1;
            }
        }
        order.truncate(kept);
    }
}

impl Layout {
    pub(super) const fn new() -> Self {
        Self {
            open_members: Vec::new(),
            sorted: Vec::new(),
            objects: Vec::new(),
            any_reordered: false,
            recent: Vec::new(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.open_members.clear();
        self.sorted.clear();
        self.objects.clear();
        self.any_reordered = false;
        for recent in &mut self.recent {
            recent.clear();
        }
    }

    /// Heap bytes held by the layout's buffers.
    pub(super) fn capacity_bytes(&self) -> usize {
        fn bytes<T>(v: &Vec<T>) -> usize {
            v.capacity() * size_of::<T>()
        }
        bytes(&self.open_members)
            + bytes(&self.sorted)
            + bytes(&self.objects)
            + bytes(&self.recent)
            + self
                .recent
                .iter()
                .map(|r| bytes(&r.keys) + bytes(&r.order))
                .sum::<usize>()
    }

    /// Records an object whose `{` is at `open`; returns its handle for [`Self::close_object`].
    pub(super) fn open_object(&mut self, open: usize) -> (usize, usize) {
        self.objects.push(Object {
            open,
            close: open,
            subtree_end: 0,
            reordered: None,
        });
        (self.objects.len() - 1, self.open_members.len())
    }

    /// The value of a member that is about to be parsed will start its objects here.
    pub(super) fn next_object(&self) -> usize {
        self.objects.len()
    }

    /// Records a member of the innermost open object; its encoding ends at `out.len()`.
    /// `prefix` is the name's first eight bytes, as computed by [`key_prefix`], and
    /// `first_object` is what [`Self::next_object`] returned before the value was parsed.
    pub(super) fn add_member(
        &mut self,
        out: &[u8],
        start: usize,
        key: Range<usize>,
        prefix: u64,
        first_object: usize,
    ) {
        self.open_members.push(Member {
            start,
            key_start: key.start,
            key_end: key.end,
            end: out.len(),
            prefix,
            first_object: (first_object < self.objects.len()).then_some(first_object),
        });
    }

    /// Closes the object opened as `handle` at nesting `depth`; its `}` is the last byte of `out`.
    pub(super) fn close_object(&mut self, out: &[u8], handle: (usize, usize), depth: usize) {
        let (index, first_member) = handle;
        let subtree_end = self.objects.len();
        let object = &mut self.objects[index];
        object.close = out.len();
        object.subtree_end = subtree_end;
        let list = &self.open_members[first_member..];
        if list
            .windows(2)
            .all(|pair| pair[0].cmp_key(&pair[1], out) == Ordering::Less)
        {
            self.open_members.truncate(first_member);
            return;
        }
        if self.recent.len() <= depth {
            self.recent.resize_with(depth + 1, RecentOrder::new);
        }
        let recent = &mut self.recent[depth];
        if !recent.matches(list, out) {
            recent.learn(list, out);
        }
        let first_sorted = self.sorted.len();
        self.sorted.extend(recent.order.iter().map(|&i| Placed {
            start: list[i].start,
            end: list[i].end,
            first_object: list[i].first_object,
        }));
        object.reordered = Some(first_sorted..self.sorted.len());
        self.any_reordered = true;
        self.open_members.truncate(first_member);
    }

    /// Feeds the canonical encoding (the parse-order encoding `out` with every object's
    /// members in canonical order) to `dst`.
    pub(super) fn write_canonical(&self, out: &[u8], dst: &mut impl Output) {
        if !self.any_reordered {
            dst.write(out);
            return;
        }
        let mut pieces = Pieces {
            out,
            run: 0..0,
            dst,
        };
        self.write_range(0..out.len(), 0, &mut pieces);
        pieces.flush();
    }

    /// Writes `out[range]`, whose first object (if any) is `self.objects[next_object]`.
    fn write_range(
        &self,
        range: Range<usize>,
        mut next_object: usize,
        pieces: &mut Pieces<'_, impl Output>,
    ) {
        let mut pos = range.start;
        while let Some(object) = self.objects.get(next_object) {
            if object.open >= range.end {
                break;
            }
            let Some(members) = &object.reordered else {
                next_object += 1;
                continue;
            };
            pieces.take(pos..object.open + 1);
            for member in &self.sorted[members.clone()] {
                match member.first_object {
                    Some(first) => self.write_range(member.start..member.end, first, pieces),
                    None => pieces.take(member.start..member.end),
                }
            }
            pieces.take(object.close - 1..object.close);
            pos = object.close;
            next_object = object.subtree_end;
        }
        pieces.take(pos..range.end);
    }
}

/// Coalesces consecutive ranges of `out` before writing them to `dst`.
struct Pieces<'a, O: Output> {
    out: &'a [u8],
    run: Range<usize>,
    dst: &'a mut O,
}

impl<O: Output> Pieces<'_, O> {
    #[inline]
    fn take(&mut self, range: Range<usize>) {
        if range.start == self.run.end {
            self.run.end = range.end;
        } else if !range.is_empty() {
            self.flush();
            self.run = range;
        }
    }

    fn flush(&mut self) {
        self.dst.write_part(self.out, self.run.clone());
    }
}

/// The first eight bytes of `bytes[start..start + len]`, big-endian, zero-padded.
#[inline]
pub(super) fn key_prefix(bytes: &[u8], start: usize, len: usize) -> u64 {
    match bytes.get(start..start + 8) {
        Some(chunk) => {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let word = u64::from_be_bytes(word);
            if len >= 8 {
                word
            } else {
                word & !(u64::MAX >> (8 * len))
            }
        }
        None => {
            let word = bytes[start..start + len]
                .iter()
                .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
            word.checked_shl(8 * (8 - len) as u32).unwrap_or(0)
        }
    }
}

/// Destination of the canonical encoding.
pub(super) trait Output {
    fn write(&mut self, bytes: &[u8]);

    /// Writes `buf[range]`; `buf` may be read beyond `range` (the bytes are not written).
    fn write_part(&mut self, buf: &[u8], range: Range<usize>) {
        self.write(&buf[range]);
    }
}

impl Output for Vec<u8> {
    fn write(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// SHA-256 fed through a staging buffer, so that many small pieces cost one hasher call.
pub(super) struct Sink<'a> {
    hasher: Sha256,
    stage: &'a mut Vec<u8>,
}

impl<'a> Sink<'a> {
    /// Starts a digest whose input begins with the concatenation of `header`.
    pub(super) fn new(stage: &'a mut Vec<u8>, header: &[&[u8]]) -> Self {
        stage.clear();
        stage.reserve(STAGE_BYTES);
        let mut sink = Self {
            hasher: Sha256::new(),
            stage,
        };
        if header.iter().map(|part| part.len()).sum::<usize>() <= STAGE_BYTES {
            for part in header {
                sink.stage.extend_from_slice(part);
            }
        } else {
            for part in header {
                sink.hasher.update(part);
            }
        }
        sink
    }

    pub(super) fn finish(self) -> [u8; 32] {
        let mut hasher = self.hasher;
        hasher.update(&self.stage);
        hasher.finalize().into()
    }
}

impl Output for Sink<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        if self.stage.len() + bytes.len() > STAGE_BYTES {
            self.hasher.update(&self.stage);
            self.stage.clear();
            if bytes.len() > STAGE_BYTES {
                self.hasher.update(bytes);
                return;
            }
        }
        self.stage.extend_from_slice(bytes);
    }

    /// Copies short pieces as one fixed-size block, which avoids a `memcpy` call per piece.
    #[inline]
    fn write_part(&mut self, buf: &[u8], range: Range<usize>) {
        const BLOCK: usize = 32;
        let len = range.len();
        match buf.get(range.start..range.start + BLOCK) {
            Some(block) if len <= BLOCK && self.stage.len() + BLOCK <= STAGE_BYTES => {
                let mut copy = [0u8; BLOCK];
                copy.copy_from_slice(block);
                self.stage.extend_from_slice(&copy);
                self.stage.truncate(self.stage.len() - BLOCK + len);
            }
            _ => self.write(&buf[range]),
        }
    }
}
