//! Host operations of `models.loop`: the list state, the raw walk, the check and compose, the
//! precheck, a round's usage and its tool calls.

use serde::Deserialize;

use super::*;

/// This module's host operations, by the name the shim calls them.
pub(super) const OPS: &[(&str, Op)] = &[
    ("loop_list", loop_list),
    ("loop_fits", loop_fits),
    ("loop_compose", loop_compose),
    ("loop_reply", loop_reply),
];

fn loop_list(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, .. } = call;
    lua.create_userdata(LoopList::default())?
        .into_lua_multi(lua)
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

/// `loop_compose(state, list, target)`: the walk (how many leading records are the ones
/// checked last time, unchanged), then the check and composition, then the precheck against
/// `target`: `(true, fits, prefix)`, or `(nil, message)`. `prefix` is nil when the list took
/// the full conversion.
fn loop_compose(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, c, _],
        ..
    } = call;
    let Value::UserData(state) = &a else {
        return (Value::Nil, "models.loop state missing").into_lua_multi(lua);
    };
    let mut list = state.borrow_mut::<LoopList>()?;
    let unchanged = list.unchanged_prefix(lua, &b)?;
    match list.check(lua, &b, unchanged)? {
        Ok(()) => (
            Value::Boolean(true),
            vm::loop_fits(s, &list, &c),
            unchanged.and_then(|p| i64::try_from(p).ok()),
        )
            .into_lua_multi(lua),
        Err(message) => (Value::Nil, message).into_lua_multi(lua),
    }
}

/// `loop_reply(state, target)`: files the usage of the round just answered (the last reply's
/// `usage`) under the round's model, and answers the first problem with the reply's tool
/// calls, or nil.
fn loop_reply(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, _, _],
        ..
    } = call;
    let Value::UserData(state) = &a else {
        return Ok(MultiValue::new());
    };
    let list = state.borrow::<LoopList>()?;
    let target = vm::round_target(&b);
    let key = target.as_ref().map_or("", |t| t.usage_key());
    let mut shared = s.borrow_mut();
    let reply = shared.last_reply.take();
    // A reply without usage carries `null` (no error built to find that out).
    let usage = reply
        .as_ref()
        .and_then(|reply| reply.get("usage"))
        .filter(|usage| !usage.is_null())
        .and_then(|usage| Usage::deserialize(usage).ok());
    shared.usage.record_round(list.composed(), key, usage);
    match reply.as_ref().and_then(|r| r.get("tool_calls")) {
        Some(calls) => match check_calls(calls) {
            Ok(()) => Ok(MultiValue::new()),
            Err(message) => message.into_lua_multi(lua),
        },
        None => Ok(MultiValue::new()),
    }
}
