//! Task and chain ids (chapter 15, "Task handles and ids"): dot-separated paths of decimal
//! components, `0` for the main walk, each child extending its parent's id by the parent's next
//! child index.
//!
//! Ids order component by component (`0.9` before `0.10`), which is spawn order among the
//! children of one chain; every list of ids the Engine hands out is sorted this way.

use std::fmt;

use promptforge_lua::task_id::parse_task_id;

/// A strand's id: its position in creation order (never reused within a run).
pub(crate) type StrandId = u64;

/// A task id, which is also the id of the chain that runs the task (a called chain's id has
/// the same shape).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TaskId(Vec<u32>);

impl TaskId {
    /// The main walk: task `0`.
    pub(crate) fn root() -> TaskId {
        TaskId(vec![0])
    }

    /// The id of this chain's child number `index`.
    pub(crate) fn child(&self, index: u32) -> TaskId {
        let mut parts = Vec::with_capacity(self.0.len() + 1);
        parts.extend_from_slice(&self.0);
        parts.push(index);
        TaskId(parts)
    }

    /// Parse an id as a prompt writes it (see [`parse_task_id`]).
    pub(crate) fn parse(text: &str) -> Option<TaskId> {
        parse_task_id(text).map(TaskId)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{part}")?;
        }
        Ok(())
    }
}

/// Ids joined with `, ` (the `tasks` field of `tasks_live`, status lines, timed-out waits).
pub(crate) fn join_ids<'a>(ids: impl IntoIterator<Item = &'a TaskId>) -> String {
    ids.into_iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[test]
    fn ids_render_and_parse() {
        let root = TaskId::root();
        assert_eq!(root.to_string(), "0");
        let id = root.child(2).child(10);
        assert_eq!(id.to_string(), "0.2.10");
        assert_eq!(TaskId::parse("0.2.10"), Some(id));
        assert_eq!(
            TaskId::parse("4294967295").unwrap().to_string(),
            "4294967295"
        );
    }

    #[test]
    fn ids_order_number_by_number() {
        let nine = TaskId::parse("0.9").unwrap();
        let ten = TaskId::parse("0.10").unwrap();
        let nested = TaskId::parse("0.0.0").unwrap();
        let one = TaskId::parse("0.1").unwrap();
        assert!(nine < ten);
        assert!(nested < one);
        assert_eq!(join_ids([&nine, &ten]), "0.9, 0.10");
    }
}
