//! The response cache (`--cache`): a model round whose request was answered before is
//! answered again from SQLite, with the reply and usage it had then.
//!
//! The key (see `docs/devloop.md`) is the model's identity (catalog id, base URL, wire name),
//! the request as sent (messages, tools, settings), and the round's place in the run: the task
//! that made it and how many identical requests that task made before it, plus the batch
//! repeat. So two identical requests in one run, and the repeats of a batch input, stay
//! independent answers (a cache that collapses them turns samples into copies), while the
//! same run made again finds every answer. A task's own sequence of rounds does not depend on
//! timing, so the key is the same however answers arrive. Only replies are kept: an error, a
//! refusal, an overflow or a cancelled round is never cached.
//!
//! The file lives beside the run history (`$PROMPTFORGE_CACHE_FILE`, else `cache.sqlite3` in
//! the user's data directory), in WAL mode with a busy timeout so parallel runs and batches
//! share it. Entries older than the TTL are neither read nor kept; past the size cap the
//! oldest go first.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

/// The default time an entry is kept: 14 days.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(14 * 24 * 3600);

/// The default size cap.
const DEFAULT_CAP_MB: u64 = 256;

/// Where the cache lives.
pub(crate) fn location() -> Option<PathBuf> {
    match std::env::var_os("PROMPTFORGE_CACHE_FILE") {
        Some(value) if !value.is_empty() => Some(PathBuf::from(value)),
        _ => dirs::data_dir().map(|d| d.join("promptforge").join("cache.sqlite3")),
    }
}

/// Whether `PROMPTFORGE_CACHE` turns the cache on.
pub(crate) fn on_by_environment() -> bool {
    matches!(
        std::env::var("PROMPTFORGE_CACHE").as_deref().map(str::trim),
        Ok("on" | "1" | "true" | "yes")
    )
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// An open cache file.
#[derive(Debug)]
pub(crate) struct ResponseCache {
    conn: Connection,
    ttl: Duration,
    cap_bytes: u64,
}

/// What `cache stats` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stats {
    pub entries: u64,
    pub bytes: u64,
    pub hits: u64,
    pub oldest: Option<i64>,
}

impl ResponseCache {
    /// Open (or create) the cache at `path`.
    pub(crate) fn open(path: &Path, ttl: Duration) -> Result<ResponseCache, String> {
        let err = |e: rusqlite::Error| format!("the response cache {}: {e}", path.display());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(err)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS responses (
                 key TEXT PRIMARY KEY,
                 answer TEXT NOT NULL,
                 created INTEGER NOT NULL,
                 bytes INTEGER NOT NULL,
                 hits INTEGER NOT NULL DEFAULT 0
             );
             CREATE INDEX IF NOT EXISTS responses_created ON responses (created);",
        )
        .map_err(err)?;
        let cap_bytes = std::env::var("PROMPTFORGE_CACHE_MAX_MB")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_CAP_MB)
            .saturating_mul(1024 * 1024);
        Ok(ResponseCache {
            conn,
            ttl,
            cap_bytes,
        })
    }

    fn oldest_kept(&self) -> i64 {
        now_secs().saturating_sub(i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX))
    }

    /// The answer kept under `key`, if it is there and fresh.
    pub(crate) fn get(&self, key: &str) -> Option<Json> {
        let text: Option<String> = self
            .conn
            .query_row(
                "UPDATE responses SET hits = hits + 1 WHERE key = ?1 AND created >= ?2
                 RETURNING answer",
                params![key, self.oldest_kept()],
                |r| r.get(0),
            )
            .optional()
            .ok()
            .flatten();
        text.and_then(|t| serde_json::from_str(&t).ok())
    }

    /// Keep `answer` under `key`, then drop what is stale or over the cap.
    pub(crate) fn put(&self, key: &str, answer: &Json) -> Result<(), String> {
        let err = |e: rusqlite::Error| format!("the response cache: {e}");
        let text = answer.to_string();
        self.conn
            .execute(
                "INSERT OR REPLACE INTO responses (key, answer, created, bytes) VALUES (?1, ?2, ?3, ?4)",
                params![key, text, now_secs(), text.len() as i64],
            )
            .map_err(err)?;
        // Eviction keeps what any user of the shared file may still read: the default TTL,
        // or this run's when it is longer (a short `--cache-ttl` only reads less).
        let keep = self.ttl.max(DEFAULT_TTL);
        let oldest = now_secs().saturating_sub(i64::try_from(keep.as_secs()).unwrap_or(i64::MAX));
        self.conn
            .execute("DELETE FROM responses WHERE created < ?1", params![oldest])
            .map_err(err)?;
        let total: i64 = self
            .conn
            .query_row("SELECT COALESCE(SUM(bytes), 0) FROM responses", [], |r| {
                r.get(0)
            })
            .map_err(err)?;
        if total as u64 > self.cap_bytes {
            // The oldest go first, until what is left fits.
            self.conn
                .execute(
                    "DELETE FROM responses WHERE key IN (
                         SELECT key FROM (
                             SELECT key, SUM(bytes) OVER (ORDER BY created DESC, key) AS running
                             FROM responses)
                         WHERE running > ?1)",
                    params![self.cap_bytes as i64],
                )
                .map_err(err)?;
        }
        Ok(())
    }

    /// How much is kept.
    pub(crate) fn stats(&self) -> Result<Stats, String> {
        self.conn
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(hits), 0), MIN(created)
                 FROM responses",
                [],
                |r| {
                    Ok(Stats {
                        entries: r.get::<_, i64>(0)? as u64,
                        bytes: r.get::<_, i64>(1)? as u64,
                        hits: r.get::<_, i64>(2)? as u64,
                        oldest: r.get(3)?,
                    })
                },
            )
            .map_err(|e| format!("the response cache: {e}"))
    }

    /// Drop every entry (or those older than `older_than`); how many went.
    pub(crate) fn clear(&self, older_than: Option<Duration>) -> Result<u64, String> {
        let before = match older_than {
            Some(age) => {
                now_secs().saturating_sub(i64::try_from(age.as_secs()).unwrap_or(i64::MAX))
            }
            None => i64::MAX,
        };
        let n = self
            .conn
            .execute("DELETE FROM responses WHERE created < ?1", params![before])
            .map_err(|e| format!("the response cache: {e}"))?;
        Ok(n as u64)
    }
}

/// A run's use of the cache: the shared file, the batch repeat, and how many identical
/// requests each task has made so far.
#[derive(Debug)]
pub(crate) struct RunCache {
    pub(crate) cache: Arc<Mutex<ResponseCache>>,
    pub(crate) repeat: u32,
    seen: std::collections::HashMap<(String, String), u32>,
}

impl RunCache {
    pub(crate) fn new(cache: Arc<Mutex<ResponseCache>>, repeat: u32) -> RunCache {
        RunCache {
            cache,
            repeat,
            seen: std::collections::HashMap::new(),
        }
    }

    /// The key of a round: `model` the model's identity (id, base URL, wire name), `request`
    /// the request as sent, `task` the task that made it.
    pub(crate) fn key(&mut self, model: &Json, request: &Json, task: &str) -> String {
        let digest = |value: &Json| hex(&Sha256::digest(value.to_string().as_bytes()));
        let request_digest = digest(&json!({"model": model, "request": request}));
        let count = self
            .seen
            .entry((task.to_owned(), request_digest.clone()))
            .or_insert(0);
        let occurrence = *count;
        *count += 1;
        digest(&json!({
            "v": 1,
            "request": request_digest,
            "task": task,
            "occurrence": occurrence,
            "repeat": self.repeat,
        }))
    }

    pub(crate) fn get(&self, key: &str) -> Option<Json> {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[test]
    fn kept_answers_come_back_and_clear_empties() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ResponseCache::open(&dir.path().join("c.sqlite3"), DEFAULT_TTL).unwrap();
        assert_eq!(cache.get("k"), None);
        cache.put("k", &json!({"text": "hi"})).unwrap();
        assert_eq!(cache.get("k"), Some(json!({"text": "hi"})));
        let stats = cache.stats().unwrap();
        assert_eq!((stats.entries, stats.hits), (1, 1));
        assert_eq!(cache.clear(Some(Duration::from_secs(3600))).unwrap(), 0);
        assert_eq!(cache.clear(None).unwrap(), 1);
        assert_eq!(cache.get("k"), None);
    }

    #[test]
    fn identical_requests_of_one_task_and_repeats_have_their_own_keys() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(Mutex::new(
            ResponseCache::open(&dir.path().join("c.sqlite3"), DEFAULT_TTL).unwrap(),
        ));
        let model = json!({"id": "m"});
        let request = json!({"messages": ["hi"]});
        let mut run = RunCache::new(cache.clone(), 0);
        let first = run.key(&model, &request, "0");
        let second = run.key(&model, &request, "0");
        let other_task = run.key(&model, &request, "0.1");
        assert!(first != second && first != other_task);
        // The same run again gives the same keys in the same order.
        let mut again = RunCache::new(cache.clone(), 0);
        assert_eq!(again.key(&model, &request, "0"), first);
        assert_eq!(again.key(&model, &request, "0"), second);
        // Another repeat of a batch input gets its own.
        let mut repeat = RunCache::new(cache, 1);
        assert_ne!(repeat.key(&model, &request, "0"), first);
    }
}
