//! The walk before a `models.loop` round, reading Lua's tables in place: a faster form of
//! `loop_walk.rs` (same question, same answers where it answers).
//!
//! Why by hand: the API walk still costs a `lua_next` per entry (each one finds its key's
//! slot again by hashing), about 0.1 µs per record on a long conversation, the largest share
//! of a round. Lua keeps a table as two plain arrays (an array part and a hash part of
//! nodes); comparing those slots with a Rust-side image of them is a few loads per slot, and
//! no crate offers it. An equal slot holds the same key and value (numbers by subtype and
//! bits, everything else by object address, as the API walk names them), and equal slots in
//! equal sizes traverse in the same order, so an unchanged image proves an unchanged record
//! exactly as the API walk does.
//!
//! # Soundness
//!
//! - **Layout.** [`RawTable`] and [`RawNode`] mirror Lua 5.5's `Table` and `Node`
//!   (`lobject.h`), and the array part is read as `ltable.h` lays it out (values below the
//!   `array` pointer, a `u32` length hint, then one tag byte per slot). That layout is a fact
//!   of the Lua the crate is built with, so it is pinned at build time: mlua's `lua55` build
//!   compiles Lua 5.5.1 from `lua-src`, which this crate's manifest pins to the exact release
//!   the mirrors were written against (a Lua update is then a deliberate change that brings
//!   this module's review with it). On top of that, nothing here is used until
//!   [`layout_holds`] has confirmed the layout on tables built for the purpose: the header's
//!   type tag, the sizes, and every slot of a table with array, hash, integer, float,
//!   boolean, string and table entries, against the traversal `lua_next` makes of the same
//!   table. If any probe disagrees, the raw form is never used and the API walk of
//!   `loop_walk.rs` does all the work.
//! - **Liveness.** Every table read is reached from the list passed in, through the slots of
//!   tables that are themselves reachable, while the Lua state is suspended in this host call:
//!   no Lua code and no collection step can run during a read (nothing here calls into Lua),
//!   so every object read lives and no slot changes under the read. Addresses remembered from
//!   an earlier round are only compared as numbers, never followed.
//! - **Bounds.** A table's hash part is `2^lsizenode` nodes (a table without one points at
//!   Lua's static one-node dummy, `lsizenode` 0); its array part is `asize` values below the
//!   `array` pointer and `asize` tags above the length hint, and `array` is only followed when
//!   `asize > 0`.
//! - **Initialised bytes only.** Lua writes a slot's tag whenever it creates or clears the
//!   slot, but leaves the value bytes of an empty, nil or boolean slot untouched (they may
//!   never have been written). A value or key payload is read only when its tag says one was
//!   stored ([`has_payload`]); the padding between fields is never read.
//!
//! Records nested deeper than the API walk follows are never reused, as there.

#![allow(unsafe_code)]

use std::os::raw::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use mlua::{Lua, Table, Value};

/// How deep a snapshot follows nested tables: one more level than a message's JSON may have
/// (`json::MAX_DEPTH`), so every record that passed the check fits.
pub(crate) const MAX_LEVELS: usize = crate::json::MAX_DEPTH + 2;

/// Lua 5.5's `Value`: one machine word of payload (a pointer, an integer or a float).
type RawValue = u64;

/// Lua 5.5's `Table` (`lobject.h`), field for field.
#[repr(C)]
struct RawTable {
    next: *mut c_void,
    tt: u8,
    marked: u8,
    flags: u8,
    lsizenode: u8,
    asize: c_uint,
    array: *mut RawValue,
    node: *mut RawNode,
    metatable: *mut c_void,
    gclist: *mut c_void,
}

/// Lua 5.5's `Node` (`lobject.h`): a value, its tag, the key's tag, the chain link and the
/// key's payload.
#[repr(C)]
struct RawNode {
    value: RawValue,
    tt: u8,
    key_tt: u8,
    next: c_int,
    key: RawValue,
}

/// `LUA_VTABLE`, the header tag of a table object.
const VTABLE: u8 = 5;
/// `ctb(LUA_VTABLE)`: the tag of a slot holding a table.
const TABLE_TAG: u8 = VTABLE | 0x40;
/// `LUA_VNUMINT`: the tag of an integer (key or value).
const INTEGER_TAG: u8 = 3;

/// Whether a slot with this tag carries a payload: everything but nil (empty slots included)
/// and the booleans, whose value is their tag (`novariant` 0 and 1).
fn has_payload(tag: u8) -> bool {
    tag & 0x0F >= 2
}

/// One slot as an image keeps it: tags, and the payloads their tags say exist (0 otherwise).
/// A slot of the array part has no key of its own (its index is its key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    tag: u8,
    key_tag: u8,
    value: u64,
    key: u64,
}

/// Every empty slot as an image keeps it: `lua_next` skips it, so what it held before (the
/// collector marks the key of an emptied node dead, for one) changes nothing a walk reads.
const EMPTY: Slot = Slot {
    tag: 0,
    key_tag: 0,
    value: 0,
    key: 0,
};

/// An image is a list of words. A table is its address, its shape ([`shape`]), then each of
/// its slots in storage order: one word of tags ([`tags`]; 0 for an empty slot) followed by
/// the payloads those tags say exist (the value, then the key), a slot holding a table
/// followed at once by that table's image. Equal words up to a slot's tags mean equal
/// layouts from there, so the live table and the image are read in step without markers.
type Word = u64;

/// The image of a record no table matches (one taken too deep, or of a non-table): no live
/// table sits at address 0.
const NEVER: Word = 0;

/// A table's sizes as one word.
fn shape(asize: u32, lsizenode: u8) -> Word {
    (Word::from(asize) << 8) | Word::from(lsizenode)
}

/// A slot's tags as one word (an array slot's key tag is 0).
fn tags(slot: Slot) -> Word {
    Word::from(slot.tag) | (Word::from(slot.key_tag) << 8)
}

/// Whether this process's Lua lays tables out as [`RawTable`] says (checked once, see the
/// module's soundness section).
pub(crate) fn layout_holds() -> bool {
    static HOLDS: OnceLock<bool> = OnceLock::new();
    *HOLDS.get_or_init(|| probe().unwrap_or(false))
}

/// A table's header fields, read through the mirror.
///
/// # Safety
/// `t` is the address of a live table and [`layout_holds`] (or the probe running it) vouches
/// for the mirror.
unsafe fn header(t: *const RawTable) -> (u8, u8, u32) {
    // SAFETY: the caller's contract; each field is read on its own, never the padding.
    unsafe {
        (
            std::ptr::addr_of!((*t).tt).read(),
            std::ptr::addr_of!((*t).lsizenode).read(),
            std::ptr::addr_of!((*t).asize).read(),
        )
    }
}

/// Slot `k` of the array part of `t` (`k < asize`).
///
/// # Safety
/// As [`header`], and `k` is below the table's `asize`.
unsafe fn array_slot(t: *const RawTable, k: u32) -> Slot {
    // SAFETY: the caller's contract; `ltable.h`'s getArrTag / getArrVal.
    unsafe {
        let array = std::ptr::addr_of!((*t).array).read();
        let tag = array
            .cast::<u8>()
            .add(std::mem::size_of::<c_uint>() + k as usize)
            .read();
        if empty(tag) {
            return EMPTY;
        }
        let value = if has_payload(tag) {
            array.sub(1 + k as usize).read_unaligned()
        } else {
            0
        };
        Slot {
            tag,
            key_tag: 0,
            value,
            key: 0,
        }
    }
}

/// Node `i` of the hash part of `t` (`i < 2^lsizenode`).
///
/// # Safety
/// As [`header`], and `i` is below the table's node count.
unsafe fn node_slot(t: *const RawTable, i: usize) -> Slot {
    // SAFETY: the caller's contract; only fields are read, payloads only when present.
    unsafe {
        let node = std::ptr::addr_of!((*t).node).read().add(i);
        let tag = std::ptr::addr_of!((*node).tt).read();
        if empty(tag) {
            return EMPTY;
        }
        let key_tag = std::ptr::addr_of!((*node).key_tt).read();
        Slot {
            tag,
            key_tag,
            value: if has_payload(tag) {
                std::ptr::addr_of!((*node).value).read()
            } else {
                0
            },
            key: if has_payload(key_tag) {
                std::ptr::addr_of!((*node).key).read()
            } else {
                0
            },
        }
    }
}

/// Every slot of `t` in storage order (the array part, then the nodes): the order `lua_next`
/// visits the non-empty ones in.
///
/// # Safety
/// As [`header`].
unsafe fn each_slot(t: *const RawTable, mut f: impl FnMut(Slot) -> bool) -> bool {
    // SAFETY: the caller's contract; indices stay below the sizes the header gives.
    unsafe {
        let (_, lsizenode, asize) = header(t);
        for k in 0..asize {
            if !f(array_slot(t, k)) {
                return false;
            }
        }
        for i in 0..(1usize << lsizenode) {
            if !f(node_slot(t, i)) {
                return false;
            }
        }
        true
    }
}

/// Whether a slot with this tag is empty (`isempty`: a nil tag of any variant).
fn empty(tag: u8) -> bool {
    tag & 0x0F == 0
}

/// The slot `i` of `t` in storage order: the array part's `asize` slots, then the nodes.
///
/// # Safety
/// As [`header`], and `i` is below `asize + 2^lsizenode`.
unsafe fn slot(t: *const RawTable, asize: u32, i: usize) -> Slot {
    // SAFETY: the caller's contract.
    unsafe {
        match u32::try_from(i) {
            Ok(k) if k < asize => array_slot(t, k),
            _ => node_slot(t, i - asize as usize),
        }
    }
}

/// Appends the image of the table at `t` to `image`, `levels` deep at most (`false` when it
/// goes deeper).
///
/// # Safety
/// As [`header`].
unsafe fn take(
    t: *const RawTable,
    image: &mut Vec<Word>,
    hints: &mut Vec<usize>,
    levels: usize,
) -> bool {
    if levels == 0 {
        return false;
    }
    // SAFETY: the caller's contract; nested tables are reached through `t`'s own slots.
    unsafe {
        let (_, lsizenode, asize) = header(t);
        image.push(t as usize as Word);
        image.push(shape(asize, lsizenode));
        hints.push(t as usize);
        let node = std::ptr::addr_of!((*t).node).read() as usize;
        hints.push(node);
        if lsizenode > 0 {
            // A second node line: four 24-byte nodes span two.
            hints.push(node + 64);
        }
        if asize > 0 {
            // The first value sits just below the `array` pointer, the tags just above it.
            hints.push((std::ptr::addr_of!((*t).array).read() as usize).wrapping_sub(8));
        }
        for i in 0..asize as usize + (1usize << lsizenode) {
            let slot = slot(t, asize, i);
            image.push(tags(slot));
            if has_payload(slot.tag) {
                image.push(slot.value);
            }
            if has_payload(slot.key_tag) {
                image.push(slot.key);
            }
            if slot.tag == TABLE_TAG
                && !take(
                    slot.value as usize as *const RawTable,
                    image,
                    hints,
                    levels - 1,
                )
            {
                return false;
            }
        }
        true
    }
}

/// Whether the image word at `at` is `word` (a read past the image's end never is).
#[inline(always)]
fn word_is(image: &[Word], at: usize, word: Word) -> bool {
    image.get(at) == Some(&word)
}

/// Where `slot`'s image ends, if the image from `at` is `slot` (its tags, then the payloads
/// they say exist): the comparison [`take`] writes the image for.
#[inline(always)]
fn slot_is(image: &[Word], mut at: usize, slot: Slot) -> Option<usize> {
    word_is(image, at, tags(slot)).then_some(())?;
    at += 1;
    if has_payload(slot.tag) {
        word_is(image, at, slot.value).then_some(())?;
        at += 1;
    }
    if has_payload(slot.key_tag) {
        word_is(image, at, slot.key).then_some(())?;
        at += 1;
    }
    Some(at)
}

/// Whether the table at `t` matches the image from `at`: where its image ends if so. Reads
/// the table as [`take`] does, slot by slot; the position travels in a register rather than
/// behind a reference.
///
/// # Safety
/// As [`header`].
unsafe fn same(t: *const RawTable, image: &[Word], at: usize) -> Option<usize> {
    // SAFETY: the caller's contract; nested tables are reached through `t`'s own slots, and
    // an equal slot names the table its image was taken from.
    unsafe {
        let (_, lsizenode, asize) = header(t);
        if !word_is(image, at, t as usize as Word)
            || !word_is(image, at + 1, shape(asize, lsizenode))
        {
            return None;
        }
        // One slot and, when it holds a table, that table's image after it.
        let step = |at: usize, slot: Slot| -> Option<usize> {
            let at = slot_is(image, at, slot)?;
            if slot.tag == TABLE_TAG {
                same(slot.value as usize as *const RawTable, image, at)
            } else {
                Some(at)
            }
        };
        // The array part, then the nodes: `slot`'s order, a loop for each.
        let mut at = at + 2;
        for k in 0..asize {
            at = step(at, array_slot(t, k))?;
        }
        for i in 0..1usize << lsizenode {
            at = step(at, node_slot(t, i))?;
        }
        Some(at)
    }
}

/// How many records ahead of the one compared the walk asks the processor for.
const AHEAD: usize = 4;

/// A prefetch hint for the cache line at `address` (nothing on other targets).
#[inline]
fn prefetch(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing the program sees and never faults, for
    // any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(address.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// What the raw walk found in a list: `Some(prefix)` as the API walk answers, or `None` when
/// the list is laid out in a way this form leaves to the API walk.
pub(crate) enum Scan {
    Answer(Option<i64>),
    AskTheApi,
}

/// The records of one `models.loop` list as images of their tables.
#[derive(Debug, Default)]
pub(crate) struct RawSnapshot {
    /// The list's own address (the shim keeps it alive as `state.list`).
    list: Option<usize>,
    /// The remembered records' images, one after the other.
    image: Vec<Word>,
    /// Where each remembered record's image starts in `image`.
    starts: Vec<usize>,
    /// The memory each remembered record's walk reads (each table's header, the lines of
    /// its nodes and the start of its array part), as taken: what the walk asks the
    /// processor for a few records ahead. A record's tables lie one behind another (the
    /// record, its calls, a call, its arguments), so without the hints each is a miss the
    /// next one waits for. Only hints: an address is never followed, and one gone stale
    /// (the record changed) costs a wasted fetch.
    hints: Vec<usize>,
    /// Where each remembered record's hints start in `hints`.
    hint_starts: Vec<usize>,
}

impl RawSnapshot {
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }

    /// Asks the processor for what comparing record `i` will read.
    fn warm(&self, i: usize) {
        let Some(&start) = self.hint_starts.get(i) else {
            return;
        };
        let end = self
            .hint_starts
            .get(i + 1)
            .copied()
            .unwrap_or(self.hints.len());
        for &address in self.hints.get(start..end).unwrap_or_default() {
            prefetch(address as *const u8);
        }
    }

    fn record(&self, i: usize) -> Option<&[Word]> {
        let start = *self.starts.get(i)?;
        let end = self.starts.get(i + 1).copied().unwrap_or(self.image.len());
        self.image.get(start..end)
    }

    /// The walk of `Snapshot::unchanged_prefix` (`loop_walk.rs`) over raw slots. Only
    /// called when [`layout_holds`].
    pub(crate) fn scan(&self, list: &Value) -> Scan {
        let Value::Table(table) = list else {
            return Scan::Answer(None);
        };
        let address = table.to_pointer() as usize;
        if self.list != Some(address) {
            return Scan::AskTheApi;
        }
        let t = address as *const RawTable;
        let (mut n, mut p) = (0i64, 0i64);
        let mut reuse = true;
        let mut gap = false;
        let mut unusual = false;
        // SAFETY: `t` is the live list (held by `list`), the layout is vouched for, and the
        // records compared are reached through its slots; see the module's soundness section.
        unsafe {
            let (_, _, asize) = header(t);
            let mut k = 0u32;
            each_slot(t, |slot| {
                let in_array = k < asize;
                if in_array && reuse {
                    self.warm(k as usize + AHEAD);
                }
                k = k.saturating_add(1);
                if empty(slot.tag) {
                    gap |= in_array;
                    return true;
                }
                // Keys must come out as 1, 2, ... in traversal order.
                let key_ok = if in_array {
                    !gap
                } else {
                    slot.key_tag == INTEGER_TAG && slot.key as i64 == n + 1
                };
                if !key_ok {
                    unusual = true;
                    return false;
                }
                n += 1;
                if reuse {
                    reuse = slot.tag == TABLE_TAG
                        && usize::try_from(n - 1)
                            .ok()
                            .and_then(|i| self.record(i))
                            .is_some_and(|held| {
                                same(slot.value as usize as *const RawTable, held, 0)
                                    == Some(held.len())
                            });
                    if reuse {
                        p = n;
                    }
                }
                true
            });
        }
        if unusual {
            Scan::AskTheApi
        } else {
            Scan::Answer(Some(p))
        }
    }

    /// Remembers `table`'s records after the first `kept` as they are now (see
    /// `Snapshot::remember` (`loop_walk.rs`)). Only called when [`layout_holds`].
    pub(crate) fn remember(&mut self, table: &Table, kept: usize) -> mlua::Result<()> {
        let kept = kept.min(self.len());
        if let Some(&start) = self.starts.get(kept) {
            self.image.truncate(start);
        }
        self.starts.truncate(kept);
        if let Some(&start) = self.hint_starts.get(kept) {
            self.hints.truncate(start);
        }
        self.hint_starts.truncate(kept);
        self.list = Some(table.to_pointer() as usize);
        for n in kept.saturating_add(1)..=table.raw_len() {
            let record: Value = table.raw_get(n)?;
            self.starts.push(self.image.len());
            self.hint_starts.push(self.hints.len());
            let complete = match &record {
                // SAFETY: `record` holds the table alive while its image is taken, and the
                // layout is vouched for; see the module's soundness section.
                Value::Table(t) => unsafe {
                    take(
                        t.to_pointer().cast::<RawTable>(),
                        &mut self.image,
                        &mut self.hints,
                        MAX_LEVELS,
                    )
                },
                _ => false,
            };
            if !complete {
                let start = self.starts.last().copied().unwrap_or(0);
                self.image.truncate(start);
                self.image.push(NEVER);
                let start = self.hint_starts.last().copied().unwrap_or(0);
                self.hints.truncate(start);
            }
        }
        Ok(())
    }
}

/// The layout check behind [`layout_holds`]: tables built for the purpose, read both through
/// the mirror and through `lua_next` (mlua's `pairs`), must agree slot for slot.
fn probe() -> mlua::Result<bool> {
    if std::mem::size_of::<RawNode>() != 24 || std::mem::size_of::<*const u8>() != 8 {
        return Ok(false);
    }
    let lua = Lua::new();
    let (t, small): (Table, Table) = lua
        .load(
            r#"
            local t = { 10, 20, 30 }
            t.s = 'probe'
            t.f = 1.5
            t.yes, t.no = true, false
            t.nested = {}
            t[100] = 7
            t.gone = 1
            t.gone = nil
            return t, { 1, 2 }
            "#,
        )
        .eval()?;
    for table in [&t, &small] {
        let address = table.to_pointer().cast::<RawTable>();
        // SAFETY: `table` holds a live table; the probe reads only what the mirror says is
        // there, and stops at the first disagreement (the header tag, then the sizes).
        let raw = unsafe {
            let (tt, lsizenode, asize) = header(address);
            if tt != VTABLE || lsizenode > 8 || asize > 64 {
                return Ok(false);
            }
            let mut entries = Vec::new();
            let mut k = 0u32;
            each_slot(address, |slot| {
                k += 1;
                if !empty(slot.tag) {
                    let key = if k <= asize {
                        (INTEGER_TAG, u64::from(k))
                    } else {
                        (slot.key_tag, slot.key)
                    };
                    entries.push((key, (slot.tag, slot.value)));
                }
                true
            });
            entries
        };
        let mut api = Vec::new();
        for pair in table.pairs::<Value, Value>() {
            let (key, value) = pair?;
            let (Some(key), Some(value)) = (probe_ident(&lua, &key)?, probe_ident(&lua, &value)?)
            else {
                return Ok(false);
            };
            api.push((key, value));
        }
        if raw != api {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A value as the raw slots name it (tag and payload), for the probe's comparison.
fn probe_ident(lua: &Lua, value: &Value) -> mlua::Result<Option<(u8, u64)>> {
    Ok(Some(match value {
        Value::Integer(i) => (INTEGER_TAG, *i as u64),
        Value::Number(f) => (0x13, f.to_bits()),
        Value::Boolean(false) => (0x01, 0),
        Value::Boolean(true) => (0x11, 0),
        Value::String(_) => (0x44, object_address(lua, value)?),
        Value::Table(_) => (TABLE_TAG, object_address(lua, value)?),
        _ => return Ok(None),
    }))
}

/// The object address `lua_topointer` gives (mlua's `to_pointer` gives a string's bytes).
fn object_address(lua: &Lua, value: &Value) -> mlua::Result<u64> {
    // SAFETY: `exec_raw` calls this with `value` at index 1 in protected mode;
    // `lua_topointer` only reads it, and the stack is left holding the one integer returned.
    let address: i64 = unsafe {
        lua.exec_raw(value, |l| {
            let address = mlua::ffi::lua_topointer(l, 1) as usize as i64;
            mlua::ffi::lua_settop(l, 0);
            mlua::ffi::lua_pushinteger(l, address);
        })
    }?;
    Ok(address as u64)
}
