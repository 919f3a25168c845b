#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The memory and directory backends agree on every operation: random sequences of store
//! calls run against both, every answer and error compared, then the whole store compared.

use promptforge_harness::store::{
    Backend, DirBackend, Durability, EntryKind, LineRange, MemoryBackend, Store, StoreOp,
};
use proptest::prelude::*;

const PATHS: [&str; 11] = [
    "a", "b", "a/x", "a/y", "a/x/z", "b/x", "c.txt", "a/c.txt", "/a", "a//b", "a/./b",
];
const PATTERNS: [&str; 12] = [
    "*", "**", "*/", "**/", "a/*", "a/**", "a/*/", "**/x", "*.txt", "**/*.txt", "a/**.txt", "",
];
const TEXTS: [&str; 7] = [
    "",
    "x",
    "one\ntwo\nthree\n",
    "na na na",
    "a\r\nb",
    "na",
    "é\n",
];

#[derive(Debug, Clone)]
enum Action {
    Op(StoreOp),
    SeedBinary(&'static str),
}

fn bound() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![Just(None), (-1i64..6).prop_map(Some)]
}

fn range() -> impl Strategy<Value = Option<LineRange>> {
    prop_oneof![
        Just(None),
        (bound(), bound()).prop_map(|(start, end)| Some(LineRange { start, end })),
    ]
}

fn path() -> impl Strategy<Value = String> {
    (0..PATHS.len()).prop_map(|i| PATHS[i].to_owned())
}

fn text() -> impl Strategy<Value = String> {
    (0..TEXTS.len()).prop_map(|i| TEXTS[i].to_owned())
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        1 => (path(), range()).prop_map(|(path, range)| Action::Op(StoreOp::Read { path, range })),
        1 => (path(), range())
            .prop_map(|(path, range)| Action::Op(StoreOp::ReadNumbered { path, range })),
        3 => (path(), text())
            .prop_map(|(path, contents)| Action::Op(StoreOp::Write { path, contents })),
        2 => (path(), text())
            .prop_map(|(path, contents)| Action::Op(StoreOp::Append { path, contents })),
        1 => (path(), text(), text())
            .prop_map(|(path, old, new)| Action::Op(StoreOp::StrReplace { path, old, new })),
        2 => path().prop_map(|path| Action::Op(StoreOp::Delete { path })),
        1 => path().prop_map(|path| Action::Op(StoreOp::Exists { path })),
        1 => (0..PATTERNS.len())
            .prop_map(|i| Action::Op(StoreOp::Glob { pattern: PATTERNS[i].to_owned() })),
        1 => (0..8usize).prop_map(|i| Action::SeedBinary(PATHS[i])),
    ]
}

fn snapshot(backend: &dyn Backend) -> Vec<(String, EntryKind, Option<Vec<u8>>)> {
    let mut entries: Vec<_> = backend
        .list("")
        .unwrap()
        .into_iter()
        .map(|entry| {
            let bytes = (entry.kind == EntryKind::File).then(|| backend.read(&entry.path).unwrap());
            (entry.path, entry.kind, bytes)
        })
        .collect();
    entries.sort();
    entries
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn memory_and_directory_agree(actions in proptest::collection::vec(action(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut memory = Store::new(Box::new(MemoryBackend::new()));
        // Durability changes no answer; buffered keeps the many cases quick.
        let backend = DirBackend::open(dir.path())
            .unwrap()
            .with_durability(Durability::Buffered);
        let mut disk = Store::new(Box::new(backend));
        for action in &actions {
            match action {
                Action::Op(op) => {
                    let a = memory.perform(op);
                    let b = disk.perform(op);
                    prop_assert_eq!(a, b, "{:?}", op);
                }
                Action::SeedBinary(path) => {
                    let a = memory.seed(path, b"\xff\xfe");
                    let b = disk.seed(path, b"\xff\xfe");
                    prop_assert_eq!(a, b, "seed {}", path);
                }
            }
            prop_assert_eq!(snapshot(memory.backend()), snapshot(disk.backend()));
        }
        // Listings beneath every directory agree too.
        for under in ["a", "a/x", "b", "c.txt", "missing"] {
            let mut m = memory.backend().list(under).unwrap();
            let mut d = disk.backend().list(under).unwrap();
            m.sort();
            d.sort();
            prop_assert_eq!(m, d);
        }
    }
}
