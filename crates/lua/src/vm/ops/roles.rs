//! Host operations of `shim/models.lua`: model handles, `models.use`/`default`/`get`, and which
//! model a round runs on.

use super::*;

/// This module's host operations, by the name the shim calls them.
pub(super) const OPS: &[(&str, Op)] = &[
    ("models_use", models_use),
    ("models_default", models_default),
    ("models_get", models_get),
    ("is_handle", is_handle),
    ("round_model", round_model),
    ("role_globals", role_globals),
];

fn models_use(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, b, c, _],
        ..
    } = call;
    let count = match a {
        Value::Integer(n) => usize::try_from(n).unwrap_or(0),
        _ => 0,
    };
    let result = {
        let st = s.borrow();
        let state = st.models.borrow();
        models::models_use(&state, count, &b, &c)
    };
    match result {
        Ok(handle) => {
            s.borrow_mut().selection = Some((handle.name.clone(), handle.sampling));
            (models::handle_value(lua, handle)?, Value::Nil).into_lua_multi(lua)
        }
        Err(message) => (Value::Nil, message).into_lua_multi(lua),
    }
}

fn models_default(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, c, _],
        ..
    } = call;
    if c != Value::Boolean(true) && s.borrow().models.borrow().ahead {
        return (Value::Nil, Value::Nil, true).into_lua_multi(lua);
    }
    let result = {
        let st = s.borrow();
        let mut state = st.models.borrow_mut();
        models::models_default(&mut state, &a)
    };
    match result {
        Ok(handle) => value_or_message(lua, Ok(models::handle_value(lua, handle)?)),
        Err(message) => value_or_message::<Value>(lua, Err(message)),
    }
}

fn models_get(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, _, _],
        ..
    } = call;
    let result = {
        let st = s.borrow();
        let state = st.models.borrow();
        models::models_get(&state, &a)
    };
    match result {
        Ok(handle) => value_or_message(lua, Ok(models::handle_value(lua, handle)?)),
        Err(message) => value_or_message::<Value>(lua, Err(message)),
    }
}

fn is_handle(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        args: [a, _, _, _],
        ..
    } = call;
    models::as_handle(&a).is_some().into_lua_multi(lua)
}

fn round_model(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call {
        lua,
        s,
        args: [a, _, c, _],
        ..
    } = call;
    let st = s.borrow();
    if models::as_handle(&a).is_none()
        && st.selection.is_none()
        && c != Value::Boolean(true)
        && st.models.borrow().default_unsettled()
    {
        return (Value::Nil, Value::Nil, true).into_lua_multi(lua);
    }
    match models::round_handle(&st.models, models::as_handle(&a), st.selection.as_ref()) {
        Some(handle) => {
            let target = handle.target();
            drop(st);
            let mut st = s.borrow_mut();
            if let Some(last) = &st.last_target
                && last.borrow::<RoundTarget>().is_ok_and(|t| t.0 == target)
            {
                return last.clone().into_lua_multi(lua);
            }
            let made = lua.create_userdata(RoundTarget::new(target))?;
            st.last_target = Some(made.clone());
            made.into_lua_multi(lua)
        }
        None => (
            Value::Nil,
            format!(
                "{} {}",
                promptforge_protocol::errors::BINDING_REQUIRED,
                st.section_name
            ),
        )
            .into_lua_multi(lua),
    }
}

fn role_globals(call: Call<'_>) -> mlua::Result<MultiValue> {
    let Call { lua, s, .. } = call;
    let handles = s.borrow().models.borrow().bound_handles();
    let t = lua.create_table()?;
    for handle in handles {
        let name = handle.name.clone();
        t.raw_set(name, models::handle_value(lua, handle)?)?;
    }
    t.into_lua_multi(lua)
}
