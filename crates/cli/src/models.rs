//! `promptforge models`: list the model catalog.

use std::process::ExitCode;

use clap::Args;
use promptforge_harness::model::{Catalog, Environment, KeyStatus};

#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Print the catalog as JSON.
    #[arg(long)]
    json: bool,
}

pub fn models(args: &ModelsArgs) -> ExitCode {
    let cwd = match std::env::current_dir() {
        Ok(cwd) => cwd,
        Err(e) => {
            eprintln!("error: cannot read the working directory: {e}");
            return ExitCode::from(2);
        }
    };
    let catalog = match Catalog::load_standard(&cwd) {
        Ok(catalog) => catalog,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let listed = catalog.list(&Environment::Process);
    if args.json {
        let rows: Vec<serde_json::Value> = listed
            .iter()
            .map(|m| {
                serde_json::json!({
                    "id": m.description.id,
                    "provider": m.description.provider,
                    "model": m.description.model,
                    "context": m.description.context,
                    "thinking": m.description.thinking.to_string(),
                    "description": m.description.description,
                    "default": m.is_default,
                    "source": m.source.as_ref().map(|p| p.display().to_string()),
                    "problem": m.problem,
                })
            })
            .collect();
        match serde_json::to_string_pretty(&rows) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    if listed.is_empty() {
        println!(
            "no models configured; add [models.\"ID\"] entries to ./promptforge.toml or the user \
             config file, or pass a quick id such as --model openai:gpt-4.1 (see docs/models.md)"
        );
        return ExitCode::SUCCESS;
    }
    for m in &listed {
        let d = &m.description;
        let key = match &m.key {
            KeyStatus::NotNeeded => "no key needed".to_owned(),
            KeyStatus::Set { env } => format!("key from ${env}"),
            KeyStatus::Missing { env } => format!("set ${env} to use it"),
        };
        println!(
            "{}{}  {:?} {}  context {}  thinking {}  ({key}){}",
            d.id,
            if m.is_default { " (default)" } else { "" },
            d.provider,
            d.model,
            d.context,
            d.thinking,
            m.problem
                .as_ref()
                .map(|p| format!("\n    problem: {p}"))
                .unwrap_or_default()
        );
        if !d.description.is_empty() {
            println!("    {}", d.description);
        }
    }
    ExitCode::SUCCESS
}
