#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every store call, rule, reason and message of chapter 09, on both backends.

use promptforge_harness::store::{
    DirBackend, LineRange, MemoryBackend, PathRule, Store, StoreAnswer, StoreError, StoreOp,
    StorePolicy, StoreReason,
};

/// Runs `check` against a fresh memory store and a fresh directory store.
fn each_backend(check: impl Fn(&mut Store)) {
    check(&mut Store::memory());
    let dir = tempfile::tempdir().unwrap();
    check(&mut Store::new(Box::new(
        DirBackend::open(dir.path()).unwrap(),
    )));
}

fn write(store: &mut Store, path: &str, contents: &str) {
    let op = StoreOp::Write {
        path: path.into(),
        contents: contents.into(),
    };
    assert_eq!(store.perform(&op), Ok(StoreAnswer::Unit), "write {path}");
}

fn append(store: &mut Store, path: &str, contents: &str) -> Result<StoreAnswer, StoreError> {
    store.perform(&StoreOp::Append {
        path: path.into(),
        contents: contents.into(),
    })
}

fn read(store: &mut Store, path: &str) -> Result<String, StoreError> {
    ranged(store, path, None, None)
}

fn range(start: Option<i64>, end: Option<i64>) -> Option<LineRange> {
    if start.is_none() && end.is_none() {
        None
    } else {
        Some(LineRange { start, end })
    }
}

fn ranged(
    store: &mut Store,
    path: &str,
    start: Option<i64>,
    end: Option<i64>,
) -> Result<String, StoreError> {
    match store.perform(&StoreOp::Read {
        path: path.into(),
        range: range(start, end),
    })? {
        StoreAnswer::Text(text) => Ok(text),
        other => panic!("read answered {other:?}"),
    }
}

fn numbered(
    store: &mut Store,
    path: &str,
    start: Option<i64>,
    end: Option<i64>,
) -> Result<String, StoreError> {
    match store.perform(&StoreOp::ReadNumbered {
        path: path.into(),
        range: range(start, end),
    })? {
        StoreAnswer::Text(text) => Ok(text),
        other => panic!("read_numbered answered {other:?}"),
    }
}

fn exists(store: &mut Store, path: &str) -> Result<bool, StoreError> {
    match store.perform(&StoreOp::Exists { path: path.into() })? {
        StoreAnswer::Bool(b) => Ok(b),
        other => panic!("exists answered {other:?}"),
    }
}

fn delete(store: &mut Store, path: &str) -> Result<StoreAnswer, StoreError> {
    store.perform(&StoreOp::Delete { path: path.into() })
}

fn glob(store: &mut Store, pattern: &str) -> Result<Vec<String>, StoreError> {
    match store.perform(&StoreOp::Glob {
        pattern: pattern.into(),
    })? {
        StoreAnswer::List(list) => Ok(list),
        other => panic!("glob answered {other:?}"),
    }
}

fn str_replace(
    store: &mut Store,
    path: &str,
    old: &str,
    new: &str,
) -> Result<StoreAnswer, StoreError> {
    store.perform(&StoreOp::StrReplace {
        path: path.into(),
        old: old.into(),
        new: new.into(),
    })
}

#[test]
fn write_then_read() {
    each_backend(|s| {
        write(s, "note.txt", "remember this");
        assert_eq!(read(s, "note.txt").unwrap(), "remember this");
        write(s, "note.txt", "old");
        write(s, "note.txt", "new");
        assert_eq!(read(s, "note.txt").unwrap(), "new");
        write(s, "lines.txt", "first\nsecond\n");
        assert_eq!(read(s, "lines.txt").unwrap(), "first\nsecond\n");
        write(s, "empty.txt", "");
        assert_eq!(read(s, "empty.txt").unwrap(), "");
        write(s, "drafts/plan.md", "step one");
        assert_eq!(read(s, "drafts/plan.md").unwrap(), "step one");
        assert!(exists(s, "drafts").unwrap());
        write(s, "café/résumé.md", "ü");
        assert_eq!(read(s, "café/résumé.md").unwrap(), "ü");
        // Case-sensitive paths.
        write(s, "Notes.md", "upper");
        write(s, "notes.md", "lower");
        assert_eq!(read(s, "Notes.md").unwrap(), "upper");
        assert_eq!(read(s, "notes.md").unwrap(), "lower");
        write(s, ".config", "dot");
        assert_eq!(read(s, ".config").unwrap(), "dot");
    });
}

#[test]
fn appends_accumulate() {
    each_backend(|s| {
        append(s, "journal.txt", "started\n").unwrap();
        append(s, "journal.txt", "worked\n").unwrap();
        append(s, "journal.txt", "finished").unwrap();
        assert_eq!(read(s, "journal.txt").unwrap(), "started\nworked\nfinished");
        append(s, "a.txt", "one\n").unwrap();
        append(s, "a.txt", "two").unwrap();
        assert_eq!(read(s, "a.txt").unwrap(), "one\ntwo");
        write(s, "b.txt", "one");
        append(s, "b.txt", "two").unwrap();
        assert_eq!(read(s, "b.txt").unwrap(), "onetwo");
        append(s, "deep/er/c.txt", "x").unwrap();
        assert_eq!(read(s, "deep/er/c.txt").unwrap(), "x");
    });
}

#[test]
fn missing_files() {
    each_backend(|s| {
        let err = read(s, "missing.md").unwrap_err();
        assert_eq!(err.reason, StoreReason::NotFound);
        assert_eq!(err.message, "file not found in store: missing.md");
        assert_eq!(err.path.as_deref(), Some("missing.md"));
        assert_eq!(
            numbered(s, "missing.md", None, None).unwrap_err().message,
            "file not found in store: missing.md"
        );
        // The file is read before the bounds are checked.
        assert_eq!(
            ranged(s, "missing.txt", Some(0), None).unwrap_err().message,
            "file not found in store: missing.txt"
        );
        assert_eq!(
            numbered(s, "missing.txt", Some(5), Some(2))
                .unwrap_err()
                .reason,
            StoreReason::NotFound
        );
        // An end with a nil start is checked before the file is read.
        write(s, "list.txt", "one\ntwo\nthree\n");
        for path in ["missing.txt", "list.txt"] {
            let err = ranged(s, path, None, Some(2)).unwrap_err();
            assert_eq!(err.reason, StoreReason::InvalidRange);
            assert_eq!(
                err.message,
                format!("invalid line range for {path}: start is required when end is given")
            );
        }
    });
}

#[test]
fn line_ranges() {
    each_backend(|s| {
        let p = "list.txt";
        write(s, p, "one\ntwo\nthree\n");
        assert_eq!(read(s, p).unwrap(), "one\ntwo\nthree\n");
        let table: &[(i64, Option<i64>, &str)] = &[
            (2, None, "two\nthree"),
            (2, Some(2), "two"),
            (1, Some(2), "one\ntwo"),
            (2, Some(99), "two\nthree"),
            (3, Some(99), "three"),
            (99, None, ""),
            (5, Some(2), ""),
        ];
        for (start, end, expected) in table {
            assert_eq!(ranged(s, p, Some(*start), *end).unwrap(), *expected);
        }
        let err = ranged(s, p, Some(0), None).unwrap_err();
        assert_eq!(
            err.message,
            "invalid line range for list.txt: start must be at least 1"
        );
        assert_eq!(err.reason, StoreReason::InvalidRange);
        assert_eq!(
            ranged(s, p, Some(-3), None).unwrap_err().message,
            "invalid line range for list.txt: start must be at least 1"
        );
        assert_eq!(
            ranged(s, p, Some(3), Some(2)).unwrap_err().message,
            "invalid line range for list.txt: end must not be before start"
        );
        assert_eq!(
            ranged(s, p, Some(1), Some(0)).unwrap_err().message,
            "invalid line range for list.txt: end must not be before start"
        );
        // Both bounds open reads the whole file.
        let both_nil = s
            .perform(&StoreOp::Read {
                path: p.into(),
                range: Some(LineRange {
                    start: None,
                    end: None,
                }),
            })
            .unwrap();
        assert_eq!(both_nil, StoreAnswer::Text("one\ntwo\nthree\n".into()));
        write(s, "crlf.txt", "a\r\nb\r\n");
        assert_eq!(ranged(s, "crlf.txt", Some(1), None).unwrap(), "a\nb");
        write(s, "empty.txt", "");
        assert_eq!(ranged(s, "empty.txt", Some(1), Some(5)).unwrap(), "");
        assert_eq!(numbered(s, "empty.txt", Some(1), None).unwrap(), "");
        assert_eq!(numbered(s, "empty.txt", None, None).unwrap(), "");
    });
}

#[test]
fn numbered_reads() {
    each_backend(|s| {
        write(s, "list.txt", "one\ntwo\nthree\n");
        assert_eq!(
            numbered(s, "list.txt", Some(2), Some(3)).unwrap(),
            "2| two\n3| three"
        );
        assert_eq!(
            numbered(s, "list.txt", Some(2), Some(99)).unwrap(),
            "2| two\n3| three"
        );
        assert_eq!(numbered(s, "list.txt", Some(99), None).unwrap(), "");
        assert_eq!(
            numbered(s, "list.txt", Some(0), None).unwrap_err().message,
            "invalid line range for list.txt: start must be at least 1"
        );
        write(s, "a", "first\nsecond");
        write(s, "b", "first\nsecond\n");
        assert_eq!(numbered(s, "a", None, None).unwrap(), "1| first\n2| second");
        assert_eq!(numbered(s, "b", None, None).unwrap(), "1| first\n2| second");
        let hundred: String = (1..=100).map(|i| format!("line{i}\n")).collect();
        write(s, "h.txt", &hundred);
        assert_eq!(
            numbered(s, "h.txt", Some(99), Some(100)).unwrap(),
            " 99| line99\n100| line100"
        );
        let eighty_five: String = (1..=85).map(|i| format!("line{i}\n")).collect();
        write(s, "a.txt", &eighty_five);
        assert_eq!(
            numbered(s, "a.txt", Some(84), Some(85)).unwrap(),
            "84| line84\n85| line85"
        );
        let ten: String = (1..=10).map(|i| format!("line{i}\n")).collect();
        write(s, "ten.txt", &ten);
        assert!(
            numbered(s, "ten.txt", None, None)
                .unwrap()
                .starts_with(" 1| line1\n")
        );
    });
}

#[test]
fn str_replace_rules() {
    each_backend(|s| {
        write(s, "fox.txt", "the quick brown fox");
        assert_eq!(
            str_replace(s, "fox.txt", "quick", "slow"),
            Ok(StoreAnswer::Unit)
        );
        assert_eq!(read(s, "fox.txt").unwrap(), "the slow brown fox");
        write(s, "cv.txt", "café résumé café");
        str_replace(s, "cv.txt", "résumé", "CV").unwrap();
        assert_eq!(read(s, "cv.txt").unwrap(), "café CV café");
        str_replace(s, "cv.txt", " CV", "").unwrap();
        assert_eq!(read(s, "cv.txt").unwrap(), "café café");

        // 1: empty anchor, checked before the file.
        let err = str_replace(s, "missing.txt", "", "x").unwrap_err();
        assert_eq!(err.reason, StoreReason::Anchor);
        assert_eq!(
            err.message,
            "str_replace requires a non-empty anchor: missing.txt"
        );
        assert_eq!(err.anchor.as_deref(), Some(""));
        assert_eq!(err.count, Some(0));
        // 2: missing file.
        let err = str_replace(s, "gone.txt", "a", "b").unwrap_err();
        assert_eq!(err.reason, StoreReason::NotFound);
        assert_eq!(err.message, "file not found in store: gone.txt");
        // 3: no match.
        write(s, "f.txt", "alpha beta");
        let err = str_replace(s, "f.txt", "gamma", "x").unwrap_err();
        assert_eq!(
            (
                err.reason,
                err.path.as_deref(),
                err.anchor.as_deref(),
                err.count
            ),
            (StoreReason::Anchor, Some("f.txt"), Some("gamma"), Some(0))
        );
        assert_eq!(
            err.message,
            "anchor \"gamma\" was not found in f.txt, expected exactly one"
        );
        assert_eq!(read(s, "f.txt").unwrap(), "alpha beta");
        write(s, "e.txt", "");
        assert_eq!(
            str_replace(s, "e.txt", "x", "y").unwrap_err().message,
            "anchor \"x\" was not found in e.txt, expected exactly one"
        );
        // 4: several matches, non-overlapping.
        write(s, "f.txt", "na na na");
        let err = str_replace(s, "f.txt", "na", "x").unwrap_err();
        assert_eq!(err.count, Some(3));
        assert_eq!(
            err.message,
            "anchor \"na\" occurs 3 times in f.txt, expected exactly one; include more \
             surrounding text so it matches once"
        );
        assert_eq!(read(s, "f.txt").unwrap(), "na na na");
        write(s, "o.txt", "aaaa");
        assert_eq!(
            str_replace(s, "o.txt", "aa", "b").unwrap_err().count,
            Some(2)
        );
        // A directory is not a file.
        write(s, "notes/a.txt", "x");
        assert_eq!(
            str_replace(s, "notes", "a", "b").unwrap_err().reason,
            StoreReason::IsADirectory
        );
    });
}

#[test]
fn delete_and_exists() {
    each_backend(|s| {
        write(s, "notes/a.txt", "x");
        assert_eq!(delete(s, "notes/a.txt"), Ok(StoreAnswer::Unit));
        assert_eq!(delete(s, "notes/a.txt"), Ok(StoreAnswer::Unit));
        assert!(!exists(s, "notes/a.txt").unwrap());
        assert!(exists(s, "notes").unwrap());
        delete(s, "notes").unwrap();
        assert!(!exists(s, "notes").unwrap());
        assert_eq!(
            read(s, "notes/a.txt").unwrap_err().message,
            "file not found in store: notes/a.txt"
        );
        // Not recursive.
        write(s, "notes/a.txt", "x");
        let err = delete(s, "notes").unwrap_err();
        assert_eq!(err.reason, StoreReason::DirectoryNotEmpty);
        assert_eq!(err.message, "directory not empty in store: notes");
        assert_eq!(err.path.as_deref(), Some("notes"));
        assert_eq!(read(s, "notes/a.txt").unwrap(), "x");
        write(s, "deep/er/x.txt", "x");
        assert_eq!(
            delete(s, "deep").unwrap_err().reason,
            StoreReason::DirectoryNotEmpty
        );
        delete(s, "deep/er/x.txt").unwrap();
        assert_eq!(
            delete(s, "deep").unwrap_err().reason,
            StoreReason::DirectoryNotEmpty
        );
        delete(s, "deep/er").unwrap();
        delete(s, "deep").unwrap();
        // Absent paths, even beneath a file, are fine.
        delete(s, "never").unwrap();
        write(s, "file.txt", "x");
        delete(s, "file.txt/below").unwrap();
        assert!(!exists(s, "file.txt/below").unwrap());
        assert!(exists(s, "file.txt").unwrap());
        let err = exists(s, "/x").unwrap_err();
        assert_eq!(err.message, "invalid path \"/x\": path is absolute");
        assert_eq!(err.rule, Some(PathRule::Absolute));
    });
}

#[test]
fn directories_and_files_collide() {
    each_backend(|s| {
        write(s, "notes/a.txt", "x");
        for op in [
            StoreOp::Read {
                path: "notes".into(),
                range: None,
            },
            StoreOp::ReadNumbered {
                path: "notes".into(),
                range: None,
            },
            StoreOp::Read {
                path: "notes".into(),
                range: Some(LineRange {
                    start: Some(1),
                    end: None,
                }),
            },
            StoreOp::Write {
                path: "notes".into(),
                contents: "y".into(),
            },
            StoreOp::Append {
                path: "notes".into(),
                contents: "y".into(),
            },
            StoreOp::StrReplace {
                path: "notes".into(),
                old: "a".into(),
                new: "b".into(),
            },
        ] {
            let err = s.perform(&op).unwrap_err();
            assert_eq!(err.reason, StoreReason::IsADirectory, "{op:?}");
            assert_eq!(err.message, "is a directory in store: notes");
        }
        write(s, "a.txt", "x");
        for op in [
            StoreOp::Write {
                path: "a.txt/b.txt".into(),
                contents: "y".into(),
            },
            StoreOp::Append {
                path: "a.txt/b.txt".into(),
                contents: "y".into(),
            },
            StoreOp::Write {
                path: "a.txt/deeper/b.txt".into(),
                contents: "y".into(),
            },
            StoreOp::Read {
                path: "a.txt/b.txt".into(),
                range: None,
            },
        ] {
            let err = s.perform(&op).unwrap_err();
            assert_eq!(err.reason, StoreReason::NotADirectory, "{op:?}");
            assert_eq!(
                err.message,
                format!("not a directory in store: {}", op.target())
            );
        }
        assert_eq!(read(s, "a.txt").unwrap(), "x");
        assert_eq!(glob(s, "**").unwrap(), ["a.txt", "notes/a.txt"]);
        assert_eq!(glob(s, "**/").unwrap(), ["notes"]);
    });
}

#[test]
fn invalid_paths_change_nothing() {
    each_backend(|s| {
        let cases: &[(&str, PathRule, &str)] = &[
            ("", PathRule::Empty, r#"invalid path "": path is empty"#),
            (
                "/notes.md",
                PathRule::Absolute,
                r#"invalid path "/notes.md": path is absolute"#,
            ),
            (
                "a\\b.txt",
                PathRule::Backslash,
                r#"invalid path "a\\b.txt": path contains a backslash"#,
            ),
            (
                "a\tb.txt",
                PathRule::Control,
                r#"invalid path "a\tb.txt": path contains a control character"#,
            ),
            (
                "a//b.txt",
                PathRule::EmptySegment,
                r#"invalid path "a//b.txt": path contains an empty segment"#,
            ),
            (
                "e.txt/",
                PathRule::EmptySegment,
                r#"invalid path "e.txt/": path contains an empty segment"#,
            ),
            (
                "c/./d.txt",
                PathRule::Traversal,
                r#"invalid path "c/./d.txt": path contains a traversal segment"#,
            ),
            (
                "../x",
                PathRule::Traversal,
                r#"invalid path "../x": path contains a traversal segment"#,
            ),
            (
                "notes./a.txt",
                PathRule::UnsafeSuffix,
                r#"invalid path "notes./a.txt": path segment ends in an unsafe character"#,
            ),
            (
                "CON.txt",
                PathRule::ReservedName,
                r#"invalid path "CON.txt": path contains a reserved device name"#,
            ),
            (
                "nul/../x",
                PathRule::ReservedName,
                r#"invalid path "nul/../x": path contains a reserved device name"#,
            ),
            (
                "/a\\b",
                PathRule::Absolute,
                r#"invalid path "/a\\b": path is absolute"#,
            ),
        ];
        for (path, rule, message) in cases {
            let ops = [
                StoreOp::Read {
                    path: (*path).into(),
                    range: None,
                },
                StoreOp::ReadNumbered {
                    path: (*path).into(),
                    range: None,
                },
                StoreOp::Write {
                    path: (*path).into(),
                    contents: "x".into(),
                },
                StoreOp::Append {
                    path: (*path).into(),
                    contents: "x".into(),
                },
                StoreOp::StrReplace {
                    path: (*path).into(),
                    old: "".into(),
                    new: "x".into(),
                },
                StoreOp::Delete {
                    path: (*path).into(),
                },
                StoreOp::Exists {
                    path: (*path).into(),
                },
            ];
            for op in ops {
                let err = s.perform(&op).unwrap_err();
                assert_eq!(err.reason, StoreReason::InvalidPath);
                assert_eq!(err.rule, Some(*rule));
                assert_eq!(err.path.as_deref(), Some(*path));
                assert_eq!(err.message, *message);
            }
        }
        let long = format!("{}/{}", vec!["a".repeat(200); 5].join("/"), "b".repeat(20));
        let err = read(s, &long).unwrap_err();
        assert_eq!(err.rule, Some(PathRule::TooLong));
        assert_eq!(
            err.message,
            format!("invalid path \"{long}\": path is too long")
        );
        // Nothing was created.
        for path in ["a", "c", "e.txt", "notes.", "x"] {
            if path.ends_with('.') {
                continue;
            }
            assert!(!exists(s, path).unwrap(), "{path}");
        }
        assert!(glob(s, "**").unwrap().is_empty());
        assert!(glob(s, "**/").unwrap().is_empty());
        // A path of exactly 1024 bytes works (segments within a disk's 255-byte names).
        let exact = format!("{}/{}", vec!["a".repeat(200); 4].join("/"), "b".repeat(220));
        assert_eq!(exact.len(), 1024);
        write(s, &exact, "ok");
        assert_eq!(read(s, &exact).unwrap(), "ok");
    });
}

#[test]
fn glob_patterns() {
    each_backend(|s| {
        write(s, "src/b.rs", "b");
        write(s, "src/a.rs", "a");
        write(s, "src/deep/c.rs", "c");
        write(s, "notes.md", "n");
        assert_eq!(glob(s, "src/*.rs").unwrap(), ["src/a.rs", "src/b.rs"]);
        assert_eq!(
            glob(s, "src/**/*.rs").unwrap(),
            ["src/a.rs", "src/b.rs", "src/deep/c.rs"]
        );
        assert_eq!(glob(s, "*.md").unwrap(), ["notes.md"]);
        assert_eq!(
            glob(s, "**").unwrap(),
            ["notes.md", "src/a.rs", "src/b.rs", "src/deep/c.rs"]
        );
        assert_eq!(glob(s, "**/c.rs").unwrap(), ["src/deep/c.rs"]);
        assert_eq!(glob(s, "*/").unwrap(), ["src"]);
        assert_eq!(glob(s, "**/").unwrap(), ["src", "src/deep"]);
        assert_eq!(glob(s, "src/*/").unwrap(), ["src/deep"]);
        assert!(glob(s, "nothing/*").unwrap().is_empty());
        assert!(glob(s, "notes.md/*").unwrap().is_empty());
        assert!(glob(s, "/src/*").unwrap().is_empty());
    });
    each_backend(|s| {
        write(s, "a/b.txt", "x");
        assert!(glob(s, "*.txt").unwrap().is_empty());
        assert_eq!(glob(s, "a/*.txt").unwrap(), ["a/b.txt"]);
        write(s, "a/b.rs", "x");
        assert_eq!(glob(s, "a/**/b.rs").unwrap(), ["a/b.rs"]);
        write(s, "z2.rs", "x");
        assert_eq!(glob(s, "**/z2.rs").unwrap(), ["z2.rs"]);
        write(s, "notes/a.txt", "x");
        assert!(!glob(s, "*").unwrap().contains(&"notes".to_owned()));
        assert_eq!(glob(s, "notes/*").unwrap(), ["notes/a.txt"]);
        assert!(glob(s, "**").unwrap().contains(&"notes/a.txt".to_owned()));
        assert!(glob(s, "notes/*/").unwrap().is_empty());
        write(s, "notes/sub/x.txt", "x");
        assert_eq!(glob(s, "notes/*/").unwrap(), ["notes/sub"]);
        // Directories stay until deleted.
        delete(s, "notes/sub/x.txt").unwrap();
        assert_eq!(glob(s, "notes/*/").unwrap(), ["notes/sub"]);
        // Literal characters.
        write(s, "[x]{y}?.md", "x");
        assert_eq!(glob(s, "[x]{y}?.md").unwrap(), ["[x]{y}?.md"]);
    });
}

#[test]
fn glob_errors() {
    each_backend(|s| {
        let cases: &[(&str, PathRule, &str)] = &[
            (
                "",
                PathRule::Empty,
                r#"invalid glob pattern "": path is empty"#,
            ),
            (
                "a\\*",
                PathRule::Backslash,
                r#"invalid glob pattern "a\\*": path contains a backslash"#,
            ),
            (
                "a\n*",
                PathRule::Control,
                r#"invalid glob pattern "a\n*": path contains a control character"#,
            ),
            (
                "src/**.rs",
                PathRule::Wildcard,
                r#"invalid glob pattern "src/**.rs": pattern contains invalid wildcard grammar"#,
            ),
            (
                "***",
                PathRule::Wildcard,
                r#"invalid glob pattern "***": pattern contains invalid wildcard grammar"#,
            ),
        ];
        for (pattern, rule, message) in cases {
            let err = glob(s, pattern).unwrap_err();
            assert_eq!(err.reason, StoreReason::InvalidPath);
            assert_eq!(err.rule, Some(*rule));
            assert_eq!(err.path.as_deref(), Some(*pattern));
            assert_eq!(err.message, *message);
        }
        let long = "a".repeat(1025);
        assert_eq!(glob(s, &long).unwrap_err().rule, Some(PathRule::TooLong));
        // Matching is bounded.
        write(s, &"a".repeat(200), "x");
        let started = std::time::Instant::now();
        let hostile = format!("{}b", "a*".repeat(300));
        assert!(glob(s, &hostile).unwrap().is_empty());
        assert!(started.elapsed().as_secs() < 5);
    });
}

#[test]
fn invalid_utf8_files() {
    each_backend(|s| {
        s.seed("bin.dat", b"bad \xff byte").unwrap();
        for op in [
            StoreOp::Read {
                path: "bin.dat".into(),
                range: None,
            },
            StoreOp::Read {
                path: "bin.dat".into(),
                range: Some(LineRange {
                    start: Some(1),
                    end: None,
                }),
            },
            StoreOp::ReadNumbered {
                path: "bin.dat".into(),
                range: None,
            },
            StoreOp::StrReplace {
                path: "bin.dat".into(),
                old: "bad".into(),
                new: "good".into(),
            },
        ] {
            let err = s.perform(&op).unwrap_err();
            assert_eq!(err.reason, StoreReason::NotUtf8, "{op:?}");
            assert_eq!(err.message, "file in store is not UTF-8: bin.dat");
        }
        assert!(exists(s, "bin.dat").unwrap());
        assert_eq!(glob(s, "*.dat").unwrap(), ["bin.dat"]);
        assert_eq!(s.read_bytes("bin.dat").unwrap(), b"bad \xff byte");
        write(s, "bin.dat", "fixed");
        assert_eq!(read(s, "bin.dat").unwrap(), "fixed");
    });
}

#[test]
fn read_only_store() {
    each_backend(|s| {
        s.seed("paper.md", b"the paper body").unwrap();
        s.set_read_only(true);
        assert!(s.is_read_only());
        for op in [
            StoreOp::Write {
                path: "report.md".into(),
                contents: "x".into(),
            },
            StoreOp::Append {
                path: "paper.md".into(),
                contents: "x".into(),
            },
            StoreOp::StrReplace {
                path: "paper.md".into(),
                old: "paper".into(),
                new: "x".into(),
            },
            StoreOp::Delete {
                path: "paper.md".into(),
            },
        ] {
            let err = s.perform(&op).unwrap_err();
            assert_eq!(err.reason, StoreReason::PermissionDenied);
            assert_eq!(
                err.message,
                format!(
                    "permission denied for store path {}: the store is read-only",
                    op.target()
                )
            );
        }
        // Reads still work; an invalid path is still an invalid path.
        assert_eq!(read(s, "paper.md").unwrap(), "the paper body");
        assert_eq!(glob(s, "*").unwrap(), ["paper.md"]);
        assert_eq!(
            s.perform(&StoreOp::Write {
                path: "/x".into(),
                contents: "x".into()
            })
            .unwrap_err()
            .reason,
            StoreReason::InvalidPath
        );
        assert!(!exists(s, "report.md").unwrap());
        s.set_read_only(false);
        write(s, "report.md", "ok");
    });
}

#[derive(Debug)]
struct NoSecrets;

impl StorePolicy for NoSecrets {
    fn check(&self, op: &StoreOp) -> Result<(), String> {
        if op.target().starts_with("secret/") {
            Err("the Host policy forbids secret/".into())
        } else {
            Ok(())
        }
    }
}

#[test]
fn host_policy() {
    each_backend(|s| {
        s.seed("secret/path.txt", b"hidden").unwrap();
        s.set_policy(Some(Box::new(NoSecrets)));
        let err = read(s, "secret/path.txt").unwrap_err();
        assert_eq!(err.reason, StoreReason::PermissionDenied);
        assert_eq!(
            err.message,
            "permission denied for store path secret/path.txt: the Host policy forbids secret/"
        );
        assert_eq!(
            glob(s, "secret/*").unwrap_err().message,
            "permission denied for store path secret/*: the Host policy forbids secret/"
        );
        write(s, "public.txt", "ok");
        s.set_policy(None);
        assert_eq!(read(s, "secret/path.txt").unwrap(), "hidden");
    });
}

#[test]
fn error_values_serialize() {
    let mut s = Store::new(Box::new(MemoryBackend::new()));
    write(&mut s, "f.txt", "na na");
    let err = str_replace(&mut s, "f.txt", "na", "x").unwrap_err();
    let json = serde_json::to_value(&err).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "reason": "anchor",
            "message": "anchor \"na\" occurs 2 times in f.txt, expected exactly one; include more surrounding text so it matches once",
            "path": "f.txt",
            "anchor": "na",
            "count": 2
        })
    );
    let err = read(&mut s, "a//b").unwrap_err();
    assert_eq!(serde_json::to_value(&err).unwrap()["rule"], "empty_segment");
    assert_eq!(
        err.message,
        "invalid path \"a//b\": path contains an empty segment"
    );
}

#[test]
fn default_store_is_empty_memory() {
    let mut s = Store::default();
    assert!(glob(&mut s, "**").unwrap().is_empty());
    assert!(!s.is_read_only());
    let dir = tempfile::tempdir().unwrap();
    let mut on_disk = Store::directory(dir.path().join("made/here")).unwrap();
    write(&mut on_disk, "drafts/plan.md", "step one");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("made/here/drafts/plan.md")).unwrap(),
        "step one"
    );
}
