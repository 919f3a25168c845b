//! Message lists for `models.loop` (chapter 11): checking a list, composing it for the model,
//! the context precheck, and accepting a round's reply.
//!
//! Everything here is pure data in, data out. A record reaches [`check_record`] as JSON
//! ([`serde_json::Value`]: sequences as arrays, other tables as objects, an empty table as
//! `{}`) after the Lua side checked the two rules that need Lua types (the list is a table;
//! every value is JSON-representable); it applies the record's own rules in the chapter's
//! order and returns it as a [`Message`] with its extra fields dropped, and [`check_across`]
//! applies the rules that span records. `loop_list.rs` runs both every round, converting only
//! the records that changed. [`compose`] merges runs of records the way the model receives
//! them, [`reply_room`], [`fits`] and [`UsageMemory`] implement the precheck, and
//! [`check_reply_calls`] and [`reply_arguments`] decide what happens to a round's reply. The
//! empty-reply rule lives in the shim (`shim/models.lua`), beside the loop it ends.
//!
//! The records are the protocol's [`Message`]s, so a checked record is what the model round
//! carries and the Harness sends: one type from the list to the wire.

use rustc_hash::FxHashSet;
use std::borrow::Borrow;
use std::sync::Arc;

use serde_json::{Map, Value};

pub use promptforge_protocol::conversation::{
    Content, ContentPart, ImageUrl, Message, ToolCall, Usage,
};

/// The role of a message record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// `system`: instructions, only in the leading block.
    System,
    /// `user`: a user turn.
    User,
    /// `assistant`: the model's turn, with any tool calls it made.
    Assistant,
    /// `tool`: the result of one tool call.
    Tool,
}

impl Role {
    #[cfg(test)]
    /// The role string as a record spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }

    /// The role for an exact lowercase role string, or `None` for any other string.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "system" => Some(Self::System),
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            "tool" => Some(Self::Tool),
            _ => None,
        }
    }
}

/// The role of a record.
pub fn role_of(message: &Message) -> Role {
    match message {
        Message::System { .. } => Role::System,
        Message::User { .. } => Role::User,
        Message::Assistant { .. } => Role::Assistant,
        Message::Tool { .. } => Role::Tool,
    }
}

/// A record's tool calls (empty on every record but an assistant's).
pub fn tool_calls_of(message: &Message) -> &[ToolCall] {
    match message {
        Message::Assistant { tool_calls, .. } => tool_calls,
        _ => &[],
    }
}

/// The UTF-8 bytes the precheck counts for content: the plain string, or the `text` of every
/// text part (image parts count nothing).
pub fn text_bytes(content: &Content) -> u64 {
    match content {
        Content::Text(text) => len_u64(text.len()),
        Content::Parts(parts) => parts
            .iter()
            .map(|part| match part {
                ContentPart::Text { text } => len_u64(text.len()),
                ContentPart::ImageUrl { .. } => 0,
            })
            .sum(),
    }
}

/// The UTF-8 bytes the precheck counts for a record: its content's text plus the serialized
/// form of each tool call (see [`tool_call_bytes`]).
pub fn estimate_bytes(message: &Message) -> u64 {
    text_bytes(message.content())
        + tool_calls_of(message)
            .iter()
            .map(tool_call_bytes)
            .sum::<u64>()
}

fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Checking the list
// ---------------------------------------------------------------------------------------------

/// The message for an empty list.
pub const EMPTY_LIST: &str = "messages must not be empty";
/// The message for a list that is not a sequence.
pub const NOT_AN_ARRAY: &str = "messages must be an array of message tables";

/// A record after the first layer of checks, with what the second layer still needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The record as the model receives it, extra fields dropped.
    pub message: Arc<Message>,
    /// Whether the record set `tool_calls` at all, an empty table included.
    sets_tool_calls: bool,
    /// Whether the record set a `tool_call_id`.
    sets_tool_call_id: bool,
}

#[cfg(test)]
/// Checks a message list converted to JSON and returns its records, extra fields dropped.
///
/// The Lua side has already checked that the list is a table and that every value in it is
/// JSON-representable. This applies the rest of "Checking the list" in order: the list is not
/// empty and is a sequence; then every record's own fields, record by record in list order;
/// then the rules across records. The `Err` is the exact message of the first broken rule.
///
/// JSON `null` anywhere counts as an absent field (Lua `nil`). An empty object `{}` is an empty
/// Lua table, so it is accepted where an empty sequence is (`tool_calls`, `arguments`) and is an
/// empty list where the list itself is expected. Should a non-table value reach this function
/// anyway, it gets the `messages must be a table of message tables, got {type}` message with
/// the Lua type name (`nil`, `boolean`, `integer`, `number`, `string`).
pub fn check_list(list: &Value) -> Result<Vec<Message>, String> {
    Ok(check_list_records(list)?
        .into_iter()
        .map(|c| Arc::unwrap_or_clone(c.message))
        .collect())
}

#[cfg(test)]
/// [`check_list`], keeping each record's first-layer result.
pub fn check_list_records(list: &Value) -> Result<Vec<Checked>, String> {
    check_list_walk(list).map(|(checked, _)| checked)
}

/// [`check_list_records`], with the walk of the rules across records as it ended (for a
/// list that goes on growing).
pub fn check_list_walk(list: &Value) -> Result<(Vec<Checked>, Across), String> {
    let items = match list {
        Value::Array(items) if items.is_empty() => return Err(EMPTY_LIST.to_owned()),
        Value::Object(map) if map.is_empty() => return Err(EMPTY_LIST.to_owned()),
        Value::Array(items) => items,
        Value::Object(_) => return Err(NOT_AN_ARRAY.to_owned()),
        other => {
            return Err(format!(
                "messages must be a table of message tables, got {}",
                lua_type_name(other)
            ));
        }
    };
    let mut checked = Vec::with_capacity(items.len());
    for (position, item) in items.iter().enumerate() {
        checked.push(check_record(position + 1, item)?);
    }
    let mut across = Across::default();
    across.go_on(&checked)?;
    across.finish()?;
    Ok((checked, across))
}

/// The Lua type name a JSON scalar came from.
fn lua_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "nil",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) | Value::Object(_) => "table",
    }
}

/// A Lua table seen through JSON: an object's fields, or no string keys at all for a sequence.
/// `None` when the value is not a table.
fn table_fields(value: &Value) -> Option<Option<&Map<String, Value>>> {
    match value {
        Value::Object(map) => Some(Some(map)),
        Value::Array(_) => Some(None),
        _ => None,
    }
}

/// A field of a table, `null` counting as absent.
fn field<'a>(fields: Option<&'a Map<String, Value>>, name: &str) -> Option<&'a Value> {
    fields
        .and_then(|map| map.get(name))
        .filter(|v| !v.is_null())
}

/// A table field read as a string, `None` when absent or of another type.
fn string_field<'a>(fields: Option<&'a Map<String, Value>>, name: &str) -> Option<&'a str> {
    field(fields, name).and_then(Value::as_str)
}

/// The first layer: one record's own fields, in the chapter's order. `index` is the record's
/// 1-based position; `value` is the record read as JSON.
pub fn check_record(index: usize, value: &Value) -> Result<Checked, String> {
    let Some(fields) = table_fields(value) else {
        return Err(format!("messages[{index}] must be a message table"));
    };

    let role = match field(fields, "role") {
        Some(Value::String(role)) => match Role::parse(role) {
            Some(role) => role,
            None => {
                return Err(format!(
                    "messages[{index}] role \"{role}\" is unknown; known roles: system, user, \
                     assistant, tool"
                ));
            }
        },
        _ => {
            return Err(format!(
                "messages[{index}] role must be a string, one of: system, user, assistant, tool"
            ));
        }
    };

    let content = match field(fields, "content") {
        Some(Value::String(text)) => Content::Text(text.clone()),
        Some(Value::Array(parts)) if !parts.is_empty() => {
            let mut checked = Vec::with_capacity(parts.len());
            for (position, part) in parts.iter().enumerate() {
                checked.push(check_part(index, position + 1, part)?);
            }
            Content::Parts(checked)
        }
        _ => {
            return Err(format!(
                "messages[{index}] content must be a string or a non-empty array of content parts"
            ));
        }
    };

    let tool_call_id = match field(fields, "tool_call_id") {
        None => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => return Err(format!("messages[{index}] tool_call_id must be a string")),
    };
    if role == Role::Tool && tool_call_id.is_none() {
        return Err(format!(
            "messages[{index}] is a tool message and must set a string tool_call_id"
        ));
    }

    let (tool_calls, sets_tool_calls) = match field(fields, "tool_calls") {
        None => (Vec::new(), false),
        Some(Value::Array(calls)) => {
            let mut checked = Vec::with_capacity(calls.len());
            for (position, call) in calls.iter().enumerate() {
                checked.push(check_call(index, position + 1, call)?);
            }
            (checked, true)
        }
        Some(Value::Object(map)) if map.is_empty() => (Vec::new(), true),
        Some(_) => return Err(format!("messages[{index}] tool_calls must be an array")),
    };

    let sets_tool_call_id = tool_call_id.is_some();
    let message = match role {
        Role::System => Message::System { content },
        Role::User => Message::User { content },
        Role::Assistant => Message::Assistant {
            content,
            tool_calls,
            reasoning: Vec::new(),
        },
        Role::Tool => Message::Tool {
            tool_call_id: tool_call_id.unwrap_or_default(),
            content,
        },
    };
    Ok(Checked {
        message: Arc::new(message),
        sets_tool_calls,
        sets_tool_call_id,
    })
}

/// One content part: a table with a string `type`, `text` or `image_url`, and that type's
/// field.
fn check_part(index: usize, part_index: usize, value: &Value) -> Result<ContentPart, String> {
    let prefix = format!("messages[{index}] content part {part_index}");
    let fields = table_fields(value);
    let Some(kind) = fields.and_then(|fields| string_field(fields, "type")) else {
        return Err(format!("{prefix} must be a table with a string type field"));
    };
    let fields = fields.flatten();
    match kind {
        "text" => match string_field(fields, "text") {
            Some(text) => Ok(ContentPart::Text {
                text: text.to_owned(),
            }),
            None => Err(format!(
                "{prefix} is a text part and must set a string text field"
            )),
        },
        "image_url" => {
            let url = field(fields, "image_url")
                .and_then(table_fields)
                .and_then(|image| string_field(image, "url"));
            match url {
                Some(url) => Ok(ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: url.to_owned(),
                    },
                }),
                None => Err(format!(
                    "{prefix} is an image_url part and must set an image_url table with a string \
                     url field"
                )),
            }
        }
        other => Err(format!(
            "{prefix} has unknown type \"{other}\"; known types: text, image_url"
        )),
    }
}

/// One tool call: a table with a string `id`, a string `name`, and optional keyed `arguments`.
fn check_call(index: usize, call_index: usize, value: &Value) -> Result<ToolCall, String> {
    // Written only for an error (a valid call, the usual case, pays nothing for it).
    let prefix = || format!("messages[{index}] tool_calls[{call_index}]");
    let Some(fields) = table_fields(value) else {
        return Err(format!("{} must be a table", prefix()));
    };
    let Some(id) = string_field(fields, "id") else {
        return Err(format!("{} must set a string id", prefix()));
    };
    let Some(name) = string_field(fields, "name") else {
        return Err(format!("{} must set a string name", prefix()));
    };
    let arguments = match field(fields, "arguments") {
        None => Value::Object(Map::new()),
        Some(Value::Object(map)) => Value::Object(map.clone()),
        Some(Value::Array(items)) if items.is_empty() => Value::Object(Map::new()),
        Some(_) => return Err(format!("{} arguments must be a table", prefix())),
    };
    Ok(ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments,
    })
}

/// The open batch of tool calls: the assistant record's 1-based index and its calls in call
/// order, each with whether it has been answered.
#[derive(Debug, Clone)]
struct Batch {
    index: usize,
    calls: Vec<(String, bool)>,
}

impl Batch {
    /// Marks the pending call `id` answered; false when no pending call has that id.
    fn answer(&mut self, id: &str) -> bool {
        match self
            .calls
            .iter_mut()
            .find(|(call, answered)| !*answered && call == id)
        {
            Some(slot) => {
                slot.1 = true;
                true
            }
            None => false,
        }
    }

    fn is_complete(&self) -> bool {
        self.calls.iter().all(|(_, answered)| *answered)
    }

    /// The error for a batch that another record or the end of the list interrupted, naming its
    /// first unanswered call in call order.
    fn unanswered(&self) -> Result<(), String> {
        match self.calls.iter().find(|(_, answered)| !*answered) {
            Some((id, _)) => Err(format!(
                "messages[{}] tool call \"{id}\" has no tool result",
                self.index
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
/// The number of system records that open the list.
fn leading_system_count<M: Borrow<Message>>(records: &[M]) -> usize {
    records
        .iter()
        .take_while(|record| matches!(Borrow::<Message>::borrow(*record), Message::System { .. }))
        .count()
}

#[cfg(test)]
/// The second layer: the rules across records, in the chapter's order (as [`Across`] goes
/// through them).
pub fn check_across(checked: &[Checked]) -> Result<(), String> {
    let mut across = Across::default();
    across.go_on(checked)?;
    across.finish()
}

/// The rules across records as a walk that can stop and go on: what [`check_across`] knows
/// after the records it has gone through (the call ids seen, the open batch, the leading
/// system block). A `models.loop` list keeps one between rounds and only goes through the
/// records appended since, which reports exactly what the whole walk would: every rule looks
/// only backwards, so the records already gone through pass again the same way.
#[derive(Debug, Clone, Default)]
pub struct Across {
    /// How many records it has gone through.
    seen: usize,
    /// The leading system block's length, once a record after it has ended it (until then
    /// a record appended could still lengthen it, so the walk starts over).
    leading: Option<usize>,
    seen_ids: FxHashSet<String>,
    batch: Option<Batch>,
}

impl Across {
    /// How many records it has gone through.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// The leading system block's length, once a record after it has ended it.
    pub fn leading(&self) -> Option<usize> {
        self.leading
    }

    /// Goes on through `checked` from the first record it has not gone through; the records
    /// before that must be the ones it went through. `Ok` while every rule holds; the rule at
    /// the end of the list is [`Across::finish`]'s. After an `Err` the walk must start over.
    pub fn go_on(&mut self, checked: &[Checked]) -> Result<(), String> {
        let leading = match self.leading {
            Some(leading) if self.seen <= checked.len() => leading,
            _ => {
                *self = Self::default();
                let leading = checked
                    .iter()
                    .take_while(|c| matches!(*c.message, Message::System { .. }))
                    .count();
                if leading >= 2
                    && let Some(position) = checked
                        .iter()
                        .take(leading)
                        .position(|c| !matches!(c.message.content(), Content::Text(_)))
                {
                    return Err(format!(
                        "messages[{}] is a system message with content parts; only plain text \
                         system messages can be composed",
                        position + 1
                    ));
                }
                if leading < checked.len() {
                    self.leading = Some(leading);
                }
                leading
            }
        };
        let fresh = checked.get(self.seen..).unwrap_or_default();
        self.seen_ids.reserve(fresh.len());
        for (offset, entry) in fresh.iter().enumerate() {
            let position = self.seen + offset;
            let n = position + 1;
            let record = &*entry.message;
            let role = role_of(record);
            if entry.sets_tool_calls && role != Role::Assistant {
                return Err(format!(
                    "messages[{n}] sets tool_calls but is not an assistant message"
                ));
            }
            if entry.sets_tool_call_id && role != Role::Tool {
                return Err(format!(
                    "messages[{n}] sets a tool_call_id but is not a tool message"
                ));
            }
            match record {
                Message::System { .. } => {
                    if position >= leading {
                        return Err(format!(
                            "messages[{n}] is a system message outside the leading system block"
                        ));
                    }
                }
                Message::User { .. } => {
                    if let Some(open) = self.batch.take() {
                        open.unanswered()?;
                    }
                }
                Message::Assistant { tool_calls, .. } => {
                    for call in tool_calls {
                        if !self.seen_ids.insert(call.id.clone()) {
                            return Err(format!(
                                "messages[{n}] tool call id \"{}\" duplicates an earlier tool call",
                                call.id
                            ));
                        }
                    }
                    if let Some(open) = self.batch.take() {
                        open.unanswered()?;
                    }
                    if !tool_calls.is_empty() {
                        self.batch = Some(Batch {
                            index: n,
                            calls: tool_calls
                                .iter()
                                .map(|call| (call.id.clone(), false))
                                .collect(),
                        });
                    }
                }
                Message::Tool { tool_call_id, .. } => {
                    let id = tool_call_id.as_str();
                    let answered = self.batch.as_mut().is_some_and(|open| open.answer(id));
                    if !answered {
                        return Err(format!(
                            "messages[{n}] is an orphan tool record: no pending assistant tool \
                             call with id \"{id}\""
                        ));
                    }
                    if self.batch.as_ref().is_some_and(Batch::is_complete) {
                        self.batch = None;
                    }
                }
            }
        }
        self.seen = checked.len();
        Ok(())
    }

    /// The rule at the end of the list: no batch of calls left unanswered.
    pub fn finish(&self) -> Result<(), String> {
        match &self.batch {
            Some(open) => open.unanswered(),
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// How the list reaches the model
// ---------------------------------------------------------------------------------------------

/// The separator between merged user records, and between merged leading system records.
const BLANK_LINE: &str = "\n\n";

/// Composes a checked list into the records the model receives, merging runs of records:
///
/// - two or more leading system records become one, their texts joined by a blank line;
/// - user records in a row become one, joined by a blank line;
/// - assistant records in a row merge while the earlier one is text-only, joined with no
///   separator, so text right before a tool-call record joins it and the merged record carries
///   the calls;
/// - tool records, and system records outside the leading block, are never merged.
///
/// When both sides are plain text, an empty side adds nothing (no stray separator). When either
/// side uses content parts, the result is a parts array in arrival order: a non-empty plain
/// side becomes one text part, an empty plain side adds no part, and a non-empty separator is
/// inserted as its own text part even when the other side is empty text. The assistant
/// separator is empty, so it adds no part.
///
/// The input is never changed; the result is a new list.
///
/// Records that stay apart are shared, not copied (`M` is [`Message`] or `Arc<Message>`).
#[cfg(test)]
pub fn compose<M>(records: &[M]) -> Vec<M>
where
    M: Borrow<Message> + Clone + From<Message>,
{
    let mut composed: Vec<M> = Vec::with_capacity(records.len());
    compose_onto(
        &mut composed,
        None,
        records,
        0,
        leading_system_count(records),
    );
    composed
}

/// [`compose`] going on: composes `records`, the list's records from position `offset` on,
/// onto `composed` (the composition of the records before `offset`, which must end where a
/// record starts a new entry), `leading` being the list's leading system count. `starts`,
/// when given, gets the position of each new entry's first record.
pub fn compose_onto<M>(
    composed: &mut Vec<M>,
    mut starts: Option<&mut Vec<usize>>,
    records: &[M],
    offset: usize,
    leading: usize,
) where
    M: Borrow<Message> + Clone + From<Message>,
{
    let first = composed.len();
    // A record merged into is built apart and put back once its run ends.
    let mut open: Option<Message> = None;
    for (index, record) in records.iter().enumerate() {
        let position = offset + index;
        let next = record.borrow();
        let previous: Option<&Message> = match &open {
            Some(merged) => Some(merged),
            None if composed.len() > first => composed.last().map(|last| last.borrow()),
            None => None,
        };
        if let Some(previous) = previous
            && let Some(separator) = merge_separator(previous, next, position < leading)
        {
            let mut merged = match open.take() {
                Some(merged) => merged,
                None => match composed.pop() {
                    Some(last) => last.borrow().clone(),
                    None => continue,
                },
            };
            merge_into(&mut merged, next, separator);
            open = Some(merged);
            continue;
        }
        if let Some(merged) = open.take() {
            composed.push(M::from(merged));
        }
        composed.push(record.clone());
        if let Some(starts) = starts.as_deref_mut() {
            starts.push(position);
        }
    }
    if let Some(merged) = open.take() {
        composed.push(M::from(merged));
    }
}

/// The separator when `next` merges into `previous`, or `None` when they stay apart.
fn merge_separator(
    previous: &Message,
    next: &Message,
    next_is_leading: bool,
) -> Option<&'static str> {
    match (previous, next) {
        (Message::System { .. }, Message::System { .. }) if next_is_leading => Some(BLANK_LINE),
        (Message::User { .. }, Message::User { .. }) => Some(BLANK_LINE),
        (Message::Assistant { tool_calls, .. }, Message::Assistant { .. })
            if tool_calls.is_empty() =>
        {
            Some("")
        }
        _ => None,
    }
}

/// Merges `next` into `previous`: content joined by `separator`, tool calls appended.
fn merge_into(previous: &mut Message, next: &Message, separator: &str) {
    let slot = match previous {
        Message::System { content }
        | Message::User { content }
        | Message::Assistant { content, .. }
        | Message::Tool { content, .. } => content,
    };
    let content = std::mem::replace(slot, Content::Text(String::new()));
    *slot = merge_content(content, next.content(), separator);
    if let Message::Assistant { tool_calls, .. } = previous {
        tool_calls.extend(tool_calls_of(next).iter().cloned());
    }
}

fn merge_content(first: Content, second: &Content, separator: &str) -> Content {
    match (first, second) {
        (Content::Text(mut first), Content::Text(second)) => {
            if first.is_empty() {
                Content::Text(second.clone())
            } else {
                if !second.is_empty() {
                    first.push_str(separator);
                    first.push_str(second);
                }
                Content::Text(first)
            }
        }
        (first, second) => {
            let mut parts = into_parts(first);
            if !separator.is_empty() {
                parts.push(ContentPart::Text {
                    text: separator.to_owned(),
                });
            }
            parts.extend(into_parts(second.clone()));
            Content::Parts(parts)
        }
    }
}

/// Content as parts: an empty plain text adds none, other plain text one text part.
fn into_parts(content: Content) -> Vec<ContentPart> {
    match content {
        Content::Text(text) if text.is_empty() => Vec::new(),
        Content::Text(text) => vec![ContentPart::Text { text }],
        Content::Parts(parts) => parts,
    }
}

// ---------------------------------------------------------------------------------------------
// The precheck
// ---------------------------------------------------------------------------------------------

/// The most room kept for the reply when the handle sets no `max_tokens`.
pub const DEFAULT_REPLY_ROOM_CAP: u64 = 8192;
#[cfg(test)]
/// The context window of a `models.get` handle for a raw model id.
pub const RAW_MODEL_CONTEXT: u64 = 8192;
/// The per-record overhead of the estimate.
pub const TOKENS_PER_RECORD: u64 = 4;

/// The bytes one tool call weighs in the estimate: the length of its compact JSON serialization
/// `{"id":...,"name":...,"arguments":{...}}` (serde_json's compact form; the length does not
/// depend on the order of the argument keys).
pub fn tool_call_bytes(call: &ToolCall) -> u64 {
    serde_json::to_vec(call)
        .map(|bytes| len_u64(bytes.len()))
        .unwrap_or(0)
}

#[cfg(test)]
/// The estimate for records already composed: their total counted UTF-8 bytes (plain string
/// content, text parts' text, and each tool call's [`tool_call_bytes`]; images count nothing)
/// divided by 4 once with the remainder dropped, plus 4 per record.
pub fn estimate_tokens<M: Borrow<Message>>(composed: &[M]) -> u64 {
    let bytes: u64 = composed.iter().map(|m| estimate_bytes(m.borrow())).sum();
    (bytes / 4).saturating_add(TOKENS_PER_RECORD.saturating_mul(len_u64(composed.len())))
}

/// The room kept for the reply: `max_tokens` when the handle has one, otherwise one eighth of
/// the context window capped at 8192; in both cases at most half the window (rounded down).
pub fn reply_room(context: u64, max_tokens: Option<u64>) -> u64 {
    let room = max_tokens.unwrap_or_else(|| (context / 8).min(DEFAULT_REPLY_ROOM_CAP));
    room.min(context / 2)
}

/// Whether a request of `tokens` passes: tokens plus the reply room within the window.
pub fn fits(tokens: u64, context: u64, max_tokens: Option<u64>) -> bool {
    tokens.saturating_add(reply_room(context, max_tokens)) <= context
}

/// What the last round that reported usage left behind.
#[derive(Debug, Clone, PartialEq)]
struct Remembered<M> {
    model_id: String,
    sent: Vec<M>,
    total: u64,
}

/// The provider-usage rule of the precheck: after a round that reported usage, the next
/// request counts from the provider's own numbers while it extends what that round sent.
///
/// Keep one per conversation. Call [`UsageMemory::record_round`] after every round that
/// returned a reply, with the composed records it sent.
///
/// `M` is what a round sent: `Arc<Message>` in the VM, so remembering a round shares its
/// records and comparing the next request with it is a pointer check per record.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageMemory<M = Arc<Message>> {
    remembered: Option<Remembered<M>>,
}

impl<M> Default for UsageMemory<M> {
    fn default() -> Self {
        Self { remembered: None }
    }
}

impl<M: Borrow<Message> + Clone + PartialEq> UsageMemory<M> {
    /// An empty memory: every request uses the estimate.
    pub fn new() -> Self {
        Self::default()
    }

    #[cfg(test)]
    /// Forgets any remembered total.
    pub fn clear(&mut self) {
        self.remembered = None;
    }

    #[cfg(test)]
    /// Whether a provider total is remembered.
    pub fn is_empty(&self) -> bool {
        self.remembered.is_none()
    }

    #[cfg(test)]
    /// The request's token count on `model_id`: the remembered total plus the estimate for the
    /// records after the reply, when the memory is for this model and `composed` has more
    /// records than the round sent, starts with exactly those records, and continues with an
    /// assistant record; otherwise the estimate of `composed` alone.
    pub fn request_tokens(&self, composed: &[M], model_id: &str) -> u64 {
        let bytes: Vec<u64> = composed
            .iter()
            .map(|m| estimate_bytes(m.borrow()))
            .collect();
        self.request_tokens_counted(composed, &bytes, model_id)
    }

    /// [`request_tokens`](Self::request_tokens) with each record's [`estimate_bytes`] already
    /// counted (`bytes[i]` for `composed[i]`), so a caller that keeps the counts between
    /// rounds does not count unchanged records again.
    pub fn request_tokens_counted(&self, composed: &[M], bytes: &[u64], model_id: &str) -> u64 {
        let estimate = |from: usize| {
            let counted = bytes.get(from..).unwrap_or_default();
            (counted.iter().sum::<u64>() / 4)
                .saturating_add(TOKENS_PER_RECORD.saturating_mul(len_u64(counted.len())))
        };
        if let Some(memory) = &self.remembered
            && memory.model_id == model_id
            && composed.starts_with(&memory.sent)
            && let Some(reply) = composed.get(memory.sent.len())
            && matches!(reply.borrow(), Message::Assistant { .. })
        {
            return memory.total.saturating_add(estimate(memory.sent.len() + 1));
        }
        estimate(0)
    }

    #[cfg(test)]
    /// The precheck: true when the request's token count plus the reply room is at most the
    /// context window (a total equal to the window passes).
    pub fn precheck(
        &self,
        composed: &[M],
        model_id: &str,
        context: u64,
        max_tokens: Option<u64>,
    ) -> bool {
        fits(self.request_tokens(composed, model_id), context, max_tokens)
    }

    /// Notes a round that returned a reply: it sent `sent` (composed) on `model_id`. With usage,
    /// the memory becomes this round's records and total. Without usage, the memory is kept when
    /// it is for the same model, and cleared when the round ran on a different model.
    pub fn record_round(&mut self, sent: &[M], model_id: &str, usage: Option<Usage>) {
        match usage {
            Some(usage) => {
                self.remembered = Some(Remembered {
                    model_id: model_id.to_owned(),
                    sent: sent.to_vec(),
                    total: usage.conversation_tokens(),
                });
            }
            None => {
                if self
                    .remembered
                    .as_ref()
                    .is_some_and(|memory| memory.model_id != model_id)
                {
                    self.remembered = None;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Accepting a reply
// ---------------------------------------------------------------------------------------------

/// The prefix of every malformed-reply message (an `internal`-kind error at the call).
pub const MALFORMED_REPLY_PREFIX: &str = "malformed model reply: ";

/// Whether reply text counts as no reply: empty or only whitespace.
pub fn is_blank(text: &str) -> bool {
    text.trim().is_empty()
}

/// A reply call's arguments as the loop records them: a JSON object, or the malformed-reply
/// error `malformed model reply: tool_calls[{call_index}] arguments must be a JSON object` when
/// they are missing (`null`) or decoded to anything else (raw text that did not decode arrives
/// as a string and fails too). `call_index` is 1-based.
pub fn reply_arguments(call_index: usize, arguments: &Value) -> Result<Map<String, Value>, String> {
    match arguments {
        Value::Object(map) => Ok(map.clone()),
        _ => Err(format!(
            "{MALFORMED_REPLY_PREFIX}tool_calls[{call_index}] arguments must be a JSON object"
        )),
    }
}

/// Checks a round's tool calls before the loop records them. Calls are checked in order, each
/// fully before the next, and the first problem is reported:
///
/// - `malformed model reply: tool_calls[{i}] has a blank id`
/// - `malformed model reply: tool_calls[{i}] has a blank name`
/// - `malformed model reply: tool_calls[{i}] id "{id}" repeats an earlier call in the round`
///
/// where `{i}` is the call's 1-based position and blank means empty or only whitespace. Ids
/// repeated from earlier rounds are left to [`check_list`] on the next round.
pub fn check_reply_calls(calls: &[ToolCall]) -> Result<(), String> {
    let mut seen: FxHashSet<&str> = FxHashSet::default();
    for (position, call) in calls.iter().enumerate() {
        let i = position + 1;
        if is_blank(&call.id) {
            return Err(format!(
                "{MALFORMED_REPLY_PREFIX}tool_calls[{i}] has a blank id"
            ));
        }
        if is_blank(&call.name) {
            return Err(format!(
                "{MALFORMED_REPLY_PREFIX}tool_calls[{i}] has a blank name"
            ));
        }
        if !seen.insert(call.id.as_str()) {
            return Err(format!(
                "{MALFORMED_REPLY_PREFIX}tool_calls[{i}] id \"{}\" repeats an earlier call in the \
                 round",
                call.id
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn err(list: Value) -> String {
        check_list(&list).unwrap_err()
    }

    #[test]
    fn going_on_from_any_point_reports_and_composes_as_the_whole_walk() {
        let sys = |t: &str| json!({"role": "system", "content": t});
        let asst = |t: &str| json!({"role": "assistant", "content": t});
        let calls = |ids: &[&str]| {
            json!({"role": "assistant", "content": "", "tool_calls": ids.iter()
                .map(|id| json!({"id": id, "name": "w", "arguments": {}})).collect::<Vec<_>>()})
        };
        let tool = |id: &str| json!({"role": "tool", "content": "r", "tool_call_id": id});
        let lists: Vec<Vec<Value>> = vec![
            vec![
                sys("a"),
                sys("b"),
                user("q"),
                user("q2"),
                asst("x"),
                asst("y"),
            ],
            vec![
                user("q"),
                calls(&["c1", "c2"]),
                tool("c1"),
                tool("c2"),
                user("u"),
                user("v"),
            ],
            vec![
                sys("s"),
                user("q"),
                asst("t"),
                calls(&["c1"]),
                tool("c1"),
                asst("done"),
            ],
            vec![sys("s"), sys("t")],
            vec![user("q"), calls(&["c1"]), user("too soon")],
            vec![
                user("q"),
                calls(&["c1"]),
                tool("c1"),
                calls(&["c1"]),
                tool("c1"),
            ],
            vec![user("q"), tool("c9")],
            vec![user("q"), sys("late")],
            vec![
                sys("s"),
                user("q"),
                calls(&["c1", "c2"]),
                tool("c2"),
                tool("c1"),
            ],
            vec![user("q"), calls(&["c1"])],
        ];
        for list in lists {
            let checked: Vec<Checked> = list
                .iter()
                .enumerate()
                .map(|(i, v)| check_record(i + 1, v).unwrap())
                .collect();
            let whole = check_across(&checked);
            let messages: Vec<Arc<Message>> = checked.iter().map(|c| c.message.clone()).collect();
            for split in 0..=checked.len() {
                let mut across = Across::default();
                let resumed = across
                    .go_on(&checked[..split])
                    .and_then(|()| across.go_on(&checked))
                    .and_then(|()| across.finish());
                // A prefix that already breaks a rule is never gone on from.
                if Across::default().go_on(&checked[..split]).is_ok() {
                    assert_eq!(resumed, whole, "{list:?} split at {split}");
                }
                if whole.is_err() {
                    continue;
                }
                // Composing on from the entry that holds record `split - 1`.
                let leading = leading_system_count(&messages);
                let mut starts = Vec::new();
                let mut composed = Vec::new();
                compose_onto(&mut composed, Some(&mut starts), &messages, 0, leading);
                assert_eq!(composed, compose(&messages));
                let entry = starts.partition_point(|&s| s < split).saturating_sub(1);
                let first = starts.get(entry).copied().unwrap_or(0);
                let mut again: Vec<Arc<Message>> = composed[..entry].to_vec();
                starts.truncate(entry);
                compose_onto(
                    &mut again,
                    Some(&mut starts),
                    &messages[first..],
                    first,
                    leading,
                );
                assert_eq!(again, composed, "{list:?} composed on from {split}");
            }
        }
    }

    fn ok(list: Value) -> Vec<Message> {
        check_list(&list).unwrap()
    }

    fn user(text: &str) -> Value {
        json!({ "role": "user", "content": text })
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.to_owned(),
            name: "weather".to_owned(),
            arguments: Value::Object(Map::new()),
        }
    }

    fn tool_record(text: &str, id: &str) -> Message {
        Message::tool(id, text)
    }

    fn text_part(text: &str) -> ContentPart {
        ContentPart::Text {
            text: text.to_owned(),
        }
    }

    fn calls_record(ids: &[&str]) -> Value {
        let calls: Vec<Value> = ids
            .iter()
            .map(|id| json!({ "id": id, "name": "weather" }))
            .collect();
        json!({ "role": "assistant", "content": "", "tool_calls": calls })
    }

    fn tool(id: &str) -> Value {
        json!({ "role": "tool", "content": "result", "tool_call_id": id })
    }

    // ----- the list as a whole -----

    #[test]
    fn empty_list_is_refused_as_array_or_object() {
        assert_eq!(err(json!([])), "messages must not be empty");
        assert_eq!(err(json!({})), "messages must not be empty");
    }

    #[test]
    fn keyed_list_is_not_an_array() {
        assert_eq!(
            err(json!({ "role": "user", "content": "hi" })),
            "messages must be an array of message tables"
        );
        assert_eq!(
            err(json!({ "1": { "role": "user", "content": "hi" }, "3": {} })),
            "messages must be an array of message tables"
        );
    }

    #[test]
    fn non_table_list_names_the_lua_type() {
        let cases = [
            (json!(null), "nil"),
            (json!(true), "boolean"),
            (json!(3), "integer"),
            (json!(1.5), "number"),
            (json!("hi"), "string"),
        ];
        for (value, name) in cases {
            assert_eq!(
                err(value),
                format!("messages must be a table of message tables, got {name}")
            );
        }
    }

    // ----- each record -----

    #[test]
    fn record_must_be_a_table() {
        for bad in [json!("hi"), json!(1), json!(true), json!(null)] {
            assert_eq!(
                err(json!([user("a"), bad])),
                "messages[2] must be a message table"
            );
        }
    }

    #[test]
    fn sequence_record_is_a_table_without_a_role() {
        assert_eq!(
            err(json!([["user", "hi"]])),
            "messages[1] role must be a string, one of: system, user, assistant, tool"
        );
        assert_eq!(
            err(json!([{}])),
            "messages[1] role must be a string, one of: system, user, assistant, tool"
        );
    }

    #[test]
    fn role_must_be_a_string() {
        for role in [
            json!(null),
            json!(1),
            json!(true),
            json!({}),
            json!(["user"]),
        ] {
            assert_eq!(
                err(json!([{ "role": role, "content": "x" }])),
                "messages[1] role must be a string, one of: system, user, assistant, tool"
            );
        }
    }

    #[test]
    fn role_must_be_known_exactly() {
        assert_eq!(
            err(json!([{ "role": "User", "content": "x" }])),
            "messages[1] role \"User\" is unknown; known roles: system, user, assistant, tool"
        );
        assert_eq!(
            err(json!([{ "role": "", "content": "x" }])),
            "messages[1] role \"\" is unknown; known roles: system, user, assistant, tool"
        );
    }

    #[test]
    fn builder_without_content_fails_at_the_loop() {
        // `messages.new():user()` appends `{ role = "user" }`.
        assert_eq!(
            err(json!([{ "role": "user" }])),
            "messages[1] content must be a string or a non-empty array of content parts"
        );
    }

    #[test]
    fn content_must_be_string_or_non_empty_parts() {
        for content in [
            json!(null),
            json!(5),
            json!(false),
            json!([]),
            json!({}),
            json!({ "type": "text", "text": "x" }),
        ] {
            assert_eq!(
                err(json!([{ "role": "user", "content": content }])),
                "messages[1] content must be a string or a non-empty array of content parts"
            );
        }
        assert_eq!(
            *ok(json!([user("")]))[0].content(),
            Content::Text(String::new())
        );
    }

    #[test]
    fn part_must_be_a_table_with_a_string_type() {
        for part in [
            json!("text"),
            json!(1),
            json!({}),
            json!({ "text": "x" }),
            json!({ "type": 1, "text": "x" }),
            json!(["text", "x"]),
        ] {
            assert_eq!(
                err(json!([{ "role": "user", "content": [part] }])),
                "messages[1] content part 1 must be a table with a string type field"
            );
        }
    }

    #[test]
    fn part_type_must_be_known() {
        assert_eq!(
            err(json!([{ "role": "user", "content": [{ "type": "image", "url": "x" }] }])),
            "messages[1] content part 1 has unknown type \"image\"; known types: text, image_url"
        );
    }

    #[test]
    fn text_part_needs_string_text() {
        for part in [
            json!({ "type": "text" }),
            json!({ "type": "text", "text": 3 }),
            json!({ "type": "text", "text": {} }),
        ] {
            assert_eq!(
                err(json!([{ "role": "user", "content": [part] }])),
                "messages[1] content part 1 is a text part and must set a string text field"
            );
        }
    }

    #[test]
    fn image_part_needs_table_with_string_url() {
        for part in [
            json!({ "type": "image_url" }),
            json!({ "type": "image_url", "image_url": "data:x" }),
            json!({ "type": "image_url", "image_url": {} }),
            json!({ "type": "image_url", "image_url": { "url": 5 } }),
            json!({ "type": "image_url", "image_url": ["data:x"] }),
            json!({ "type": "image_url", "url": "data:x" }),
        ] {
            assert_eq!(
                err(json!([{ "role": "user", "content": [part] }])),
                "messages[1] content part 1 is an image_url part and must set an image_url \
                 table with a string url field"
            );
        }
    }

    #[test]
    fn image_url_ignores_other_keys() {
        let records = ok(json!([{ "role": "user", "content": [
            { "type": "text", "text": "What does this chart show?" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,AA", "detail": "high" } },
        ] }]));
        assert_eq!(
            *records[0].content(),
            Content::Parts(vec![
                text_part("What does this chart show?"),
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: "data:image/png;base64,AA".to_owned()
                    }
                },
            ])
        );
    }

    #[test]
    fn first_bad_part_is_reported() {
        let list = json!([user("a"), { "role": "user", "content": [
            { "type": "text", "text": "ok" },
            { "type": "video" },
            { "type": "text" },
        ] }]);
        assert_eq!(
            err(list),
            "messages[2] content part 2 has unknown type \"video\"; known types: text, image_url"
        );
    }

    #[test]
    fn tool_call_id_must_be_a_string() {
        assert_eq!(
            err(json!([{ "role": "user", "content": "x", "tool_call_id": 1 }])),
            "messages[1] tool_call_id must be a string"
        );
        // The type check comes before the tool-record rule.
        assert_eq!(
            err(json!([{ "role": "tool", "content": "x", "tool_call_id": true }])),
            "messages[1] tool_call_id must be a string"
        );
    }

    #[test]
    fn tool_record_must_set_tool_call_id() {
        for record in [
            json!({ "role": "tool", "content": "x" }),
            json!({ "role": "tool", "content": "x", "tool_call_id": null }),
        ] {
            assert_eq!(
                err(json!([user("a"), record])),
                "messages[2] is a tool message and must set a string tool_call_id"
            );
        }
    }

    #[test]
    fn tool_calls_must_be_an_array() {
        for calls in [json!("call"), json!(1), json!({ "id": "c1", "name": "w" })] {
            assert_eq!(
                err(json!([{ "role": "assistant", "content": "", "tool_calls": calls }])),
                "messages[1] tool_calls must be an array"
            );
        }
        // An empty table is an empty sequence.
        let records =
            ok(json!([user("a"), { "role": "assistant", "content": "x", "tool_calls": {} }]));
        assert!(tool_calls_of(&records[1]).is_empty());
    }

    #[test]
    fn tool_call_must_be_a_table() {
        let list = json!([{ "role": "assistant", "content": "", "tool_calls": [
            { "id": "c1", "name": "w" },
            "c2",
        ] }]);
        assert_eq!(err(list), "messages[1] tool_calls[2] must be a table");
    }

    #[test]
    fn tool_call_id_is_checked_before_name() {
        for bad in [
            json!({}),
            json!({ "name": 1 }),
            json!({ "id": 1, "name": "w" }),
            json!(["c1"]),
        ] {
            assert_eq!(
                err(json!([{ "role": "assistant", "content": "", "tool_calls": [bad] }])),
                "messages[1] tool_calls[1] must set a string id"
            );
        }
        assert_eq!(
            err(json!([{ "role": "assistant", "content": "", "tool_calls": [{ "id": "c1" }] }])),
            "messages[1] tool_calls[1] must set a string name"
        );
        assert_eq!(
            err(json!([{ "role": "assistant", "content": "", "tool_calls": [
                { "id": "c1", "name": false }
            ] }])),
            "messages[1] tool_calls[1] must set a string name"
        );
    }

    #[test]
    fn tool_call_arguments_must_be_a_keyed_table() {
        for arguments in [json!(["Paris"]), json!("{}"), json!(1), json!(true)] {
            assert_eq!(
                err(json!([{ "role": "assistant", "content": "", "tool_calls": [
                    { "id": "c1", "name": "w", "arguments": arguments }
                ] }])),
                "messages[1] tool_calls[1] arguments must be a table"
            );
        }
    }

    #[test]
    fn missing_or_empty_arguments_become_an_empty_table() {
        let records = ok(json!([
            user("a"),
            { "role": "assistant", "content": "Let me check.", "tool_calls": [
                { "id": "c1", "name": "weather", "arguments": { "city": "Paris" } },
                { "id": "c2", "name": "clock" },
                { "id": "c3", "name": "clock", "arguments": null },
                { "id": "c4", "name": "clock", "arguments": {} },
            ] },
            tool("c1"), tool("c2"), tool("c3"), tool("c4"),
        ]));
        let calls = tool_calls_of(&records[1]);
        assert_eq!(calls[0].arguments.get("city"), Some(&json!("Paris")));
        for call in &calls[1..] {
            assert_eq!(call.arguments, json!({}));
        }
    }

    #[test]
    fn first_bad_call_is_reported() {
        let list = json!([{ "role": "assistant", "content": "", "tool_calls": [
            { "id": "c1", "name": "w" },
            { "id": "c2", "name": "w", "arguments": [1] },
            { "name": "w" },
        ] }]);
        assert_eq!(
            err(list),
            "messages[1] tool_calls[2] arguments must be a table"
        );
    }

    #[test]
    fn record_fields_are_checked_in_order() {
        // role before content
        assert_eq!(
            err(json!([{ "content": 5 }])),
            "messages[1] role must be a string, one of: system, user, assistant, tool"
        );
        // unknown role before content
        assert_eq!(
            err(json!([{ "role": "bot" }])),
            "messages[1] role \"bot\" is unknown; known roles: system, user, assistant, tool"
        );
        // content before tool_call_id
        assert_eq!(
            err(json!([{ "role": "tool", "tool_call_id": 5 }])),
            "messages[1] content must be a string or a non-empty array of content parts"
        );
        // tool_call_id before tool_calls
        assert_eq!(
            err(json!([{ "role": "user", "content": "", "tool_call_id": 5, "tool_calls": 1 }])),
            "messages[1] tool_call_id must be a string"
        );
        // the tool record rule before tool_calls
        assert_eq!(
            err(json!([{ "role": "tool", "content": "", "tool_calls": 1 }])),
            "messages[1] is a tool message and must set a string tool_call_id"
        );
        // parts before tool_call_id
        assert_eq!(
            err(json!([{ "role": "user", "content": [{}], "tool_call_id": 5 }])),
            "messages[1] content part 1 must be a table with a string type field"
        );
    }

    #[test]
    fn first_bad_record_is_reported() {
        let list = json!([
            user("a"),
            { "role": "user", "content": 1 },
            { "role": 1, "content": "x" },
        ]);
        assert_eq!(
            err(list),
            "messages[2] content must be a string or a non-empty array of content parts"
        );
    }

    #[test]
    fn record_checks_run_before_rules_across_records() {
        // Record 1 opens a batch that is never answered, but record 2's own fields are bad.
        let list = json!([calls_record(&["c1"]), { "role": "x", "content": "" }]);
        assert_eq!(
            err(list),
            "messages[2] role \"x\" is unknown; known roles: system, user, assistant, tool"
        );
        let list = json!([user("a"), { "role": "system", "content": "s" }, { "role": "user" }]);
        assert_eq!(
            err(list),
            "messages[3] content must be a string or a non-empty array of content parts"
        );
    }

    #[test]
    fn extra_fields_are_dropped() {
        let records = ok(json!([
            { "role": "system", "content": "s", "api_key": "secret", "n": 1 },
            { "role": "user", "content": [
                { "type": "text", "text": "hi", "cache": true },
            ], "name": "bob" },
            { "role": "assistant", "content": "", "reasoning": "x", "tool_calls": [
                { "id": "c1", "name": "w", "type": "function", "arguments": { "a": [1, 2] } },
            ] },
            { "role": "tool", "content": "r", "tool_call_id": "c1", "name": "w" },
        ]));
        let value = serde_json::to_value(&records).unwrap();
        assert_eq!(
            value,
            json!([
                { "role": "system", "content": "s" },
                { "role": "user", "content": [{ "type": "text", "text": "hi" }] },
                { "role": "assistant", "content": "", "tool_calls": [
                    { "id": "c1", "name": "w", "arguments": { "a": [1, 2] } },
                ] },
                { "role": "tool", "content": "r", "tool_call_id": "c1" },
            ])
        );
    }

    // ----- rules across records -----

    #[test]
    fn spec_weather_list_is_valid() {
        let records = ok(json!([
            user("What is the weather in Paris?"),
            { "role": "assistant", "content": "", "tool_calls": [
                { "id": "call_1", "name": "weather", "arguments": { "city": "Paris" } },
            ] },
            { "role": "tool", "content": "Sunny, 24 C", "tool_call_id": "call_1" },
            user("And in Lyon?"),
        ]));
        assert_eq!(records.len(), 4);
        assert!(
            matches!(&records[2], Message::Tool { tool_call_id, .. } if tool_call_id == "call_1")
        );
    }

    #[test]
    fn leading_system_block_of_two_must_be_plain_text() {
        let parts = json!([{ "type": "text", "text": "s" }]);
        let list = json!([
            { "role": "system", "content": "a" },
            { "role": "system", "content": parts },
            { "role": "system", "content": parts },
            user("u"),
        ]);
        assert_eq!(
            err(list),
            "messages[2] is a system message with content parts; only plain text system \
             messages can be composed"
        );
        // A lone leading system record may use parts.
        ok(json!([{ "role": "system", "content": parts }, user("u")]));
    }

    #[test]
    fn plain_text_system_rule_runs_before_every_other_rule_across_records() {
        let parts = json!([{ "type": "text", "text": "s" }]);
        let list = json!([
            { "role": "system", "content": "a", "tool_call_id": "x" },
            { "role": "system", "content": parts },
            user("u"),
            { "role": "system", "content": "late" },
            tool("orphan"),
        ]);
        assert_eq!(
            err(list),
            "messages[2] is a system message with content parts; only plain text system \
             messages can be composed"
        );
    }

    #[test]
    fn tool_calls_only_on_assistant_records() {
        for role in ["user", "system"] {
            assert_eq!(
                err(json!([{ "role": role, "content": "x", "tool_calls": [
                    { "id": "c1", "name": "w" }
                ] }])),
                "messages[1] sets tool_calls but is not an assistant message"
            );
        }
        // Even an empty table sets it.
        assert_eq!(
            err(json!([user("a"), { "role": "user", "content": "x", "tool_calls": {} }])),
            "messages[2] sets tool_calls but is not an assistant message"
        );
        assert_eq!(
            err(json!([
                calls_record(&["c1"]),
                { "role": "tool", "content": "x", "tool_call_id": "c1", "tool_calls": [] },
            ])),
            "messages[2] sets tool_calls but is not an assistant message"
        );
    }

    #[test]
    fn tool_call_id_only_on_tool_records() {
        assert_eq!(
            err(json!([user("a"), { "role": "assistant", "content": "x", "tool_call_id": "c1" }])),
            "messages[2] sets a tool_call_id but is not a tool message"
        );
        // tool_calls placement comes first.
        assert_eq!(
            err(json!([{ "role": "user", "content": "x", "tool_call_id": "c", "tool_calls": [] }])),
            "messages[1] sets tool_calls but is not an assistant message"
        );
        // tool_call_id placement before the role's own rules.
        assert_eq!(
            err(json!([user("a"), { "role": "system", "content": "x", "tool_call_id": "c" }])),
            "messages[2] sets a tool_call_id but is not a tool message"
        );
    }

    #[test]
    fn system_records_only_in_the_leading_block() {
        assert_eq!(
            err(json!([user("a"), { "role": "system", "content": "s" }])),
            "messages[2] is a system message outside the leading system block"
        );
        assert_eq!(
            err(json!([
                { "role": "system", "content": "s" },
                user("a"),
                { "role": "assistant", "content": "b" },
                { "role": "system", "content": "s" },
            ])),
            "messages[4] is a system message outside the leading system block"
        );
        ok(json!([{ "role": "system", "content": "a" }, { "role": "system", "content": "b" }]));
    }

    #[test]
    fn misplaced_system_record_is_named_before_an_open_batch() {
        assert_eq!(
            err(json!([user("a"), calls_record(&["c1"]), { "role": "system", "content": "s" }])),
            "messages[3] is a system message outside the leading system block"
        );
    }

    #[test]
    fn tool_call_ids_are_unique_across_the_list() {
        // Twice in one record.
        assert_eq!(
            err(json!([user("a"), calls_record(&["c1", "c1"]), tool("c1")])),
            "messages[2] tool call id \"c1\" duplicates an earlier tool call"
        );
        // Repeated from an earlier round, naming the later record.
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1"]),
                tool("c1"),
                calls_record(&["c2", "c1"]),
                tool("c2"),
                tool("c1"),
            ])),
            "messages[4] tool call id \"c1\" duplicates an earlier tool call"
        );
    }

    #[test]
    fn duplicate_id_is_reported_before_the_open_batch() {
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1"]),
                calls_record(&["c1"])
            ])),
            "messages[3] tool call id \"c1\" duplicates an earlier tool call"
        );
    }

    #[test]
    fn batch_results_may_come_in_any_order() {
        ok(json!([
            user("a"),
            calls_record(&["c1", "c2", "c3"]),
            tool("c3"),
            tool("c1"),
            tool("c2"),
            { "role": "assistant", "content": "done" },
        ]));
    }

    #[test]
    fn interrupted_batch_names_the_first_unanswered_call() {
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1", "c2", "c3"]),
                tool("c2"),
                user("b")
            ])),
            "messages[2] tool call \"c1\" has no tool result"
        );
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1", "c2"]),
                tool("c1"),
                { "role": "assistant", "content": "x" },
            ])),
            "messages[2] tool call \"c2\" has no tool result"
        );
        assert_eq!(
            err(json!([
                calls_record(&["c1"]),
                calls_record(&["c2"]),
                tool("c2")
            ])),
            "messages[1] tool call \"c1\" has no tool result"
        );
    }

    #[test]
    fn placement_error_on_the_interrupting_record_comes_first() {
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1"]),
                { "role": "user", "content": "b", "tool_calls": {} },
            ])),
            "messages[3] sets tool_calls but is not an assistant message"
        );
    }

    #[test]
    fn batch_open_at_the_end_is_reported() {
        assert_eq!(
            err(json!([user("a"), calls_record(&["c1", "c2"]), tool("c2")])),
            "messages[2] tool call \"c1\" has no tool result"
        );
        assert_eq!(
            err(json!([user("a"), calls_record(&["c1"])])),
            "messages[2] tool call \"c1\" has no tool result"
        );
    }

    #[test]
    fn orphan_tool_records() {
        // No batch at all.
        assert_eq!(
            err(json!([user("a"), tool("x")])),
            "messages[2] is an orphan tool record: no pending assistant tool call with id \"x\""
        );
        // An id outside the open batch.
        assert_eq!(
            err(json!([user("a"), calls_record(&["c1"]), tool("c9")])),
            "messages[3] is an orphan tool record: no pending assistant tool call with id \"c9\""
        );
        // Answering the same call twice.
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1", "c2"]),
                tool("c1"),
                tool("c1")
            ])),
            "messages[4] is an orphan tool record: no pending assistant tool call with id \"c1\""
        );
        // After the batch is complete.
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1"]),
                tool("c1"),
                tool("c1")
            ])),
            "messages[4] is an orphan tool record: no pending assistant tool call with id \"c1\""
        );
        // A call from an earlier, closed batch.
        assert_eq!(
            err(json!([
                user("a"),
                calls_record(&["c1"]),
                tool("c1"),
                calls_record(&["c2"]),
                tool("c1"),
            ])),
            "messages[5] is an orphan tool record: no pending assistant tool call with id \"c1\""
        );
        // After an assistant record with an empty tool_calls table.
        assert_eq!(
            err(json!([
                user("a"),
                { "role": "assistant", "content": "", "tool_calls": {} },
                tool("c1"),
            ])),
            "messages[3] is an orphan tool record: no pending assistant tool call with id \"c1\""
        );
    }

    #[test]
    fn loop_shaped_lists_pass() {
        let mut list = vec![user("Will it rain in Paris tomorrow?")];
        for round in 1..=4 {
            let id = format!("call_{round}");
            list.push(calls_record(&[id.as_str()]));
            list.push(tool(&id));
        }
        list.push(json!({ "role": "assistant", "content": "Yes." }));
        assert_eq!(ok(Value::Array(list)).len(), 10);
    }

    // ----- composing -----

    fn records(list: Value) -> Vec<Message> {
        check_list(&list).unwrap()
    }

    #[test]
    fn spec_example_merges_system_and_user_runs() {
        let list = records(json!([
            { "role": "system", "content": "You are terse." },
            { "role": "system", "content": "Answer in French." },
            user("Hello."),
            user("What time is it?"),
        ]));
        assert_eq!(
            compose(&list),
            vec![
                Message::system("You are terse.\n\nAnswer in French."),
                Message::user("Hello.\n\nWhat time is it?"),
            ]
        );
        assert_eq!(list.len(), 4);
    }

    #[test]
    fn well_formed_list_reaches_the_model_as_written() {
        let list = vec![
            Message::system("s"),
            Message::user("a"),
            Message::assistant("b"),
            Message::user("c"),
        ];
        assert_eq!(compose(&list), list);
    }

    #[test]
    fn compose_never_mutates_its_input() {
        let list = vec![Message::user("a"), Message::user("b")];
        let copy = list.clone();
        let composed = compose(&list);
        assert_eq!(list, copy);
        assert_eq!(composed, vec![Message::user("a\n\nb")]);
    }

    #[test]
    fn empty_plain_text_adds_nothing() {
        assert_eq!(
            compose(&[Message::user(""), Message::user("x")]),
            vec![Message::user("x")]
        );
        assert_eq!(
            compose(&[Message::user("x"), Message::user(""), Message::user("y")]),
            vec![Message::user("x\n\ny")]
        );
        assert_eq!(
            compose(&[Message::user(""), Message::user("")]),
            vec![Message::user("")]
        );
        assert_eq!(
            compose(&[
                Message::system(""),
                Message::system("b"),
                Message::user("u")
            ]),
            vec![Message::system("b"), Message::user("u")]
        );
    }

    #[test]
    fn three_user_records_merge_into_one() {
        assert_eq!(
            compose(&[Message::user("a"), Message::user("b"), Message::user("c")]),
            vec![Message::user("a\n\nb\n\nc")]
        );
    }

    #[test]
    fn text_only_assistant_records_join_directly() {
        assert_eq!(
            compose(&[
                Message::user("u"),
                Message::assistant("Hel"),
                Message::assistant("lo"),
                Message::assistant("!"),
            ]),
            vec![Message::user("u"), Message::assistant("Hello!")]
        );
    }

    #[test]
    fn assistant_text_merges_into_the_following_tool_call_record() {
        let list = vec![
            Message::user("u"),
            Message::assistant("Let me check."),
            Message::assistant_tool_calls("", vec![call("c1"), call("c2")]),
            tool_record("r1", "c1"),
            tool_record("r2", "c2"),
        ];
        assert_eq!(
            compose(&list),
            vec![
                Message::user("u"),
                Message::assistant_tool_calls("Let me check.", vec![call("c1"), call("c2")]),
                tool_record("r1", "c1"),
                tool_record("r2", "c2"),
            ]
        );
    }

    #[test]
    fn tool_call_record_does_not_absorb_a_later_assistant_record() {
        let list = vec![
            Message::assistant_tool_calls("a", vec![call("c1")]),
            Message::assistant("b"),
        ];
        assert_eq!(compose(&list), list);
    }

    #[test]
    fn tool_records_never_merge() {
        let list = vec![
            Message::user("u"),
            Message::assistant_tool_calls("", vec![call("c1"), call("c2")]),
            tool_record("same", "c1"),
            tool_record("same", "c2"),
            Message::assistant("done"),
        ];
        assert_eq!(compose(&list), list);
    }

    #[test]
    fn system_records_outside_the_leading_block_do_not_merge() {
        let list = vec![
            Message::user("u"),
            Message::system("a"),
            Message::system("b"),
        ];
        assert_eq!(compose(&list), list);
    }

    #[test]
    fn lone_leading_system_record_keeps_its_parts() {
        let system = Message::System {
            content: Content::Parts(vec![text_part("s")]),
        };
        let list = vec![system, Message::user("u")];
        assert_eq!(compose(&list), list);
    }

    fn image() -> ContentPart {
        ContentPart::ImageUrl {
            image_url: ImageUrl {
                url: "data:image/png;base64,AA".to_owned(),
            },
        }
    }

    fn parts_user(parts: Vec<ContentPart>) -> Message {
        Message::User {
            content: Content::Parts(parts),
        }
    }

    #[test]
    fn parts_merge_with_the_separator_as_its_own_part() {
        let merged = compose(&[Message::user("a"), parts_user(vec![image()])]);
        assert_eq!(
            merged,
            vec![parts_user(
                vec![text_part("a"), text_part("\n\n"), image(),]
            )]
        );
        let merged = compose(&[parts_user(vec![image()]), Message::user("b")]);
        assert_eq!(
            merged,
            vec![parts_user(
                vec![image(), text_part("\n\n"), text_part("b"),]
            )]
        );
    }

    #[test]
    fn separator_part_is_inserted_even_beside_empty_text() {
        assert_eq!(
            compose(&[Message::user(""), parts_user(vec![image()])]),
            vec![parts_user(vec![text_part("\n\n"), image()])]
        );
        assert_eq!(
            compose(&[parts_user(vec![image()]), Message::user("")]),
            vec![parts_user(vec![image(), text_part("\n\n")])]
        );
    }

    #[test]
    fn parts_runs_keep_arrival_order() {
        let merged = compose(&[
            Message::user("a"),
            parts_user(vec![text_part("t"), image()]),
            Message::user("c"),
        ]);
        assert_eq!(
            merged,
            vec![parts_user(vec![
                text_part("a"),
                text_part("\n\n"),
                text_part("t"),
                image(),
                text_part("\n\n"),
                text_part("c"),
            ])]
        );
    }

    #[test]
    fn assistant_parts_merge_without_a_separator_part() {
        let parts_assistant = Message::Assistant {
            content: Content::Parts(vec![text_part("b")]),
            tool_calls: Vec::new(),
            reasoning: Vec::new(),
        };
        let merged = compose(&[Message::assistant("a"), parts_assistant]);
        assert_eq!(
            merged,
            vec![Message::Assistant {
                content: Content::Parts(vec![text_part("a"), text_part("b")]),
                tool_calls: Vec::new(),
                reasoning: Vec::new(),
            }]
        );
    }

    // ----- the estimate and the precheck -----

    #[test]
    fn worked_example_396_characters() {
        let record = Message::user("x".repeat(396));
        assert_eq!(estimate_tokens(std::slice::from_ref(&record)), 103);
        let memory = UsageMemory::new();
        assert!(memory.precheck(std::slice::from_ref(&record), "m", 123, Some(20)));
        assert!(!memory.precheck(&[record], "m", 122, Some(20)));
    }

    #[test]
    fn division_runs_once_over_the_whole_conversation() {
        // 3 + 3 bytes: once over the whole is 6 / 4 = 1, per record would be 0.
        let list = [Message::user("abc"), Message::assistant("def")];
        assert_eq!(estimate_tokens(&list), 1 + 8);
        assert_eq!(estimate_tokens::<Message>(&[]), 0);
    }

    #[test]
    fn merged_records_pay_the_overhead_once() {
        let list = [Message::user("abcd"), Message::user("efgh")];
        let composed = compose(&list);
        // "abcd\n\nefgh" is 10 bytes: 2 tokens plus 4 for one record.
        assert_eq!(estimate_tokens(&composed), 6);
    }

    #[test]
    fn non_ascii_text_counts_bytes() {
        assert_eq!(estimate_tokens(&[Message::user("éé")]), 1 + 4);
        assert_eq!(estimate_bytes(&Message::user("日本")), 6);
    }

    #[test]
    fn images_count_nothing_and_text_parts_count() {
        let record = parts_user(vec![text_part("abcdefgh"), image()]);
        assert_eq!(estimate_bytes(&record), 8);
        assert_eq!(estimate_tokens(&[record]), 2 + 4);
    }

    #[test]
    fn tool_calls_count_their_whole_serialized_form() {
        let mut arguments = Map::new();
        arguments.insert("city".to_owned(), json!("Paris"));
        let weather = ToolCall {
            id: "call_1".to_owned(),
            name: "weather".to_owned(),
            arguments: Value::Object(arguments),
        };
        let text = r#"{"id":"call_1","name":"weather","arguments":{"city":"Paris"}}"#;
        assert_eq!(tool_call_bytes(&weather), len_u64(text.len()));
        let record = Message::assistant_tool_calls("ok", vec![weather, call("c")]);
        let empty = r#"{"id":"c","name":"weather","arguments":{}}"#;
        assert_eq!(
            estimate_bytes(&record),
            2 + len_u64(text.len()) + len_u64(empty.len())
        );
        // tool_call_id and role count nothing.
        assert_eq!(estimate_bytes(&tool_record("abcd", "a-long-call-id")), 4);
    }

    #[test]
    fn reply_room_rules() {
        assert_eq!(reply_room(123, Some(20)), 20);
        assert_eq!(reply_room(128_000, None), 8192);
        assert_eq!(reply_room(65_536, None), 8192);
        assert_eq!(reply_room(8192, None), 1024);
        assert_eq!(reply_room(100, None), 12);
        // Never more than half the window.
        assert_eq!(reply_room(100, Some(1000)), 50);
        assert_eq!(reply_room(100, Some(51)), 50);
        assert_eq!(reply_room(100, Some(50)), 50);
        assert_eq!(reply_room(1, None), 0);
        assert_eq!(reply_room(0, Some(5)), 0);
    }

    #[test]
    fn max_tokens_at_the_window_cannot_refuse_an_empty_request() {
        let memory = UsageMemory::new();
        assert!(memory.precheck(&[Message::user("")], "m", 100, Some(100)));
        assert!(memory.precheck(&[Message::user("")], "m", 100, Some(u64::from(u32::MAX))));
    }

    #[test]
    fn total_equal_to_the_window_passes() {
        // Room on a 100-token window without max_tokens is 12.
        assert!(fits(88, 100, None));
        assert!(!fits(89, 100, None));
        assert!(fits(u64::MAX, u64::MAX, Some(0)));
        assert!(!fits(u64::MAX, 10, None));
    }

    #[test]
    fn raw_model_window_and_long_prose() {
        let prose = "Explain what a compiler does in two short paragraphs, covering parsing, \
                     checking, and code generation. "
            .repeat(40);
        let request = compose(&[Message::user(prose)]);
        let memory = UsageMemory::new();
        assert!(!memory.precheck(&request, "scripted-small", 100, None));
        assert!(memory.precheck(&request, "scripted", 128_000, None));
        assert!(memory.precheck(&request, "raw", RAW_MODEL_CONTEXT, None));
    }

    // ----- the usage memory -----

    fn usage(prompt: u64, completion: u64, reasoning: Option<u64>) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            reasoning_tokens: reasoning,
        })
    }

    #[test]
    fn usage_total_drops_reasoning() {
        assert_eq!(usage(100, 50, Some(30)).unwrap().conversation_tokens(), 120);
        assert_eq!(usage(100, 50, None).unwrap().conversation_tokens(), 150);
        assert_eq!(usage(1, 1, Some(10)).unwrap().conversation_tokens(), 0);
    }

    #[test]
    fn estimate_alone_before_any_usage() {
        let memory = UsageMemory::new();
        let list = [Message::user("abcdefgh"), Message::assistant("ab")];
        assert_eq!(memory.request_tokens(&list, "m"), estimate_tokens(&list));
        assert!(memory.is_empty());
    }

    #[test]
    fn usage_counts_from_the_provider_total_after_the_reply() {
        let sent = vec![Message::system("s"), Message::user("question")];
        let mut memory = UsageMemory::new();
        memory.record_round(&sent, "m", usage(1000, 200, Some(50)));
        let rest = vec![tool_record("abcdefgh", "c1")];
        let mut next = sent.clone();
        next.push(Message::assistant_tool_calls("", vec![call("c1")]));
        next.extend(rest.clone());
        assert_eq!(
            memory.request_tokens(&next, "m"),
            1150 + estimate_tokens(&rest)
        );
        assert_eq!(memory.request_tokens(&next, "m"), 1150 + 2 + 4);
        // Nothing after the reply: the total alone.
        assert_eq!(memory.request_tokens(&next[..3], "m"), 1150);
    }

    #[test]
    fn usage_needs_more_records_than_were_sent() {
        let sent = vec![Message::user("question")];
        let mut memory = UsageMemory::new();
        memory.record_round(&sent, "m", usage(1000, 200, None));
        assert_eq!(memory.request_tokens(&sent, "m"), estimate_tokens(&sent));
        assert_eq!(memory.request_tokens(&[], "m"), 0);
    }

    #[test]
    fn usage_needs_the_sent_records_as_prefix() {
        let sent = vec![Message::user("question")];
        let mut memory = UsageMemory::new();
        memory.record_round(&sent, "m", usage(1000, 200, None));
        let rewritten = vec![Message::user("question, edited"), Message::assistant("a")];
        assert_eq!(
            memory.request_tokens(&rewritten, "m"),
            estimate_tokens(&rewritten)
        );
        let shortened = vec![Message::assistant("a"), Message::user("b")];
        assert_eq!(
            memory.request_tokens(&shortened, "m"),
            estimate_tokens(&shortened)
        );
    }

    #[test]
    fn usage_needs_an_assistant_record_right_after() {
        let sent = vec![Message::user("question")];
        let mut memory = UsageMemory::new();
        memory.record_round(&sent, "m", usage(1000, 200, None));
        let next = vec![
            Message::user("question"),
            Message::system("s"),
            Message::assistant("a"),
        ];
        assert_eq!(memory.request_tokens(&next, "m"), estimate_tokens(&next));
    }

    #[test]
    fn merged_user_records_change_the_prefix() {
        // The round sent [user a]; appending another user record without a reply composes to
        // [user "a\n\nb"], which no longer starts with the sent records.
        let mut memory = UsageMemory::new();
        let sent = compose(&[Message::user("a")]);
        memory.record_round(&sent, "m", usage(1000, 0, None));
        let next = compose(&[
            Message::user("a"),
            Message::user("b"),
            Message::assistant("x"),
        ]);
        assert_eq!(memory.request_tokens(&next, "m"), estimate_tokens(&next));
    }

    #[test]
    fn round_without_usage_keeps_the_memory() {
        let mut memory = UsageMemory::new();
        let first = vec![Message::user("question")];
        memory.record_round(&first, "m", usage(500, 100, None));

        let mut second = first.clone();
        second.push(Message::assistant_tool_calls("", vec![call("c1")]));
        second.push(tool_record("r1", "c1"));
        memory.record_round(&second, "m", None);
        assert!(!memory.is_empty());

        let mut third = second.clone();
        third.push(Message::assistant_tool_calls("", vec![call("c2")]));
        third.push(tool_record("r2", "c2"));
        assert_eq!(
            memory.request_tokens(&third, "m"),
            600 + estimate_tokens(&third[2..])
        );
    }

    #[test]
    fn a_later_usage_round_replaces_the_memory() {
        let mut memory = UsageMemory::new();
        let first = vec![Message::user("q")];
        memory.record_round(&first, "m", usage(500, 100, None));
        let mut second = first.clone();
        second.push(Message::assistant_tool_calls("", vec![call("c1")]));
        second.push(tool_record("r1", "c1"));
        memory.record_round(&second, "m", usage(700, 10, None));
        let mut third = second.clone();
        third.push(Message::assistant("done"));
        assert_eq!(memory.request_tokens(&third, "m"), 710);
    }

    #[test]
    fn model_switch_uses_the_estimate_and_clears() {
        let mut memory = UsageMemory::new();
        let first = vec![Message::user("q")];
        memory.record_round(&first, "writer", usage(5000, 100, None));
        let mut next = first.clone();
        next.push(Message::assistant("a"));
        next.push(Message::user("more"));
        assert_eq!(memory.request_tokens(&next, "writer"), 5100 + 1 + 4);
        assert_eq!(
            memory.request_tokens(&next, "reviewer"),
            estimate_tokens(&next)
        );
        // A round on the other model without usage clears the first model's total.
        memory.record_round(&next, "reviewer", None);
        assert!(memory.is_empty());
        let mut after = next.clone();
        after.push(Message::assistant("b"));
        assert_eq!(
            memory.request_tokens(&after, "writer"),
            estimate_tokens(&after)
        );
    }

    #[test]
    fn round_without_usage_on_the_same_model_keeps_and_clear_forgets() {
        let mut memory = UsageMemory::new();
        memory.record_round(&[Message::user("q")], "m", usage(1, 1, None));
        memory.record_round(&[Message::user("q")], "m", None);
        assert!(!memory.is_empty());
        memory.clear();
        assert!(memory.is_empty());
    }

    #[test]
    fn provider_total_can_refuse_what_the_estimate_admits() {
        let mut memory = UsageMemory::new();
        let first = vec![Message::user("q")];
        let mut next = first.clone();
        next.push(Message::assistant("a"));
        next.push(Message::user("b"));
        assert!(memory.precheck(&next, "m", 1000, Some(10)));
        memory.record_round(&first, "m", usage(980, 10, None));
        // 990 + (1 / 4 + 4) = 994, plus 10 room = 1004 > 1000.
        assert!(!memory.precheck(&next, "m", 1000, Some(10)));
        assert!(memory.precheck(&next, "m", 1004, Some(10)));
        // Another model still uses the estimate.
        assert!(memory.precheck(&next, "other", 1000, Some(10)));
    }

    // ----- accepting a reply -----

    #[test]
    fn well_formed_reply_calls_pass() {
        check_reply_calls(&[]).unwrap();
        check_reply_calls(&[call("a"), call("b")]).unwrap();
    }

    #[test]
    fn reply_calls_need_non_blank_ids_and_names() {
        for id in ["", "  ", "\n\t"] {
            assert_eq!(
                check_reply_calls(&[call("a"), call(id)]).unwrap_err(),
                "malformed model reply: tool_calls[2] has a blank id"
            );
        }
        let nameless = ToolCall {
            name: " ".to_owned(),
            ..call("a")
        };
        assert_eq!(
            check_reply_calls(std::slice::from_ref(&nameless)).unwrap_err(),
            "malformed model reply: tool_calls[1] has a blank name"
        );
        // The first bad call wins, each call checked whole.
        assert_eq!(
            check_reply_calls(&[nameless, call("")]).unwrap_err(),
            "malformed model reply: tool_calls[1] has a blank name"
        );
    }

    #[test]
    fn reply_call_ids_are_unique_within_the_round() {
        assert_eq!(
            check_reply_calls(&[call("a"), call("b"), call("a")]).unwrap_err(),
            "malformed model reply: tool_calls[3] id \"a\" repeats an earlier call in the round"
        );
    }

    #[test]
    fn reply_arguments_must_be_an_object() {
        assert_eq!(reply_arguments(1, &json!({ "a": 1 })).unwrap().len(), 1);
        assert!(reply_arguments(1, &json!({})).unwrap().is_empty());
        for bad in [json!(null), json!("{not json"), json!([1]), json!(3)] {
            assert_eq!(
                reply_arguments(2, &bad).unwrap_err(),
                "malformed model reply: tool_calls[2] arguments must be a JSON object"
            );
        }
    }

    #[test]
    fn blank_text() {
        assert!(is_blank(""));
        assert!(is_blank(" \n\t "));
        assert!(!is_blank(" x "));
    }

    // ----- serialization -----

    #[test]
    fn records_serialize_in_the_chapter_shape_and_round_trip() {
        let list = vec![
            Message::system("s"),
            parts_user(vec![text_part("t"), image()]),
            Message::assistant_tool_calls("", vec![call("c1")]),
            tool_record("r", "c1"),
        ];
        let value = serde_json::to_value(&list).unwrap();
        assert_eq!(
            value,
            json!([
                { "role": "system", "content": "s" },
                { "role": "user", "content": [
                    { "type": "text", "text": "t" },
                    { "type": "image_url", "image_url": { "url": "data:image/png;base64,AA" } },
                ] },
                { "role": "assistant", "content": "", "tool_calls": [
                    { "id": "c1", "name": "weather", "arguments": {} },
                ] },
                { "role": "tool", "content": "r", "tool_call_id": "c1" },
            ])
        );
        let back: Vec<Message> = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(back, list);
        // The serialized form passes the check unchanged.
        assert_eq!(check_list(&value).unwrap(), list);
    }

    #[test]
    fn role_strings() {
        for role in [Role::System, Role::User, Role::Assistant, Role::Tool] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("System"), None);
    }
}
