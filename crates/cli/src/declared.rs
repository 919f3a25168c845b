//! What a prompt declares, as the Host presents and enforces it: the description a person
//! reads (`describe`, `run PROMPT --help`, `check --json` print it), and the argument object
//! the Host builds as a careful caller (`--arg NAME=VALUE`, a batch line's `arg`, an MCP tool
//! call). Commands share it; none of them owns it.

use std::path::Path;

use promptforge_syntax::Prompt;
use promptforge_syntax::frontmatter::{ArgDecl, ArgType, ArgValue, ArgsDecl};
use serde::Serialize;
use serde_json::{Map, Value as Json};

use crate::source::read_prompt;

/// A prompt's interface: what `describe --json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct Description {
    name: String,
    description: String,
    title: String,
    /// `free text` (no `args:` key: the whole string is `argv.prose`) or `json`.
    args_form: &'static str,
    args: Vec<ArgLine>,
    roles: Vec<RoleLine>,
    tool_slots: Vec<SlotLine>,
    plugins: Vec<PluginLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_file: Option<FileLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_file: Option<FileLine>,
}

#[derive(Debug, Serialize)]
struct ArgLine {
    name: String,
    #[serde(rename = "type")]
    ty: &'static str,
    optional: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    default: Option<Json>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

#[derive(Debug, Serialize)]
struct RoleLine {
    label: String,
    keywords: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_context: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

#[derive(Debug, Serialize)]
struct SlotLine {
    alias: String,
    path: String,
}

#[derive(Debug, Serialize)]
struct PluginLine {
    id: String,
    optional: bool,
}

#[derive(Debug, Serialize)]
struct FileLine {
    path: String,
    description: String,
}

pub(crate) fn arg_value_json(value: &ArgValue) -> Json {
    match value {
        ArgValue::String(s) => Json::String(s.clone()),
        ArgValue::Boolean(b) => Json::Bool(*b),
        ArgValue::Integer(n) => Json::from(*n),
        ArgValue::Number(x) => serde_json::Number::from_f64(*x).map_or(Json::Null, Json::Number),
    }
}

impl Description {
    pub(crate) fn of(prompt: &Prompt) -> Description {
        let fm = &prompt.frontmatter;
        let arg_line = |arg: &ArgDecl| ArgLine {
            name: arg.name.clone(),
            ty: arg.ty.as_str(),
            optional: arg.optional,
            default: arg.default.as_ref().map(arg_value_json),
            description: arg.description.clone(),
        };
        let file = |decl: &promptforge_syntax::frontmatter::FileDecl| FileLine {
            path: decl.path.clone(),
            description: decl.description.clone(),
        };
        Description {
            name: fm.name.clone(),
            description: fm.description.clone(),
            title: prompt.title.clone(),
            args_form: if fm.args.is_structured() {
                "json"
            } else {
                "free text"
            },
            args: fm.args.args.iter().map(arg_line).collect(),
            roles: fm
                .models
                .iter()
                .map(|role| RoleLine {
                    label: role.label.clone(),
                    keywords: role.keywords.iter().map(|k| k.to_string()).collect(),
                    min_context: role.min_context,
                    description: role.description.clone(),
                })
                .collect(),
            tool_slots: fm
                .tools
                .iter()
                .map(|slot| SlotLine {
                    alias: slot.alias.clone(),
                    path: slot.path.clone(),
                })
                .collect(),
            plugins: fm
                .plugins
                .iter()
                .map(|p| PluginLine {
                    id: p.id.clone(),
                    optional: p.optional,
                })
                .collect(),
            input_file: fm.input.as_ref().map(file),
            output_file: fm.output.as_ref().map(file),
        }
    }

    /// The description as text, every line starting with `indent`.
    pub(crate) fn text(&self, indent: &str) -> String {
        let mut out = Vec::new();
        let mut line = |s: String| out.push(format!("{indent}{s}").trim_end().to_owned());
        line(format!("{}: {}", self.name, self.description));
        if self.args_form == "json" {
            line("arguments (a JSON object: --args '{...}', or --arg NAME=VALUE each):".into());
            if self.args.is_empty() {
                line("  none declared".into());
            }
        } else {
            line("arguments (free text: --args STRING, read as argv.prose):".into());
        }
        let width = self.args.iter().map(|a| a.name.len()).max().unwrap_or(0);
        for arg in &self.args {
            let need = match (&arg.default, arg.optional) {
                (Some(default), _) => format!("default {default}"),
                (None, true) => "optional".into(),
                (None, false) => "required".into(),
            };
            let about = arg.description.as_deref().unwrap_or("");
            line(format!(
                "  {:width$}  {}, {need}  {about}",
                arg.name, arg.ty
            ));
        }
        if self.roles.is_empty() {
            line("model roles: none (the prompt can still call the current model)".into());
        } else {
            line("model roles (each bound to the current model, --model ID):".into());
            for role in &self.roles {
                let mut needs = Vec::new();
                if !role.keywords.is_empty() {
                    needs.push(format!("keywords {}", role.keywords.join(", ")));
                }
                if let Some(min) = role.min_context {
                    needs.push(format!("context of at least {min} tokens"));
                }
                if needs.is_empty() {
                    needs.push("any model".into());
                }
                let about = role
                    .description
                    .as_deref()
                    .map(|d| format!("  {d}"))
                    .unwrap_or_default();
                line(format!("  {}: {}{about}", role.label, needs.join("; ")));
            }
        }
        if !self.tool_slots.is_empty() {
            line("tool slots:".into());
            for slot in &self.tool_slots {
                line(format!("  {} = {}", slot.alias, slot.path));
            }
        }
        if !self.plugins.is_empty() {
            line("plugins:".into());
            for plugin in &self.plugins {
                let optional = if plugin.optional { " (optional)" } else { "" };
                line(format!("  {}{optional}", plugin.id));
            }
        }
        if let Some(file) = &self.input_file {
            line(format!(
                "input file: {} ({}); pass --input-file PATH",
                file.path, file.description
            ));
        }
        if let Some(file) = &self.output_file {
            line(format!(
                "output file: {} ({}); pass --output-file PATH to copy it out",
                file.path, file.description
            ));
        }
        out.join("\n")
    }
}

/// Parse a prompt file for its description; the error is a one-line report.
pub(crate) fn load(path: &Path) -> Result<Description, String> {
    let text = read_prompt(path)?;
    let prompt =
        Prompt::parse(&text).map_err(|err| crate::source::parse_failure_line(path, &err))?;
    Ok(Description::of(&prompt))
}

/// An argument object as the caller sees the declaration (chapter 06 advertises defaults and
/// never enforces `args:` at run time, but when the Host builds the object itself, from
/// `--arg` pairs, a batch line's `arg` or an MCP tool call, it acts as a careful caller): each
/// declared arg that is absent (or null) gets its default, then a required arg still absent
/// or a value that is not of its declared type is refused, naming the arg. Fields the
/// declaration does not name pass untouched (the argument string may carry more), and a
/// free-text prompt's object is left as it is.
pub(crate) fn complete_args(decl: &ArgsDecl, object: &mut Map<String, Json>) -> Result<(), String> {
    if !decl.is_structured() {
        return Ok(());
    }
    for arg in &decl.args {
        let given = object.get(&arg.name).filter(|v| !v.is_null());
        if given.is_none() {
            match &arg.default {
                Some(default) => {
                    object.insert(arg.name.clone(), arg_value_json(default));
                }
                None if arg.optional => {}
                None => {
                    return Err(format!(
                        "argument `{}` ({}) is required and was not given",
                        arg.name,
                        arg.ty.as_str()
                    ));
                }
            }
            continue;
        }
        if let Some(value) = given
            && !fits(arg.ty, value)
        {
            return Err(format!(
                "argument `{}` is declared as {}, and {value} is not one",
                arg.name,
                arg.ty.as_str()
            ));
        }
    }
    Ok(())
}

/// Whether a JSON value is of a declared arg type (`integer`: a whole number, `1.0` too).
fn fits(ty: ArgType, value: &Json) -> bool {
    match ty {
        ArgType::String => value.is_string(),
        ArgType::Boolean => value.is_boolean(),
        ArgType::Number => value.is_number(),
        ArgType::Integer => {
            value.is_i64()
                || value.is_u64()
                || value
                    .as_f64()
                    .is_some_and(|x| x.is_finite() && x.fract() == 0.0)
        }
    }
}

/// The argument string of `--arg NAME=VALUE` pairs for a prompt that declares structured
/// args: a JSON object whose values follow the declared types (`string` as written; `boolean`
/// `true`/`false`; `integer` and `number` as JSON numbers). A name the prompt does not declare
/// passes as a string (chapter 06: the argument object may carry fields beyond the declared
/// ones), with a note naming what the prompt declares, since it is most often a typo. A value
/// that does not fit its type, or a prompt that takes free text, is an error that says what the
/// prompt takes. Returns the argument string and the notes.
pub(crate) fn structured_args(
    decl: &ArgsDecl,
    pairs: &[String],
) -> Result<(String, Vec<String>), String> {
    if !decl.is_structured() {
        return Err(
            "--arg: this prompt takes free text (it declares no `args:`); pass --args STRING"
                .to_owned(),
        );
    }
    let declared = || {
        if decl.args.is_empty() {
            "it declares none".to_owned()
        } else {
            let names: Vec<&str> = decl.args.iter().map(|a| a.name.as_str()).collect();
            format!("it declares: {}", names.join(", "))
        }
    };
    let mut object = Map::new();
    let mut notes = Vec::new();
    for pair in pairs {
        let Some((name, value)) = pair.split_once('=').filter(|(name, _)| !name.is_empty()) else {
            return Err(format!("--arg {pair:?}: write it as NAME=VALUE"));
        };
        let Some(arg) = decl.get(name) else {
            notes.push(format!(
                "--arg {name}: the prompt declares no arg `{name}` ({}); passed as the string {value:?}",
                declared()
            ));
            if object
                .insert(name.to_owned(), Json::String(value.to_owned()))
                .is_some()
            {
                return Err(format!("--arg {name}: given twice"));
            }
            continue;
        };
        let parsed = match arg.ty {
            ArgType::String => Some(Json::String(value.to_owned())),
            ArgType::Boolean => match value {
                "true" => Some(Json::Bool(true)),
                "false" => Some(Json::Bool(false)),
                _ => None,
            },
            ArgType::Integer => value.trim().parse::<i64>().ok().map(Json::from),
            ArgType::Number => value
                .trim()
                .parse::<i64>()
                .ok()
                .map(Json::from)
                .or_else(|| {
                    value
                        .trim()
                        .parse::<f64>()
                        .ok()
                        .and_then(serde_json::Number::from_f64)
                        .map(Json::Number)
                }),
        };
        let Some(parsed) = parsed else {
            return Err(format!(
                "--arg {name}={value}: `{name}` is declared as {}, and {value:?} is not one",
                arg.ty.as_str()
            ));
        };
        if object.insert(name.to_owned(), parsed).is_some() {
            return Err(format!("--arg {name}: given twice"));
        }
    }
    // A refusal keeps the notes: an undeclared name is most often the typo behind it.
    complete_args(decl, &mut object).map_err(|e| {
        let refusal = match e.strip_suffix("and was not given") {
            Some(_) => format!("--arg: {e}; pass it as --arg NAME=VALUE"),
            None => format!("--arg: {e}"),
        };
        notes
            .iter()
            .fold(refusal, |text, note| format!("{text}\nnote: {note}"))
    })?;
    let text = serde_json::to_string(&Json::Object(object)).map_err(|e| format!("--arg: {e}"))?;
    Ok((text, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(frontmatter: &str) -> Prompt {
        let text = format!(
            "---\nname: t\ndescription: A test\npromptforge: 0\n{frontmatter}---\n\n# T\n\n## S\n\n```lua\nreturn 1\n```\n"
        );
        match Prompt::parse(&text) {
            Ok(p) => p,
            Err(e) => unreachable!("fixture must parse: {e:?}"),
        }
    }

    const ARGS: &str = "args:\n  topic:\n    type: string\n    description: What to write about\n  words:\n    type: integer\n    optional: true\n    default: 200\n  loud:\n    type: boolean\n    optional: true\n  ratio:\n    type: number\n    optional: true\n";

    #[test]
    fn arg_pairs_follow_the_declared_types() {
        let p = prompt(ARGS);
        let args = structured_args(
            &p.frontmatter.args,
            &[
                "topic=tides, moons".into(),
                "words=50".into(),
                "loud=true".into(),
                "ratio=0.5".into(),
            ],
        );
        assert_eq!(
            args,
            Ok((
                r#"{"loud":true,"ratio":0.5,"topic":"tides, moons","words":50}"#.to_owned(),
                Vec::new()
            ))
        );
    }

    #[test]
    fn arg_pairs_say_what_the_prompt_takes() {
        let p = prompt(ARGS);
        let decl = &p.frontmatter.args;
        // An undeclared name passes as a string, with a note (a typo most often).
        assert_eq!(
            structured_args(decl, &["topic=t".into(), "nope=1".into()]),
            Ok((
                r#"{"nope":"1","topic":"t","words":200}"#.to_owned(),
                vec![
                    "--arg nope: the prompt declares no arg `nope` (it declares: topic, words, loud, ratio); passed as the string \"1\""
                        .to_owned()
                ]
            ))
        );
        assert_eq!(
            structured_args(decl, &["words=many".into()]),
            Err("--arg words=many: `words` is declared as integer, and \"many\" is not one".into())
        );
        assert_eq!(
            structured_args(decl, &["topic".into()]),
            Err("--arg \"topic\": write it as NAME=VALUE".into())
        );
        assert_eq!(
            structured_args(decl, &["=x".into()]),
            Err("--arg \"=x\": write it as NAME=VALUE".into())
        );
        // Refused for a missing required arg: the note on the likely typo comes with it.
        assert_eq!(
            structured_args(decl, &["topik=x".into()]),
            Err("--arg: argument `topic` (string) is required and was not given; pass it as --arg NAME=VALUE\nnote: --arg topik: the prompt declares no arg `topik` (it declares: topic, words, loud, ratio); passed as the string \"x\"".into())
        );
        let free = prompt("");
        assert!(
            structured_args(&free.frontmatter.args, &["a=b".into()])
                .is_err_and(|e| e.contains("takes free text"))
        );
    }

    #[test]
    fn the_host_fills_defaults_and_checks_what_it_builds() {
        let p = prompt(ARGS);
        let decl = &p.frontmatter.args;
        assert_eq!(
            structured_args(decl, &["topic=tides".into()]),
            Ok((r#"{"topic":"tides","words":200}"#.to_owned(), Vec::new()))
        );
        assert_eq!(
            structured_args(decl, &["words=5".into()]),
            Err("--arg: argument `topic` (string) is required and was not given; pass it as --arg NAME=VALUE".into())
        );
        let complete = |value: Json| {
            let Json::Object(mut object) = value else {
                unreachable!("an object")
            };
            complete_args(decl, &mut object).map(|()| Json::Object(object))
        };
        // Extra fields pass; null counts as absent; a whole float is an integer.
        assert_eq!(
            complete(serde_json::json!({"topic": "t", "words": null, "extra": [1]})),
            Ok(serde_json::json!({"topic": "t", "words": 200, "extra": [1]}))
        );
        assert_eq!(
            complete(serde_json::json!({"topic": "t", "words": 3.0, "ratio": 1})),
            Ok(serde_json::json!({"topic": "t", "words": 3.0, "ratio": 1}))
        );
        assert_eq!(
            complete(serde_json::json!({"topic": 5})),
            Err("argument `topic` is declared as string, and 5 is not one".into())
        );
        assert_eq!(
            complete(serde_json::json!({"topic": "t", "words": 2.5})),
            Err("argument `words` is declared as integer, and 2.5 is not one".into())
        );
        assert_eq!(
            complete(serde_json::json!({"topic": "t", "loud": "yes"})),
            Err("argument `loud` is declared as boolean, and \"yes\" is not one".into())
        );
        // A free-text prompt's object is not the Host's to judge.
        let free = prompt("");
        let mut object = Map::new();
        assert_eq!(complete_args(&free.frontmatter.args, &mut object), Ok(()));
        assert!(object.is_empty());
    }

    #[test]
    fn the_description_lists_args_roles_slots_and_files() {
        let p = prompt(&format!(
            "{ARGS}models:\n  writer:\n    keywords: [frontier]\n    min_context: 1000\n    description: Writes the draft\ntools:\n  ask: promptforge/user-input/ask\noutput:\n  path: out.md\n  description: the draft\n"
        ));
        let text = Description::of(&p).text("");
        for want in [
            "t: A test",
            "arguments (a JSON object",
            "topic  string, required  What to write about",
            "words  integer, default 200",
            "loud   boolean, optional",
            "writer: keywords frontier; context of at least 1000 tokens  Writes the draft",
            "ask = promptforge/user-input/ask",
            "output file: out.md (the draft)",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        let free = Description::of(&prompt("")).text("  ");
        assert!(free.contains("  arguments (free text: --args STRING"));
        assert!(free.contains("prose  string, optional  Freeform input for this prompt"));
    }
}
