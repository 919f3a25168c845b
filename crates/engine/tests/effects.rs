//! The effect protocol: a run suspends on Harness work, the host answers in its own time and
//! order, and the outcome, the events and the effects never depend on when the answers arrive.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod util;

use std::sync::Arc;

use promptforge_engine::{Effect, EventKind, Outcome, Run, RunContext, Step};
use promptforge_syntax::Prompt;
use util::{Order, drive};

const PROMPT: &str = "---\nname: effects\ndescription: store and model effects\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# Effects\n\n```lua\nmodels.default('writer')\nstore.write('log.txt', 'start')\n```\n\n## Work\n\n```lua\nstore.append('log.txt', '|work')\nlocal ok, err = pcall(store.read, 'missing.txt')\nlog(err.kind .. ':' .. err.reason)\nvar.reply = models.infer('hello')\n```\n\n## Finish\n\nSay {{ var.reply }}.\n\n```lua\nlocal msgs = messages.new():user(prose)\nmodels.loop(msgs)\nreturn store.read('log.txt') .. '|' .. msgs[#msgs].content .. '|' .. tostring(store.exists('log.txt'))\n```\n";

#[test]
fn outcome_and_events_do_not_depend_on_answer_timing() {
    let first = drive(PROMPT, Order::Issued);
    assert_eq!(
        first.outcome,
        Outcome::Completed("start|work|echo: Say echo: hello.|true".into())
    );
    let rounds: Vec<bool> = first
        .effects
        .iter()
        .filter_map(|(_, e)| match e {
            Effect::ModelRound(r) => Some(r.infer),
            _ => None,
        })
        .collect();
    assert_eq!(rounds, [true, false]);
    assert_eq!(first.logs(), ["store:not_found"]);
    // Effect ids are issued in increasing order.
    assert!(first.effects.windows(2).all(|w| w[0].0 < w[1].0));
    for order in Order::ALL {
        let other = drive(PROMPT, order);
        assert_eq!(other.outcome, first.outcome, "{order:?}");
        assert_eq!(other.events, first.events, "{order:?}");
        assert_eq!(other.effects, first.effects, "{order:?}");
        assert_eq!(other.files, first.files, "{order:?}");
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
fn cancel_while_waiting_ends_cancelled_and_withdraws_nothing_twice() {
    let prompt = Arc::new(Prompt::parse(PROMPT).unwrap());
    let mut run = Run::new(prompt, util::context(7));
    match run.step() {
        Step::Effects(batch) => assert_eq!(batch.issued.len(), 1),
        other => panic!("{other:?}"),
    }
    run.cancel();
    assert_eq!(run.step(), Step::Done(Outcome::Cancelled));
    let ended = run
        .take_events()
        .into_iter()
        .filter(|e| matches!(e.kind, EventKind::RunEnded { .. }))
        .count();
    assert_eq!(ended, 1);
}

const FANOUT_PROMPT: &str = "---\nname: arms\ndescription: concurrent arms\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# Arms\n\n```lua\nmodels.default('writer')\n```\n\n## Main\n\n```lua\nlocal r = fanout('### Worker', {'a', 'b', 'c'})\nreturn table.concat(r, ',') .. '|' .. store.read('out/b.txt')\n```\n\n### Worker\n\n```lua\nlocal first = models.infer('first ' .. item)\nstore.write('out/' .. item .. '.txt', first)\nreturn models.infer('second ' .. item .. ' ' .. sys.id)\n```\n";

#[test]
fn every_answer_order_gives_the_same_run() {
    let first = drive(FANOUT_PROMPT, Order::Issued);
    assert_eq!(
        first.result(),
        "echo: second a 0.0.0,echo: second b 0.1.0,echo: second c 0.2.0|echo: first b"
    );
    // The arms run beside each other: every arm's first round is out before any second one.
    assert_eq!(
        first.prompts(),
        [
            "first a",
            "first b",
            "first c",
            "second a 0.0.0",
            "second b 0.1.0",
            "second c 0.2.0"
        ]
    );
    assert!(first.most_rounds >= 3, "{}", first.most_rounds);
    for order in Order::ALL {
        let other = drive(FANOUT_PROMPT, order);
        assert_eq!(other.outcome, first.outcome, "{order:?}");
        assert_eq!(other.events, first.events, "{order:?}");
        assert_eq!(other.effects, first.effects, "{order:?}");
    }
}
