//! A `models.loop` message list between rounds: checked on every round, converted once.
//!
//! Chapter 11 checks the whole list before every round, extra fields included, so a record the
//! prompt changed between rounds is caught like a new one. Converting every record to JSON and
//! checking it again each round made a round's cost grow with the conversation; instead a
//! [`LoopList`] keeps, for each record it has checked, the record's first-layer result and a
//! *snapshot*: every key and value it held, strings and tables by identity. Before a round the
//! list is walked raw once: a record whose table is the same object and whose entries are
//! identical, in the same traversal order, to its snapshot is exactly the record checked
//! before, so its checked form is reused; any other record (new, replaced, or edited in any
//! field, nested tables included) is converted and checked from scratch. The rules across
//! records then run over the whole list every round, and the composed records reuse the
//! checked ones (shared, never copied).
//!
//! The snapshot holds the values it compares against, so an identity it remembers can never
//! be reused by a new object. Anything unusual (a list that is not a plain sequence, a record
//! that is not a table) takes the full conversion, which reports the exact error.

use std::sync::Arc;

use mlua::{Table, UserData, Value};
use serde_json::Value as Json;

use promptforge_protocol::conversation::Message;

use crate::conversation::{self, Checked, UsageMemory};
use crate::json;

/// The message for a list holding a value JSON cannot carry.
const NOT_JSON: &str = "messages must be a JSON-representable table";

/// One value of a snapshot: a scalar (strings by identity), or a table by identity with its
/// own entries.
#[derive(Debug)]
enum Snap {
    Scalar(Value),
    Table(Table, Vec<(Value, Snap)>),
}

/// A record checked on an earlier round.
#[derive(Debug)]
struct Cached {
    table: Table,
    entries: Vec<(Value, Snap)>,
    checked: Checked,
}

/// One `models.loop` call's list state: the records checked so far and what the last check
/// composed. It reaches Lua as an opaque value the shim holds for the loop's duration; the
/// round's request takes the composed records from it, never through a Lua table.
#[derive(Debug, Default)]
pub(crate) struct LoopList {
    list: Option<Table>,
    cached: Vec<Cached>,
    /// What the last check composed: the records the next round sends.
    composed: Vec<Arc<Message>>,
}

impl UserData for LoopList {}

impl LoopList {
    /// The records the next round sends.
    pub(crate) fn composed(&self) -> &[Arc<Message>] {
        &self.composed
    }

    /// The precheck on the composed records (see [`UsageMemory::precheck`]).
    pub(crate) fn fits(
        &self,
        usage: &UsageMemory,
        key: &str,
        context: u64,
        max_tokens: Option<u64>,
    ) -> bool {
        usage.precheck(&self.composed, key, context, max_tokens)
    }

    /// Checks `list` by every rule of chapter 11 and composes it; `Err` is the message of the
    /// first broken rule. Records unchanged since the last check are not converted again.
    pub(crate) fn check(&mut self, list: &Value) -> mlua::Result<Result<(), String>> {
        let result = match list {
            Value::Table(table) => self.check_table(table)?,
            _ => None,
        };
        let checked = match result {
            Some(checked) => checked,
            None => {
                // The full conversion: exact errors for everything unusual.
                self.list = None;
                self.cached.clear();
                let Ok(data) = json::to_json(list, "messages") else {
                    return Ok(Err(NOT_JSON.to_owned()));
                };
                match conversation::check_list(&data) {
                    Ok(records) => {
                        self.composed = conversation::compose(
                            &records.into_iter().map(Arc::new).collect::<Vec<_>>(),
                        );
                        return Ok(Ok(()));
                    }
                    Err(message) => return Ok(Err(message)),
                }
            }
        };
        match checked {
            Ok(records) => {
                self.composed = conversation::compose(&records);
                Ok(Ok(()))
            }
            Err(message) => {
                self.list = None;
                self.cached.clear();
                Ok(Err(message))
            }
        }
    }

    /// The incremental check of a list table; `None` when the list needs the full conversion
    /// (not a plain sequence of tables).
    #[allow(clippy::type_complexity)]
    fn check_table(
        &mut self,
        table: &Table,
    ) -> mlua::Result<Option<Result<Vec<Arc<Message>>, String>>> {
        let len = table.raw_len();
        if len == 0 {
            return Ok(None);
        }
        // The list's entries, placed by index; any key but 1..len means "not a sequence".
        let mut records: Vec<Option<Table>> = vec![None; len];
        for pair in table.pairs::<Value, Value>() {
            let (key, value) = pair?;
            let (Value::Integer(index), Value::Table(record)) = (key, value) else {
                return Ok(None);
            };
            let slot = usize::try_from(index)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .and_then(|i| records.get_mut(i));
            match slot {
                Some(slot @ None) => *slot = Some(record),
                _ => return Ok(None),
            }
        }
        let same_list = self
            .list
            .as_ref()
            .is_some_and(|known| known.to_pointer() == table.to_pointer());
        if !same_list {
            self.cached.clear();
        }
        // First every record is read (a value JSON cannot carry anywhere fails before any
        // record's own rules), then the first layer runs in list order.
        let mut fresh: Vec<(usize, Json)> = Vec::new();
        let mut reused = 0;
        for (position, record) in records.iter().enumerate() {
            let Some(record) = record else {
                return Ok(None);
            };
            if position == reused
                && let Some(cached) = self.cached.get(position)
                && cached.table.to_pointer() == record.to_pointer()
                && unchanged(record, &cached.entries)?
            {
                reused += 1;
                continue;
            }
            match json::to_json_within(
                &Value::Table(record.clone()),
                "messages",
                table.to_pointer(),
            ) {
                Ok(data) => fresh.push((position, data)),
                Err(_) => return Ok(Some(Err(NOT_JSON.to_owned()))),
            }
        }
        self.cached.truncate(reused);
        let mut checked: Vec<Checked> = self.cached.iter().map(|c| c.checked.clone()).collect();
        for (position, data) in fresh {
            let record = match conversation::check_record(position + 1, &data) {
                Ok(record) => record,
                Err(message) => return Ok(Some(Err(message))),
            };
            checked.push(record);
        }
        if let Err(message) = conversation::check_across(&checked) {
            return Ok(Some(Err(message)));
        }
        // Remember every record now checked.
        for (position, record) in records.into_iter().enumerate().skip(reused) {
            let (Some(record), Some(done)) = (record, checked.get(position)) else {
                continue;
            };
            let entries = snapshot(&record)?;
            self.cached.push(Cached {
                table: record,
                entries,
                checked: done.clone(),
            });
        }
        self.list = Some(table.clone());
        Ok(Some(Ok(checked.into_iter().map(|c| c.message).collect())))
    }
}

/// Every entry of a table in traversal order, nested tables included. Called only on a table
/// [`json::to_json`] accepted, so it is finite and acyclic.
fn snapshot(table: &Table) -> mlua::Result<Vec<(Value, Snap)>> {
    let mut entries = Vec::new();
    for pair in table.pairs::<Value, Value>() {
        let (key, value) = pair?;
        let snap = match value {
            Value::Table(inner) => {
                let nested = snapshot(&inner)?;
                Snap::Table(inner, nested)
            }
            other => Snap::Scalar(other),
        };
        entries.push((key, snap));
    }
    Ok(entries)
}

/// Whether `table` holds exactly the entries of its snapshot, in the same traversal order
/// (a table nobody wrote to traverses the same way every time).
fn unchanged(table: &Table, entries: &[(Value, Snap)]) -> mlua::Result<bool> {
    let mut expected = entries.iter();
    for pair in table.pairs::<Value, Value>() {
        let (key, value) = pair?;
        let Some((known_key, known)) = expected.next() else {
            return Ok(false);
        };
        if !identical(&key, known_key) {
            return Ok(false);
        }
        let same = match (known, &value) {
            (Snap::Scalar(known), value) => identical(value, known),
            (Snap::Table(known, nested), Value::Table(inner)) => {
                known.to_pointer() == inner.to_pointer() && unchanged(inner, nested)?
            }
            _ => false,
        };
        if !same {
            return Ok(false);
        }
    }
    Ok(expected.next().is_none())
}

/// Scalars compared exactly: strings by identity (the snapshot holds its strings, so an
/// identity is never reused while it is remembered), numbers by type and bits.
fn identical(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(a), Value::String(b)) => a.to_pointer() == b.to_pointer(),
        (Value::Integer(a), Value::Integer(b)) => a == b,
        (Value::Number(a), Value::Number(b)) => a.to_bits() == b.to_bits(),
        (Value::Boolean(a), Value::Boolean(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use mlua::Lua;

    use super::*;

    fn check(state: &mut LoopList, list: &Value) -> Result<(), String> {
        state.check(list).unwrap()
    }

    fn texts(state: &LoopList) -> Vec<String> {
        state
            .composed()
            .iter()
            .map(|m| format!("{}:{}", m.role(), m.content().text()))
            .collect()
    }

    fn setup() -> (Lua, Value) {
        let lua = Lua::new();
        let list: Value = lua
            .load(
                r#"
                msgs = {
                  { role = 'system', content = 's' },
                  { role = 'user', content = 'q', extra = { deep = { 1, 2 } } },
                  { role = 'assistant', content = '', tool_calls = {
                      { id = 'c1', name = 'look', arguments = { k = 'v' } } } },
                  { role = 'tool', content = 'r1', tool_call_id = 'c1' },
                }
                return msgs
                "#,
            )
            .eval()
            .unwrap();
        (lua, list)
    }

    #[test]
    fn unchanged_records_are_shared_and_appended_ones_checked() {
        let (lua, list) = setup();
        let mut state = LoopList::default();
        check(&mut state, &list).unwrap();
        let first = state.composed().to_vec();
        assert_eq!(
            texts(&state),
            ["system:s", "user:q", "assistant:", "tool:r1"]
        );
        lua.load("msgs[5] = { role = 'user', content = 'more' }")
            .exec()
            .unwrap();
        check(&mut state, &list).unwrap();
        let second = state.composed();
        assert_eq!(second.len(), 5);
        for (a, b) in first.iter().zip(second) {
            assert!(Arc::ptr_eq(a, b), "{a:?} was converted again");
        }
        assert_eq!(texts(&state)[4], "user:more");
    }

    #[test]
    fn every_kind_of_edit_is_seen() {
        let edits = [
            ("msgs[2].content = 'edited'", Ok("user:edited")),
            ("msgs[2].extra.deep[3] = 3", Ok("user:q")),
            ("msgs[2].extra.deep[1] = function() end", Err(NOT_JSON)),
            (
                "msgs[3].tool_calls[1].arguments = 'x'",
                Err("messages[3] tool_calls[1] arguments must be a table"),
            ),
            (
                "msgs[3].tool_calls[1].id = 'c2'",
                Err(
                    "messages[4] is an orphan tool record: no pending assistant tool call with id \"c1\"",
                ),
            ),
            (
                "msgs[2] = { role = 'user', content = 'new' }",
                Ok("user:new"),
            ),
            (
                "msgs[2].content = nil",
                Err("messages[2] content must be a string or a non-empty array of content parts"),
            ),
            (
                "msgs.x = 1",
                Err("messages must be an array of message tables"),
            ),
            ("msgs[2].self = msgs", Err(NOT_JSON)),
            (
                "table.remove(msgs, 4)",
                Err("messages[3] tool call \"c1\" has no tool result"),
            ),
        ];
        for (edit, expected) in edits {
            let (lua, list) = setup();
            let mut state = LoopList::default();
            check(&mut state, &list).unwrap();
            lua.load(edit).exec().unwrap();
            let got = check(&mut state, &list);
            match expected {
                Ok(text) => {
                    assert_eq!(got, Ok(()), "{edit}");
                    assert_eq!(texts(&state)[1], text, "{edit}");
                }
                Err(message) => assert_eq!(got, Err(message.to_owned()), "{edit}"),
            }
            // A fresh state (the full conversion) agrees with the incremental one.
            let mut fresh = LoopList::default();
            assert_eq!(check(&mut fresh, &list), got, "{edit}");
            if got.is_ok() {
                assert_eq!(texts(&fresh), texts(&state), "{edit}");
            }
        }
    }

    #[test]
    fn a_different_list_starts_over() {
        let (lua, list) = setup();
        let mut state = LoopList::default();
        check(&mut state, &list).unwrap();
        let other: Value = lua
            .load("return { { role = 'user', content = 'other' } }")
            .eval()
            .unwrap();
        check(&mut state, &other).unwrap();
        assert_eq!(texts(&state), ["user:other"]);
        let empty: Value = lua.load("return {}").eval().unwrap();
        assert_eq!(
            check(&mut state, &empty),
            Err("messages must not be empty".to_owned())
        );
    }
}
