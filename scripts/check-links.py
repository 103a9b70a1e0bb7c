#!/usr/bin/env python3
"""Checks every internal link and anchor of the built book.

    scripts/check-links.py BOOK_DIR

For every HTML page mdBook wrote (print.html aside: it repeats every page
with links rewritten into itself), each href and src that is not an
absolute URL must name a file inside BOOK_DIR, and its #fragment an id (or
a name) in that file. A link that leaves the book (to ../README.md, say)
is broken on any web server, so it is an error too. Exits 1 and lists
every broken link, page and target.
"""

import html.parser
import os
import sys
import urllib.parse

SKIP_PAGES = {"print.html", "toc.html"}
EXTERNAL = ("http:", "https:", "mailto:", "data:", "javascript:")


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []  # (attribute, value, line)

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id",) or (name == "name" and tag == "a"):
                self.ids.add(value)
            if (name == "href" and tag in ("a", "link")) or (name == "src" and tag in ("img", "script")):
                self.links.append((name, value, self.getpos()[0]))


def parse(path, cache):
    if path not in cache:
        page = Page()
        with open(path, encoding="utf-8") as f:
            page.feed(f.read())
        cache[path] = page
    return cache[path]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = os.path.realpath(sys.argv[1])
    pages = []
    for directory, _, files in os.walk(root):
        for name in files:
            if name.endswith(".html") and name not in SKIP_PAGES:
                pages.append(os.path.join(directory, name))
    if not pages:
        sys.exit(f"check-links: no HTML pages under {root}")
    cache = {}
    broken = []
    checked = 0
    for page_path in sorted(pages):
        page = parse(page_path, cache)
        rel_page = os.path.relpath(page_path, root)
        for attr, value, line in page.links:
            if value.startswith(EXTERNAL) or value.startswith("//"):
                continue
            checked += 1
            parts = urllib.parse.urlsplit(value)
            target = page_path
            if parts.path:
                target = os.path.realpath(os.path.join(os.path.dirname(page_path), urllib.parse.unquote(parts.path)))
                if not (target == root or target.startswith(root + os.sep)):
                    broken.append((rel_page, line, value, "leaves the book"))
                    continue
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
                if not os.path.isfile(target):
                    broken.append((rel_page, line, value, "no such file"))
                    continue
            fragment = urllib.parse.unquote(parts.fragment)
            if fragment and target.endswith(".html"):
                if fragment not in parse(target, cache).ids:
                    broken.append((rel_page, line, value, f"no id {fragment!r} in {os.path.relpath(target, root)}"))
    for page, line, value, why in broken:
        print(f"{page}:{line}: {value}: {why}", file=sys.stderr)
    if broken:
        sys.exit(f"check-links: {len(broken)} broken of {checked} internal links in {len(pages)} pages")
    print(f"check-links: {checked} internal links in {len(pages)} pages, none broken", file=sys.stderr)


if __name__ == "__main__":
    main()
