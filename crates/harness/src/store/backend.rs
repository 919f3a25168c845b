//! The raw file operations a store backend offers, on valid logical paths.

use std::fmt;

/// What sits at a logical path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntryKind {
    /// A file.
    File,
    /// A directory (the parent of a written file, until deleted).
    Dir,
}

/// The result of looking a path up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// Nothing is there.
    Missing,
    /// A file is there.
    File,
    /// A directory is there.
    Dir,
    /// A parent directory of the path is a file, so nothing can be there.
    UnderFile,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// The entry's logical path.
    pub path: String,
    /// File or directory.
    pub kind: EntryKind,
}

/// Why a backend operation failed. The [`Store`](super::Store) adds the path as the prompt
/// wrote it and turns each into the chapter's store error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// Nothing at the path (`file not found in store`).
    NotFound,
    /// A directory where a file is needed.
    IsADirectory,
    /// A file where a directory is needed (a parent of the path is a file).
    NotADirectory,
    /// Removing a directory that still holds entries.
    DirectoryNotEmpty,
    /// The backend refuses a path that already exists.
    AlreadyExists,
    /// The backend refuses the call; the payload is the reason in words.
    PermissionDenied(String),
    /// The backend cannot serve the call; the payload is the detail in words.
    Unsupported(String),
    /// The storage behind the backend failed; the payload is the failure in words, naming no
    /// path.
    Failed(String),
}

impl BackendError {
    /// The refusal for a path that would traverse a symbolic link.
    pub fn symlink() -> Self {
        BackendError::PermissionDenied("the path crosses a symbolic link".to_owned())
    }

    /// The refusal for a file that has other hard links (which may be outside the store).
    pub fn hard_link() -> Self {
        BackendError::PermissionDenied(
            "the file has other hard links, which may be outside the store".to_owned(),
        )
    }

    /// A storage failure from an I/O error, naming no path.
    pub fn io(err: &std::io::Error) -> Self {
        BackendError::Failed(err.to_string())
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::NotFound => f.write_str("not found"),
            BackendError::IsADirectory => f.write_str("is a directory"),
            BackendError::NotADirectory => f.write_str("not a directory"),
            BackendError::DirectoryNotEmpty => f.write_str("directory not empty"),
            BackendError::AlreadyExists => f.write_str("already exists"),
            BackendError::PermissionDenied(reason) => write!(f, "permission denied: {reason}"),
            BackendError::Unsupported(detail) => write!(f, "unsupported: {detail}"),
            BackendError::Failed(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for BackendError {}

/// Raw file operations on valid logical paths (checked by `store_path::validate_path`).
///
/// Every implementation gives the same answers for the same sequence of calls:
///
/// - `read`: the bytes of a file; `IsADirectory` for a directory, `NotFound` when nothing is
///   there, `NotADirectory` when a parent is a file.
/// - `write` and `append`: create missing parent directories, then replace (atomically) or
///   extend the file; `IsADirectory` when the path is a directory and `NotADirectory` when a
///   parent is a file, in both cases changing nothing.
/// - `remove`: a file or an empty directory; `DirectoryNotEmpty` for a directory with entries,
///   `NotFound` when nothing is there (or a parent is a file).
/// - `list`: every entry strictly beneath the directory `under` (`""` is the root), files and
///   directories, in any order; empty when `under` is not a directory.
pub trait Backend: fmt::Debug + Send {
    /// What sits at `path`.
    fn lookup(&self, path: &str) -> Result<Lookup, BackendError>;
    /// The bytes of the file at `path`.
    fn read(&self, path: &str) -> Result<Vec<u8>, BackendError>;
    /// Creates or replaces the file at `path`, atomically.
    fn write(&mut self, path: &str, contents: &[u8]) -> Result<(), BackendError>;
    /// Adds `contents` to the end of the file at `path`, creating it when absent.
    fn append(&mut self, path: &str, contents: &[u8]) -> Result<(), BackendError>;
    /// Removes the file or empty directory at `path`.
    fn remove(&mut self, path: &str) -> Result<(), BackendError>;
    /// Every entry beneath the directory `under`.
    fn list(&self, under: &str) -> Result<Vec<Entry>, BackendError>;
}

/// The parent directories of a logical path, shortest first (`a`, `a/b` for `a/b/c`).
pub(crate) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(move |(index, _)| &path[..index])
}
