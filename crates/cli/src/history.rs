//! The run history: every run's record kept in a local SQLite database, and the `runs`
//! commands that read it.
//!
//! The database is `$PROMPTFORGE_HISTORY` when set (`off` turns the history off), else
//! `promptforge/history.sqlite3` in the user's data directory (`~/.local/share` on Linux).
//! It runs in WAL mode with a busy timeout, so runs started in parallel wait their turn for
//! the one write each makes at its end instead of failing on a lock. A run is one row of
//! `runs` (what `promptforge runs` lists) and one row of `effects` per effect (its request,
//! its answer and the step it was handed over at, its times): exactly the record of
//! `run --record`, which `runs export` writes back out. When the database passes its size
//! cap (`$PROMPTFORGE_HISTORY_MAX_MB`, 256 MB by default) the oldest runs are pruned.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value as Json, json};

use crate::record::Header;

/// The most the write-ahead log keeps on disk after a run, in bytes.
const WAL_LIMIT: u64 = 4 * 1024 * 1024;

/// The default size cap, in megabytes.
const DEFAULT_CAP_MB: u64 = 256;

/// How many bytes of event lines one `events` row holds (a row holds whole lines, joined by
/// newlines; rows written before chunking hold one line each).
const EVENT_CHUNK: usize = 64 * 1024;

/// Where the history lives, or `None` when it is off.
pub(crate) fn location() -> Option<PathBuf> {
    match std::env::var_os("PROMPTFORGE_HISTORY") {
        Some(value) if value == "off" || value.is_empty() => None,
        Some(value) => Some(PathBuf::from(value)),
        None => dirs::data_dir().map(|d| d.join("promptforge").join("history.sqlite3")),
    }
}

fn cap_bytes() -> u64 {
    std::env::var("PROMPTFORGE_HISTORY_MAX_MB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_CAP_MB)
        .saturating_mul(1024 * 1024)
}

/// Add `column` to `table` unless it is there (an older database opened by a newer binary).
fn add_missing_column(
    conn: &Connection,
    table: &str,
    column: &str,
    declaration: &str,
) -> rusqlite::Result<()> {
    if !has_column(conn, table, column)? {
        conn.execute_batch(&format!(
            "ALTER TABLE {table} ADD COLUMN {column} {declaration};"
        ))?;
    }
    Ok(())
}

/// Whether `table` has `column`.
fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    conn.prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists(params![table, column])
}

/// The columns added to the schema since it was first written: effects their task, runs
/// their cost, their count of cached rounds and their journal.
const ADDED_COLUMNS: [(&str, &str, &str); 4] = [
    ("effects", "task", "TEXT"),
    ("runs", "cost", "REAL"),
    ("runs", "cached_rounds", "INTEGER NOT NULL DEFAULT 0"),
    ("runs", "journal", "TEXT"),
];

/// The outcome a run's row holds until the run ends.
pub(crate) const UNFINISHED: &str = "unfinished";

/// Add a run's row from its record's header (`header_line` its text), with `outcome` until
/// the record is read: the row's id.
fn insert_run(
    conn: &Connection,
    header: &Header,
    header_line: &str,
    outcome: &str,
    wall_ms: i64,
) -> rusqlite::Result<i64> {
    conn.execute(
        "INSERT INTO runs (prompt, prompt_sha256, seed, started_at, args, model, outcome,
             wall_ms, rounds, prompt_tokens, completion_tokens, header, events, cancels,
             outcome_json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, 0, 0, ?9, '', '[]', 'null')",
        params![
            header.prompt.path.display().to_string(),
            header.prompt.sha256,
            header.seed.to_string(),
            header.when,
            header.args,
            header.host.model.as_ref().map(|m| m.id.clone()),
            outcome,
            wall_ms,
            header_line,
        ],
    )?;
    Ok(conn.last_insert_rowid())
}

/// Where a history keeps the journal of run `id`: `journal/` beside the database, named after
/// it (two histories in one folder keep apart).
fn journal_path(db: &Path, id: i64) -> PathBuf {
    let stem = db
        .file_stem()
        .map_or_else(|| "history".into(), |s| s.to_string_lossy());
    journal_dir(db).join(format!("{stem}-{id}.jsonl"))
}

/// Whether a run is still writing this journal: its process holds a lock on it for as long as
/// it runs, and the system lets go of it when the process ends, however it ends.
pub(crate) fn is_running(journal: &Path) -> bool {
    std::fs::File::open(journal)
        .and_then(|file| crate::record::take_lock(&file))
        .is_ok_and(|taken| !taken)
}

/// The history row of the run this process is running, for [`abandon_started`].
static STARTED: std::sync::Mutex<Option<(PathBuf, i64)>> = std::sync::Mutex::new(None);

/// Note the run this process is running (its history and row), or that it has none.
pub(crate) fn started(history: Option<&Path>, row: Option<i64>) {
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    *started = history.zip(row).map(|(db, id)| (db.to_path_buf(), id));
}

/// The process ends the run it is running as cancelled before the run could end itself (a
/// cancel's grace ran out): its row says `cancelled`, so it is never resumed (it had
/// its one outcome), and its journal goes.
pub(crate) fn abandon_started() {
    let started = STARTED.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some((db, id)) = started else {
        return;
    };
    if let Ok(history) = History::open(&db) {
        let journal: Option<String> = history
            .conn
            .query_row("SELECT journal FROM runs WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()
            .ok()
            .flatten()
            .flatten();
        let updated = history.conn.execute(
            "UPDATE runs SET outcome = 'cancelled', outcome_json = ?2, journal = NULL
             WHERE id = ?1 AND outcome = 'unfinished'",
            params![id, json!({"outcome": "cancelled"}).to_string()],
        );
        if let (Ok(1), Some(journal)) = (updated, journal)
            && owns_journal(&db, Path::new(&journal))
        {
            let _ = std::fs::remove_file(journal);
        }
    }
}

/// Whether `journal` is one of this history's own journal files (not a run's `--record`).
pub(crate) fn owns_journal(db: &Path, journal: &Path) -> bool {
    journal.starts_with(journal_dir(db))
}

/// The folder of a history's journals.
fn journal_dir(db: &Path) -> PathBuf {
    db.parent().unwrap_or(Path::new(".")).join("journal")
}

/// What became of a run that `resume` was asked for.
#[derive(Debug)]
pub(crate) enum Unfinished {
    /// It ended with this outcome.
    Ended(String),
    /// It has not ended, and this is its journal.
    Journal(PathBuf),
    /// It has not ended, and kept no journal (killed before its first step was written).
    NoJournal,
}

/// One row of [`History::recent`].
#[derive(Debug)]
pub(crate) struct RunRow {
    pub id: i64,
    pub started_at: String,
    pub prompt: String,
    pub outcome: String,
    pub error_kind: Option<String>,
    pub wall_ms: i64,
    pub rounds: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub model: Option<String>,
    pub seed: String,
    /// Dollars, when the model's price was known and every reply reported its tokens.
    pub cost: Option<f64>,
    /// Rounds answered from the response cache.
    pub cached_rounds: i64,
}

/// An open history database.
#[derive(Debug)]
pub(crate) struct History {
    conn: Connection,
    /// The private copy a read-only history is read from, removed after the connection.
    _copy: Option<tempfile::TempDir>,
}

fn sql_error(path: &Path) -> impl Fn(rusqlite::Error) -> String + '_ {
    move |e| format!("the run history {}: {e}", path.display())
}

impl History {
    /// Open (creating it and its directory if need be) the database at `path`.
    pub(crate) fn open(path: &Path) -> Result<History, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("the run history {}: {e}", dir.display()))?;
        }
        let err = sql_error(path);
        let conn = Connection::open(path).map_err(&err)?;
        // Parallel runs each write once, at their end; they wait for each other rather
        // than fail.
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(&err)?;
        // No checkpoint when the connection closes: every `run` is its own process, and
        // folding the write-ahead log into the database at each exit cost five fsyncs a run
        // (about a millisecond on a virtual disk, and most of the jitter in timing a run).
        // SQLite still checkpoints as the log grows past its threshold, during a write, and
        // the log is part of the database: a reader sees it, and a crash loses nothing
        // already committed.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(&err)?;
        conn.execute_batch(
            "PRAGMA auto_vacuum = INCREMENTAL;
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA foreign_keys = ON;
             CREATE TABLE IF NOT EXISTS runs (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 prompt TEXT NOT NULL,
                 prompt_sha256 TEXT NOT NULL,
                 seed TEXT NOT NULL,
                 started_at TEXT NOT NULL,
                 args TEXT,
                 model TEXT,
                 outcome TEXT NOT NULL,
                 error_kind TEXT,
                 error_message TEXT,
                 wall_ms INTEGER NOT NULL,
                 rounds INTEGER NOT NULL,
                 prompt_tokens INTEGER NOT NULL,
                 completion_tokens INTEGER NOT NULL,
                 header TEXT NOT NULL,
                 events TEXT NOT NULL,
                 cancels TEXT NOT NULL,
                 outcome_json TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS effects (
                 run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                 effect_id INTEGER NOT NULL,
                 kind TEXT NOT NULL,
                 request TEXT NOT NULL,
                 issued_ms INTEGER,
                 answer TEXT,
                 answer_step INTEGER,
                 answer_seq INTEGER,
                 answered_ms INTEGER,
                 withdrawn INTEGER NOT NULL DEFAULT 0,
                 task TEXT,
                 PRIMARY KEY (run_id, effect_id)
             );
             CREATE TABLE IF NOT EXISTS events (
                 run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                 seq INTEGER NOT NULL,
                 line TEXT NOT NULL,
                 PRIMARY KEY (run_id, seq)
             );",
        )
        .map_err(&err)?;
        // The log is cut back to this after a checkpoint (see `bound_log`).
        conn.pragma_update(None, "journal_size_limit", WAL_LIMIT as i64)
            .map_err(&err)?;
        // A database from before a column was added gets it. Runs start in parallel and each
        // opens the history as it starts: when a column is missing, the check and the change
        // go in one write transaction (taken at once, waiting its turn), so two never add the
        // same column; a database already complete is only read (no write lock at every open).
        let mut complete = true;
        for (table, column, _) in ADDED_COLUMNS {
            complete &= has_column(&conn, table, column).map_err(&err)?;
        }
        if complete {
            return Ok(History { conn, _copy: None });
        }
        conn.execute_batch("BEGIN IMMEDIATE").map_err(&err)?;
        let added = ADDED_COLUMNS
            .into_iter()
            .try_for_each(|(table, column, declaration)| {
                add_missing_column(&conn, table, column, declaration)
            });
        match added {
            Ok(()) => conn.execute_batch("COMMIT").map_err(&err)?,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(err(e));
            }
        }
        Ok(History { conn, _copy: None })
    }

    /// Open an existing database only to read it. Reading needs no write: a history in a
    /// folder this process cannot write to is still listed, shown and exported. When the
    /// normal open fails, the file is opened read-only; when SQLite cannot even read it in
    /// place (its write-ahead index cannot be made there), a copy of the database and its
    /// write-ahead log (where the newest runs are) is read instead.
    pub(crate) fn open_read(path: &Path) -> Result<History, String> {
        let first = match History::open(path) {
            Ok(history) => return Ok(history),
            Err(e) => e,
        };
        let readable = |conn: Connection| -> Option<History> {
            conn.query_row("SELECT COUNT(*) FROM runs", [], |r| r.get::<_, i64>(0))
                .ok()
                .map(|_| History { conn, _copy: None })
        };
        if let Ok(conn) =
            Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            && let Some(history) = readable(conn)
        {
            return Ok(history);
        }
        // A private copy: SQLite recovers the log into it as it opens it.
        let dir = tempfile::tempdir().map_err(|_| first.clone())?;
        let copy = dir.path().join("history.sqlite3");
        std::fs::copy(path, &copy).map_err(|_| first.clone())?;
        let wal = PathBuf::from(format!("{}-wal", path.display()));
        if wal.is_file() {
            std::fs::copy(&wal, format!("{}-wal", copy.display())).map_err(|_| first.clone())?;
        }
        let conn = Connection::open(&copy).map_err(|_| first.clone())?;
        let mut history = readable(conn).ok_or(first)?;
        history._copy = Some(dir);
        Ok(history)
    }

    /// A run starts: its row goes in at once (outcome `unfinished`), so a run that never
    /// ends (killed, crashed) is still listed and can be resumed from its journal, the file
    /// this returns, which the run's recorder writes as it goes (see `record::Recorder`).
    /// `journal` is the run's `--record` file, when it has one (the record is the journal).
    pub(crate) fn begin(
        &mut self,
        header: &Header,
        journal: Option<&Path>,
    ) -> Result<(i64, PathBuf), String> {
        let err = |e: rusqlite::Error| format!("the run history: {e}");
        let header_line = serde_json::to_string(header).map_err(|e| e.to_string())?;
        let id = insert_run(&self.conn, header, &header_line, UNFINISHED, 0).map_err(err)?;
        let db = self.conn.path().map(PathBuf::from).unwrap_or_default();
        let journal = journal.map_or_else(|| journal_path(&db, id), Path::to_path_buf);
        self.conn
            .execute(
                "UPDATE runs SET journal = ?2 WHERE id = ?1",
                params![id, journal.display().to_string()],
            )
            .map_err(err)?;
        Ok((id, journal))
    }

    /// Drop the row of a run that went in as it started but could not keep a journal (it is
    /// added again, whole, when it ends).
    pub(crate) fn forget(&mut self, id: i64) -> Result<(), String> {
        self.conn
            .execute(
                "DELETE FROM runs WHERE id = ?1 AND outcome = 'unfinished'",
                params![id],
            )
            .map(|_| ())
            .map_err(|e| format!("the run history: {e}"))
    }

    /// Run `id` as `resume` needs it: whether it ended, and its journal.
    pub(crate) fn unfinished(&self, id: i64) -> Result<Unfinished, String> {
        let row: Option<(String, Option<String>)> = self
            .conn
            .query_row(
                "SELECT outcome, journal FROM runs WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| format!("the run history: {e}"))?;
        match row {
            None => Err(format!(
                "no run {id} in the history (`promptforge runs` lists them)"
            )),
            Some((outcome, _)) if outcome != UNFINISHED => Ok(Unfinished::Ended(outcome)),
            Some((_, None)) => Ok(Unfinished::NoJournal),
            Some((_, Some(journal))) => Ok(Unfinished::Journal(PathBuf::from(journal))),
        }
    }

    /// Keep a run: its record (as `run --record` writes it) and how long it took. The
    /// record is read a line at a time and written as it is read, so memory does not grow
    /// with the run.
    /// The cost is kept when the model's price is known and every reply reported its tokens.
    /// A run that went in when it started ([`History::begin`]) is `started`: its row is
    /// completed (and its journal forgotten) rather than a second one added.
    pub(crate) fn add(
        &mut self,
        record: impl BufRead,
        wall_ms: u64,
        price: Option<&promptforge_harness::model::Price>,
        started: Option<i64>,
    ) -> Result<i64, String> {
        let err = |e: rusqlite::Error| format!("the run history: {e}");
        let mut lines = record.lines();
        let header_line = match lines.next() {
            Some(line) => line.map_err(|e| format!("cannot read the run's record: {e}"))?,
            None => return Err("the run's record is empty".to_owned()),
        };
        let header: Header = serde_json::from_str(&header_line)
            .map_err(|e| format!("the run's record has no header: {e}"))?;
        let tx = self.conn.transaction().map_err(err)?;
        // The row made when the run started, unless it was pruned meanwhile.
        let updated = match started {
            Some(id) => {
                tx.execute("DELETE FROM effects WHERE run_id = ?1", params![id])
                    .map_err(err)?;
                tx.execute("DELETE FROM events WHERE run_id = ?1", params![id])
                    .map_err(err)?;
                tx.execute(
                    "UPDATE runs SET wall_ms = ?2, header = ?3, journal = NULL WHERE id = ?1",
                    params![id, wall_ms as i64, header_line],
                )
                .map_err(err)?
                    == 1
            }
            None => false,
        };
        let run_id = match (updated, started) {
            (true, Some(id)) => id,
            _ => insert_run(&tx, &header, &header_line, "unknown", wall_ms as i64).map_err(err)?,
        };
        let mut cancels: Vec<u64> = Vec::new();
        let mut outcome = Json::Null;
        let (mut rounds, mut prompt_tokens, mut completion_tokens) = (0i64, 0i64, 0i64);
        let mut unmetered = 0i64;
        let mut cached_rounds = 0i64;
        // A model reply counts as a round, with the tokens it reports.
        let mut count_reply = |reply: &Json| {
            rounds += 1;
            let usage = &reply["usage"];
            if !usage.is_object() {
                unmetered += 1;
            }
            prompt_tokens += usage["prompt_tokens"].as_i64().unwrap_or(0);
            completion_tokens += usage["completion_tokens"].as_i64().unwrap_or(0);
        };
        {
            let mut insert = tx
                .prepare(
                    "INSERT INTO effects (run_id, effect_id, kind, request, issued_ms, task)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(err)?;
            let mut answer = tx
                .prepare(
                    "UPDATE effects SET answer = ?3, answer_step = ?4, answer_seq = ?5,
                         answered_ms = ?6
                     WHERE run_id = ?1 AND effect_id = ?2 RETURNING kind",
                )
                .map_err(err)?;
            let mut withdraw = tx
                .prepare("UPDATE effects SET withdrawn = 1 WHERE run_id = ?1 AND effect_id = ?2")
                .map_err(err)?;
            let mut event = tx
                .prepare("INSERT INTO events (run_id, seq, line) VALUES (?1, ?2, ?3)")
                .map_err(err)?;
            // Events are most of a long run's lines: they are kept in chunks of lines (one
            // row per 64 KiB, not one per event), and recognised by their opening, which the
            // recorder writes (keys in order, `event` first), without parsing them.
            let mut chunk = String::new();
            let mut last_seq = 0usize;
            for (seq, line) in lines.enumerate() {
                let line = line.map_err(|e| format!("cannot read the run's record: {e}"))?;
                if line.starts_with(r#"{"event":"#) {
                    if !chunk.is_empty() {
                        chunk.push('\n');
                    }
                    chunk.push_str(&line);
                    last_seq = seq;
                    if chunk.len() >= EVENT_CHUNK {
                        event
                            .execute(params![run_id, seq as i64, chunk])
                            .map_err(err)?;
                        chunk.clear();
                    }
                    continue;
                }
                let value: Json = serde_json::from_str(&line)
                    .map_err(|e| format!("the run's record holds a bad line: {e}"))?;
                let num = |key: &str| value.get(key).and_then(Json::as_u64);
                let t = num("t").map(|t| t as i64);
                if let (Some(id), Some(request)) = (num("effect"), value.get("request")) {
                    insert
                        .execute(params![
                            run_id,
                            id as i64,
                            request.get("effect").and_then(Json::as_str).unwrap_or(""),
                            request.to_string(),
                            t,
                            value.get("task").and_then(Json::as_str),
                        ])
                        .map_err(err)?;
                } else if let (Some(id), Some(answered)) = (num("answer"), value.get("value")) {
                    let from_cache = value.get("cached").and_then(Json::as_bool) == Some(true);
                    let value = answered;
                    // An answer the run never took has no step (it still cost its tokens).
                    let step = num("step").map(|s| s as i64);
                    let kind: Option<String> = answer
                        .query_row(
                            params![run_id, id as i64, value.to_string(), step, seq as i64, t],
                            |r| r.get(0),
                        )
                        .optional()
                        .map_err(err)?;
                    if kind.as_deref() == Some("model_round")
                        && let Some(reply) = value.get("value")
                    {
                        count_reply(reply);
                        if from_cache {
                            cached_rounds += 1;
                        }
                    }
                } else if value.get("uncommitted").and_then(Json::as_str) == Some("model_round") {
                    // A reply to a round sent ahead and never committed: it cost all the same.
                    if let Some(reply) = value["value"].get("value") {
                        count_reply(reply);
                    }
                } else if let Some(id) = num("withdrawn") {
                    withdraw.execute(params![run_id, id as i64]).map_err(err)?;
                } else if let Some(step) = num("cancel") {
                    cancels.push(step);
                } else if let Some(o) = value.get("outcome") {
                    outcome = o.clone();
                }
            }
            if !chunk.is_empty() {
                event
                    .execute(params![run_id, last_seq as i64, chunk])
                    .map_err(err)?;
            }
        }
        let cost = price.filter(|_| unmetered == 0).map(|price| {
            price.cost(&promptforge_harness::model::Usage {
                prompt_tokens: u64::try_from(prompt_tokens).unwrap_or(0),
                completion_tokens: u64::try_from(completion_tokens).unwrap_or(0),
                reasoning_tokens: None,
            })
        });
        tx.execute(
            "UPDATE runs SET outcome = ?2, error_kind = ?3, error_message = ?4, rounds = ?5,
                 prompt_tokens = ?6, completion_tokens = ?7, cancels = ?8, outcome_json = ?9,
                 cost = ?10, cached_rounds = ?11
             WHERE id = ?1",
            params![
                run_id,
                outcome["outcome"].as_str().unwrap_or("unknown"),
                outcome["error"]["kind"].as_str(),
                outcome["error"]["message"].as_str(),
                rounds,
                prompt_tokens,
                completion_tokens,
                json!(cancels).to_string(),
                outcome.to_string(),
                cost,
                cached_rounds,
            ],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        self.prune()?;
        self.bound_log()?;
        Ok(run_id)
    }

    /// Keep the write-ahead log small on disk: after a large run (or a prune) it is folded
    /// into the database and cut back to nothing. A small run leaves it as it is (no
    /// checkpoint on close; see `open`).
    fn bound_log(&mut self) -> Result<(), String> {
        let err = |e: rusqlite::Error| format!("the run history: {e}");
        let wal = self.conn.path().map(|p| format!("{p}-wal"));
        let big = wal
            .and_then(|wal| std::fs::metadata(wal).ok())
            .is_some_and(|m| m.len() > WAL_LIMIT);
        if big {
            self.conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(err)?;
        }
        Ok(())
    }

    /// Drop the oldest runs while the database is over its cap.
    fn prune(&mut self) -> Result<(), String> {
        let err = |e: rusqlite::Error| format!("the run history: {e}");
        let cap = cap_bytes();
        let size = |conn: &Connection| -> Result<u64, String> {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .map_err(err)?;
            let free: i64 = conn
                .query_row("PRAGMA freelist_count", [], |r| r.get(0))
                .map_err(err)?;
            let page: i64 = conn
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .map_err(err)?;
            Ok(((pages - free).max(0) * page) as u64)
        };
        if size(&self.conn)? <= cap {
            return Ok(());
        }
        // Over the cap: down to four fifths of it, so that a history at its cap prunes once
        // in many runs rather than on every one.
        let target = cap / 5 * 4;
        let mut rounds = 0;
        while size(&self.conn)? > target && rounds < 1000 {
            rounds += 1;
            // A tenth of the runs (at least one), oldest first.
            let count: i64 = self
                .conn
                .query_row(
                    "SELECT COUNT(*) FROM runs WHERE outcome != 'unfinished'",
                    [],
                    |r| r.get(0),
                )
                .map_err(err)?;
            if count <= 1 {
                break;
            }
            let drop = (count / 10).max(1);
            self.conn
                .execute(
                    // A run that has not ended keeps its row: it may still be running, or
                    // be resumed (its journal is outside the database).
                    "DELETE FROM runs WHERE id IN
                         (SELECT id FROM runs WHERE outcome != 'unfinished' ORDER BY id LIMIT ?1)",
                    params![drop],
                )
                .map_err(err)?;
        }
        if rounds > 0 {
            // Return the freed pages to the file system. The pragma frees one page per step:
            // step it to the end (a batch steps each statement once).
            let mut stmt = self
                .conn
                .prepare("PRAGMA incremental_vacuum")
                .map_err(err)?;
            let mut rows = stmt.query([]).map_err(err)?;
            while rows.next().map_err(err)?.is_some() {}
            drop(rows);
            drop(stmt);
            self.conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(err)?;
        }
        Ok(())
    }

    /// Write run `id`'s record, as `run --record` would have.
    /// The most recent `limit` runs, newest first.
    pub(crate) fn recent(&self, limit: u32) -> Result<Vec<RunRow>, String> {
        let err = |e: rusqlite::Error| format!("the run history: {e}");
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, started_at, prompt, outcome, error_kind, wall_ms, rounds,
                        prompt_tokens, completion_tokens, model, seed, cost, cached_rounds,
                        journal
                 FROM runs ORDER BY id DESC LIMIT ?1",
            )
            .map_err(err)?;
        stmt.query_map(params![limit], |r| {
            let outcome: String = r.get(3)?;
            let journal: Option<String> = r.get(13)?;
            // A run that has not ended is `running` while its process holds its journal.
            let outcome = match journal {
                Some(journal) if outcome == UNFINISHED && is_running(Path::new(&journal)) => {
                    "running".to_owned()
                }
                _ => outcome,
            };
            Ok(RunRow {
                id: r.get(0)?,
                started_at: r.get(1)?,
                prompt: r.get(2)?,
                outcome,
                error_kind: r.get(4)?,
                wall_ms: r.get(5)?,
                rounds: r.get(6)?,
                prompt_tokens: r.get(7)?,
                completion_tokens: r.get(8)?,
                model: r.get(9)?,
                seed: r.get(10)?,
                cost: r.get(11)?,
                cached_rounds: r.get(12)?,
            })
        })
        .map_err(err)?
        .collect::<Result<_, _>>()
        .map_err(err)
    }

    /// A run id as a user gives it: a number, or `last` for the newest run.
    pub(crate) fn resolve(&self, id: &str) -> Result<i64, String> {
        if id == "last" {
            let last: Option<i64> = self
                .conn
                .query_row("SELECT MAX(id) FROM runs", [], |r| r.get(0))
                .map_err(|e| format!("the run history: {e}"))?;
            return last.ok_or_else(|| "the run history has no runs yet".to_owned());
        }
        id.parse().map_err(|_| {
            format!("`{id}` is not a run id: give a number from `promptforge runs`, or `last`")
        })
    }

    pub(crate) fn export(&self, id: i64, out: &mut dyn Write) -> Result<(), String> {
        let err = |e: rusqlite::Error| format!("the run history: {e}");
        let row: Option<(String, String, String, String)> = self
            .conn
            .query_row(
                "SELECT header, events, cancels, outcome_json FROM runs WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(err)?;
        let Some((header, events, cancels, outcome)) = row else {
            return Err(format!(
                "no run {id} in the history (`promptforge runs` lists them)"
            ));
        };
        if outcome == "null" {
            return Err(format!(
                "run {id} has not ended, so it has no record yet; if its process is gone, `promptforge resume {id}` continues it"
            ));
        }
        let io = |e: std::io::Error| format!("cannot write the record: {e}");
        writeln!(out, "{header}").map_err(io)?;
        // Each query streams its rows straight out, so an export of a long run holds one
        // row at a time.
        let mut withdrawn: Vec<i64> = Vec::new();
        let mut stmt = self
            .conn
            .prepare(
                "SELECT effect_id, request, issued_ms, withdrawn, task
                 FROM effects WHERE run_id = ?1 ORDER BY effect_id",
            )
            .map_err(err)?;
        let mut rows = stmt.query(params![id]).map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            let effect: i64 = row.get(0).map_err(err)?;
            let request: String = row.get(1).map_err(err)?;
            let issued: Option<i64> = row.get(2).map_err(err)?;
            let task: Option<String> = row.get(4).map_err(err)?;
            if row.get::<_, bool>(3).map_err(err)? {
                withdrawn.push(effect);
            }
            writeln!(
                out,
                r#"{{"effect":{effect},"request":{request},"task":{},"t":{}}}"#,
                json!(task),
                issued.unwrap_or(0)
            )
            .map_err(io)?;
        }
        // Answers in the order they were handed over.
        let mut stmt = self
            .conn
            .prepare(
                "SELECT effect_id, answer, answer_step, answered_ms FROM effects
                 WHERE run_id = ?1 AND answer IS NOT NULL ORDER BY answer_seq",
            )
            .map_err(err)?;
        let mut rows = stmt.query(params![id]).map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            let effect: i64 = row.get(0).map_err(err)?;
            let answer: String = row.get(1).map_err(err)?;
            let step: Option<i64> = row.get(2).map_err(err)?;
            let answered: Option<i64> = row.get(3).map_err(err)?;
            match step {
                Some(step) => writeln!(
                    out,
                    r#"{{"answer":{effect},"value":{answer},"step":{step},"t":{}}}"#,
                    answered.unwrap_or(0)
                ),
                None => writeln!(
                    out,
                    r#"{{"answer":{effect},"value":{answer},"t":{}}}"#,
                    answered.unwrap_or(0)
                ),
            }
            .map_err(io)?;
        }
        for effect in withdrawn {
            writeln!(out, r#"{{"withdrawn":{effect}}}"#).map_err(io)?;
        }
        let cancels: Vec<u64> = serde_json::from_str(&cancels).unwrap_or_default();
        for step in cancels {
            writeln!(out, r#"{{"cancel":{step}}}"#).map_err(io)?;
        }
        // Runs kept before events had a table of their own hold them in `runs.events`.
        out.write_all(events.as_bytes()).map_err(io)?;
        let mut stmt = self
            .conn
            .prepare("SELECT line FROM events WHERE run_id = ?1 ORDER BY seq")
            .map_err(err)?;
        let mut rows = stmt.query(params![id]).map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            let line: String = row.get(0).map_err(err)?;
            writeln!(out, "{line}").map_err(io)?;
        }
        writeln!(out, r#"{{"outcome":{outcome}}}"#).map_err(io)?;
        Ok(())
    }
}

pub(crate) fn open_existing() -> Result<(History, PathBuf), String> {
    let Some(path) = location() else {
        return Err("the run history is off (PROMPTFORGE_HISTORY=off)".to_owned());
    };
    if !path.exists() {
        return Err(format!(
            "no run history yet at {} (every `promptforge run` adds to it)",
            path.display()
        ));
    }
    Ok((History::open_read(&path)?, path))
}

/// Export run `id` into a temporary record file (for `replay ID`).
pub(crate) fn export_to_temp(id: &str) -> Result<tempfile::NamedTempFile, String> {
    let (history, _) = open_existing()?;
    let id = history.resolve(id)?;
    let mut file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    {
        let mut out = std::io::BufWriter::new(file.as_file_mut());
        history.export(id, &mut out)?;
        out.flush().map_err(|e| e.to_string())?;
    }
    Ok(file)
}
