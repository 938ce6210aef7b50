//! Reading the checkout's own sources, for the tests that check its structure
//! (`module_graph_tests`, `architecture_doc_tests`), without the heavier `common`.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`, subfolders included.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}
