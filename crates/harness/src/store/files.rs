//! Input and output files ("Input and output files" in chapter 02): the Harness places the
//! declared input file in the store before the run and collects the declared output file
//! after it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use super::{Store, StoreError};

/// Why an input file could not be placed or an output file collected.
#[derive(Debug)]
pub enum TransferError {
    /// The host input file could not be read.
    ReadHost {
        /// The host file.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// The host output file could not be written.
    WriteHost {
        /// The host file.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// The store refused: an invalid declared path, or (collecting) a missing output file,
    /// `file not found in store: {path}`.
    Store(StoreError),
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransferError::ReadHost { path, source } => {
                write!(f, "cannot read input file {}: {source}", path.display())
            }
            TransferError::WriteHost { path, source } => {
                write!(f, "cannot write output file {}: {source}", path.display())
            }
            TransferError::Store(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for TransferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TransferError::ReadHost { source, .. } | TransferError::WriteHost { source, .. } => {
                Some(source)
            }
            TransferError::Store(err) => Some(err),
        }
    }
}

impl From<StoreError> for TransferError {
    fn from(err: StoreError) -> Self {
        TransferError::Store(err)
    }
}

/// Places the host file `host_file` in the store at `store_path` (the declared `input.path`),
/// before the run. The bytes are copied as they are.
pub fn place_input_file(
    store: &mut Store,
    store_path: &str,
    host_file: &Path,
) -> Result<(), TransferError> {
    let bytes =
        crate::limits::read_capped(host_file, crate::limits::INPUT_FILE_CAP).map_err(|err| {
            TransferError::ReadHost {
                path: host_file.to_path_buf(),
                source: match err {
                    crate::limits::ReadError::Io(source) => source,
                    other => io::Error::other(other.describe(host_file)),
                },
            }
        })?;
    store.seed(store_path, &bytes)?;
    Ok(())
}

/// Copies the store file at `store_path` (the declared `output.path`) to the host file
/// `host_file` after the run, atomically (a synced temporary file in the same directory,
/// renamed into place). A missing output file fails with `file not found in store: {path}`.
pub fn collect_output_file(
    store: &Store,
    store_path: &str,
    host_file: &Path,
) -> Result<(), TransferError> {
    let bytes = store.read_bytes(store_path)?;
    let write_error = |source: io::Error| TransferError::WriteHost {
        path: host_file.to_path_buf(),
        source,
    };
    let name = host_file.file_name().ok_or_else(|| {
        write_error(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the output path names no file",
        ))
    })?;
    let parent = match host_file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let dir = Dir::open_ambient_dir(parent, ambient_authority()).map_err(write_error)?;
    super::dir::write_atomically(&dir, name, &bytes, true).map_err(write_error)
}
