#!/usr/bin/env bash
# The image smoke tier: builds the release image here (scripts/build-image.sh)
# and proves that it works as an image, not only as a binary:
#
#   1. the image's configuration (podman image inspect) is the contract of
#      scripts/image-contract.env, which scripts/build-image.sh builds from and
#      the Dockerfile's final stage is generated from: user, entrypoint, cmd,
#      workdir, HOME, labels; the build's own tag (<version>-<image ID>)
#      names it too; inside it the user exists, /tmp is 1777, sh and the CA
#      bundle are there;
#   2. `--version` prints the crate version;
#   3. `run` in the container (host network, its configuration mounted read-only
#      as the chart mounts it) provisions a simulated fleet on a test
#      nats-server: /metrics reaches N provisioned, the fleet's journal shows
#      every node configured and restarted once; then `podman stop` (SIGTERM
#      to tini, PID 1) ends it with status 0 in under 3 s;
#   4. `operator` in the container, logged in as the chart's ServiceAccount
#      with deploy/rbac.yaml, reconciles deploy/example-provisioner.yaml on a
#      real kube-apiserver (etcd + kube-apiserver from
#      scripts/build-kube-peers.sh, started as tests/it/support/kube.rs starts
#      them): the owned ConfigMap and Deployment appear, the Provisioner gets
#      its conditions, and SIGTERM ends it promptly with its Lease released.
#
#   scripts/image-smoke.sh [--bin PATH]     (--bin is passed to build-image.sh)
#
# Environment: IMAGE_SMOKE_NODES (fleet size, default 200), IMAGE_SMOKE_KEEP=1
# (keep the work directory; it is also kept when a check fails).
# Any failure exits 1 with what failed; timings are printed at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"

NODES="${IMAGE_SMOKE_NODES:-200}"
BUILD_ARGS=("$@")
BIN="$CARGO_TARGET_DIR/release/choria-provisioner"
[ "${1:-}" = --bin ] && BIN="${2:?--bin needs a path}"

ETCD="${ETCD_BIN:-$CACHE_BIN/etcd}"
APISERVER="${KUBE_APISERVER_BIN:-$CACHE_BIN/kube-apiserver}"
KUBECTL="${KUBECTL_BIN:-$CACHE_BIN/kubectl}"

# The contract, from the one place it is written (scripts/image-contract.env:
# IMAGE_NAME, IMAGE_USER, ...).
load_image_contract || { log "image-smoke: no image contract"; exit 1; }
VERSION="$(image_version)"
[ -n "$VERSION" ] || { log "image-smoke: no workspace.package version in Cargo.toml"; exit 1; }
TAG="$IMAGE_NAME:$VERSION"

began=$(date +%s%N)
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
TIMINGS=()
timed() { TIMINGS+=("$(printf '%-44s %6s s' "$1" "$(secs "$2" "$(now)")")"); }

WORK="$(mktemp -d "$CACHE_DIR/image-smoke.XXXXXX")"
OK=0
CONTAINERS=()
PIDS=()
cleanup() {
  local c p
  for c in "${CONTAINERS[@]+"${CONTAINERS[@]}"}"; do podman_cmd rm --force --time 0 "$c" >/dev/null 2>&1 || true; done
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do wait "$p" 2>/dev/null || true; done
  if [ "$OK" = 1 ] && [ -z "${IMAGE_SMOKE_KEEP:-}" ]; then
    rm -rf "$WORK"
  else
    log "image-smoke: work directory kept: $WORK"
  fi
}
trap cleanup EXIT

die() {
  log "image-smoke: FAILED: $*"
  exit 1
}
pass() { log "image-smoke: ok: $*"; }

# show_logs NAME: the end of a container's log, to go with a failure.
show_logs() { podman_cmd logs "$1" 2>&1 | tail -n 30 | sed 's/^/  | /' >&2 || true; }
running() { [ "$(podman_cmd inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }

# metric URL NAME: the sum of every series of NAME, empty when not scraped.
metric() {
  curl -fsS --max-time 2 "$1" 2>/dev/null |
    awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $NF; f = 1 } END { if (f) print s }' || true
}

# stop_container NAME WHAT: podman stop -t 5 (SIGTERM, SIGKILL after 5 s);
# it must have exited by itself with status 0 in under 3 s.
stop_container() {
  local name="$1" what="$2" t0 took code
  t0=$(now)
  podman_cmd stop --time 5 "$name" >/dev/null
  took="$(secs "$t0" "$(now)")"
  code="$(podman_cmd inspect --format '{{.State.ExitCode}}' "$name")"
  podman_cmd logs "$name" >"$WORK/$name.log" 2>&1 || true
  if [ "$code" != 0 ] || awk -v t="$took" 'BEGIN { exit !(t >= 3) }'; then
    show_logs "$name"
    die "$what: after SIGTERM it took ${took} s and exited with status $code (want 0 in < 3 s: tini forwards SIGTERM, the provisioner stops gracefully)"
  fi
  pass "$what: SIGTERM through tini, exited 0 in ${took} s"
}

for tool in curl openssl python3 base64; do
  command -v "$tool" >/dev/null || die "$tool is needed"
done
ensure_nats_server
for b in "$ETCD" "$APISERVER" "$KUBECTL"; do
  [ -x "$b" ] || die "$b does not exist: build etcd, kube-apiserver and kubectl with scripts/build-kube-peers.sh (or set ETCD_BIN, KUBE_APISERVER_BIN, KUBECTL_BIN)"
done
read -r -a ULIMITS <<<"$(podman_ulimits)"
INIT="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])[0])' "$IMAGE_ENTRYPOINT")"

# ---- 1. the image -----------------------------------------------------------------
t=$(now)
log "image-smoke: scripts/build-image.sh ${BUILD_ARGS[*]+"${BUILD_ARGS[*]}"}"
"$ROOT/scripts/build-image.sh" "${BUILD_ARGS[@]+"${BUILD_ARGS[@]}"}" | tee "$WORK/build.out" || die "scripts/build-image.sh failed"
timed "build-image.sh" "$t"
[ -x "$BIN" ] || die "no binary at $BIN for the fleet on the host"

t=$(now)
podman_cmd image inspect "$TAG" >"$WORK/inspect.json" || die "podman image inspect $TAG"
# shellcheck disable=SC2153 # IMAGE_HOME is set by load_image_contract
python3 - "$WORK/inspect.json" "$IMAGE_USER" "$IMAGE_ENTRYPOINT" "$IMAGE_CMD" "$IMAGE_WORKDIR" "$IMAGE_HOME" \
  "$IMAGE_TITLE" "$IMAGE_DESCRIPTION" "$VERSION" "$IMAGE_LICENSES" <<'PY' ||
import json, sys
inspect, user, entrypoint, cmd, workdir, home, title, description, version, licenses = sys.argv[1:]
cfg = json.load(open(inspect))[0]["Config"]
want = {"User": user, "Entrypoint": json.loads(entrypoint), "Cmd": json.loads(cmd), "WorkingDir": workdir}
bad = [f"{k}: image {cfg.get(k)!r}, contract {v!r}" for k, v in want.items() if cfg.get(k) != v]
env = dict(e.split("=", 1) for e in cfg.get("Env") or [])
if env.get("HOME") != home:
    bad.append(f"Env HOME: image {env.get('HOME')!r}, contract {home!r}")
labels = cfg.get("Labels") or {}
for k, v in {"title": title, "description": description, "version": version, "licenses": licenses}.items():
    have = labels.get(f"org.opencontainers.image.{k}")
    if have != v:
        bad.append(f"label org.opencontainers.image.{k}: image {have!r}, want {v!r}")
for b in bad:
    print(f"  {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
  die "the image's configuration is not the contract in scripts/image-contract.env"
pass "podman image inspect: user $IMAGE_USER, entrypoint $IMAGE_ENTRYPOINT, cmd $IMAGE_CMD, workdir $IMAGE_WORKDIR, HOME=$IMAGE_HOME, OCI labels"
# The build's own tag (the one to push): <version>-<start of the image's ID>,
# on this same image.
id="$(podman_cmd image inspect --format '{{.Id}}' "$TAG")"
build_tag="$(sed -n 's/^build: *\([^ ]*\).*/\1/p' "$WORK/build.out")"
[ "$build_tag" = "$TAG-${id:0:12}" ] || die "build-image.sh reported the build's tag '$build_tag', want $TAG-${id:0:12}"
[ "$(podman_cmd image inspect --format '{{.Id}}' "$build_tag" 2>/dev/null)" = "$id" ] ||
  die "$build_tag does not name the image $TAG names (${id:0:12})"
pass "the build's own tag $build_tag names the same image"

# shellcheck disable=SC2016 # expanded by the image's /bin/sh
inside="$(podman_cmd run --rm --network none "${ULIMITS[@]}" --entrypoint /bin/sh "$TAG" -c '
  echo "uid=$(id -u) gid=$(id -g) user=$(id -un) home=$HOME pwd=$(pwd) tmp=$(stat -c %a /tmp)"
  for f in "$@"; do [ -x "$f" ] && echo "exec=$f"; done
  [ -s /etc/ssl/certs/ca-certificates.crt ] && echo "ca=ok"
  command -v sed >/dev/null && echo "coreutils=ok"' sh "$IMAGE_BINARY" "$INIT" 2>&1)" ||
  die "/bin/sh does not run in the image: $inside"
want="uid=${IMAGE_USER%%:*} gid=${IMAGE_USER##*:} user=$IMAGE_USER_NAME home=$IMAGE_HOME pwd=$IMAGE_WORKDIR tmp=1777"
grep -qxF "$want" <<<"$inside" || die "inside the image: want '$want', got: $inside"
grep -qxF "exec=$IMAGE_BINARY" <<<"$inside" || die "$IMAGE_BINARY is not executable in the image"
grep -qxF "exec=$INIT" <<<"$inside" || die "the entrypoint's $INIT is not executable in the image"
grep -qx "ca=ok" <<<"$inside" || die "no CA bundle (/etc/ssl/certs/ca-certificates.crt) in the image"
grep -qx "coreutils=ok" <<<"$inside" || die "no sed in the image (helpers are shell scripts)"
pass "inside: $want, $IMAGE_BINARY and $INIT executable, CA bundle, sh and coreutils"
timed "image configuration checks" "$t"

# ---- 2. --version ---------------------------------------------------------------------
t=$(now)
out="$(podman_cmd run --rm --network none "${ULIMITS[@]}" "$TAG" --version 2>&1)" || die "--version failed: $out"
grep -qw -- "$VERSION" <<<"$out" || die "--version printed '$out', not version $VERSION"
pass "podman run $TAG --version: $out"
timed "podman run --version" "$t"

# ---- 3. run: a simulated fleet on a test nats-server ---------------------------------
t=$(now)
R="$WORK/run"
CFG="$R/config"
mkdir -p "$CFG"
chmod 0755 "$CFG"
port="$(free_port)"
monitor="$(free_port)"
printf 'listen: 127.0.0.1:%s\nmax_payload: 4MB\n' "$port" >"$R/nats.conf"
"$CACHE_BIN/nats-server" -c "$R/nats.conf" >"$R/nats.log" 2>&1 &
PIDS+=($!)
wait_for_port "$port" || die "nats-server did not start (see $R/nats.log)"
# The fleet's provisioning JWTs are signed with this key; the provisioner in
# the container verifies them with its public half, read from the mount.
openssl genrsa -out "$R/signer.key" 2048 2>/dev/null
openssl rsa -in "$R/signer.key" -pubout -out "$CFG/jwt-verify.pem" 2>/dev/null
install -m 0755 "$ROOT/examples/helper.sh" "$CFG/helper.sh"
cat >"$CFG/provisioner.yaml" <<EOF
workers: 8
interval: 1m
token: s3cret
site: image-smoke
helper: /etc/choria-provisioner/helper.sh
choria_insecure: true
monitor_port: $monitor
loglevel: warn
jwt_verify_cert: /etc/choria-provisioner/jwt-verify.pem
features:
  jwt: true
EOF
cat >"$CFG/choria.cfg" <<EOF
identity = provisioner.image-smoke
plugin.choria.middleware_hosts = nats://127.0.0.1:$port
plugin.security.provider = file
EOF
chmod 0644 "$CFG"/*.yaml "$CFG"/*.cfg "$CFG"/*.pem

"$BIN" fleet --nats "nats://127.0.0.1:$port" --nodes "$NODES" --token s3cret \
  --jwt-signer "$R/signer.key" --journal "$R/journal.jsonl" --exit-when-done --log warn \
  >"$R/fleet.out" 2>"$R/fleet.log" &
fleet_pid=$!
PIDS+=("$fleet_pid")
started=0
for _ in $(seq 300); do
  started="$(grep -c '"event":"startup"' "$R/journal.jsonl" 2>/dev/null || true)"
  [ "${started:-0}" -ge "$NODES" ] && break
  kill -0 "$fleet_pid" 2>/dev/null || break
  sleep 0.1
done
[ "${started:-0}" -ge "$NODES" ] || die "the fleet started ${started:-0} of $NODES nodes (see $R/fleet.log)"

name="choria-smoke-run-$$"
CONTAINERS+=("$name")
t_run=$(now)
podman_cmd run --detach --name "$name" --network host "${ULIMITS[@]}" \
  --env BROKER=nats://broker.image-smoke.example.net:4222 \
  --volume "$CFG:/etc/choria-provisioner:ro" \
  "$TAG" run --config /etc/choria-provisioner/provisioner.yaml \
  --choria-config /etc/choria-provisioner/choria.cfg >/dev/null || die "podman run ($name) failed"
provisioned=""
deadline=$(($(date +%s) + 120))
while :; do
  provisioned="$(metric "http://127.0.0.1:$monitor/metrics" choria_provisioner_provisioned)"
  [ -n "$provisioned" ] && awk -v p="$provisioned" -v n="$NODES" 'BEGIN { exit !(p >= n) }' && break
  running "$name" || { show_logs "$name"; die "the provisioner container exited before provisioning the fleet"; }
  [ "$(date +%s)" -lt "$deadline" ] || { show_logs "$name"; die "choria_provisioner_provisioned is ${provisioned:-not scraped}, not $NODES, after 120 s"; }
  sleep 0.2
done
pass "run in the container: choria_provisioner_provisioned = $provisioned in $(secs "$t_run" "$(now)") s"
# The fleet leaves once every node restarted out of provisioning mode (a 2-3 s
# splay) and then writes each node's final state.
for _ in $(seq 300); do kill -0 "$fleet_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$fleet_pid" 2>/dev/null && die "the fleet did not exit after every node was provisioned (see $R/fleet.log)"
python3 "$ROOT/scripts/bench_report.py" journal "$R/journal.jsonl" --nodes "$NODES" >"$R/journal-check.json"
python3 - "$R/journal-check.json" <<'PY' || die "the fleet's journal does not show every node provisioned once ($R/journal.jsonl)"
import json, sys
j = json.load(open(sys.argv[1]))
for p in j["problems"]:
    print(f"  {p}", file=sys.stderr)
sys.exit(0 if j["ok"] else 1)
PY
pass "journal: $NODES nodes, each configured once, restarted once, finally provisioned"
stop_container "$name" "run"
timed "run: $NODES nodes provisioned, SIGTERM" "$t"
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
PIDS=()

# ---- 4. operator: a real kube-apiserver -----------------------------------------------
t=$(now)
K="$WORK/kube"
mkdir -p "$K/operator"
chmod 0755 "$K/operator"
# spawn LOG CMD...: in the background, killed with this script (pdeathsig) too
spawn() {
  local logf="$1"
  shift
  if [ -x /usr/bin/setpriv ]; then
    /usr/bin/setpriv --pdeathsig KILL "$@" </dev/null >"$logf" 2>&1 &
  else
    "$@" </dev/null >"$logf" 2>&1 &
  fi
  PIDS+=($!)
}
client="$(free_port)"
peer="$(free_port)"
api="$(free_port)"
spawn "$K/etcd.log" "$ETCD" --name=default --data-dir="$K/etcd" \
  --listen-client-urls="http://127.0.0.1:$client" --advertise-client-urls="http://127.0.0.1:$client" \
  --listen-peer-urls="http://127.0.0.1:$peer" --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
  --initial-cluster="default=http://127.0.0.1:$peer" --unsafe-no-fsync --log-level=warn
for _ in $(seq 600); do
  curl -fsS --max-time 2 "http://127.0.0.1:$client/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS --max-time 2 "http://127.0.0.1:$client/health" >/dev/null 2>&1 || { tail -n 20 "$K/etcd.log" >&2; die "etcd did not become healthy"; }

openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$K/sa.key" 2>/dev/null
admin_token="admin-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
umask_was="$(umask)"
umask 077
printf '%s,admin,admin,"system:masters"\n' "$admin_token" >"$K/tokens.csv"
umask "$umask_was"
server="https://127.0.0.1:$api"
spawn "$K/kube-apiserver.log" "$APISERVER" --etcd-servers="http://127.0.0.1:$client" \
  --bind-address=127.0.0.1 --secure-port="$api" --advertise-address=127.0.0.1 \
  --endpoint-reconciler-type=none --cert-dir="$K/certs" \
  --service-account-issuer="$server" --service-account-key-file="$K/sa.key" \
  --service-account-signing-key-file="$K/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
  --authorization-mode=RBAC --token-auth-file="$K/tokens.csv" \
  --disable-admission-plugins=ServiceAccount --allow-privileged=true
for _ in $(seq 900); do
  [ -s "$K/certs/apiserver.crt" ] && (exec 3<>"/dev/tcp/127.0.0.1/$api") 2>/dev/null && break
  sleep 0.1
done
[ -s "$K/certs/apiserver.crt" ] || { tail -n 20 "$K/kube-apiserver.log" >&2; die "kube-apiserver did not start"; }
# kubeconfig FILE TOKEN USER: logs in with TOKEN, verifies the server with its CA.
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: smoke
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$K/certs/apiserver.crt")
users:
- name: $3
  user:
    token: $2
contexts:
- name: $3@smoke
  context:
    cluster: smoke
    user: $3
current-context: $3@smoke
EOF
}
umask 077
kubeconfig "$K/admin.kubeconfig" "$admin_token" admin
umask "$umask_was"
kc() { KUBECACHEDIR="$K/kube-cache" "$KUBECTL" --kubeconfig "$K/admin.kubeconfig" "$@"; }
for _ in $(seq 900); do
  kc get --raw=/readyz --request-timeout=5s >/dev/null 2>&1 && break
  sleep 0.1
done
kc get --raw=/readyz --request-timeout=5s >/dev/null || { tail -n 20 "$K/kube-apiserver.log" >&2; die "kube-apiserver /readyz did not pass"; }
pass "etcd + kube-apiserver $("$APISERVER" --version | awk '{print $2}') ready in $(secs "$t" "$(now)") s"

kc apply --server-side -f crds/provisioner.yaml >/dev/null || die "applying crds/provisioner.yaml"
crd_established provisioners.provisioning.choria.io kc ||
  die "the CRD did not become Established"
kc apply -f deploy/namespace.yaml -f deploy/rbac.yaml >/dev/null || die "applying deploy/namespace.yaml and deploy/rbac.yaml"
sa_token="$(kc create token choria-provisioner-operator -n choria-provisioner --duration=1h)" ||
  die "no token for ServiceAccount choria-provisioner-operator"
# Readable by the container's user (a throw-away token for a throw-away apiserver).
kubeconfig "$K/operator/config" "$sa_token" operator
chmod 0644 "$K/operator/config"
okc() { KUBECACHEDIR="$K/kube-cache-op" "$KUBECTL" --kubeconfig "$K/operator/config" "$@"; }
for _ in $(seq 200); do
  [ "$(okc auth can-i list provisioners.provisioning.choria.io --all-namespaces 2>/dev/null)" = yes ] && break
  sleep 0.1
done
[ "$(okc auth can-i list provisioners.provisioning.choria.io --all-namespaces 2>/dev/null)" = yes ] ||
  die "deploy/rbac.yaml does not let the operator list Provisioners"

name="choria-smoke-operator-$$"
CONTAINERS+=("$name")
mport="$(free_port)"
pod="choria-provisioner-operator-smoke-$$"
t_op=$(now)
podman_cmd run --detach --name "$name" --network host "${ULIMITS[@]}" \
  --volume "$K/operator:/var/run/choria-provisioner-kube:ro" \
  --env KUBECONFIG=/var/run/choria-provisioner-kube/config \
  --env POD_NAME="$pod" --env POD_NAMESPACE=choria-provisioner \
  "$TAG" operator --metrics-port="$mport" >/dev/null || die "podman run ($name) failed"
deadline=$(($(date +%s) + 60))
until [ "$(metric "http://127.0.0.1:$mport/metrics" choria_provisioner_operator_leader)" = 1 ]; do
  running "$name" || { show_logs "$name"; die "the operator container exited"; }
  [ "$(date +%s)" -lt "$deadline" ] || { show_logs "$name"; die "the operator did not lead within 60 s"; }
  sleep 0.2
done
pass "operator in the container leads (Lease choria-provisioner-operator) after $(secs "$t_op" "$(now)") s"

kc apply -f deploy/example-provisioner.yaml >/dev/null || die "applying deploy/example-provisioner.yaml"
t_rec=$(now)
deadline=$(($(date +%s) + 60))
while :; do
  cm="$(kc -n choria get configmap provisioner-config -o name 2>/dev/null || true)"
  dep="$(kc -n choria get deployment provisioner -o name 2>/dev/null || true)"
  conds="$(kc -n choria get provisioners.provisioning.choria.io provisioner \
    -o jsonpath='{.metadata.generation} {.status.observedGeneration} {range .status.conditions[*]}{.type}={.status} {end}' 2>/dev/null || true)"
  read -r gen observed rest <<<"$conds" || true
  [ -n "$cm" ] && [ -n "$dep" ] && [ -n "${rest:-}" ] && [ "${gen:-x}" = "${observed:-y}" ] && break
  running "$name" || { show_logs "$name"; die "the operator container exited"; }
  if [ "$(date +%s)" -ge "$deadline" ]; then
    show_logs "$name"
    die "after 60 s: ConfigMap '${cm:-missing}', Deployment '${dep:-missing}', status '${conds:-none}'"
  fi
  sleep 0.2
done
pass "reconciled in $(secs "$t_rec" "$(now)") s: $cm, $dep, conditions $rest"
image="$(kc -n choria get deployment provisioner -o jsonpath='{.spec.template.spec.containers[0].image}')"
[ "$image" = "$TAG" ] || die "the example Provisioner's pods would run image '$image', not the image built here ($TAG)"
pass "its Deployment runs $image, the image built here"
stop_container "$name" "operator"
holder="$(kc -n choria-provisioner get lease choria-provisioner-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
[ -z "$holder" ] || die "the operator's Lease is still held by '$holder' after SIGTERM"
pass "its Lease was released on SIGTERM"
timed "operator: apiserver, reconcile, SIGTERM" "$t"

OK=1
log "image-smoke: every check passed"
TIMINGS+=("$(printf '%-44s %6s s' "total" "$(secs "$began" "$(now)")")")
printf '  %s\n' "${TIMINGS[@]}" >&2
