//! `promptforge check FILE...`: parse each file, report every problem, run nothing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use promptforge_syntax::Prompt;
use serde::Serialize;

use crate::source::{problem_location, read_prompt};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print a JSON list of results instead of text.
    #[arg(long)]
    json: bool,
    /// Prompt files to check; a folder is walked for its prompts (`.md` files that open with
    /// a frontmatter, as `mcp serve DIR` finds them).
    #[arg(required = true, value_name = "FILE|DIR")]
    files: Vec<PathBuf>,
}

/// One file's problem, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Problem {
    /// `error` (the file does not parse or would be refused) or `warning` (a literal
    /// reference that names nothing: the run fails there unless the call is caught).
    severity: &'static str,
    kind: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    column: Option<u32>,
}

/// A clean file's summary, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Summary {
    name: String,
    title: String,
    sections: usize,
    blocks: usize,
    lua_blocks: usize,
    shared_library: bool,
    roles: Vec<String>,
    slots: Vec<String>,
    plugins: Vec<String>,
}

#[derive(Debug, Serialize)]
struct FileReport {
    file: String,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<Summary>,
    /// What the prompt takes (what `describe` prints).
    #[serde(skip_serializing_if = "Option::is_none")]
    describe: Option<crate::declared::Description>,
    problems: Vec<Problem>,
}

fn summarize(prompt: &Prompt) -> Summary {
    let fm = &prompt.frontmatter;
    let blocks = prompt.h1_blocks.len()
        + prompt
            .sections
            .iter()
            .map(|s| s.blocks.len())
            .sum::<usize>();
    Summary {
        name: fm.name.clone(),
        title: prompt.title.clone(),
        sections: prompt.sections.len(),
        blocks,
        lua_blocks: prompt.lua_regions().count() - usize::from(prompt.shared.is_some()),
        shared_library: prompt.shared.is_some(),
        roles: fm.models.iter().map(|r| r.label.clone()).collect(),
        slots: fm.tools.iter().map(|t| t.alias.clone()).collect(),
        plugins: fm.plugins.iter().map(|p| p.id.clone()).collect(),
    }
}

fn check_file(path: &Path) -> FileReport {
    let file = path.display().to_string();
    let text = match read_prompt(path) {
        Ok(text) => text,
        Err(message) => {
            return FileReport {
                file,
                ok: false,
                summary: None,
                describe: None,
                problems: vec![Problem {
                    severity: "error",
                    kind: "Io".into(),
                    message,
                    line: None,
                    column: None,
                }],
            };
        }
    };
    // One analysis gives the parse problems, the prompt, and the reference warnings.
    let analysis = promptforge_ide::Analysis::new(&text);
    let parsed = analysis.clean_prompt();
    let mut problems = Vec::new();
    match parsed {
        None => {
            for err in analysis.problems() {
                let location = problem_location(err, &text);
                problems.push(Problem {
                    severity: "error",
                    kind: err.kind.to_string(),
                    message: err.message.clone(),
                    line: location.map(|l| l.0),
                    column: location.and_then(|l| l.1),
                });
            }
        }
        Some(_) => {
            // A file that parses but would be refused on its first step (the version rule,
            // which the analysis applies as a run does) is still a problem, where the editor
            // shows it: a missing version at the frontmatter's opening `---`.
            for refused in analysis
                .diagnostics()
                .iter()
                .filter(|d| d.severity == promptforge_ide::Severity::Error)
            {
                problems.push(Problem {
                    severity: "error",
                    kind: refused.kind.clone(),
                    message: refused.message.clone(),
                    line: Some(refused.span.start.line),
                    column: (!refused.whole_line).then_some(refused.span.start.col),
                });
            }
        }
    }
    // Literal references that name nothing: warnings, which never fail the check (a prompt
    // may name a missing section on purpose, under `pcall`).
    let warned_lines: Vec<Option<u32>> = problems.iter().map(|p| p.line).collect();
    for warning in analysis
        .diagnostics()
        .iter()
        .filter(|d| d.severity == promptforge_ide::Severity::Warning)
    {
        if warned_lines.contains(&Some(warning.span.start.line)) {
            continue;
        }
        problems.push(Problem {
            severity: "warning",
            kind: warning.kind.clone(),
            message: warning.message.clone(),
            line: Some(warning.span.start.line),
            column: Some(warning.span.start.col),
        });
    }
    problems.sort_by_key(|p| (p.line.is_some(), p.line, p.column));
    FileReport {
        file,
        ok: problems.iter().all(|p| p.severity != "error"),
        summary: parsed.map(summarize),
        describe: parsed.map(crate::declared::Description::of),
        problems,
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

pub fn check(args: &CheckArgs) -> ExitCode {
    let mut reports: Vec<FileReport> = Vec::new();
    for path in &args.files {
        if !path.is_dir() {
            reports.push(check_file(path));
            continue;
        }
        // In a folder, Markdown that is not a prompt program (a README) is not checked.
        let found: Vec<FileReport> = crate::source::prompt_files(std::slice::from_ref(path))
            .iter()
            .filter(|file| {
                read_prompt(file).is_ok_and(|text| crate::source::looks_like_a_prompt(&text))
            })
            .map(|file| check_file(file))
            .collect();
        if found.is_empty() {
            errln!("error: {}: no prompt files in this folder", path.display());
            return ExitCode::from(2);
        }
        reports.extend(found);
    }
    let failed = reports.iter().any(|r| !r.ok);
    if args.json {
        match serde_json::to_string_pretty(&reports) {
            Ok(text) => outln!("{text}"),
            Err(e) => {
                errln!("error: cannot encode the report: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        for report in &reports {
            for p in &report.problems {
                let at = match (p.line, p.column) {
                    (Some(line), Some(col)) => format!("{}:{line}:{col}", report.file),
                    (Some(line), None) => format!("{}:{line}", report.file),
                    _ => report.file.clone(),
                };
                outln!("{at}: {}[{}]: {}", p.severity, p.kind, p.message);
            }
            if let (true, Some(s)) = (report.ok, &report.summary) {
                outln!(
                    "{}: ok: `{}` ({}): {} section{}, {} block{} ({} lua{}); roles: {}; tool slots: {}; plugins: {}",
                    report.file,
                    s.title,
                    s.name,
                    s.sections,
                    if s.sections == 1 { "" } else { "s" },
                    s.blocks,
                    if s.blocks == 1 { "" } else { "s" },
                    s.lua_blocks,
                    if s.shared_library {
                        " + shared library"
                    } else {
                        ""
                    },
                    list(&s.roles),
                    list(&s.slots),
                    list(&s.plugins),
                );
                if let Some(description) = &report.describe {
                    outln!("{}", description.text("    "));
                }
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
