#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Input and output files, real files behind a directory store, and atomic writes.

use std::path::Path;

use promptforge_harness::store::{
    DirBackend, Store, StoreAnswer, StoreOp, StoreReason, TransferError, collect_output_file,
    place_input_file,
};

fn names(dir: &Path) -> Vec<String> {
    let mut all = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let entry = entry.unwrap();
            let rel = entry
                .path()
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if entry.file_type().unwrap().is_dir() {
                pending.push(entry.path());
            }
            all.push(rel);
        }
    }
    all.sort();
    all
}

fn perform(store: &mut Store, op: StoreOp) -> StoreAnswer {
    store.perform(&op).unwrap()
}

#[test]
fn input_and_output_files_round_trip() {
    for on_disk in [false, true] {
        let host = tempfile::tempdir().unwrap();
        let store_dir = tempfile::tempdir().unwrap();
        let mut store = if on_disk {
            Store::new(Box::new(DirBackend::open(store_dir.path()).unwrap()))
        } else {
            Store::memory()
        };
        let paper = host.path().join("paper-on-host.md");
        std::fs::write(&paper, "the paper body").unwrap();
        place_input_file(&mut store, "paper.md", &paper).unwrap();
        // The prompt: store.write('report.md', 'report on: ' .. store.read('paper.md')).
        let StoreAnswer::Text(body) = perform(
            &mut store,
            StoreOp::Read {
                path: "paper.md".into(),
                range: None,
            },
        ) else {
            panic!()
        };
        perform(
            &mut store,
            StoreOp::Write {
                path: "report.md".into(),
                contents: format!("report on: {body}"),
            },
        );
        let out = host.path().join("out/report.txt");
        std::fs::create_dir(host.path().join("out")).unwrap();
        collect_output_file(&store, "report.md", &out).unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "report on: the paper body"
        );
        // Collecting again replaces the file; no temporary files are left behind.
        collect_output_file(&store, "report.md", &out).unwrap();
        assert_eq!(names(&host.path().join("out")), ["report.txt"]);
    }
}

#[test]
fn transfer_failures() {
    let host = tempfile::tempdir().unwrap();
    let mut store = Store::memory();
    let err = place_input_file(&mut store, "paper.md", &host.path().join("absent.md")).unwrap_err();
    assert!(matches!(err, TransferError::ReadHost { .. }));
    assert!(err.to_string().starts_with("cannot read input file "));
    std::fs::write(host.path().join("p.md"), "x").unwrap();
    let err = place_input_file(&mut store, "../paper.md", &host.path().join("p.md")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid path \"../paper.md\": path contains a traversal segment"
    );
    let err = collect_output_file(&store, "report.md", &host.path().join("r.md")).unwrap_err();
    let TransferError::Store(store_err) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(store_err.reason, StoreReason::NotFound);
    assert_eq!(err.to_string(), "file not found in store: report.md");
    assert!(!host.path().join("r.md").exists());
    store.seed("r.md", b"x").unwrap();
    let err =
        collect_output_file(&store, "r.md", &host.path().join("no/such/dir/r.md")).unwrap_err();
    assert!(matches!(err, TransferError::WriteHost { .. }));
    // Input files may be binary; they are placed as they are.
    std::fs::write(host.path().join("bin"), b"\xff").unwrap();
    place_input_file(&mut store, "bin", &host.path().join("bin")).unwrap();
    assert_eq!(store.read_bytes("bin").unwrap(), b"\xff");
    // A read-only store still takes the Host's input.
    store.set_read_only(true);
    place_input_file(&mut store, "again.md", &host.path().join("p.md")).unwrap();
}

#[test]
fn directory_store_writes_real_files_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::new(Box::new(DirBackend::open(dir.path()).unwrap()));
    for i in 0..200 {
        perform(
            &mut store,
            StoreOp::Write {
                path: format!("notes/n{}.md", i % 7),
                contents: format!("version {i}"),
            },
        );
        perform(
            &mut store,
            StoreOp::Append {
                path: "log.txt".into(),
                contents: format!("{i};"),
            },
        );
    }
    perform(
        &mut store,
        StoreOp::StrReplace {
            path: "notes/n0.md".into(),
            old: "version".into(),
            new: "v".into(),
        },
    );
    let mut expected: Vec<String> = (0..7).map(|i| format!("notes/n{i}.md")).collect();
    expected.push("log.txt".into());
    expected.push("notes".into());
    expected.sort();
    assert_eq!(names(dir.path()), expected);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/n6.md")).unwrap(),
        "version 195"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/n0.md")).unwrap(),
        "v 196"
    );
    let log = std::fs::read_to_string(dir.path().join("log.txt")).unwrap();
    assert!(log.starts_with("0;1;2;") && log.ends_with("199;"));
    // Files put there by hand are seen by the store.
    std::fs::write(dir.path().join("seeded.txt"), "by hand").unwrap();
    assert_eq!(
        perform(
            &mut store,
            StoreOp::Read {
                path: "seeded.txt".into(),
                range: None
            }
        ),
        StoreAnswer::Text("by hand".into())
    );
}

#[test]
fn names_no_store_path_can_spell_are_not_listed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.txt"), "x").unwrap();
    std::fs::write(dir.path().join("trailing."), "x").unwrap();
    std::fs::write(dir.path().join("back\\slash"), "x").unwrap();
    std::fs::write(dir.path().join("CON"), "x").unwrap();
    std::fs::write(dir.path().join("tab\there"), "x").unwrap();
    // What a crash in the middle of a write could leave behind.
    std::fs::write(dir.path().join(".promptforge-1-2-0.tmp."), "x").unwrap();
    let mut store = Store::new(Box::new(DirBackend::open(dir.path()).unwrap()));
    assert_eq!(
        perform(
            &mut store,
            StoreOp::Glob {
                pattern: "**".into()
            }
        ),
        StoreAnswer::List(vec!["ok.txt".into()])
    );
}

#[cfg(unix)]
#[test]
fn special_files_are_unsupported() {
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().unwrap();
    let _listener = UnixListener::bind(dir.path().join("sock")).unwrap();
    let mut store = Store::new(Box::new(DirBackend::open(dir.path()).unwrap()));
    let err = store
        .perform(&StoreOp::Read {
            path: "sock".into(),
            range: None,
        })
        .unwrap_err();
    assert_eq!(err.reason, StoreReason::Unsupported);
    assert_eq!(
        err.message,
        "unsupported store operation on sock: not a regular file or directory"
    );
    assert_eq!(
        store.perform(&StoreOp::Glob {
            pattern: "*".into()
        }),
        Ok(StoreAnswer::List(Vec::new()))
    );
}

#[test]
fn disk_failures_are_backend_failures() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::new(Box::new(DirBackend::open(dir.path()).unwrap()));
    // A segment longer than the disk's name limit cannot be written, and reads as absent.
    let long = "n".repeat(300);
    let err = store
        .perform(&StoreOp::Write {
            path: long.clone(),
            contents: "x".into(),
        })
        .unwrap_err();
    assert_eq!(err.reason, StoreReason::Unsupported);
    assert_eq!(
        store.perform(&StoreOp::Exists { path: long.clone() }),
        Ok(StoreAnswer::Bool(false))
    );
    // The storage going away underneath is a backend failure naming no path.
    let backend = DirBackend::open(dir.path()).unwrap();
    assert_eq!(backend.location(), dir.path());
    drop(store);
    let path = dir.path().to_path_buf();
    dir.close().unwrap();
    let mut store = Store::new(Box::new(backend));
    let err = store
        .perform(&StoreOp::Write {
            path: "a.txt".into(),
            contents: "x".into(),
        })
        .unwrap_err();
    assert_eq!(err.reason, StoreReason::Backend);
    assert!(
        err.message.starts_with("store backend failure: "),
        "{err:?}"
    );
    assert_eq!(err.path, None);
    assert!(!path.exists());
}
