//! Turning a failure that left Lua into what it becomes: the error value raised at a waiter
//! (`call`, `fanout`, a wait on a task), or the run's outcome.

use promptforge_lua::vm::{FailureKind, LuaFailure};

use crate::outcome::{Outcome, RunError, RunErrorKind};
use crate::protocol::ErrorValue;

/// The outcome a failure that ends the run gives. `h1_gate` marks a failure of the H1 pass's
/// own blocks, where an ordinary Lua failure is `RequirementsUnmet` (failures *around* the
/// blocks, such as the shared library load or a read-back, stay `Lua`).
pub(crate) fn run_outcome(failure: LuaFailure, h1_gate: bool) -> Outcome {
    let kind = match &failure.kind {
        FailureKind::Cancelled => return Outcome::Cancelled,
        FailureKind::Quota => RunErrorKind::Quota,
        FailureKind::Internal => RunErrorKind::Internal,
        FailureKind::Run(kind) => *kind,
        FailureKind::Lua if h1_gate => RunErrorKind::RequirementsUnmet,
        FailureKind::Lua => RunErrorKind::Lua,
    };
    // Chapter 08: a fanout refused at the depth cap fails the run with exactly its message,
    // with no location tag and no traceback, however many calls it passed up through.
    let fanout_cap = failure
        .error
        .as_ref()
        .is_some_and(|e| e.kind == "lua" && e.message == fanout_depth_message());
    if fanout_cap {
        return Outcome::Failed(RunError::new(kind, fanout_depth_message()));
    }
    let message = match failure.kind {
        FailureKind::Quota if failure.message.contains("event budget") => {
            "lua log event quota exceeded".to_owned()
        }
        FailureKind::Quota => "lua log byte quota exceeded".to_owned(),
        _ => failure.message,
    };
    let mut error = RunError::new(kind, message);
    error.traceback = failure.traceback;
    error.display_line = failure.line;
    Outcome::Failed(error)
}

/// The refusal of a fanout whose arms would pass the depth cap.
pub(crate) fn fanout_depth_message() -> String {
    format!(
        "fanout recursion exceeded cap of {}",
        crate::strand::CALL_DEPTH_CAP
    )
}

/// A failure as the error value raised at its waiter, unchanged (kind, message and fields
/// kept; a log quota or a fault in the machinery keeps its run error kind).
pub(crate) fn error_value_of(failure: &LuaFailure) -> ErrorValue {
    let mut error = failure
        .error
        .clone()
        .map_or_else(|| ErrorValue::lua(failure.message.clone()), |e| *e);
    match failure.kind {
        FailureKind::Quota => error.run_kind = Some(RunErrorKind::Quota),
        FailureKind::Internal => {
            error.kind = "internal".into();
            error.run_kind = Some(RunErrorKind::Internal);
        }
        _ => {}
    }
    error
}

/// Whether a failure is round-cap exhaustion (the one arm failure a fanout survives).
pub(crate) fn is_exhausted(failure: &LuaFailure) -> bool {
    failure
        .error
        .as_ref()
        .is_some_and(|e| e.kind == "tool_loop_exhausted")
}

/// A failure of the Engine's own making at a point where no Lua is running.
pub(crate) fn internal_failure(message: impl Into<String>) -> LuaFailure {
    LuaFailure {
        kind: FailureKind::Internal,
        message: message.into(),
        traceback: None,
        line: None,
        error: None,
    }
}

/// An Engine error value that ends the chain it is raised in, as a failure (a leaked task's
/// `tasks_live`, a bad `jump` target), classified `Lua` wherever it happens.
pub(crate) fn engine_failure(mut error: ErrorValue) -> LuaFailure {
    error.run_kind.get_or_insert(RunErrorKind::Lua);
    LuaFailure {
        kind: FailureKind::Run(RunErrorKind::Lua),
        message: error.message.clone(),
        traceback: None,
        line: None,
        error: Some(Box::new(error)),
    }
}
