//! An in-process driver for runs (in the spirit of quinn-proto's `tests/util.rs`): a fake
//! Harness (an in-memory store, a model that answers from a closure, timers that fire when
//! nothing else is pending) and a Host loop that answers effects in a chosen order, recording
//! everything the run did.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::sync::Arc;

use promptforge_engine::protocol::{ModelRound, store_answer, store_error_answer};
use promptforge_engine::store_path::{StoreAnswer, StoreError, StoreOp};
use promptforge_engine::{
    Answer, Effect, EffectId, Event, ModelInfo, Outcome, Run, RunContext, Step, ThinkingCapability,
};
use promptforge_syntax::Prompt;
use serde_json::{Value as Json, json};

/// How the driver answers the effects it holds, each time the run waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Everything held, in issue order.
    Issued,
    /// Everything held, newest first.
    Reversed,
    /// The oldest held effect only; the rest wait for later steps.
    OneAtATime,
    /// The newest held effect only.
    NewestOnly,
    /// A pseudo-random subset, in a pseudo-random order, from this seed.
    Shuffled(u64),
}

impl Order {
    /// Every order the determinism tests compare.
    pub const ALL: [Order; 7] = [
        Order::Issued,
        Order::Reversed,
        Order::OneAtATime,
        Order::NewestOnly,
        Order::Shuffled(1),
        Order::Shuffled(2),
        Order::Shuffled(99),
    ];
}

/// The model's answer to a round (the JSON the section VM reads: `{text, finish_reason}` or
/// `{tool_calls: [...]}`).
pub type ModelFn = Box<dyn FnMut(&ModelRound) -> Json>;

/// Replies `echo: {last message content}`.
pub fn echo_model() -> ModelFn {
    Box::new(|round: &ModelRound| {
        let last = round
            .messages
            .last()
            .map(|m| m.content().text())
            .unwrap_or_default();
        json!({"text": format!("echo: {last}"), "finish_reason": "stop"})
    })
}

/// An in-memory fake Harness.
pub struct FakeHarness {
    pub files: BTreeMap<String, String>,
    pub model: ModelFn,
    /// Operator answers, in order.
    pub inputs: Vec<String>,
    /// The model is slow: rounds are answered only once nothing else (timers included) is
    /// held, so a timeout fires before the round it races.
    pub rounds_last: bool,
}

impl Default for FakeHarness {
    fn default() -> Self {
        FakeHarness {
            files: BTreeMap::new(),
            model: echo_model(),
            inputs: Vec::new(),
            rounds_last: false,
        }
    }
}

impl FakeHarness {
    pub fn perform(&mut self, effect: &Effect) -> Answer {
        match effect {
            Effect::Store(op) => match op {
                StoreOp::Write { path, contents } => {
                    self.files.insert(path.clone(), contents.clone());
                    store_answer(StoreAnswer::Unit)
                }
                StoreOp::Append { path, contents } => {
                    self.files
                        .entry(path.clone())
                        .or_default()
                        .push_str(contents);
                    store_answer(StoreAnswer::Unit)
                }
                StoreOp::Read { path, .. } => match self.files.get(path) {
                    Some(text) => store_answer(StoreAnswer::Text(text.clone())),
                    None => store_error_answer(&StoreError::not_found(path)),
                },
                StoreOp::Exists { path } => {
                    store_answer(StoreAnswer::Bool(self.files.contains_key(path)))
                }
                other => panic!("unexpected store op {other:?}"),
            },
            Effect::Ask => {
                let text = if self.inputs.is_empty() {
                    "operator".to_owned()
                } else {
                    self.inputs.remove(0)
                };
                Answer::Value(json!({"text": text, "available": true}))
            }
            Effect::Tool { .. } => panic!("no bound tools here"),
            Effect::ModelRound(round) => Answer::Value((self.model)(round)),
            Effect::Timer { .. } => Answer::Value(Json::Null),
        }
    }
}

/// Everything a driven run did.
#[derive(Debug)]
pub struct Transcript {
    pub outcome: Outcome,
    pub events: Vec<Event>,
    /// Every effect, in issue order.
    pub effects: Vec<(EffectId, Effect)>,
    /// Withdrawn effect ids, in the order they were withdrawn.
    pub withdrawn: Vec<EffectId>,
    /// The most effects outstanding at once.
    pub most_outstanding: usize,
    /// The most model rounds outstanding at once.
    pub most_rounds: usize,
    /// The most section VMs alive at once, sampled whenever the run waits.
    pub most_vms: usize,
    /// How many effects went out ahead of the committed order (under provisional ids).
    pub ahead: usize,
    /// How many queued tasks were prepared while answers were out.
    pub prepared: usize,
    pub files: BTreeMap<String, String>,
}

impl Transcript {
    /// The model prompts (the last message of each round), in issue order.
    pub fn prompts(&self) -> Vec<String> {
        self.effects
            .iter()
            .filter_map(|(_, e)| match e {
                Effect::ModelRound(r) => r.messages.last().map(|m| m.content().text()),
                _ => None,
            })
            .collect()
    }

    /// The `log` messages, in order.
    pub fn logs(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match &e.kind {
                promptforge_engine::EventKind::Log { message, .. } => Some(message.clone()),
                _ => None,
            })
            .collect()
    }

    /// The completed result, or a panic naming the outcome.
    pub fn result(&self) -> &str {
        match &self.outcome {
            Outcome::Completed(text) => text,
            other => panic!("the run did not complete: {other:?}"),
        }
    }
}

/// A context with a current model.
pub fn context(seed: u64) -> RunContext {
    let mut ctx = RunContext::new(seed, 1_700_000_000_000);
    ctx.host.model = Some(ModelInfo {
        id: "fake".into(),
        context: 100_000,
        thinking: ThinkingCapability::Switchable,
        description: "a fake".into(),
    });
    ctx
}

/// A tiny deterministic generator for the shuffled order.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Drive `source` to its end under `ctx`, answering in `order`.
pub fn drive_with(source: &str, ctx: RunContext, harness: FakeHarness, order: Order) -> Transcript {
    let prompt = Arc::new(Prompt::parse(source).expect("the prompt parses"));
    let mut run = Run::new(prompt, ctx);
    drive_run(&mut run, harness, order)
}

/// A prompt whose H1 sets the default model to a declared `writer` role, then `body` (its
/// sections).
pub fn with_writer(body: &str) -> String {
    format!(
        "---\nname: t\ndescription: d\npromptforge: 0\nmodels:\n  writer: {{}}\n---\n\n# T\n\n```lua\nmodels.default('writer')\n```\n\n{body}"
    )
}

/// Drive `with_writer(body)` to its end in issue order, keeping the run to look inside it.
pub fn drive_kept(body: &str) -> (Run, Transcript) {
    let prompt = Arc::new(Prompt::parse(&with_writer(body)).expect("the prompt parses"));
    let mut run = Run::new(prompt, context(7));
    let t = drive_run(&mut run, FakeHarness::default(), Order::Issued);
    (run, t)
}

/// Drive `source` with the default context and harness.
pub fn drive(source: &str, order: Order) -> Transcript {
    drive_with(source, context(7), FakeHarness::default(), order)
}

/// Drive an existing run.
pub fn drive_run(run: &mut Run, mut harness: FakeHarness, order: Order) -> Transcript {
    let mut held: Vec<(EffectId, Effect)> = Vec::new();
    let mut effects = Vec::new();
    let mut withdrawn = Vec::new();
    let mut events = Vec::new();
    let (mut most_outstanding, mut most_rounds, mut most_vms) = (0, 0, 0);
    let mut random = match order {
        Order::Shuffled(seed) => seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        _ => 1,
    };
    let mut idle = 0;
    let mut ahead = 0;
    let mut prepared = 0;
    // Effects issued ahead under provisional ids, until their issue is committed.
    let mut provisional: BTreeMap<EffectId, Effect> = BTreeMap::new();
    let mut finals: BTreeMap<EffectId, EffectId> = BTreeMap::new();
    loop {
        let step = run.step();
        events.extend(run.take_events());
        let commits = run.take_commits();
        for (prov, id) in commits.renamed {
            finals.insert(prov, id);
            if let Some(effect) = provisional.remove(&prov) {
                effects.push((id, effect));
            }
        }
        for (id, effect) in commits.unsent {
            effects.push((finals.get(&id).copied().unwrap_or(id), effect));
        }
        let batch = match step {
            Step::Done(outcome) => {
                // The run's effects as the committed order issued them.
                effects.sort_by_key(|(id, _)| *id);
                return Transcript {
                    outcome,
                    events,
                    effects,
                    withdrawn,
                    most_outstanding,
                    most_rounds,
                    most_vms,
                    ahead,
                    prepared,
                    files: harness.files,
                };
            }
            Step::Effects(batch) => batch,
        };
        most_vms = most_vms.max(promptforge_lua::vm::live_vms());
        for id in &batch.withdrawn {
            held.retain(|(h, _)| h != id);
            if !promptforge_engine::is_provisional(*id) {
                withdrawn.push(*id);
            } else if let Some(id) = finals.get(id) {
                withdrawn.push(*id);
            } else {
                provisional.remove(id);
            }
        }
        for (id, effect) in &batch.issued {
            if promptforge_engine::is_provisional(*id) {
                ahead += 1;
                match finals.get(id) {
                    Some(final_id) => effects.push((*final_id, effect.clone())),
                    None => {
                        provisional.insert(*id, effect.clone());
                    }
                }
            } else {
                effects.push((*id, effect.clone()));
            }
        }
        // An effect issued and withdrawn in one batch is recorded but never started.
        held.extend(
            batch
                .issued
                .into_iter()
                .filter(|(id, _)| !batch.withdrawn.contains(id)),
        );
        most_outstanding = most_outstanding.max(held.len());
        most_rounds = most_rounds.max(
            held.iter()
                .filter(|(_, e)| matches!(e, Effect::ModelRound(_)))
                .count(),
        );
        assert!(!held.is_empty(), "the run waits on nothing");
        // Timers fire only when nothing else is held (time passes while the rest is instant),
        // unless the model is slow, when rounds go last.
        let timer = |e: &Effect| matches!(e, Effect::Timer { .. });
        let round = |e: &Effect| matches!(e, Effect::ModelRound(_));
        let ready: Vec<usize> = if harness.rounds_last && held.iter().any(|(_, e)| !round(e)) {
            (0..held.len()).filter(|&i| !round(&held[i].1)).collect()
        } else if held.iter().all(|(_, e)| timer(e)) {
            (0..held.len()).collect()
        } else {
            (0..held.len()).filter(|&i| !timer(&held[i].1)).collect()
        };
        let pick: Vec<usize> = match order {
            Order::Issued => ready,
            Order::Reversed => ready.into_iter().rev().collect(),
            Order::OneAtATime => ready.into_iter().take(1).collect(),
            Order::NewestOnly => ready.into_iter().last().into_iter().collect(),
            Order::Shuffled(_) => {
                let mut chosen: Vec<usize> = ready
                    .iter()
                    .copied()
                    .filter(|_| !next_random(&mut random).is_multiple_of(3))
                    .collect();
                if chosen.is_empty() {
                    chosen.push(ready[(next_random(&mut random) as usize) % ready.len()]);
                }
                for i in (1..chosen.len()).rev() {
                    let j = (next_random(&mut random) as usize) % (i + 1);
                    chosen.swap(i, j);
                }
                chosen
            }
        };
        // While the answers are out, a Host may prepare queued tasks ahead (their work held
        // for a slot): the shuffled orders do it now and then.
        if matches!(order, Order::Shuffled(_)) && next_random(&mut random).is_multiple_of(2) {
            while run.prepare_ahead() {
                prepared += 1;
            }
        }
        if pick.is_empty() {
            idle += 1;
            assert!(idle < 10_000, "the driver made no progress");
            continue;
        }
        // Answer in the picked order (the harness performs each effect as it answers it).
        let taken: Vec<(EffectId, Effect)> = pick.iter().map(|&i| held[i].clone()).collect();
        held.retain(|(id, _)| !taken.iter().any(|(t, _)| t == id));
        for (id, effect) in taken {
            let answer = harness.perform(&effect);
            run.resume(id, answer);
        }
    }
}
