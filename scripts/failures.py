#!/usr/bin/env python3
"""Print why each failed test failed, from libtest's output, kept short.

scripts/test.sh calls this last, so a failure's panic message is in the
tail of the run's output: CI keeps the head and the tail of a long log, and
libtest prints its `failures:` section in the middle (before the alone pass,
the image smoke tier and the node tier), where a cut log loses it.

Each failed test's block (`---- name stdout ----`) is printed whole when it
is short; a long one keeps its first lines (what the test printed as it
went) and the panic with the lines after it (the message and the tails of
logs the assertion attached).
"""
import re
import sys

HEAD = 10  # lines of a long block kept from its start
PANIC = 50  # lines kept from the first panic on
SHORT = HEAD + PANIC

START = re.compile(r"^---- (\S+) stdout ----$")


def blocks(lines):
    """Yield (test name, lines) for each failure block of libtest's output."""
    name, body = None, []
    for line in lines:
        m = START.match(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
        elif name and (line == "failures:" or line.startswith("test result:")):
            yield name, body
            name, body = None, []
        elif name:
            body.append(line)
    if name:
        yield name, body


def shortened(body):
    while body and not body[-1].strip():
        body = body[:-1]
    if len(body) <= SHORT:
        return body
    panic = next((i for i, l in enumerate(body) if " panicked at " in l), None)
    if panic is None or panic < HEAD:
        return body[:SHORT] + [f"[... {len(body) - SHORT} more lines]"]
    kept = body[panic : panic + PANIC]
    after = len(body) - panic - len(kept)
    return (
        body[:HEAD]
        + [f"[... {panic - HEAD} lines ...]"]
        + kept
        + ([f"[... {after} more lines]"] if after else [])
    )


def self_test():
    log = [
        "test a::b ... FAILED", "", "failures:", "", "---- a::b stdout ----",
        "it printed this", "thread 'a::b' (1) panicked at x.rs:1:1:", "the reason", "",
        "---- a::c stdout ----", "only this", "", "failures:", "    a::b", "    a::c", "",
        "test result: FAILED. 0 passed; 2 failed",
    ]
    found = list(blocks(log))
    assert [n for n, _ in found] == ["a::b", "a::c"], found
    assert found[0][1][1].endswith("panicked at x.rs:1:1:"), found
    long = [f"line {i}" for i in range(100)] + ["thread 'x' panicked at y.rs"] + [f"after {i}" for i in range(100)]
    cut = shortened(long)
    assert cut[:HEAD] == long[:HEAD] and cut[HEAD] == "[... 90 lines ...]", cut[: HEAD + 1]
    assert cut[HEAD + 1] == "thread 'x' panicked at y.rs" and cut[-1] == "[... 51 more lines]", cut[-3:]
    print("failures: self-test passed")


def main(path):
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    found = list(blocks(lines))
    if not found:
        return
    print(f"\n=== why {len(found)} test(s) failed (from {path}) ===")
    for name, body in found:
        print(f"\n--- {name}")
        for line in shortened(body):
            print(line)


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    else:
        main(sys.argv[1])
