#!/usr/bin/env python3
"""Checks what Cargo cannot: the layers inside the crates, and their size.

    scripts/check-layers.py          check; exit 1 on any finding
    scripts/check-layers.py --graph  print choria-core's rooms and what each uses

Cargo already refuses a crate that uses one it does not depend on, so the
layers between crates (ARCHITECTURE.md, "Crates") hold by construction. What
this script checks is inside them:

1. No import cycle between files, in any crate: a file that uses another
   (through `crate::`, `super::` or `self::` paths) must not be used back,
   directly or around a circle.
2. choria-core's rooms use only what ROOMS allows (ARCHITECTURE.md, "Rooms
   inside the provisioner"), and the rooms form no cycle.
3. No file over MAX_FILE lines and no function over MAX_FN lines, leaving
   out tests (files named tests.rs, trailing `#[cfg(test)] mod tests`) and
   the declarative tables in TABLES.

4. Every module is documented where a newcomer looks: each crate's root
   doc names each module the root declares (in backticks, linked or not),
   and ARCHITECTURE.md names every source file (its name, in an inline code
   span: `driver.rs`, `election/driver.rs` or `driver`), tests.rs and
   mod.rs aside.

Only non-test code counts: tests may reach across (a test of the
leadership glue builds a provisioner).
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CRATES = {
    "choria-provisioner": "src",
    "choria-wire": "crates/wire/src",
    "choria-config": "crates/config/src",
    "choria-k8s": "crates/k8s/src",
    "choria-replica": "crates/replica/src",
    "choria-core": "crates/core/src",
    "choria-operator": "crates/operator/src",
    "choria-fleet": "crates/fleet/src",
}
MAX_FILE = 600
MAX_FN = 80
# Functions that are declarative tables: one entry per line, nothing to split.
TABLES = {
    ("crates/core/src/provision/metrics.rs", "new"),  # every metric, registered at 0
    ("crates/k8s/src/crd/validation.rs", "rules"),  # the CRD's CEL rules
    ("crates/operator/src/build/config.rs", "provisioner_yaml"),  # spec field -> file key, one a line
}

# choria-core's rooms, most specific first: a file belongs to the first
# whose module path prefixes its own.
ROOM_ORDER = [
    "provision/pipeline/registry",
    "provision/pipeline/lanes",
    "provision/pipeline",
    "provision/sequence",
    "provision/signing",
    "provision/day_two/recorder",
    "provision/day_two",
    "provision/kube",
    "provision/steering",
    "provision/metrics",
    "provision/gate",
    "provision/suspects",
    "provision/ownership",
    "provision/text",
    "provision/traces",
    "provision",
    "election",
    "records",
    "revocations",
    "held",
    "bindings",
    "admission",
    "evidence",
    "audit",
    "monitor",
    "backoff",
]
# room -> the rooms it may use (ARCHITECTURE.md). Leaves first.
ROOMS = {
    "backoff": set(),
    "monitor": set(),
    "records": set(),
    # What the provisioner remembers, a room each: the sealed buckets (records),
    # the followers that read them back, the plans of the resource's lists.
    "held": {"records", "backoff"},
    "bindings": {"records"},
    "election": {"backoff"},
    "provision/text": set(),
    # One trace per node sequence and its OTLP exporter: knows no room.
    "provision/traces": set(),
    "admission": {"provision/text", "records", "held", "evidence"},
    "evidence": {"records", "bindings"},
    "provision/metrics": {"monitor", "records"},
    "revocations": {"records", "backoff", "monitor", "provision/metrics", "provision/text"},
    "audit": {"backoff", "records", "provision/metrics"},
    "provision/gate": {"provision/metrics"},
    "provision/suspects": {"provision/metrics"},
    "provision/ownership": {"election"},
    "provision/pipeline/registry": {"provision/metrics", "provision/suspects"},
    "provision/pipeline/lanes": {"provision/pipeline/registry"},
    "provision/day_two/recorder": {"backoff", "records", "provision/metrics"},
    "provision/signing": {"provision/gate", "provision/text"},
    # What steers a running provisioner: the gate, the registry it empties,
    # readiness, the shards' ownership.
    "provision/steering": {
        "monitor", "provision/metrics", "provision/gate", "provision/ownership",
        "provision/pipeline/registry",
    },
    "provision/sequence": {
        "records", "provision/metrics", "provision/gate", "provision/suspects",
        "provision/ownership", "provision/signing", "provision/day_two/recorder",
        "provision/pipeline/registry", "provision/pipeline/lanes", "admission",
        "provision/text", "audit", "evidence", "held", "revocations", "provision/traces",
    },
    "provision/day_two": {
        "backoff", "election", "monitor", "records", "provision/metrics", "provision/gate",
        "provision/ownership", "provision/suspects", "provision/text", "provision/signing",
        "provision/pipeline/registry", "provision/day_two/recorder", "audit", "held",
        "revocations",
    },
    # spec.revocations: the pods write the resource's list into the
    # revocations' bucket (revocations plans each write, records seals);
    # spec.bindings: into the names' bucket (bindings), audited (audit).
    "provision/kube": {
        "backoff", "monitor", "provision/gate", "provision/steering", "records", "provision/text",
        "evidence", "audit", "revocations", "bindings",
    },
    "provision/pipeline": {
        "backoff", "election", "monitor", "provision/metrics", "provision/gate",
        "provision/suspects", "provision/ownership", "provision/steering",
        "provision/sequence", "provision/pipeline/registry", "provision/pipeline/lanes",
        "provision/text", "audit", "provision/traces",
    },
    # The wiring (mod.rs, prepare.rs, stop.rs) starts and stops every room.
    "provision": set(ROOM_ORDER) - {"provision"},
}

PATH = re.compile(r"\b((?:crate|self|super)(?:::super)*)::")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def non_test_lines(path):
    """The file's lines without its trailing test module (all of them for a
    tests.rs), comments blanked."""
    if os.path.basename(path) == "tests.rs":
        return []
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(
            r"^(pub(\([a-z]+\))? )?mod tests\b", lines[i + 1]
        ):
            lines = lines[:i]
            break
    return lines


def code_of(lines):
    return "\n".join(l.split("//")[0] for l in lines)


def modules(src):
    """module path (tuple) -> file, for the files of one crate."""
    found = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs") or f == "tests.rs":
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src).split(os.sep)
            if rel in (["lib.rs"], ["main.rs"]):
                mod = ()
            elif rel[-1] == "mod.rs":
                mod = tuple(rel[:-1])
            else:
                mod = tuple(rel[:-1]) + (rel[-1][:-3],)
            found.setdefault(mod, path)
    return found


def module_of(path, mods):
    for mod, p in mods.items():
        if p == path:
            return mod
    return None


def paths_after(text, start):
    """The module paths that follow a `crate::`/`super::` prefix at
    `start`: `a::b::c` gives one, `{a, b::c, self}` several."""
    out = []

    def parse(i, prefix):
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "{":
            i += 1
            while i < len(text):
                while i < len(text) and text[i] in " \n\t,":
                    i += 1
                if i >= len(text) or text[i] == "}":
                    return i + 1
                i = parse(i, prefix)
            return i
        m = IDENT.match(text, i)
        if not m:
            out.append(prefix)
            return i + 1
        name = m.group(0)
        i = m.end()
        path = prefix + ([] if name == "self" else [name])
        if text.startswith("::", i):
            return parse(i + 2, path)
        out.append(path)
        return i

    parse(start, [])
    return out


def edges_of(path, mod, mods):
    """The files of this crate that `path` (module `mod`) uses."""
    text = code_of(non_test_lines(path))
    is_mod_file = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
    # The module a `super::` in this file is relative to.
    here = mod if is_mod_file else mod
    used = set()
    for m in PATH.finditer(text):
        head = m.group(1).split("::")
        if head[0] == "crate":
            base = ()
        else:
            base = here
            # `self::` is this module; each `super` climbs one.
            for h in head:
                if h == "super":
                    base = base[:-1]
        for rest in paths_after(text, m.end()):
            target = tuple(base) + tuple(rest)
            while target and target not in mods:
                target = target[:-1]
            f = mods.get(target)
            if f and f != path:
                used.add(f)
    return used


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def room_of(mod):
    joined = "/".join(mod)
    for r in ROOM_ORDER:
        if joined == r or joined.startswith(r + "/"):
            return r
    return None


def long_functions(path, lines):
    fn = re.compile(r"^(\s*)(pub(\([a-z]+\))? )?(async )?(const )?(unsafe )?fn (\w+)")
    out = []
    i = 0
    while i < len(lines):
        m = fn.match(lines[i])
        if m and not lines[i].rstrip().endswith(";"):
            indent = m.group(1)
            j = i
            while j < len(lines) and lines[j].rstrip() != indent + "}":
                j += 1
            if j - i + 1 > MAX_FN:
                out.append((m.group(7), i + 1, j - i + 1))
        i += 1
    return out


def undocumented():
    """Modules a crate root's doc or ARCHITECTURE.md does not name."""
    out = []
    for crate, src in CRATES.items():
        root = os.path.join(ROOT, src, "lib.rs")
        if not os.path.exists(root):
            root = os.path.join(ROOT, src, "main.rs")
        text = open(root).read()
        doc = "\n".join(l[3:] for l in text.splitlines() if l.startswith("//!"))
        spans = " ".join(re.findall(r"`([^`]+)`", doc))
        declared = re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M)
        for m in declared:
            if m != "tests" and not re.search(r"\b" + m + r"\b", spans):
                out.append(f"{os.path.relpath(root, ROOT)}: its doc does not name module `{m}`")
    arch = open(os.path.join(ROOT, "ARCHITECTURE.md")).read()
    arch = re.sub(r"```.*?```", "", arch, flags=re.S)
    named = set()
    for para in re.split(r"\n\s*\n", arch):
        for span in re.findall(r"`([^`]+)`", para):
            for word in re.split(r"[\s,;()]+", span):
                for part in word.split("/"):
                    part = part.strip().strip(".:")
                    named.add(part[:-3] if part.endswith(".rs") else part)
    for src in CRATES.values():
        for d, _, files in os.walk(os.path.join(ROOT, src)):
            for f in sorted(files):
                stem = f[:-3]
                if not f.endswith(".rs") or stem in ("mod", "lib", "main", "tests") or stem.endswith("_tests"):
                    continue
                if stem not in named:
                    out.append(f"ARCHITECTURE.md does not name {os.path.relpath(os.path.join(d, f), ROOT)}")
    return out


def main():
    problems = undocumented()
    core_rooms = {}
    for crate, src in CRATES.items():
        src = os.path.join(ROOT, src)
        mods = modules(src)
        graph = {}
        for mod, path in mods.items():
            graph[path] = edges_of(path, mod, mods)
        for c in cycles(graph):
            rel = [os.path.relpath(p, ROOT) for p in c]
            problems.append(f"{crate}: import cycle among {', '.join(rel)}")
        if crate == "choria-core":
            for path, used in graph.items():
                mine = room_of(module_of(path, mods))
                for u in used:
                    theirs = room_of(module_of(u, mods))
                    if mine and theirs and theirs != mine:
                        core_rooms.setdefault(mine, {}).setdefault(theirs, set()).add(
                            os.path.relpath(path, ROOT)
                        )
        for path in mods.values():
            rel = os.path.relpath(path, ROOT)
            lines = non_test_lines(path)
            if len(lines) > MAX_FILE:
                problems.append(f"{rel}: {len(lines)} lines without tests (at most {MAX_FILE}): split it by what its parts do")
            for name, line, length in long_functions(path, lines):
                if (rel, name) not in TABLES:
                    problems.append(f"{rel}:{line}: fn {name} is {length} lines (at most {MAX_FN}): name its stages")

    if "--graph" in sys.argv[1:]:
        for r in ROOM_ORDER:
            print(f"{r} -> {', '.join(sorted(core_rooms.get(r, {}))) or '(nothing)'}")
        return 0
    for r, used in sorted(core_rooms.items()):
        for u, files in sorted(used.items()):
            if u not in ROOMS.get(r, set()):
                problems.append(f"choria-core: {r} may not use {u} (in {', '.join(sorted(files))})")
    for c in cycles({r: set(u) for r, u in core_rooms.items()}):
        problems.append(f"choria-core: the rooms {' , '.join(c)} use each other")
    for p in problems:
        print(f"check-layers: {p}")
    if problems:
        return 1
    print(f"check-layers: {len(CRATES)} crates: no import cycle, every room's use allowed, "
          f"no file over {MAX_FILE} lines or function over {MAX_FN} outside tests and tables, "
          f"every module named in its crate's doc and ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
