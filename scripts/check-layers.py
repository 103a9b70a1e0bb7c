#!/usr/bin/env python3
"""Checks the crate's module layering: which top-level module may use which.

    scripts/check-layers.py          check; exit 1 on a cycle or a use the table forbids
    scripts/check-layers.py --graph  print the edges found (module -> modules it uses)

A top-level module is a first path segment under src/ (`choria`, `config`,
`provision`, ... ; `main.rs` and `lib.rs` are the crate root). An edge A -> B is
any `crate::B` path in A's non-test code: files named tests.rs and everything
after a file's trailing `#[cfg(test)]` are left out, since tests may reach
across (a test of the provisioner's leadership builds a provisioner).

ALLOWED below is the table ARCHITECTURE.md documents ("What each module may
use"); a use outside it fails, and so does any cycle, even an allowed one.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

# module -> the modules it may use. Bottom first.
ALLOWED = {
    "backoff": set(),
    "k8s": set(),
    "telemetry": {"config"},
    "choria": set(),
    "config": {"choria", "k8s"},
    "crd": {"config"},
    "monitor": set(),
    "election": {"backoff", "choria", "config", "k8s"},
    "fleet": {"choria"},
    "records": {"choria", "config"},
    "provision": {"backoff", "choria", "config", "crd", "election", "k8s", "monitor", "records"},
    "operator": {"choria", "config", "crd", "election", "k8s", "monitor", "provision"},
    "cmd": {"choria", "config", "crd", "fleet", "monitor", "operator", "provision", "records", "telemetry"},
}
USE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def module_of(path):
    rel = os.path.relpath(path, ROOT)
    first = rel.split(os.sep)[0]
    if first in ("lib.rs", "main.rs"):
        return None
    return first[:-3] if first.endswith(".rs") else first


def non_test_text(path):
    if os.path.basename(path) == "tests.rs":
        return ""
    lines = open(path, encoding="utf-8").read().split("\n")
    cut = len(lines)
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]":
            cut = i  # the last one wins: the trailing test module
    # only cut when what follows is a test module, not a test-only helper
    # in the middle of a file
    if cut < len(lines) - 1 and re.match(r"^(pub(\(crate\))? )?mod tests", lines[cut + 1]):
        lines = lines[:cut]
    text = "\n".join(lines)
    # drop comments: doc links such as [`crate::provision::Handle`] are not uses
    return "\n".join(l.split("//")[0] for l in text.split("\n"))


def edges():
    found = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            m = module_of(path)
            if m is None:
                continue
            for used in USE.findall(non_test_text(path)):
                if used != m:
                    found.setdefault(m, {}).setdefault(used, set()).add(
                        os.path.relpath(path, os.path.join(ROOT, ".."))
                    )
    return found


def cycles(graph):
    out = []
    state = {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, {})):
            if state.get(m) == 1:
                out.append(stack[stack.index(m):] + [m])
            elif state.get(m) is None:
                visit(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if state.get(n) is None:
            visit(n, [])
    return out


def main():
    graph = edges()
    if "--graph" in sys.argv[1:]:
        for m in sorted(set(graph) | set(ALLOWED)):
            print(f"{m} -> {', '.join(sorted(graph.get(m, {}))) or '(nothing)'}")
        return 0
    failed = False
    for m, used in sorted(graph.items()):
        if m not in ALLOWED:
            print(f"check-layers: module {m} is not in the table (scripts/check-layers.py, ARCHITECTURE.md)")
            failed = True
            continue
        for u, files in sorted(used.items()):
            if u not in ALLOWED[m]:
                print(f"check-layers: {m} may not use {u} (in {', '.join(sorted(files))})")
                failed = True
    for c in cycles(graph):
        print(f"check-layers: import cycle: {' -> '.join(c)}")
        failed = True
    if failed:
        return 1
    print(f"check-layers: {len(graph)} modules, no cycle, every use allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
