//! `promptforge resume ID|last`: continue a run that was killed before it ended. Part of the
//! `run` command: a resumed run is the killed `run`, started again.
//!
//! A run goes into the history when it starts, and its journal (its record, with every answer
//! written and synced the moment it arrives) grows as it goes. A run killed mid-way (SIGKILL,
//! a crash, a lost machine with the history on a volume) has no outcome there. `resume` starts
//! it again the way it was started (its command line, in its folder, on the prompt text it
//! ran), with its seed, start instant and argument string; hands it the answers it was given,
//! in the order it took them, with no network call (a store operation is performed again, so
//! the store is rebuilt, and gets its recorded answer); and goes on live from where they end.
//! So no answered round is sent twice, and the run ends as an uninterrupted one with the same
//! answers would have.
//!
//! A run that ended (completed, failed or cancelled) had its one outcome, and nothing replaces
//! it: `resume` refuses and points at `replay --then-live`. A run whose process still holds
//! its journal is running, and is not resumed either.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser};

use crate::history::{History, Unfinished};
use crate::record::{Invocation, Record};
use crate::report::Ui;

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run's id (from `promptforge runs`), or `last` for the newest run.
    #[arg(value_name = "ID")]
    id: String,
    /// The run kept its store in a directory (`--store DIR`), and that directory is as it was
    /// when the run started (resume performs the run's store operations again on it).
    #[arg(long)]
    store_ready: bool,
}

/// What a resumed run continues from: its row, its journal, and what the journal holds.
#[derive(Debug)]
pub struct Resume {
    pub(crate) id: i64,
    pub(crate) journal: PathBuf,
    /// The journal is the history's file (not the run's `--record` file).
    pub(crate) owned: bool,
    pub(crate) record: Record,
    pub(crate) invocation: Invocation,
    /// The old journal, open and locked from the check that no process runs it until the
    /// resumed run's journal has taken its place (and while the run lasts).
    pub(crate) _lock: std::fs::File,
}

pub fn resume(args: &ResumeArgs, ui: Ui) -> ExitCode {
    match prepare(args) {
        Ok(run_args) => super::run(&run_args, ui),
        Err(message) => {
            errln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// The `run` the killed run was, set to continue it.
fn prepare(args: &ResumeArgs) -> Result<super::RunArgs, String> {
    let Some(db) = crate::history::location() else {
        return Err(
            "the run history is off (PROMPTFORGE_HISTORY=off), and resume continues a run from it"
                .to_owned(),
        );
    };
    if !db.exists() {
        return Err(format!("no run history yet at {}", db.display()));
    }
    let mut history = History::open(&db)?;
    let id = history.resolve(&args.id)?;
    let journal = match history.unfinished(id)? {
        Unfinished::Ended(outcome) => {
            return Err(format!(
                "run {id} ended ({outcome}), and a run that ended keeps its one outcome: it is not resumed.\n\
                 To run it again with the answers it got and go on live where they end: promptforge replay {id} --then-live"
            ));
        }
        Unfinished::NoJournal => {
            return Err(format!(
                "run {id} has not ended, but it kept no journal to resume from"
            ));
        }
        Unfinished::Journal(journal) => journal,
    };
    let lock = match std::fs::File::open(&journal) {
        Ok(file) => file,
        Err(_) => {
            return Err(format!(
                "run {id} has not ended, but its journal {} is gone",
                journal.display()
            ));
        }
    };
    match crate::record::take_lock(&lock) {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "run {id} is still running (its process holds {}); resume continues a run whose process is gone",
                journal.display()
            ));
        }
        Err(e) => {
            return Err(format!("the run journal {}: {e}", journal.display()));
        }
    }
    let record = Record::load(&journal)?;
    let owned = crate::history::owns_journal(&db, &journal);
    if let Some(outcome) = &record.outcome {
        // The run ended, and its process died keeping it: the history takes it now.
        let file = std::fs::File::open(&journal)
            .map_err(|e| format!("the run journal {}: {e}", journal.display()))?;
        history.add(std::io::BufReader::new(file), 0, None, Some(id))?;
        if owned {
            let _ = std::fs::remove_file(&journal);
        }
        let outcome = outcome["outcome"].as_str().unwrap_or("ended");
        return Err(format!(
            "run {id} ended ({outcome}) before its process died, and is now in the history; a run that ended is not resumed.\n\
             To run it again with the answers it got and go on live where they end: promptforge replay {id} --then-live"
        ));
    }
    drop(history);
    let Some(invocation) = record.invocation.clone() else {
        return Err(format!(
            "{} is not a run journal (it says nothing of how the run was started)",
            journal.display()
        ));
    };
    // Relative paths on its command line (the prompt, --input-file, --script) are the ones it
    // was started with.
    if let Err(e) = std::env::set_current_dir(&invocation.cwd) {
        errln!(
            "note: cannot work in {} ({e}), where run {id} was started; paths on its command line are taken from here",
            invocation.cwd.display()
        );
    }
    let parsed = crate::Cli::try_parse_from(&invocation.argv)
        .map_err(|e| format!("run {id}'s command line no longer parses: {e}"))?;
    let crate::Command::Run(mut run_args) = parsed.command else {
        return Err(format!(
            "run {id} was not started by `promptforge run`, and only those are resumed"
        ));
    };
    // The store is rebuilt by performing the run's store operations again from its start: a
    // directory the killed run had already written to would get them twice (an append
    // doubled), so it must be put back first.
    if let (Some(dir), false) = (&run_args.store, args.store_ready) {
        return Err(format!(
            "run {id} kept its store in {}, which it had already changed when it was killed; resume performs the run's store operations again from its start.\n\
             Put the directory back as it was when run {id} started (empty, if it was new), then: promptforge resume {id} --store-ready",
            dir.display()
        ));
    }
    let answers = record.answers.values().map(Vec::len).sum::<usize>() + record.arrived.len();
    errln!(
        "resuming run {id}: {answers} answer{} from its journal, then live",
        if answers == 1 { "" } else { "s" }
    );
    // One run, not a loop: a `--watch` run that was killed is continued once.
    run_args.watch = false;
    run_args.resume = Some(Resume {
        id,
        journal,
        owned,
        record,
        invocation,
        _lock: lock,
    });
    Ok(*run_args)
}
