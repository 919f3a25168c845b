//! The run's store (chapter 09, "The Store"): performs the engine's [`StoreOp`] effects.
//!
//! A [`Store`] pairs a [`Backend`] (raw file operations: [`MemoryBackend`] for the run's
//! default store, [`DirBackend`] for a directory on disk) with the chapter's rules: path and
//! pattern checks, whole and line-range reads, numbered reads, single-occurrence
//! `str_replace`, non-recursive delete, exists, sorted globs, UTF-8 text, and read-only or
//! policy-restricted stores. The request, answer and error types are the engine's (the engine
//! issues the requests and raises the errors), re-exported here.

mod backend;
mod dir;
mod files;
mod memory;
pub mod text;

use std::fmt;

pub use backend::{Backend, BackendError, Entry, EntryKind, Lookup};
pub use dir::{DirBackend, Durability};
pub use files::{TransferError, collect_output_file, place_input_file};
pub use memory::MemoryBackend;
pub use promptforge_protocol::store::{
    BoundArg, GlobPattern, LineRange, PathRule, RangeProblem, StoreAnswer, StoreError, StoreOp,
    StoreReason, line_range, normalize_path, validate_path, validate_pattern,
};

/// The reason a read-only store gives for refusing a change.
pub const READ_ONLY_REASON: &str = "the store is read-only";

/// A Host policy over store calls: `Err(reason)` refuses the call with `permission_denied`.
pub trait StorePolicy: fmt::Debug + Send {
    /// Whether the call may proceed; it has a valid path or pattern.
    fn check(&self, op: &StoreOp) -> Result<(), String>;
}

/// A run's store.
#[derive(Debug)]
pub struct Store {
    backend: Box<dyn Backend>,
    read_only: bool,
    policy: Option<Box<dyn StorePolicy>>,
}

impl Default for Store {
    fn default() -> Self {
        Self::memory()
    }
}

impl Store {
    /// A store over any backend.
    pub fn new(backend: Box<dyn Backend>) -> Self {
        Store {
            backend,
            read_only: false,
            policy: None,
        }
    }

    /// The run's default store: fresh, empty, in memory.
    pub fn memory() -> Self {
        Self::new(Box::new(MemoryBackend::new()))
    }

    /// A store kept in the directory `location` on disk, created when missing.
    pub fn directory(location: impl AsRef<std::path::Path>) -> std::io::Result<Self> {
        Ok(Self::new(Box::new(DirBackend::create(location)?)))
    }

    /// Makes the store read-only (or writable again): every change is refused with
    /// `permission denied for store path {path}: the store is read-only`.
    pub fn set_read_only(&mut self, read_only: bool) {
        self.read_only = read_only;
    }

    /// Whether the store refuses changes.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Puts a Host policy in front of every call.
    pub fn set_policy(&mut self, policy: Option<Box<dyn StorePolicy>>) {
        self.policy = policy;
    }

    /// The backend behind the store.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Places a file in the store as the Host does before a run (input files, seeded files):
    /// the path must be valid; read-only and policy do not apply; the bytes need not be UTF-8.
    pub fn seed(&mut self, path: &str, contents: &[u8]) -> Result<(), StoreError> {
        validate_path(path).map_err(|rule| StoreError::invalid_path(path, rule))?;
        self.backend
            .write(path, contents)
            .map_err(|err| backend_error(path, err))
    }

    /// Reads a file's bytes as the Host does after a run (output files).
    pub fn read_bytes(&self, path: &str) -> Result<Vec<u8>, StoreError> {
        validate_path(path).map_err(|rule| StoreError::invalid_path(path, rule))?;
        self.backend
            .read(path)
            .map_err(|err| backend_error(path, err))
    }

    /// Performs one store call by the chapter's rules.
    pub fn perform(&mut self, op: &StoreOp) -> Result<StoreAnswer, StoreError> {
        if let StoreOp::Glob { pattern } = op {
            let glob = GlobPattern::new(pattern)
                .map_err(|rule| StoreError::invalid_pattern(pattern, rule))?;
            self.permit(op, pattern)?;
            return self.glob(&glob).map(StoreAnswer::List);
        }
        let path = op.target();
        validate_path(path).map_err(|rule| StoreError::invalid_path(path, rule))?;
        self.permit(op, path)?;
        match op {
            StoreOp::Read { range, .. } => self.read(path, *range, false),
            StoreOp::ReadNumbered { range, .. } => self.read(path, *range, true),
            StoreOp::Write { contents, .. } => self
                .backend
                .write(path, contents.as_bytes())
                .map(|()| StoreAnswer::Unit)
                .map_err(|err| backend_error(path, err)),
            StoreOp::Append { contents, .. } => self
                .backend
                .append(path, contents.as_bytes())
                .map(|()| StoreAnswer::Unit)
                .map_err(|err| backend_error(path, err)),
            StoreOp::StrReplace { old, new, .. } => self.str_replace(path, old, new),
            StoreOp::Delete { .. } => match self.backend.remove(path) {
                Ok(()) | Err(BackendError::NotFound) => Ok(StoreAnswer::Unit),
                Err(err) => Err(backend_error(path, err)),
            },
            StoreOp::Exists { .. } => match self.backend.lookup(path) {
                Ok(Lookup::File | Lookup::Dir) => Ok(StoreAnswer::Bool(true)),
                Ok(Lookup::Missing | Lookup::UnderFile) => Ok(StoreAnswer::Bool(false)),
                Err(err) => Err(backend_error(path, err)),
            },
            StoreOp::Glob { .. } => Ok(StoreAnswer::List(Vec::new())),
        }
    }

    /// Read-only and policy checks, after the path is known to be valid.
    fn permit(&self, op: &StoreOp, target: &str) -> Result<(), StoreError> {
        if self.read_only && op.is_mutation() {
            return Err(StoreError::permission_denied(target, READ_ONLY_REASON));
        }
        if let Some(policy) = &self.policy {
            policy
                .check(op)
                .map_err(|reason| StoreError::permission_denied(target, &reason))?;
        }
        Ok(())
    }

    fn text(&self, path: &str) -> Result<String, StoreError> {
        let bytes = self
            .backend
            .read(path)
            .map_err(|err| backend_error(path, err))?;
        String::from_utf8(bytes).map_err(|_| StoreError::not_utf8(path))
    }

    fn read(
        &self,
        path: &str,
        range: Option<LineRange>,
        numbered: bool,
    ) -> Result<StoreAnswer, StoreError> {
        let start = match range {
            None => None,
            Some(LineRange {
                start: None,
                end: None,
            }) => None,
            Some(LineRange {
                start: None,
                end: Some(_),
            }) => {
                return Err(StoreError::invalid_range(path, RangeProblem::StartRequired));
            }
            Some(LineRange {
                start: Some(start),
                end,
            }) => Some((start, end)),
        };
        let text = self.text(path)?;
        if !numbered && start.is_none() {
            return Ok(StoreAnswer::Text(text));
        }
        let (start, end) = start.unwrap_or((1, None));
        let selection = text::select(&text, start, end)
            .map_err(|problem| StoreError::invalid_range(path, problem))?;
        Ok(StoreAnswer::Text(if numbered {
            text::numbered(&selection)
        } else {
            text::plain(&selection)
        }))
    }

    fn str_replace(&mut self, path: &str, old: &str, new: &str) -> Result<StoreAnswer, StoreError> {
        if old.is_empty() {
            return Err(StoreError::empty_anchor(path));
        }
        let text = self.text(path)?;
        let count = u64::try_from(text.matches(old).count()).unwrap_or(u64::MAX);
        match count {
            0 => Err(StoreError::anchor_not_found(path, old)),
            1 => {
                let replaced = text.replacen(old, new, 1);
                self.backend
                    .write(path, replaced.as_bytes())
                    .map(|()| StoreAnswer::Unit)
                    .map_err(|err| backend_error(path, err))
            }
            count => Err(StoreError::anchor_ambiguous(path, old, count)),
        }
    }

    fn glob(&self, glob: &GlobPattern) -> Result<Vec<String>, StoreError> {
        let wanted = if glob.dirs_only() {
            EntryKind::Dir
        } else {
            EntryKind::File
        };
        let entries = self
            .backend
            .list(glob.base_dir())
            .map_err(|err| backend_error(glob.as_str(), err))?;
        let mut paths: Vec<String> = entries
            .into_iter()
            .filter(|entry| entry.kind == wanted && glob.is_match(&entry.path))
            .map(|entry| entry.path)
            .collect();
        paths.sort_unstable();
        paths.dedup();
        Ok(paths)
    }
}

/// The store error for a backend failure on `path` (as the prompt wrote it).
pub fn backend_error(path: &str, err: BackendError) -> StoreError {
    match err {
        BackendError::NotFound => StoreError::not_found(path),
        BackendError::IsADirectory => StoreError::is_a_directory(path),
        BackendError::NotADirectory => StoreError::not_a_directory(path),
        BackendError::DirectoryNotEmpty => StoreError::directory_not_empty(path),
        BackendError::AlreadyExists => StoreError::already_exists(path),
        BackendError::PermissionDenied(reason) => StoreError::permission_denied(path, &reason),
        BackendError::Unsupported(detail) => StoreError::unsupported(path, &detail),
        BackendError::Failed(message) => StoreError::backend(&message),
    }
}
