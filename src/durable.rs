//! Writes that survive a crash: the names a half-done replacement goes by
//! (`<path>.partial` being written, `<path>.previous` being replaced), the syncs
//! that put data and folder entries on disk, and a whole-file replacement through a
//! synced `.partial` and a rename. The run log (`closed_loop/log.rs`) and
//! checkpoints (`train/checkpoint.rs`) share them, so one crash rule holds for every
//! file a run keeps: after a crash at any point, the old version or the new one is
//! there whole.
//!
//! Each returns `std::io::Error`; the caller names the path in its own layer's error.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file or folder being written to replace `path`: `<path>.partial`.
pub fn partial(path: &Path) -> PathBuf {
    sibling(path, ".partial")
}

/// Where `path` goes while its replacement is renamed in: `<path>.previous`.
pub fn previous(path: &Path) -> PathBuf {
    sibling(path, ".previous")
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Flushes a written file's data and metadata (or a folder's entries: the names
/// created or renamed in it) to disk.
pub fn sync(path: &Path) -> std::io::Result<()> {
    File::open(path)?.sync_all()
}

/// Flushes the entries of the folder holding `path` (after `path` was created or
/// renamed). A bare relative name lives in the current folder.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync(parent),
        None => sync(Path::new(".")),
    }
}

/// Replaces `path`'s contents with `bytes` so that a crash leaves the old file or
/// the new one whole: written to [`partial`], synced, renamed over `path`, and the
/// folder synced. Errors name no path: it is always `path`'s to report.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let partial = partial(path);
    let mut file = File::create(&partial)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&partial, path)?;
    sync_parent(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sit_beside_the_path() {
        let p = Path::new("runs/r/checkpoint");
        assert_eq!(partial(p), Path::new("runs/r/checkpoint.partial"));
        assert_eq!(previous(p), Path::new("runs/r/checkpoint.previous"));
        assert_eq!(
            partial(Path::new("log.jsonl")),
            Path::new("log.jsonl.partial")
        );
    }

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_leaves_no_partial() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        std::fs::write(&path, b"old\n").unwrap();
        replace_file(&path, b"new\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new\n");
        assert!(!partial(&path).exists());
    }
}
