//! A `models.loop` message list between rounds: checked on every round, converted once.
//!
//! Chapter 11 checks the whole list before every round, extra fields included, so a record the
//! prompt changed between rounds is caught like a new one. Converting every record to JSON and
//! checking it again each round made a round's cost grow with the conversation. Instead the
//! loop keeps, for each record it has checked, the record's first-layer result and a
//! *snapshot* (`loop_walk.rs`: every key and value the record held, nested tables followed in
//! full, numbers with their subtype, the rest by object identity, with the shim keeping every
//! object named alive). Before a round one raw walk over the list confirms it is a plain
//! sequence and finds the leading records that are the same tables holding exactly what their
//! snapshots hold, in the same traversal order (a table nobody wrote to traverses the same way
//! every time). Those keep their checked form; every later record (new, replaced, or edited in
//! any field) is converted and checked from scratch here. The rules across records then run
//! over the whole list every round, and the composed records reuse the checked ones (shared,
//! never copied). Anything unusual (a list that is not a plain sequence in traversal order)
//! takes the full conversion, which reports the exact error.

use std::sync::Arc;

use mlua::{Lua, Table, UserData, Value};
use serde_json::Value as Json;

use promptforge_protocol::conversation::{Message, SharedMessages, ToolSpec};

use crate::conversation::{self, Across, Checked, UsageMemory};
use crate::json_raw;
use crate::loop_walk::Snapshot;

/// The message for a list holding a value JSON cannot carry.
const NOT_JSON: &str = "messages must be a JSON-representable table";

/// One `models.loop` call's list state on the Rust side: the first-layer result of every
/// record checked so far (aligned with the shim's snapshots) and what the last check composed.
/// It reaches Lua as an opaque value the shim holds for the loop's duration; the round's
/// request takes the composed records from it, never through a Lua table.
#[derive(Debug, Default)]
pub(crate) struct LoopList {
    cached: Vec<Checked>,
    /// The rules across records, gone through `cached` (see [`Across`]).
    across: Across,
    /// What the last check composed: the records the next round sends.
    composed: SharedMessages,
    /// The position in `cached` of each composed record's first record.
    starts: Vec<usize>,
    /// The leading system count the composition was made with (`None`: compose afresh).
    composed_leading: Option<usize>,
    /// Each composed record's bytes for the precheck's estimate, kept while it is unchanged.
    bytes: Vec<u64>,
    /// The records in `cached` as they were when checked, for the next round's walk.
    snapshot: Snapshot,
    /// The tools the last round offered (see [`LoopList::offered_tools`]).
    tools: Option<OfferedTools>,
}

/// The tools a round offered: the objects its specs named, the list that holds them (kept
/// alive, so no address in `key` can be reused by a new object), and their conversion.
#[derive(Debug)]
struct OfferedTools {
    key: Vec<[usize; 3]>,
    #[expect(dead_code, reason = "held only to keep the objects `key` names alive")]
    anchor: Table,
    specs: Arc<[ToolSpec]>,
}

/// What names each spec of a round's tool list: its `name`, `description` and `parameters`
/// objects by address; `None` for anything but a list of tables.
fn tools_key(specs: &Table) -> mlua::Result<Option<Vec<[usize; 3]>>> {
    let len = specs.raw_len();
    let mut key = Vec::with_capacity(len);
    for index in 1..=len {
        let Value::Table(spec) = specs.raw_get::<Value>(index)? else {
            return Ok(None);
        };
        let mut entry = [0; 3];
        for (slot, field) in entry.iter_mut().zip(["name", "description", "parameters"]) {
            let value: Value = spec.raw_get(field)?;
            *slot = match value {
                Value::String(_) | Value::Table(_) => value.to_pointer() as usize,
                _ => return Ok(None),
            };
        }
        key.push(entry);
    }
    Ok(Some(key))
}

impl UserData for LoopList {}

impl LoopList {
    /// The tools a round offers, as `convert` reads them from `specs` (the shim's list of
    /// `{name, description, parameters}`), or the last round's conversion again when `specs`
    /// names the same objects in the same order. That reuse is exact because the shim builds
    /// every spec from its own tables, which nothing writes once they are made (a local
    /// tool's schema at `tools.add_local`, a bound tool's from the Host, the task built-ins'
    /// constants) and which no prompt code can reach (a tool object's `parameters` is a
    /// fresh empty table), and strings never change.
    pub(crate) fn offered_tools(
        &mut self,
        specs: &Value,
        convert: impl FnOnce() -> Result<Vec<ToolSpec>, String>,
    ) -> Result<Arc<[ToolSpec]>, String> {
        let key = match specs {
            Value::Table(table) => tools_key(table).ok().flatten().map(|k| (k, table)),
            _ => None,
        };
        if let (Some((key, _)), Some(held)) = (&key, &self.tools)
            && *key == held.key
        {
            return Ok(Arc::clone(&held.specs));
        }
        let specs: Arc<[ToolSpec]> = convert()?.into();
        self.tools = key.map(|(key, table)| OfferedTools {
            key,
            anchor: table.clone(),
            specs: Arc::clone(&specs),
        });
        Ok(specs)
    }

    /// The records the next round sends.
    pub(crate) fn composed(&self) -> &[Arc<Message>] {
        &self.composed
    }

    /// The composed records as the round sends them: the list itself, shared.
    pub(crate) fn composed_shared(&self) -> SharedMessages {
        Arc::clone(&self.composed)
    }

    /// How many leading records of `list` are the ones checked last time, unchanged; `None`
    /// when `list` is not a plain sequence (see [`Snapshot::unchanged_prefix`]).
    pub(crate) fn unchanged_prefix(&self, lua: &Lua, list: &Value) -> mlua::Result<Option<usize>> {
        self.snapshot.unchanged_prefix(lua, list)
    }

    /// The precheck on the composed records (see [`UsageMemory::precheck`]).
    pub(crate) fn fits(
        &self,
        usage: &UsageMemory,
        key: &str,
        context: u64,
        max_tokens: Option<u64>,
    ) -> bool {
        let tokens = usage.request_tokens_counted(&self.composed, &self.bytes, key);
        conversation::fits(tokens, context, max_tokens)
    }

    /// Checks `list` by every rule of chapter 11 and composes it; `Err` is the message of the
    /// first broken rule. `unchanged` is what the shim's walk found: `Some(p)` when the list is
    /// a plain sequence whose first `p` records are exactly the ones checked last time (they
    /// are not converted again), `None` when the list needs the full conversion.
    pub(crate) fn check(
        &mut self,
        lua: &Lua,
        list: &Value,
        unchanged: Option<usize>,
    ) -> mlua::Result<Result<(), String>> {
        let checked = match (list, unchanged) {
            (Value::Table(table), Some(unchanged)) => self.check_sequence(lua, table, unchanged)?,
            _ => self.check_whole(lua, list),
        };
        match checked {
            Ok(kept) => {
                match unchanged {
                    // `cached` now holds the first `p` records as before and the rest anew.
                    Some(p) if p <= self.snapshot.len() => self.snapshot.remember(lua, list, p)?,
                    _ => self.snapshot.clear(),
                }
                self.compose(kept);
                Ok(Ok(()))
            }
            Err(message) => {
                self.cached.clear();
                self.across = Across::default();
                self.snapshot.clear();
                Ok(Err(message))
            }
        }
    }

    /// Composes `cached`, whose first `kept` records are the ones the last composition was
    /// made from. Its records before the entry holding record `kept` stand (an entry's run
    /// only ever depends on the records before it and the leading system count); the rest
    /// is composed again, and records that come out the same keep their counted bytes.
    fn compose(&mut self, kept: usize) {
        let leading = self.across.leading();
        let from = match leading {
            Some(_) if leading == self.composed_leading && kept > 0 => {
                self.starts.partition_point(|&s| s < kept).checked_sub(1)
            }
            _ => None,
        };
        let (entry, first) = from
            .and_then(|k| Some((k, *self.starts.get(k)?)))
            .unwrap_or_default();
        let leading = leading.unwrap_or(self.cached.len());
        // The list is extended in place when no round holds it any more (the usual case: the
        // last round's request is gone); otherwise the kept entries are copied.
        let mut composed: Vec<Arc<Message>> = match Arc::get_mut(&mut self.composed) {
            Some(list) => std::mem::take(list),
            None => self.composed.to_vec(),
        };
        // The entries composed again, to keep the counted bytes of those that come out the same.
        let before = composed.split_off(entry.min(composed.len()));
        composed.reserve(self.cached.len().saturating_sub(composed.len()));
        self.starts.truncate(entry);
        let records: Vec<Arc<Message>> = self
            .cached
            .get(first..)
            .unwrap_or_default()
            .iter()
            .map(|c| c.message.clone())
            .collect();
        conversation::compose_onto(
            &mut composed,
            Some(&mut self.starts),
            &records,
            first,
            leading,
        );
        self.bytes.truncate(composed.len());
        for (i, record) in composed.iter().enumerate().skip(entry) {
            let counted = match (before.get(i - entry), self.bytes.get(i)) {
                (Some(before), Some(&counted)) if Arc::ptr_eq(before, record) => counted,
                _ => conversation::estimate_bytes(record),
            };
            match self.bytes.get_mut(i) {
                Some(slot) => *slot = counted,
                None => self.bytes.push(counted),
            }
        }
        self.composed = Arc::new(composed);
        self.composed_leading = self.across.leading();
    }

    /// The full conversion: the whole list read as JSON and checked. No record is kept.
    fn check_whole(&mut self, lua: &Lua, list: &Value) -> Result<usize, String> {
        self.cached.clear();
        self.across = Across::default();
        let data = json_raw::to_json(lua, list, "messages").map_err(|_| NOT_JSON.to_owned())?;
        let (cached, across) = conversation::check_list_walk(&data)?;
        self.cached = cached;
        self.across = across;
        Ok(0)
    }

    /// A plain sequence whose first `unchanged` records were checked before.
    fn check_sequence(
        &mut self,
        lua: &Lua,
        table: &Table,
        unchanged: usize,
    ) -> mlua::Result<Result<usize, String>> {
        let len = table.raw_len();
        if len == 0 || unchanged > self.cached.len() || unchanged > len {
            // Not a list the shim's walk can have vouched for: start over.
            return Ok(self.check_whole(lua, &Value::Table(table.clone())));
        }
        self.cached.truncate(unchanged);
        // First every new record is read (a value JSON cannot carry anywhere fails before any
        // record's own rules), then the first layer runs in list order.
        let mut fresh: Vec<Json> = Vec::with_capacity(len - unchanged);
        for index in unchanged + 1..=len {
            let record: Value = table.raw_get(index)?;
            match json_raw::to_json_within(lua, &record, "messages", table.to_pointer()) {
                Ok(data) => fresh.push(data),
                Err(_) => return Ok(Err(NOT_JSON.to_owned())),
            }
        }
        for (offset, data) in fresh.iter().enumerate() {
            match conversation::check_record(unchanged + offset + 1, data) {
                Ok(record) => self.cached.push(record),
                Err(message) => return Ok(Err(message)),
            }
        }
        // The rules across records go on from where they stopped when every record they went
        // through is still there as it was; otherwise they go through the list again.
        if self.across.seen() != unchanged {
            self.across = Across::default();
        }
        if let Err(message) = self
            .across
            .go_on(&self.cached)
            .and_then(|()| self.across.finish())
        {
            return Ok(Err(message));
        }
        Ok(Ok(unchanged))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use mlua::Lua;

    use super::*;

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
    fn records_vouched_for_are_shared_and_the_rest_checked() {
        let (lua, list) = setup();
        let mut state = LoopList::default();
        state.check(&lua, &list, Some(0)).unwrap().unwrap();
        let first = state.composed().to_vec();
        assert_eq!(
            texts(&state),
            ["system:s", "user:q", "assistant:", "tool:r1"]
        );
        lua.load("msgs[5] = { role = 'user', content = 'more' }")
            .exec()
            .unwrap();
        state.check(&lua, &list, Some(4)).unwrap().unwrap();
        let second = state.composed();
        assert_eq!(second.len(), 5);
        for (a, b) in first.iter().zip(second) {
            assert!(Arc::ptr_eq(a, b), "{a:?} was converted again");
        }
        assert_eq!(texts(&state)[4], "user:more");
        // Only the records after the vouched-for prefix are read again.
        lua.load("msgs[3].tool_calls[1].id = 'c2'").exec().unwrap();
        assert_eq!(state.check(&lua, &list, Some(5)).unwrap(), Ok(()));
        assert_eq!(
            state.check(&lua, &list, Some(2)).unwrap(),
            Err(
                "messages[4] is an orphan tool record: no pending assistant tool call with id \"c1\""
                    .to_owned()
            )
        );
    }

    #[test]
    fn a_round_offering_the_same_tool_objects_reuses_their_conversion() {
        let lua = Lua::new();
        let mut state = LoopList::default();
        let specs = |lua: &Lua| -> Value {
            lua.load("return { { name = 'look', description = D, parameters = P } }")
                .eval()
                .unwrap()
        };
        lua.load("D = 'Look it up'; P = { type = 'object' }")
            .exec()
            .unwrap();
        let converted = std::cell::Cell::new(0);
        let convert = || {
            converted.set(converted.get() + 1);
            Ok(vec![ToolSpec {
                name: "look".into(),
                description: "Look it up".into(),
                parameters: serde_json::json!({"type": "object"}),
            }])
        };
        let first = state.offered_tools(&specs(&lua), convert).unwrap();
        // A fresh list naming the same objects: the same conversion, shared.
        let second = state.offered_tools(&specs(&lua), convert).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(converted.get(), 1);
        // Another description or another parameters table: converted again.
        lua.load("D = 'Look it up now'").exec().unwrap();
        state.offered_tools(&specs(&lua), convert).unwrap();
        lua.load("P = { type = 'object' }").exec().unwrap();
        let third = state.offered_tools(&specs(&lua), convert).unwrap();
        assert_eq!(converted.get(), 3);
        assert!(!Arc::ptr_eq(&first, &third));
        // Anything but a list of spec tables is converted every time.
        let odd: Value = lua.load("return { 'look' }").eval().unwrap();
        state.offered_tools(&odd, convert).unwrap();
        state.offered_tools(&odd, convert).unwrap();
        assert_eq!(converted.get(), 5);
    }

    #[test]
    fn the_full_conversion_reports_exact_errors() {
        let (lua, list) = setup();
        let mut state = LoopList::default();
        for (edit, expected) in [
            ("msgs.x = 1", "messages must be an array of message tables"),
            ("msgs.x = nil; msgs[2].f = function() end", NOT_JSON),
            (
                "msgs[2].f = nil; msgs[2].content = 5",
                "messages[2] content must be a string or a non-empty array of content parts",
            ),
        ] {
            lua.load(edit).exec().unwrap();
            assert_eq!(
                state.check(&lua, &list, None).unwrap(),
                Err(expected.to_owned()),
                "{edit}"
            );
            // A prefix the state never checked is not trusted.
            assert_eq!(
                state.check(&lua, &list, Some(3)).unwrap(),
                Err(expected.to_owned()),
                "{edit}"
            );
        }
        let empty: Value = lua.load("return {}").eval().unwrap();
        assert_eq!(
            state.check(&lua, &empty, Some(0)).unwrap(),
            Err("messages must not be empty".to_owned())
        );
    }
}
