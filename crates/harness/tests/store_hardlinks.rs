#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A directory store never reads or extends a file that has other hard links, which may lie
//! outside the store; replacing or removing the store's own name leaves the other link alone.
//! Opening a store sweeps away the temporary files of writes a crash interrupted.
#![cfg(unix)]

use promptforge_harness::store::{DirBackend, LineRange, Store, StoreAnswer, StoreOp, StoreReason};

const REFUSAL: &str = "the file has other hard links, which may be outside the store";

#[test]
fn a_hard_link_to_an_outside_file_is_neither_read_nor_extended() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("outside.txt");
    std::fs::write(&outside, "outside secret\n").unwrap();
    let store_dir = root.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    std::fs::hard_link(&outside, store_dir.join("linked.txt")).unwrap();
    let mut store = Store::new(Box::new(DirBackend::open(&store_dir).unwrap()));

    let in_place = [
        StoreOp::Read {
            path: "linked.txt".into(),
            range: None,
        },
        StoreOp::Read {
            path: "linked.txt".into(),
            range: Some(LineRange {
                start: Some(1),
                end: Some(1),
            }),
        },
        StoreOp::ReadNumbered {
            path: "linked.txt".into(),
            range: None,
        },
        StoreOp::Append {
            path: "linked.txt".into(),
            contents: "pwned\n".into(),
        },
        StoreOp::StrReplace {
            path: "linked.txt".into(),
            old: "secret".into(),
            new: "pwned".into(),
        },
    ];
    for op in in_place {
        let err = store.perform(&op).unwrap_err();
        assert_eq!(err.reason, StoreReason::PermissionDenied, "{op:?}: {err:?}");
        assert_eq!(
            err.message,
            format!("permission denied for store path linked.txt: {REFUSAL}")
        );
    }
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "outside secret\n"
    );

    // Replacing the store's name writes a new file; the outside one keeps its bytes.
    store
        .perform(&StoreOp::Write {
            path: "linked.txt".into(),
            contents: "fresh".into(),
        })
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "outside secret\n"
    );
    assert_eq!(
        store
            .perform(&StoreOp::Read {
                path: "linked.txt".into(),
                range: None
            })
            .unwrap(),
        StoreAnswer::Text("fresh".into())
    );
    // Removing drops only the store's name.
    std::fs::hard_link(&outside, store_dir.join("again.txt")).unwrap();
    store
        .perform(&StoreOp::Delete {
            path: "again.txt".into(),
        })
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "outside secret\n"
    );
}

#[test]
fn opening_a_store_sweeps_temporary_files_of_dead_writers_only() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sub")).unwrap();
    // A pid far above any real one: its writer is gone.
    let dead = root.path().join("sub/.promptforge-4000000000-7-0.tmp.");
    std::fs::write(&dead, "half a write").unwrap();
    let live = root
        .path()
        .join(format!(".promptforge-{}-9-0.tmp.", std::process::id()));
    std::fs::write(&live, "in flight").unwrap();
    let other = root.path().join(".promptforge-notes.txt");
    std::fs::write(&other, "not ours").unwrap();
    let _store = DirBackend::open(root.path()).unwrap();
    assert!(!dead.exists(), "a dead writer's temporary file was kept");
    assert!(live.exists(), "a live writer's temporary file was removed");
    assert!(other.exists());
}
