//! The import graph inside each folder of `src/` has no circle: the files of a folder
//! import each other one way (shared types live in leaf files such as
//! `rollout/cost.rs`, `engine/weight_version.rs`, `serve/session_table.rs`). Read
//! from the source's `crate::`, `super::` and `self::` paths — resolved against each
//! file's own module path, `use` groups spanning lines included, comments and string
//! literals left out — and names a folder's `mod.rs` re-exports from a file, so a new
//! circle fails here, named. `scripts/import_cycles.py` is the same reader, for a
//! report of every folder outside `cargo test`.

#[path = "support/source_files.rs"]
mod source_files;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use source_files::rust_files;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The source without comments, and with string literals emptied.
fn strip_comments(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if text[i..].starts_with("//") {
            i = text[i..].find('\n').map_or(bytes.len(), |j| i + j);
        } else if text[i..].starts_with("/*") {
            i = text[i + 2..]
                .find("*/")
                .map_or(bytes.len(), |j| i + 2 + j + 2);
        } else if text[i..].starts_with("'\"'") {
            i += 3; // the character '"', not a string
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// `src/a/b/c.rs` → `[a, b, c]`; `src/a/b/mod.rs` → `[a, b]`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn ident_len(text: &str) -> usize {
    text.char_indices()
        .find(|&(i, c)| !(c == '_' || c.is_alphanumeric()) || (i == 0 && c.is_numeric()))
        .map_or(text.len(), |(i, _)| i)
}

/// The top-level items of a `use` group, `text` starting right after its `{`.
fn group_items(text: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&text[start..i]);
                return items
                    .into_iter()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The leading segments of a path tail (`a::b::{…}` → `[a, b]`) and what follows
/// them when it is a group (starting at its `{`).
fn segments(text: &str) -> (Vec<String>, &str) {
    let mut segs = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        let n = ident_len(rest);
        if n == 0 {
            return (segs, rest);
        }
        segs.push(rest[..n].to_owned());
        rest = rest[n..].trim_start();
        match rest.strip_prefix("::") {
            Some(after) if after.trim_start().starts_with('{') => {
                return (segs, after.trim_start())
            }
            Some(after) => rest = after,
            None => return (segs, ""),
        }
    }
}

/// Every absolute module path the source names.
fn reached_paths(source: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in source.match_indices(start) {
            let before = source[..at].chars().next_back();
            if before.is_some_and(|c| c == ':' || c == '_' || c.is_alphanumeric()) {
                continue; // inside a longer path or name
            }
            let mut base: Vec<String> = if start == "crate::" {
                Vec::new()
            } else {
                here.to_vec()
            };
            let mut rest = &source[at + start.len()..];
            if start == "super::" {
                base.pop();
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
            }
            let (segs, group) = segments(rest);
            let mut prefix = base;
            prefix.extend(segs);
            if let Some(inner) = group.strip_prefix('{') {
                for item in group_items(inner) {
                    let (sub, _) = segments(item);
                    let mut path = prefix.clone();
                    if let Some(first) = sub.first().filter(|s| *s != "self") {
                        path.push(first.clone());
                    }
                    found.push(path);
                }
            } else {
                found.push(prefix);
            }
        }
    }
    found
}

/// Names a folder's `mod.rs` re-exports (`pub use child::Name`), by child.
fn reexports(folder: &Path, children: &BTreeMap<String, Vec<PathBuf>>) -> BTreeMap<String, String> {
    let text = strip_comments(&fs::read_to_string(folder.join("mod.rs")).unwrap_or_default());
    let mut names = BTreeMap::new();
    for line in text.split(';') {
        let Some(at) = line.find("use ") else {
            continue;
        };
        if !line[..at].trim_start().starts_with("pub") {
            continue;
        }
        let tail = line[at + 4..].trim_start();
        let tail = tail.strip_prefix("self::").unwrap_or(tail);
        let (segs, group) = segments(tail);
        let Some(child) = segs.first().filter(|c| children.contains_key(*c)) else {
            continue;
        };
        let items: Vec<&str> = match group.strip_prefix('{') {
            Some(inner) => group_items(inner),
            None => vec![tail],
        };
        for item in items {
            // `X as Y` exports Y: the last word.
            if let Some(word) = item
                .split(|c: char| !(c == '_' || c.is_alphanumeric()))
                .rfind(|w| !w.is_empty())
            {
                names.insert(word.to_owned(), child.clone());
            }
        }
    }
    names
}

/// A folder's child modules and, for each, the children it imports.
fn folder_graph(folder: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let base = module_path(&folder.join("mod.rs"));
    let mut children: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            children.insert(name, rust_files(&path));
        } else if name != "mod" && path.extension().is_some_and(|e| e == "rs") {
            children.insert(name, vec![path]);
        }
    }
    let exported = reexports(folder, &children);
    children
        .iter()
        .map(|(child, files)| {
            let mut imports = BTreeSet::new();
            for file in files {
                let source = strip_comments(&fs::read_to_string(file).unwrap());
                for path in reached_paths(&source, &module_path(file)) {
                    if path.len() <= base.len() || path[..base.len()] != base[..] {
                        continue;
                    }
                    let name = &path[base.len()];
                    let target = if children.contains_key(name) {
                        Some(name.clone())
                    } else {
                        exported.get(name).cloned()
                    };
                    if let Some(t) = target.filter(|t| t != child) {
                        imports.insert(t);
                    }
                }
            }
            (child.clone(), imports)
        })
        .collect()
}

/// Every folder of `src/` that is a module (has a `mod.rs`).
fn module_folders(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.join("mod.rs").exists() {
                out.push(path.clone());
            }
            out.extend(module_folders(&path));
        }
    }
    out.sort();
    out
}

/// One circle of the graph, as the modules along it, if there is any.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

#[test]
fn no_folder_has_a_circle_of_imports_inside_it() {
    let folders = module_folders(&src());
    // Every layer of lib.rs and the subfolders (kv/cache, model/kernels, …).
    assert!(
        folders.len() >= 19,
        "found only {} module folders",
        folders.len()
    );
    let mut circles = Vec::new();
    for folder in &folders {
        if let Some(circle) = find_circle(&folder_graph(folder)) {
            let name = folder.strip_prefix(src()).unwrap().display().to_string();
            circles.push(format!("src/{name}: {}", circle.join(" → ")));
        }
    }
    assert!(
        circles.is_empty(),
        "circles of imports:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_resolves_paths_and_finds_a_circle_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_circle(&graph).map(|c| c.join(" → ")),
        Some("a → b → c → a".into())
    );
    let here: Vec<String> = ["rollout", "sampler"].map(String::from).into();
    let source = strip_comments(
        "use super::{\n    cost::ForestCost,\n    summary,\n};\n\
         use crate::engine::Engine; // super::ignored\n\
         let s = \"super::in_a_string\";\nsuper::super::model::x();",
    );
    let reached: BTreeSet<String> = reached_paths(&source, &here)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        reached,
        [
            "rollout::cost",
            "rollout::summary",
            "engine::Engine",
            "model::x"
        ]
        .map(String::from)
        .into()
    );
    // The real tree: the serve folder's handlers import the state, never the reverse.
    let serve = folder_graph(&src().join("serve"));
    assert!(serve["sessions"].contains("state"));
    assert!(!serve["state"].contains("sessions"));
    assert!(serve["state"].contains("session_table"));
}
