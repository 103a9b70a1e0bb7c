# shellcheck shell=bash
# Sourced by scripts/node-tier.sh after teardown.sh: the cluster on this
# machine, a step each: the host's network (bridge, the service range's
# route, iptables), etcd + kube-apiserver, kube-scheduler +
# kube-controller-manager, containerd with the pause and release images, and
# the kubelet until its node is Ready. The configs are config/*, rendered
# into the work directory (render, lib.sh); the pause binary is pause.c.
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
# shellcheck disable=SC2034 # its locals are read by render
kubeconfig() {
  local token="$2" user="$3" ca_data
  ca_data="$(base64 -w0 "$K/certs/apiserver.crt")"
  (umask 077 && render "$ROOT/scripts/node-tier/config/kubeconfig.yaml" >"$1")
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
# The pod sandbox's process, pause.c: built here (no registry to pull
# registry.k8s.io/pause from).
gcc -static -Os -s -o "$W/pause/pause" "$ROOT/scripts/node-tier/pause.c" >"$W/pause/build.log" 2>&1 || die "gcc -static pause.c"
# An OCI archive of one layer (/pause), as `ctr images import` takes it.
python3 "$ROOT/scripts/node-tier/oci-image.py" "$W/pause/pause" "$W/pause/pause.oci.tar" "$PAUSE_REF" \
  --user 65535:65535 || die "writing the pause image"
# Loopback is added by containerd's CRI itself (from bin_dir); the bridge gives
# each pod an address on our /24 and only a route to the service range.
render "$ROOT/scripts/node-tier/config/cni.conflist" >"$W/cni/net.d/10-$CNI_NET.conflist"
# shellcheck disable=SC2034 # read by render
RUNC="$(command -v runc)"
render "$ROOT/scripts/node-tier/config/containerd.toml" >"$C/config.toml"
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
# shellcheck disable=SC2034 # read by render
kport="$(free_port)"
# shellcheck disable=SC2034 # read by render
khealth="$(free_port)"
mkdir -p "$KUBELET_DIR" "$W/pod-logs" "$W/sysctl"
render "$ROOT/scripts/node-tier/config/kubelet.yaml" >"$W/kubelet.yaml"
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
