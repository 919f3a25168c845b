//! The CLI Host's side of a run: performing the engine's effects for real.
//!
//! The engine issues effects in a deterministic order; the Host performs them in that issue
//! order (so the scripted model answers rounds in engine issue order) and resumes the run with
//! each answer. Model rounds go to the current model's provider on a tokio runtime; a cancel
//! (Ctrl-C) stops the wait at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use promptforge_engine::run::{ModelRound, store_answer, store_error_answer};
use promptforge_engine::{Effect, Event, Outcome, Run, Step};
use promptforge_harness::model::{
    ModelDescription, ModelError, ModelProvider, reply_answer, round_request,
};
use promptforge_harness::store::Store;
use promptforge_lua::vm::{Answer, ErrorValue};
use serde_json::{Map, Value as Json, json};

/// The current model: its catalog description and the provider that answers its rounds.
#[derive(Debug, Clone)]
pub struct CurrentModel {
    /// What the catalog knows about it.
    pub description: ModelDescription,
    /// The provider.
    pub provider: Arc<dyn ModelProvider>,
}

/// The operator behind `input.ask()`: answers given on the command line, a terminal, or
/// nobody (no input broker).
#[derive(Debug)]
pub enum Operator {
    /// `--input TEXT` answers, in order.
    Scripted(std::collections::VecDeque<String>),
    /// A person at the terminal on stdin.
    Terminal,
    /// No input broker.
    Nobody,
}

impl Operator {
    /// Whether the Host has an input broker.
    pub fn connected(&self) -> bool {
        !matches!(self, Operator::Nobody)
    }
}

/// The user-input Plugin's ask tool.
pub const ASK_TOOL_PATH: &str = "promptforge/user-input/ask";

/// The fixed answer when nobody is there to ask (chapter 05).
const NO_OPERATOR: &str = "User input is unavailable in this host; continue without it.";

/// Performs effects for one run.
#[derive(Debug)]
pub struct Host {
    model: Option<CurrentModel>,
    operator: std::cell::RefCell<Operator>,
    store: std::cell::RefCell<Store>,
    cancel: Arc<AtomicBool>,
    runtime: tokio::runtime::Runtime,
}

/// An `internal` error value for a failure on the Harness's side.
fn internal(message: impl Into<String>, run_kind: &str) -> Answer {
    Answer::Error(ErrorValue {
        kind: "internal".into(),
        message: message.into(),
        fields: Json::Object(Map::new()),
        run_kind: run_kind.into(),
    })
}

impl Host {
    /// A Host with this current model (or none), store and cancel flag.
    pub fn new(
        model: Option<CurrentModel>,
        store: Store,
        operator: Operator,
        cancel: Arc<AtomicBool>,
    ) -> Result<Host, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        Ok(Host {
            model,
            operator: std::cell::RefCell::new(operator),
            store: std::cell::RefCell::new(store),
            cancel,
            runtime,
        })
    }

    /// The run's store (to collect the output file after the run).
    pub fn store(&self) -> std::cell::Ref<'_, Store> {
        self.store.borrow()
    }

    /// Drive a run to its end, handing every event to `on_event` as it happens.
    pub fn drive(&self, run: &mut Run, on_event: &mut dyn FnMut(&Event)) -> Outcome {
        loop {
            let step = run.step();
            for event in run.take_events() {
                on_event(&event);
            }
            match step {
                Step::Done(outcome) => return outcome,
                Step::Effects(effects) => {
                    if effects.is_empty() {
                        // Blocked with nothing issued: nothing can answer, so stop the run.
                        run.cancel();
                    }
                    for (id, effect) in effects {
                        let answer = self.perform(effect);
                        run.resume(id, answer);
                    }
                }
            }
        }
    }

    fn perform(&self, effect: Effect) -> Answer {
        match effect {
            Effect::ModelRound(round) => self.model_round(round),
            Effect::Store(op) => match self.store.borrow_mut().perform(&op) {
                Ok(answer) => store_answer(answer),
                Err(err) => store_error_answer(&err),
            },
            Effect::Ask => self.ask(),
            Effect::Tool { alias, path, .. } => self.tool(&alias, &path),
        }
    }

    /// A bound tool's call. The Host's only Plugin tool is `promptforge/user-input/ask`: the
    /// operator's next message, as trusted text.
    fn tool(&self, alias: &str, path: &str) -> Answer {
        if path == ASK_TOOL_PATH {
            return match self.ask() {
                Answer::Value(value) => {
                    Answer::Value(value.get("text").cloned().unwrap_or_default())
                }
                failure => failure,
            };
        }
        Answer::Error(ErrorValue {
            kind: "tool".into(),
            message: format!("tool call failure: this Host has no tool at {path} (alias {alias})"),
            fields: Json::Object(Map::new()),
            run_kind: "Tool".into(),
        })
    }

    /// `input.ask()`: the operator's next message.
    fn ask(&self) -> Answer {
        let answered = |text: String| Answer::Value(json!({"text": text, "available": true}));
        let failed = |message: &str| {
            Answer::Error(ErrorValue {
                kind: "tool".into(),
                message: format!("tool call failure: {message}"),
                fields: Json::Object(Map::new()),
                run_kind: "Tool".into(),
            })
        };
        match &mut *self.operator.borrow_mut() {
            Operator::Nobody => Answer::Value(json!({"text": NO_OPERATOR, "available": false})),
            Operator::Scripted(answers) => match answers.pop_front() {
                Some(text) => answered(text),
                None => failed("the operator has no more answers"),
            },
            Operator::Terminal => {
                use std::io::{BufRead, Write};
                eprint!("> ");
                let _ = std::io::stderr().flush();
                let mut line = String::new();
                match std::io::stdin().lock().read_line(&mut line) {
                    Ok(0) => failed("the operator closed the input"),
                    Ok(_) => {
                        let text = line.strip_suffix('\n').unwrap_or(&line);
                        answered(text.strip_suffix('\r').unwrap_or(text).to_owned())
                    }
                    Err(e) => failed(&format!("cannot read the operator's answer: {e}")),
                }
            }
        }
    }

    fn model_round(&self, round: ModelRound) -> Answer {
        let Some(model) = &self.model else {
            return internal("model access is turned off or not configured", "Completion");
        };
        let request = match round_request(&model.description.model, &round) {
            Ok(request) => request,
            Err(message) => return internal(message, "Internal"),
        };
        let provider = model.provider.clone();
        let cancel = self.cancel.clone();
        let result = self.runtime.block_on(async move {
            let watch = async {
                while !cancel.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            };
            tokio::select! {
                reply = provider.complete(&request) => Some(reply),
                () = watch => None,
            }
        });
        match result {
            // Cancelled: the run ends as cancelled at its next step; this answer is never read
            // as a failed model call.
            None => internal("cancelled", "Cancelled"),
            Some(Ok(reply)) => Answer::Value(reply_answer(&reply)),
            Some(Err(err)) => model_failure(&round, &err),
        }
    }
}

/// A failed round: a `models.loop` round that overflowed the context goes to its compactor;
/// every other failure is an `internal` error value (run error kind `Completion`).
fn model_failure(round: &ModelRound, err: &ModelError) -> Answer {
    if !round.infer && err.is_context_overflow() {
        return Answer::Value(json!({"overflow": true}));
    }
    internal(err.to_string(), "Completion")
}
