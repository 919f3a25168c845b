//! `promptforge cache`: what the response cache holds, and emptying it.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::response_cache::{DEFAULT_TTL, ResponseCache, location};

#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    command: CacheCommand,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// Where the cache is, how many replies it holds, their size and how often they were used.
    Stats,
    /// Drop every cached reply, or only those older than `--older-than DAYS`.
    Clear {
        /// Only replies kept longer ago than this many days.
        #[arg(long, value_name = "DAYS")]
        older_than: Option<f64>,
    },
}

pub fn cache(args: &CacheArgs) -> ExitCode {
    match cache_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            errln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn cache_inner(args: &CacheArgs) -> Result<(), String> {
    let path = location().ok_or("the response cache has no place: set PROMPTFORGE_CACHE_FILE")?;
    let cache = ResponseCache::open(&path, DEFAULT_TTL)?;
    match &args.command {
        CacheCommand::Stats => {
            let stats = cache.stats()?;
            outln!("{}", path.display());
            outln!(
                "  {} · {} · used {}",
                replies(stats.entries),
                bytes_text(stats.bytes),
                crate::ui::plural(stats.hits, "time")
            );
        }
        CacheCommand::Clear { older_than } => {
            let age = match older_than {
                Some(days) => Some(
                    std::time::Duration::try_from_secs_f64(days * 86_400.0)
                        .map_err(|_| format!("--older-than {days}: give a number of days"))?,
                ),
                None => None,
            };
            let dropped = cache.clear(age)?;
            outln!("dropped {}", replies(dropped));
        }
    }
    Ok(())
}

fn replies(n: u64) -> String {
    if n == 1 {
        "1 cached reply".to_owned()
    } else {
        format!("{n} cached replies")
    }
}

fn bytes_text(bytes: u64) -> String {
    if bytes >= 1024 * 1024 {
        format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
    } else if bytes >= 1024 {
        format!("{:.1} KB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} bytes")
    }
}
