//! Host operations of `models.loop`: the list state, the raw walk, the check and compose, the
//! precheck, a round's usage and its tool calls.

use serde::Deserialize;

use super::*;

/// This module's host operations, by the name the shim calls them.
pub(super) const OPS: &[(&str, Op)] = &[
    ("loop_list", loop_list),
    ("loop_scan", loop_scan),
    ("loop_fits", loop_fits),
    ("loop_compose", loop_compose),
    ("loop_record", loop_record),
    ("loop_check_calls", loop_check_calls),
];

fn loop_list(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, .. } = call;
    lua.create_userdata(LoopList::default())?
        .into_lua_multi(lua)
}

fn loop_scan(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, b, _, _],
        ..
    } = call;
    let Value::UserData(state) = &a else {
        return Value::Nil.into_lua_multi(lua);
    };
    let list = state.borrow::<LoopList>()?;
    list.unchanged_prefix(lua, &b)?.into_lua_multi(lua)
}

fn loop_fits(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, _, _],
        ..
    } = call;
    let Value::UserData(state) = &a else {
        return (Value::Nil, "models.loop state missing").into_lua_multi(lua);
    };
    let list = state.borrow::<LoopList>()?;
    (Value::Boolean(true), vm::loop_fits(s, &list, &b)).into_lua_multi(lua)
}

fn loop_compose(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, c, d],
        ..
    } = call;
    let Value::UserData(state) = &a else {
        return (Value::Nil, "models.loop state missing").into_lua_multi(lua);
    };
    let mut list = state.borrow_mut::<LoopList>()?;
    let unchanged = match d {
        Value::Integer(n) => usize::try_from(n).ok(),
        _ => None,
    };
    match list.check(lua, &b, unchanged)? {
        Ok(()) => (Value::Boolean(true), vm::loop_fits(s, &list, &c)).into_lua_multi(lua),
        Err(message) => (Value::Nil, message).into_lua_multi(lua),
    }
}

/// `loop_record(state, target)`: files the usage of the round just answered (the last
/// reply's `usage`) under the round's model.
fn loop_record(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        s,
        args: [a, b, _, _],
        ..
    } = call;
    let Value::UserData(state) = &a else {
        return Ok(MultiValue::new());
    };
    let list = state.borrow::<LoopList>()?;
    let key = vm::round_target(&b)
        .map(|t| t.usage_key())
        .unwrap_or_default();
    let mut shared = s.borrow_mut();
    let usage = shared
        .last_reply
        .as_ref()
        .and_then(|reply| reply.get("usage"))
        .and_then(|usage| Usage::deserialize(usage).ok());
    shared.usage.record_round(list.composed(), &key, usage);
    Ok(MultiValue::new())
}

/// `loop_check_calls()`: the first problem with the last reply's tool calls, if any.
fn loop_check_calls(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, s, .. } = call;
    let checked = match s
        .borrow()
        .last_reply
        .as_ref()
        .and_then(|r| r.get("tool_calls"))
    {
        Some(calls) => check_calls(calls),
        None => Ok(()),
    };
    match checked {
        Ok(()) => Ok(MultiValue::new()),
        Err(message) => message.into_lua_multi(lua),
    }
}
