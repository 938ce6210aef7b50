//! The import graph inside each layer has no circle: within a folder of `src/`, the
//! files import each other one way (shared types live in leaf files such as
//! `rollout/cost.rs`, `env/config.rs`, `closed_loop/config.rs`). Read from the
//! source's `use` paths — `super::x`, `crate::<layer>::x`, and names the folder's
//! `mod.rs` re-exports from a file — so a new circle fails here, named.
//!
//! The layers listed in `ACYCLIC` are those without a circle today; `advantage`,
//! `engine`, `model` and `serve` still have some (e.g. `engine/core.rs` ↔
//! `engine/weights.rs`) and join the list as they are untangled.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Layers whose files must not import each other in a circle.
const ACYCLIC: &[&str] = &[
    "rollout",
    "env",
    "closed_loop",
    "kv",
    "train",
    "bench",
    "view",
    "cli",
    "compare",
];

/// The identifiers a path's tail names: `x` or every word of `{x, y::z, …}`.
fn names_after(text: &str) -> Vec<String> {
    let rest = text.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 1;
        let end = group
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(group.len(), |(i, _)| i);
        group[..end]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect()
    } else {
        let word: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        vec![word]
    }
}

/// Every name a source text reaches through one of `prefixes`.
fn reached(source: &str, prefixes: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        for prefix in prefixes {
            for (at, _) in code.match_indices(prefix.as_str()) {
                out.extend(names_after(&code[at + prefix.len()..]));
            }
        }
    }
    out
}

/// The `.rs` sources of a module: a file, or every file under a subfolder.
fn sources(path: &Path) -> Vec<String> {
    if path.is_dir() {
        let mut all = Vec::new();
        for entry in fs::read_dir(path).unwrap() {
            all.extend(sources(&entry.unwrap().path()));
        }
        all
    } else if path.extension().is_some_and(|e| e == "rs") {
        vec![fs::read_to_string(path).unwrap()]
    } else {
        Vec::new()
    }
}

/// The modules of a layer folder and, for each, the modules of the same folder it
/// imports.
fn layer_graph(layer: &str) -> BTreeMap<String, BTreeSet<String>> {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(layer);
    let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in fs::read_dir(&folder).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if stem != "mod" && (path.is_dir() || path.extension().is_some_and(|e| e == "rs")) {
            modules.insert(stem, sources(&path));
        }
    }
    // Names mod.rs re-exports, by the module they come from.
    let mod_rs = fs::read_to_string(folder.join("mod.rs")).unwrap_or_default();
    let mut reexported: BTreeMap<String, String> = BTreeMap::new();
    for module in modules.keys() {
        for name in reached(&mod_rs, &[format!("pub use {module}::")]) {
            reexported.insert(name, module.clone());
        }
    }
    let prefixes = ["super::".to_owned(), format!("crate::{layer}::")];
    modules
        .iter()
        .map(|(module, texts)| {
            let mut imports = BTreeSet::new();
            for text in texts {
                for name in reached(text, &prefixes) {
                    let target = if modules.contains_key(&name) {
                        Some(name)
                    } else {
                        reexported.get(&name).cloned()
                    };
                    if let Some(t) = target.filter(|t| t != module) {
                        imports.insert(t);
                    }
                }
            }
            (module.clone(), imports)
        })
        .collect()
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
fn no_layer_in_the_list_has_a_circle_of_imports_inside_it() {
    for layer in ACYCLIC {
        let graph = layer_graph(layer);
        assert!(graph.len() > 1, "src/{layer} has too few files to check");
        if let Some(circle) = find_circle(&graph) {
            panic!(
                "a circle of imports inside src/{layer}: {}",
                circle.join(" → ")
            );
        }
    }
}

#[test]
fn the_reader_finds_a_circle_when_there_is_one() {
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
    assert_eq!(
        reached(
            "use super::{cost::ForestCost, summary};\nuse crate::rollout::Tree; // super::x",
            &["super::".into(), "crate::rollout::".into()]
        ),
        ["ForestCost", "Tree", "cost", "summary"]
            .map(String::from)
            .into()
    );
}
