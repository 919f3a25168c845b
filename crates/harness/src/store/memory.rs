//! The in-memory store backend: the run's default store.

use std::collections::BTreeMap;

use super::backend::{Backend, BackendError, Entry, EntryKind, Lookup, ancestors};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
}

/// A store held in memory, ordered by path.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    entries: BTreeMap<String, Node>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn beneath(&self, dir: &str) -> impl Iterator<Item = (&String, &Node)> {
        let (low, high) = if dir.is_empty() {
            (String::new(), None)
        } else {
            // `0` is the byte after `/`: the range is exactly the keys starting `dir/`.
            (format!("{dir}/"), Some(format!("{dir}0")))
        };
        let upper = match high {
            Some(high) => std::ops::Bound::Excluded(high),
            None => std::ops::Bound::Unbounded,
        };
        self.entries.range((std::ops::Bound::Included(low), upper))
    }

    /// Checks a path for `write`/`append`: `Ok(true)` when the file exists.
    fn writable(&self, path: &str) -> Result<bool, BackendError> {
        match self.lookup(path)? {
            Lookup::Dir => Err(BackendError::IsADirectory),
            Lookup::UnderFile => Err(BackendError::NotADirectory),
            Lookup::File => Ok(true),
            Lookup::Missing => Ok(false),
        }
    }

    fn create_parents(&mut self, path: &str) {
        for parent in ancestors(path) {
            self.entries.entry(parent.to_owned()).or_insert(Node::Dir);
        }
    }
}

impl Backend for MemoryBackend {
    fn lookup(&self, path: &str) -> Result<Lookup, BackendError> {
        for parent in ancestors(path) {
            match self.entries.get(parent) {
                Some(Node::Dir) => {}
                Some(Node::File(_)) => return Ok(Lookup::UnderFile),
                None => return Ok(Lookup::Missing),
            }
        }
        Ok(match self.entries.get(path) {
            Some(Node::File(_)) => Lookup::File,
            Some(Node::Dir) => Lookup::Dir,
            None => Lookup::Missing,
        })
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, BackendError> {
        match self.lookup(path)? {
            Lookup::File => match self.entries.get(path) {
                Some(Node::File(bytes)) => Ok(bytes.clone()),
                _ => Err(BackendError::NotFound),
            },
            Lookup::Dir => Err(BackendError::IsADirectory),
            Lookup::UnderFile => Err(BackendError::NotADirectory),
            Lookup::Missing => Err(BackendError::NotFound),
        }
    }

    fn write(&mut self, path: &str, contents: &[u8]) -> Result<(), BackendError> {
        self.writable(path)?;
        self.create_parents(path);
        self.entries
            .insert(path.to_owned(), Node::File(contents.to_vec()));
        Ok(())
    }

    fn append(&mut self, path: &str, contents: &[u8]) -> Result<(), BackendError> {
        self.writable(path)?;
        self.create_parents(path);
        match self
            .entries
            .entry(path.to_owned())
            .or_insert_with(|| Node::File(Vec::new()))
        {
            Node::File(bytes) => {
                bytes.extend_from_slice(contents);
                Ok(())
            }
            Node::Dir => Err(BackendError::IsADirectory),
        }
    }

    fn remove(&mut self, path: &str) -> Result<(), BackendError> {
        match self.lookup(path)? {
            Lookup::Missing | Lookup::UnderFile => Err(BackendError::NotFound),
            Lookup::File => {
                self.entries.remove(path);
                Ok(())
            }
            Lookup::Dir => {
                if self.beneath(path).next().is_some() {
                    return Err(BackendError::DirectoryNotEmpty);
                }
                self.entries.remove(path);
                Ok(())
            }
        }
    }

    fn list(&self, under: &str) -> Result<Vec<Entry>, BackendError> {
        if !under.is_empty() && self.lookup(under)? != Lookup::Dir {
            return Ok(Vec::new());
        }
        Ok(self
            .beneath(under)
            .map(|(path, node)| Entry {
                path: path.clone(),
                kind: match node {
                    Node::File(_) => EntryKind::File,
                    Node::Dir => EntryKind::Dir,
                },
            })
            .collect())
    }
}
