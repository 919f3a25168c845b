//! Running ahead changes nothing a run reports: strands advance on their own answers the
//! moment those arrive (and queued tasks start as soon as a slot is free in fact), yet every
//! outcome, event, effect id and request, store state and status read is the one the committed
//! order gives. Each prompt here is driven in order with run-ahead off, then under many seeded
//! arrival orders and timings with run-ahead on, and every transcript must match the first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod util;

use promptforge_engine::protocol::ModelRound;
use promptforge_engine::{Outcome, RunErrorKind};
use serde_json::json;
use util::{FakeHarness, ModelFn, Order, Transcript, context, drive_with, echo_model};

fn header(h1: &str, body: &str) -> String {
    format!(
        "---\nname: t\ndescription: d\npromptforge: 0\nmodels:\n  writer: {{}}\n---\n\n# T\n\n{h1}{body}"
    )
}

/// Queued tasks prepared ahead across this file's drives (the shuffled orders prepare them).
static PREPARED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

const DEFAULT: &str = "```lua\nmodels.default('writer')\n```\n\n";

/// The orders compared against the in-order run: the fixed ones and 24 seeded random ones
/// (a random subset of what is held answered each time, in a random order).
fn orders() -> Vec<Order> {
    let mut orders = vec![
        Order::Issued,
        Order::Reversed,
        Order::OneAtATime,
        Order::NewestOnly,
    ];
    orders.extend((0..24).map(|seed| Order::Shuffled(1000 + seed * 7919)));
    orders
}

/// Drive `source` in order without run-ahead, then in every order with it, and require the
/// same transcript; returns the reference and how many effects went out ahead in all.
fn same_in_every_order(
    source: &str,
    harness: impl Fn() -> FakeHarness,
    limit: u32,
) -> (Transcript, usize) {
    let mut ctx = context(11);
    ctx.concurrency = limit;
    ctx.run_ahead = false;
    let reference = drive_with(source, ctx, harness(), Order::Issued);
    assert_eq!(reference.ahead, 0, "nothing runs ahead when it is off");
    let mut ahead = 0;
    for order in orders() {
        let mut ctx = context(11);
        ctx.concurrency = limit;
        let other = drive_with(source, ctx, harness(), order);
        assert_eq!(other.outcome, reference.outcome, "{order:?}");
        assert_eq!(other.events, reference.events, "{order:?}");
        let ids = |t: &Transcript| t.effects.iter().map(|(id, _)| *id).collect::<Vec<_>>();
        assert_eq!(ids(&other), ids(&reference), "{order:?}: effect ids");
        assert_eq!(other.effects, reference.effects, "{order:?}");
        assert_eq!(other.files, reference.files, "{order:?}");
        assert!(
            other.most_rounds <= limit as usize + 1,
            "{order:?}: {} rounds in flight under a limit of {limit}",
            other.most_rounds
        );
        ahead += other.ahead;
        PREPARED.fetch_add(other.prepared, std::sync::atomic::Ordering::Relaxed);
    }
    (reference, ahead)
}

#[test]
fn fanouts_with_several_rounds_a_failing_arm_and_a_walk_past_the_target() {
    let source = header(
        DEFAULT,
        "## Main\n\n```lua\nlocal ok, err = pcall(fanout, '### Arm', {'a', 'b', 'f', 'c', 'd', 'e'})\nlocal r = fanout('### Arm', {'p', 'c', 'q', 'r', 's'})\nlocal texts = {}\nfor i = 1, #r do texts[i] = r[i].text end\nreturn tostring(ok) .. '|' .. tostring(err) .. '|' .. table.concat(texts, ',')\n```\n\n### Arm\n\n```lua\nlocal a = models.infer(item)\nlog('arm ' .. item .. ' got ' .. a)\nif item == 'f' then error('boom ' .. a) end\nlocal b = models.infer(a .. '+')\nif item ~= 'c' then return b end\nvar.x = b\n```\n\n### After\n\n```lua\nlog('after ' .. var.x)\nreturn 'after ' .. models.infer(var.x)\n```\n",
    );
    for limit in [1, 3, 8] {
        let (reference, ahead) = same_in_every_order(&source, FakeHarness::default, limit);
        assert!(
            reference.result().starts_with("false|"),
            "{}",
            reference.result()
        );
        assert!(
            reference.result().ends_with(
                "echo: echo: p+,after echo: echo: echo: c+,echo: echo: q+,echo: echo: r+,echo: echo: s+"
            ),
            "{}",
            reference.result()
        );
        if limit > 1 {
            assert!(ahead > 0, "limit {limit}: no work ever went out ahead");
        }
    }
    assert!(
        PREPARED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no queued arm was ever prepared"
    );
}

#[test]
fn a_race_its_status_reads_and_its_cancelled_loser() {
    let source = header(
        DEFAULT,
        "## Answer\n\n```lua\nlocal quick = tasks.spawn('### Quick')\nlocal careful = tasks.spawn('### Careful')\nlocal first, ok, result = tasks.join_any({ quick, careful })\nlocal s1 = tasks.status(careful)\nlocal seen = tostring(s1.blocked) .. ',' .. tostring(s1.section) .. ',' .. s1.turns .. ',' .. s1.state\nfor _, t in ipairs(tasks.pending()) do tasks.cancel(t) end\nlocal s = tasks.status(careful)\nreturn first.task .. '=' .. result .. '|' .. seen .. '|' .. s.state .. ',' .. s.turns\n```\n\n### Quick\n\n```lua\nreturn models.infer('quick')\n```\n\n### Careful\n\n```lua\nlocal a = models.infer('careful 1')\nlocal b = models.infer('careful 2 ' .. a)\nreturn models.infer('careful 3 ' .. b)\n```\n",
    );
    for limit in [1, 2, 8] {
        let (reference, ahead) = same_in_every_order(&source, FakeHarness::default, limit);
        assert!(
            reference.result().starts_with("0.0=echo: quick|"),
            "{}",
            reference.result()
        );
        if limit > 1 {
            assert!(ahead > 0, "limit {limit}: no work ever went out ahead");
        }
    }
}

#[test]
fn store_calls_in_arms_and_a_conflict_the_checker_reports_the_same_way() {
    let own = header(
        DEFAULT,
        "## Main\n\n```lua\nlocal r = fanout('### Arm', {'a', 'b', 'c', 'd'})\nlocal files = {}\nfor _, x in ipairs({'a', 'b', 'c', 'd'}) do files[#files + 1] = store.read(x .. '.txt') end\nreturn table.concat(files, ';') .. '|' .. r[4].text\n```\n\n### Arm\n\n```lua\nlocal t = models.infer(item)\nstore.write(item .. '.txt', t)\nlocal again = store.read(item .. '.txt')\nreturn models.infer(again)\n```\n",
    );
    // Store calls wait for the committed order, so these arms run ahead only up to them.
    let (reference, _) = same_in_every_order(&own, FakeHarness::default, 8);
    assert_eq!(
        reference.result(),
        "echo: a;echo: b;echo: c;echo: d|echo: echo: d"
    );
    let conflict = header(
        DEFAULT,
        "## Main\n\n```lua\nlocal r = fanout('### Arm', {'a', 'b', 'c'})\nreturn 'unreachable'\n```\n\n### Arm\n\n```lua\nlocal t = models.infer(item)\nstore.write('same.txt', t)\nreturn models.infer(t)\n```\n",
    );
    let (reference, _) = same_in_every_order(&conflict, FakeHarness::default, 8);
    match &reference.outcome {
        Outcome::Failed(error) => assert_eq!(error.kind, RunErrorKind::Determinism),
        other => panic!("{other:?}"),
    }
}

/// A model that starts two tasks, waits for them twice, then answers with what it saw.
fn spawning_model() -> ModelFn {
    let mut echo = echo_model();
    Box::new(move |round: &ModelRound| {
        if round.infer {
            return echo(round);
        }
        let assistants = round
            .messages
            .iter()
            .filter(|m| m.role() == "assistant")
            .count();
        match assistants {
            0 => json!({"finish_reason": "tool_calls", "tool_calls": [
                {"id": "a", "name": "task", "arguments": {"target": "## Child", "input": "c1"}},
                {"id": "b", "name": "task", "arguments": {"target": "## Child", "input": "c2"}},
            ]}),
            1 | 2 => json!({"finish_reason": "tool_calls", "tool_calls": [
                {"id": format!("w{assistants}"), "name": "await_tasks", "arguments": {}},
            ]}),
            _ => {
                let seen: Vec<String> = round
                    .messages
                    .iter()
                    .filter_map(|m| match m.content() {
                        promptforge_protocol::conversation::Content::Text(text) => {
                            Some(text.clone())
                        }
                        _ => None,
                    })
                    .collect();
                json!({"text": seen.join(" / "), "finish_reason": "stop"})
            }
        }
    })
}

#[test]
fn model_tasks_and_the_notices_a_round_gathers() {
    let source = header(
        DEFAULT,
        "## Main\n\n```lua\ntools.allow_tasks()\nlocal msgs = messages.new():user('PARENT')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n\n## Child\n\n```lua\nlocal a = models.infer('child ' .. args)\nreturn models.infer(a)\n```\n",
    );
    let harness = || FakeHarness {
        model: spawning_model(),
        ..FakeHarness::default()
    };
    let (reference, ahead) = same_in_every_order(&source, harness, 8);
    assert!(
        reference.result().contains("PARENT"),
        "{}",
        reference.result()
    );
    assert!(ahead > 0, "the children never ran ahead");
}

#[test]
fn timed_waits_take_the_same_ids_and_fire_at_the_same_point() {
    let source = header(
        DEFAULT,
        "## Main\n\n```lua\nlocal slow = tasks.spawn('### Slow')\nlocal other = tasks.spawn('### Slow')\nlocal a, ok, r = tasks.join_any({ slow }, { timeout = 5 })\nlocal first = tostring(a and a.task) .. ':' .. tostring(r)\nlocal rest = a and tasks.join({ other }) or tasks.join({ slow, other })\nreturn first .. '|' .. rest[#rest].result\n```\n\n### Slow\n\n```lua\nlocal a = models.infer('s1')\nreturn models.infer(a)\n```\n",
    );
    for rounds_last in [false, true] {
        let harness = || FakeHarness {
            rounds_last,
            ..FakeHarness::default()
        };
        let (reference, _) = same_in_every_order(&source, harness, 8);
        // A slow model loses the race to the timeout; an instant one wins it.
        let expected = if rounds_last {
            "nil:nil|echo: echo: s1"
        } else {
            "0.0:echo: echo: s1|echo: echo: s1"
        };
        assert_eq!(reference.result(), expected);
    }
}

#[test]
fn nested_fanouts_under_a_lowered_limit_with_calls_in_the_arms() {
    let source = header(
        DEFAULT,
        "## Main\n\n```lua\ntasks.concurrency(3)\nlocal r = fanout('### Outer', {'x', 'y', 'z', 'w'})\nreturn table.concat(r, ';')\n```\n\n### Outer\n\n```lua\nlocal a = call('#### Helper', item)\nlocal inner = fanout('#### Inner', {item .. '1', item .. '2'})\nreturn a .. ':' .. table.concat(inner, ',')\n```\n\n#### Helper\n\n```lua\nlocal h = models.infer('help ' .. args)\nreturn models.infer(h)\n```\n\n#### Inner\n\n```lua\nlocal t = models.infer(item)\nreturn models.infer(t)\n```\n",
    );
    for limit in [1, 2, 8] {
        let (reference, ahead) = same_in_every_order(&source, FakeHarness::default, limit);
        assert!(
            reference
                .result()
                .starts_with("echo: echo: help x:echo: echo: x1,echo: echo: x2;"),
            "{}",
            reference.result()
        );
        if limit > 1 {
            assert!(ahead > 0, "limit {limit}: no work ever went out ahead");
        }
    }
}

#[test]
fn the_prompt_wide_default_set_late_is_seen_where_the_order_says() {
    // The first task's second round reads the default; in the committed order the main
    // walk has set it by then, though the task's first answer may arrive before main's.
    let source = header(
        "",
        "## Main\n\n```lua\nlocal w1 = tasks.spawn('### W', { item = '1' })\nlocal w2 = tasks.spawn('### W', { item = '2' })\nmodels.use('writer')\nlocal m = models.infer('main')\nmodels.default('writer')\nlocal r = tasks.join({ w1, w2 })\nreturn m .. '|' .. r[1].result .. '|' .. r[2].result\n```\n\n### W\n\n```lua\nlocal h = models.get('writer')\nlocal a = models.infer(h, 'w' .. item)\nlocal ok, v = pcall(models.infer, a)\nreturn tostring(ok) .. ':' .. tostring(ok and v or v.kind)\n```\n",
    );
    for limit in [1, 2, 8] {
        let (reference, _) = same_in_every_order(&source, FakeHarness::default, limit);
        assert_eq!(
            reference.result(),
            "echo: main|true:echo: echo: w1|true:echo: echo: w2",
            "limit {limit}"
        );
    }
}

#[test]
fn status_reads_of_a_task_admitted_after_it_ran_ahead() {
    // A task queued behind a limit of 2 starts ahead when an earlier one ends early, runs on
    // through rounds of its own, and is admitted later; status reads before and after its
    // admission see what the committed order makes of it.
    let source = header(
        DEFAULT,
        "## Main\n\n```lua\nlocal a = tasks.spawn('### One')\nlocal b = tasks.spawn('### One')\nlocal c = tasks.spawn('### Three')\nlocal function seen(t)\n  local s = tasks.status(t)\n  return tostring(s.blocked) .. ',' .. tostring(s.section) .. ',' .. s.turns .. ',' .. s.state\nend\nlocal before = seen(c)\nlocal m = models.infer('m1')\nlocal mid = seen(c)\ntasks.join({ a })\nlocal m2 = models.infer('m2')\nlocal after = seen(c)\nlocal m3 = models.infer('m3')\nlocal later = seen(c)\ntasks.join({ b, c })\nreturn before .. '|' .. mid .. '|' .. after .. '|' .. later\n```\n\n### One\n\n```lua\nreturn models.infer('one ' .. sys.taskid)\n```\n\n### Three\n\n```lua\nlocal x = models.infer('t1')\nlocal y = models.infer('t2 ' .. x)\nreturn models.infer('t3 ' .. y)\n```\n",
    );
    for limit in [1, 2, 3] {
        let (reference, _) = same_in_every_order(&source, FakeHarness::default, limit);
        assert!(
            reference.result().contains("|chat,Three,"),
            "{}",
            reference.result()
        );
    }
}

#[test]
fn a_waiter_taking_its_slot_back_is_never_outrun_by_a_task_started_ahead() {
    // Under a limit of 1, W waits on T1 (giving its slot back) while Q2 queues behind it.
    // When T1 ends early, W will take the slot back when its wait returns: Q2 must not start
    // ahead meanwhile, or two tasks would send rounds under a limit of one.
    let source = header(
        DEFAULT,
        "## Main\n\n```lua\nlocal w = tasks.spawn('### W')\nlocal m = models.infer('main')\nlocal r = tasks.join({ w })\nreturn m .. '|' .. r[1].result\n```\n\n### W\n\n```lua\nlocal t1 = tasks.spawn('#### T', { item = '1' })\nlocal q2 = tasks.spawn('#### T', { item = '2' })\nlocal r = tasks.join({ t1 })\nlocal again = models.infer('w after')\nlocal r2 = tasks.join({ q2 })\nreturn r[1].result .. '+' .. again .. '+' .. r2[1].result\n```\n\n#### T\n\n```lua\nlocal a = models.infer('t' .. item)\nreturn models.infer(a)\n```\n",
    );
    for limit in [1, 2] {
        let (reference, _) = same_in_every_order(&source, FakeHarness::default, limit);
        assert_eq!(
            reference.result(),
            "echo: main|echo: echo: t1+echo: w after+echo: echo: t2"
        );
    }
}
