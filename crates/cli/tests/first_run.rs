//! What a new user meets first, through the real binary: failures that say what to do, a
//! prompt that describes itself, arguments from flags and stdin, a store that does not litter
//! the temp folder, `--events` that is JSON lines only, completions, and the model listing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};
use support::{LocalServer, promptforge};

const WRITER: &str = "---\nname: writer\ndescription: Writes one line\npromptforge: 0\nmodels:\n  writer:\n    description: Drafts the line\n---\n\n# Writer\n\n## Write\n\n```lua\nmodels.default('writer')\nreturn models.infer('a line about ' .. args)\n```\n";

const TYPED: &str = "---\nname: typed\ndescription: Echoes its structured args\npromptforge: 0\nargs:\n  topic:\n    type: string\n    description: What to write about\n  words:\n    type: integer\n    optional: true\n    default: 100\n---\n\n# Typed\n\n## Echo\n\n```lua\nreturn argv.topic .. '/' .. tostring(argv.words)\n```\n";

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_forgotten_model_gets_a_hint_and_no_traceback() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "writer.md", WRITER);
    let output = promptforge(dir.path())
        .args(["run", "writer.md", "--args", "tides"])
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        // FILE:LINE first, as typed, so an editor or terminal can jump to the call.
        lines[0].starts_with("writer.md:15: error[Lua]: section `Write` prologue:15: ")
            && lines[0].ends_with("models.default label \"writer\" is not a bound model role"),
        "{stderr}"
    );
    assert!(
        lines.iter().any(
            |l| l.starts_with("hint: no model is selected: pass --model ID")
                && l.contains("promptforge models")
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("stack traceback"), "{stderr}");
    assert!(stderr.contains("(-v shows the Lua traceback)"), "{stderr}");
    // A round with no role selected is a Binding failure: the hint is the prompt's fix (a
    // --model would not help).
    write(
        dir.path(),
        "bare.md",
        "---\nname: bare\ndescription: d\npromptforge: 0\n---\n\n# Bare\n\n## Main\n\n```lua\nreturn models.infer('hi')\n```\n",
    );
    let output = promptforge(dir.path())
        .args(["run", "bare.md"])
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert!(
        stderr.starts_with("bare.md:12: error[Binding]: model binding required for section Main\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "hint: a model round ran with no model role selected: call `models.use('ROLE')`"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("pass --model"), "{stderr}");
    let verbose = promptforge(dir.path())
        .args(["-v", "run", "writer.md"])
        .output()
        .unwrap();
    assert!(text(&verbose).1.contains("stack traceback"));
}

#[test]
fn a_failure_away_from_its_cause_names_the_cause_too() {
    let dir = tempfile::tempdir().unwrap();
    // A missing placeholder fails where the block reads `prose` (line 16); the hint names
    // the placeholder's own line and column.
    write(
        dir.path(),
        "days.md",
        "---\nname: days\ndescription: d\npromptforge: 0\n---\n\n# Days\n\n## Main\n\nSummarize\nthe last {{ argv.days }} days.\n\n```lua\nlocal x = 1\nreturn prose\n```\n",
    );
    let output = promptforge(dir.path())
        .args(["run", "days.md", "--args", "{}"])
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines[0],
        "days.md:16: error[Lua]: section `Main` epilog:16: missing {{ argv.days }} [MissingKey at byte 19]",
        "{stderr}"
    );
    assert!(
        lines.contains(&"hint: the placeholder {{ argv.days }} is at days.md:12:10"),
        "{stderr}"
    );
    // A role label the frontmatter does not declare: the message is the spec's, the hint
    // lists the roles there are.
    write(
        dir.path(),
        "planer.md",
        &WRITER.replace("models.default('writer')", "models.default('planer')"),
    );
    let output = promptforge(dir.path())
        .args(["run", "planer.md", "--model", "openai:gpt-test"])
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert!(
        stderr.starts_with("planer.md:15: error[Lua]: section `Write` prologue:15: models.default label \"planer\" is not a bound model role\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: `planer` is not declared; the prompt's model roles: writer\n"),
        "{stderr}"
    );
    // A model failure points at the line that made the round.
    write(
        dir.path(),
        "kept.md",
        &WRITER.replace(
            "return models.infer('a line about ' .. args)",
            "local line = models.infer('a line about ' .. args)\nreturn line",
        ),
    );
    let output = promptforge(dir.path())
        .args(["run", "kept.md", "--model", "openai:gpt-test"])
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert!(
        stderr.starts_with(
            "kept.md:16: error[Completion]: the connection to the model backend failed\n"
        ),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_or_refusing_endpoint_names_the_url_and_the_servers_words() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "writer.md", WRITER);
    // Nothing listens on port 9 of 127.0.0.1 (the discard port).
    let output = promptforge(dir.path())
        .args(["run", "writer.md", "--model", "openai:gpt-test"])
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        // `return models.infer(...)` is a tail call: no Lua frame is left to point at, so
        // the line is the block's one tail call.
        stderr.starts_with(
            "writer.md:16: error[Completion]: the connection to the model backend failed"
        ),
        "{stderr}"
    );
    assert!(
        stderr.lines().any(
            |l| l.starts_with("hint: POST http://127.0.0.1:9/v1/chat/completions")
                && l.contains("OPENAI_BASE_URL")
        ),
        "{stderr}"
    );
    // A traceback would only show the Lua line that waited on the server.
    assert!(!stderr.contains("-v shows the Lua traceback"), "{stderr}");
    // With --json, stdout holds only the outcome; the hint still reaches stderr.
    let output = promptforge(dir.path())
        .args(["run", "writer.md", "--model", "openai:gpt-test", "--json"])
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains(r#""kind":"Completion""#), "{stdout}");
    assert!(
        stderr.lines().any(
            |l| l.starts_with("hint: POST http://127.0.0.1:9/v1/chat/completions")
                && l.contains("OPENAI_BASE_URL")
        ),
        "{stderr}"
    );

    let refusing = LocalServer::start(Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            Response::builder()
                .status(401)
                .header("content-type", "application/json")
                .body(Body::from(
                    json!({"error": {"message": "Incorrect API key provided"}}).to_string(),
                ))
                .unwrap()
        }),
    ));
    let output = promptforge(dir.path())
        .args(["run", "writer.md", "--model", "openai:gpt-test"])
        .env("OPENAI_BASE_URL", format!("{}/v1", refusing.base()))
        .env("OPENAI_API_KEY", "wrong")
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert!(
        stderr.contains(
            "error[Completion]: the model backend did not accept the credentials (status 401)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: the model server answered 401: Incorrect API key provided"),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong"), "the key never shows: {stderr}");
}

#[test]
fn a_prompt_describes_itself_and_takes_typed_args() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "typed.md", TYPED);
    write(dir.path(), "writer.md", WRITER);
    let described = promptforge(dir.path())
        .args(["describe", "typed.md"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&described);
    assert!(described.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("typed: Echoes its structured args\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("topic  string, required  What to write about"),
        "{stdout}"
    );
    assert!(stdout.contains("words  integer, default 100"), "{stdout}");
    let json: Value = serde_json::from_slice(
        &promptforge(dir.path())
            .args(["describe", "writer.md", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(json["roles"][0]["label"], "writer");
    assert_eq!(json["roles"][0]["description"], "Drafts the line");

    let help = promptforge(dir.path())
        .args(["run", "writer.md", "--help"])
        .output()
        .unwrap();
    let (stdout, _) = text(&help);
    assert!(help.status.success());
    assert!(stdout.starts_with("writer: Writes one line\n"), "{stdout}");
    assert!(
        stdout.contains("writer: any model  Drafts the line"),
        "{stdout}"
    );
    assert!(stdout.contains("Usage: promptforge run"), "{stdout}");
    assert!(stdout.contains("--arg <NAME=VALUE>"), "{stdout}");

    let run = |args: &[&str]| {
        let output = promptforge(dir.path())
            .args(["run", "typed.md", "--json"])
            .args(args)
            .output()
            .unwrap();
        text(&output)
    };
    assert_eq!(
        run(&["--arg", "topic=tides", "--arg", "words=7"]).0.trim(),
        r#"{"outcome":"completed","result":"tides/7"}"#
    );
    // A name the prompt does not declare passes (chapter 06 allows fields beyond the
    // declared ones), with a note in case it is a typo.
    let (stdout, stderr) = run(&["--arg", "topic=tides", "--arg", "colour=red"]);
    assert_eq!(
        stdout.trim(),
        r#"{"outcome":"completed","result":"tides/100"}"#
    );
    assert!(
        stderr.contains(
            "note: --arg colour: the prompt declares no arg `colour` (it declares: topic, words); passed as the string \"red\""
        ),
        "{stderr}"
    );
    // No arguments at all: the run goes (chapter 06), fails inside, and the hint says what
    // the prompt takes.
    let output = promptforge(dir.path())
        .args(["run", "typed.md"])
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "hint: the run was given no arguments, and this prompt declares required args: topic (string); pass them as --arg NAME=VALUE"
        ),
        "{stderr}"
    );
    let (_, stderr) = run(&["--arg", "words=lots"]);
    assert!(
        stderr.contains("`words` is declared as integer"),
        "{stderr}"
    );

    let mut child = promptforge(dir.path())
        .args(["run", "typed.md", "--json", "--args", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"topic": "from stdin", "words": 3}"#)
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        text(&output).0.trim(),
        r#"{"outcome":"completed","result":"from stdin/3"}"#
    );

    let checked = promptforge(dir.path())
        .args(["check", "typed.md"])
        .output()
        .unwrap();
    let (stdout, _) = text(&checked);
    assert!(stdout.contains("typed.md: ok:"), "{stdout}");
    assert!(stdout.contains("    topic  string, required"), "{stdout}");
}

#[test]
fn runs_leave_no_store_behind_unless_asked_or_needed() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    write(
        dir.path(),
        "w.md",
        "---\nname: w\ndescription: d\npromptforge: 0\n---\n\n# W\n\n## S\n\n```lua\nstore.write('a.txt', 'x')\nreturn 'ok'\n```\n",
    );
    write(
        dir.path(),
        "fails.md",
        "---\nname: f\ndescription: d\npromptforge: 0\n---\n\n# F\n\n## S\n\n```lua\nstore.write('left.txt', 'x')\nerror('boom')\n```\n",
    );
    let run = |args: &[&str]| {
        let output = promptforge(dir.path())
            .arg("run")
            .args(args)
            .env("TMPDIR", &tmp)
            .output()
            .unwrap();
        text(&output).1
    };
    let left = || std::fs::read_dir(&tmp).unwrap().count();
    run(&["w.md"]);
    assert_eq!(left(), 0, "a completed run's fresh store is removed");
    let stderr = run(&["w.md", "--keep-store"]);
    assert_eq!(left(), 1);
    assert!(stderr.contains("store kept at "), "{stderr}");
    let kept = stderr
        .lines()
        .find_map(|l| l.strip_prefix("store kept at "))
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(Path::new(kept).join("a.txt")).unwrap(),
        "x"
    );
    std::fs::remove_dir_all(kept).unwrap();
    let stderr = run(&["fails.md"]);
    assert_eq!(left(), 1, "a failed run's files are kept: {stderr}");
    assert!(stderr.contains("store kept at "), "{stderr}");
}

#[test]
fn events_are_json_lines_only_and_end_with_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "l.md",
        "---\nname: l\ndescription: d\npromptforge: 0\n---\n\n# L\n\n## S\n\n```lua\nlog('hello')\nreturn 'done'\n```\n",
    );
    let output = promptforge(dir.path())
        .args(["run", "l.md", "--events"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|v| v["event"] == "log" && v["message"] == "hello")
    );
    assert_eq!(
        lines.last().unwrap(),
        &json!({"outcome": "completed", "result": "done"})
    );
    assert!(!stderr.contains("hello"), "{stderr}");
}

#[test]
fn completions_and_the_model_listing() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let output = promptforge(dir.path())
            .args(["completions", shell])
            .output()
            .unwrap();
        let (stdout, _) = text(&output);
        assert!(output.status.success());
        assert!(
            stdout.contains("promptforge") && stdout.contains("batch"),
            "{shell}"
        );
    }
    let nested = dir.path().join("a").join("b");
    std::fs::create_dir_all(&nested).unwrap();
    write(
        dir.path(),
        "promptforge.toml",
        "default = \"local\"\n[models.local]\nprovider = \"ollama\"\nmodel = \"qwen3:8b\"\ninput_price = 0.5\noutput_price = 1.5\n",
    );
    let output = promptforge(&nested).arg("models").output().unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.contains("local (default)  ollama qwen3:8b"),
        "{stdout}"
    );
    assert!(stdout.contains("$0.5 / $1.5 per Mtok in/out"), "{stdout}");
    assert!(stdout.contains("quick ids (--model KIND:NAME"), "{stdout}");
    assert!(stdout.contains("  anthropic:NAME  "), "{stdout}");
    assert!(stdout.contains("config files read:"), "{stdout}");
    assert!(
        stdout.contains(&dir.path().join("promptforge.toml").display().to_string()),
        "the project file is found from a subfolder: {stdout}"
    );
}

#[test]
fn a_key_the_server_echoes_is_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "writer.md", WRITER);
    const KEY: &str = "sk-test-echoed-key-0123456789";
    let echoing = LocalServer::start(Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            Response::builder()
                .status(401)
                .header("content-type", "application/json")
                .body(Body::from(
                    json!({"error": {"message": format!("Incorrect API key provided: {KEY}")}})
                        .to_string(),
                ))
                .unwrap()
        }),
    ));
    for extra in [&[][..], &["--json"][..], &["--events"][..]] {
        let output = promptforge(dir.path())
            .args(["run", "writer.md", "--model", "openai:gpt-test"])
            .args(extra)
            .env("OPENAI_BASE_URL", format!("{}/v1", echoing.base()))
            .env("OPENAI_API_KEY", KEY)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(
            !stdout.contains(KEY) && !stderr.contains(KEY),
            "{extra:?}: the key was shown:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains("[redacted]") || stderr.contains("[redacted]"),
            "{extra:?}: the server's words were dropped instead of redacted:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn a_prompt_from_stdin_or_a_pipe_a_folder_to_check_a_short_model_flag_and_a_final_newline() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "typed.md", TYPED);
    // Piped, the result still ends its line.
    let output = promptforge(dir.path())
        .args(["run", "typed.md", "--arg", "topic=tides"])
        .output()
        .unwrap();
    assert_eq!(text(&output).0, "tides/100\n");
    // `run -` reads the prompt from stdin; `--args -` cannot then read stdin too.
    let mut child = promptforge(dir.path())
        .args(["run", "-", "--arg", "topic=moons"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(TYPED.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(text(&output).0, "moons/100\n");
    let output = promptforge(dir.path())
        .args(["run", "-", "--args", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output).1.contains("stdin already carries the prompt"));
    // A process substitution hands the prompt over as /dev/fd/N, a pipe.
    let output = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} run <(cat typed.md) --arg topic=fd",
            env!("CARGO_BIN_EXE_promptforge")
        ))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(text(&output).0, "fd/100\n", "{}", text(&output).1);
    // `check DIR` walks the folder for prompts (a README is not one); `-m` is `--model`.
    write(dir.path(), "README.md", "# Notes\n\nnot a prompt\n");
    std::fs::create_dir(dir.path().join("more")).unwrap();
    write(&dir.path().join("more"), "writer.md", WRITER);
    let output = promptforge(dir.path())
        .args(["check", "."])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.contains("typed.md: ok") && stdout.contains("writer.md: ok"),
        "{stdout}"
    );
    assert!(!stdout.contains("README"), "{stdout}");
    let output = promptforge(dir.path())
        .args(["run", "more/writer.md", "-m", "openai:gpt-test"])
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    // The model flag was taken: the run reached for the server.
    assert!(
        text(&output).1.contains("error[Completion]"),
        "{}",
        text(&output).1
    );
}

#[test]
fn check_prints_every_problem_as_file_line_column() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/check/many/every-problem.md");
    std::fs::copy(fixture, dir.path().join("many.md")).unwrap();
    let output = promptforge(dir.path())
        .args(["check", "many.md"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    let all = format!("{stdout}{stderr}");
    let starts: Vec<&str> = all
        .lines()
        .filter(|l| l.starts_with("many.md:"))
        .map(|l| l.split(": ").next().unwrap_or_default())
        .collect();
    // Every independent problem, each at its own line and real column, in file order.
    assert_eq!(
        starts,
        [
            "many.md:13:11",
            "many.md:18:3",
            "many.md:24:1",
            "many.md:27:7"
        ],
        "{all}"
    );
    assert!(
        all.contains("many.md:18:3: error[Structure]: duplicate sibling section name `A`"),
        "{all}"
    );
}
