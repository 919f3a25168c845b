//! Errors raised from Rust into Lua as Engine error values.
//!
//! A Rust callback cannot raise a Lua table: mlua wraps any error it returns in a userdata.
//! Callbacks that must fail with an error value (a model handle's unknown field, say) return a
//! [`Raise`]; the shim's `pcall` and the engine's classification unwrap it into an error value
//! with the same kind and message.

use std::fmt;

/// An error value raised from Rust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raise {
    /// `err.kind`.
    pub kind: String,
    /// `err.message`.
    pub message: String,
    /// The run error kind when uncaught, if not the default for the kind.
    pub run_kind: Option<String>,
}

impl Raise {
    /// A `lua`-kind error value.
    pub fn lua(message: impl Into<String>) -> Self {
        Raise {
            kind: "lua".into(),
            message: message.into(),
            run_kind: None,
        }
    }
}

impl fmt::Display for Raise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Raise {}

impl From<Raise> for mlua::Error {
    fn from(raise: Raise) -> Self {
        mlua::Error::external(raise)
    }
}

/// Find a [`Raise`] inside an mlua error (through callback wrappers).
pub fn find_raise(err: &mlua::Error) -> Option<&Raise> {
    match err {
        mlua::Error::CallbackError { cause, .. } => find_raise(cause),
        mlua::Error::ExternalError(inner) => inner.downcast_ref::<Raise>(),
        mlua::Error::WithContext { cause, .. } => find_raise(cause),
        _ => None,
    }
}
