//! ARCHITECTURE.md stays true: every source path it names exists, and its table of
//! imports is each layer's real one (the folder's `crate::<layer>` paths; for the
//! binary, `src/bin` and `src/cli`'s `treegrpo::<layer>` ones; for the Python
//! binding, `python/src`'s). A file renamed or an import added without the document
//! fails here, named.

#[path = "support/source_files.rs"]
mod source_files;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use source_files::rust_files;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file of the checkout below `dir` (build output and caches left out), as
/// paths relative to the root with `/` separators.
fn all_files(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') && name != ".ci" || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            all_files(&path, out);
        } else {
            let rel = path.strip_prefix(root()).unwrap();
            out.insert(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The source-file names in one backticked span of the document.
fn named_paths(span: &str) -> Vec<&str> {
    const KINDS: [&str; 6] = [".rs", ".py", ".pyi", ".md", ".toml", ".sh"];
    // Files the tools write, which the document names as outputs.
    const OUTPUTS: [&str; 1] = ["report.md"];
    span.split(|c: char| !(c.is_alphanumeric() || "_./-".contains(c)))
        .filter(|w| KINDS.iter().any(|k| w.ends_with(k)) && w.len() > 3)
        .filter(|w| !OUTPUTS.contains(w))
        .collect()
}

#[test]
fn every_path_the_architecture_names_exists() {
    let doc = fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut files = BTreeSet::new();
    all_files(&root(), &mut files);
    let mut section: Option<String> = None;
    let mut missing = Vec::new();
    let mut checked = 0;
    for line in doc.lines() {
        if let Some(rest) = line.strip_prefix("### `") {
            section = rest
                .split('`')
                .next()
                .map(|s| s.trim_end_matches('/').to_owned());
        } else if line.starts_with("## ") || line.starts_with("### ") {
            section = None;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 0 {
                continue; // outside backticks
            }
            for path in named_paths(span) {
                checked += 1;
                let path = path.trim_start_matches("./");
                let under = |folder: &str| {
                    let prefix = format!("{folder}/");
                    files.contains(&format!("{prefix}{path}"))
                        || files
                            .iter()
                            .any(|f| f.starts_with(&prefix) && f.ends_with(&format!("/{path}")))
                };
                let found = files.contains(path)
                    || section.as_deref().is_some_and(under)
                    || ["src", "tests", "python"].into_iter().any(under);
                if !found {
                    missing.push(format!("{path} (in {})", section.as_deref().unwrap_or("-")));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths read: is the reader broken?"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The first segment of every `<prefix>::` path in `source` (groups included).
fn first_segments(source: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let pattern = format!("{prefix}::");
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices(&pattern) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c == '_' || c == ':' || c.is_alphanumeric()) {
                continue;
            }
            let rest = &code[at + pattern.len()..];
            let words: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group
                    .split(',')
                    .map(|item| item.trim().split("::").next().unwrap_or(""))
                    .collect(),
                None => vec![rest.split("::").next().unwrap_or("")],
            };
            for w in words {
                let w: String = w
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !w.is_empty() {
                    out.insert(w);
                }
            }
        }
    }
    out
}

/// The layers that `files` import through `prefix`.
fn imported_layers(files: &[PathBuf], prefix: &str, layers: &BTreeSet<String>) -> BTreeSet<String> {
    files
        .iter()
        .flat_map(|f| first_segments(&fs::read_to_string(f).unwrap(), prefix))
        .filter(|s| layers.contains(s))
        .collect()
}

#[test]
fn the_import_table_is_every_layers_real_imports() {
    let src = root().join("src");
    let layers: BTreeSet<String> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && p.join("mod.rs").exists())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut actual: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for layer in &layers {
        let mut got = imported_layers(&rust_files(&src.join(layer)), "crate", &layers);
        got.remove(layer);
        actual.insert(layer.clone(), got);
    }
    let mut binary = rust_files(&src.join("cli"));
    binary.extend(rust_files(&src.join("bin")));
    actual.insert("cli".into(), imported_layers(&binary, "treegrpo", &layers));
    actual.insert(
        "python/".into(),
        imported_layers(&rust_files(&root().join("python/src")), "treegrpo", &layers),
    );

    let doc = fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| `layer` | a, b, c |`
        if cells.len() == 4 && cells[1].starts_with('`') && cells[1].ends_with('`') {
            let layer = cells[1].trim_matches('`').to_owned();
            let imports = cells[2]
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty() && *s != "—")
                .map(str::to_owned)
                .collect();
            documented.insert(layer, imports);
        }
    }
    let mut wrong = Vec::new();
    for (layer, got) in &actual {
        match documented.get(layer) {
            None => wrong.push(format!("{layer}: not in the table (imports {got:?})")),
            Some(listed) if listed != got => wrong.push(format!(
                "{layer}: the table says {listed:?}, the code imports {got:?}"
            )),
            Some(_) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's import table is out of date:\n{}",
        wrong.join("\n")
    );
    // Only model, engine and train name candle's types among the library's layers.
    for layer in [
        "cli",
        "compare",
        "closed_loop",
        "rollout",
        "serve",
        "env",
        "kv",
        "view",
        "bench",
    ] {
        for file in rust_files(&src.join(layer)) {
            let text = fs::read_to_string(&file).unwrap();
            assert!(
                !text
                    .lines()
                    .any(|l| l.trim_start().starts_with("use candle_core")),
                "{} imports candle_core",
                file.display()
            );
        }
    }
}
