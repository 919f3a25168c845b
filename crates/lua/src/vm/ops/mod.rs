//! The shim's host operations: one table per shim module, each op a plain function over the
//! call's arguments and the VM's shared state.
//!
//! The shim reaches Rust through one function, `host(op, ...)` (one Rust function per VM
//! rather than one per operation keeps a section entry cheap); that function looks the name
//! up here. Each module of the shim has its own table ([`models`], [`conversation`],
//! [`tools`], [`control`], and [`base`] for the VM core), so an op lives beside the others its
//! shim module calls.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::OnceLock;

use mlua::{Lua, MultiValue, Value};
use rustc_hash::FxHashMap;

use super::Shared;

mod base;
mod control;
mod conversation;
mod roles;
mod tools;

// What the tables' ops use from the VM module, in one place.
use super::{
    ChunkMode, IntoLuaMulti, Json, LoopList, Ordering, Prose, Usage, call_site, check_calls,
    check_log, find_raise, json, models, module_bytecode, record_error_site, scalar_result,
};
use crate::models::RoundTarget;
use crate::vm;

/// One host call: the VM, its shared state, and the (up to four) arguments.
pub(super) struct Call<'a> {
    pub(super) lua: &'a Lua,
    pub(super) s: &'a Rc<RefCell<Shared>>,
    pub(super) args: [Value; 4],
}

/// A host operation.
pub(super) type Op = fn(Call<'_>) -> mlua::Result<MultiValue>;

/// A string argument as text (bad UTF-8 read lossily), or the empty string for any other
/// value.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.to_string_lossy(),
        _ => String::new(),
    }
}

/// How an op answers something the shim may refuse: `(value, nil)`, or `(nil, message)` for
/// the shim to raise.
fn value_or_message<V: mlua::IntoLua>(
    lua: &Lua,
    result: Result<V, String>,
) -> mlua::Result<MultiValue> {
    match result {
        Ok(value) => (value, Value::Nil).into_lua_multi(lua),
        Err(message) => (Value::Nil, message).into_lua_multi(lua),
    }
}

/// The op the shim calls by `name`.
pub(super) fn find(name: &str) -> Option<Op> {
    static TABLE: OnceLock<FxHashMap<&'static str, Op>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            [
                roles::OPS,
                conversation::OPS,
                tools::OPS,
                control::OPS,
                base::OPS,
            ]
            .into_iter()
            .flatten()
            .copied()
            .collect()
        })
        .get(name)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op name is in exactly one table, and every name the shim calls has an op.
    #[test]
    fn one_op_per_name_and_every_shim_call_resolves() {
        let tables = [
            roles::OPS,
            conversation::OPS,
            tools::OPS,
            control::OPS,
            base::OPS,
        ];
        let mut names: Vec<&str> = tables
            .iter()
            .flat_map(|t| t.iter().map(|(n, _)| *n))
            .collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "an op name is in two tables");
        let shim = [
            include_str!("../../shim/vm.lua"),
            include_str!("../../shim/support.lua"),
            include_str!("../../shim/globals.lua"),
            include_str!("../../shim/errors.lua"),
            include_str!("../../shim/text.lua"),
            include_str!("../../shim/proxies.lua"),
            include_str!("../../shim/store.lua"),
            include_str!("../../shim/models.lua"),
            include_str!("../../shim/tools.lua"),
            include_str!("../../shim/control.lua"),
            include_str!("../../shim/tasks.lua"),
        ];
        for source in shim {
            for (at, _) in source.match_indices("host('") {
                let rest = &source[at + 6..];
                let name = rest.split('\'').next().unwrap_or_default();
                assert!(
                    find(name).is_some(),
                    "the shim calls host('{name}') and no op has it"
                );
            }
        }
    }
}
