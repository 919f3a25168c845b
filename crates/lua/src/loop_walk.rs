//! The raw walk before a `models.loop` round: which leading records of the list are exactly the
//! ones checked last time (see `loop_list.rs` for the scheme).
//!
//! Why `unsafe` (here, and in `loop_raw.rs`, the in-place form this module hands the walk to
//! when this process's Lua allows it; the snapshot below is its fallback): chapter 11 checks the
//! whole list before every round, so a record edited in place must be caught, and plain Lua
//! offers no write stamp on a table. The only way to know a record is untouched is to look at
//! every entry of it, every round. Done in Lua bytecode (`for k, v in next, t`) that look cost
//! about 1,500 machine instructions per entry, three quarters of a round's CPU on a long
//! conversation; through mlua's safe API every key and value becomes a reference-counted
//! handle. Here it is a direct `lua_next` walk over the Lua stack, comparing each entry with a
//! Rust-side [`Snapshot`]: a handful of C API calls per entry. mlua exposes the C API for
//! exactly this (`Lua::exec_raw`).
//!
//! A snapshot names every key and value of a record tree by its [`Ident`]: booleans, integers
//! and floats by value (a float bit for bit, so `0.0` and `-0.0` differ, and `1` never equals
//! `1.0`), everything else (strings, tables, functions) by the object's address. An address
//! only names an object while it lives, so the shim keeps every object a snapshot names
//! reachable for as long as the snapshot is used (`anchor` in `shim/models.lua`): no address
//! in a snapshot can be reused by a new object. Two strings with equal bytes at different
//! addresses count as a change, which only costs that record a fresh check.
//!
//! # Soundness
//!
//! Everything below runs inside `Lua::exec_raw`, which calls the closure in protected mode
//! with its arguments on the stack and restores the stack afterwards. The closure only calls
//! C API functions that cannot raise an error (no `longjmp` can cross a Rust frame) and, but
//! for growing the stack, do not allocate in Lua (no table can change under the walk):
//!
//! - `lua_next` raises only for a key the table does not hold. Each call passes either nil or
//!   the key the previous call on the same table returned, and no table is written during the
//!   walk (nothing here writes, and no Lua code runs), so the key is always present.
//! - `lua_type`, `lua_toboolean`, `lua_isinteger`, `lua_tointegerx` (called on integers
//!   only), `lua_tonumberx` (called on numbers only), `lua_topointer`, `lua_rawlen`,
//!   `lua_rawgeti`, `lua_pushnil`, `lua_settop` and `lua_gettop` neither raise nor allocate;
//!   none runs a metamethod.
//! - Stack space: `lua_checkstack` returns 0 instead of raising when the stack cannot grow;
//!   every level asks for its slots first and gives the conservative answer if refused
//!   ("changed", so the record is converted and checked from scratch, which is always right).
//!   Growing the stack allocates, and an allocation that fails first runs an emergency
//!   collection: it moves no object, runs no finalizer and changes no entry a traversal
//!   visits (it only marks dead the keys of emptied slots, which `lua_next` skips and still
//!   finds).
//! - Every raw access (`lua_next`, `lua_rawgeti`, `lua_rawlen`) is made on an index whose type
//!   was just checked to be a table. Indices are absolute, so pushes never shift them.
//! - Recursion is bounded: a comparison descends only as deep as its snapshot does, and a
//!   snapshot is taken to at most [`MAX_LEVELS`] levels (deeper records are never reused).
//!
//! Rust allocation inside the closure (a snapshot's `Vec`) is not a Lua allocation: on failure
//! it aborts the process, it never unwinds through Lua.

#![allow(unsafe_code)]

use std::os::raw::c_int;

use mlua::ffi::{self, lua_State};
use mlua::{Lua, Value};

use crate::loop_raw::{self, MAX_LEVELS, RawSnapshot, Scan};

/// Stack slots one level of a walk uses at most: a key and its value.
const LEVEL_SLOTS: c_int = 4;

/// A value as a snapshot names it: its Lua type tag and a payload (see the module's opening).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ident {
    tag: i32,
    payload: u64,
}

/// Closes a table's entries in a snapshot (never a Lua type tag).
const END: Ident = Ident {
    tag: -100,
    payload: 0,
};
/// The tag of an integer (a float keeps `LUA_TNUMBER`).
const INTEGER_TAG: i32 = -101;

/// The records of one `models.loop` list as they were when last checked: kept as images of
/// their tables' slots when this process's Lua allows reading them in place (`loop_raw.rs`),
/// else as the [`Ident`]s the API walk compares.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The in-place form, when [`loop_raw::layout_holds`]; the fields below stay empty then.
    raw: Option<RawSnapshot>,
    /// The list's own address (the shim keeps that list alive as `state.list`).
    list: Option<u64>,
    /// Every remembered record in list order: the record's own [`Ident`], then its entries as
    /// `key, value` pairs in raw traversal order, each table value followed by its own entries
    /// and [`END`], then the record's [`END`].
    idents: Vec<Ident>,
    /// Where each remembered record starts in `idents`.
    starts: Vec<usize>,
}

impl Default for Snapshot {
    fn default() -> Self {
        Self::with_raw(loop_raw::layout_holds())
    }
}

impl Snapshot {
    /// A snapshot in the in-place form (`raw`) or the API walk's.
    fn with_raw(raw: bool) -> Self {
        Self {
            raw: raw.then(RawSnapshot::default),
            list: None,
            idents: Vec::new(),
            starts: Vec::new(),
        }
    }

    /// Forgets every record.
    pub(crate) fn clear(&mut self) {
        *self = Self::with_raw(self.raw.is_some());
    }

    /// How many records it remembers.
    pub(crate) fn len(&self) -> usize {
        match &self.raw {
            Some(raw) => raw.len(),
            None => self.starts.len(),
        }
    }

    /// The idents of record `i` (0-based).
    fn record(&self, i: usize) -> Option<&[Ident]> {
        let start = *self.starts.get(i)?;
        let end = self.starts.get(i + 1).copied().unwrap_or(self.idents.len());
        self.idents.get(start..end)
    }

    /// How many leading records of `list` are the records remembered, each holding exactly
    /// what it held then, when `list` is the list remembered; `None` when `list` is not a
    /// plain sequence (keys 1..n in traversal order), which takes the full conversion.
    pub(crate) fn unchanged_prefix(&self, lua: &Lua, list: &Value) -> mlua::Result<Option<usize>> {
        if let Some(raw) = &self.raw
            && let Scan::Answer(found) = raw.scan(list)
        {
            return Ok(found.and_then(|p| usize::try_from(p).ok()));
        }
        // The API walk (in the in-place form it holds no records, so it only tells a plain
        // sequence, with no prefix reused, from the rest).
        // SAFETY: see the module's soundness section; `scan` keeps every rule listed there.
        let found: Option<i64> = unsafe {
            lua.exec_raw(list, |l| {
                let answer = self.scan(l, 1);
                ffi::lua_settop(l, 0);
                match answer {
                    Some(p) => ffi::lua_pushinteger(l, p),
                    None => ffi::lua_pushnil(l),
                }
            })
        }?;
        Ok(found.and_then(|p| usize::try_from(p).ok()))
    }

    /// Remembers `list` and its records after the first `kept` (which stay as they are),
    /// as they are now. A record the snapshot cannot follow to its end is remembered in a
    /// form no record matches, so it is always checked again.
    pub(crate) fn remember(&mut self, lua: &Lua, list: &Value, kept: usize) -> mlua::Result<()> {
        if let Some(raw) = &mut self.raw {
            return match list {
                Value::Table(table) => raw.remember(table, kept),
                _ => {
                    raw.clear();
                    Ok(())
                }
            };
        }
        let kept = kept.min(self.len());
        if let Some(&start) = self.starts.get(kept) {
            self.idents.truncate(start);
        }
        self.starts.truncate(kept);
        // SAFETY: see the module's soundness section; `record_all` keeps every rule there.
        unsafe {
            lua.exec_raw::<()>(list, |l| {
                self.record_all(l, 1, kept);
                ffi::lua_settop(l, 0);
            })
        }
    }

    /// The walk behind [`Snapshot::unchanged_prefix`] over the list at `list`.
    ///
    /// # Safety
    /// `l` is the state `exec_raw` passes, `list` an absolute index in it.
    unsafe fn scan(&self, l: *mut lua_State, list: c_int) -> Option<i64> {
        // SAFETY (every call in this function): see the module's soundness section.
        unsafe {
            if ffi::lua_type(l, list) != ffi::LUA_TTABLE || ffi::lua_checkstack(l, LEVEL_SLOTS) == 0
            {
                return None;
            }
            let mut reuse = self.list.is_some() && self.list == Some(address(l, list));
            let base = ffi::lua_gettop(l);
            let (mut n, mut p) = (0i64, 0i64);
            ffi::lua_pushnil(l);
            while ffi::lua_next(l, list) != 0 {
                // the key at base + 1, the record at base + 2
                n += 1;
                if integer_at(l, base + 1) != Some(n) {
                    ffi::lua_settop(l, base);
                    return None;
                }
                if reuse {
                    let held = usize::try_from(n - 1).ok().and_then(|i| self.record(i));
                    reuse = match held {
                        Some(held) => same_record(l, base + 2, held),
                        None => false,
                    };
                    if reuse {
                        p = n;
                    }
                }
                ffi::lua_settop(l, base + 1);
            }
            ffi::lua_settop(l, base);
            Some(p)
        }
    }

    /// Records the entries of the list at `list` from record `kept + 1` on.
    ///
    /// # Safety
    /// `l` is the state `exec_raw` passes, `list` an absolute index in it.
    unsafe fn record_all(&mut self, l: *mut lua_State, list: c_int, kept: usize) {
        // SAFETY (every call in this function): see the module's soundness section.
        unsafe {
            if ffi::lua_type(l, list) != ffi::LUA_TTABLE || ffi::lua_checkstack(l, LEVEL_SLOTS) == 0
            {
                self.clear();
                return;
            }
            self.list = Some(address(l, list));
            let len = ffi::lua_rawlen(l, list);
            let base = ffi::lua_gettop(l);
            for n in kept.saturating_add(1)..=len {
                let Ok(index) = i64::try_from(n) else { break };
                ffi::lua_rawgeti(l, list, index);
                self.starts.push(self.idents.len());
                let record = ident(l, base + 1);
                self.idents.push(record);
                let complete = record.tag == ffi::LUA_TTABLE
                    && take(l, base + 1, &mut self.idents, MAX_LEVELS);
                if !complete {
                    // Matches no record: a table's entries never start with END twice.
                    self.idents.extend([END, END]);
                }
                ffi::lua_settop(l, base);
            }
        }
    }
}

/// Whether the table at `t` is the record `held` names, holding exactly what it held.
///
/// # Safety
/// `t` is an absolute index; see the module's soundness section.
unsafe fn same_record(l: *mut lua_State, t: c_int, held: &[Ident]) -> bool {
    // SAFETY: see the module's soundness section.
    unsafe {
        let Some((first, rest)) = held.split_first() else {
            return false;
        };
        if *first != ident(l, t) || first.tag != ffi::LUA_TTABLE {
            return false;
        }
        let mut at = 0;
        same_entries(l, t, rest, &mut at) && at == rest.len()
    }
}

/// Whether the table at `t` holds exactly the entries `held[*at..]` names (up to their
/// [`END`]), in the same traversal order; advances `at` past them.
///
/// # Safety
/// `t` is an absolute index holding a table; see the module's soundness section.
unsafe fn same_entries(l: *mut lua_State, t: c_int, held: &[Ident], at: &mut usize) -> bool {
    // SAFETY (every call in this function): see the module's soundness section.
    unsafe {
        if ffi::lua_checkstack(l, LEVEL_SLOTS) == 0 {
            return false;
        }
        let base = ffi::lua_gettop(l);
        let mut equal = true;
        ffi::lua_pushnil(l);
        while ffi::lua_next(l, t) != 0 {
            // the key at base + 1, the value at base + 2
            let value = ident(l, base + 2);
            equal = held.get(*at) == Some(&ident(l, base + 1)) && held.get(*at + 1) == Some(&value);
            *at += 2;
            if equal && value.tag == ffi::LUA_TTABLE {
                equal = same_entries(l, base + 2, held, at);
            }
            if !equal {
                break;
            }
            ffi::lua_settop(l, base + 1);
        }
        ffi::lua_settop(l, base);
        if equal && held.get(*at) == Some(&END) {
            *at += 1;
            true
        } else {
            false
        }
    }
}

/// Appends the entries of the table at `t` and their [`END`] to `idents`, following nested
/// tables `levels` deep at most; `false` when the table goes deeper.
///
/// # Safety
/// `t` is an absolute index holding a table; see the module's soundness section.
unsafe fn take(l: *mut lua_State, t: c_int, idents: &mut Vec<Ident>, levels: usize) -> bool {
    // SAFETY (every call in this function): see the module's soundness section.
    unsafe {
        if levels == 0 || ffi::lua_checkstack(l, LEVEL_SLOTS) == 0 {
            return false;
        }
        let base = ffi::lua_gettop(l);
        let mut complete = true;
        ffi::lua_pushnil(l);
        while ffi::lua_next(l, t) != 0 {
            let value = ident(l, base + 2);
            idents.extend([ident(l, base + 1), value]);
            if value.tag == ffi::LUA_TTABLE && !take(l, base + 2, idents, levels - 1) {
                complete = false;
                break;
            }
            ffi::lua_settop(l, base + 1);
        }
        ffi::lua_settop(l, base);
        if complete {
            idents.push(END);
        }
        complete
    }
}

/// The value at `index` as a snapshot names it.
///
/// # Safety
/// `index` is valid; see the module's soundness section.
unsafe fn ident(l: *mut lua_State, index: c_int) -> Ident {
    // SAFETY (every call in this function): see the module's soundness section.
    unsafe {
        let tag = ffi::lua_type(l, index);
        let payload = match tag {
            ffi::LUA_TNIL => 0,
            ffi::LUA_TBOOLEAN => u64::from(ffi::lua_toboolean(l, index) != 0),
            ffi::LUA_TNUMBER => {
                if let Some(integer) = integer_at(l, index) {
                    return Ident {
                        tag: INTEGER_TAG,
                        payload: integer as u64,
                    };
                }
                ffi::lua_tonumberx(l, index, std::ptr::null_mut()).to_bits()
            }
            _ => address(l, index),
        };
        Ident { tag, payload }
    }
}

/// The address of the collectable value at `index`.
///
/// # Safety
/// `index` is valid; see the module's soundness section.
unsafe fn address(l: *mut lua_State, index: c_int) -> u64 {
    // SAFETY: `lua_topointer` only reads the value's address.
    unsafe { ffi::lua_topointer(l, index) as usize as u64 }
}

/// The integer at `index`, if the value there is one (never a float or a numeric string).
///
/// # Safety
/// `index` is valid; see the module's soundness section.
unsafe fn integer_at(l: *mut lua_State, index: c_int) -> Option<i64> {
    // SAFETY: see the module's soundness section; `lua_tointegerx` only reads an integer here.
    unsafe {
        (ffi::lua_isinteger(l, index) != 0)
            .then(|| ffi::lua_tointegerx(l, index, std::ptr::null_mut()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    /// Both forms: the API walk, and the in-place one (which this platform's Lua allows).
    const MODES: [bool; 2] = [false, true];

    #[test]
    fn this_lua_allows_the_in_place_form() {
        assert!(loop_raw::layout_holds());
    }

    fn setup(raw: bool) -> (Lua, Value, Snapshot) {
        let lua = Lua::new();
        let list: Value = lua
            .load(
                r#"
                long = string.rep('x', 100)
                msgs = {
                  { role = 'system', content = 's' },
                  { role = 'user', content = long, n = 1, f = 0.0, b = true },
                  { role = 'assistant', content = '', tool_calls = {
                      { id = 'c1', name = 'look', arguments = { k = 'v', deep = { 1, 2 } } } } },
                  { role = 'tool', content = 'r1', tool_call_id = 'c1' },
                }
                return msgs
                "#,
            )
            .eval()
            .unwrap();
        let mut snapshot = Snapshot::with_raw(raw);
        snapshot.remember(&lua, &list, 0).unwrap();
        (lua, list, snapshot)
    }

    #[test]
    fn a_growing_list_whose_last_records_sit_in_the_hash_part() {
        // Appending past the array part puts the new integer keys in the hash part until the
        // next rehash; both forms read them in traversal order.
        for raw in MODES {
            for len in [1, 5, 17, 33, 300] {
                let lua = Lua::new();
                let list: Value = lua
                    .load(format!(
                        "msgs = {{}} for i = 1, {len} do msgs[#msgs + 1] = {{ role = 'user', content = 'm' .. i }} end return msgs"
                    ))
                    .eval()
                    .unwrap();
                let mut snapshot = Snapshot::with_raw(raw);
                snapshot.remember(&lua, &list, 0).unwrap();
                assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(len));
                lua.load("msgs[#msgs + 1] = { role = 'user', content = 'new' }")
                    .exec()
                    .unwrap();
                assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(len));
                lua.load(format!("msgs[{len}].content = 'edited'"))
                    .exec()
                    .unwrap();
                assert_eq!(
                    snapshot.unchanged_prefix(&lua, &list).unwrap(),
                    Some(len - 1),
                    "{len}"
                );
                lua.load(format!("msgs[{}] = 1", len + 5)).exec().unwrap();
                assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), None);
            }
        }
    }

    #[test]
    fn a_collection_clearing_emptied_keys_changes_nothing() {
        // An emptied slot is skipped by every walk, whatever the collector does to its key.
        for raw in MODES {
            let lua = Lua::new();
            let list: Value = lua
                .load(
                    "msgs = { { role = 'user', content = 'a', tmp = 1 }, { role = 'user', content = 'b' } }
                     msgs[1].tmp = nil
                     return msgs",
                )
                .eval()
                .unwrap();
            let mut snapshot = Snapshot::with_raw(raw);
            snapshot.remember(&lua, &list, 0).unwrap();
            lua.load("collectgarbage(); collectgarbage()")
                .exec()
                .unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(2));
        }
    }

    #[test]
    fn an_untouched_list_is_reused_whole() {
        for raw in MODES {
            let (lua, list, snapshot) = setup(raw);
            assert_eq!(snapshot.len(), 4);
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(4));
            // Appended records are new: the prefix stays at the records remembered.
            lua.load("msgs[5] = { role = 'user', content = 'more' }")
                .exec()
                .unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(4));
        }
    }

    #[test]
    fn every_kind_of_edit_ends_the_prefix_at_its_record() {
        for raw in MODES {
            for (edit, prefix) in [
                ("msgs[1].content = 't'", 0),
                ("msgs[2].content = string.rep('x', 99) .. 'y'", 1),
                ("msgs[2].n = 1.0", 1),
                ("msgs[2].n = 2", 1),
                ("msgs[2].f = -0.0", 1),
                ("msgs[2].b = false", 1),
                ("msgs[2].extra = 1", 1),
                ("msgs[2].n = nil", 1),
                ("msgs[3].tool_calls[1].arguments.k = 'w'", 2),
                ("msgs[3].tool_calls[1].arguments.deep[2] = 3", 2),
                ("msgs[3].tool_calls[1].arguments.deep[3] = 3", 2),
                (
                    "msgs[3].tool_calls[1].arguments = { k = 'v', deep = { 1, 2 } }",
                    2,
                ),
                (
                    "msgs[4] = { role = 'tool', content = 'r1', tool_call_id = 'c1' }",
                    3,
                ),
                ("msgs[4].tool_call_id = 'c' .. '1' .. ''", 4),
            ] {
                let (lua, list, snapshot) = setup(raw);
                lua.load(edit).exec().unwrap();
                assert_eq!(
                    snapshot.unchanged_prefix(&lua, &list).unwrap(),
                    Some(prefix),
                    "{edit}"
                );
            }
        }
    }

    #[test]
    fn an_equal_long_string_at_a_new_address_counts_as_a_change() {
        for raw in MODES {
            // Conservative: the record is checked again, never wrongly reused.
            let (lua, list, snapshot) = setup(raw);
            lua.load("msgs[2].content = string.rep('x', 50) .. string.rep('x', 50)")
                .exec()
                .unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(1));
        }
    }

    #[test]
    fn another_list_or_a_list_with_holes() {
        for raw in MODES {
            let (lua, list, snapshot) = setup(raw);
            let copy: Value = lua
                .load("local c = {} for i, v in ipairs(msgs) do c[i] = v end return c")
                .eval()
                .unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &copy).unwrap(), Some(0));
            lua.load("msgs.x = 1").exec().unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), None);
            let not_a_table = Value::Integer(3);
            assert_eq!(snapshot.unchanged_prefix(&lua, &not_a_table).unwrap(), None);
        }
    }

    #[test]
    fn remembering_keeps_the_prefix_and_retakes_the_rest() {
        for raw in MODES {
            let (lua, list, mut snapshot) = setup(raw);
            lua.load("msgs[4].content = 'r2'; msgs[5] = { role = 'user', content = 'u' }")
                .exec()
                .unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(3));
            snapshot.remember(&lua, &list, 3).unwrap();
            assert_eq!(snapshot.len(), 5);
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(5));
            lua.load("msgs[5] = nil").exec().unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(4));
        }
    }

    #[test]
    fn a_record_deeper_than_the_snapshot_follows_is_never_reused() {
        for raw in MODES {
            let lua = Lua::new();
            let list: Value = lua
            .load(
                r#"
                local deep = {}
                local t = deep
                for _ = 1, 200 do t.next = {}; t = t.next end
                msgs = { { role = 'user', content = 'a' }, { role = 'user', content = 'b', x = deep } }
                return msgs
                "#,
            )
            .eval()
            .unwrap();
            let mut snapshot = Snapshot::with_raw(raw);
            snapshot.remember(&lua, &list, 0).unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(1));
            // A non-table record is remembered in a form nothing matches, too.
            lua.load("msgs[1] = 'text'").exec().unwrap();
            snapshot.remember(&lua, &list, 0).unwrap();
            assert_eq!(snapshot.unchanged_prefix(&lua, &list).unwrap(), Some(0));
        }
    }
}
