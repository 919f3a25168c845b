//! The effects a run asks its Host for, their ids, and the answers the Host gives.
//!
//! Everything here is plain data with serde derives, so a Host (or a recorder) can write a run's
//! effects and answers down and read them back.
//!
//! # Delivery order
//!
//! A Host may answer outstanding effects in any order and at any time; the engine takes the
//! answers in an order of its own, so that nothing observable depends on when they arrived
//! (see [`Delivery`]).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::conversation::{SharedMessages, ToolSpec};
use crate::errors::{Answer, ErrorValue, RunErrorKind};
use crate::store::{StoreAnswer, StoreError, StoreOp};

/// An effect id: unique within a run and assigned in the committed issue order, which is
/// itself the same on every run with the same prompt, seed, start instant and answers.
///
/// An effect a strand issues while it runs ahead of the committed order goes to the Host at
/// once under a *provisional* id (at or above [`PROVISIONAL`]); when the work that issued it is
/// committed it gets its final id, reported in [`Commits::renamed`]. The Host may keep using
/// the provisional id (answers, withdrawals and `Run::effect_task` accept either);
/// a record keeps only final ids.
pub type EffectId = u64;

/// The first provisional effect id.
pub const PROVISIONAL: EffectId = 1 << 48;

/// Whether an id is provisional (an effect issued ahead, not yet committed).
pub fn is_provisional(id: EffectId) -> bool {
    id >= PROVISIONAL
}

/// What the run committed since the last `Run::take_commits`: the final ids of
/// effects issued ahead, and the answers it took, in the order it took them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Commits {
    /// `(provisional, final)` for every effect issued ahead whose issue was committed, in
    /// commit order (final ids increase).
    pub renamed: Vec<(EffectId, EffectId)>,
    /// The effects whose answers the run took, by final id, in the order it took them. This
    /// order decides everything the run reports; a replay hands answers back in it.
    pub taken: Vec<EffectId>,
    /// Effects the committed order issued in the run's last step, which never went out (the
    /// run ended first; they count as withdrawn). Ids as in a batch.
    pub unsent: Vec<(EffectId, Effect)>,
}

/// Harness work the engine asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "effect", content = "request", rename_all = "snake_case")]
pub enum Effect {
    /// One model round.
    ModelRound(ModelRound),
    /// One store operation (path already validated, claim already recorded).
    Store(StoreOp),
    /// `input.ask()`: the operator's next message, through the `promptforge/user-input`
    /// Plugin's ask tool (the Host answers `{text, available}`).
    Ask,
    /// A call to a bound tool (answered with the tool's output text, or a `tool` error).
    Tool {
        /// The alias it was called by.
        alias: String,
        /// The tool path.
        path: String,
        /// The arguments (a JSON object).
        args: Json,
    },
    /// A timeout of a wait: answer it (with any value) once `duration` has passed. The engine
    /// withdraws it when the wait ends first.
    Timer {
        /// How long to wait.
        duration: Duration,
    },
}

/// When the engine takes an effect's answer (the engine reads no clock, so this order is what
/// keeps a run's record independent of timing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Store operations. The Host answers these as the run makes them, before it steps again;
    /// the engine takes no other answer while one is outstanding.
    Immediate,
    /// Model rounds, tool calls, and questions to an operator who answers at once: taken one
    /// at a time in issue order, so a reply that arrives early waits for the replies to
    /// effects issued before it.
    Ordered,
    /// Timers, and questions to a person at a terminal: taken when they come (oldest first),
    /// after any ordered answer that is already there (a task that ends at the same moment as
    /// a timeout wins). Only these depend on real time, as the spec says they do.
    OnArrival,
}

/// The `promptforge/user-input` Plugin's ask tool, which reaches the operator.
pub const ASK_TOOL_PATH: &str = "promptforge/user-input/ask";

impl Effect {
    /// Whether it asks the operator: `input.ask()`, or the user-input Plugin's ask tool.
    pub fn asks_operator(&self) -> bool {
        match self {
            Effect::Ask => true,
            Effect::Tool { path, .. } => path == ASK_TOOL_PATH,
            Effect::ModelRound(_) | Effect::Store(_) | Effect::Timer { .. } => false,
        }
    }

    /// When the engine takes this effect's answer; `live_operator`: the Host's operator is a
    /// person (see [`crate::host::HostState::live_operator`]).
    pub fn delivery(&self, live_operator: bool) -> Delivery {
        match self {
            Effect::Store(_) => Delivery::Immediate,
            Effect::Timer { .. } => Delivery::OnArrival,
            _ if live_operator && self.asks_operator() => Delivery::OnArrival,
            Effect::ModelRound(_) | Effect::Ask | Effect::Tool { .. } => Delivery::Ordered,
        }
    }
}

/// The model a round runs on, as the section resolved it (a model handle's settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelTarget {
    /// The role label, or the raw model id for a `models.get` id handle.
    pub name: String,
    /// The catalog model id.
    pub model_id: String,
    /// The context window.
    pub context: u64,
    /// The thinking switch (`None`: the model's own default).
    pub thinking: Option<bool>,
    /// Sampling temperature, when `models.use` set one.
    pub temperature: Option<f64>,
    /// Reply token cap, when `models.use` set one.
    pub max_tokens: Option<u64>,
}

/// One model round: the composed messages, the tools on offer, and the model settings.
///
/// The messages are shared (`Arc`): a round after a tool call sends the records of the round
/// before it, and neither the section VM, the engine nor the Host copies them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRound {
    /// A `models.infer` round (rather than a `models.loop` round).
    pub infer: bool,
    /// The model and its settings.
    pub model: ModelTarget,
    /// The messages to send, in order, already checked and composed: one shared list (the
    /// loop's composition, the Harness's request and the record all hold the same one, so a
    /// round never copies it).
    pub messages: SharedMessages,
    /// The tools offered (shared with the Harness's request as the messages are).
    pub tools: Arc<[ToolSpec]>,
}

/// What one step hands the Host while the run waits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Effects issued since the last step, in issue order: start every one of them. An id may
    /// be provisional (see [`EffectId`]).
    pub issued: Vec<(EffectId, Effect)>,
    /// Effects issued earlier whose answers the run no longer wants (a cancelled task's model
    /// round, a timeout whose wait ended first): the Host may drop them; an answer it still
    /// gives is ignored.
    pub withdrawn: Vec<EffectId>,
}

impl Batch {
    /// Whether the batch holds nothing.
    pub fn is_empty(&self) -> bool {
        self.issued.is_empty() && self.withdrawn.is_empty()
    }
}

/// A store answer as the value the call returns.
pub fn store_answer(answer: StoreAnswer) -> Answer {
    Answer::Value(match answer {
        StoreAnswer::Text(text) => Json::String(text),
        StoreAnswer::Bool(b) => Json::Bool(b),
        StoreAnswer::List(items) => Json::Array(items.into_iter().map(Json::String).collect()),
        StoreAnswer::Unit => Json::Null,
    })
}

/// A store error as the error value raised at the call (run error kind `Vfs`).
pub fn store_error_answer(err: &StoreError) -> Answer {
    let mut fields = Map::new();
    if let Ok(Json::Object(map)) = serde_json::to_value(err) {
        for (key, value) in map {
            if key != "message" {
                fields.insert(key, value);
            }
        }
    }
    Answer::Error(ErrorValue {
        kind: "store".into(),
        message: err.message.clone(),
        fields: Json::Object(fields),
        run_kind: Some(RunErrorKind::Vfs),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[test]
    fn effects_round_trip_through_json() {
        let effects = [
            Effect::Store(StoreOp::Write {
                path: "a.md".into(),
                contents: "x".into(),
            }),
            Effect::Ask,
            Effect::Timer {
                duration: Duration::from_millis(1500),
            },
            Effect::ModelRound(ModelRound {
                infer: true,
                model: ModelTarget {
                    name: "writer".into(),
                    model_id: "m".into(),
                    context: 8192,
                    thinking: None,
                    temperature: Some(0.1),
                    max_tokens: None,
                },
                messages: Arc::new(vec![Arc::new(crate::conversation::Message::user("hi"))]),
                tools: Arc::from([]),
            }),
        ];
        for effect in effects {
            let text = serde_json::to_string(&effect).unwrap();
            let back: Effect = serde_json::from_str(&text).unwrap();
            assert_eq!(back, effect, "{text}");
        }
    }

    #[test]
    fn delivery_classes() {
        assert_eq!(Effect::Ask.delivery(false), Delivery::Ordered);
        assert_eq!(Effect::Ask.delivery(true), Delivery::OnArrival);
        let ask_tool = Effect::Tool {
            alias: "ask".into(),
            path: ASK_TOOL_PATH.into(),
            args: Json::Null,
        };
        assert_eq!(ask_tool.delivery(true), Delivery::OnArrival);
        assert_eq!(ask_tool.delivery(false), Delivery::Ordered);
        assert_eq!(
            Effect::Timer {
                duration: Duration::ZERO
            }
            .delivery(false),
            Delivery::OnArrival
        );
        assert_eq!(
            Effect::Store(StoreOp::Exists { path: "a".into() }).delivery(true),
            Delivery::Immediate
        );
    }
}
