#!/usr/bin/env python3
"""Functions over 100 lines and files over 600 lines: in src/, python/src/, benches/
and examples/ (the rule), and with --tests in tests/ too (reported, scenario tests
may run long).

A function is counted from its `fn` line to its closing brace (comments and blank
lines included: they are read too). Kernels may be long and straight-line where
that is the clearest form; such a function carries a `// long-by-design:` comment
with the reason within the five lines above its `fn`, and is listed apart.

    python3 scripts/long_functions.py          # report; exit 1 if any is over
    python3 scripts/long_functions.py --tests  # the tests as well
    python3 scripts/long_functions.py --limit 80 --file-limit 500
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FN = re.compile(r"^\s*(?:pub(?:\([a-z:]+\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def code_only(line):
    """The line without a trailing // comment or string contents (braces in strings
    and comments must not count)."""
    out, i, in_str = [], 0, False
    while i < len(line):
        c = line[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_str = False
            i += 1
            continue
        if line.startswith("//", i):
            break
        if line.startswith("'\"'", i) or line.startswith("'{'", i) or line.startswith("'}'", i):
            i += 3
            continue
        if c == '"':
            in_str = True
        else:
            out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    """(name, first line, length, long-by-design) of each fn with a body."""
    lines = path.read_text().splitlines()
    found = []
    for start, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, opened = 0, False
        for end in range(start, len(lines)):
            code = code_only(lines[end])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration without a body (trait item)
            for ch in code:
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                above = "\n".join(lines[max(0, start - 5):start])
                found.append((m.group(1), start + 1, end - start + 1, "long-by-design:" in above))
                break
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--file-limit", type=int, default=600)
    ap.add_argument("--tests", action="store_true", help="also check tests/")
    args = ap.parse_args()
    over, by_design, long_files = [], [], []
    folders = ["src", "python/src", "benches", "examples"] + (["tests"] if args.tests else [])
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.rs")):
            rel = path.relative_to(ROOT)
            n = len(path.read_text().splitlines())
            if n > args.file_limit:
                long_files.append((n, rel))
            for name, line, length, design in functions(path):
                if length > args.limit:
                    (by_design if design else over).append((length, f"{rel}:{line}", name))
    for title, rows in (("functions over the limit", over), ("long by design", by_design)):
        print(f"{title} ({args.limit} lines): {len(rows)}")
        for length, at, name in sorted(rows, reverse=True):
            print(f"  {length:4d}  {name}  {at}")
    print(f"files over {args.file_limit} lines: {len(long_files)}")
    for n, rel in sorted(long_files, reverse=True):
        print(f"  {n:4d}  {rel}")
    return 1 if over or long_files else 0


if __name__ == "__main__":
    sys.exit(main())
