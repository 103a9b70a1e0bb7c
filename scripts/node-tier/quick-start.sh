# shellcheck shell=bash
# Sourced by scripts/node-tier.sh, last: the quick start on Kubernetes
# (docs/src/quick-start/kubernetes.md) from its own text, run by
# tests/it/kubernetes_quick_start.rs. It uses the tier's helpers (step, pass,
# die, spawn, kc, ctrc, wait_until, free_port) and its cluster.
#
# The page assumes a cluster with what most have and this one lacks until
# here; this file adds it, as a cluster's admin would, before the page runs:
#   * cluster DNS and Services: CoreDNS (kubernetes plugin, the `cluster.local`
#     zone the kubelet's clusterDNS points at) and kube-proxy (iptables mode),
#     both on the host against the API server;
#   * cert-manager: its CRDs and its controllers (issuers, the CA issuer, the
#     default approver) on the host;
#   * the images the page names, in the node's containerd, since no registry
#     is reachable: `nats:2.10` made from the nats-server the suite installs,
#     and this build's image under the name and tag step 1 of the page pushes
#     (`registry.example.net/choria-provisioner:0.1.0-<commit>`).
# The tier's own operator release goes first: the page installs one of the
# same name into the same namespace.

step "quick start on Kubernetes: cluster DNS, Services, cert-manager, images"
STEP_LOGS=("$W/coredns.log" "$W/kube-proxy.log" "$W/cert-manager.log" "$W/quick-start-setup.log")
[ -n "$HELM" ] || die "the quick start installs the chart with helm, which could not be built"
{
  kc delete namespace "$PNS" --wait=true --timeout=180s &&
    hm uninstall choria-provisioner-operator -n "$NS" --wait --timeout 180s &&
    kc delete namespace "$NS" --wait=true --timeout=180s
} >"$W/quick-start-setup.log" 2>&1 || die "removing the tier's own operator and namespaces"
# A pod reaching another through a Service's address gets its answer back
# un-NATed only if bridged traffic passes iptables (kube-proxy's own
# requirement; no masquerading here).
[ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] ||
  die "kube-proxy needs bridged traffic through iptables: modprobe br_netfilter; sysctl net.bridge.bridge-nf-call-iptables=1"

cat >"$W/Corefile" <<EOF
.:53 {
    bind $GW
    errors
    kubernetes cluster.local {
        kubeconfig $KUBECONFIG_FILE
    }
}
EOF
spawn coredns "$CACHE_BIN/coredns" -conf "$W/Corefile"
# kube-proxy as it would run on a node, leaving the host's sysctls alone
# (conntrack sizes and timeouts, route_localnet for localhost NodePorts).
spawn kube-proxy "$CACHE_BIN/kube-proxy" --kubeconfig="$KUBECONFIG_FILE" --hostname-override="$NODE" \
  --proxy-mode=iptables --cluster-cidr="$SUBNET" --conntrack-max-per-core=0 \
  --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 \
  --iptables-localhost-nodeports=false \
  --metrics-bind-address="127.0.0.1:$(free_port)" --healthz-bind-address="127.0.0.1:$(free_port)" --v=1
dns_answers() { [ -n "$(dig +short +time=1 +tries=1 "@$GW" kubernetes.default.svc.cluster.local 2>/dev/null)" ]; }
if command -v dig >/dev/null; then
  wait_until 30 "CoreDNS answering on $GW:53" dns_answers
else
  wait_until 30 "CoreDNS listening on $GW:53" sh -c "ss -lun | grep -q '$GW:53 '"
fi
proxy_synced() { iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1; }
wait_until 30 "kube-proxy's KUBE-SERVICES chain" proxy_synced

kc apply --server-side -f "$CACHE_DIR/cert-manager/crds/" >>"$W/quick-start-setup.log" 2>&1 ||
  die "applying cert-manager's CRDs"
for c in certificaterequests certificates issuers clusterissuers; do
  crd_established "$c.cert-manager.io" kc || die "cert-manager's CRD $c is not Established"
done
spawn cert-manager "$CACHE_BIN/cert-manager-controller" --kubeconfig="$KUBECONFIG_FILE" \
  --cluster-resource-namespace=cert-manager -v=2

python3 "$ROOT/scripts/node-tier/oci-image.py" "$(readlink -f "$CACHE_BIN/nats-server")" "$W/nats.oci.tar" \
  docker.io/library/nats:2.10 --name nats-server --user 0:0 || die "making the nats:2.10 image"
ctrc images import "$W/nats.oci.tar" >>"$W/quick-start-setup.log" 2>&1 || die "ctr images import nats:2.10"
QS_IMAGE="registry.example.net/$IMAGE_NAME:$VERSION-$(git -C "$ROOT" rev-parse --short=12 HEAD)"
ctrc images tag --force "$IMAGE_REF" "$QS_IMAGE" >>"$W/quick-start-setup.log" 2>&1 || die "ctr images tag $QS_IMAGE"
pass "CoreDNS on $GW:53 (cluster.local), kube-proxy (iptables), cert-manager's controllers; images nats:2.10 and $QS_IMAGE"

step "quick start on Kubernetes: the page as written"
STEP_LOGS=("$W/quick-start.log" "$W/cert-manager.log" "$W/kubelet.log")
t0=$(now)
NODE_TIER_KUBECONFIG="$KUBECONFIG_FILE" NODE_TIER_KUBECTL="$KUBECTL" NODE_TIER_HELM="$HELM" \
  cargo test --workspace --quiet --test it kubernetes_quick_start::the_kubernetes_quick_start_on_a_real_kubelet \
  -- --ignored --exact --nocapture >"$W/quick-start.log" 2>&1 || {
  kc -n choria get pods -o wide >>"$W/quick-start.log" 2>&1
  die "the quick start on Kubernetes did not run through"
}
QS_S="$(secs "$t0" "$(now)")"
summary "quick start on Kubernetes, from the page" "$QS_S s"
pass "the page's every command ran: 50 nodes provisioned through cert-manager in $QS_S s"
