//! Host operations of `shim/control.lua` and `shim/tasks.lua`: `jump`, fanout members, list
//! sections, task ids, names and the cancel flag.

use super::*;

/// This module's host operations, by the name the shim calls them.
pub(super) const OPS: &[(&str, Op)] = &[
    ("jump", jump),
    ("fanout_members", fanout_members),
    ("list_from_section", list_from_section),
    ("task_id_ok", task_id_ok),
    ("utf8_ok", utf8_ok),
    ("control_pending", control_pending),
    ("valid_name", valid_name),
];

fn jump(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        s,
        args: [a, _, _, _],
        ..
    } = call;
    if let Value::String(target) = &a {
        s.borrow_mut().jump = Some(target.to_string_lossy());
    }
    Ok(MultiValue::new())
}

fn fanout_members(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    match &a {
        Value::Table(collection) => value_or_message(lua, vm::fanout_members(lua, collection)?),
        _ => (Value::Nil, "fanout collection must be a table").into_lua_multi(lua),
    }
}

fn list_from_section(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, _, _],
        ..
    } = call;
    value_or_message(lua, vm::list_from_section(lua, &s.borrow().visible, &a)?)
}

fn task_id_ok(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    match &a {
        Value::String(text) => text
            .to_str()
            .is_ok_and(|t| crate::task_id::parse_task_id(&t).is_some())
            .into_lua_multi(lua),
        _ => false.into_lua_multi(lua),
    }
}

fn utf8_ok(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    match a {
        Value::String(text) => text.to_str().is_ok().into_lua_multi(lua),
        _ => false.into_lua_multi(lua),
    }
}

fn control_pending(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, s, .. } = call;
    Value::Boolean(s.borrow().cancel.load(Ordering::Relaxed)).into_lua_multi(lua)
}

fn valid_name(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    match &a {
        Value::String(name) => {
            promptforge_syntax::names::is_valid_name(&name.to_string_lossy()).into_lua_multi(lua)
        }
        _ => false.into_lua_multi(lua),
    }
}
