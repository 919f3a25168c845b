//! `promptforge-harness`: performs the engine's effects for real.
//!
//! The engine decides language semantics and asks for work; the Harness does it: model
//! providers over HTTP (and the scripted model), store backends (memory and a directory on
//! disk), and the Host's model catalog. Nothing here decides what a prompt means.

pub mod limits;
pub mod mcp;
pub mod model;
pub mod secrets;
pub mod store;
pub mod web;
