//! Size limits on the files a Host reads for a run, and a reader that keeps to them.
//!
//! Every file a run reads from the host side (the prompt, `--script`, `--web-script`,
//! `--snapshot`, the declared input file, the config files) is read through [`read_capped`]:
//! only a regular file is read (a FIFO or a device would never end), and never more than its
//! cap, so no input can make the run's own memory grow without bound.

use std::io::Read;
use std::path::Path;

/// The largest prompt file (1 MiB, about 250,000 tokens of text: data belongs in an input
/// file or the store). It also bounds the parser, which keeps some state per line.
pub const PROMPT_FILE_CAP: u64 = 1024 * 1024;
/// The largest `--script` or `--web-script` file.
pub const SCRIPT_FILE_CAP: u64 = 64 * 1024 * 1024;
/// The largest `--snapshot` file.
pub const SNAPSHOT_FILE_CAP: u64 = 16 * 1024 * 1024;
/// The largest declared input file placed in the store.
pub const INPUT_FILE_CAP: u64 = 64 * 1024 * 1024;
/// The largest config file.
pub const CONFIG_FILE_CAP: u64 = 1024 * 1024;

/// Why a capped read failed, as a message naming `what` (the flag or role of the file).
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be opened or read.
    Io(std::io::Error),
    /// Not a regular file: a directory, FIFO, socket or device.
    NotAFile,
    /// Larger than the cap.
    TooLarge {
        /// The cap in bytes.
        cap: u64,
    },
}

impl ReadError {
    /// The error as a sentence about the file at `path`.
    pub fn describe(&self, path: &Path) -> String {
        match self {
            ReadError::Io(err) => format!("cannot read {}: {err}", path.display()),
            ReadError::NotAFile => format!(
                "{} is not a regular file (a directory, pipe or device is never read)",
                path.display()
            ),
            ReadError::TooLarge { cap } => format!(
                "{} is larger than the {cap}-byte limit for this file",
                path.display()
            ),
        }
    }
}

/// The bytes of the regular file at `path`, at most `cap` of them.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, ReadError> {
    // Look before opening: opening a FIFO blocks until someone writes to it.
    if !std::fs::metadata(path).map_err(ReadError::Io)?.is_file() {
        return Err(ReadError::NotAFile);
    }
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    if meta.len() > cap {
        return Err(ReadError::TooLarge { cap });
    }
    // The file may grow while it is read: never take more than one byte past the cap.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > cap {
        return Err(ReadError::TooLarge { cap });
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text.
pub fn read_capped_text(path: &Path, cap: u64) -> Result<String, String> {
    let bytes = read_capped(path, cap).map_err(|e| e.describe(path))?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{} is not valid UTF-8 (first bad byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "12345").unwrap();
        assert_eq!(read_capped(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read_capped(&file, 4),
            Err(ReadError::TooLarge { cap: 4 })
        ));
        assert!(matches!(
            read_capped(dir.path(), 4),
            Err(ReadError::NotAFile)
        ));
        #[cfg(unix)]
        {
            let fifo = dir.path().join("fifo");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            if made.is_ok_and(|s| s.success()) {
                assert!(matches!(read_capped(&fifo, 4), Err(ReadError::NotAFile)));
            }
        }
        #[cfg(unix)]
        assert!(matches!(
            read_capped(Path::new("/dev/zero"), 4),
            Err(ReadError::NotAFile)
        ));
        assert_eq!(
            read_capped(&file, 4).unwrap_err().describe(&file),
            format!(
                "{} is larger than the 4-byte limit for this file",
                file.display()
            )
        );
    }
}
