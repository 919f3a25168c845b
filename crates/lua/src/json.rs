//! Lua values and JSON data: the one conversion every feature shares.
//!
//! [`to_json`] reads a Lua value as JSON data (the `var` guard's write check and read-back, the
//! `argv` freeze, fanout items, `{{ }}` substitution), [`from_json`] builds a fresh Lua value from
//! JSON data, and [`to_compact_json`] / [`display_value`] write JSON data as text the way
//! substitution renders it: compact, keys sorted bytewise, numbers in their natural form.
//! [`format_number`] and [`format_integer`] are the number rule of run results (chapter 04,
//! "Block and section returns"), which substitution reuses.
//!
//! Conversion rules:
//!
//! - nil is JSON null (and so is mlua's `Value::NULL` light userdata); booleans and strings map
//!   directly (a string that is not UTF-8 is read lossily, bad bytes becoming U+FFFD);
//! - a Lua integer stays a JSON integer and a Lua float stays a JSON float; infinity and NaN are
//!   not JSON data;
//! - a table whose keys are exactly `1..n` (`n >= 1`) is an array; any other table, the empty
//!   table included, is an object (`{}` renders as `{}`);
//! - object keys: a string key as is; a boolean key as `true` or `false`; an integer key as its
//!   decimal digits; a float key in its usual form (`2.5`), the same key text fanout labels use;
//!   a key of any other type is not JSON data;
//! - functions, userdata, threads, cyclic tables and tables nested deeper than [`MAX_DEPTH`]
//!   are not JSON data, and the failure names the full path of the offending value.
//!
//! Tables are read raw: no `__index`, `__pairs` or other metamethod runs. Entries are visited in
//! the deterministic key order (array part, booleans, numbers, strings), so the first offending
//! value reported is the same on every run.

use std::cmp::Ordering;
use std::ffi::c_void;
use std::fmt;

use mlua::{Lua, Table, Value};
use serde_json::{Map, Number, Value as Json};

/// The deepest table nesting [`to_json`] and [`from_json`] accept: the root container is level 1.
///
/// It matches `serde_json`'s own parse limit, so every value [`to_json`] returns, written as text,
/// parses back.
pub const MAX_DEPTH: usize = 127;

/// A Lua value that is not JSON data.
///
/// Its text is `{path} must be JSON data, got {type}` (chapter 05, "What var can hold").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJson {
    /// The full path of the offending value: the root, then `.key` for a string key and
    /// `[key]` for any other key, as in `var.t.f` or `var.list[2]`.
    pub path: String,
    /// What was found: a Lua type name (`function`, `userdata`, `thread`), or `cyclic table`,
    /// `non-finite number`, `{type} key`, or `table nested deeper than 127 levels`.
    pub type_name: String,
}

impl NotJson {
    /// The error text: `{path} must be JSON data, got {type}`.
    pub fn message(&self) -> String {
        format!("{} must be JSON data, got {}", self.path, self.type_name)
    }
}

impl fmt::Display for NotJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for NotJson {}

/// The Lua type name of a value as Lua's `type()` reports it.
pub fn lua_type_name(value: &Value) -> &'static str {
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

/// Whether a value is mlua's JSON-null stand-in, the null light userdata.
pub fn is_null_sentinel(value: &Value) -> bool {
    matches!(value, Value::LightUserData(ud) if ud.0.is_null())
}

/// Converts a Lua value to JSON data, naming `root` as the path of `value` itself in a failure.
pub fn to_json(value: &Value, root: &str) -> Result<Json, NotJson> {
    let mut path = root.to_owned();
    let mut ancestors = Vec::new();
    convert(value, &mut path, &mut ancestors)
}

/// [`to_json`] for a value held inside the table at `parent`, as converting the parent would
/// reach it: one level of nesting already used, and a reference back to the parent a cycle.
pub(crate) fn to_json_within(
    value: &Value,
    root: &str,
    parent: *const c_void,
) -> Result<Json, NotJson> {
    let mut path = root.to_owned();
    let mut ancestors = vec![parent];
    convert(value, &mut path, &mut ancestors)
}

fn not_json(path: &str, type_name: impl Into<String>) -> NotJson {
    NotJson {
        path: path.to_owned(),
        type_name: type_name.into(),
    }
}

fn convert(
    value: &Value,
    path: &mut String,
    ancestors: &mut Vec<*const c_void>,
) -> Result<Json, NotJson> {
    match value {
        Value::Nil => Ok(Json::Null),
        Value::Boolean(b) => Ok(Json::Bool(*b)),
        Value::Integer(i) => Ok(Json::Number(Number::from(*i))),
        Value::Number(n) => Number::from_f64(*n)
            .map(Json::Number)
            .ok_or_else(|| not_json(path, "non-finite number")),
        Value::String(s) => Ok(Json::String(s.to_string_lossy())),
        Value::Table(t) => table_to_json(t, path, ancestors),
        other if is_null_sentinel(other) => Ok(Json::Null),
        other => Err(not_json(path, lua_type_name(other))),
    }
}

/// A table key in the deterministic order: booleans, numbers, strings, then everything else.
fn key_rank(key: &Value) -> u8 {
    match key {
        Value::Boolean(_) => 0,
        Value::Integer(_) | Value::Number(_) => 1,
        Value::String(_) => 2,
        _ => 3,
    }
}

/// Exact comparison of an integer with a float (neither side is NaN for table keys).
fn cmp_int_float(i: i64, f: f64) -> Ordering {
    // 2^63 as f64: every i64 is below it, and -2^63 is exactly representable.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return Ordering::Less;
    }
    if f >= TWO_63 {
        return Ordering::Less;
    }
    if f < -TWO_63 {
        return Ordering::Greater;
    }
    // `f` is within i64 range: compare integer parts exactly, then the fraction.
    let whole = f.trunc();
    // In range, the cast is exact for the integral part.
    let whole_i = whole as i64;
    match i.cmp(&whole_i) {
        Ordering::Equal => {
            let frac = f - whole;
            if frac > 0.0 {
                Ordering::Less
            } else if frac < 0.0 {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        other => other,
    }
}

fn cmp_keys(a: &Value, b: &Value) -> Ordering {
    let (ra, rb) = (key_rank(a), key_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        (Value::Boolean(x), Value::Boolean(y)) => x.cmp(y),
        (Value::Integer(x), Value::Integer(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => x.total_cmp(y),
        (Value::Integer(x), Value::Number(y)) => cmp_int_float(*x, *y),
        (Value::Number(x), Value::Integer(y)) => cmp_int_float(*y, *x).reverse(),
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(&y.as_bytes()),
        _ => Ordering::Equal,
    }
}

/// The text of a table key as a JSON object key, or `None` for a key that cannot be one.
fn key_text(key: &Value) -> Option<String> {
    match key {
        Value::String(s) => Some(s.to_string_lossy()),
        Value::Boolean(b) => Some(b.to_string()),
        Value::Integer(i) => Some(format_integer(*i)),
        Value::Number(n) => Some(format_number(*n)),
        _ => None,
    }
}

fn table_to_json(
    table: &Table,
    path: &mut String,
    ancestors: &mut Vec<*const c_void>,
) -> Result<Json, NotJson> {
    let ptr = table.to_pointer();
    if ancestors.contains(&ptr) {
        return Err(not_json(path, "cyclic table"));
    }
    if ancestors.len() >= MAX_DEPTH {
        return Err(not_json(
            path,
            format!("table nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    let mut entries: Vec<(Value, Value)> = Vec::new();
    for pair in table.pairs::<Value, Value>() {
        match pair {
            Ok(kv) => entries.push(kv),
            Err(_) => return Err(not_json(path, "unreadable table")),
        }
    }
    ancestors.push(ptr);
    let result = if is_sequence(&entries) {
        sequence_to_json(entries, path, ancestors)
    } else {
        object_to_json(entries, path, ancestors)
    };
    ancestors.pop();
    result
}

/// Keys exactly `1..n` with `n >= 1`.
fn is_sequence(entries: &[(Value, Value)]) -> bool {
    let n = entries.len();
    !entries.is_empty()
        && entries.iter().all(|(k, _)| match k {
            Value::Integer(i) => *i >= 1 && usize::try_from(*i).is_ok_and(|i| i <= n),
            _ => false,
        })
}

fn sequence_to_json(
    mut entries: Vec<(Value, Value)>,
    path: &mut String,
    ancestors: &mut Vec<*const c_void>,
) -> Result<Json, NotJson> {
    entries.sort_by(|a, b| cmp_keys(&a.0, &b.0));
    let mut items = Vec::with_capacity(entries.len());
    for (key, value) in &entries {
        let len = path.len();
        if let Value::Integer(i) = key {
            // Written in place: a path is built for every element but read only on error.
            let _ = fmt::Write::write_fmt(path, format_args!("[{i}]"));
        }
        let item = convert(value, path, ancestors);
        path.truncate(len);
        items.push(item?);
    }
    Ok(Json::Array(items))
}

fn object_to_json(
    mut entries: Vec<(Value, Value)>,
    path: &mut String,
    ancestors: &mut Vec<*const c_void>,
) -> Result<Json, NotJson> {
    entries.sort_by(|a, b| cmp_keys(&a.0, &b.0));
    let mut map = Map::new();
    for (key, value) in &entries {
        let Some(text) = key_text(key) else {
            return Err(not_json(path, format!("{} key", lua_type_name(key))));
        };
        let len = path.len();
        if matches!(key, Value::String(_)) {
            path.push('.');
            path.push_str(&text);
        } else {
            path.push('[');
            path.push_str(&text);
            path.push(']');
        }
        let item = convert(value, path, ancestors);
        path.truncate(len);
        map.insert(text, item?);
    }
    Ok(Json::Object(map))
}

/// Builds a fresh Lua value from JSON data: objects become tables with string keys, arrays
/// 1-based sequences, null nil (a null array element leaves a hole; a null field is absent).
/// Integers that fit in 64 bits become Lua integers and every other number a Lua float.
pub fn from_json(lua: &Lua, value: &Json) -> mlua::Result<Value> {
    from_json_at(lua, value, 0)
}

fn from_json_at(lua: &Lua, value: &Json, depth: usize) -> mlua::Result<Value> {
    Ok(match value {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Number(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::String(lua.create_string(s)?),
        Json::Array(items) => {
            check_depth(depth)?;
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (index, item) in items.iter().enumerate() {
                let v = from_json_at(lua, item, depth + 1)?;
                if !v.is_nil() {
                    table.raw_set(index + 1, v)?;
                }
            }
            Value::Table(table)
        }
        Json::Object(map) => {
            check_depth(depth)?;
            let table = lua.create_table_with_capacity(0, map.len())?;
            for (key, item) in map {
                let v = from_json_at(lua, item, depth + 1)?;
                if !v.is_nil() {
                    table.raw_set(key.as_str(), v)?;
                }
            }
            Value::Table(table)
        }
    })
}

fn check_depth(depth: usize) -> mlua::Result<()> {
    if depth >= MAX_DEPTH {
        Err(mlua::Error::runtime(format!(
            "JSON data nested deeper than {MAX_DEPTH} levels"
        )))
    } else {
        Ok(())
    }
}

/// A float in plain display form: the shortest digits that read back as the same float, never in
/// exponent form; a whole float has no fraction (`3.0` is `3`), and infinity and NaN are `inf`,
/// `-inf` and `NaN`. `1e20` is `100000000000000000000` and `1e-7` is `0.0000001`.
pub fn format_number(n: f64) -> String {
    // Rust's `Display` for f64 is exactly this form.
    format!("{n}")
}

/// An integer as its decimal digits.
pub fn format_integer(i: i64) -> String {
    i.to_string()
}

/// JSON data as compact text: no spaces, object keys sorted bytewise, integers as digits and
/// floats by [`format_number`] (so `3.0` is written `3` and nothing uses exponent form).
pub fn to_compact_json(value: &Json) -> String {
    let mut out = String::new();
    write_json(&mut out, value);
    out
}

/// JSON data as substitution renders it: a string as its own text, anything else as
/// [`to_compact_json`] (null is `null`). This is how `{{ item }}` renders a member.
pub fn display_value(value: &Json) -> String {
    match value {
        Json::String(s) => s.clone(),
        other => to_compact_json(other),
    }
}

fn write_number(out: &mut String, n: &Number) {
    if let Some(i) = n.as_i64() {
        out.push_str(&format_integer(i));
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&format_number(f));
    } else {
        out.push_str(&n.to_string());
    }
}

fn write_json(out: &mut String, value: &Json) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => write_number(out, n),
        Json::String(s) => write_string(out, s),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, item);
            }
            out.push(']');
        }
        Json::Object(map) => {
            // Sort explicitly: `serde_json::Map` keeps insertion order when some dependency
            // turns on `preserve_order`.
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                if let Some(item) = map.get(key) {
                    write_json(out, item);
                }
            }
            out.push('}');
        }
    }
}

/// A JSON string literal, escaped as `serde_json` escapes it.
fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let b = c as u32 as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX[b >> 4]));
                out.push(char::from(HEX[b & 0xf]));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(lua: &Lua, code: &str) -> Value {
        lua.load(code).eval::<Value>().unwrap()
    }

    fn json_of(lua: &Lua, code: &str) -> Result<Json, NotJson> {
        to_json(&eval(lua, code), "var.x")
    }

    fn err_of(lua: &Lua, code: &str, root: &str) -> String {
        to_json(&eval(lua, code), root).unwrap_err().message()
    }

    #[test]
    fn scalars() {
        let lua = Lua::new();
        assert_eq!(json_of(&lua, "return nil").unwrap(), Json::Null);
        assert_eq!(json_of(&lua, "return true").unwrap(), json!(true));
        assert_eq!(json_of(&lua, "return 'x'").unwrap(), json!("x"));
        assert_eq!(json_of(&lua, "return 3").unwrap(), json!(3));
        let f = json_of(&lua, "return 3.0").unwrap();
        assert!(f.is_f64());
        assert_eq!(f.as_f64(), Some(3.0));
        assert_eq!(json_of(&lua, "return 2.5").unwrap(), json!(2.5));
        assert_eq!(
            json_of(&lua, "return math.maxinteger").unwrap(),
            json!(i64::MAX)
        );
        assert_eq!(
            json_of(&lua, "return 'h\\u{e9}llo'").unwrap(),
            json!("h\u{e9}llo")
        );
        assert_eq!(to_json(&Value::NULL, "v").unwrap(), Json::Null);
    }

    #[test]
    fn invalid_utf8_is_lossy() {
        let lua = Lua::new();
        assert_eq!(
            json_of(&lua, "return 'a\\xffb'").unwrap(),
            json!("a\u{fffd}b")
        );
    }

    #[test]
    fn sequences_and_objects() {
        let lua = Lua::new();
        assert_eq!(json_of(&lua, "return {1, 2, 3}").unwrap(), json!([1, 2, 3]));
        assert_eq!(
            json_of(&lua, "return {'red', 'green'}").unwrap(),
            json!(["red", "green"])
        );
        assert_eq!(
            json_of(&lua, "return {[2] = 'b', [1] = 'a'}").unwrap(),
            json!(["a", "b"])
        );
        assert_eq!(json_of(&lua, "return {}").unwrap(), json!({}));
        assert_eq!(
            json_of(&lua, "return { a = { 1, 2 } }").unwrap(),
            json!({"a": [1, 2]})
        );
        // Not exactly 1..n: an object with key text.
        assert_eq!(
            json_of(&lua, "return {[2] = 'b'}").unwrap(),
            json!({"2": "b"})
        );
        assert_eq!(
            json_of(
                &lua,
                "return {[5] = 'five', [2.5] = 'half', [true] = 't', [false] = 'f'}"
            )
            .unwrap(),
            json!({"5": "five", "2.5": "half", "true": "t", "false": "f"})
        );
        assert_eq!(
            json_of(&lua, "return {1, 2, n = 3}").unwrap(),
            json!({"1": 1, "2": 2, "n": 3})
        );
        assert_eq!(
            json_of(&lua, "return {[0] = 'z', 'a'}").unwrap(),
            json!({"0": "z", "1": "a"})
        );
    }

    #[test]
    fn shared_subtables_are_not_cycles() {
        let lua = Lua::new();
        assert_eq!(
            json_of(&lua, "local s = {1}; return { a = s, b = s, c = { s } }").unwrap(),
            json!({"a": [1], "b": [1], "c": [[1]]})
        );
    }

    #[test]
    fn metamethods_are_not_consulted() {
        let lua = Lua::new();
        let code = "return setmetatable({ a = 1 }, { __index = function() error('no') end, \
                    __pairs = function() error('no') end })";
        assert_eq!(json_of(&lua, code).unwrap(), json!({"a": 1}));
    }

    #[test]
    fn failure_paths() {
        let lua = Lua::new();
        assert_eq!(
            err_of(&lua, "return print", "var.handler"),
            "var.handler must be JSON data, got function"
        );
        assert_eq!(
            err_of(&lua, "return { 'x', print }", "var.list"),
            "var.list[2] must be JSON data, got function"
        );
        assert_eq!(
            err_of(&lua, "return { a = { f = print } }", "var.t"),
            "var.t.a.f must be JSON data, got function"
        );
        assert_eq!(
            err_of(&lua, "return coroutine.create(print)", "argv"),
            "argv must be JSON data, got thread"
        );
        assert_eq!(
            err_of(&lua, "return { [true] = { print } }", "var.t"),
            "var.t[true][1] must be JSON data, got function"
        );
        assert_eq!(
            err_of(&lua, "return { [2.5] = print }", "var.t"),
            "var.t[2.5] must be JSON data, got function"
        );
        assert_eq!(
            err_of(&lua, "return { ['a b'] = print }", "var"),
            "var.a b must be JSON data, got function"
        );
        assert_eq!(
            err_of(&lua, "return { a = math.huge }", "var.t"),
            "var.t.a must be JSON data, got non-finite number"
        );
        assert_eq!(
            err_of(&lua, "return { [{}] = 1 }", "var.t"),
            "var.t must be JSON data, got table key"
        );
        let ud = Value::UserData(lua.create_any_userdata(5_u8).unwrap());
        assert_eq!(
            to_json(&ud, "argv").unwrap_err().message(),
            "argv must be JSON data, got userdata"
        );
    }

    #[test]
    fn first_failure_is_deterministic() {
        let lua = Lua::new();
        for _ in 0..20 {
            assert_eq!(
                err_of(
                    &lua,
                    "return { z = print, a = print, m = print, [3] = print }",
                    "v"
                ),
                "v[3] must be JSON data, got function"
            );
            assert_eq!(
                err_of(&lua, "return { z = print, a = print, m = print }", "v"),
                "v.a must be JSON data, got function"
            );
        }
    }

    #[test]
    fn cycles_fail_cleanly() {
        let lua = Lua::new();
        assert_eq!(
            err_of(&lua, "local t = {}; t.self = t; return t", "t"),
            "t.self must be JSON data, got cyclic table"
        );
        assert_eq!(
            err_of(
                &lua,
                "local t = { a = { b = {} } }; t.a.b.c = t.a; return t",
                "var.t"
            ),
            "var.t.a.b.c must be JSON data, got cyclic table"
        );
        assert_eq!(
            err_of(&lua, "return _G", "_G").split(" must").next(),
            Some("_G._G")
        );
    }

    #[test]
    fn deep_nesting_fails_cleanly() {
        let lua = Lua::new();
        let ok = format!(
            "local t = {{}}; local cur = t; for i = 2, {MAX_DEPTH} do cur.x = {{}}; cur = cur.x end; return t"
        );
        let v = json_of(&lua, &ok).unwrap();
        // It parses back with serde_json.
        let text = to_compact_json(&v);
        assert_eq!(serde_json::from_str::<Json>(&text).unwrap(), v);
        let deep = "local t = {}; local cur = t; for i = 1, 100000 do cur.x = {}; cur = cur.x end; \
                    return t";
        let err = json_of(&lua, deep).unwrap_err();
        assert_eq!(err.type_name, "table nested deeper than 127 levels");
        assert!(err.path.starts_with("var.x.x.x"));
    }

    #[test]
    fn round_trips() {
        let lua = Lua::new();
        for data in [
            json!(null),
            json!(true),
            json!(7),
            json!(-7),
            json!(2.5),
            json!(3.0),
            json!(1e300),
            json!(i64::MIN),
            json!("text \u{1F600}"),
            json!([1, "x", [true, false], {"k": 1}]),
            json!({"a": {"b": [1, 2, {"c": "d"}]}, "n": 0.5, "s": ""}),
        ] {
            let lv = from_json(&lua, &data).unwrap();
            assert_eq!(to_json(&lv, "v").unwrap(), data, "{data}");
        }
        // Float-ness survives.
        let lv = from_json(&lua, &json!(3.0)).unwrap();
        assert!(matches!(lv, Value::Number(n) if n == 3.0));
        let lv = from_json(&lua, &json!(3)).unwrap();
        assert!(matches!(lv, Value::Integer(3)));
        // u64 beyond i64 becomes a float.
        let lv = from_json(&lua, &json!(u64::MAX)).unwrap();
        assert!(matches!(lv, Value::Number(_)));
    }

    #[test]
    fn from_json_shapes() {
        let lua = Lua::new();
        let data = json!({"items": ["a", null, "c"], "note": null, "n": 1});
        let v = from_json(&lua, &data).unwrap();
        lua.globals().set("d", v).unwrap();
        let out: String = lua
            .load(
                "return tostring(d.items[1]) .. tostring(d.items[2]) .. tostring(d.items[3]) \
                 .. tostring(d.note) .. math.type(d.n)",
            )
            .eval()
            .unwrap();
        assert_eq!(out, "anilcnilinteger");
        // Empty containers come back as empty tables, which read back as an object.
        let v = from_json(&lua, &json!([])).unwrap();
        assert_eq!(to_json(&v, "v").unwrap(), json!({}));
    }

    #[test]
    fn from_json_depth_guard() {
        let lua = Lua::new();
        let mut data = json!(1);
        for _ in 0..(MAX_DEPTH + 5) {
            data = json!([data]);
        }
        assert!(from_json(&lua, &data).is_err());
    }

    #[test]
    fn numbers() {
        assert_eq!(format_number(3.0), "3");
        assert_eq!(format_number(1.5), "1.5");
        assert_eq!(format_number(-0.25), "-0.25");
        assert_eq!(format_number(1e20), "100000000000000000000");
        assert_eq!(format_number(1e-7), "0.0000001");
        assert_eq!(format_number(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(format_number(f64::INFINITY), "inf");
        assert_eq!(format_number(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_number(f64::NAN), "NaN");
        assert_eq!(format_integer(42), "42");
        assert_eq!(format_integer(i64::MIN), "-9223372036854775808");
    }

    #[test]
    fn compact_text() {
        assert_eq!(
            to_compact_json(&json!({"query": "papers", "n": 2})),
            r#"{"n":2,"query":"papers"}"#
        );
        assert_eq!(to_compact_json(&json!([7, "x"])), r#"[7,"x"]"#);
        assert_eq!(to_compact_json(&json!({})), "{}");
        assert_eq!(to_compact_json(&json!([])), "[]");
        assert_eq!(to_compact_json(&json!(null)), "null");
        assert_eq!(
            to_compact_json(&json!({"B": 1, "a": 2, "ab": 3})),
            r#"{"B":1,"a":2,"ab":3}"#
        );
        assert_eq!(
            to_compact_json(&json!({"x": 3.0, "y": 1e20})),
            r#"{"x":3,"y":100000000000000000000}"#
        );
        assert_eq!(
            to_compact_json(&json!("q\"\\\n\u{1b}\u{7f}é")),
            "\"q\\\"\\\\\\n\\u001b\u{7f}é\""
        );
        // String escaping matches serde_json's.
        let s = json!("a\u{0}\u{8}\u{c}\t\r\u{1f} \"/\\ \u{2028}");
        assert_eq!(to_compact_json(&s), serde_json::to_string(&s).unwrap());
        assert_eq!(display_value(&json!("plain")), "plain");
        assert_eq!(display_value(&json!(7)), "7");
        assert_eq!(display_value(&json!(2.5)), "2.5");
        assert_eq!(display_value(&json!(true)), "true");
        assert_eq!(display_value(&json!(null)), "null");
        assert_eq!(
            display_value(&json!({"key": "alpha", "value": 1})),
            r#"{"key":"alpha","value":1}"#
        );
    }

    #[test]
    fn key_order_is_exact() {
        assert_eq!(cmp_int_float(2, 2.5), Ordering::Less);
        assert_eq!(cmp_int_float(3, 2.5), Ordering::Greater);
        assert_eq!(cmp_int_float(2, 2.0), Ordering::Equal);
        assert_eq!(cmp_int_float(i64::MAX, 1e300), Ordering::Less);
        assert_eq!(cmp_int_float(i64::MIN, -1e300), Ordering::Greater);
        assert_eq!(cmp_int_float(-1, -0.5), Ordering::Less);
        assert_eq!(
            cmp_int_float(9_007_199_254_740_993, 9_007_199_254_740_992.0),
            Ordering::Greater
        );
    }
}
