#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need into a cache
# under $HOME (nats-server, the real Go peers), checks formatting and lints, and
# runs every test tier.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

# Build outputs live in the cache so that a fresh clone reuses earlier builds.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
# Incremental data is kept per source path: a fresh clone never reuses it,
# and under CI every run's clone would add ~5 GB of it to the shared target
# (16 GB after a few runs filled this machine's disk and failed a run).
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi

ensure_rust
ensure_nats_server
export NATS_SERVER_BIN="$CACHE_BIN/nats-server"

# openssl makes test certificates; faketime (libfaketime) moves a leader's
# clock in the fault tier; softhsm2 is the PKCS#11 token the token-key tests
# sign with (the wire's, config's, core's, and tests/it/issuer_in_token.rs;
# its module at Debian's path, as the tests expect), and
# opensc's pkcs11-tool inspects such tokens by hand.
missing=()
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)
{ [ -e /usr/lib/softhsm/libsofthsm2.so ] && command -v softhsm2-util >/dev/null 2>&1; } || missing+=(softhsm2)
command -v pkcs11-tool >/dev/null 2>&1 || missing+=(opensc)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} from Debian's packages"
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The real Go peers: go-choria's `choria` (server + CLI) for the interop tier,
# the election candidate, and the Go provisioner itself (built from the copy
# in ../shared/peers/go-provisioner, see tests/gopeers/RECIPE.md).
# A peer that cannot be built is reported loudly and fails this script at
# the end (after the tests ran, so their results are still seen); under CI
# (`CI` set, as .ci/run is run) each test that needs it fails too, and
# without CI it says NOT RUN and is counted as skipped in the closing line.
unavailable=()
peer_log="$CACHE_DIR/build-go-peers.log"
if "$ROOT/scripts/build-go-peers.sh" choria natstap election-candidate >"$peer_log.out" 2>"$peer_log"; then
  export CHORIA_BIN="$CACHE_BIN/choria" CHORIA_ELECTION_CANDIDATE_BIN="$CACHE_BIN/choria-election-candidate"
  log "go-choria peer: $CHORIA_BIN"
else
  export CHORIA_GO_PEERS_UNAVAILABLE="$(tail -n 20 "$peer_log")"
  unavailable+=("go-choria (choria, natstap, election candidate): $peer_log")
  printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
  printf '!!! go-choria could not be built: the interop tier cannot prove anything\n%s\n' "$CHORIA_GO_PEERS_UNAVAILABLE" >&2
  printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
fi
if "$ROOT/scripts/build-go-peers.sh" provisioner >/dev/null 2>"$peer_log.prov"; then
  export CHORIA_GO_PROVISIONER_BIN="$CACHE_BIN/choria-go-provisioner"
  log "Go provisioner peer: $CHORIA_GO_PROVISIONER_BIN"
else
  export CHORIA_GO_PROVISIONER_UNAVAILABLE="$(tail -n 5 "$peer_log.prov")"
  unavailable+=("the Go provisioner: $peer_log.prov")
  printf '\n!!! the Go provisioner could not be built: the side-by-side tiers cannot prove anything\n%s\n\n' \
    "$CHORIA_GO_PROVISIONER_UNAVAILABLE" >&2
fi

# Jaeger for the traces tier (tests/it/traces.rs): ~7 min cold, seconds when
# the Go build cache is warm.
if "$ROOT/scripts/build-go-peers.sh" jaeger >/dev/null 2>"$peer_log.jaeger"; then
  export JAEGER_BIN="$CACHE_BIN/jaeger"
  log "Jaeger peer: $JAEGER_BIN"
else
  export JAEGER_UNAVAILABLE="$(tail -n 20 "$peer_log.jaeger")"
  unavailable+=("Jaeger: $peer_log.jaeger")
  printf '\n!!! Jaeger could not be built: the traces tier cannot prove anything\n%s\n\n' \
    "$JAEGER_UNAVAILABLE" >&2
fi

# A real Kubernetes control plane (etcd, kube-apiserver, kubectl) for the kube
# tier: ~8 min cold on 2 cores, ~10 s with a warm Go build cache, 0.14 s when up to date.
kube_log="$CACHE_DIR/build-kube-peers.log"
if "$ROOT/scripts/build-kube-peers.sh" >"$kube_log.out" 2>"$kube_log"; then
  export ETCD_BIN="$CACHE_BIN/etcd" KUBE_APISERVER_BIN="$CACHE_BIN/kube-apiserver" KUBECTL_BIN="$CACHE_BIN/kubectl"
  log "kube control plane: $KUBE_APISERVER_BIN"
else
  export KUBE_PEERS_UNAVAILABLE="$({ grep -A 20 'FAILED' "$kube_log" || tail -n 20 "$kube_log"; } | head -n 40)"
  unavailable+=("etcd/kube-apiserver/kubectl (and so cert-manager and the image smoke tier): $kube_log")
  printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
  printf '!!! etcd/kube-apiserver/kubectl could not be built: the Kubernetes tier cannot prove anything\n%s\n' "$KUBE_PEERS_UNAVAILABLE" >&2
  printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
fi

# The real cert-manager's controllers and CRDs for tests/it/cert_manager.rs
# (~3 min cold, 0.1 s when up to date); without them that test says NOT RUN.
if [ -z "${KUBE_PEERS_UNAVAILABLE:-}" ]; then
  if "$ROOT/scripts/build-kube-peers.sh" cert-manager >>"$kube_log.out" 2>"$kube_log.cm"; then
    export CERT_MANAGER_CONTROLLER_BIN="$CACHE_BIN/cert-manager-controller" CERT_MANAGER_CRDS="$CACHE_DIR/cert-manager/crds"
    log "cert-manager peer: $CERT_MANAGER_CONTROLLER_BIN"
  else
    export CERT_MANAGER_UNAVAILABLE="$(tail -n 20 "$kube_log.cm")"
    unavailable+=("cert-manager: $kube_log.cm")
    printf '\n!!! cert-manager could not be built: tests/it/cert_manager.rs proves nothing in this run\n%s\n\n' \
      "$CERT_MANAGER_UNAVAILABLE" >&2
  fi
else
  export CERT_MANAGER_UNAVAILABLE="not built: it needs the kube control plane, which is unavailable"
fi

# Every install helper once more into an empty cache (~80 s): one that only
# works with a warm cache fails here instead of on a new user's machine.
log "install helpers on an empty cache (scripts/check-install.sh)"
"$ROOT/scripts/check-install.sh"

log "manifests: the checks' own unit tests (scripts/manifests/tests)"
"$ROOT/scripts/check-manifests.sh" --self-test
log "manifests: chart lint/render, kubernetes-validate 1.34 strict, CRD copies"
"$ROOT/scripts/check-manifests.sh"
log "layers inside the crates: no import cycle, rooms, sizes (scripts/check-layers.py)"
python3 "$ROOT/scripts/check-layers.py"
# Tests a reader can follow: no test function over 150 lines, no dead_code
# allowance in tests/it/support, long test modules in <file>/tests.rs.
log "tests: scenarios in named steps, support without dead code (scripts/check-tests.py)"
python3 "$ROOT/scripts/check-tests.py" --self-test
python3 "$ROOT/scripts/check-tests.py"
# The commit convention (docs/src/contributing.md, "Commits") for every
# commit after the one it was adopted at.
log "commit messages: area: summary in at most 72 characters, a body (scripts/check-commits.py)"
python3 "$ROOT/scripts/check-commits.py" --self-test
python3 "$ROOT/scripts/check-commits.py"
# The helpers' own tests: the failure summary printed last, the node tier's
# image writer and reader and its metrics sampler.
python3 "$ROOT/scripts/failures.py" --self-test
python3 "$ROOT/scripts/node-tier/oci-image.py" --self-test
python3 "$ROOT/scripts/node-tier/oci-extract.py" --self-test
python3 "$ROOT/scripts/node-tier/sampler.py" --self-test
# The book in docs/: builds without a warning, no internal link or anchor
# broken (~2 s once mdBook is installed; its reference pages are compared
# with the code by tests/it/book.rs in cargo test below).
log "the book: mdBook build, internal links and anchors (scripts/docs.sh)"
"$ROOT/scripts/docs.sh"
log "cargo fmt --check"
cargo fmt --all -- --check
# --all-targets type-checks the benchmarks too; building them (the bench
# profile is a release build of its own, ~4 min after a source change) is
# left to scripts/bench.sh.
log "cargo clippy (every target, benchmarks included)"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The unit tests of every crate and the integration tests (one binary,
# tests/it) in two passes: first everything that mostly waits on its peers,
# CHORIA_TEST_THREADS at a time (4: each mostly sleeps on timers, brokers
# and API servers); then the tests in `alone` modules (floods, scale runs,
# benchmarks against the Go provisioner: they load both cores, and their
# bounds were measured with the machine to themselves), one at a time.
threads="${CHORIA_TEST_THREADS:-4}"
log "cargo build --tests"
cargo build --workspace --tests --quiet
log "cargo test: unit tests and the integration tiers, $threads at a time"
results="$CACHE_DIR/test-results.txt"
set +e
cargo test --workspace --no-fail-fast --lib --bins --tests -- --skip ::alone:: --test-threads "$threads" 2>&1 | tee "$results"
status=${PIPESTATUS[0]}
log "cargo test: the tests that want the machine to themselves (alone), one at a time"
cargo test --workspace --no-fail-fast --test it -- ::alone:: --test-threads 1 2>&1 | tee -a "$results"
alone_status=${PIPESTATUS[0]}
[ "$status" -ne 0 ] || status=$alone_status
set -e
# One closing line over every test binary, so the outcome is read at a glance.
# libtest counts a test that returned early for want of a peer as passed;
# each printed a `test-not-run: <test>: <why>` line (tests/it/support/peers.rs),
# so those are taken out of "passed" and reported as skipped, by name.
not_run="$(grep -o '^test-not-run: .*' "$results" | sort -u || true)"
skipped=0
[ -z "$not_run" ] || skipped="$(printf '%s\n' "$not_run" | wc -l)"
if [ "$skipped" -gt 0 ]; then
  printf '\n!!! %d tests NOT RUN (a peer is missing; they prove nothing):\n%s\n\n' "$skipped" "$not_run" >&2
fi
awk -v skipped="$skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed, %d skipped\n", p - skipped, f, skipped }' "$results"

# The release image, built here from Debian packages (scripts/build-image.sh),
# run as a container: --version, `run` provisioning a fleet, `operator`
# reconciling on the test apiserver, SIGTERM through tini (~20 s warm; the
# first time ~1 min for podman, mmdebstrap and the Debian root filesystem,
# plus the release build).
image_status=0
if [ -z "${KUBE_PEERS_UNAVAILABLE:-}" ]; then
  log "image smoke tier: release image built here, run/operator/SIGTERM in containers (scripts/image-smoke.sh)"
  "$ROOT/scripts/image-smoke.sh" || image_status=$?
else
  printf '\n!!! no kube control plane: the image smoke tier (scripts/image-smoke.sh) is NOT run\n\n' >&2
fi
[ "$status" -ne 0 ] || status=$image_status

# The node tier (scripts/node-tier.sh): the image as real pods on a real kubelet
# (containerd, runc, CNI, kube-scheduler, kube-controller-manager), the chart
# installed with Helm, 3 leader-elected replicas through rollout restart, pod
# delete, pause and a broker outage. Behind CHORIA_NODE_TIER=1: it needs root,
# adds a bridge and iptables rules while it runs, and its first build (kubelet,
# controller-manager, scheduler, helm: ~12 min cold) does not fit CI's budget
# next to the rest; warm it takes ~2 min (docs/src/contributing.md, "Tested on a real kubelet").
node_status=0
if [ "${CHORIA_NODE_TIER:-0}" = 1 ]; then
  log "node tier: real pods on a real kubelet (scripts/node-tier.sh)"
  "$ROOT/scripts/node-tier.sh" || node_status=$?
else
  log "node tier not run (CHORIA_NODE_TIER=1 runs scripts/node-tier.sh, ~7 min warm)"
fi
[ "$status" -ne 0 ] || status=$node_status
if [ ${#unavailable[@]} -gt 0 ]; then
  printf '\n!!! FAILED: peers this script builds are unavailable, so tests that need them proved nothing:\n' >&2
  printf '!!!   %s\n' "${unavailable[@]}" >&2
  [ "$status" -ne 0 ] || status=1
fi
# Last of all, why each failed test failed (scripts/failures.py): libtest
# prints it mid-run, and a long log cut in the middle (as CI keeps it) would
# lose it.
[ "$status" -eq 0 ] || python3 "$ROOT/scripts/failures.py" "$results" || true
exit "$status"
