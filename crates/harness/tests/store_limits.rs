#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The longest store path (1,024 bytes) works in the memory store; a directory store whose
//! file system cannot hold one of its names refuses it with the store's own `unsupported`
//! error, never an OS error.

use promptforge_harness::store::{DirBackend, Store, StoreAnswer, StoreOp, StoreReason};

fn longest_paths() -> Vec<String> {
    let mut nested = format!(
        "{}/{}/{}/",
        "a".repeat(300),
        "b".repeat(300),
        "c".repeat(300)
    );
    nested.push_str(&"d".repeat(1024 - nested.len()));
    let short_segments = format!("{}xxxxxxxx", "abcdefg/".repeat(127));
    vec![nested, "x".repeat(1024), short_segments]
}

#[test]
fn a_1024_byte_path_works_or_is_refused_as_unsupported() {
    for path in longest_paths() {
        assert_eq!(path.len(), 1024);
        let mut memory = Store::default();
        memory
            .perform(&StoreOp::Write {
                path: path.clone(),
                contents: "deep".into(),
            })
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut disk = Store::new(Box::new(DirBackend::open(dir.path()).unwrap()));
        match disk.perform(&StoreOp::Write {
            path: path.clone(),
            contents: "deep".into(),
        }) {
            Ok(_) => assert_eq!(
                disk.perform(&StoreOp::Read {
                    path: path.clone(),
                    range: None
                })
                .unwrap(),
                StoreAnswer::Text("deep".into())
            ),
            Err(err) => {
                assert_eq!(err.reason, StoreReason::Unsupported, "{err:?}");
                assert_eq!(
                    err.message,
                    format!(
                        "unsupported store operation on {path}: the directory on disk cannot hold a name this long"
                    )
                );
            }
        }
    }
}
