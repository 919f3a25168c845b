//! [`crate::json::to_json`] through Lua's C API: the same JSON data, a few times cheaper.
//!
//! Why by hand: the general conversion reads a table through mlua's `pairs`, which turns every
//! string and table it meets into a reference-counted registry handle; converting the records
//! a `models.loop` round appends cost more than the rest of the round's checks. Here a
//! `lua_next` walk reads each key and value off the Lua stack and copies strings straight out
//! of Lua's memory. It takes only the common shapes (sequences `1..n`, tables whose keys are
//! all strings, scalars, the null stand-in) and hands everything else back to the general
//! conversion ([`crate::json::to_json`]), which also reports every failure: the answer is the
//! general conversion's, always.
//!
//! # Soundness
//!
//! Everything runs inside `Lua::exec_raw`, which calls the closure in protected mode with the
//! value at index 1 and restores the stack afterwards. Only C API functions that cannot raise
//! and, but for growing the stack, do not allocate in Lua are called (so no `longjmp` crosses
//! a Rust frame and no table changes during the walk):
//!
//! - `lua_next` raises only for a key its table does not hold; each call passes nil or the key
//!   the previous call on the same table left, and nothing writes to any table meanwhile.
//! - `lua_tolstring` is called on strings only, where it returns the string's own bytes
//!   without converting or allocating; the bytes are copied out while the string is on the
//!   stack.
//! - `lua_type`, `lua_toboolean`, `lua_isinteger`, `lua_tointegerx` (on integers),
//!   `lua_tonumberx` (on numbers), `lua_touserdata`, `lua_topointer`, `lua_pushnil`,
//!   `lua_gettop` and `lua_settop` neither raise nor allocate.
//! - Stack space is asked for with `lua_checkstack`, which answers 0 instead of raising; a
//!   refusal hands the value to the general conversion. Growing the stack allocates, and a
//!   failed allocation first runs an emergency collection, which moves no object, runs no
//!   finalizer and changes no entry a traversal visits (it marks dead only the keys of
//!   emptied slots, which `lua_next` skips and still finds).
//! - Recursion follows the value's nesting and stops at [`crate::json::MAX_DEPTH`] levels
//!   (deeper values go to the general conversion, which reports them).

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::raw::c_int;

use mlua::ffi::{self, lua_State};
use mlua::{Lua, Value};
use serde_json::{Map, Number, Value as Json};

use crate::json::{self, MAX_DEPTH, NotJson};

/// [`json::to_json_within`], through the C API where it can.
pub(crate) fn to_json_within(
    lua: &Lua,
    value: &Value,
    root: &str,
    parent: *const c_void,
) -> Result<Json, NotJson> {
    match fast(lua, value, vec![parent]) {
        Some(data) => Ok(data),
        None => json::to_json_within(value, root, parent),
    }
}

/// [`json::to_json`], through the C API where it can.
pub(crate) fn to_json(lua: &Lua, value: &Value, root: &str) -> Result<Json, NotJson> {
    match fast(lua, value, Vec::new()) {
        Some(data) => Ok(data),
        None => json::to_json(value, root),
    }
}

/// The conversion of `value` when it has only the shapes this walk takes; `None` otherwise.
fn fast(lua: &Lua, value: &Value, mut ancestors: Vec<*const c_void>) -> Option<Json> {
    match value {
        Value::Table(_) => {}
        // Scalars need no walk; the general conversion is as cheap.
        _ => return None,
    }
    let mut found = None;
    // SAFETY: see the module's soundness section; `value_at` keeps every rule listed there.
    let done = unsafe {
        lua.exec_raw::<()>(value, |l| {
            found = value_at(l, 1, &mut ancestors);
            ffi::lua_settop(l, 0);
        })
    };
    done.ok().and(found)
}

/// A key of a table this walk converts.
enum Key {
    Index(i64),
    Text(Vec<u8>),
}

/// The value at `index` as JSON data, or `None` for a shape left to the general conversion.
///
/// # Safety
/// `index` is an absolute, valid index; see the module's soundness section.
unsafe fn value_at(
    l: *mut lua_State,
    index: c_int,
    ancestors: &mut Vec<*const c_void>,
) -> Option<Json> {
    // SAFETY (every call in this function): see the module's soundness section.
    unsafe {
        match ffi::lua_type(l, index) {
            ffi::LUA_TNIL => Some(Json::Null),
            ffi::LUA_TBOOLEAN => Some(Json::Bool(ffi::lua_toboolean(l, index) != 0)),
            ffi::LUA_TNUMBER => {
                if ffi::lua_isinteger(l, index) != 0 {
                    Some(Json::Number(Number::from(ffi::lua_tointegerx(
                        l,
                        index,
                        std::ptr::null_mut(),
                    ))))
                } else {
                    Number::from_f64(ffi::lua_tonumberx(l, index, std::ptr::null_mut()))
                        .map(Json::Number)
                }
            }
            ffi::LUA_TSTRING => Some(Json::String(
                String::from_utf8_lossy(bytes_at(l, index)).into_owned(),
            )),
            ffi::LUA_TLIGHTUSERDATA if ffi::lua_touserdata(l, index).is_null() => Some(Json::Null),
            ffi::LUA_TTABLE => table_at(l, index, ancestors),
            _ => None,
        }
    }
}

/// The bytes of the string at `index` (valid while it stays on the stack).
///
/// # Safety
/// The value at `index` is a string; see the module's soundness section.
unsafe fn bytes_at<'a>(l: *mut lua_State, index: c_int) -> &'a [u8] {
    // SAFETY: on a string `lua_tolstring` returns its own bytes and their length.
    unsafe {
        let mut len = 0usize;
        let data = ffi::lua_tolstring(l, index, &mut len);
        if data.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(data.cast::<u8>(), len)
        }
    }
}

/// The table at `index` as a JSON array (keys exactly `1..n`) or object (string keys only).
///
/// # Safety
/// The value at `index` is a table; see the module's soundness section.
unsafe fn table_at(
    l: *mut lua_State,
    index: c_int,
    ancestors: &mut Vec<*const c_void>,
) -> Option<Json> {
    // SAFETY (every call in this function): see the module's soundness section.
    unsafe {
        let address = ffi::lua_topointer(l, index);
        if ancestors.contains(&address)
            || ancestors.len() >= MAX_DEPTH
            || ffi::lua_checkstack(l, 4) == 0
        {
            return None;
        }
        let base = ffi::lua_gettop(l);
        let mut entries: Vec<(Key, Json)> = Vec::new();
        ancestors.push(address);
        ffi::lua_pushnil(l);
        let mut complete = true;
        while ffi::lua_next(l, index) != 0 {
            // the key at base + 1, the value at base + 2
            let key = match ffi::lua_type(l, base + 1) {
                ffi::LUA_TNUMBER if ffi::lua_isinteger(l, base + 1) != 0 => {
                    Key::Index(ffi::lua_tointegerx(l, base + 1, std::ptr::null_mut()))
                }
                ffi::LUA_TSTRING => Key::Text(bytes_at(l, base + 1).to_vec()),
                _ => {
                    complete = false;
                    break;
                }
            };
            match value_at(l, base + 2, ancestors) {
                Some(value) => entries.push((key, value)),
                None => {
                    complete = false;
                    break;
                }
            }
            ffi::lua_settop(l, base + 1);
        }
        ffi::lua_settop(l, base);
        ancestors.pop();
        if !complete {
            return None;
        }
        shape(entries)
    }
}

/// The entries of a table as an array (keys exactly `1..n`, `n >= 1`) or an object (string
/// keys only, written in byte order as the general conversion writes them, so of two keys
/// that read the same once made UTF-8 the later one stays); `None` for any other mix.
fn shape(mut entries: Vec<(Key, Json)>) -> Option<Json> {
    let n = entries.len();
    let sequence = n > 0
        && entries.iter().all(|(key, _)| match key {
            Key::Index(i) => *i >= 1 && usize::try_from(*i).is_ok_and(|i| i <= n),
            Key::Text(_) => false,
        });
    if sequence {
        entries.sort_by_key(|(key, _)| match key {
            Key::Index(i) => *i,
            Key::Text(_) => 0,
        });
        return Some(Json::Array(entries.into_iter().map(|(_, v)| v).collect()));
    }
    let mut texts = Vec::with_capacity(n);
    for (key, value) in entries {
        match key {
            Key::Text(text) => texts.push((text, value)),
            Key::Index(_) => return None,
        }
    }
    texts.sort_by(|a, b| a.0.cmp(&b.0));
    let mut map = Map::new();
    for (text, value) in texts {
        map.insert(String::from_utf8_lossy(&text).into_owned(), value);
    }
    Some(Json::Object(map))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    /// Every shape, taken or left: the answer is always the general conversion's.
    #[test]
    fn the_answer_is_always_the_general_conversions() {
        let lua = Lua::new();
        let cases = [
            "return { role = 'user', content = 'hi' }",
            "return { role = 'assistant', content = '', tool_calls = { { id = 'c1', name = 'f', arguments = { a = 1, b = 2.5, c = true, d = { 1, 2, 3 } } } } }",
            "return {}",
            "return { 1, 2, nil, 4 }",
            "return { [1] = 'a', [3] = 'c' }",
            "return { [2] = 'b', [1] = 'a' }",
            "return { 'a', x = 1 }",
            "return { [1.5] = 'f' }",
            "return { [true] = 1 }",
            "return { f = function() end }",
            "return { n = 0/0 }",
            "return { n = 1/0 }",
            "return { s = '\\xff\\xfe', ['\\xff'] = 1, ['\\xfe'] = 2 }",
            "local t = {} t.self = t return t",
            "local t = { x = {} } t.x.up = t return t",
            "return { big = math.maxinteger, small = math.mininteger, neg = -0.0 }",
            "local t = {} local c = t for _ = 1, 130 do c.n = {} c = c.n end return t",
            "local t = {} local c = t for _ = 1, 100 do c.n = {} c = c.n end return t",
            "return { u = coroutine.create(function() end) }",
        ];
        for case in cases {
            let value: Value = lua.load(case).eval().unwrap();
            assert_eq!(
                to_json(&lua, &value, "messages"),
                json::to_json(&value, "messages"),
                "{case}"
            );
            let parent = lua.create_table().unwrap();
            assert_eq!(
                to_json_within(&lua, &value, "messages", parent.to_pointer()),
                json::to_json_within(&value, "messages", parent.to_pointer()),
                "{case}"
            );
        }
        // The null stand-in and a value inside its own parent.
        let t = lua.create_table().unwrap();
        t.raw_set("n", Value::NULL).unwrap();
        let value = Value::Table(t.clone());
        assert_eq!(
            to_json(&lua, &value, "v").unwrap(),
            serde_json::json!({ "n": null })
        );
        assert!(to_json_within(&lua, &value, "v", t.to_pointer()).is_err());
    }
}
