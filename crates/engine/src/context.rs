//! What the Host gives a run when it creates it: the seed, the start instant, the argument
//! string and what the Host provides. Its own module (re-exported from `run`), so the rooms
//! below the run (the entry setup) read it without importing the run.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::Value as Json;

use crate::prepare::HostState;

/// What the Host gives a run when it creates it.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The run's seed.
    pub seed: u64,
    /// The start instant, in milliseconds since the Unix epoch.
    pub start_ms: i64,
    /// The run's argument string (`None`: no argument, read as the empty string).
    pub args: Option<String>,
    /// The Host-state snapshot `ui()` returns, when the Host has one.
    pub snapshot: Option<Json>,
    /// `sys.execution`: the run's name, assigned by the Host.
    pub execution: String,
    /// What the Host provides (Plugins, the current model).
    pub host: HostState,
    /// Log checkpoints allowed per section VM.
    pub log_events: u32,
    /// Raised by the Host to cancel the run.
    pub cancel: Arc<AtomicBool>,
    /// The run's default round cap for `models.loop` (24 unless the Harness sets another).
    pub round_cap: u32,
    /// The run's concurrency limit: the most tasks running at once (8 unless the Harness sets
    /// another; at least 1).
    pub concurrency: u32,
    /// Keep where each effect was issued ([`Run::effect_site`]), for a Host that reports
    /// against the prompt's lines (a replay's divergence). Off by default: it holds an entry
    /// per effect for the whole run.
    pub effect_sites: bool,
    /// Let strands run ahead of the committed order on their own answers (on by default):
    /// their next work goes to the Host at once, while everything observable is still decided
    /// in the committed order. A Host whose providers bind answers by issue order (a scripted
    /// model answering at issue) turns it off, so its effects are issued in committed order.
    pub run_ahead: bool,
}

impl RunContext {
    /// A context with the given seed and start instant and everything else defaulted.
    pub fn new(seed: u64, start_ms: i64) -> Self {
        RunContext {
            seed,
            start_ms,
            args: None,
            snapshot: None,
            execution: String::new(),
            host: HostState::default(),
            log_events: promptforge_lua::vm::DEFAULT_LOG_EVENTS,
            cancel: Arc::new(AtomicBool::new(false)),
            round_cap: DEFAULT_ROUND_CAP,
            concurrency: DEFAULT_CONCURRENCY,
            effect_sites: false,
            run_ahead: true,
        }
    }
}

/// The default round cap of a `models.loop` call.
pub const DEFAULT_ROUND_CAP: u32 = 24;

/// The default concurrency limit.
pub const DEFAULT_CONCURRENCY: u32 = 8;
