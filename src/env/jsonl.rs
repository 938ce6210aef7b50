//! JSONL reading and writing with errors that name the file and line, since
//! a bad data file is the one misuse users will actually hit.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::env::error::EnvError;

/// Reads one record per non-blank line.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, EnvError> {
    Ok(read_jsonl_lines(path)?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// Like [`read_jsonl`], with each record's 1-based line number, so later
/// validation can point at the line too.
pub fn read_jsonl_lines<T: DeserializeOwned>(path: &Path) -> Result<Vec<(usize, T)>, EnvError> {
    let text = fs::read_to_string(path).map_err(|source| EnvError::Io {
        op: "read",
        path: path.to_owned(),
        source,
    })?;
    parse_jsonl_lines(&text, path)
}

/// Parses JSONL `text` that came from `path` (named in errors; for data embedded in
/// the binary, the file it was embedded from).
pub fn parse_jsonl_lines<T: DeserializeOwned>(
    text: &str,
    path: &Path,
) -> Result<Vec<(usize, T)>, EnvError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(line).map_err(|source| EnvError::JsonLine {
            path: path.to_owned(),
            line: i + 1,
            source,
        })?;
        out.push((i + 1, record));
    }
    Ok(out)
}

/// Writes one compact JSON record per line, creating parent folders.
pub fn write_jsonl<T: Serialize>(path: &Path, records: &[T]) -> Result<(), EnvError> {
    let io = |op, source| EnvError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| io("create the folder of", e))?;
    }
    let mut buf = Vec::new();
    for record in records {
        // Serializing plain data structs cannot fail; map it anyway rather
        // than unwrap.
        serde_json::to_writer(&mut buf, record)
            .map_err(|e| io("serialize", std::io::Error::other(e)))?;
        buf.push(b'\n');
    }
    let mut file = fs::File::create(path).map_err(|e| io("create", e))?;
    file.write_all(&buf).map_err(|e| io("write", e))
}
