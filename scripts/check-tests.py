#!/usr/bin/env python3
"""Hold the tests to the house's rules for tests a reader can follow
(ARCHITECTURE.md, "Rooms inside the provisioner";
docs/src/contributing.md):

  * no function in tests/ over MAX_TEST_FN lines (from its `fn` line to its
    closing brace): a long scenario becomes a fixture and named steps;
  * no `dead_code` allowance in tests/it/support/: the integration tests are
    one binary, so support code nothing calls is deleted, not hidden;
  * no inline `mod tests { ... }` over MAX_INLINE_TESTS lines in crates/ or
    src/: a long test module lives beside its file as `<file>/tests.rs`,
    and by that name only (not `<file>_tests.rs` beside it).

  scripts/check-tests.py            # the tree
  scripts/check-tests.py --self-test
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_TEST_FN = 150
MAX_INLINE_TESTS = 300

FN = re.compile(r"^(\s*)(pub(\([a-z]+\))? )?(async )?fn (\w+)")
INLINE_TESTS = re.compile(r"^(\s*)(pub(\([a-z]+\))? )?mod tests \{")
DEAD_CODE = re.compile(r"#!?\[\s*(allow|expect)\s*\([^\]]*\bdead_code\b")


def block_end(lines, i, indent):
    """The index of the line closing the block opened on line `i`: the first
    later line that is `indent` followed by `}` alone (rustfmt's layout)."""
    close = indent + "}"
    for j in range(i + 1, len(lines)):
        if lines[j].rstrip() == close:
            return j
    return len(lines) - 1


def long_functions(lines, limit):
    """(name, first line 1-based, length) of each function over `limit`
    lines. A declaration without a body (a trait's, ending in `;`) is skipped."""
    out = []
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if m and not lines[i].rstrip().endswith(";"):
            j = block_end(lines, i, m.group(1))
            if j - i + 1 > limit:
                out.append((m.group(5), i + 1, j - i + 1))
            i = j
        i += 1
    return out


def long_inline_tests(lines, limit):
    """(first line 1-based, length) of each inline `mod tests {` over `limit`."""
    out = []
    for i, line in enumerate(lines):
        m = INLINE_TESTS.match(line)
        if m:
            j = block_end(lines, i, m.group(1))
            if j - i + 1 > limit:
                out.append((i + 1, j - i + 1))
    return out


def dead_code_allowances(lines):
    """1-based line numbers of `allow`/`expect(dead_code)` attributes."""
    return [i + 1 for i, line in enumerate(lines) if DEAD_CODE.search(line)]


def rust_files(top):
    for d, subdirs, files in os.walk(os.path.join(ROOT, top)):
        subdirs[:] = sorted(s for s in subdirs if s not in ("target", ".git"))
        for f in sorted(files):
            if f.endswith(".rs"):
                yield os.path.join(d, f)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def problems():
    out = []
    for path in rust_files("tests"):
        rel = os.path.relpath(path, ROOT)
        lines = read(path)
        for name, at, n in long_functions(lines, MAX_TEST_FN):
            out.append(f"{rel}:{at}: fn {name} is {n} lines (at most {MAX_TEST_FN}): "
                       "a fixture and named steps")
        if rel.startswith(os.path.join("tests", "it", "support") + os.sep):
            for at in dead_code_allowances(lines):
                out.append(f"{rel}:{at}: a dead_code allowance in support: "
                           "delete what nothing uses")
    for top in ("crates", "src"):
        for path in rust_files(top):
            rel = os.path.relpath(path, ROOT)
            if os.path.basename(path).endswith("_tests.rs"):
                out.append(f"{rel}: a test file beside its module: make it "
                           "<file>/tests.rs")
            for at, n in long_inline_tests(read(path), MAX_INLINE_TESTS):
                out.append(f"{rel}:{at}: inline mod tests is {n} lines "
                           f"(at most {MAX_INLINE_TESTS}): move it to <file>/tests.rs")
    return out


def self_test():
    def body(n):
        return ["    let _ = 1;"] * n

    short = ["#[test]", "fn short() {", *body(3), "}"]
    assert long_functions(short, 5) == [], long_functions(short, 5)
    # 1 + 5 + 1 = 7 lines, from `fn` to the closing brace.
    long = ["async fn long() {", *body(5), "}"]
    assert long_functions(long, 6) == [("long", 1, 7)], long_functions(long, 6)
    assert long_functions(long, 7) == []
    # A nested function's brace does not end the outer one early.
    nested = ["pub fn outer() {", "    fn inner() {", "    }", *body(4), "}"]
    assert long_functions(nested, 7) == [("outer", 1, 8)], long_functions(nested, 7)
    # An indented method is measured to its own closing brace.
    method = ["impl X {", "    pub(crate) async fn m(&self) {", *body(4), "    }", "}"]
    assert long_functions(method, 5) == [("m", 2, 6)], long_functions(method, 5)
    assert long_functions(["    fn declared(&self);"], 0) == []

    inline = ["fn f() {}", "#[cfg(test)]", "mod tests {", *body(3), "}"]
    assert long_inline_tests(inline, 4) == [(3, 5)], long_inline_tests(inline, 4)
    assert long_inline_tests(inline, 5) == []
    assert long_inline_tests(["#[cfg(test)]", "mod tests;"], 0) == []

    assert dead_code_allowances(["#![allow(dead_code)]"]) == [1]
    assert dead_code_allowances(["", "#[allow(unused, dead_code)]"]) == [2]
    assert dead_code_allowances(["    #[expect(dead_code)]"]) == [1]
    assert dead_code_allowances(["#[allow(clippy::too_many_arguments)]"]) == []
    assert dead_code_allowances(["// dead_code is not allowed here"]) == []
    print("check-tests: self-test ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    found = problems()
    for p in found:
        print(p, file=sys.stderr)
    if found:
        sys.exit(f"check-tests: {len(found)} problem(s)")
    print(f"check-tests: no test function over {MAX_TEST_FN} lines, no dead_code "
          f"allowance in support, no inline test module over {MAX_INLINE_TESTS} lines")


if __name__ == "__main__":
    main()
