//! Tasks and admission, driven in process: every answer order gives the same run, the
//! concurrency limit holds at every level, nested waits never deadlock, queued tasks hold no
//! VM, and timers are real effects that are withdrawn when a wait ends first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod util;

use promptforge_engine::{Effect, EventKind, Outcome, TaskEnding};
use util::{FakeHarness, Order, context, drive, drive_with, with_writer as header};

#[test]
fn a_race_and_its_cancelled_loser_are_the_same_in_every_answer_order() {
    let source = header(
        "## Answer\n\n```lua\nlocal quick = tasks.spawn('### Quick')\nlocal careful = tasks.spawn('### Careful')\nlocal first, ok, result = tasks.join_any({ quick, careful })\nfor _, t in ipairs(tasks.pending()) do tasks.cancel(t) end\nlocal s = tasks.status(careful)\nreturn first.task .. '=' .. result .. '|' .. s.state .. '|' .. tostring(s.ok)\n```\n\n### Quick\n\n```lua\nreturn models.infer('quick')\n```\n\n### Careful\n\n```lua\nlocal a = models.infer('careful 1')\nreturn models.infer('careful 2 ' .. a)\n```\n",
    );
    let first = drive(&source, Order::Issued);
    assert_eq!(first.result(), "0.0=echo: quick|cancelled|false");
    // The loser's second round was issued and then withdrawn when it was cancelled, or never
    // issued at all: either way no answer to it is ever taken.
    for order in Order::ALL {
        let other = drive(&source, order);
        assert_eq!(other.outcome, first.outcome, "{order:?}");
        assert_eq!(other.events, first.events, "{order:?}");
        assert_eq!(other.effects, first.effects, "{order:?}");
    }
}

const MANY: usize = 10_000;

#[test]
fn queued_arms_hold_no_vm_and_the_limit_holds() {
    let source = header(&format!(
        "## Main\n\n```lua\nlocal members = {{}}\nfor i = 1, {MANY} do members[i] = 'm' .. i end\nlocal r = fanout('### Ask', members)\nreturn #r .. ':' .. r[1].text .. ':' .. r[{MANY}].text\n```\n\n### Ask\n\n```lua\nreturn models.infer(item)\n```\n"
    ));
    let before = promptforge_lua::vm::live_vms();
    let t = drive(&source, Order::Issued);
    assert_eq!(
        t.result(),
        format!("{MANY}:echo: m1:echo: m{MANY}").as_str()
    );
    // The main walk's VM and one per admitted arm: queued arms cost no VM.
    assert!(
        t.most_vms - before <= 1 + 8,
        "{} VMs alive with {MANY} arms queued",
        t.most_vms - before
    );
    assert_eq!(t.most_rounds, 8, "every slot in use, never more");
    assert_eq!(promptforge_lua::vm::live_vms(), before, "every VM is gone");
}

#[test]
fn nested_fanouts_never_deadlock_even_at_a_limit_of_one() {
    let source = header(
        "## Parent\n\n```lua\nlocal r = fanout('### Outer', {'a', 'b', 'c'})\nreturn table.concat(r, ';')\n```\n\n### Outer\n\n```lua\nlocal inner = fanout('### Inner', {item .. '1', item .. '2'})\nlocal t = tasks.spawn('### Inner', { item = item .. '3' })\nlocal _, _, third = tasks.join_any({ t })\nreturn item .. ':' .. table.concat(inner, ',') .. ',' .. third\n```\n\n### Inner\n\n```lua\nreturn models.infer(item)\n```\n",
    );
    for limit in [1, 2, 8] {
        let mut ctx = context(3);
        ctx.concurrency = limit;
        let t = drive_with(&source, ctx, FakeHarness::default(), Order::Issued);
        assert_eq!(
            t.result(),
            "a:echo: a1,echo: a2,echo: a3;b:echo: b1,echo: b2,echo: b3;c:echo: c1,echo: c2,echo: c3",
            "limit {limit}"
        );
        assert!(
            t.most_rounds <= limit as usize,
            "limit {limit}: {}",
            t.most_rounds
        );
    }
}

#[test]
fn queued_tasks_start_in_spawn_order_and_read_queued_meanwhile() {
    let source = header(
        "## Main\n\n```lua\nlocal set = {}\nfor i = 1, 5 do set[i] = tasks.spawn('### Work', { index = i }) end\nstore.write('park', 'x')\nlocal s = tasks.status(set[5])\nlocal results = tasks.join(set)\nlocal out = {}\nfor i = 1, 5 do out[i] = results[i].result end\nreturn s.state .. ':' .. tostring(s.blocked) .. '|' .. table.concat(out, ',')\n```\n\n### Work\n\n```lua\nreturn models.infer('w' .. sys.index)\n```\n",
    );
    let mut ctx = context(5);
    ctx.concurrency = 2;
    let t = drive_with(&source, ctx, FakeHarness::default(), Order::Reversed);
    assert_eq!(
        t.result(),
        "running:queued|echo: w1,echo: w2,echo: w3,echo: w4,echo: w5"
    );
    let started: Vec<String> = t
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::TaskStarted))
        .map(|e| e.task.clone())
        .collect();
    assert_eq!(started, ["0.0", "0.1", "0.2", "0.3", "0.4"]);
    assert!(t.most_rounds <= 2);
}

#[test]
fn tasks_concurrency_lowers_a_chains_own_limit() {
    let source = header(
        "## Main\n\n```lua\nlocal a = tasks.concurrency(16)\nlocal b = tasks.concurrency(1)\nlocal set = {}\nfor i = 1, 4 do set[i] = tasks.spawn('### Work', { index = i }) end\ntasks.join(set)\nlocal c = tasks.concurrency(3)\nreturn a .. ',' .. b .. ',' .. c .. ',' .. tasks.concurrency()\n```\n\n### Work\n\n```lua\nreturn models.infer('w' .. sys.index)\n```\n",
    );
    let t = drive(&source, Order::Issued);
    assert_eq!(t.result(), "8,1,3,3");
    assert_eq!(t.most_rounds, 1, "the chain's own limit of 1");
}

#[test]
fn a_timed_wait_is_a_timer_effect_withdrawn_when_the_member_ends_first() {
    let source = header(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Work')\nlocal first, ok, result = tasks.join_any({ t }, { timeout = 5 })\nlocal u = tasks.spawn('### Work')\nreturn first.task .. '|' .. result .. '|' .. u.task .. '|' .. tasks.join({ u })[1].result\n```\n\n### Work\n\n```lua\nreturn models.infer('w ' .. sys.taskid)\n```\n",
    );
    let t = drive(&source, Order::Issued);
    // The timed wait took index 1, so the next spawn is 0.2.
    assert_eq!(t.result(), "0.0|echo: w 0.0|0.2|echo: w 0.2");
    let timers: Vec<u64> = t
        .effects
        .iter()
        .filter(|(_, e)| matches!(e, Effect::Timer { .. }))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(timers.len(), 1);
    assert_eq!(
        t.withdrawn, timers,
        "the timeout is dropped once the task ends"
    );
}

#[test]
fn a_timer_that_fires_first_ends_the_wait_with_nothing() {
    let source = header(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Work')\nlocal first = tasks.join_any({ t }, { timeout = 0 })\nlocal results, timed_out = tasks.join({ t }, { timeout = 0.5 })\nlocal _, ok, result = tasks.join_any({ t })\nreturn tostring(first) .. '|' .. tostring(results[1]) .. '|' .. tostring(timed_out) .. '|' .. tostring(ok) .. '|' .. result\n```\n\n### Work\n\n```lua\nreturn models.infer('slow')\n```\n",
    );
    // A slow model: both timeouts fire before the task's round returns, the members keep
    // running, and a wait without a timeout collects the task.
    let harness = FakeHarness {
        rounds_last: true,
        ..FakeHarness::default()
    };
    let t = drive_with(&source, context(1), harness, Order::Issued);
    assert_eq!(t.result(), "nil|nil|true|true|echo: slow");
    let timers = t
        .effects
        .iter()
        .filter(|(_, e)| matches!(e, Effect::Timer { .. }))
        .count();
    // A zero timeout is answered at the call (nothing can end in no time); the 0.5 s one is
    // a real timer, and it fired.
    assert_eq!(timers, 1);
    assert!(t.withdrawn.is_empty(), "the timer fired");
}

#[test]
fn a_host_cancel_abandons_live_tasks_exactly_once() {
    use std::sync::Arc;
    let source = header(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Work')\nlocal u = tasks.spawn('### Work')\nreturn tasks.join({ t, u })[1].result\n```\n\n### Work\n\n```lua\nlocal inner = tasks.spawn('### Leaf')\ntasks.join({ inner })\nreturn 'x'\n```\n\n### Leaf\n\n```lua\nreturn models.infer('leaf')\n```\n",
    );
    let prompt = Arc::new(promptforge_syntax::Prompt::parse(&source).unwrap());
    let mut run = promptforge_engine::Run::new(prompt, context(1));
    let mut events = Vec::new();
    loop {
        match run.step() {
            promptforge_engine::Step::Effects(batch) => {
                events.extend(run.take_events());
                if batch
                    .issued
                    .iter()
                    .any(|(_, e)| matches!(e, Effect::ModelRound(_)))
                {
                    break;
                }
            }
            other => panic!("{other:?}"),
        }
    }
    run.cancel();
    assert_eq!(
        run.step(),
        promptforge_engine::Step::Done(Outcome::Cancelled)
    );
    events.extend(run.take_events());
    let ended: Vec<(String, TaskEnding)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskEnded { ending } => Some((e.task.clone(), *ending)),
            _ => None,
        })
        .collect();
    use promptforge_engine::AbandonReason::{OwnerAborted, RunTerminated};
    assert_eq!(
        ended,
        [
            ("0.0".into(), TaskEnding::Abandoned(RunTerminated)),
            ("0.0.0".into(), TaskEnding::Abandoned(OwnerAborted)),
            ("0.1".into(), TaskEnding::Abandoned(RunTerminated)),
            ("0.1.0".into(), TaskEnding::Abandoned(OwnerAborted)),
        ]
    );
}
