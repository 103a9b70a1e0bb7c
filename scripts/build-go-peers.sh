#!/usr/bin/env bash
# Builds the real Go peers used by the interoperability tests, from the Go
# module proxy, into the project cache ($CACHE_BIN, see scripts/lib.sh):
#
#   choria                 go-choria (tests/gopeers/choria) with all agent
#                          providers registered and a provisioning JWT path
#                          compiled in (provisioning-capable server + CLI)
#   natstap                raw NATS subscriber printing every message as a JSON
#                          line (tests/gopeers/choria/natstap), for captures
#   choria-go-provisioner  the real Go provisioner (github.com/choria-io/provisioner
#                          v0.16 line), from the copy in ../shared/peers/go-provisioner
#                          (CHORIA_GO_PROVISIONER_SRC), see tests/gopeers/RECIPE.md
#   jaeger                 Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger, the
#                          version tests/gopeers/jaeger/go.mod requires): OTLP in, the
#                          query API out, for tests/it/traces.rs (~3.5 min of
#                          downloads and ~3.5 min of build cold, a 121 MB binary)
#
# Usage: scripts/build-go-peers.sh [choria] [natstap] [election-candidate] [provisioner] [jaeger]
#        (default: all five)
#
# Each build is skipped when the binary exists and its stamp (a hash of the Go
# version, the module's go.mod/go.sum/*.go inputs and the ldflags) matches.
# A failing build prints go's exact output and makes the script exit 1 (after
# trying the other requested peers). The paths of the binaries that are ready
# are printed on stdout, one per line.
#
# Environment:
#   CHORIA_VERSION             build.Version to stamp in (default 0.30.2, the
#                              go-choria release required in tests/gopeers/choria/go.mod)
#   CHORIA_PROVISION_JWT_FILE  build.ProvisionJWTFile (default "provisioning.jwt":
#                              RELATIVE, resolved against the server's working
#                              directory, so every server started in its own
#                              directory uses its own provisioning JWT)
#   GO                         go command to use (default: go)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

GOPEERS="$ROOT/tests/gopeers"
GO="${GO:-go}"
CHORIA_VERSION="${CHORIA_VERSION:-0.30.2}"
CHORIA_PROVISION_JWT_FILE="${CHORIA_PROVISION_JWT_FILE:-provisioning.jwt}"

if ! command -v "$GO" >/dev/null 2>&1; then
  echo "build-go-peers: '$GO' not found; Go >= 1.25 is needed" >&2
  exit 1
fi

# stamp_of PATH... -- WORD... : hash of the go version, every go.mod/go.sum/*.go
# file given or found under the given directories, and the extra words.
stamp_of() {
  local dirs=() extra=()
  while [ $# -gt 0 ]; do
    if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
    dirs+=("$1"); shift
  done
  {
    "$GO" version
    printf '%s\n' "${extra[@]}"
    find "${dirs[@]}" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 |
      LC_ALL=C sort -z | xargs -0 sha256sum | sed "s#  $GOPEERS/#  #"
  } | sha256sum | cut -d' ' -f1
}

# build_peer NAME OUT MODDIR STAMP -- go build args...
build_peer() {
  local name="$1" out="$2" moddir="$3" stamp="$4"
  shift 5
  local stampfile="$out.stamp"

  if [ -x "$out" ] && [ -f "$stampfile" ] && [ "$(cat "$stampfile")" = "$stamp" ]; then
    log "$name is up to date: $out"
    return 0
  fi

  log "building $name (slow on 2 cores: ~3 min cold, seconds when GOCACHE is warm)"
  local errlog start
  errlog="$(mktemp)"
  start=$(date +%s)
  if ! (cd "$moddir" && "$GO" build -trimpath -o "$out.tmp" "$@") >"$errlog" 2>&1; then
    echo "build-go-peers: building $name FAILED in $moddir:" >&2
    echo "  $GO build -trimpath -o $out.tmp $*" >&2
    sed 's/^/  | /' "$errlog" >&2
    rm -f "$errlog" "$out.tmp"
    return 1
  fi
  # go build may print warnings while succeeding
  [ -s "$errlog" ] && cat "$errlog" >&2
  rm -f "$errlog"
  mv -f "$out.tmp" "$out"
  printf '%s\n' "$stamp" >"$stampfile"
  log "built $name in $(( $(date +%s) - start ))s: $out"
}

build_choria() {
  local moddir="$GOPEERS/choria"
  local ldflags="-X github.com/choria-io/go-choria/build.Version=$CHORIA_VERSION -X github.com/choria-io/go-choria/build.ProvisionJWTFile=$CHORIA_PROVISION_JWT_FILE"
  local stamp
  stamp="$(stamp_of "$moddir/go.mod" "$moddir/go.sum" "$moddir/main.go" "$GOPEERS/appbuilder-stub" -- "ldflags=$ldflags")"
  build_peer choria "$CACHE_BIN/choria" "$moddir" "$stamp" -- -ldflags "$ldflags" .
}

build_natstap() {
  local moddir="$GOPEERS/choria"
  local stamp
  stamp="$(stamp_of "$moddir/go.mod" "$moddir/go.sum" "$moddir/natstap" -- "pkg=./natstap")"
  build_peer natstap "$CACHE_BIN/natstap" "$moddir" "$stamp" -- ./natstap
}

build_election_candidate() {
  local moddir="$GOPEERS/choria"
  local stamp
  stamp="$(stamp_of "$moddir/go.mod" "$moddir/go.sum" "$moddir/candidate" -- "pkg=./candidate")"
  build_peer election-candidate "$CACHE_BIN/choria-election-candidate" "$moddir" "$stamp" -- ./candidate
}

# The Go provisioner's source is not served by the module proxy (403 for
# every version of github.com/choria-io/provisioner); a copy of upstream
# (see tests/gopeers/RECIPE.md) sits beside the project in
# ../shared/peers/go-provisioner, or where CHORIA_GO_PROVISIONER_SRC says.
# It is copied to a writable place in the cache first (go may update go.sum).
build_provisioner() {
  # ../shared/peers/go-provisioner beside the checkout; a clone made deeper
  # (e.g. CI's) finds it further up.
  local src="${CHORIA_GO_PROVISIONER_SRC:-}" up
  if [ -z "$src" ]; then
    src="$ROOT/../shared/peers/go-provisioner"
    for up in .. ../.. ../../..; do
      if [ -f "$ROOT/$up/shared/peers/go-provisioner/go.mod" ]; then
        src="$ROOT/$up/shared/peers/go-provisioner"
        break
      fi
    done
  fi
  if [ ! -f "$src/go.mod" ]; then
    echo "build-go-peers: building choria-go-provisioner FAILED: no Go provisioner source at $src" >&2
    echo "  (set CHORIA_GO_PROVISIONER_SRC to a checkout of github.com/choria-io/provisioner; see tests/gopeers/RECIPE.md)" >&2
    return 1
  fi
  src="$(cd "$src" && pwd)"
  local work="$CACHE_DIR/src/go-provisioner" stamp
  stamp="$(stamp_of "$src" -- "src=go-provisioner")"
  if [ ! -f "$work/.stamp" ] || [ "$(cat "$work/.stamp")" != "$stamp" ]; then
    rm -rf "$work"
    mkdir -p "$work"
    cp -R "$src/." "$work/"
    chmod -R u+w "$work"
    printf '%s\n' "$stamp" >"$work/.stamp"
  fi
  build_peer choria-go-provisioner "$CACHE_BIN/choria-go-provisioner" "$work" "$stamp" -- .
}

# Jaeger from its module as tests/gopeers/jaeger requires it (a `tool`
# directive: the command is built from the module cache, no source here).
build_jaeger() {
  local moddir="$GOPEERS/jaeger"
  local stamp
  stamp="$(stamp_of "$moddir/go.mod" "$moddir/go.sum" -- "pkg=github.com/jaegertracing/jaeger/cmd/jaeger")"
  build_peer jaeger "$CACHE_BIN/jaeger" "$moddir" "$stamp" -- github.com/jaegertracing/jaeger/cmd/jaeger
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(choria natstap election-candidate provisioner jaeger)

failed=0
built=()
for t in "${targets[@]}"; do
  case "$t" in
    choria) build_choria && built+=("$CACHE_BIN/choria") || failed=1 ;;
    natstap) build_natstap && built+=("$CACHE_BIN/natstap") || failed=1 ;;
    election-candidate) build_election_candidate && built+=("$CACHE_BIN/choria-election-candidate") || failed=1 ;;
    provisioner) build_provisioner && built+=("$CACHE_BIN/choria-go-provisioner") || failed=1 ;;
    jaeger) build_jaeger && built+=("$CACHE_BIN/jaeger") || failed=1 ;;
    *) echo "build-go-peers: unknown peer '$t' (want: choria, natstap, election-candidate, provisioner, jaeger)" >&2; exit 2 ;;
  esac
done

[ ${#built[@]} -gt 0 ] && printf '%s\n' "${built[@]}"
exit "$failed"
