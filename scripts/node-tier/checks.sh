# shellcheck shell=bash
# Sourced by scripts/node-tier.sh once the node is Ready: checks 1-5 of its
# header. Pods of the release image on the kubelet (--version to Succeeded
# and `kubectl logs`; probes that restart and hold NotReady), then the
# operator installed by helm from the chart (deploy/ when helm could not be
# built), its leader's SIGTERM and a rolling restart. The pods' manifests
# are manifests/pod-*.yaml.

# ---- 1. --version as a pod ----------------------------------------------------------------
step "pod: choria-provisioner --version (Succeeded, kubectl logs)"
STEP_LOGS=("$W/kubelet.log" "$W/containerd.log")
phase() { kc -n default get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
render "$ROOT/scripts/node-tier/manifests/pod-version.yaml" | kc apply -f - >/dev/null || die "creating pod version"
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
render "$ROOT/scripts/node-tier/manifests/pod-probes.yaml" | kc apply -f - >/dev/null || die "creating pod probes"
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
summary "operator installed with" "$OPERATOR_VIA"
summary "operator Ready (install -> rollout complete)" "$OP_READY_S s"

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
