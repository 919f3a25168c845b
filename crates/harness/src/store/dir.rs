//! The directory store backend: a store kept as real files under one directory.
//!
//! Every operation resolves a logical path one component at a time from a handle on the root
//! directory (`cap-std`, so no operation can leave the root even while the tree changes under
//! it), opening each parent with no-follow semantics and refusing any component that is a
//! symbolic link, for reads, writes, appends, removals, look-ups and listings alike. Writes go
//! to a temporary file in the target's own directory, are synced (see [`Durability`]), and are
//! renamed into place, so a reader never sees half a file; an append that fails is rolled back
//! to the file's old length. Listings skip symbolic links and names no store path can spell.
//!
//! A regular file with more than one hard link is refused for every operation that reads or
//! extends it in place (`read`, `append`): its other name may lie outside the store, and a
//! store call must never read or change a file outside its directory. (`write` replaces the
//! store's name with a new file and `remove` drops only the store's name, so neither can
//! touch the other link.) Opening a store removes the temporary files a write interrupted by
//! a crash left behind.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use promptforge_protocol::store::validate_path;

use super::backend::{Backend, BackendError, Entry, EntryKind, Lookup};

/// A store kept in a directory on disk.
#[derive(Debug)]
pub struct DirBackend {
    root: Dir,
    location: PathBuf,
    durability: Durability,
}

/// A resolved parent directory: the root itself, or one opened beneath it.
enum Parent<'a> {
    Root(&'a Dir),
    Opened(Dir),
}

impl Parent<'_> {
    fn dir(&self) -> &Dir {
        match self {
            Parent::Root(dir) => dir,
            Parent::Opened(dir) => dir,
        }
    }
}

/// How resolving a path's parents ended.
enum Resolved<'a> {
    /// The parent directory, and the final name.
    Found(Parent<'a>, &'a str),
    /// A parent is missing (and `create` was off).
    Missing,
    /// A parent is a file.
    UnderFile,
}

/// One component step.
enum Step {
    Dir(Dir),
    Missing,
    File,
}

/// What the final component is, never following a symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Missing,
    File,
    Dir,
}

fn kind_of(dir: &Dir, name: &str) -> Result<Kind, BackendError> {
    match dir.symlink_metadata(name) {
        Ok(meta) => {
            let file_type = meta.file_type();
            if file_type.is_symlink() {
                Err(BackendError::symlink())
            } else if file_type.is_dir() {
                Ok(Kind::Dir)
            } else if file_type.is_file() {
                Ok(Kind::File)
            } else {
                Err(BackendError::Unsupported(
                    "not a regular file or directory".to_owned(),
                ))
            }
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Kind::Missing),
        // Nothing can exist under a name the disk cannot hold.
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::NotADirectory | io::ErrorKind::InvalidFilename
            ) =>
        {
            Ok(Kind::Missing)
        }
        Err(err) => Err(io_error(&err)),
    }
}

fn step(dir: &Dir, name: &str, create: bool) -> Result<Step, BackendError> {
    match dir.open_dir_nofollow(name) {
        Ok(opened) => Ok(Step::Dir(opened)),
        Err(open_err) => match kind_of(dir, name)? {
            Kind::Missing if create => {
                match dir.create_dir(name) {
                    Ok(()) => {}
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(err) => return Err(io_error(&err)),
                }
                dir.open_dir_nofollow(name)
                    .map(Step::Dir)
                    .map_err(|err| io_error(&err))
            }
            Kind::Missing => Ok(Step::Missing),
            Kind::File => Ok(Step::File),
            Kind::Dir => Err(BackendError::io(&open_err)),
        },
    }
}

/// Refuses a file with more than one hard link: its other names may be outside the store.
fn check_links(file: &cap_std::fs::File) -> Result<(), BackendError> {
    #[cfg(unix)]
    {
        use cap_std::fs::MetadataExt;
        let meta = file.metadata().map_err(|err| io_error(&err))?;
        if meta.is_file() && meta.nlink() > 1 {
            return Err(BackendError::hard_link());
        }
    }
    #[cfg(not(unix))]
    let _ = file;
    Ok(())
}

/// Whether `name` is a temporary file of [`write_atomically`] whose writer is gone: another
/// process's that is no longer running (on Linux, where `/proc` says), or, elsewhere, one
/// older than an hour. A live writer's temporary file is left alone.
fn stale_temp(name: &str, dir: &Dir) -> bool {
    let Some(rest) = name
        .strip_prefix(".promptforge-")
        .and_then(|r| r.strip_suffix(".tmp."))
    else {
        return false;
    };
    let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    if pid == std::process::id() {
        return false;
    }
    if cfg!(target_os = "linux") && Path::new("/proc/self").exists() {
        return !Path::new(&format!("/proc/{pid}")).exists();
    }
    dir.symlink_metadata(name)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.into_std().elapsed().ok())
        .is_some_and(|age| age > std::time::Duration::from_secs(3600))
}

/// Remove the stale temporary files under `root` (best effort: what cannot be removed stays,
/// invisible to the store either way).
fn sweep_temps(root: &Dir) {
    let mut pending: Vec<Dir> = match root.try_clone() {
        Ok(dir) => vec![dir],
        Err(_) => return,
    };
    while let Some(dir) = pending.pop() {
        let Ok(entries) = dir.entries() else { continue };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            if file_type.is_dir() {
                if let Ok(child) = dir.open_dir_nofollow(&name) {
                    pending.push(child);
                }
            } else if file_type.is_file() && stale_temp(&name, &dir) {
                let _ = dir.remove_file(&name);
            }
        }
    }
}

/// [`io_error`], with `NotFound` meaning the file is gone.
fn gone_or(err: &io::Error) -> BackendError {
    if err.kind() == io::ErrorKind::NotFound {
        BackendError::NotFound
    } else {
        io_error(err)
    }
}

/// A failed operation on a path already resolved: the shapes the store reports, otherwise a
/// storage failure. Something vanishing underneath (`NotFound` here) is a storage failure,
/// except while reading or removing a file, where it means the file is gone.
fn io_error(err: &io::Error) -> BackendError {
    match err.kind() {
        io::ErrorKind::IsADirectory => BackendError::IsADirectory,
        io::ErrorKind::NotADirectory => BackendError::NotADirectory,
        io::ErrorKind::DirectoryNotEmpty => BackendError::DirectoryNotEmpty,
        io::ErrorKind::InvalidFilename => BackendError::Unsupported(
            "the directory on disk cannot hold a name this long".to_owned(),
        ),
        _ => BackendError::io(err),
    }
}

/// Numbers temporary files within this process; with the process id it makes names unique.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh temporary name in the target's directory. It ends in `.`, so it breaks the store's
/// path rules: no store call can name it and no listing shows it, even if a crash leaves it.
fn temp_name(attempt: u32) -> String {
    let serial = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        ".promptforge-{}-{serial}-{attempt}.tmp.",
        std::process::id()
    )
}

/// Writes `contents` to `name` in `dir` through a new temporary file in the same directory
/// (synced first when `sync` is set), then renames it into place, so a reader sees the old
/// file or the new one and never part of one. The temporary file never survives a failure.
pub(crate) fn write_atomically(
    dir: &Dir,
    name: &std::ffi::OsStr,
    contents: &[u8],
    sync: bool,
) -> io::Result<()> {
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .follow(FollowSymlinks::No);
    let mut attempt = 0;
    let (mut file, temp) = loop {
        let temp = temp_name(attempt);
        match dir.open_with(&temp, &options) {
            Ok(file) => break (file, temp),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => {
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    };
    let written = file
        .write_all(contents)
        .and_then(|()| if sync { file.sync_all() } else { Ok(()) });
    drop(file);
    let renamed = written.and_then(|()| dir.rename(&temp, dir, name));
    if renamed.is_err() {
        // Best effort: the temporary name is invisible to the store either way.
        let _ = dir.remove_file(&temp);
    }
    renamed
}

/// How hard a directory store works to keep writes across a machine crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// A write's data reaches the disk before its rename, so a crash leaves the old file or
    /// the new one, never a torn or empty one; an append is synced before it returns.
    #[default]
    Synced,
    /// Nothing is synced: writes are still atomic for readers (a rename into place), but a
    /// machine crash can lose recent ones. Much faster on real disks.
    Buffered,
}

impl DirBackend {
    /// Opens an existing directory as a store.
    pub fn open(location: impl AsRef<Path>) -> io::Result<Self> {
        let location = location.as_ref().to_path_buf();
        let root = Dir::open_ambient_dir(&location, ambient_authority())?;
        sweep_temps(&root);
        Ok(DirBackend {
            root,
            location,
            durability: Durability::default(),
        })
    }

    /// The same store with another [`Durability`].
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How the store syncs its writes.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Opens a directory as a store, creating it (and its parents) when missing.
    pub fn create(location: impl AsRef<Path>) -> io::Result<Self> {
        std::fs::create_dir_all(location.as_ref())?;
        Self::open(location)
    }

    /// The directory on disk behind the store.
    pub fn location(&self) -> &Path {
        &self.location
    }

    fn resolve<'a>(&'a self, path: &'a str, create: bool) -> Result<Resolved<'a>, BackendError> {
        let (parents, name) = match path.rsplit_once('/') {
            Some((parents, name)) => (Some(parents), name),
            None => (None, path),
        };
        let mut current = Parent::Root(&self.root);
        if let Some(parents) = parents {
            for component in parents.split('/') {
                current = match step(current.dir(), component, create)? {
                    Step::Dir(opened) => Parent::Opened(opened),
                    Step::Missing => return Ok(Resolved::Missing),
                    Step::File => return Ok(Resolved::UnderFile),
                };
            }
        }
        Ok(Resolved::Found(current, name))
    }

    /// The parent of a path about to be written, checked the way `write` and `append` need.
    fn writable<'a>(&'a self, path: &'a str) -> Result<(Parent<'a>, &'a str), BackendError> {
        // Check first without creating anything, so a refused write changes nothing.
        match self.resolve(path, false)? {
            Resolved::UnderFile => return Err(BackendError::NotADirectory),
            Resolved::Found(parent, name) => {
                if kind_of(parent.dir(), name)? == Kind::Dir {
                    return Err(BackendError::IsADirectory);
                }
                return Ok((parent, name));
            }
            Resolved::Missing => {}
        }
        match self.resolve(path, true)? {
            Resolved::Found(parent, name) => match kind_of(parent.dir(), name)? {
                Kind::Dir => Err(BackendError::IsADirectory),
                _ => Ok((parent, name)),
            },
            Resolved::UnderFile => Err(BackendError::NotADirectory),
            Resolved::Missing => Err(BackendError::NotFound),
        }
    }
}

impl Backend for DirBackend {
    fn lookup(&self, path: &str) -> Result<Lookup, BackendError> {
        Ok(match self.resolve(path, false)? {
            Resolved::Missing => Lookup::Missing,
            Resolved::UnderFile => Lookup::UnderFile,
            Resolved::Found(parent, name) => match kind_of(parent.dir(), name)? {
                Kind::Missing => Lookup::Missing,
                Kind::File => Lookup::File,
                Kind::Dir => Lookup::Dir,
            },
        })
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, BackendError> {
        let (parent, name) = match self.resolve(path, false)? {
            Resolved::Missing => return Err(BackendError::NotFound),
            Resolved::UnderFile => return Err(BackendError::NotADirectory),
            Resolved::Found(parent, name) => (parent, name),
        };
        match kind_of(parent.dir(), name)? {
            Kind::Missing => Err(BackendError::NotFound),
            Kind::Dir => Err(BackendError::IsADirectory),
            Kind::File => {
                let mut options = OpenOptions::new();
                options.read(true).follow(FollowSymlinks::No);
                let mut file = parent
                    .dir()
                    .open_with(name, &options)
                    .map_err(|err| gone_or(&err))?;
                check_links(&file)?;
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).map_err(|err| io_error(&err))?;
                Ok(bytes)
            }
        }
    }

    fn write(&mut self, path: &str, contents: &[u8]) -> Result<(), BackendError> {
        let (parent, name) = self.writable(path)?;
        write_atomically(
            parent.dir(),
            name.as_ref(),
            contents,
            self.durability == Durability::Synced,
        )
        .map_err(|err| io_error(&err))
    }

    fn append(&mut self, path: &str, contents: &[u8]) -> Result<(), BackendError> {
        let (parent, name) = self.writable(path)?;
        let mut options = OpenOptions::new();
        options.append(true).create(true).follow(FollowSymlinks::No);
        let mut file = parent
            .dir()
            .open_with(name, &options)
            .map_err(|err| io_error(&err))?;
        check_links(&file)?;
        let before = file.metadata().map_err(|err| io_error(&err))?.len();
        let synced = self.durability == Durability::Synced;
        let appended = file
            .write_all(contents)
            .and_then(|()| if synced { file.sync_data() } else { Ok(()) });
        if let Err(err) = appended {
            // Roll back: a failed append (a full disk, say) leaves the file as it was.
            let _ = file.set_len(before);
            if synced {
                let _ = file.sync_data();
            }
            return Err(io_error(&err));
        }
        Ok(())
    }

    fn remove(&mut self, path: &str) -> Result<(), BackendError> {
        let (parent, name) = match self.resolve(path, false)? {
            Resolved::Missing | Resolved::UnderFile => return Err(BackendError::NotFound),
            Resolved::Found(parent, name) => (parent, name),
        };
        let removed = match kind_of(parent.dir(), name)? {
            Kind::Missing => return Err(BackendError::NotFound),
            Kind::File => parent.dir().remove_file(name),
            Kind::Dir => parent.dir().remove_dir(name),
        };
        removed.map_err(|err| gone_or(&err))
    }

    fn list(&self, under: &str) -> Result<Vec<Entry>, BackendError> {
        let start = if under.is_empty() {
            Parent::Root(&self.root)
        } else {
            let mut current = Parent::Root(&self.root);
            for component in under.split('/') {
                current = match step(current.dir(), component, false) {
                    Ok(Step::Dir(opened)) => Parent::Opened(opened),
                    Ok(Step::Missing | Step::File) => return Ok(Vec::new()),
                    // Listings skip symbolic links rather than refuse.
                    Err(err) if err == BackendError::symlink() => return Ok(Vec::new()),
                    Err(err) => return Err(err),
                };
            }
            current
        };
        let mut entries = Vec::new();
        let mut pending: Vec<(String, Option<Dir>)> = vec![(under.to_owned(), None)];
        while let Some((prefix, opened)) = pending.pop() {
            let dir = match &opened {
                Some(dir) => dir,
                None => start.dir(),
            };
            let listing = dir.entries().map_err(|err| BackendError::io(&err))?;
            for entry in listing {
                let entry = entry.map_err(|err| BackendError::io(&err))?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let path = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}/{name}")
                };
                if validate_path(&path).is_err() {
                    continue;
                }
                let file_type = entry.file_type().map_err(|err| BackendError::io(&err))?;
                if file_type.is_dir() {
                    let child = dir
                        .open_dir_nofollow(&name)
                        .map_err(|err| BackendError::io(&err))?;
                    entries.push(Entry {
                        path: path.clone(),
                        kind: EntryKind::Dir,
                    });
                    pending.push((path, Some(child)));
                } else if file_type.is_file() {
                    entries.push(Entry {
                        path,
                        kind: EntryKind::File,
                    });
                }
            }
        }
        Ok(entries)
    }
}
