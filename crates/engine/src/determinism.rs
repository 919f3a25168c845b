//! The store's happens-before checker (chapter 09, "Sharing the store across calls and tasks").
//!
//! Every chain of a run (the walk, each task, each fanout arm) gets a [`ChainRef`] and a vector
//! clock. A chain or task start is a [`Claims::fork`]: everything the parent did so far comes
//! ahead of everything the child does. Delivering a result is a [`Claims::join`]: everything the
//! finished chain did comes ahead of the waiter's next step (`tasks.join`, `tasks.join_any`, a
//! task notice, a fanout returning, a chain's end joining the tasks it owns). A `call` shares
//! its caller's identity, so the engine keeps using the caller's [`ChainRef`] for it.
//!
//! Every store call makes a claim ([`Access`]) before it reaches the store. Two claims conflict
//! when they come from different chains, neither is ordered before the other, at least one
//! writes, and they touch one region; the later claim is refused with a [`Violation`] and
//! never reaches the store. Regions:
//!
//! | later \ earlier | `Read(q)`                 | `Write(q)`                       | `Glob(g)`            |
//! |-----------------|---------------------------|----------------------------------|----------------------|
//! | `Read(p)`       | never                     | `p` and `q` nested or equal      | never                |
//! | `Write(p)`      | `p` and `q` nested or equal | `p` and `q` nested or equal    | `g` touches `p`      |
//! | `Glob(g)`       | never                     | `g` touches `q`                  | never                |
//!
//! "Nested or equal" means one path is the other or lies beneath it (`notes` and
//! `notes/a.txt`): a write creates its parent directories and fails under a file, and a delete
//! of a directory depends on what lies beneath it, so both orders are observable. A file
//! pattern touches a path it matches; a directory pattern (ending in `/`) touches a path that
//! it, or one of the path's parent directories, matches.
//!
//! The checker keeps, per path (and per glob pattern) and per chain, only the latest read and
//! write tick: if an earlier claim of a chain is unordered with a new claim, so is every later
//! claim of that chain, so the latest one decides. Clocks are shared copy-on-write snapshots,
//! so forking thousands of arms and joining them back costs little.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::outcome::{RunError, RunErrorKind};
use crate::store_path::{GlobPattern, StoreError, StoreOp, validate_path};

/// The two kinds of claim a message names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimKind {
    /// `store.read`, `store.read_numbered`, `store.exists`, `store.glob`.
    Read,
    /// `store.write`, `store.append`, `store.str_replace`, `store.delete`.
    Write,
}

impl ClaimKind {
    /// `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Read => "read",
            ClaimKind::Write => "write",
        }
    }
}

impl fmt::Display for ClaimKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one store call claims, on a valid logical path or a valid pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// A read of one path: `store.read`, `store.read_numbered`, `store.exists`.
    Read(String),
    /// A change to one path: `store.write`, `store.append`, `store.str_replace`, `store.delete`.
    Write(String),
    /// A listing: `store.glob`, which claims its pattern for reading.
    Glob(GlobPattern),
}

impl Access {
    /// The claim a store call makes, or the store error for a path or pattern that breaks a
    /// rule (a rejected call claims nothing).
    pub fn of(op: &StoreOp) -> Result<Access, StoreError> {
        match op {
            StoreOp::Glob { pattern } => GlobPattern::new(pattern)
                .map(Access::Glob)
                .map_err(|rule| StoreError::invalid_pattern(pattern, rule)),
            op => {
                let path = op.target();
                validate_path(path).map_err(|rule| StoreError::invalid_path(path, rule))?;
                Ok(if op.is_mutation() {
                    Access::Write(path.to_owned())
                } else {
                    Access::Read(path.to_owned())
                })
            }
        }
    }

    /// The claim kind the message names.
    pub fn kind(&self) -> ClaimKind {
        match self {
            Access::Write(_) => ClaimKind::Write,
            Access::Read(_) | Access::Glob(_) => ClaimKind::Read,
        }
    }

    /// The path, or the pattern, exactly as the prompt wrote it.
    pub fn target(&self) -> &str {
        match self {
            Access::Read(path) | Access::Write(path) => path,
            Access::Glob(pattern) => pattern.as_str(),
        }
    }
}

/// Whether one path is the other or lies beneath it.
pub fn nested_or_equal(a: &str, b: &str) -> bool {
    let beneath = |inner: &str, outer: &str| {
        inner.len() > outer.len()
            && inner.starts_with(outer)
            && inner.as_bytes().get(outer.len()) == Some(&b'/')
    };
    a == b || beneath(a, b) || beneath(b, a)
}

/// Whether a glob claim and a write to `path` touch one region.
pub fn pattern_touches(pattern: &GlobPattern, path: &str) -> bool {
    if pattern.is_match(path) {
        return true;
    }
    pattern.dirs_only()
        && path
            .match_indices('/')
            .any(|(index, _)| pattern.is_match(&path[..index]))
}

/// The conflict matrix: whether two claims from different, unordered chains conflict.
pub fn conflicts(a: &Access, b: &Access) -> bool {
    match (a, b) {
        (Access::Write(p), Access::Write(q))
        | (Access::Write(p), Access::Read(q))
        | (Access::Read(p), Access::Write(q)) => nested_or_equal(p, q),
        (Access::Write(p), Access::Glob(g)) | (Access::Glob(g), Access::Write(p)) => {
            pattern_touches(g, p)
        }
        (Access::Read(_) | Access::Glob(_), Access::Read(_) | Access::Glob(_)) => false,
    }
}

/// A chain known to a [`Claims`] checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChainRef(usize);

/// A [`ChainRef`] that this checker never handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownChain(pub ChainRef);

impl fmt::Display for UnknownChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown store chain {}", self.0.0)
    }
}

impl std::error::Error for UnknownChain {}

/// A claims conflict: the run ends with `Determinism`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The refused (later) claim's kind.
    pub claim: ClaimKind,
    /// The refused claim's path or pattern, as written.
    pub path: String,
    /// The chain that made the refused claim.
    pub identity: String,
    /// The earlier claim's kind.
    pub other_claim: ClaimKind,
    /// The chain that made the earlier claim.
    pub other_identity: String,
}

impl Violation {
    /// `store determinism violation: {claim} on {path} by {identity} conflicts with a
    /// {other_claim} claim by {other_identity}`.
    pub fn message(&self) -> String {
        format!(
            "store determinism violation: {} on {} by {} conflicts with a {} claim by {}",
            self.claim, self.path, self.identity, self.other_claim, self.other_identity
        )
    }

    /// The run error the conflict ends the run with.
    pub fn to_run_error(&self) -> RunError {
        RunError::new(RunErrorKind::Determinism, self.message())
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for Violation {}

/// Why a claim was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimError {
    /// Two unordered claims conflict.
    Conflict(Violation),
    /// The chain was not made by this checker (an engine bug).
    UnknownChain(UnknownChain),
}

impl ClaimError {
    /// `Determinism` for a conflict, `Internal` for an unknown chain.
    pub fn to_run_error(&self) -> RunError {
        match self {
            ClaimError::Conflict(violation) => violation.to_run_error(),
            ClaimError::UnknownChain(unknown) => RunError::new(
                RunErrorKind::Internal,
                format!("internal invariant violated: {unknown}"),
            ),
        }
    }
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::Conflict(violation) => violation.fmt(f),
            ClaimError::UnknownChain(unknown) => unknown.fmt(f),
        }
    }
}

impl std::error::Error for ClaimError {}

/// A clock snapshot, shared between chains until one of them changes it.
#[derive(Debug, Clone)]
struct Snapshot {
    /// The chain whose clock this snapshot was, at some point: its current clock dominates it.
    owner: ChainRef,
    ticks: BTreeMap<ChainRef, u64>,
}

#[derive(Debug, Clone)]
struct Chain {
    identity: String,
    /// Everything known about other chains; this chain's own entry may be stale.
    base: Arc<Snapshot>,
    /// This chain's own tick, counting its claims.
    own: u64,
}

impl Chain {
    /// The chain's clock entry for `other`.
    fn knows(&self, me: ChainRef, other: ChainRef) -> u64 {
        if me == other {
            self.own
        } else {
            self.base.ticks.get(&other).copied().unwrap_or(0)
        }
    }
}

/// Latest claim ticks of one chain on one path (0: none).
#[derive(Debug, Clone, Copy, Default)]
struct Latest {
    read: u64,
    write: u64,
}

#[derive(Debug)]
struct GlobClaims {
    pattern: GlobPattern,
    ticks: BTreeMap<ChainRef, u64>,
}

/// The happens-before checker of one run's store claims.
#[derive(Debug, Default)]
pub struct Claims {
    chains: Vec<Chain>,
    paths: BTreeMap<String, BTreeMap<ChainRef, Latest>>,
    globs: BTreeMap<String, GlobClaims>,
}

impl Claims {
    /// An empty checker.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new chain ordered after nothing, such as the run's walk (which the H1 pass shares).
    pub fn root(&mut self, identity: impl Into<String>) -> ChainRef {
        let me = ChainRef(self.chains.len());
        self.chains.push(Chain {
            identity: identity.into(),
            base: Arc::new(Snapshot {
                owner: me,
                ticks: BTreeMap::new(),
            }),
            own: 0,
        });
        me
    }

    /// A chain or task start: a new chain ordered after everything `parent` did so far.
    pub fn fork(
        &mut self,
        parent: ChainRef,
        identity: impl Into<String>,
    ) -> Result<ChainRef, UnknownChain> {
        let child = ChainRef(self.chains.len());
        let chain = self.chains.get_mut(parent.0).ok_or(UnknownChain(parent))?;
        let known = chain.base.ticks.get(&parent).copied().unwrap_or(0);
        if known != chain.own {
            let snapshot = Arc::make_mut(&mut chain.base);
            snapshot.owner = parent;
            snapshot.ticks.insert(parent, chain.own);
        }
        let base = Arc::clone(&chain.base);
        self.chains.push(Chain {
            identity: identity.into(),
            base,
            own: 0,
        });
        Ok(child)
    }

    /// Delivery of a result: everything `finished` did so far comes ahead of whatever `waiter`
    /// does next.
    pub fn join(&mut self, waiter: ChainRef, finished: ChainRef) -> Result<(), UnknownChain> {
        let (done_base, done_own) = self
            .chains
            .get(finished.0)
            .map(|done| (Arc::clone(&done.base), done.own))
            .ok_or(UnknownChain(finished))?;
        let chain = self.chains.get_mut(waiter.0).ok_or(UnknownChain(waiter))?;
        if waiter == finished {
            return Ok(());
        }
        // A snapshot the waiter once had is dominated by its current clock: skip merging it.
        let merge_base = done_base.owner != waiter && !Arc::ptr_eq(&done_base, &chain.base);
        let needs_own = chain.base.ticks.get(&finished).copied().unwrap_or(0) < done_own;
        let needs_base = merge_base
            && done_base.ticks.iter().any(|(other, tick)| {
                *other != waiter && chain.base.ticks.get(other).copied().unwrap_or(0) < *tick
            });
        if !needs_own && !needs_base {
            return Ok(());
        }
        let snapshot = Arc::make_mut(&mut chain.base);
        snapshot.owner = waiter;
        if needs_base {
            for (other, tick) in &done_base.ticks {
                if *other != waiter {
                    let entry = snapshot.ticks.entry(*other).or_insert(0);
                    *entry = (*entry).max(*tick);
                }
            }
        }
        let entry = snapshot.ticks.entry(finished).or_insert(0);
        *entry = (*entry).max(done_own);
        Ok(())
    }

    /// The identity a chain was made with.
    pub fn identity(&self, chain: ChainRef) -> Option<&str> {
        self.chains.get(chain.0).map(|c| c.identity.as_str())
    }

    /// Claims `access` for `chain` before the store call runs. A conflicting claim is refused
    /// with the [`Violation`] and is not recorded; otherwise the claim is recorded.
    pub fn claim(&mut self, chain: ChainRef, access: &Access) -> Result<(), ClaimError> {
        let me = self
            .chains
            .get(chain.0)
            .ok_or(ClaimError::UnknownChain(UnknownChain(chain)))?;
        if let Some((other, other_claim)) = self.find_conflict(chain, me, access) {
            let other_identity = self.identity(other).unwrap_or_default().to_owned();
            return Err(ClaimError::Conflict(Violation {
                claim: access.kind(),
                path: access.target().to_owned(),
                identity: me.identity.clone(),
                other_claim,
                other_identity,
            }));
        }
        let tick = match self.chains.get_mut(chain.0) {
            Some(me) => {
                me.own += 1;
                me.own
            }
            None => return Err(ClaimError::UnknownChain(UnknownChain(chain))),
        };
        match access {
            Access::Read(path) => {
                let latest = self.latest_mut(path, chain);
                latest.read = tick;
            }
            Access::Write(path) => {
                let latest = self.latest_mut(path, chain);
                latest.write = tick;
            }
            Access::Glob(pattern) => {
                self.globs
                    .entry(pattern.as_str().to_owned())
                    .or_insert_with(|| GlobClaims {
                        pattern: pattern.clone(),
                        ticks: BTreeMap::new(),
                    })
                    .ticks
                    .insert(chain, tick);
            }
        }
        Ok(())
    }

    fn latest_mut(&mut self, path: &str, chain: ChainRef) -> &mut Latest {
        self.paths
            .entry(path.to_owned())
            .or_default()
            .entry(chain)
            .or_default()
    }

    /// The first earlier, unordered, conflicting claim by another chain, if any.
    fn find_conflict(
        &self,
        me_ref: ChainRef,
        me: &Chain,
        access: &Access,
    ) -> Option<(ChainRef, ClaimKind)> {
        let unordered = |other: ChainRef, tick: u64| {
            other != me_ref && tick > 0 && me.knows(me_ref, other) < tick
        };
        // Claims on one path that conflict with this access: writes always, reads only when
        // this access writes.
        let check_path = |path: &str| -> Option<(ChainRef, ClaimKind)> {
            let claims = self.paths.get(path)?;
            claims.iter().find_map(|(other, latest)| {
                if unordered(*other, latest.write) {
                    Some((*other, ClaimKind::Write))
                } else if access.kind() == ClaimKind::Write && unordered(*other, latest.read) {
                    Some((*other, ClaimKind::Read))
                } else {
                    None
                }
            })
        };
        match access {
            Access::Read(path) | Access::Write(path) => {
                if let Some(found) = check_path(path) {
                    return Some(found);
                }
                for (index, _) in path.match_indices('/') {
                    if let Some(found) = check_path(&path[..index]) {
                        return Some(found);
                    }
                }
                for (beneath, _) in self.paths_beneath(path) {
                    if let Some(found) = check_path(beneath) {
                        return Some(found);
                    }
                }
                if access.kind() == ClaimKind::Write {
                    for globs in self.globs.values() {
                        if !pattern_touches(&globs.pattern, path) {
                            continue;
                        }
                        if let Some((other, _)) = globs
                            .ticks
                            .iter()
                            .find(|(other, tick)| unordered(**other, **tick))
                        {
                            return Some((*other, ClaimKind::Read));
                        }
                    }
                }
                None
            }
            Access::Glob(pattern) => {
                let base = pattern.base_dir();
                let candidates: Box<dyn Iterator<Item = (&String, _)>> = if base.is_empty() {
                    Box::new(self.paths.iter())
                } else {
                    Box::new(self.paths_beneath(base))
                };
                for (path, claims) in candidates {
                    if !pattern_touches(pattern, path) {
                        continue;
                    }
                    let found = claims
                        .iter()
                        .find(|(other, latest)| unordered(**other, latest.write));
                    if let Some((other, _)) = found {
                        return Some((*other, ClaimKind::Write));
                    }
                }
                None
            }
        }
    }

    /// Every claimed path strictly beneath the directory `dir`.
    fn paths_beneath<'a>(
        &'a self,
        dir: &str,
    ) -> impl Iterator<Item = (&'a String, &'a BTreeMap<ChainRef, Latest>)> + 'a {
        // `0` is the byte after `/`, so this range is exactly the paths starting `dir/`.
        let low = format!("{dir}/");
        let high = format!("{dir}0");
        self.paths.range(low..high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(p: &str) -> Access {
        Access::Read(p.to_owned())
    }
    fn write(p: &str) -> Access {
        Access::Write(p.to_owned())
    }
    fn glob(p: &str) -> Access {
        Access::Glob(GlobPattern::new(p).unwrap())
    }

    fn violation(err: ClaimError) -> Violation {
        match err {
            ClaimError::Conflict(v) => v,
            ClaimError::UnknownChain(u) => panic!("{u}"),
        }
    }

    #[test]
    fn two_arms_writing_one_path() {
        let mut c = Claims::new();
        let main = c.root("chain 0");
        let a = c.fork(main, "task 0.0").unwrap();
        let b = c.fork(main, "task 0.1").unwrap();
        c.claim(a, &write("shared.txt")).unwrap();
        let v = violation(c.claim(b, &write("shared.txt")).unwrap_err());
        assert_eq!(
            v.message(),
            "store determinism violation: write on shared.txt by task 0.1 conflicts with a \
             write claim by task 0.0"
        );
        assert_eq!(v.to_run_error().kind, RunErrorKind::Determinism);
        // The refused claim was not recorded: after joining `a` only, main may write freely.
        c.join(main, a).unwrap();
        c.claim(main, &write("shared.txt")).unwrap();
    }

    #[test]
    fn reads_never_conflict_and_a_chain_never_conflicts_with_itself() {
        let mut c = Claims::new();
        let main = c.root("chain 0");
        let a = c.fork(main, "a").unwrap();
        let b = c.fork(main, "b").unwrap();
        c.claim(a, &read("x")).unwrap();
        c.claim(b, &read("x")).unwrap();
        c.claim(b, &glob("other/*")).unwrap();
        c.claim(a, &glob("**")).unwrap();
        c.claim(a, &write("own.txt")).unwrap();
        c.claim(a, &write("own.txt")).unwrap();
        c.claim(a, &read("own.txt")).unwrap();
        // `a` globbed `**`, so a write by `b` anywhere conflicts.
        c.claim(b, &write("b.txt")).unwrap_err();
        // ... and `b` globbed `other/*`, so a write there by `a` conflicts too.
        c.claim(a, &write("other/x")).unwrap_err();
    }

    #[test]
    fn fork_orders_what_came_before_and_not_after() {
        let mut c = Claims::new();
        let main = c.root("chain 0");
        c.claim(main, &write("input.md")).unwrap();
        let task = c.fork(main, "task 0.0").unwrap();
        c.claim(task, &read("input.md")).unwrap();
        // The owner writing a path after spawning a task that reads it conflicts.
        let v = violation(c.claim(main, &write("input.md")).unwrap_err());
        assert_eq!(v.claim, ClaimKind::Write);
        assert_eq!(v.other_claim, ClaimKind::Read);
        assert_eq!(v.other_identity, "task 0.0");
        // ... and the other way round: the owner writes first, the task reads later.
        let mut c = Claims::new();
        let main = c.root("chain 0");
        let task = c.fork(main, "task 0.0").unwrap();
        c.claim(main, &write("late.md")).unwrap();
        let v = violation(c.claim(task, &read("late.md")).unwrap_err());
        assert_eq!(
            v.message(),
            "store determinism violation: read on late.md by task 0.0 conflicts with a write \
             claim by chain 0"
        );
    }

    #[test]
    fn join_orders_what_the_task_did() {
        let mut c = Claims::new();
        let main = c.root("chain 0");
        let arms: Vec<_> = (0..3)
            .map(|i| c.fork(main, format!("task 0.{i}")).unwrap())
            .collect();
        for (i, arm) in arms.iter().enumerate() {
            c.claim(*arm, &write(&format!("research/{}.md", i + 1)))
                .unwrap();
        }
        // Reading a sibling's output without a join conflicts.
        let v = violation(c.claim(arms[0], &read("research/2.md")).unwrap_err());
        assert_eq!(v.other_identity, "task 0.1");
        // Reading before the join conflicts too.
        c.claim(main, &read("research/1.md")).unwrap_err();
        for arm in &arms {
            c.join(main, *arm).unwrap();
        }
        for i in 1..=3 {
            c.claim(main, &read(&format!("research/{i}.md"))).unwrap();
        }
        c.claim(main, &glob("research/*")).unwrap();
        c.claim(main, &write("research.md")).unwrap();
        // Sequential fanouts: the later arms overwrite freely.
        let later = c.fork(main, "task 0.3").unwrap();
        c.claim(later, &write("research/1.md")).unwrap();
    }

    #[test]
    fn join_is_transitive() {
        let mut c = Claims::new();
        let main = c.root("chain 0");
        let task = c.fork(main, "task 0.0").unwrap();
        let nested = c.fork(task, "task 0.0.0").unwrap();
        c.claim(nested, &write("deep.txt")).unwrap();
        // The task's end joins the nested task; main joins the task.
        c.join(task, nested).unwrap();
        c.join(main, task).unwrap();
        c.claim(main, &read("deep.txt")).unwrap();
        // A sibling of the task that was forked before the join stays unordered.
        let mut c = Claims::new();
        let main = c.root("chain 0");
        let task = c.fork(main, "t").unwrap();
        let nested = c.fork(task, "n").unwrap();
        let sibling = c.fork(main, "s").unwrap();
        c.claim(nested, &write("deep.txt")).unwrap();
        c.join(task, nested).unwrap();
        c.join(main, task).unwrap();
        c.claim(sibling, &read("deep.txt")).unwrap_err();
    }

    #[test]
    fn glob_and_exists_race_a_write() {
        for (first_glob, pattern, path) in [
            (true, "src/*.rs", "src/a.rs"),
            (false, "src/*.rs", "src/a.rs"),
            (true, "**", "a/b/c"),
            (false, "notes/*/", "notes/sub/a.txt"),
            (true, "*/", "notes/a.txt"),
        ] {
            let mut c = Claims::new();
            let main = c.root("m");
            let a = c.fork(main, "a").unwrap();
            let b = c.fork(main, "b").unwrap();
            if first_glob {
                c.claim(a, &glob(pattern)).unwrap();
                let v = violation(c.claim(b, &write(path)).unwrap_err());
                assert_eq!(
                    (v.claim, v.other_claim),
                    (ClaimKind::Write, ClaimKind::Read)
                );
                assert_eq!(v.path, path);
            } else {
                c.claim(a, &write(path)).unwrap();
                let v = violation(c.claim(b, &glob(pattern)).unwrap_err());
                assert_eq!(
                    (v.claim, v.other_claim),
                    (ClaimKind::Read, ClaimKind::Write)
                );
                assert_eq!(v.path, pattern);
            }
        }
        // Non-matching globs and files under a file-pattern's directory do not conflict.
        let mut c = Claims::new();
        let main = c.root("m");
        let a = c.fork(main, "a").unwrap();
        let b = c.fork(main, "b").unwrap();
        c.claim(a, &glob("src/*.rs")).unwrap();
        c.claim(a, &glob("*")).unwrap();
        c.claim(b, &write("src/deep/c.rs")).unwrap();
        c.claim(b, &write("notes.md")).unwrap_err();
        // exists claims its path.
        let mut c = Claims::new();
        let main = c.root("m");
        let a = c.fork(main, "a").unwrap();
        let b = c.fork(main, "b").unwrap();
        c.claim(a, &read("marker")).unwrap();
        c.claim(b, &write("marker")).unwrap_err();
    }

    #[test]
    fn nested_paths_conflict() {
        assert!(nested_or_equal("notes", "notes/a.txt"));
        assert!(nested_or_equal("notes/a.txt", "notes"));
        assert!(nested_or_equal("a", "a"));
        assert!(!nested_or_equal("notes", "notes2/a"));
        assert!(!nested_or_equal("research/1.md", "research/2.md"));
        let mut c = Claims::new();
        let main = c.root("m");
        let a = c.fork(main, "a").unwrap();
        let b = c.fork(main, "b").unwrap();
        c.claim(a, &write("notes/a.txt")).unwrap();
        c.claim(b, &read("notes")).unwrap_err();
        c.claim(b, &write("notes")).unwrap_err();
        c.claim(b, &write("notes/b.txt")).unwrap();
        c.claim(b, &read("notes/a.txt/x")).unwrap_err();
        c.claim(b, &read("notes2")).unwrap();
    }

    #[test]
    fn called_chain_shares_identity() {
        // A `call` keeps the caller's ChainRef: writes and reads in it are the caller's own.
        let mut c = Claims::new();
        let main = c.root("chain 0");
        c.claim(main, &write("findings.md")).unwrap();
        c.claim(main, &read("findings.md")).unwrap();
    }

    #[test]
    fn unknown_chains_are_errors() {
        let mut other = Claims::new();
        other.root("x");
        let stranger = other.fork(ChainRef(0), "y").unwrap();
        let mut c = Claims::new();
        assert_eq!(c.fork(stranger, "z"), Err(UnknownChain(stranger)));
        assert_eq!(c.join(stranger, stranger), Err(UnknownChain(stranger)));
        let err = c.claim(stranger, &read("a")).unwrap_err();
        assert!(matches!(err, ClaimError::UnknownChain(_)));
        assert_eq!(err.to_run_error().kind, RunErrorKind::Internal);
    }

    #[test]
    fn many_arms_are_cheap() {
        let mut c = Claims::new();
        let main = c.root("m");
        for round in 0..2 {
            let arms: Vec<_> = (0..5000)
                .map(|i| c.fork(main, format!("0.{i}")).unwrap())
                .collect();
            for (i, arm) in arms.iter().enumerate() {
                c.claim(*arm, &write(&format!("arm-{round}-{i}.md")))
                    .unwrap();
            }
            for arm in &arms {
                c.join(main, *arm).unwrap();
            }
            c.claim(main, &glob("*")).unwrap();
        }
    }

    // ---- brute-force reference ----

    #[derive(Debug, Clone)]
    enum Event {
        Fork(usize),
        Join(usize, usize),
        Claim(usize, Access),
    }

    const PATHS: [&str; 7] = ["a", "b", "a/x", "a/y", "a/x/z", "b/x", "c"];
    const PATTERNS: [&str; 6] = ["*", "a/*", "**", "*/", "a/*/", "*/x"];

    fn access_strategy() -> impl Strategy<Value = Access> {
        prop_oneof![
            (0..PATHS.len()).prop_map(|i| read(PATHS[i])),
            (0..PATHS.len()).prop_map(|i| write(PATHS[i])),
            (0..PATHS.len()).prop_map(|i| write(PATHS[i])),
            (0..PATTERNS.len()).prop_map(|i| glob(PATTERNS[i])),
        ]
    }

    fn event_strategy() -> impl Strategy<Value = Event> {
        prop_oneof![
            1 => (0usize..8).prop_map(Event::Fork),
            1 => ((0usize..8), (0usize..8)).prop_map(|(w, f)| Event::Join(w, f)),
            4 => ((0usize..8), access_strategy()).prop_map(|(c, a)| Event::Claim(c, a)),
        ]
    }

    /// Resolves chain numbers modulo the chains existing at each step.
    fn normalize(trace: &[Event]) -> Vec<Event> {
        let mut chains = 1;
        let mut out = Vec::new();
        for event in trace {
            match event {
                Event::Fork(p) => {
                    out.push(Event::Fork(p % chains));
                    chains += 1;
                }
                Event::Join(w, f) => out.push(Event::Join(w % chains, f % chains)),
                Event::Claim(c, a) => out.push(Event::Claim(c % chains, a.clone())),
            }
        }
        out
    }

    /// The first claim index whose claim conflicts with an earlier unordered claim, with the
    /// set of (chain, kind) pairs that justify it.
    fn reference(trace: &[Event]) -> Option<(usize, Vec<(usize, ClaimKind)>)> {
        // Node i is event i; preds[i] are its direct happens-before predecessors.
        let mut preds: Vec<Vec<usize>> = vec![Vec::new(); trace.len()];
        let mut last: Vec<Option<usize>> = vec![None];
        let mut chain_of = vec![0usize; trace.len()];
        for (i, event) in trace.iter().enumerate() {
            let chain = match event {
                Event::Fork(p) | Event::Join(p, _) | Event::Claim(p, _) => *p,
            };
            chain_of[i] = chain;
            if let Some(prev) = last[chain] {
                preds[i].push(prev);
            }
            if let Event::Join(_, f) = event
                && let Some(prev) = last[*f]
            {
                preds[i].push(prev);
            }
            last[chain] = Some(i);
            if let Event::Fork(_) = event {
                // The child's chain starts at the fork node.
                last.push(Some(i));
            }
        }
        let before = |a: usize, b: usize| -> bool {
            let mut stack = vec![b];
            let mut seen = vec![false; trace.len()];
            while let Some(n) = stack.pop() {
                for &p in &preds[n] {
                    if p == a {
                        return true;
                    }
                    if !seen[p] {
                        seen[p] = true;
                        stack.push(p);
                    }
                }
            }
            false
        };
        // Claim node chain: for a Claim the chain is the claimer.
        for (j, event) in trace.iter().enumerate() {
            let Event::Claim(cj, aj) = event else {
                continue;
            };
            let mut why = Vec::new();
            for (i, earlier) in trace.iter().enumerate().take(j) {
                let Event::Claim(ci, ai) = earlier else {
                    continue;
                };
                if ci != cj && conflicts(ai, aj) && !before(i, j) {
                    why.push((*ci, ai.kind()));
                }
            }
            if !why.is_empty() {
                return Some((j, why));
            }
        }
        None
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn checker_matches_brute_force(trace in proptest::collection::vec(event_strategy(), 0..40)) {
            let trace = normalize(&trace);
            let expected = reference(&trace);
            let mut c = Claims::new();
            let mut refs = vec![c.root("chain 0")];
            let mut got = None;
            for (j, event) in trace.iter().enumerate() {
                match event {
                    Event::Fork(p) => {
                        let child = c.fork(refs[*p], format!("chain {}", refs.len())).unwrap();
                        refs.push(child);
                    }
                    Event::Join(w, f) => c.join(refs[*w], refs[*f]).unwrap(),
                    Event::Claim(chain, access) => {
                        if let Err(err) = c.claim(refs[*chain], access) {
                            got = Some((j, violation(err)));
                            break;
                        }
                    }
                }
            }
            match (expected, got) {
                (None, None) => {}
                (Some((j, why)), Some((k, v))) => {
                    prop_assert_eq!(j, k);
                    let Event::Claim(chain, access) = &trace[j] else { unreachable!() };
                    prop_assert_eq!(&v.identity, &format!("chain {chain}"));
                    prop_assert_eq!(v.claim, access.kind());
                    prop_assert_eq!(&v.path, access.target());
                    let justified = why.iter().any(|(other, kind)| {
                        format!("chain {other}") == v.other_identity && *kind == v.other_claim
                    });
                    prop_assert!(justified, "{:?} not in {:?}", v, why);
                }
                (expected, got) => {
                    prop_assert!(false, "expected {:?}, got {:?}", expected, got);
                }
            }
        }
    }
}
