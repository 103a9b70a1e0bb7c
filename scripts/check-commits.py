#!/usr/bin/env python3
"""Hold new commits to the house's commit convention (docs/src/contributing.md).

Every commit after SINCE (the last one before the convention was adopted;
older history is left as it is) must have:
  * a subject `area: summary`: an area (a crate, module, file, script or
    page, lower or upper case, words joined by `,`, `/`, `.`, `-` or `_`),
    a colon and a space, then the summary;
  * a subject of at most 72 characters, not ending in a full stop;
  * a blank line, then a body that says why.
Merge commits are not checked.

  scripts/check-commits.py            # the commits after SINCE up to HEAD
  scripts/check-commits.py --self-test
"""
import re
import subprocess
import sys

SINCE = "bf4b955c518f3950f4e48a803195233f078fb2ea"
MAX_SUBJECT = 72
AREA = re.compile(r"^[A-Za-z0-9_.\-/]+(, ?[A-Za-z0-9_.\-/]+)*: \S")


def problems(subject, body):
    """What is wrong with one commit's message; empty when nothing is."""
    out = []
    if len(subject) > MAX_SUBJECT:
        out.append(f"subject is {len(subject)} characters (at most {MAX_SUBJECT})")
    if not AREA.match(subject):
        out.append("subject is not `area: summary`")
    if subject.endswith("."):
        out.append("subject ends in a full stop")
    if not body.strip():
        out.append("no body saying why")
    return out


def commits(since):
    """(sha, subject, body) of the non-merge commits after `since`; with
    `since` None, the newest commit only."""
    fmt = "%H%x00%s%x00%b%x1e"
    span = ["-1", "HEAD"] if since is None else [f"{since}..HEAD"]
    log = subprocess.run(
        ["git", "log", "--no-merges", f"--format={fmt}", *span],
        check=True, capture_output=True, text=True,
    ).stdout
    for rec in log.split("\x1e"):
        rec = rec.strip("\n")
        if rec:
            sha, subject, body = rec.split("\x00", 2)
            yield sha, subject, body


def self_test():
    ok = ("check-commits: hold new commits to the convention", "Because.")
    assert problems(*ok) == [], problems(*ok)
    assert problems("fleet, crd: one RSA signer", "Why.") == []
    assert problems("docs/src: a page", "Why.") == []
    assert "no body saying why" in problems("docs: a page", "")
    assert "subject is not `area: summary`" in problems("Fix the thing", "Why.")
    assert "subject is not `area: summary`" in problems("a:b", "Why.")
    assert "subject ends in a full stop" in problems("docs: a page.", "Why.")
    long = "docs: " + "x" * 67
    assert problems(long, "Why.") == [f"subject is 73 characters (at most {MAX_SUBJECT})"]
    assert problems(long[:-1], "Why.") == []
    print("check-commits: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    known = subprocess.run(["git", "merge-base", "--is-ancestor", SINCE, "HEAD"],
                           capture_output=True)
    if known.returncode != 0:
        # A shallow clone or another history: the newest commit only (a
        # clone of depth 1 has no HEAD~1 to count from).
        since = None
        print(f"check-commits: {SINCE[:12]} is not in this history; checking HEAD only")
    else:
        since = SINCE
    bad = 0
    n = 0
    for sha, subject, body in commits(since):
        n += 1
        for p in problems(subject, body):
            bad += 1
            print(f"check-commits: {sha[:12]} {subject[:60]!r}: {p}")
    if bad:
        print("check-commits: the convention is in docs/src/contributing.md, 'Commits'")
        return 1
    after = "HEAD only" if since is None else f"after {since[:12]}"
    print(f"check-commits: {n} commit(s) {after} follow `area: summary` (<= {MAX_SUBJECT}) with a body")
    return 0


if __name__ == "__main__":
    sys.exit(main())
