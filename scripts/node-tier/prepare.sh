# shellcheck shell=bash
# Sourced by scripts/node-tier.sh: what the tier needs before it touches the
# host. Debian's packages (containerd, runc, CNI plugins, iptables, gcc for
# the pause binary), the Kubernetes and Choria binaries built from source
# (helm optional: without it the operator comes from deploy/), the
# integration-test binary that judges the timeline and runs the pages, and
# the release image's archive.

# ---- packages ----------------------------------------------------------------------
step "packages"
NEED=()
command -v containerd >/dev/null || NEED+=(containerd)
command -v runc >/dev/null || NEED+=(runc)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] || NEED+=(containernetworking-plugins)
command -v iptables >/dev/null || NEED+=(iptables)
command -v gcc >/dev/null || NEED+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -n "$(find /usr/lib -name libc.a -print -quit 2>/dev/null)" ] || NEED+=(libc6-dev)
for tool in curl openssl python3 base64 ip unshare mount; do
  command -v "$tool" >/dev/null || die "$tool is needed"
done
if [ ${#NEED[@]} -gt 0 ]; then
  log "installing ${NEED[*]} from Debian's packages"
  STEP_LOGS=("$CACHE_DIR/node-tier-apt.log")
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${NEED[@]}"; } \
    >"$CACHE_DIR/node-tier-apt.log" 2>&1 || die "apt-get install ${NEED[*]}"
fi
pass "$(containerd --version | awk '{print $1, $3}'), $(runc --version | head -n1), CNI plugins in /usr/lib/cni"

# ---- binaries and images ------------------------------------------------------------
step "binaries (scripts/build-kube-peers.sh)"
STEP_LOGS=("$CACHE_DIR/node-tier-build.log")
nice -n 10 "$ROOT/scripts/build-kube-peers.sh" etcd kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager \
  kube-proxy coredns cert-manager \
  >"$CACHE_DIR/node-tier-build.log" 2>&1 || die "scripts/build-kube-peers.sh failed"
# The real choria (go-choria's broker, server and CLI) for the production
# guide's run (7.).
nice -n 10 "$ROOT/scripts/build-go-peers.sh" choria >>"$CACHE_DIR/node-tier-build.log" 2>&1 ||
  die "scripts/build-go-peers.sh choria failed"
ETCD="$CACHE_BIN/etcd"
APISERVER="$CACHE_BIN/kube-apiserver"
KUBECTL="$CACHE_BIN/kubectl"
KUBELET="$CACHE_BIN/kubelet"
SCHEDULER="$CACHE_BIN/kube-scheduler"
KCM="$CACHE_BIN/kube-controller-manager"
# Helm for the operator's install; without it the chart's default render in
# deploy/ is applied instead, and every summary says so.
HELM=""
if nice -n 10 "$ROOT/scripts/build-kube-peers.sh" helm >"$CACHE_DIR/node-tier-build-helm.log" 2>&1; then
  HELM="$CACHE_BIN/helm"
  pass "$("$HELM" version --short 2>/dev/null || echo helm) at $HELM"
else
  log "node-tier: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  log "node-tier: WARNING: helm could not be built (scripts/build-kube-peers.sh helm, see"
  log "node-tier: $CACHE_DIR/node-tier-build-helm.log): the operator is installed from"
  log "node-tier: deploy/ (the chart's default render) with kubectl apply, NOT with helm"
  log "node-tier: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  tail -n 20 "$CACHE_DIR/node-tier-build-helm.log" | sed 's/^/  | /' >&2
fi

step "the integration-test binary (it judges the timeline: tests/it/node_tier.rs)"
STEP_LOGS=("$CACHE_DIR/node-tier-test-build.log")
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
cargo test --workspace --no-run --quiet --test it >"$CACHE_DIR/node-tier-test-build.log" 2>&1 || die "cargo test --no-run --test it failed"
pass "built"

step "release image archive"
if [ ! -s "$ARCHIVE" ] && [ "$ARCHIVE_GIVEN" = 0 ]; then
  STEP_LOGS=("$CACHE_DIR/node-tier-image.log")
  log "no $ARCHIVE: running scripts/build-image.sh"
  "$ROOT/scripts/build-image.sh" >"$CACHE_DIR/node-tier-image.log" 2>&1 || die "scripts/build-image.sh failed"
fi
[ -s "$ARCHIVE" ] || die "no image archive at $ARCHIVE"
pass "$ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
