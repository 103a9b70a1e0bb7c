# shellcheck shell=bash
# Sourced by scripts/node-tier.sh after checks.sh: check 6 of its header, a
# Provisioner of 3 replicas (manifests/provisioner.yaml, in the namespace of
# manifests/namespace.yaml) provisioning a fleet simulated on the host, its
# leadership sampled by sampler.py and judged by tests/it/node_tier.rs
# through a rollout, a delete, a pause, the fleet's end and a broker outage.

# ---- 6. a Provisioner of 3 replicas provisions a fleet on the host -------------------------
# The fleet (`choria-provisioner fleet`) and NATS run on the host, NATS on the
# bridge's address; the Provisioner's pods reach it there. A background sampler
# scrapes every pod's /metrics at its pod IP every SAMPLE_MS ms (the timeline:
# which replica reports choria_provisioner_leader 1 when), from which the
# hand-over gaps below are measured. The helper sleeps HELPER_SLEEP s per node
# (WORKERS at a time), so provisioning lasts through the rollout, the delete and
# the pause.
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
render "$ROOT/scripts/node-tier/manifests/namespace.yaml" | kc apply -f - >/dev/null || die "creating namespace $PNS"
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
render "$ROOT/scripts/node-tier/manifests/provisioner.yaml" | kc apply -f - >/dev/null ||
  die "creating Provisioner $PNS/provisioner"
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
