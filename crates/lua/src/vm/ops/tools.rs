//! Host operations of `shim/tools.lua`: the run-wide always-on tools, `sys.model` at the first tool
//! call, and the untrusted envelope.

use super::*;

/// This module's host operations, by the name the shim calls them.
pub(super) const OPS: &[(&str, Op)] = &[
    ("tools_always", tools_always),
    ("tools_always_list", tools_always_list),
    ("first_tool_call", first_tool_call),
    ("untrusted", untrusted),
    ("tool_report", tool_report),
    ("handler_done", handler_done),
];

/// `handler_done(alias, ok, value)`: a local tool's handler returned (`ok`, its first value)
/// or raised. Answers the result's text by the scalar rule (`text, nil`, or `nil, message`
/// when the value has no text form; nothing when it raised), and reports the call to the
/// event stream unless a cancel or jump is in flight.
fn handler_done(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, c, _],
    } = call;
    let ok = matches!(b, Value::Boolean(true));
    let text = ok.then(|| scalar_result(&c).map(|text| text.unwrap_or_default()));
    let mut shared = s.borrow_mut();
    if !shared.cancel.load(Ordering::Relaxed)
        && let Value::String(name) = &a
    {
        shared.reports.push(vm::VmReport::Tool {
            name: name.to_string_lossy(),
            via: "local".to_owned(),
            ok: matches!(text, Some(Ok(_))),
        });
    }
    drop(shared);
    match text {
        Some(text) => value_or_message(lua, text),
        None => Ok(MultiValue::new()),
    }
}

/// A tool call that ended in the VM, for the event stream: `(name, via, ok)`.
fn tool_report(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        s,
        args: [a, b, c, _],
        ..
    } = call;
    if let (Value::String(name), Value::String(via)) = (&a, &b) {
        s.borrow_mut().reports.push(vm::VmReport::Tool {
            name: name.to_string_lossy(),
            via: via.to_string_lossy(),
            ok: matches!(c, Value::Boolean(true)),
        });
    }
    Ok(MultiValue::new())
}

fn tools_always(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, c, _],
        ..
    } = call;
    let alias = match &a {
        Value::String(alias) => alias.to_string_lossy(),
        _ => return Ok(MultiValue::new()),
    };
    let description = match &b {
        Value::String(d) => Some(d.to_string_lossy()),
        _ => None,
    };
    let st = s.borrow();
    let mut state = st.models.borrow_mut();
    if c != Value::Boolean(true) && state.ahead {
        return (Value::Nil, Value::Nil, true).into_lua_multi(lua);
    }
    match state.tools_always.iter_mut().find(|(a, _)| *a == alias) {
        Some(entry) => {
            if description.is_some() && entry.1 != description {
                entry.1 = description;
                state.tools_always_version += 1;
            }
        }
        None => {
            state.tools_always.push((alias, description));
            state.tools_always_version += 1;
        }
    }
    Ok(MultiValue::new())
}

/// `tools_always_list(known)`: the run-wide `tools.always` list as `{alias, description}`
/// tables and its version, or `nil` and the version when `known` is that version already
/// (the shim keeps the list it last read).
fn tools_always_list(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, c, _],
        ..
    } = call;
    let st = s.borrow();
    let models = st.models.borrow();
    if c != Value::Boolean(true) && models.tools_unsettled() {
        return (Value::Nil, Value::Nil, true).into_lua_multi(lua);
    }
    let version = i64::try_from(models.tools_always_version).unwrap_or(i64::MAX);
    if a == Value::Integer(version) {
        return (Value::Nil, version).into_lua_multi(lua);
    }
    let list = lua.create_table()?;
    for (i, (alias, description)) in models.tools_always.iter().enumerate() {
        let t = lua.create_table()?;
        t.raw_set("alias", alias.as_str())?;
        t.raw_set("description", description.as_deref())?;
        list.raw_set(i + 1, t)?;
    }
    (list, version).into_lua_multi(lua)
}

fn first_tool_call(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [_, _, c, _],
        ..
    } = call;
    // sys.model appears at the section's first tool call, when it has a model.
    let mut st = s.borrow_mut();
    if st.selection.is_none() && c != Value::Boolean(true) && st.models.borrow().default_unsettled()
    {
        return (Value::Nil, Value::Nil, true).into_lua_multi(lua);
    }
    let model = models::round_handle(&st.models, None, st.selection.as_ref());
    if let (Some(handle), Json::Object(sys)) = (model, &mut st.sys) {
        sys.insert("model".to_owned(), Json::String(handle.model_id));
    }
    Ok(MultiValue::new())
}

fn untrusted(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, _, _],
        ..
    } = call;
    let text = text_of(&a);
    let nonce = s.borrow().nonce.clone();
    crate::untrusted::wrap(&text, &nonce).into_lua_multi(lua)
}
