//! Deterministic table iteration and `table.concat` with `__tostring`.
//!
//! Stock Lua leaves the order of `pairs` and `next` unspecified. A section VM replaces both with
//! versions that visit a table's raw keys in one fixed order (chapter 05, "Deterministic table
//! iteration"):
//!
//! 1. the array part `1..#t` (raw border), in index order;
//! 2. booleans, `false` before `true`;
//! 3. numbers, integers and floats in one sequence by exact value;
//! 4. strings that are valid UTF-8, bytewise;
//! 5. a trailing group: strings that are not valid UTF-8, infinite numbers, then tables,
//!    functions, userdata, threads (these by identity, so stable while they live but not fixed
//!    from run to run).
//!
//! `table.concat` is replaced by a version that also joins values rendering through
//! `__tostring` (chapter 05, "Joining values with table.concat").
//!
//! The replacements raise their errors as plain Lua strings, exactly like stock Lua's
//! `luaL_error` (message prefixed with the caller's position when the caller is a Lua function),
//! so each public function is a small Lua wrapper (compiled once per process, then loaded from
//! bytecode by each [`install`]) around Rust callbacks that do the work and report what to
//! raise. The wrappers also make `pairs` hand a
//! `__pairs` metamethod's call back to Lua as a tail call, so that call is not made from Rust.

use std::cmp::Ordering;
#[cfg(test)]
use std::sync::OnceLock;

#[cfg(test)]
use mlua::chunk::ChunkMode;
use mlua::{Function, IntoLuaMulti, Lua, MultiValue, Table, Value};

/// 2^63 as a float: the first float above every `i64`.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

#[cfg(test)]
/// The chunk name of the wrappers, seen in tracebacks.
const WRAPPERS_NAME: &str = "=promptforge.order";

#[cfg(test)]
/// The wrappers compiled once per process: every later [`install`] loads this bytecode instead
/// of compiling the source again. The chunk reads no globals (everything it uses is passed in),
/// so the bytecode is independent of the state it was compiled in.
static WRAPPERS_BYTECODE: OnceLock<Vec<u8>> = OnceLock::new();

/// The Lua wrappers. They receive the Rust callbacks and the stock functions they need, and
/// return `pairs`, `next` and `table.concat`. Errors are raised at level 2, which is where stock
/// Lua's `luaL_error` in a C function points: the caller of `pairs` / `next` / `concat`.
pub const WRAPPERS: &str = r#"
local dispatch, stock_concat, tostring, type, error, select, rawget = ...

-- One Rust callback serves all five operations (one allocation per VM instead of five).
local function core_pairs(t) return dispatch(1, t) end
local function core_next(t, k) return dispatch(2, t, k) end
local function concat_nontable(n, list) return dispatch(3, n, list) end
local function concat_range(len, sep, i, j) return dispatch(4, len, sep, i, j) end
local function has_tostring(v) return dispatch(5, v) end

local function got(n, v)
  if n == 0 then return 'no value' end
  return type(v)
end

local function pairs(...)
  local t = ...
  if type(t) ~= 'table' then
    error("bad argument #1 to 'pairs' (table expected, got " .. got(select('#', ...), t) .. ')', 2)
  end
  -- `keys, n` for the ordered walk; `false, f` for a function __pairs `f`; `false, nil, msg`
  -- for any other __pairs.
  local keys, n, msg = core_pairs(t)
  if keys then
    -- The ordered walk over the snapshot `keys[1..n]`: ignores its arguments, reads values
    -- raw and live, skips cleared keys, and drops the snapshot once it reaches the end.
    local i, source = 0, t
    return function()
      while i < n do
        i = i + 1
        local k = keys[i]
        local v = rawget(source, k)
        if v ~= nil then return k, v end
      end
      keys, source = nil, nil
      return nil, nil
    end, t, nil
  end
  if msg then error(msg, 2) end
  return n(t)
end

local function next(...)
  local t, k = ...
  if type(t) ~= 'table' then
    error("bad argument #1 to 'next' (table expected, got " .. got(select('#', ...), t) .. ')', 2)
  end
  return core_next(t, k)
end

local function concat(...)
  local list, sep, i, j = ...
  if type(list) ~= 'table' then
    local msg = concat_nontable(select('#', ...), list)
    if msg then error(msg, 2) end
  end
  local first, last, msg = concat_range(#list, sep, i, j)
  if msg then error(msg, 2) end
  local buf, n = {}, 0
  for k = first, last do
    local v = list[k]
    local tv = type(v)
    if tv ~= 'string' and tv ~= 'number' then
      if not has_tostring(v) then
        error('invalid value (' .. tv .. ') at index ' .. k .. " in table for 'concat'", 2)
      end
      v = tostring(v)
    end
    n = n + 1
    buf[n] = v
  end
  return stock_concat(buf, sep, 1, n)
end

return pairs, next, concat
"#;

#[cfg(test)]
/// Replace the globals `pairs` and `next` and the function `table.concat` in `lua`'s globals
/// with the deterministic versions.
///
/// Call once per fresh Lua state, after the base library and `table` are loaded. The
/// `tostring`, `type`, `error`, `select` and `table.concat` in place at that moment are
/// captured, so later changes to those globals do not affect the replacements. So is `rawget`
/// when it is still a global (the `pairs` iterator then reads values through it, which is
/// faster); without it, a Rust raw read stands in. Setting the
/// three fields is raw, so a metatable already on `_G` is not consulted.
pub fn install(lua: &Lua) -> mlua::Result<()> {
    let globals = lua.globals();
    let table_lib: Table = required(&globals, "table")?;
    let stock_concat: Function = required(&table_lib, "concat")?;
    let tostring: Function = required(&globals, "tostring")?;
    let type_fn: Function = required(&globals, "type")?;
    let error: Function = required(&globals, "error")?;
    let select: Function = required(&globals, "select")?;
    // The sandbox has no `rawget` global; without one, a Rust raw read stands in.
    let rawget: Function = match globals.raw_get::<Option<Function>>("rawget")? {
        Some(rawget) => rawget,
        None => lua.create_function(|_, (t, k): (Table, Value)| t.raw_get::<Value>(k))?,
    };
    let dispatch = callbacks(lua)?;
    let (pairs, next, concat): (Function, Function, Function) = load_wrappers(lua)?.call((
        dispatch,
        stock_concat,
        tostring,
        type_fn,
        error,
        select,
        rawget,
    ))?;

    globals.raw_set("pairs", pairs)?;
    globals.raw_set("next", next)?;
    table_lib.raw_set("concat", concat)?;
    Ok(())
}

/// The one Rust callback [`WRAPPERS`] expects as its first argument: `dispatch(op, ...)` with
/// `op` 1 `core_pairs(t)`, 2 `core_next(t, k)`, 3 `concat_nontable(nargs, list)`,
/// 4 `concat_range(len, sep, i, j)`, 5 `has_tostring(v)`, 6 `reference_name(v)`. The section
/// VM's shim runs the
/// wrappers inside its own chunk, to save a chunk load per VM.
pub fn callbacks(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(
        |lua, (op, a, b, c, d): (i64, Value, Value, Value, Value)| match op {
            1 => match a {
                Value::Table(t) => core_pairs(lua, t),
                other => Err(mlua::Error::RuntimeError(format!(
                    "pairs expects a table, got {}",
                    other.type_name()
                ))),
            },
            2 => {
                let Value::Table(t) = a else {
                    return Err(mlua::Error::RuntimeError("next expects a table".into()));
                };
                match next_key(&t, &b)? {
                    Some(key) => {
                        let value: Value = t.raw_get(&key)?;
                        (key, value).into_lua_multi(lua)
                    }
                    None => (Value::Nil, Value::Nil).into_lua_multi(lua),
                }
            }
            3 => {
                let nargs = match a {
                    Value::Integer(n) => n,
                    _ => 0,
                };
                concat_nontable(nargs, &b).into_lua_multi(lua)
            }
            4 => match concat_range(lua, a, &b, c, d)? {
                Ok((first, last)) => (first, last).into_lua_multi(lua),
                Err(msg) => (Value::Nil, Value::Nil, msg).into_lua_multi(lua),
            },
            5 => has_tostring(&a).into_lua_multi(lua),
            _ => reference_name(lua, &a)?.into_lua_multi(lua),
        },
    )
}

/// The full deterministic raw key order of `table`: the array part `1..#t` first, then
/// booleans, numbers, strings and the trailing group (see the module docs). Only keys with a
/// non-nil raw value appear; `__index` and `__pairs` are never consulted.
pub fn ordered_keys(table: &Table) -> mlua::Result<Vec<Value>> {
    let border = border(table);
    let mut array: Vec<i64> = Vec::new();
    let mut rest: Vec<Value> = Vec::new();
    table.for_each::<Value, bool>(|key, _| {
        match key {
            Value::Integer(i) if (1..=border).contains(&i) => array.push(i),
            other => rest.push(other),
        }
        Ok(())
    })?;
    array.sort_unstable();
    let rest = sort_rest(rest);
    let mut keys = Vec::with_capacity(array.len() + rest.len());
    keys.extend(array.into_iter().map(Value::Integer));
    keys.extend(rest);
    Ok(keys)
}

#[cfg(test)]
/// The wrappers chunk as a function, from the cached bytecode when there is one.
fn load_wrappers(lua: &Lua) -> mlua::Result<Function> {
    if let Some(bytecode) = WRAPPERS_BYTECODE.get() {
        return lua
            .load(bytecode.as_slice())
            .set_name(WRAPPERS_NAME)
            .set_mode(ChunkMode::Binary)
            .into_function();
    }
    let function = lua
        .load(WRAPPERS)
        .set_name(WRAPPERS_NAME)
        .set_mode(ChunkMode::Text)
        .into_function()?;
    // A concurrent first install may have stored the same bytes already; either copy will do.
    let _ = WRAPPERS_BYTECODE.set(function.dump(false));
    Ok(function)
}

#[cfg(test)]
/// Look up a field that `install` cannot work without.
fn required<V: mlua::FromLua>(table: &Table, name: &str) -> mlua::Result<V> {
    table.raw_get::<Option<V>>(name)?.ok_or_else(|| {
        mlua::Error::RuntimeError(format!(
            "cannot install deterministic iteration: `{name}` is missing"
        ))
    })
}

/// The raw length `#t` (a border), the end of the array part.
fn border(table: &Table) -> i64 {
    i64::try_from(table.raw_len()).unwrap_or(i64::MAX)
}

/// The name Lua's `type()` gives a value.
fn lua_type_name(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "boolean",
        Value::Integer(_) | Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Table(_) => "table",
        Value::Function(_) => "function",
        Value::Thread(_) => "thread",
        _ => "userdata",
    }
}

// ---------------------------------------------------------------------------------------------
// The key order
// ---------------------------------------------------------------------------------------------

/// A key's place in the order outside the array part. Strings borrow their bytes.
#[derive(Clone, Copy, Debug)]
enum SortKey<'a> {
    Bool(bool),
    Int(i64),
    /// A finite float with no integer value in the `i64` range.
    Float(f64),
    /// A valid UTF-8 string.
    Str(&'a [u8]),
    /// A string that is not valid UTF-8 (trailing group).
    RawStr(&'a [u8]),
    /// An infinite (or NaN) number (trailing group).
    NonFinite(f64),
    /// A reference value (trailing group), by type rank and then identity.
    Object(u8, usize),
}

impl<'a> SortKey<'a> {
    /// The sort key of `value`; `bytes` must be the bytes of `value` when it is a string.
    fn of(value: &Value, bytes: Option<&'a [u8]>) -> Self {
        match value {
            Value::Boolean(b) => SortKey::Bool(*b),
            Value::Integer(i) => SortKey::Int(*i),
            Value::Number(f) => match float_as_integer(*f) {
                Some(i) => SortKey::Int(i),
                None if f.is_finite() => SortKey::Float(*f),
                None => SortKey::NonFinite(*f),
            },
            Value::String(_) => {
                let bytes = bytes.unwrap_or_default();
                if std::str::from_utf8(bytes).is_ok() {
                    SortKey::Str(bytes)
                } else {
                    SortKey::RawStr(bytes)
                }
            }
            other => {
                let rank = match other {
                    Value::Table(_) => 0,
                    Value::Function(_) => 1,
                    Value::UserData(_) | Value::Error(_) => 2,
                    Value::Thread(_) => 3,
                    Value::LightUserData(_) => 4,
                    _ => 5,
                };
                SortKey::Object(rank, other.to_pointer() as usize)
            }
        }
    }

    /// The group: booleans, numbers, strings, then the trailing group's parts.
    fn class(&self) -> u8 {
        match self {
            SortKey::Bool(_) => 0,
            SortKey::Int(_) | SortKey::Float(_) => 1,
            SortKey::Str(_) => 2,
            SortKey::RawStr(_) => 3,
            SortKey::NonFinite(_) => 4,
            SortKey::Object(..) => 5,
        }
    }

    fn compare(&self, other: &SortKey<'_>) -> Ordering {
        match (self, other) {
            (SortKey::Bool(a), SortKey::Bool(b)) => a.cmp(b),
            (SortKey::Int(a), SortKey::Int(b)) => a.cmp(b),
            (SortKey::Int(a), SortKey::Float(b)) => compare_int_float(*a, *b),
            (SortKey::Float(a), SortKey::Int(b)) => compare_int_float(*b, *a).reverse(),
            (SortKey::Float(a), SortKey::Float(b))
            | (SortKey::NonFinite(a), SortKey::NonFinite(b)) => a.total_cmp(b),
            (SortKey::Str(a), SortKey::Str(b)) | (SortKey::RawStr(a), SortKey::RawStr(b)) => {
                a.cmp(b)
            }
            (SortKey::Object(ra, pa), SortKey::Object(rb, pb)) => (ra, pa).cmp(&(rb, pb)),
            _ => self.class().cmp(&other.class()),
        }
    }
}

/// The integer a float equals exactly, when it is in the `i64` range (how Lua normalizes float
/// keys).
fn float_as_integer(f: f64) -> Option<i64> {
    if f.is_finite() && f.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&f) {
        Some(f as i64)
    } else {
        None
    }
}

/// Compare an integer with a finite float by exact value, with no rounding of the integer.
fn compare_int_float(i: i64, f: f64) -> Ordering {
    if f >= TWO_POW_63 {
        return Ordering::Less;
    }
    if f < -TWO_POW_63 {
        return Ordering::Greater;
    }
    // -2^63 <= floor(f) < 2^63, so the cast is exact.
    let floor = f.floor();
    match i.cmp(&(floor as i64)) {
        Ordering::Equal if f > floor => Ordering::Less,
        other => other,
    }
}

/// Compare two keys outside the array part.
fn compare_values(a: &Value, b: &Value) -> Ordering {
    let a_bytes = string_bytes(a);
    let b_bytes = string_bytes(b);
    SortKey::of(a, a_bytes.as_deref()).compare(&SortKey::of(b, b_bytes.as_deref()))
}

fn string_bytes(value: &Value) -> Option<mlua::BorrowedBytes> {
    match value {
        Value::String(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// Sort the keys outside the array part. String bytes are copied once into one buffer so the
/// comparisons stay cheap.
fn sort_rest(keys: Vec<Value>) -> Vec<Value> {
    let mut arena: Vec<u8> = Vec::new();
    let spans: Vec<Option<(usize, usize)>> = keys
        .iter()
        .map(|key| {
            string_bytes(key).map(|bytes| {
                let start = arena.len();
                arena.extend_from_slice(&bytes);
                (start, arena.len())
            })
        })
        .collect();
    let mut ranked: Vec<(SortKey<'_>, usize)> = keys
        .iter()
        .zip(&spans)
        .enumerate()
        .map(|(index, (key, span))| {
            let bytes = span.and_then(|(start, end)| arena.get(start..end));
            (SortKey::of(key, bytes), index)
        })
        .collect();
    ranked.sort_unstable_by(|a, b| a.0.compare(&b.0));
    let order: Vec<usize> = ranked.into_iter().map(|(_, index)| index).collect();
    let mut slots: Vec<Option<Value>> = keys.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|index| slots.get_mut(index).and_then(Option::take))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// pairs
// ---------------------------------------------------------------------------------------------

/// The Rust side of `pairs(t)` for a table `t`: returns `keys, n`, the snapshot of the ordered
/// keys as a sequence for the wrapper's iterator; or `false, f` when the metatable's `__pairs`
/// is a function `f` (the wrapper tail-calls `f(t)`); or `false, nil, message` when `__pairs`
/// holds anything else.
fn core_pairs(lua: &Lua, table: Table) -> mlua::Result<MultiValue> {
    if let Some(metatable) = table.metatable() {
        match metatable.raw_get::<Value>("__pairs")? {
            Value::Nil => {}
            Value::Function(f) => return (false, f).into_lua_multi(lua),
            other => {
                let message = format!(
                    "attempt to call a {} value (metamethod '__pairs')",
                    lua_type_name(&other)
                );
                return (false, Value::Nil, message).into_lua_multi(lua);
            }
        }
    }
    let keys = ordered_keys(&table)?;
    let count = keys.len();
    (lua.create_sequence_from(keys)?, count).into_lua_multi(lua)
}

// ---------------------------------------------------------------------------------------------
// next
// ---------------------------------------------------------------------------------------------

/// Where a `next(t, k)` step resumes.
enum Resume {
    /// After array index `i` (0: from the very start).
    Array(i64),
    /// At the first key outside the array part.
    RestStart,
    /// At the first key outside the array part that sorts after this key.
    RestAfter(Value),
}

/// The key after `key` in `table`'s deterministic order (`key` nil: the first key), computed
/// from the live table, or `None` past the end.
///
/// A key that is no longer in the table (cleared during the walk) never raises:
/// - an integer inside the array part `1..#t` resumes at the next array index;
/// - any other integer resumes at the first key outside the array part, so the walk can
///   visit booleans and smaller numbers again (chapter 05: over `{ [false]='b', [3]='c',
///   [7]='y' }`, clearing `7` when `k == 7` visits `false, 3, 7, false, 3`);
/// - every other key resumes at the first live key that sorts after it, so clearing a boolean,
///   float, string or reference key visits each key exactly once.
fn next_key(table: &Table, key: &Value) -> mlua::Result<Option<Value>> {
    let border = border(table);
    let key = match key {
        Value::Number(f) => float_as_integer(*f).map_or(Value::Number(*f), Value::Integer),
        other => other.clone(),
    };
    let resume = match key {
        Value::Nil => Resume::Array(0),
        Value::Integer(i) if (1..=border).contains(&i) => Resume::Array(i),
        Value::Integer(_) if table.raw_get::<Value>(&key)?.is_nil() => Resume::RestStart,
        other => Resume::RestAfter(other),
    };
    match resume {
        Resume::Array(i) => {
            // The common dense case needs no scan.
            if i < border && !table.raw_get::<Value>(i + 1)?.is_nil() {
                return Ok(Some(Value::Integer(i + 1)));
            }
            scan(table, border, Some(i), None)
        }
        Resume::RestStart => scan(table, border, None, None),
        Resume::RestAfter(after) => scan(table, border, None, Some(&after)),
    }
}

/// One pass over the live table: with `array_after` = `Some(i)`, the smallest array index
/// above `i`, falling back to the first key outside the array part; otherwise the first key
/// outside the array part that sorts after `rest_after` (or the very first one).
fn scan(
    table: &Table,
    border: i64,
    array_after: Option<i64>,
    rest_after: Option<&Value>,
) -> mlua::Result<Option<Value>> {
    let mut best_index: Option<i64> = None;
    let mut best_rest: Option<Value> = None;
    let after_bytes = rest_after.and_then(string_bytes);
    let after_key = rest_after.map(|after| SortKey::of(after, after_bytes.as_deref()));
    table.for_each::<Value, bool>(|key, _| {
        if let Value::Integer(i) = key
            && (1..=border).contains(&i)
        {
            if let Some(after) = array_after
                && i > after
                && best_index.is_none_or(|best| i < best)
            {
                best_index = Some(i);
            }
            return Ok(());
        }
        if best_index.is_some() {
            return Ok(());
        }
        let bytes = string_bytes(&key);
        let sort_key = SortKey::of(&key, bytes.as_deref());
        if let Some(after) = &after_key
            && sort_key.compare(after) != Ordering::Greater
        {
            return Ok(());
        }
        let better = match &best_rest {
            None => true,
            Some(best) => compare_values(&key, best) == Ordering::Less,
        };
        if better {
            best_rest = Some(key);
        }
        Ok(())
    })?;
    Ok(best_index.map(Value::Integer).or(best_rest))
}

// ---------------------------------------------------------------------------------------------
// table.concat
// ---------------------------------------------------------------------------------------------

/// For a `list` that is not a table: `None` when stock `table.concat` would still accept it
/// (a userdata whose metatable has both `__index` and `__len`), else the argument error.
fn concat_nontable(nargs: i64, list: &Value) -> Option<String> {
    if let Value::UserData(ud) = list
        && let Ok(metatable) = ud.metatable()
        && metatable.get::<Value>("__index").is_ok_and(|v| !v.is_nil())
        && metatable.get::<Value>("__len").is_ok_and(|v| !v.is_nil())
    {
        return None;
    }
    let got = if nargs == 0 {
        "no value"
    } else {
        lua_type_name(list)
    };
    Some(format!(
        "bad argument #1 to 'concat' (table expected, got {got})"
    ))
}

/// Check `#list`, `sep`, `i` and `j` as stock `table.concat` does, in its order, and give the
/// index range, or the message to raise.
fn concat_range(
    lua: &Lua,
    len: Value,
    sep: &Value,
    i: Value,
    j: Value,
) -> mlua::Result<Result<(i64, i64), String>> {
    let Some(len) = lua.coerce_integer(len)? else {
        return Ok(Err("object length is not an integer".to_owned()));
    };
    if !matches!(
        sep,
        Value::Nil | Value::String(_) | Value::Integer(_) | Value::Number(_)
    ) {
        return Ok(Err(format!(
            "bad argument #2 to 'concat' (string expected, got {})",
            lua_type_name(sep)
        )));
    }
    let first = match optional_integer(lua, i, 3, 1)? {
        Ok(first) => first,
        Err(msg) => return Ok(Err(msg)),
    };
    let last = match optional_integer(lua, j, 4, len)? {
        Ok(last) => last,
        Err(msg) => return Ok(Err(msg)),
    };
    Ok(Ok((first, last)))
}

/// `luaL_optinteger`: nil gives `default`; numbers and numeric strings with an integer value
/// are accepted.
fn optional_integer(
    lua: &Lua,
    value: Value,
    arg: u8,
    default: i64,
) -> mlua::Result<Result<i64, String>> {
    if value.is_nil() {
        return Ok(Ok(default));
    }
    let type_name = lua_type_name(&value);
    if let Some(i) = lua.coerce_integer(value.clone())? {
        return Ok(Ok(i));
    }
    let detail = if lua.coerce_number(value)?.is_some() {
        "number has no integer representation".to_owned()
    } else {
        format!("number expected, got {type_name}")
    };
    Ok(Err(format!("bad argument #{arg} to 'concat' ({detail})")))
}

/// Whether `tostring` renders `value` through a `__tostring` metamethod (read raw from the
/// value's own metatable, as `luaL_tolstring` does).
fn has_tostring(value: &Value) -> bool {
    match value {
        Value::Table(t) => t
            .metatable()
            .is_some_and(|mt| mt.raw_get::<Value>("__tostring").is_ok_and(|v| !v.is_nil())),
        Value::UserData(ud) => ud
            .metatable()
            .is_ok_and(|mt| mt.get::<Value>("__tostring").is_ok_and(|v| !v.is_nil())),
        Value::Error(_) => true,
        _ => false,
    }
}

/// The name `tostring` prints before a reference value's number (`table`, or the raw
/// metatable's `__name` when it is a string), or `None` when stock `tostring` renders the
/// value itself: not a reference value, or one with a `__tostring` metamethod.
fn reference_name(lua: &Lua, value: &Value) -> mlua::Result<Option<mlua::LuaString>> {
    let kind = match value {
        Value::Table(_) => "table",
        Value::Function(_) => "function",
        Value::Thread(_) => "thread",
        Value::UserData(_) | Value::LightUserData(_) => "userdata",
        _ => return Ok(None),
    };
    if has_tostring(value) {
        return Ok(None);
    }
    let name = match value {
        Value::Table(t) => t
            .metatable()
            .and_then(|mt| mt.raw_get::<Value>("__name").ok()),
        Value::UserData(ud) => ud
            .metatable()
            .ok()
            .and_then(|mt| mt.get::<Value>("__name").ok()),
        _ => None,
    };
    match name {
        Some(Value::String(name)) => Ok(Some(name)),
        _ => lua.create_string(kind).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm() -> Lua {
        let lua = Lua::new();
        install(&lua).expect("install");
        lua
    }

    fn eval(lua: &Lua, code: &str) -> String {
        lua.load(code)
            .set_name("=test")
            .eval::<String>()
            .unwrap_or_else(|e| panic!("{e}\n--- code:\n{code}"))
    }

    /// The keys `pairs` visits over the table constructor `ctor`, joined with `sep`.
    fn pairs_keys(ctor: &str) -> String {
        eval(
            &vm(),
            &format!(
                "local seen = {{}}
                 for k, v in pairs({ctor}) do
                   assert(v ~= nil)
                   seen[#seen + 1] = type(k) == 'string' and string.format('%q', k) or tostring(k)
                 end
                 return table.concat(seen, ', ')"
            ),
        )
    }

    /// The keys `for k in next, t` visits over `ctor`.
    fn next_keys(ctor: &str) -> String {
        eval(
            &vm(),
            &format!(
                "local seen = {{}}
                 for k, v in next, {ctor} do
                   assert(v ~= nil)
                   seen[#seen + 1] = type(k) == 'string' and string.format('%q', k) or tostring(k)
                 end
                 return table.concat(seen, ', ')"
            ),
        )
    }

    // --- The order -----------------------------------------------------------------------

    #[test]
    fn spec_intro_example() {
        let lua = vm();
        let got = eval(
            &lua,
            "local seen = {}
             for k in pairs({ 'a', 'b', z = 1, [true] = 2, [10] = 3 }) do
               seen[#seen + 1] = tostring(k)
             end
             return table.concat(seen, ' ')",
        );
        assert_eq!(got, "1 2 true 10 z");
    }

    #[test]
    fn spec_order_in_detail_table() {
        let rows = [
            (
                "{zeta=1, alpha=2, mid=3, beta=4, omega=5}",
                r#""alpha", "beta", "mid", "omega", "zeta""#,
            ),
            (
                "{10, 20, 30, extra='x', another='y'}",
                r#"1, 2, 3, "another", "extra""#,
            ),
            (
                "{[true]='t', [7]='seven', b='bee', [false]='f', [2.5]='half', a='ay'}",
                r#"false, true, 2.5, 7, "a", "b""#,
            ),
            (r#"{[true] = 1, "x"}"#, "1, true"),
        ];
        for (ctor, expected) in rows {
            assert_eq!(pairs_keys(ctor), expected, "pairs over {ctor}");
            assert_eq!(next_keys(ctor), expected, "next over {ctor}");
        }
    }

    #[test]
    fn insertion_order_does_not_matter() {
        let lua = vm();
        let got = eval(
            &lua,
            "local a, b = {}, {}
             local keys = { 'k1', 'k2', 'x', 'y', 3.5, -2, true, false, 100, 'zz' }
             for i = 1, #keys do a[keys[i]] = i end
             for i = #keys, 1, -1 do b[keys[i]] = i end
             for i = 1, 500 do b['tmp' .. i] = i end
             for i = 1, 500 do b['tmp' .. i] = nil end
             local function walk(t)
               local out = {}
               for k in pairs(t) do out[#out + 1] = tostring(k) end
               return table.concat(out, ' ')
             end
             assert(walk(a) == walk(b), walk(a) .. ' vs ' .. walk(b))
             return walk(a)",
        );
        assert_eq!(got, "false true -2 3.5 100 k1 k2 x y zz");
    }

    #[test]
    fn integers_outside_the_array_part_sort_among_numbers() {
        assert_eq!(
            pairs_keys(
                "{ 'a', 'b', [0] = 1, [-3] = 1, [5] = 1, [-0.5] = 1, [true] = 1, [1.5] = 1 }"
            ),
            "1, 2, true, -3, -0.5, 0, 1.5, 5"
        );
        assert_eq!(
            pairs_keys(
                "{ [3] = 1, [2.5] = 1, [2] = 1, [-1] = 1, [-0.5] = 1, [0] = 1, [false] = 0 }"
            ),
            "false, -1, -0.5, 0, 2, 2.5, 3"
        );
    }

    #[test]
    fn huge_integers_keep_their_exact_place() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = {}
             local keys = {
               math.maxinteger, math.maxinteger - 1, 2.0^63, -(2.0^64),
               math.mininteger, math.mininteger + 1,
               (1 << 53) - 1, 1 << 53, (1 << 53) + 1, (1 << 53) + 2,
               2.0^53, 0.5, 2.0^62,
             }
             for _, k in ipairs(keys) do t[k] = true end
             local out = {}
             for k in pairs(t) do out[#out + 1] = string.format('%s:%s', math.type(k), k) end
             return table.concat(out, ' ')",
        );
        assert_eq!(
            got,
            "float:-1.8446744073709552e+19 integer:-9223372036854775808 \
             integer:-9223372036854775807 float:0.5 integer:9007199254740991 \
             integer:9007199254740992 integer:9007199254740993 integer:9007199254740994 \
             integer:4611686018427387904 integer:9223372036854775806 \
             integer:9223372036854775807 float:9.2233720368547758e+18"
        );
    }

    #[test]
    fn exact_int_float_comparison() {
        let max = i64::MAX;
        assert_eq!(compare_int_float(max, TWO_POW_63), Ordering::Less);
        assert_eq!(compare_int_float(i64::MIN, -TWO_POW_63), Ordering::Equal);
        assert_eq!(
            compare_int_float(i64::MIN, -TWO_POW_63 * 2.0),
            Ordering::Greater
        );
        let big = 1_i64 << 53;
        assert_eq!(compare_int_float(big + 1, big as f64), Ordering::Greater);
        assert_eq!(compare_int_float(big - 1, big as f64), Ordering::Less);
        assert_eq!(compare_int_float(big, big as f64), Ordering::Equal);
        assert_eq!(compare_int_float(-1, -0.5), Ordering::Less);
        assert_eq!(compare_int_float(0, -0.5), Ordering::Greater);
        assert_eq!(compare_int_float(2, 2.5), Ordering::Less);
        assert_eq!(compare_int_float(3, 2.5), Ordering::Greater);
        assert_eq!(compare_int_float(-3, -2.5), Ordering::Less);
        assert_eq!(compare_int_float(-2, -2.5), Ordering::Greater);
        assert_eq!(float_as_integer(-0.0), Some(0));
        assert_eq!(float_as_integer(TWO_POW_63), None);
        assert_eq!(float_as_integer(-TWO_POW_63), Some(i64::MIN));
        assert_eq!(float_as_integer(f64::INFINITY), None);
    }

    #[test]
    fn huge_floats_sort_beyond_every_integer() {
        assert_eq!(
            pairs_keys(
                "{ [1e300] = 1, [-1e300] = 1, [math.maxinteger] = 1, [math.mininteger] = 1, [0] = 1 }"
            ),
            "-1e+300, -9223372036854775808, 0, 9223372036854775807, 1e+300"
        );
    }

    #[test]
    fn strings_go_bytewise() {
        assert_eq!(
            pairs_keys("{ b = 1, a = 1, ab = 1, B = 1, ['a b'] = 1, [''] = 1, ['é'] = 1 }"),
            r#""", "B", "a", "a b", "ab", "b", "é""#
        );
    }

    #[test]
    fn trailing_group_comes_after_scalars_and_is_stable() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t1, t2, f = {}, {}, function() end
             local co = coroutine.create(function() end)
             local t = {
               [t1] = 'table', [f] = 'function', [co] = 'thread', [t2] = 'table',
               ['\\255bad'] = 'raw', [math.huge] = 'inf', [-math.huge] = 'ninf',
               z = 'zed', [1] = 'one', [false] = 'no', [2.5] = 'num',
             }
             local function walk()
               local out = {}
               for k, v in pairs(t) do out[#out + 1] = v end
               return table.concat(out, ' ')
             end
             local function walk_next()
               local out = {}
               for k, v in next, t do out[#out + 1] = v end
               return table.concat(out, ' ')
             end
             local first = walk()
             assert(walk() == first)
             assert(walk_next() == first, walk_next() .. ' vs ' .. first)
             return first",
        );
        let (scalars, trailing) = got.split_at("one no num zed ".len());
        assert_eq!(scalars, "one no num zed ");
        let mut trailing: Vec<&str> = trailing.split(' ').collect();
        assert_eq!(trailing.len(), 7, "{got}");
        // Raw strings, then infinities, then reference values.
        assert_eq!(&trailing[..3], ["raw", "ninf", "inf"]);
        trailing.sort_unstable();
        assert_eq!(
            trailing,
            ["function", "inf", "ninf", "raw", "table", "table", "thread"]
        );
    }

    #[test]
    fn holes_never_yield_nil() {
        assert_eq!(pairs_keys("{ 1, nil, 3, nil, 5 }"), "1, 3, 5");
        assert_eq!(next_keys("{ 1, nil, 3, nil, 5 }"), "1, 3, 5");
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { 'a', 'b', 'c', 'd' }
             t[2] = nil
             t[3] = nil
             local out = {}
             for k, v in pairs(t) do out[#out + 1] = k .. '=' .. v end
             local out2 = {}
             for k, v in next, t do out2[#out2 + 1] = k .. '=' .. v end
             return table.concat(out, ' ') .. '|' .. table.concat(out2, ' ')",
        );
        assert_eq!(got, "1=a 4=d|1=a 4=d");
    }

    #[test]
    fn raw_keys_and_values_only() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = setmetatable({ a = 1 }, {
               __index = function(_, k) return 'meta-' .. tostring(k) end,
               __len = function() return 10 end,
             })
             t[1] = 'x'
             local out = {}
             for k, v in pairs(t) do out[#out + 1] = tostring(k) .. '=' .. tostring(v) end
             local k, v = next(t)
             return table.concat(out, ' ') .. '|' .. tostring(k) .. '=' .. tostring(v)",
        );
        assert_eq!(got, "1=x a=1|1=x");
    }

    #[test]
    fn sparse_border_is_safe() {
        let lua = vm();
        // `#t` can be a huge border with few keys.
        let got = eval(
            &lua,
            "local t = {}
             for e = 0, 40 do t[1 << e] = e end
             t.name = 'x'
             t[false] = 0
             local n = 0
             for k in pairs(t) do n = n + 1 end
             local m = 0
             for k in next, t do m = m + 1 end
             return n .. ' ' .. m",
        );
        assert_eq!(got, "43 43");
    }

    #[test]
    fn ordered_keys_api() {
        let lua = vm();
        let t: Table = lua
            .load("return { 'a', 'b', z = 1, [true] = 2, [10] = 3, [false] = 4, [-1] = 5 }")
            .eval()
            .expect("table");
        let keys = ordered_keys(&t).expect("keys");
        let rendered: Vec<String> = keys
            .iter()
            .map(|k| match k {
                Value::String(s) => s.to_string_lossy(),
                Value::Integer(i) => i.to_string(),
                Value::Boolean(b) => b.to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(rendered, ["1", "2", "false", "true", "-1", "10", "z"]);
        let empty = lua.create_table().expect("table");
        assert!(ordered_keys(&empty).expect("keys").is_empty());
    }

    // --- next ----------------------------------------------------------------------------

    #[test]
    fn spec_next_examples() {
        let lua = vm();
        let got = eval(
            &lua,
            "local k, v = next({ only = 1 })
             assert(k == 'only' and v == 1)
             return tostring(next({}) == nil)",
        );
        assert_eq!(got, "true");
        assert_eq!(
            next_keys("{10, 20, [false] = 'f', [true] = 't'}"),
            "1, 2, false, true"
        );
        let got = eval(
            &lua,
            "local t = { 'a', x = 1 }
             local k1, v1 = next(t, nil)
             local k2, v2 = next(t, k1)
             return table.concat({ k1, v1, k2, v2, select('#', next(t, 'x')),
                                   tostring(next(t, 'x')), tostring(next({}, nil)) }, ' ')",
        );
        assert_eq!(got, "1 a x 1 2 nil nil");
    }

    #[test]
    fn next_accepts_float_keys_with_integer_values() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { 'a', 'b', [5] = 'e', [true] = 't' }
             return tostring(next(t, 1.0)) .. ' ' .. tostring(next(t, 2.0)) .. ' '
               .. tostring(next(t, 5.0))",
        );
        assert_eq!(got, "2 true nil");
    }

    #[test]
    fn next_errors() {
        let lua = vm();
        let got = eval(
            &lua,
            "local ok, err = pcall(next, 5)
             assert(not ok and type(err) == 'string')
             local ok2, err2 = pcall(next)
             local ok3, err3 = pcall(function() local k = next(nil) return k end)
             return err .. '|' .. err2 .. '|' .. err3",
        );
        assert_eq!(
            got,
            "bad argument #1 to 'next' (table expected, got number)|\
             bad argument #1 to 'next' (table expected, got no value)|\
             test:4: bad argument #1 to 'next' (table expected, got nil)"
        );
    }

    // --- pairs ---------------------------------------------------------------------------

    #[test]
    fn pairs_returns_iterator_table_nil() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { 'a', b = 2 }
             local f, s, init = pairs(t)
             assert(select('#', pairs(t)) == 3)
             assert(type(f) == 'function' and s == t and init == nil)
             local out = {}
             -- ignores its arguments
             local k, v = f('junk', 42)
             out[#out + 1] = tostring(k) .. '=' .. tostring(v)
             k, v = f()
             out[#out + 1] = tostring(k) .. '=' .. tostring(v)
             for _ = 1, 3 do
               local a, b = f(t, k)
               out[#out + 1] = tostring(a) .. '=' .. tostring(b) .. '#' .. select('#', f())
             end
             return table.concat(out, ' ')",
        );
        assert_eq!(got, "1=a b=2 nil=nil#2 nil=nil#2 nil=nil#2");
    }

    #[test]
    fn spec_pairs_metamethod_example() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = setmetatable({}, {
               __pairs = function()
                 local i = 0
                 return function()
                   i = i + 1
                   if i <= 2 then return i, i * 10 end
                 end
               end,
             })
             local out = {}
             for k, v in pairs(t) do out[#out + 1] = k .. ':' .. v end
             return table.concat(out, ' ')",
        );
        assert_eq!(got, "1:10 2:20");
    }

    #[test]
    fn pairs_metamethod_gets_the_table_and_returns_all_results() {
        let lua = vm();
        let got = eval(
            &lua,
            "local seen
             local t = setmetatable({}, {
               __pairs = function(self) seen = self return 1, 2, 3, 4, 5 end,
             })
             local n = select('#', pairs(t))
             assert(seen == t)
             -- __metatable protection does not hide __pairs
             local p = setmetatable({}, { __metatable = 'locked', __pairs = function() return 'x' end })
             return n .. ' ' .. pairs(p)",
        );
        assert_eq!(got, "5 x");
    }

    #[test]
    fn pairs_errors() {
        let lua = vm();
        let got = eval(
            &lua,
            "local out = {}
             local ok, err = pcall(pairs, 5)
             assert(not ok and type(err) == 'string')
             out[#out + 1] = err
             ok, err = pcall(function() for k in pairs(nil) do end end)
             out[#out + 1] = err
             ok, err = pcall(pairs)
             out[#out + 1] = err
             local t = setmetatable({}, { __pairs = {} })
             ok, err = pcall(function() for k in pairs(t) do end end)
             assert(not ok and type(err) == 'string')
             out[#out + 1] = err
             ok, err = pcall(pairs, setmetatable({}, { __pairs = false }))
             out[#out + 1] = err
             ok, err = pcall(pairs, setmetatable({}, { __pairs = 'x' }))
             out[#out + 1] = err
             -- only tables, even when a string's metatable has __pairs
             getmetatable('').__pairs = function() return next, {}, nil end
             ok, err = pcall(pairs, 'abc')
             getmetatable('').__pairs = nil
             out[#out + 1] = err
             return table.concat(out, '\\n')",
        );
        assert_eq!(
            got,
            "bad argument #1 to 'pairs' (table expected, got number)\n\
             test:5: bad argument #1 to 'pairs' (table expected, got nil)\n\
             bad argument #1 to 'pairs' (table expected, got no value)\n\
             test:10: attempt to call a table value (metamethod '__pairs')\n\
             attempt to call a boolean value (metamethod '__pairs')\n\
             attempt to call a string value (metamethod '__pairs')\n\
             bad argument #1 to 'pairs' (table expected, got string)"
        );
    }

    #[test]
    fn pairs_works_across_coroutine_yields() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { 'a', 'b', x = 1, y = 2 }
             local co = coroutine.wrap(function()
               for k in pairs(t) do coroutine.yield(tostring(k)) end
               local m = setmetatable({}, { __pairs = function(self)
                 coroutine.yield('in-meta')
                 return next, { z = 1 }, nil
               end })
               for k in pairs(m) do coroutine.yield(k) end
               return 'done'
             end)
             local out = {}
             repeat
               local v = co()
               out[#out + 1] = v
             until v == 'done'
             return table.concat(out, ' ')",
        );
        assert_eq!(got, "1 2 x y in-meta z done");
    }

    // --- Changing a table during a loop ---------------------------------------------------

    #[test]
    fn pairs_clearing_a_key_not_reached_skips_it() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { a = 1, b = 2, c = 3 }
             local out = {}
             for k, v in pairs(t) do
               out[#out + 1] = k .. v
               if k == 'a' then t.b = nil end
             end
             return table.concat(out, ' ')",
        );
        assert_eq!(got, "a1 c3");
    }

    #[test]
    fn pairs_clearing_the_current_key_moves_on() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { a = 1, b = 2, c = 3 }
             local out = {}
             for k in pairs(t) do out[#out + 1] = k; t[k] = nil end
             return table.concat(out, ' ') .. '|' .. tostring(next(t))",
        );
        assert_eq!(got, "a b c|nil");
    }

    #[test]
    fn pairs_clearing_a_boolean_key_visits_each_once() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { 10, 20, [false] = 'f' }
             local out = {}
             for k in pairs(t) do
               out[#out + 1] = tostring(k)
               if k == false then t[false] = nil end
             end
             return table.concat(out, ', ')",
        );
        assert_eq!(got, "1, 2, false");
    }

    #[test]
    fn pairs_clearing_table_keys_still_visits_the_rest() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = {}
             for i = 1, 20 do t[{}] = i end
             local visited = 0
             for k in pairs(t) do
               visited = visited + 1
               t[k] = nil
             end
             return visited .. ' ' .. tostring(next(t) == nil)",
        );
        assert_eq!(got, "20 true");
    }

    #[test]
    fn pairs_ignores_added_keys_and_reads_values_live() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { a = 1, b = 2, 'x' }
             local out = {}
             for k, v in pairs(t) do
               out[#out + 1] = tostring(k) .. '=' .. tostring(v)
               if k == 1 then
                 t.b = 'live'
                 t.c = 'new'
                 t[2] = 'new'
                 t.aa = 'new'
               end
             end
             return table.concat(out, ' ')",
        );
        assert_eq!(got, "1=x a=1 b=live");
    }

    #[test]
    fn next_clearing_an_integer_outside_the_array_part_revisits() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = { [false] = 'b', [3] = 'c', [7] = 'y' }
             local out = {}
             for k in next, t do
               out[#out + 1] = tostring(k)
               if k == 7 then t[7] = nil end
             end
             local manual = {}
             local u = { [false] = 'b', [3] = 'c', [7] = 'y' }
             local k = next(u)
             while k ~= nil do
               manual[#manual + 1] = tostring(k)
               if k == 7 then u[7] = nil end
               k = next(u, k)
             end
             return table.concat(out, ', ') .. '|' .. table.concat(manual, ', ')",
        );
        assert_eq!(got, "false, 3, 7, false, 3|false, 3, 7, false, 3");
    }

    #[test]
    fn next_clearing_array_boolean_and_string_keys_visits_each_once() {
        let lua = vm();
        let got = eval(
            &lua,
            "local function walk(t, clear)
               local out = {}
               for k in next, t do
                 out[#out + 1] = tostring(k)
                 if clear(k) then t[k] = nil end
               end
               return table.concat(out, ' ')
             end
             local all = function() return true end
             return table.concat({
               walk({ 10, 20, 30, [false] = 'f', [true] = 't', x = 1 }, all),
               walk({ 10, 20, 30, [false] = 'f', [true] = 't', x = 1 },
                    function(k) return k == 2 end),
               walk({ 10, 20, [false] = 'f', [true] = 't' },
                    function(k) return k == false end),
               walk({ a = 1, b = 2, c = 3, [2.5] = 1, [9] = 1 },
                    function(k) return k == 'b' or k == 2.5 end),
             }, '|')",
        );
        assert_eq!(
            got,
            "1 2 3 false true x|1 2 3 false true x|1 2 false true|2.5 9 a b c"
        );
    }

    #[test]
    fn next_clearing_never_loses_a_key() {
        let lua = vm();
        // Clear every key as it is visited: every key is still visited at least once.
        let got = eval(
            &lua,
            "local t = { 1, 2, 3, [false] = 1, [true] = 1, [-4] = 1, [0] = 1, [2.5] = 1,
                         [40] = 1, [41] = 1, s = 1, u = 1, [{}] = 1, [{}] = 1 }
             local count = 0
             for k in pairs(t) do count = count + 1 end
             local seen, visits = {}, 0
             for k in next, t do
               visits = visits + 1
               seen[k] = true
               t[k] = nil
               assert(visits < 100)
             end
             local distinct = 0
             for _ in pairs(seen) do distinct = distinct + 1 end
             return count .. ' ' .. distinct .. ' ' .. tostring(next(t) == nil)",
        );
        assert_eq!(got, "14 14 true");
    }

    // --- table.concat --------------------------------------------------------------------

    #[test]
    fn spec_concat_examples() {
        let lua = vm();
        let got = eval(
            &lua,
            "local point = setmetatable({ x = 1, y = 2 }, {
               __tostring = function(p) return '(' .. p.x .. ',' .. p.y .. ')' end,
             })
             return table.concat({ 'at', point }, ' ')",
        );
        assert_eq!(got, "at (1,2)");
        let got = eval(
            &lua,
            "local words = { 'alpha', 'beta', 'gamma' }
             local line = table.concat(words, ', ')
             if string.find(line, 'beta') then
               return string.upper(line) .. ' (' .. #words .. ' words)'
             end",
        );
        assert_eq!(got, "ALPHA, BETA, GAMMA (3 words)");
    }

    #[test]
    fn concat_defaults_ranges_and_numbers() {
        let lua = vm();
        let got = eval(
            &lua,
            "local out = {
               table.concat({ 'a', 'b', 'c' }),
               table.concat({ 1, 1.5, 3.0, -0.0, 2^63, 'x' }, ' '),
               table.concat({ 'a', 'b', 'c', 'd' }, '-', 2, 3),
               table.concat({ 'a', 'b' }, '-', 3),
               table.concat({ 'a', 'b' }, '-', 2, 1),
               table.concat({}, ','),
               table.concat({ 'a', 'b' }, 7),
               table.concat({ 'a', 'b', 'c' }, '', '2', 3.0),
               table.concat({ [0] = 'z', 'a' }, '+', 0),
             }
             return table.concat(out, '|')",
        );
        assert_eq!(
            got,
            "abc|1 1.5 3.0 -0.0 9.2233720368547758e+18 x|b-c||||a7b|bc|z+a"
        );
    }

    #[test]
    fn concat_respects_index_len_and_tostring_values() {
        let lua = vm();
        let got = eval(
            &lua,
            "local proxy = setmetatable({}, {
               __index = function(_, k) return 'v' .. k end,
               __len = function() return 3 end,
             })
             local named = setmetatable({}, {
               __tostring = function() return 'N' end, __metatable = 'hidden',
             })
             local ok, caught = pcall(error)
             return table.concat(proxy, ',') .. '|' .. table.concat({ named, 1, named }, '')",
        );
        assert_eq!(got, "v1,v2,v3|N1N");
    }

    #[test]
    fn concat_errors() {
        let lua = vm();
        let got = eval(
            &lua,
            "local out = {}
             local function try(...)
               local ok, err = pcall(table.concat, ...)
               assert(not ok and type(err) == 'string', tostring(err))
               out[#out + 1] = err
             end
             try({ 'a', true }, ',')
             try({ 'a', tostring })
             try({ 'a', {} })
             try({ 'a', nil, 'c' }, ',', 1, 3)
             try({ 'a', 'b' }, ',', 1, 3)
             try({ 'a', 'b', 'c' }, ',', 2, 5)
             try(nil)
             try()
             try({ 'a' }, {})
             try({ 'a' }, ',', 1.5)
             try({ 'a' }, ',', 1, 'x')
             try(setmetatable({}, { __len = function() return 'x' end }))
             local ok, err = pcall(function() local s = table.concat({ 'a', true }) return s end)
             out[#out + 1] = err
             return table.concat(out, '\\n')",
        );
        assert_eq!(
            got,
            "invalid value (boolean) at index 2 in table for 'concat'\n\
             invalid value (function) at index 2 in table for 'concat'\n\
             invalid value (table) at index 2 in table for 'concat'\n\
             invalid value (nil) at index 2 in table for 'concat'\n\
             invalid value (nil) at index 3 in table for 'concat'\n\
             invalid value (nil) at index 4 in table for 'concat'\n\
             bad argument #1 to 'concat' (table expected, got nil)\n\
             bad argument #1 to 'concat' (table expected, got no value)\n\
             bad argument #2 to 'concat' (string expected, got table)\n\
             bad argument #3 to 'concat' (number has no integer representation)\n\
             bad argument #4 to 'concat' (number expected, got string)\n\
             object length is not an integer\n\
             test:19: invalid value (boolean) at index 2 in table for 'concat'"
        );
    }

    #[test]
    fn concat_keeps_errors_raised_by_metamethods() {
        let lua = vm();
        let got = eval(
            &lua,
            "local own = { reason = 'mine' }
             local bad = setmetatable({}, { __tostring = function() error(own) end })
             local ok, err = pcall(table.concat, { bad })
             assert(not ok and err == own)
             local idx = setmetatable({}, {
               __index = function() error('from index', 0) end, __len = function() return 1 end,
             })
             local ok2, err2 = pcall(table.concat, idx)
             return err.reason .. '|' .. err2",
        );
        assert_eq!(got, "mine|from index");
    }

    // --- install -------------------------------------------------------------------------

    #[test]
    fn install_captures_stock_helpers() {
        let lua = vm();
        let got = eval(
            &lua,
            "local p = setmetatable({}, { __tostring = function() return 'P' end })
             type, tostring, error, select = nil, nil, nil, nil
             local out = {}
             for k in pairs({ 'a', b = 1 }) do out[#out + 1] = k end
             local ok, err = pcall(pairs, 1)
             return table.concat(out, ' ') .. ' ' .. table.concat({ p }) .. ' ' .. err",
        );
        assert_eq!(
            got,
            "1 b P bad argument #1 to 'pairs' (table expected, got number)"
        );
    }

    #[test]
    fn works_in_the_sandbox_without_raw_functions() {
        let lua = Lua::new_with(
            mlua::StdLib::STRING | mlua::StdLib::TABLE | mlua::StdLib::MATH,
            mlua::LuaOptions::new(),
        )
        .expect("lua");
        for name in [
            "rawget", "rawset", "rawequal", "rawlen", "load", "dofile", "print",
        ] {
            lua.globals().raw_set(name, Value::Nil).expect("prune");
        }
        install(&lua).expect("install");
        let got = eval(
            &lua,
            "local t = setmetatable({ 'a', b = 2, c = 3 }, { __index = function() return 'meta' end })
             local out = {}
             for k, v in pairs(t) do
               out[#out + 1] = tostring(k) .. '=' .. tostring(v)
               if k == 1 then t.c = nil end
             end
             return table.concat(out, ' ')",
        );
        assert_eq!(got, "1=a b=2");
    }

    #[test]
    fn every_install_works_from_the_cached_bytecode() {
        for _ in 0..3 {
            let lua = vm();
            assert!(WRAPPERS_BYTECODE.get().is_some());
            assert_eq!(
                eval(
                    &lua,
                    "local t = {} for k in pairs({ b = 1, a = 2 }) do t[#t + 1] = k end return table.concat(t)"
                ),
                "ab"
            );
        }
    }

    #[test]
    fn large_tables_stay_fast() {
        let lua = vm();
        let got = eval(
            &lua,
            "local t = {}
             for i = 1, 200000 do t[i] = i end
             for i = 1, 20000 do t['k' .. i] = i end
             local n = 0
             for k in pairs(t) do n = n + 1 end
             local m = 0
             local k = next(t)
             while m < 200000 do m = m + 1; k = next(t, k) end
             return n .. ' ' .. tostring(k)",
        );
        assert_eq!(got, "220000 k1");
    }
}
