//! Reading a store call's arguments into the store operation it asks for.

use promptforge_protocol::request::{Bound, StoreCall};

use crate::protocol::{Answer, ErrorValue};
use crate::store_path::{BoundArg, LineRange, StoreOp, line_range};

/// A `lua`-kind error answered at the call.
pub(crate) fn lua_error(message: impl Into<String>) -> Answer {
    Answer::Error(ErrorValue::lua(message))
}

/// The store operation a `store.*` call asks for, or the argument error to raise at the call.
pub(crate) fn store_op(call: &StoreCall) -> Result<StoreOp, Answer> {
    let range = || -> Result<Option<LineRange>, Answer> {
        let bound = |bound: &Option<Bound>| {
            let Some(bound) = bound else {
                return BoundArg::Nil;
            };
            match (bound.type_name.as_str(), &bound.value) {
                ("nil", _) => BoundArg::Nil,
                ("integer", Some(v)) => v.as_i64().map_or(BoundArg::Nil, BoundArg::Integer),
                ("number", Some(v)) => v.as_f64().map_or(BoundArg::Nil, BoundArg::Number),
                // A float JSON cannot carry (infinite, NaN) is a number that is no integer.
                ("number", None) => BoundArg::Number(f64::NAN),
                (other, _) => BoundArg::Other(match other {
                    "string" => "string",
                    "boolean" => "boolean",
                    "table" => "table",
                    "function" => "function",
                    "thread" => "thread",
                    _ => "userdata",
                }),
            }
        };
        line_range(bound(&call.first), bound(&call.last)).map_err(lua_error)
    };
    let path = || call.path.clone();
    Ok(match call.op.as_str() {
        "read" => StoreOp::Read {
            path: path(),
            range: range()?,
        },
        "read_numbered" => StoreOp::ReadNumbered {
            path: path(),
            range: range()?,
        },
        "write" => StoreOp::Write {
            path: path(),
            contents: call.contents.clone(),
        },
        "append" => StoreOp::Append {
            path: path(),
            contents: call.contents.clone(),
        },
        "str_replace" => StoreOp::StrReplace {
            path: path(),
            old: call.old.clone(),
            new: call.new.clone(),
        },
        "delete" => StoreOp::Delete { path: path() },
        "exists" => StoreOp::Exists { path: path() },
        "glob" => StoreOp::Glob {
            pattern: call.pattern.clone(),
        },
        other => return Err(lua_error(format!("unknown store operation `{other}`"))),
    })
}
