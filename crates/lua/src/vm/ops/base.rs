//! Host operations of the VM core (`shim/vm.lua`, `support.lua`, `globals.lua`, `text.lua`):
//! modules, values and JSON, errors and their sites, `sys`, `log`, `ui`, and `prose`.

use super::*;

/// This module's host operations, by the name the shim calls them.
pub(super) const OPS: &[(&str, Op)] = &[
    ("var_data", var_data),
    ("load_module", load_module),
    ("json_ok", json_ok),
    ("normalize", normalize),
    ("json_copy", json_copy),
    ("debug_notation", debug_notation),
    ("sys", sys),
    ("log", log),
    ("ui", ui),
    ("on_error", on_error),
    ("site", site),
    ("render_prose", render_prose),
];

fn var_data(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, s, .. } = call;
    let data = json::from_json(lua, &s.borrow().var)?;
    match data {
        Value::Table(t) => t.into_lua_multi(lua),
        _ => lua.create_table()?.into_lua_multi(lua),
    }
}

fn load_module(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    let name = text_of(&a);
    let Some((_, chunk, bytecode)) = module_bytecode().iter().find(|(n, _, _)| *n == name) else {
        return Err(mlua::Error::RuntimeError(format!(
            "unknown shim module `{name}`"
        )));
    };
    lua.load(&bytecode[..])
        .set_name(*chunk)
        .set_mode(ChunkMode::Binary)
        .into_function()?
        .into_lua_multi(lua)
}

fn json_ok(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    json::to_json(&a, "args").is_ok().into_lua_multi(lua)
}

fn normalize(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    match a {
        Value::Error(err) => match find_raise(&err) {
            Some(raise) => (
                raise.kind.clone(),
                raise.message.clone(),
                raise.run_kind.clone(),
            )
                .into_lua_multi(lua),
            None => (
                "internal",
                format!("lua runtime failure: {err}"),
                "Internal",
            )
                .into_lua_multi(lua),
        },
        _ => Ok(MultiValue::new()),
    }
}

fn json_copy(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, b, _, _],
        ..
    } = call;
    let path = match &b {
        Value::String(p) => p.to_string_lossy(),
        _ => "var".to_owned(),
    };
    match crate::json_raw::to_json(lua, &a, &path) {
        Ok(data) => (
            crate::vm::beyond_ceiling(lua, || json::from_json(lua, &data))?,
            Value::Nil,
        )
            .into_lua_multi(lua),
        Err(not_json) => (Value::Nil, not_json.message()).into_lua_multi(lua),
    }
}

fn debug_notation(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    match a {
        Value::Integer(i) => format!("Integer({i})").into_lua_multi(lua),
        Value::Number(n) => format!("Number({n:?})").into_lua_multi(lua),
        Value::Boolean(v) => format!("Boolean({v})").into_lua_multi(lua),
        other => other.type_name().into_lua_multi(lua),
    }
}

fn sys(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, _, _],
        ..
    } = call;
    let st = s.borrow();
    let key = match &a {
        Value::String(k) => k.to_string_lossy(),
        _ => return (false,).into_lua_multi(lua),
    };
    match st.sys.get(&key) {
        Some(value) => (true, json::from_json(lua, value)?).into_lua_multi(lua),
        None => (false,).into_lua_multi(lua),
    }
}

fn log(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, _, _],
        ..
    } = call;
    let count = match a {
        Value::Integer(n) => usize::try_from(n).unwrap_or(0),
        _ => 0,
    };
    let mut st = s.borrow_mut();
    check_log(&mut st, count, &b).into_lua_multi(lua)
}

fn ui(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, s, .. } = call;
    let snapshot = s.borrow().snapshot.clone();
    match snapshot {
        Some(value) => json::from_json(lua, &value)?.into_lua_multi(lua),
        None => Ok(MultiValue::new()),
    }
}

fn on_error(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, _, _],
        ..
    } = call;
    record_error_site(lua, s);
    a.into_lua_multi(lua)
}

fn site(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, s, .. } = call;
    let site = call_site(lua, &s.borrow().region_labels);
    s.borrow_mut().call_site = site;
    Ok(MultiValue::new())
}

fn render_prose(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, s, .. } = call;
    let template = {
        let st = s.borrow();
        match &st.prose {
            Prose::Unset => return Ok(MultiValue::new()),
            Prose::Rendered(text) => return text.as_str().into_lua_multi(lua),
            Prose::Pending(template) => template.clone(),
        }
    };
    match vm::render_prose(lua, s, &template)? {
        Ok(text) => {
            // Out of room for the text: Lua's own memory error, one line.
            let Ok(value) = lua.create_string(&text) else {
                return (Value::Nil, "not enough memory").into_lua_multi(lua);
            };
            s.borrow_mut().prose = Prose::Rendered(text);
            (value, Value::Nil).into_lua_multi(lua)
        }
        Err(message) => (Value::Nil, message).into_lua_multi(lua),
    }
}
