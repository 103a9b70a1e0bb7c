#!/usr/bin/env bash
# The book in docs/ (mdBook): builds it and checks every internal link and
# anchor (scripts/check-links.py). A few seconds once mdBook is installed
# (ensure_mdbook in scripts/lib.sh, ~3 min the first time).
#
#   scripts/docs.sh                  build into ~/.cache/choria-provisioner-rs/book, check
#   scripts/docs.sh --update         first rewrite docs/src/reference/ from the code
#                                    (UPDATE_REFERENCE=1 cargo test --test it book::), then build
#   scripts/docs.sh --out DIR        build into DIR instead
#
# The reference pages are checked against the code by `cargo test` (tests/it/book.rs),
# which scripts/test.sh runs; this script checks that the book builds, without
# warnings, and that no link inside it is broken.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

update=0
out="$CACHE_DIR/book"
while [ $# -gt 0 ]; do
  case "$1" in
    --update) update=1 ;;
    --out) out="$2"; shift ;;
    *) echo "docs.sh: unknown argument $1 (want --update, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

ensure_mdbook
if [ "$update" = 1 ]; then
  ensure_rust
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
  log "rewriting docs/src/reference/ from the code (tests/it/book.rs)"
  UPDATE_REFERENCE=1 cargo test --workspace --quiet --test it book:: -- --test-threads 1 >&2
fi

rm -rf "$out"
build_log="$(mktemp)"
trap 'rm -f "$build_log"' EXIT
if ! "$CACHE_BIN/mdbook" build "$ROOT/docs" --dest-dir "$out" >"$build_log" 2>&1; then
  cat "$build_log" >&2
  log "mdbook build failed"
  exit 1
fi
# mdBook reports a missing include or a malformed SUMMARY as a warning and
# builds anyway: here a warning fails.
if grep -E '(WARN|ERROR)' "$build_log" >&2; then
  log "mdbook build warned (above)"
  exit 1
fi
python3 "$ROOT/scripts/check-links.py" "$out"
log "the book: $out/index.html"
