#!/usr/bin/env bash
# Builds a Kubernetes control plane for the integration tests (by default no
# kubelet, scheduler or controller-manager), from the Go module proxy, into the
# project cache ($CACHE_BIN, see scripts/lib.sh):
#
#   etcd            go.etcd.io/etcd/server/v3             (tests/kubepeers/etcd)
#   kube-apiserver  k8s.io/kubernetes/cmd/kube-apiserver  (tests/kubepeers/kubernetes)
#   kubectl         k8s.io/kubernetes/cmd/kubectl         (tests/kubepeers/kubernetes)
#
# and, only when asked for (not in the default set):
#
#   kubelet, kube-scheduler, kube-controller-manager
#                   k8s.io/kubernetes/cmd/...               (tests/kubepeers/kubernetes)
#                   the node tier: scripts/node-tier.sh runs them with containerd
#   cert-manager-controller  github.com/cert-manager/cert-manager's issuers,
#                   certificaterequests-approver and certificaterequests-issuer-ca
#                   controllers (tests/gopeers/certmanager/main.go), plus
#                   cert-manager's CRDs as plain YAML in $CACHE_DIR/cert-manager/crds/
#                   (tests/it/cert_manager.rs runs them)
#   helm            helm.sh/helm/v3/cmd/helm (v3.22.0)     (tests/kubepeers/helm)
#                   scripts/node-tier.sh installs charts/choria-provisioner-operator
#                   with it; the version ldflags of Helm's Makefile
#   kube-proxy      k8s.io/kubernetes/cmd/kube-proxy        (tests/kubepeers/kubernetes)
#   coredns         github.com/coredns/coredns with the kubernetes and errors
#                   plugins only                            (tests/kubepeers/coredns)
#                   the node tier's Services and cluster DNS, for the Kubernetes
#                   quick start run from its page
#
# The versions are the ones required in the wrapper modules' go.mod (see
# tests/kubepeers/README.md). tests/it/support/kube.rs starts them.
#
# Usage: scripts/build-kube-peers.sh [etcd] [kube-apiserver] [kubectl] [cert-manager]
#          [kubelet] [kube-scheduler] [kube-controller-manager] [helm]
#          [kube-proxy] [coredns]
#        (default: etcd kube-apiserver kubectl)
#        scripts/build-kube-peers.sh --pin 1.M.N
#        (rewrites tests/kubepeers/kubernetes/go.mod and go.sum for Kubernetes
#        v1.M.N: every staging module pinned to v0.M.N, as read from the
#        published k8s.io/kubernetes go.mod; commit the result)
#
# Each build is skipped when the binary exists and its stamp (a hash of the Go
# version, the module's go.mod/go.sum, the package and the ldflags; for
# cert-manager also its main.go) matches.
# A failing build prints go's exact output and makes the script exit 1 (after
# trying the other requested binaries). The paths of the binaries that are
# ready are printed on stdout, one per line.
#
# Environment:
#   GO   go command to use (default: go; Go >= 1.26 because etcd 3.6.16 needs it)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

KUBEPEERS="$ROOT/tests/kubepeers"
GO="${GO:-go}"
# Static binaries: no C toolchain needed, and they run on any test machine.
export CGO_ENABLED=0

if ! command -v "$GO" >/dev/null 2>&1; then
  echo "build-kube-peers: '$GO' not found; Go >= 1.26 is needed" >&2
  exit 1
fi

# run_go DIR WHAT -- go args...: runs go in DIR, its stdout to stdout (for
# callers capturing a value) and its stderr to stderr; on failure prints the
# exact command and go's output, and returns 1.
run_go() {
  local dir="$1" what="$2" out errfile rc=0
  shift 3
  errfile="$(mktemp)"
  out="$(cd "$dir" && "$GO" "$@" 2>"$errfile")" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "build-kube-peers: $what FAILED in $dir:" >&2
    printf '  %s' "$GO" >&2
    printf ' %q' "$@" >&2
    echo >&2
    { if [ -n "$out" ]; then printf '%s\n' "$out"; fi; cat "$errfile"; } | sed 's/^/  | /' >&2
    rm -f "$errfile"
    return 1
  fi
  # go may print warnings (or "downloading" lines) while succeeding
  cat "$errfile" >&2
  rm -f "$errfile"
  if [ -n "$out" ]; then printf '%s\n' "$out"; fi
}

# module_version DIR MODULE: the version of MODULE selected in DIR's module.
module_version() {
  run_go "$1" "reading the version of $2" -- list -m -f '{{.Version}}' "$2"
}

# stamp_of DIR WORD...: hash of the go version, DIR's go.mod and go.sum, and
# the extra words (package, ldflags).
stamp_of() {
  local dir="$1"
  shift
  {
    "$GO" version
    printf '%s\n' "$@"
    (cd "$dir" && sha256sum go.mod go.sum)
  } | sha256sum | cut -d' ' -f1
}

# build_bin NAME MODDIR PKG LDFLAGS [STAMPWORD...]: the extra words go into the stamp
build_bin() {
  local name="$1" moddir="$2" pkg="$3" ldflags="$4"
  local out="$CACHE_BIN/$name" stamp
  stamp="$(stamp_of "$moddir" "pkg=$pkg" "ldflags=$ldflags" "cgo=$CGO_ENABLED" "${@:5}")"
  if [ -x "$out" ] && [ -f "$out.stamp" ] && [ "$(cat "$out.stamp")" = "$stamp" ]; then
    log "$name is up to date: $out"
    return 0
  fi

  log "building $name (slow on 2 cores: minutes cold, seconds when GOCACHE is warm)"
  local start
  start=$(date +%s)
  run_go "$moddir" "building $name" -- build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg" >&2 || {
    rm -f "$out.tmp"
    return 1
  }
  mv -f "$out.tmp" "$out"
  printf '%s\n' "$stamp" >"$out.stamp"
  log "built $name in $(( $(date +%s) - start ))s ($(du -h "$out" | cut -f1)): $out"
}

# kube_ldflags: what hack/lib/version.sh stamps into a release, so that
# `kubectl version`, /version (component-base) and the client User-Agent
# (client-go) report the real release instead of v0.0.0-master. gitCommit is
# unknown from a module, so it is left alone; buildDate is the release's date
# (a build time would change the binary, not its stamp).
kube_ldflags() {
  local moddir="$KUBEPEERS/kubernetes" v date
  v="$(module_version "$moddir" k8s.io/kubernetes)" || return 1
  date="$(run_go "$moddir" "reading the date of k8s.io/kubernetes" -- list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)" || return 1
  local major="${v#v}" minor
  minor="${major#*.}"
  major="${major%%.*}"
  minor="${minor%%.*}"
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  printf '%s' "$flags"
}

build_etcd() {
  build_bin etcd "$KUBEPEERS/etcd" go.etcd.io/etcd/server/v3 "-s -w"
}

build_kube() {
  local name="$1" ldflags
  ldflags="$(kube_ldflags)" || return 1
  build_bin "$name" "$KUBEPEERS/kubernetes" "k8s.io/kubernetes/cmd/$name" "$ldflags"
}

# cert-manager: the controllers from tests/gopeers/certmanager, and the CRDs
# of the same cert-manager release from the module cache. deploy/crds holds
# controller-gen's plain YAML (the chart's templates/crd-*.yaml are the same
# CRDs wrapped in Helm markup); any line that is only a template action is
# dropped anyway, and markup left anywhere else is an error.
build_cert_manager() {
  local moddir="$ROOT/tests/gopeers/certmanager" v dir
  v="$(module_version "$moddir" github.com/cert-manager/cert-manager)" || return 1
  local ldflags="-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$v"
  build_bin cert-manager-controller "$moddir" . "$ldflags" "main=$(cd "$moddir" && sha256sum main.go)" || return 1

  dir="$(run_go "$moddir" "locating github.com/cert-manager/cert-manager $v" -- list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)" || return 1
  [ -n "$dir" ] || dir="$(run_go "$moddir" "downloading github.com/cert-manager/cert-manager $v" -- mod download -json "github.com/cert-manager/cert-manager@$v" | sed -n 's|.*"Dir": "\(.*\)".*|\1|p')"
  local src="$dir/deploy/crds" out="$CACHE_DIR/cert-manager/crds" f n=0
  if ! compgen -G "$src/*.yaml" >/dev/null; then
    echo "build-kube-peers: no CRDs in $src" >&2
    return 1
  fi
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  for f in "$src"/*.yaml; do
    sed -E '/^[[:space:]]*\{\{-?.*-?\}\}[[:space:]]*$/d' "$f" >"$out.tmp/$(basename "$f")"
    if grep -n '{{' "$out.tmp/$(basename "$f")" >&2; then
      echo "build-kube-peers: Helm markup left in $f (above)" >&2
      rm -rf "$out.tmp"
      return 1
    fi
    n=$((n + 1))
  done
  printf '%s\n' "$v" >"$out.tmp/VERSION"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  log "cert-manager $v: $n CRDs in $out"
}

# helm: what Helm's Makefile stamps into a release (the version, a clean tree,
# and the Kubernetes version `helm template`/lint assume: client-go v0.M ->
# 1.M); gitCommit is not known from a module.
build_helm() {
  local moddir="$KUBEPEERS/helm" v k
  v="$(module_version "$moddir" helm.sh/helm/v3)" || return 1
  k="$(module_version "$moddir" k8s.io/client-go)" || return 1
  k="${k#v0.}"
  k="${k%%.*}"
  local flags="-s -w -X helm.sh/helm/v3/internal/version.version=$v -X helm.sh/helm/v3/internal/version.gitTreeState=clean" pkg
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k"
  done
  build_bin helm "$moddir" helm.sh/helm/v3/cmd/helm "$flags"
}

build_coredns() {
  local moddir="$KUBEPEERS/coredns" v
  v="$(module_version "$moddir" github.com/coredns/coredns)" || return 1
  build_bin coredns "$moddir" . "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$v" \
    "main=$(cd "$moddir" && sha256sum main.go)"
}

# pin K: points tests/kubepeers/kubernetes at k8s.io/kubernetes vK.
pin() {
  local k="${1#v}" moddir="$KUBEPEERS/kubernetes"
  if ! [[ "$k" =~ ^1\.[0-9]+\.[0-9]+$ ]]; then
    echo "build-kube-peers: --pin wants a release like 1.34.4, not '$1'" >&2
    exit 2
  fi
  local s="0.${k#1.}" gomod m
  local json
  json="$(run_go "$moddir" "downloading k8s.io/kubernetes v$k" -- mod download -json "k8s.io/kubernetes@v$k")" || exit 1
  gomod="$(printf '%s\n' "$json" | sed -n 's|.*"GoMod": "\(.*\)".*|\1|p')"
  # The staging modules differ between releases: take them from the release.
  local staging edits=()
  staging="$(sed -n 's|^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*|\1|p' "$gomod")"
  [ -n "$staging" ] || { echo "build-kube-peers: no staging replaces found in $gomod" >&2; exit 1; }
  for m in $staging; do
    # an existing replace of the same module is updated in place
    edits+=("-replace=$m=$m@v$s")
  done
  # Replaces of the previous release that the new one no longer has must go.
  for m in $(sed -nE 's/^[[:space:]]*(replace[[:space:]]+)?(k8s\.io\/[A-Za-z0-9._\/-]+) =>.*/\2/p' "$moddir/go.mod"); do
    grep -qxF "$m" <<<"$staging" || edits+=("-dropreplace=$m")
  done
  local godebug
  godebug="$(sed -n 's/^godebug \(.*\)$/\1/p' "$gomod")"
  run_go "$moddir" "editing go.mod" -- mod edit "${edits[@]}" >/dev/null || exit 1
  if [ -n "$godebug" ]; then
    run_go "$moddir" "editing go.mod" -- mod edit "-godebug=$godebug" >/dev/null || exit 1
  fi
  local tools=() t
  for t in kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager kube-proxy; do
    tools+=("k8s.io/kubernetes/cmd/$t@v$k")
  done
  run_go "$moddir" "go get" -- get -tool "${tools[@]}" >/dev/null || exit 1
  run_go "$moddir" "go mod tidy" -- mod tidy >/dev/null || exit 1
  log "tests/kubepeers/kubernetes now builds Kubernetes v$k (staging modules v$s${godebug:+, godebug $godebug}); commit go.mod and go.sum"
  exit 0
}

if [ "${1:-}" = "--pin" ]; then
  pin "${2:?--pin wants a release like 1.34.4}"
fi

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(etcd kube-apiserver kubectl)

failed=0
built=()
for t in "${targets[@]}"; do
  case "$t" in
    etcd) build_etcd && built+=("$CACHE_BIN/etcd") || failed=1 ;;
    kube-apiserver | kubectl | kubelet | kube-scheduler | kube-controller-manager | kube-proxy) build_kube "$t" && built+=("$CACHE_BIN/$t") || failed=1 ;;
    cert-manager) build_cert_manager && built+=("$CACHE_BIN/cert-manager-controller") || failed=1 ;;
    helm) build_helm && built+=("$CACHE_BIN/helm") || failed=1 ;;
    coredns) build_coredns && built+=("$CACHE_BIN/coredns") || failed=1 ;;
    *) echo "build-kube-peers: unknown binary '$t' (want: etcd, kube-apiserver, kubectl, cert-manager, kubelet, kube-scheduler, kube-controller-manager, helm, kube-proxy, coredns)" >&2; exit 2 ;;
  esac
done

[ ${#built[@]} -gt 0 ] && printf '%s\n' "${built[@]}"
exit "$failed"
