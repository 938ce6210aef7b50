#!/usr/bin/env python3
"""Circles of imports between the files of each folder of src/.

Inside a folder, files should import each other one way: shared types live in
leaf files, and a circle (a.rs uses b.rs, which uses a.rs) means a concept is
split across two files or a type sits too high. This reads every `super::`,
`self::` and `crate::` path in the sources (comments stripped, `use` groups
spanning lines included), resolves it against the file's module path, and for
each folder builds the graph "child module -> child modules it reaches" (a
name that the folder's mod.rs re-exports counts as its source file). It prints
each folder's circles and exits 1 if there is any.

    python3 scripts/import_cycles.py            # every folder
    python3 scripts/import_cycles.py engine kv  # some folders (paths under src/)

tests/module_graph_tests.rs applies the same rule in `cargo test`.
"""

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PATH_START = re.compile(r"\b(crate|super|self)::")


def strip_comments(text):
    """The source without // and /* */ comments or string literals' contents."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif text.startswith("'\"'", i):
            i += 3  # the character '"', not a string
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def module_path(file):
    """src/a/b/c.rs -> ['a','b','c']; src/a/b/mod.rs -> ['a','b']."""
    parts = list(file.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def group_items(text):
    """The top-level items of `{a, b::{c}, d}` starting right after the `{`."""
    items, depth, current = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def segments(text):
    """The leading path segments of a path tail: 'a::b::{..}' -> ['a','b']."""
    segs = []
    rest = text
    while True:
        rest = rest.lstrip()
        m = IDENT.match(rest)
        if not m:
            return segs, rest
        segs.append(m.group(0))
        rest = rest[m.end():].lstrip()
        if not rest.startswith("::"):
            return segs, ""
        rest = rest[2:]
        if rest.lstrip().startswith("{"):
            return segs, rest.lstrip()


def reached_paths(source, here):
    """Every absolute module path (list of names) the source names."""
    found = []
    for m in PATH_START.finditer(source):
        if m.start() > 0 and source[m.start() - 1] == ":":
            continue  # the middle of a longer path (`a::super::`) is not a start
        base = [] if m.group(1) == "crate" else list(here)
        rest = source[m.end():]
        if m.group(1) == "super":
            base = base[:-1]
            while rest.startswith("super::"):
                base = base[:-1]
                rest = rest[len("super::"):]
        segs, group = segments(rest)
        prefix = base + segs
        if group.startswith("{"):
            for item in group_items(group[1:]):
                sub, _ = segments(item)
                if sub and sub[0] != "self":
                    found.append(prefix + sub[:1])
                else:
                    found.append(prefix)
        else:
            found.append(prefix)
    return found


def reexports(folder, children):
    """Names the folder's mod.rs re-exports (`pub use child::Name`), by child."""
    mod_rs = folder / "mod.rs"
    if not mod_rs.exists():
        return {}
    text = strip_comments(mod_rs.read_text())
    names = {}
    for m in re.finditer(r"pub(?:\([a-z]+\))?\s+use\s+(?:self::)?([A-Za-z_][A-Za-z0-9_]*)::", text):
        child = m.group(1)
        if child not in children:
            continue
        rest = text[m.end():]
        if rest.lstrip().startswith("{"):
            for item in group_items(rest.lstrip()[1:]):
                words = IDENT.findall(item)
                if words:
                    names[words[-1]] = child  # `X as Y` exports Y
        else:
            words = IDENT.findall(rest.split(";", 1)[0])
            if words:
                names[words[-1]] = child
    return names


def folder_graph(folder):
    """child module -> set of sibling child modules it imports."""
    base = module_path(folder / "mod.rs")
    children = {}
    for entry in folder.iterdir():
        if entry.name == "mod.rs":
            continue
        if entry.is_dir():
            children[entry.name] = sorted(entry.rglob("*.rs"))
        elif entry.suffix == ".rs":
            children[entry.stem] = [entry]
    exported = reexports(folder, children)
    graph = {child: set() for child in children}
    for child, files in children.items():
        for file in files:
            source = strip_comments(file.read_text())
            for path in reached_paths(source, module_path(file)):
                if path[: len(base)] != base or len(path) <= len(base):
                    continue
                name = path[len(base)]
                target = name if name in children else exported.get(name)
                if target and target != child:
                    graph[child].add(target)
    return graph


def circles(graph):
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def main(argv):
    folders = [SRC / a for a in argv] if argv else sorted(
        p for p in SRC.rglob("*") if p.is_dir() and (p / "mod.rs").exists()
    )
    total = 0
    for folder in folders:
        graph = folder_graph(folder)
        found = circles(graph)
        name = folder.relative_to(SRC)
        if not found:
            print(f"src/{name}: 0 circles ({len(graph)} modules)")
            continue
        total += len(found)
        print(f"src/{name}: {len(found)} circle(s)")
        for group in found:
            edges = [f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
            print(f"  {{{', '.join(group)}}}: " + "; ".join(edges))
    print(f"{total} circle(s) in {len(folders)} folders")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
