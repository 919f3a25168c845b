//! The effect protocol: a run suspends on Harness work, the host answers in its own time and
//! order, and the outcome and event stream never depend on when the answers arrive.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::sync::Arc;

use promptforge_engine::run::{ModelRound, store_answer, store_error_answer};
use promptforge_engine::store_path::{StoreAnswer, StoreError, StoreOp};
use promptforge_engine::{
    Effect, EffectId, Event, ModelInfo, Outcome, Run, RunContext, Step, ThinkingCapability,
};
use promptforge_lua::vm::Answer;
use promptforge_syntax::Prompt;
use serde_json::json;

/// An in-memory fake Harness: a map for the store and an echoing model.
#[derive(Default)]
struct FakeHarness {
    files: BTreeMap<String, String>,
    rounds: Vec<ModelRound>,
}

impl FakeHarness {
    fn perform(&mut self, effect: Effect) -> Answer {
        match effect {
            Effect::Store(op) => match op {
                StoreOp::Write { path, contents } => {
                    self.files.insert(path, contents);
                    store_answer(StoreAnswer::Unit)
                }
                StoreOp::Append { path, contents } => {
                    self.files.entry(path).or_default().push_str(&contents);
                    store_answer(StoreAnswer::Unit)
                }
                StoreOp::Read { path, .. } => match self.files.get(&path) {
                    Some(text) => store_answer(StoreAnswer::Text(text.clone())),
                    None => store_error_answer(&StoreError::not_found(&path)),
                },
                StoreOp::Exists { path } => {
                    store_answer(StoreAnswer::Bool(self.files.contains_key(&path)))
                }
                other => panic!("unexpected store op {other:?}"),
            },
            Effect::Ask => Answer::Value(json!({"text": "operator", "available": true})),
            Effect::Tool { .. } => panic!("no bound tools here"),
            Effect::ModelRound(round) => {
                let last = round
                    .messages
                    .last()
                    .and_then(|m| m.get("content"))
                    .and_then(|c| c.as_str())
                    .unwrap_or_default()
                    .to_owned();
                self.rounds.push(round);
                Answer::Value(json!({"text": format!("echo: {last}"), "finish_reason": "stop"}))
            }
        }
    }
}

const PROMPT: &str = "---\nname: effects\ndescription: store and model effects\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# Effects\n\n```lua\nmodels.default('writer')\nstore.write('log.txt', 'start')\n```\n\n## Work\n\n```lua\nstore.append('log.txt', '|work')\nlocal ok, err = pcall(store.read, 'missing.txt')\nlog(err.kind .. ':' .. err.reason)\nvar.reply = models.infer('hello')\n```\n\n## Finish\n\nSay {{ var.reply }}.\n\n```lua\nlocal msgs = messages.new():user(prose)\nmodels.loop(msgs)\nreturn store.read('log.txt') .. '|' .. msgs[#msgs].content .. '|' .. tostring(store.exists('log.txt'))\n```\n";

fn new_run() -> Run {
    let prompt = Arc::new(Prompt::parse(PROMPT).unwrap());
    let mut ctx = RunContext::new(7, 1_700_000_000_000);
    ctx.host.model = Some(ModelInfo {
        id: "fake".into(),
        context: 100_000,
        thinking: ThinkingCapability::Switchable,
        description: "a fake".into(),
    });
    Run::new(prompt, ctx)
}

/// How the host times its answers.
#[derive(Clone, Copy)]
enum Timing {
    /// Answer every effect as soon as it is issued.
    Immediately,
    /// Poll the run a few times before answering (the run must just keep waiting).
    AfterIdlePolls,
    /// Hold answers and deliver them with a bogus answer for an unknown id first.
    WithNoise,
}

fn drive(timing: Timing) -> (Outcome, Vec<Event>, Vec<EffectId>, FakeHarness) {
    let mut run = new_run();
    let mut harness = FakeHarness::default();
    let mut events = Vec::new();
    let mut ids = Vec::new();
    let mut held: Vec<(EffectId, Effect)> = Vec::new();
    loop {
        let step = run.step();
        events.extend(run.take_events());
        match step {
            Step::Done(outcome) => return (outcome, events, ids, harness),
            Step::Effects(effects) => {
                held.extend(effects);
                if let Timing::AfterIdlePolls = timing {
                    for _ in 0..3 {
                        match run.step() {
                            Step::Effects(more) => {
                                assert!(more.is_empty(), "no new work while waiting")
                            }
                            Step::Done(_) => panic!("the run ended while waiting"),
                        }
                    }
                }
                if let Timing::WithNoise = timing {
                    run.resume(9_999, Answer::Value(json!("noise")));
                }
                for (id, effect) in held.drain(..) {
                    ids.push(id);
                    let answer = harness.perform(effect);
                    run.resume(id, answer);
                }
            }
        }
    }
}

#[test]
fn outcome_and_events_do_not_depend_on_answer_timing() {
    let (outcome, events, ids, harness) = drive(Timing::Immediately);
    assert_eq!(
        outcome,
        Outcome::Completed("start|work|echo: Say echo: hello.|true".into())
    );
    assert_eq!(harness.rounds.len(), 2);
    assert!(harness.rounds[0].infer && !harness.rounds[1].infer);
    assert!(events.contains(&Event::Log {
        section: "Work".into(),
        message: "store:not_found".into()
    }));
    // Effect ids are issued in increasing order.
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    for timing in [Timing::AfterIdlePolls, Timing::WithNoise] {
        let (o, e, i, h) = drive(timing);
        assert_eq!(o, outcome);
        assert_eq!(e, events);
        assert_eq!(i, ids);
        assert_eq!(h.files, harness.files);
    }
}

#[test]
fn invalid_store_paths_are_answered_by_the_engine() {
    let prompt = Arc::new(
        Prompt::parse("---\nname: p\ndescription: d\npromptforge: 0\n---\n\n# P\n\n## Main\n\n```lua\nlocal ok, err = pcall(store.write, '../x', 'y')\nreturn err.kind .. '|' .. err.reason .. '|' .. err.rule\n```\n")
            .unwrap(),
    );
    let mut run = Run::new(prompt, RunContext::new(1, 0));
    match run.step() {
        Step::Done(Outcome::Completed(result)) => {
            assert_eq!(result, "store|invalid_path|traversal");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn cancel_while_waiting_ends_cancelled() {
    let mut run = new_run();
    match run.step() {
        Step::Effects(effects) => assert_eq!(effects.len(), 1),
        other => panic!("{other:?}"),
    }
    run.cancel();
    assert_eq!(run.step(), Step::Done(Outcome::Cancelled));
}

/// How the host answers the effects a step returns.
#[derive(Clone, Copy, Debug)]
enum Order {
    /// One effect at a time, oldest first; the rest wait.
    OneAtATime,
    /// Everything issued, in issue order.
    Batched,
    /// Everything issued, newest first.
    BatchedReversed,
}

const FANOUT_PROMPT: &str = "---\nname: arms\ndescription: concurrent arms\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# Arms\n\n```lua\nmodels.default('writer')\n```\n\n## Main\n\n```lua\nlocal r = fanout('### Worker', {'a', 'b', 'c'})\nreturn table.concat(r, ',') .. '|' .. store.read('out/b.txt')\n```\n\n### Worker\n\n```lua\nlocal first = models.infer('first ' .. item)\nstore.write('out/' .. item .. '.txt', first)\nreturn models.infer('second ' .. item .. ' ' .. sys.id)\n```\n";

fn drive_fanout(order: Order) -> (Outcome, BTreeMap<String, Vec<String>>, usize) {
    let prompt = Arc::new(Prompt::parse(FANOUT_PROMPT).unwrap());
    let mut ctx = RunContext::new(3, 0);
    ctx.host.model = Some(ModelInfo {
        id: "fake".into(),
        context: 100_000,
        thinking: ThinkingCapability::Switchable,
        description: String::new(),
    });
    let mut run = Run::new(prompt, ctx);
    let mut harness = FakeHarness::default();
    let mut queue: Vec<(EffectId, Effect)> = Vec::new();
    let mut most_outstanding = 0;
    // Per arm (by member), the model prompts in the order that arm issued them.
    let mut per_arm: BTreeMap<String, Vec<String>> = BTreeMap::new();
    loop {
        match run.step() {
            Step::Done(outcome) => return (outcome, per_arm, most_outstanding),
            Step::Effects(effects) => {
                queue.extend(effects);
                most_outstanding = most_outstanding.max(queue.len());
                let batch: Vec<(EffectId, Effect)> = match order {
                    Order::OneAtATime => vec![queue.remove(0)],
                    Order::Batched => std::mem::take(&mut queue),
                    Order::BatchedReversed => {
                        std::mem::take(&mut queue).into_iter().rev().collect()
                    }
                };
                for (id, effect) in batch {
                    if let Effect::ModelRound(round) = &effect {
                        let text = round.messages[0]["content"].as_str().unwrap().to_owned();
                        let member = text.split(' ').nth(1).unwrap().to_owned();
                        per_arm.entry(member).or_default().push(text);
                    }
                    let answer = harness.perform(effect);
                    run.resume(id, answer);
                }
            }
        }
    }
}

#[test]
fn three_answer_orders_agree() {
    let (outcome, per_arm, outstanding) = drive_fanout(Order::OneAtATime);
    assert_eq!(
        outcome,
        Outcome::Completed(
            "echo: second a 0.0.0,echo: second b 0.1.0,echo: second c 0.2.0|echo: first b".into()
        )
    );
    // The arms run beside each other: their effects are outstanding together.
    assert!(outstanding >= 3, "{outstanding}");
    for order in [Order::Batched, Order::BatchedReversed] {
        let (o, p, _) = drive_fanout(order);
        assert_eq!(o, outcome, "{order:?}");
        assert_eq!(p, per_arm, "{order:?}");
    }
}
