"""What the checks print, and what they remember: the failures (any one makes
the run exit 1) and the counts the summary gives."""

import sys


class Report:
    def __init__(self, out=None):
        self.out = out if out is not None else sys.stdout
        self.failures = []
        self.counts = {"validated": 0, "crs": 0, "skipped": 0}

    def line(self, text):
        print(text, file=self.out)

    def section(self, title):
        self.line(f"\n== {title}")

    def ok(self, msg):
        self.line(f"  ok    {msg}")

    def fail(self, msg):
        self.failures.append(msg)
        self.line(f"  FAIL  {msg}")

    def note(self, msg):
        self.line(f"  note  {msg}")

    def check(self, cond, msg):
        if cond:
            self.ok(msg)
        else:
            self.fail(msg)
        return cond

    def no_problems(self, problems, msg):
        """One FAIL line per problem, or one ok line when there is none."""
        for p in problems:
            self.fail(f"{msg}: {p}")
        if not problems:
            self.ok(msg)
