//! Canonical member order.
//!
//! The parser appends every value's encoding to one buffer in input order and records
//! where each member of the objects being parsed lies. When an object closes, its
//! members are put in canonical order (sorted by name, duplicates dropped, last one
//! wins), in one of two ways:
//!
//! * an object of at most [`IN_PLACE_MAX`] bytes is rewritten in place, as long as the
//!   bytes so rewritten stay within twice the output size, which keeps the copying
//!   linear however deep the nesting;
//! * any other object keeps its input order in the buffer, and its sorted member list
//!   is recorded; the hashing pass then walks the buffer once, emitting such objects'
//!   members in sorted order.

use std::cmp::Ordering;
use std::ops::Range;

use sha2::{Digest, Sha256};

/// Member lists up to this length are sorted by insertion sort.
const INSERTION_SORT_MAX: usize = 16;

/// Objects with at most this many members are sorted directly, which costs less than
/// consulting [`RecentOrder`].
const SMALL_OBJECT: usize = 8;

/// Largest object (in encoded bytes) that is put in order by rewriting it in place.
const IN_PLACE_MAX: usize = 4096;

/// Size of the fixed blocks in which short pieces are copied (reading past them), which
/// avoids a `memcpy` call per piece.
const BLOCK: usize = 32;

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
}

/// A member kept in canonical order: what [`Layout::write_range`] needs of it.
#[derive(Clone, Copy)]
struct Placed {
    start: usize,
    end: usize,
    /// Index in `Layout::objects` of the first object that opens after `start`.
    first_object: usize,
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

/// Sorts a list of at most [`SMALL_OBJECT`] members, dropping overridden duplicates.
/// Leaves the indices of the members kept, in canonical order, in the low 64 bits of
/// the first entries of `order` and returns their number; returns `None` when `list` is
/// already in canonical order.
fn sort_small(list: &[Member], out: &[u8], order: &mut [u128; SMALL_OBJECT]) -> Option<usize> {
    // Usually the names' first eight bytes all differ and alone decide the order, so
    // sort (prefix, index) pairs first.
    let mut moved = false;
    for (i, member) in list.iter().enumerate() {
        let item = (u128::from(member.prefix) << 64) | i as u128;
        let mut at = i;
        while at > 0 && order[at - 1] > item {
            order[at] = order[at - 1];
            at -= 1;
        }
        moved |= at != i;
        order[at] = item;
    }
    if order[..list.len()]
        .windows(2)
        .any(|pair| pair[0] >> 64 == pair[1] >> 64)
    {
        return sort_small_by_name(list, out, order);
    }
    moved.then_some(list.len())
}

/// [`sort_small`] comparing whole names, for lists where some names share a prefix.
#[inline(never)]
fn sort_small_by_name(
    list: &[Member],
    out: &[u8],
    order: &mut [u128; SMALL_OBJECT],
) -> Option<usize> {
    let mut len = 0;
    let mut reordered = false;
    for (i, member) in list.iter().enumerate() {
        let mut at = len;
        let mut ordering = Ordering::Less;
        while at > 0 {
            ordering = list[order[at - 1] as usize].cmp_key(member, out);
            if ordering != Ordering::Greater {
                break;
            }
            at -= 1;
        }
        if ordering == Ordering::Equal {
            order[at - 1] = i as u128;
            reordered = true;
            continue;
        }
        if at < len {
            reordered = true;
            let mut j = len;
            while j > at {
                order[j] = order[j - 1];
                j -= 1;
            }
        }
        order[at] = i as u128;
        len += 1;
    }
    reordered.then_some(len)
}

/// Rewrites the object whose `{` is at `out[open]` and which ends `out`, emitting the
/// members `list[i]` for `i` in `order`. The members are gathered in `scratch`, whose
/// contents do not matter and whose length only grows, then copied back.
fn rewrite_in_place(
    out: &mut Vec<u8>,
    open: usize,
    list: &[Member],
    order: impl Iterator<Item = usize>,
    scratch: &mut Vec<u8>,
) {
    let body = open + 1;
    let size = out.len() - body;
    // Slack at the end of both buffers lets each short member be read and written as
    // one block; writing through a slice keeps `scratch` from growing in the loop.
    out.extend_from_slice(&[0; BLOCK]);
    if scratch.len() < size + BLOCK {
        scratch.resize(size + BLOCK, 0);
    }
    // Plain slices, unlike the vectors, cannot alias each other, so their pointers and
    // lengths stay in registers.
    let (from, to) = (out.as_slice(), scratch.as_mut_slice());
    let mut pos = 0;
    for i in order {
        let Member { start, end, .. } = list[i];
        let len = end - start;
        if len <= BLOCK {
            to[pos..pos + BLOCK].copy_from_slice(&from[start..start + BLOCK]);
        } else {
            to[pos..pos + len].copy_from_slice(&from[start..end]);
        }
        pos += len;
    }
    to[pos] = b'}';
    out.truncate(body);
    out.extend_from_slice(&scratch[..=pos]);
}

/// One object whose members are put in order while hashing (or that contains such an
/// object), by absolute positions in the output buffer; objects are listed in the order
/// their `{` appears.
#[derive(Clone)]
struct Object {
    open: usize,
    /// Set, like `subtree_end`, only when `reordered` is.
    close: usize,
    /// Index in `Layout::objects` just past this object's descendants.
    subtree_end: usize,
    /// Sorted, deduplicated members in `Layout::sorted`; `None` when the input
    /// already lists the members in canonical order without duplicates.
    reordered: Option<Range<usize>>,
}

/// What [`Layout::open_object`] records for [`Layout::close_object`].
pub(super) struct OpenObject {
    index: usize,
    first_member: usize,
    /// Position of the object's `{` in the output buffer.
    open: usize,
}

/// Positions of the objects and members of one encoding that still need ordering.
pub(super) struct Layout {
    open_members: Vec<Member>,
    sorted: Vec<Placed>,
    /// Every open object, and every closed one with members still out of order in
    /// the buffer (or with such a descendant).
    objects: Vec<Object>,
    any_reordered: bool,
    /// One entry per nesting depth: sibling objects at one depth tend to share keys.
    recent: Vec<RecentOrder>,
    /// Where the members of an object rewritten in place are gathered.
    scratch: Vec<u8>,
    /// Bytes rewritten in place so far.
    rewritten: usize,
}

/// The key sequence of the last object (at some depth) that needed sorting and the
/// canonical order found for it. Arrays of records repeat the same keys in the same
/// order, so most such objects reuse this order after a linear comparison instead of
/// being sorted again. The names are copied, as their bytes in the output buffer may
/// be rewritten.
struct RecentOrder {
    /// `(prefix, length)` of each name, in input order.
    keys: Vec<(u64, usize)>,
    /// The names longer than eight bytes, concatenated in input order.
    long_names: Vec<u8>,
    /// Indices of the members to keep, in canonical order.
    order: Vec<usize>,
}

impl RecentOrder {
    const fn new() -> Self {
        Self {
            keys: Vec::new(),
            long_names: Vec::new(),
            order: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.long_names.clear();
        self.order.clear();
    }

    fn matches(&self, list: &[Member], out: &[u8]) -> bool {
        if list.len() != self.keys.len() {
            return false;
        }
        let mut long_names = self.long_names.as_slice();
        list.iter().zip(&self.keys).all(|(member, &(prefix, len))| {
            if member.prefix != prefix || member.key_end - member.key_start != len {
                return false;
            }
            if len <= 8 {
                return true;
            }
            let (name, rest) = long_names.split_at(len);
            long_names = rest;
            member.key(out) == name
        })
    }

    fn learn(&mut self, list: &[Member], out: &[u8]) {
        self.keys.clear();
        self.long_names.clear();
        for member in list {
            let len = member.key_end - member.key_start;
            self.keys.push((member.prefix, len));
            if len > 8 {
                self.long_names.extend_from_slice(member.key(out));
            }
        }
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
            scratch: Vec::new(),
            rewritten: 0,
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
        self.rewritten = 0;
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
            + bytes(&self.scratch)
            + self
                .recent
                .iter()
                .map(|r| bytes(&r.keys) + bytes(&r.long_names) + bytes(&r.order))
                .sum::<usize>()
    }

    /// Records an object whose `{` is at `open`; returns its handle for [`Self::close_object`].
    pub(super) fn open_object(&mut self, open: usize) -> OpenObject {
        self.objects.push(Object {
            open,
            close: open,
            subtree_end: 0,
            reordered: None,
        });
        OpenObject {
            index: self.objects.len() - 1,
            first_member: self.open_members.len(),
            open,
        }
    }

    /// Records a member of the innermost open object; its encoding ends at `out.len()`.
    /// `prefix` is the name's first eight bytes, as computed by [`key_prefix`].
    pub(super) fn add_member(&mut self, out: &[u8], start: usize, key: Range<usize>, prefix: u64) {
        self.open_members.push(Member {
            start,
            key_start: key.start,
            key_end: key.end,
            end: out.len(),
            prefix,
        });
    }

    /// Closes the object opened as `handle` at nesting `depth`; its `}` is the last byte
    /// of `out`, which may be rewritten to put the object's members in order.
    pub(super) fn close_object(&mut self, out: &mut Vec<u8>, handle: OpenObject, depth: usize) {
        let list = &self.open_members[handle.first_member..];
        if list.len() <= SMALL_OBJECT {
            let mut order = [0; SMALL_OBJECT];
            match sort_small(list, out, &mut order) {
                Some(len) => {
                    let order = order[..len].iter().map(|&item| item as u64 as usize);
                    self.place(out, handle, order);
                }
                None => self.settle(handle),
            }
        } else if list
            .windows(2)
            .all(|pair| pair[0].cmp_key(&pair[1], out) == Ordering::Less)
        {
            self.settle(handle);
        } else {
            if self.recent.len() <= depth {
                self.recent.resize_with(depth + 1, RecentOrder::new);
            }
            let recent = &mut self.recent[depth];
            if !recent.matches(list, out) {
                recent.learn(list, out);
            }
            // Taken out for the duration, as `place` borrows all of `self`.
            let order = std::mem::take(&mut recent.order);
            self.place(out, handle, order.iter().copied());
            self.recent[depth].order = order;
        }
    }

    /// Finishes closing an object whose members are in canonical order in `out`.
    fn settle(&mut self, handle: OpenObject) {
        // Descendants still listed in `objects` have members out of order in `out`;
        // without any, the entry is not needed.
        if self.objects.len() == handle.index + 1 {
            self.objects.truncate(handle.index);
        }
        self.open_members.truncate(handle.first_member);
    }

    /// Finishes closing an object whose members belong in the order `order` (indices
    /// into its member list): rewrites it in place when it is small enough and the
    /// budget allows, and otherwise records the order for the hashing pass.
    fn place(&mut self, out: &mut Vec<u8>, handle: OpenObject, order: impl Iterator<Item = usize>) {
        let OpenObject {
            index,
            first_member,
            open,
        } = handle;
        let list = &self.open_members[first_member..];
        let size = out.len() - open;
        if self.objects.len() == index + 1
            && size <= IN_PLACE_MAX
            && self.rewritten + size <= 2 * out.len()
        {
            rewrite_in_place(out, open, list, order, &mut self.scratch);
            self.rewritten += size;
            self.objects.truncate(index);
        } else {
            let first_sorted = self.sorted.len();
            let inside = &self.objects[index + 1..];
            self.sorted.extend(order.map(|i| Placed {
                start: list[i].start,
                end: list[i].end,
                first_object: index + 1 + inside.partition_point(|o| o.open < list[i].start),
            }));
            self.any_reordered = true;
            let subtree_end = self.objects.len();
            let object = &mut self.objects[index];
            object.close = out.len();
            object.subtree_end = subtree_end;
            object.reordered = Some(first_sorted..self.sorted.len());
        }
        self.open_members.truncate(first_member);
    }

    /// Whether some object's members are out of order in the buffer.
    pub(super) fn any_reordered(&self) -> bool {
        self.any_reordered
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
                self.write_range(member.start..member.end, member.first_object, pieces);
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
    /// Starts a digest.
    pub(super) fn new(stage: &'a mut Vec<u8>) -> Self {
        stage.clear();
        stage.reserve(STAGE_BYTES);
        Self {
            hasher: Sha256::new(),
            stage,
        }
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
