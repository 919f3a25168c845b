#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A directory store never follows a symbolic link, out of its root or within it.
#![cfg(unix)]

use std::os::unix::fs::symlink;
use std::path::Path;

use promptforge_harness::store::{
    DirBackend, LineRange, Store, StoreAnswer, StoreError, StoreOp, StoreReason,
};

const REFUSAL: &str = "the path crosses a symbolic link";

struct Setup {
    _root: tempfile::TempDir,
    _outside: tempfile::TempDir,
    store: Store,
    store_dir: std::path::PathBuf,
    outside_dir: std::path::PathBuf,
}

/// A store with `link_dir` -> a directory outside, `link_file` -> a file outside,
/// `inner_link` -> a directory inside, and `real/` holding a real file.
fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside secret").unwrap();
    std::fs::create_dir(outside.path().join("sub")).unwrap();
    std::fs::write(outside.path().join("sub/deep.txt"), "deep secret").unwrap();
    let store_dir = root.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    std::fs::create_dir(store_dir.join("real")).unwrap();
    std::fs::write(store_dir.join("real/file.txt"), "inside").unwrap();
    symlink(outside.path(), store_dir.join("link_dir")).unwrap();
    symlink(
        outside.path().join("secret.txt"),
        store_dir.join("link_file"),
    )
    .unwrap();
    symlink(store_dir.join("real"), store_dir.join("inner_link")).unwrap();
    symlink("../..", store_dir.join("real/up")).unwrap();
    let store = Store::new(Box::new(DirBackend::open(&store_dir).unwrap()));
    Setup {
        outside_dir: outside.path().to_path_buf(),
        _root: root,
        _outside: outside,
        store,
        store_dir,
    }
}

fn refused(result: Result<StoreAnswer, StoreError>, path: &str) {
    let err = result.unwrap_err();
    assert_eq!(err.reason, StoreReason::PermissionDenied, "{path}: {err:?}");
    assert_eq!(
        err.message,
        format!("permission denied for store path {path}: {REFUSAL}")
    );
}

fn outside_untouched(outside: &Path) {
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "outside secret"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("sub/deep.txt")).unwrap(),
        "deep secret"
    );
    let mut names: Vec<_> = std::fs::read_dir(outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["secret.txt", "sub"]);
}

fn every_op(path: &str) -> Vec<StoreOp> {
    vec![
        StoreOp::Read {
            path: path.into(),
            range: None,
        },
        StoreOp::Read {
            path: path.into(),
            range: Some(LineRange {
                start: Some(1),
                end: None,
            }),
        },
        StoreOp::ReadNumbered {
            path: path.into(),
            range: None,
        },
        StoreOp::Write {
            path: path.into(),
            contents: "pwned".into(),
        },
        StoreOp::Append {
            path: path.into(),
            contents: "pwned".into(),
        },
        StoreOp::StrReplace {
            path: path.into(),
            old: "secret".into(),
            new: "pwned".into(),
        },
        StoreOp::Delete { path: path.into() },
        StoreOp::Exists { path: path.into() },
    ]
}

#[test]
fn symlinked_directory_pointing_outside() {
    let mut s = setup();
    for path in [
        "link_dir/secret.txt",
        "link_dir/sub/deep.txt",
        "link_dir/new.txt",
        "link_dir/sub/new/x.txt",
        "link_dir",
        "link_dir/sub",
    ] {
        for op in every_op(path) {
            refused(s.store.perform(&op), path);
        }
    }
    outside_untouched(&s.outside_dir);
}

#[test]
fn symlinked_file_pointing_outside() {
    let mut s = setup();
    for op in every_op("link_file") {
        refused(s.store.perform(&op), "link_file");
    }
    for op in every_op("link_file/x") {
        refused(s.store.perform(&op), "link_file/x");
    }
    outside_untouched(&s.outside_dir);
    // The link itself is still there, untouched.
    assert!(
        std::fs::symlink_metadata(s.store_dir.join("link_file"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn symlinks_inside_the_root_are_refused_too() {
    let mut s = setup();
    for path in ["inner_link/file.txt", "inner_link", "real/up", "real/up/x"] {
        for op in every_op(path) {
            refused(s.store.perform(&op), path);
        }
    }
    assert_eq!(
        std::fs::read_to_string(s.store_dir.join("real/file.txt")).unwrap(),
        "inside"
    );
    // Real paths still work.
    let answer = s
        .store
        .perform(&StoreOp::Read {
            path: "real/file.txt".into(),
            range: None,
        })
        .unwrap();
    assert_eq!(answer, StoreAnswer::Text("inside".into()));
}

#[test]
fn glob_never_lists_through_symlinks() {
    let mut s = setup();
    for pattern in [
        "**",
        "*",
        "**/",
        "*/",
        "link_dir/*",
        "link_dir/**",
        "inner_link/*",
    ] {
        let answer = s
            .store
            .perform(&StoreOp::Glob {
                pattern: pattern.into(),
            })
            .unwrap();
        let StoreAnswer::List(paths) = answer else {
            panic!("{answer:?}")
        };
        for path in &paths {
            assert!(
                !path.starts_with("link_") && !path.starts_with("inner_link") && path != "real/up",
                "{pattern} listed {path}"
            );
        }
        match pattern {
            "**" => assert_eq!(paths, ["real/file.txt"]),
            "**/" | "*/" => assert_eq!(paths, ["real"]),
            _ => assert!(paths.is_empty(), "{pattern}: {paths:?}"),
        }
    }
}

#[test]
fn a_symlinked_root_is_the_hosts_choice() {
    // The Host may hand over a root that is itself a link; paths beneath it still resolve.
    let s = setup();
    let linked_root = s.store_dir.parent().unwrap().join("root_link");
    symlink(&s.store_dir, &linked_root).unwrap();
    let mut store = Store::new(Box::new(DirBackend::open(&linked_root).unwrap()));
    assert_eq!(
        store
            .perform(&StoreOp::Exists {
                path: "real/file.txt".into()
            })
            .unwrap(),
        StoreAnswer::Bool(true)
    );
}
