//! A `models.loop` list is converted once and checked every round: edits a local tool makes
//! between rounds reach the next round exactly as a fresh conversion of the list would send
//! them (numbers keep their subtype, nested tables and added keys included), while records
//! nobody touched are shared between rounds, never copied.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod util;

use std::sync::Arc;

use promptforge_engine::{Effect, Outcome};
use serde_json::json;
use util::{FakeHarness, Order, context, drive_with};

const PROMPT: &str = r#"---
name: loop-list
description: a list edited between rounds
promptforge: 0
models:
  writer: {}
---

# Loop list

## Main

```lua
models.default('writer')
local msgs = messages.new():user('q')
  :assistant('', { { id = 'c0', name = 'look', arguments = { a = 1, z = 0.0, list = { 1, 2 } } } })
  :tool('r0', 'c0'):user('again')
local calls = 0
tools.add_local('look', 'Look', {}, function()
  calls = calls + 1
  local args = msgs[2].tool_calls[1].arguments
  if calls == 1 then
    msgs[1].content = 'edited'
    args.a = 1.0
    args.z = -0.0
    args.list[3] = 3
    args.new = 'x'
  else
    msgs[2].tool_calls[1].arguments = { a = 1, z = 0.0, list = { 1, 2, 3 }, new = 'x' }
  end
  return 'seen'
end)
models.loop(msgs)
return tostring(#msgs)
```
"#;

fn model() -> util::ModelFn {
    Box::new(|round| {
        let calls = round
            .messages
            .iter()
            .filter(|m| m.role() == "assistant")
            .count();
        if calls < 3 {
            json!({"finish_reason": "tool_calls", "tool_calls": [
                {"id": format!("call_{calls}"), "name": "look", "arguments": {}}]})
        } else {
            json!({"text": "done", "finish_reason": "stop"})
        }
    })
}

#[test]
fn edits_between_rounds_reach_the_next_round_and_the_rest_is_shared() {
    let harness = FakeHarness {
        model: model(),
        ..FakeHarness::default()
    };
    let run = drive_with(PROMPT, context(7), harness, Order::Issued);
    assert_eq!(run.outcome, Outcome::Completed("9".into()));
    let rounds: Vec<_> = run
        .effects
        .iter()
        .filter_map(|(_, e)| match e {
            Effect::ModelRound(r) => Some(r.messages.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(rounds.len(), 3);
    let wire = |i: usize| serde_json::to_value(&rounds[i]).unwrap();
    let assistant = |args: serde_json::Value| {
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c0", "name": "look", "arguments": args}]})
    };
    let call = |n: usize| {
        [
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": format!("call_{n}"), "name": "look", "arguments": {}}]}),
            json!({"role": "tool", "content": "seen", "tool_call_id": format!("call_{n}")}),
        ]
    };
    let tail = [
        json!({"role": "tool", "content": "r0", "tool_call_id": "c0"}),
        json!({"role": "user", "content": "again"}),
    ];
    let first = json!([{"role": "user", "content": "q"},
        assistant(json!({"a": 1, "z": 0.0, "list": [1, 2]})), tail[0], tail[1]]);
    assert_eq!(wire(0), first);
    let [a1, t1] = call(1);
    let second = json!([{"role": "user", "content": "edited"},
        assistant(json!({"a": 1.0, "z": -0.0, "list": [1, 2, 3], "new": "x"})),
        tail[0], tail[1], a1, t1]);
    assert_eq!(wire(1), second);
    // The subtype and the sign of zero are part of what is sent, not only the value.
    let text = serde_json::to_string(&rounds[1]).unwrap();
    assert!(
        text.contains(r#""a":1.0"#) && text.contains(r#""z":-0.0"#),
        "{text}"
    );
    let [a2, t2] = call(2);
    let third = json!([{"role": "user", "content": "edited"},
        assistant(json!({"a": 1, "z": 0.0, "list": [1, 2, 3], "new": "x"})),
        tail[0], tail[1], a1, t1, a2, t2]);
    assert_eq!(wire(2), third);
    let text = serde_json::to_string(&rounds[2]).unwrap();
    assert!(
        text.contains(r#""a":1,"#) && text.contains(r#""z":0.0"#),
        "{text}"
    );
    // The records before the first one edited are the same records from round to round;
    // from the first edited one on, the list is converted again.
    assert!(Arc::ptr_eq(&rounds[1][0], &rounds[2][0]));
    assert!(!Arc::ptr_eq(&rounds[0][0], &rounds[1][0]));
    assert!(!Arc::ptr_eq(&rounds[1][2], &rounds[2][2]));
}
