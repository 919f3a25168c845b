//! `promptforge models`: list the model catalog.

use std::process::ExitCode;

use clap::Args;
use promptforge_harness::model::{Catalog, ConfigSources, Environment, KeyStatus};

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
            errln!("error: cannot read the working directory: {e}");
            return ExitCode::from(2);
        }
    };
    let catalog = match Catalog::load_standard(&cwd) {
        Ok(catalog) => catalog,
        Err(e) => {
            errln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let listed = catalog.list(&Environment::Process);
    let quick = Catalog::quick_kinds(&Environment::Process);
    let looked = ConfigSources::standard(&cwd, &Environment::Process)
        .map(|s| {
            [s.user, s.project]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let key_text = |key: &KeyStatus| match key {
        KeyStatus::NotNeeded => "no key needed".to_owned(),
        KeyStatus::Set { env } => format!("key from ${env}"),
        KeyStatus::Missing { env } => format!("set ${env} to use it"),
    };
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
                    "price": m.description.price,
                    "default": m.is_default,
                    "source": m.source.as_ref().map(|p| p.display().to_string()),
                    "problem": m.problem,
                })
            })
            .collect();
        let report = serde_json::json!({
            "models": rows,
            "config_files_read": catalog.files_read(),
            "config_files_looked_for": looked,
            "quick_ids": quick,
        });
        match serde_json::to_string_pretty(&report) {
            Ok(text) => outln!("{text}"),
            Err(e) => {
                errln!("error: {e}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    if listed.is_empty() {
        outln!(
            "no models configured; add [models.\"ID\"] entries to ./promptforge.toml or the user \
             config file, or pass a quick id such as --model openai:gpt-4.1 (see docs/models.md)"
        );
    }
    for m in &listed {
        let d = &m.description;
        let price = d
            .price
            .map(|p| format!("  ${} / ${} per Mtok in/out", p.input, p.output))
            .unwrap_or_default();
        outln!(
            "{}{}  {} {}  context {}  thinking {}{price}  ({}){}",
            d.id,
            if m.is_default { " (default)" } else { "" },
            d.provider.as_str(),
            d.model,
            d.context,
            d.thinking,
            key_text(&m.key),
            m.problem
                .as_ref()
                .map(|p| format!("\n    problem: {p}"))
                .unwrap_or_default()
        );
        if !d.description.is_empty() {
            outln!("    {}", d.description);
        }
    }
    outln!();
    outln!("quick ids (--model KIND:NAME, no config entry needed):");
    for q in &quick {
        let url = q.base_url.as_deref().unwrap_or("no URL");
        outln!(
            "  {}:NAME  {url} ({})  {}",
            q.kind.as_str(),
            q.origin,
            key_text(&q.key)
        );
    }
    outln!();
    if catalog.files_read().is_empty() {
        outln!("config files read: none");
    } else {
        outln!("config files read:");
        for file in catalog.files_read() {
            outln!("  {}", file.display());
        }
    }
    let missing: Vec<_> = looked
        .iter()
        .filter(|p| !catalog.files_read().contains(p))
        .collect();
    if !missing.is_empty() {
        outln!("looked for, not found:");
        for file in missing {
            outln!("  {}", file.display());
        }
    }
    ExitCode::SUCCESS
}
