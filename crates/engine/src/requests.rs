//! Reading a suspended call's request: the operation name and JSON payload the shim yielded,
//! parsed into a closed set of effects (anything else is refused).

use serde_json::{Map, Value as Json};

use promptforge_lua::vm::Request;

use crate::protocol::{Answer, Effect, ErrorValue};
use crate::store_path::{BoundArg, LineRange, StoreOp, line_range};

/// A `lua`-kind error answered at the call.
pub(crate) fn lua_error(message: impl Into<String>) -> Answer {
    Answer::Error(ErrorValue::lua(message))
}

/// A string field of a payload ('' when absent).
pub(crate) fn text_field<'a>(payload: &'a Json, key: &str) -> &'a str {
    payload.get(key).and_then(Json::as_str).unwrap_or_default()
}

/// The store operation a `store.*` call asks for, or the argument error to raise at the call.
pub(crate) fn store_op(payload: &Json) -> Result<StoreOp, Answer> {
    let text = |key: &str| text_field(payload, key).to_owned();
    let range = || -> Result<Option<LineRange>, Answer> {
        let bound = |key: &str| {
            let raw = payload.get(key);
            let ty = raw
                .and_then(|b| b.get("type"))
                .and_then(Json::as_str)
                .unwrap_or("nil");
            let value = raw.and_then(|b| b.get("value"));
            match (ty, value) {
                ("nil", _) => BoundArg::Nil,
                ("integer", Some(v)) => v.as_i64().map_or(BoundArg::Nil, BoundArg::Integer),
                ("number", Some(v)) => v.as_f64().map_or(BoundArg::Nil, BoundArg::Number),
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
        line_range(bound("first"), bound("last")).map_err(lua_error)
    };
    Ok(match text_field(payload, "op") {
        "read" => StoreOp::Read {
            path: text("path"),
            range: range()?,
        },
        "read_numbered" => StoreOp::ReadNumbered {
            path: text("path"),
            range: range()?,
        },
        "write" => StoreOp::Write {
            path: text("path"),
            contents: text("contents"),
        },
        "append" => StoreOp::Append {
            path: text("path"),
            contents: text("contents"),
        },
        "str_replace" => StoreOp::StrReplace {
            path: text("path"),
            old: text("old"),
            new: text("new"),
        },
        "delete" => StoreOp::Delete { path: text("path") },
        "exists" => StoreOp::Exists { path: text("path") },
        "glob" => StoreOp::Glob {
            pattern: text("pattern"),
        },
        other => return Err(lua_error(format!("unknown store operation `{other}`"))),
    })
}

/// The Harness work a model, tool or operator request asks for.
pub(crate) fn harness_effect(request: &Request) -> Result<Effect, String> {
    let payload = &request.payload;
    match request.op.as_str() {
        "model.infer" | "model.loop" => match &request.round {
            Some(Ok(round)) => Ok(Effect::ModelRound(round.clone())),
            Some(Err(message)) => Err(message.clone()),
            None => Err(format!("malformed {} request", request.op)),
        },
        "input.ask" => Ok(Effect::Ask),
        "tool.call" => Ok(Effect::Tool {
            alias: text_field(payload, "alias").to_owned(),
            path: text_field(payload, "path").to_owned(),
            args: match payload.get("args") {
                Some(Json::Object(map)) => Json::Object(map.clone()),
                _ => Json::Object(Map::new()),
            },
        }),
        other => Err(format!("unsupported suspending request `{other}`")),
    }
}
