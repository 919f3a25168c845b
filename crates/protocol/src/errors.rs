//! The error vocabulary every layer shares (chapter 16): the twelve run error kinds, error
//! values, and the answer to a suspended call.
//!
//! These types are defined here, at the lowest layer that raises error values, so the section
//! VM, the engine and every Host use one definition of each. The engine re-exports them in its
//! `protocol` module; a Host never needs this crate for them. All three are plain data with
//! serde derives, so a run's answers can be written down and read back.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// The twelve run error kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RunErrorKind {
    /// The file failed to parse, or has no `promptforge:` key.
    Parse,
    /// The `promptforge:` key declares a major other than 0.
    Version,
    /// A model role or handle could not be bound.
    Binding,
    /// A model call failed.
    Completion,
    /// A tool call failed.
    Tool,
    /// A store operation failed.
    Vfs,
    /// Unordered conflicting store access.
    Determinism,
    /// An uncaught Lua error.
    Lua,
    /// A log quota was exceeded.
    Quota,
    /// The conversation no longer fits the model's context.
    ContextExhausted,
    /// A fault inside the Engine or Harness.
    Internal,
    /// Prepare refused the run.
    RequirementsUnmet,
}

impl RunErrorKind {
    /// Every kind, in the order chapter 16 lists them.
    pub const ALL: [RunErrorKind; 12] = [
        RunErrorKind::Parse,
        RunErrorKind::Version,
        RunErrorKind::Binding,
        RunErrorKind::Completion,
        RunErrorKind::Tool,
        RunErrorKind::Vfs,
        RunErrorKind::Determinism,
        RunErrorKind::Lua,
        RunErrorKind::Quota,
        RunErrorKind::ContextExhausted,
        RunErrorKind::Internal,
        RunErrorKind::RequirementsUnmet,
    ];

    /// The kind's name exactly as the spec writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunErrorKind::Parse => "Parse",
            RunErrorKind::Version => "Version",
            RunErrorKind::Binding => "Binding",
            RunErrorKind::Completion => "Completion",
            RunErrorKind::Tool => "Tool",
            RunErrorKind::Vfs => "Vfs",
            RunErrorKind::Determinism => "Determinism",
            RunErrorKind::Lua => "Lua",
            RunErrorKind::Quota => "Quota",
            RunErrorKind::ContextExhausted => "ContextExhausted",
            RunErrorKind::Internal => "Internal",
            RunErrorKind::RequirementsUnmet => "RequirementsUnmet",
        }
    }

    /// The kind with this spec name, if any.
    pub fn from_name(name: &str) -> Option<RunErrorKind> {
        RunErrorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for RunErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error value to raise in Lua at a suspended call (chapter 05, "Catching and inspecting
/// errors").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorValue {
    /// `err.kind`, one of the thirteen tags.
    pub kind: String,
    /// `err.message`.
    pub message: String,
    /// The kind's own fields (`reason`, `path`, `task`, ...), a JSON object.
    #[serde(default = "empty_object", skip_serializing_if = "is_empty_object")]
    pub fields: Json,
    /// The run error kind the error ends the run with when left uncaught (`Vfs`, `Tool`, ...);
    /// `None` for an ordinary Lua failure (`Lua`, or `RequirementsUnmet` in the H1 pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_kind: Option<RunErrorKind>,
}

/// How the `Binding` failure of a model round run with no role selected opens (`model binding
/// required for section NAME`): the section VM writes it, and a Host that hints at the fix
/// recognises it by this opening.
pub const BINDING_REQUIRED: &str = "model binding required for section";

fn empty_object() -> Json {
    Json::Object(Map::new())
}

fn is_empty_object(value: &Json) -> bool {
    value.as_object().is_some_and(Map::is_empty)
}

impl ErrorValue {
    /// An error value with no fields of its own.
    pub fn new(
        kind: impl Into<String>,
        message: impl Into<String>,
        run_kind: Option<RunErrorKind>,
    ) -> Self {
        ErrorValue {
            kind: kind.into(),
            message: message.into(),
            fields: empty_object(),
            run_kind,
        }
    }

    /// A `lua`-kind error value with no run error kind of its own (the H1 gate applies).
    pub fn lua(message: impl Into<String>) -> Self {
        ErrorValue::new("lua", message, None)
    }

    /// This value with one more field.
    pub fn with_field(mut self, key: &str, value: impl Into<Json>) -> Self {
        if let Json::Object(map) = &mut self.fields {
            map.insert(key.to_owned(), value.into());
        }
        self
    }
}

/// The answer to a suspended call: the value it returns, or the error value it raises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The call returns this value (JSON data).
    Value(Json),
    /// The call raises this error value.
    Error(ErrorValue),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[test]
    fn run_error_kind_names_round_trip() {
        for kind in RunErrorKind::ALL {
            assert_eq!(RunErrorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(RunErrorKind::from_name("Cancelled"), None);
    }

    #[test]
    fn answers_round_trip_through_json() {
        let answers = [
            Answer::Value(serde_json::json!({"text": "hi", "n": 0.1})),
            Answer::Error(
                ErrorValue::new(
                    "store",
                    "file not found in store: a",
                    Some(RunErrorKind::Vfs),
                )
                .with_field("reason", "not_found"),
            ),
            Answer::Error(ErrorValue::lua("boom")),
        ];
        for answer in answers {
            let text = serde_json::to_string(&answer).unwrap();
            let back: Answer = serde_json::from_str(&text).unwrap();
            assert_eq!(back, answer, "{text}");
        }
    }
}
