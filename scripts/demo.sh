#!/usr/bin/env bash
# The demo: a local nats-server, a simulated fleet of provisioning-mode Choria
# Servers, and choria-provisioner provisioning all of them with the example
# helper (examples/helper.sh). Shows progress while it runs and a summary at
# the end.
#
#   NODES=1000    fleet size
#   WORKERS=32    provisioner workers
#   TIMEOUT=600   give up after this many seconds
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"

NODES="${NODES:-1000}"
WORKERS="${WORKERS:-32}"
TIMEOUT="${TIMEOUT:-600}"

ensure_rust
ensure_nats_server
command -v openssl >/dev/null || { log "openssl is needed to make the demo's JWT signing key"; exit 1; }
log "building choria-provisioner (release)"
cargo build --release --quiet
BIN="$CARGO_TARGET_DIR/release/choria-provisioner"

WORK="$(mktemp -d)"
PORT="$(free_port)"
MONITOR="$(free_port)"
cleanup() {
  [ -n "${PROV_PID:-}" ] && kill "$PROV_PID" 2>/dev/null || true
  [ -n "${FLEET_PID:-}" ] && kill "$FLEET_PID" 2>/dev/null || true
  [ -n "${NATS_PID:-}" ] && kill "$NATS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

printf 'listen: 127.0.0.1:%s\n' "$PORT" >"$WORK/nats.conf"
"$CACHE_BIN/nats-server" -c "$WORK/nats.conf" >"$WORK/nats.log" 2>&1 &
NATS_PID=$!
wait_for_port "$PORT"
log "nats-server on nats://127.0.0.1:$PORT"

# The organisation's provisioning JWT signer: the fleet's JWTs are signed with
# it and the provisioner verifies them with its public half.
openssl genrsa -out "$WORK/signer.key" 2048 2>/dev/null
openssl rsa -in "$WORK/signer.key" -pubout -out "$WORK/signer.pub" 2>/dev/null

log "starting a simulated fleet of $NODES provisioning-mode servers"
"$BIN" fleet --nats "nats://127.0.0.1:$PORT" --nodes "$NODES" --token s3cret \
  --jwt-signer "$WORK/signer.key" --journal "$WORK/journal.jsonl" --exit-when-done \
  >"$WORK/fleet.out" 2>"$WORK/fleet.log" &
FLEET_PID=$!
for _ in $(seq 600); do
  # grep -c prints 0 and fails when nothing matches yet; the journal may not exist yet.
  started="$(grep -c '"event":"startup"' "$WORK/journal.jsonl" 2>/dev/null || true)"
  [ "${started:-0}" -ge "$NODES" ] && break
  sleep 0.1
done

cat >"$WORK/provisioner.yaml" <<EOF
workers: $WORKERS
interval: 1m
token: s3cret
site: demo
helper: $ROOT/examples/helper.sh
choria_insecure: true
monitor_port: $MONITOR
loglevel: warn
jwt_verify_cert: $WORK/signer.pub
features:
  jwt: true
EOF
cat >"$WORK/choria.cfg" <<EOF
identity = provisioner.demo
plugin.choria.middleware_hosts = nats://127.0.0.1:$PORT
plugin.security.provider = file
EOF

log "provisioning with examples/helper.sh ($WORKERS workers); metrics on http://127.0.0.1:$MONITOR/metrics"
START_NS=$(date +%s%N)
BROKER=nats://broker.demo.example.net:4222 "$BIN" run --config "$WORK/provisioner.yaml" \
  --choria-config "$WORK/choria.cfg" --progress 2>&1 >"$WORK/provisioner.log" | grep --line-buffered '^\[' &
PROV_PID=$!

# The fleet exits by itself once every node has left provisioning mode.
for _ in $(seq "$TIMEOUT"); do
  kill -0 "$FLEET_PID" 2>/dev/null || break
  sleep 1
done
END_NS=$(date +%s%N)
if kill -0 "$FLEET_PID" 2>/dev/null; then
  log "not every node was provisioned within ${TIMEOUT}s"
  kill "$FLEET_PID"
fi
wait "$FLEET_PID" 2>/dev/null || true
FLEET_PID=
pkill -TERM -f "$WORK/provisioner.yaml" 2>/dev/null || true
wait "$PROV_PID" 2>/dev/null || true
PROV_PID=

python3 - "$WORK/fleet.out" "$WORK/journal.jsonl" "$START_NS" "$END_NS" <<'PY'
import json, sys
summary = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
first = last = None
for line in open(sys.argv[2]):
    e = json.loads(line)
    if e.get("kind") != "action":
        continue
    t = e["time_us"]
    first = t if first is None else min(first, t)
    if e["action"] == "restart" and e["outcome"] == "ok":
        last = t if last is None else max(last, t)
wall = (int(sys.argv[4]) - int(sys.argv[3])) / 1e9
nodes, done = summary["nodes"], summary["provisioned"]
print()
print("summary")
print(f"  nodes        {nodes}")
print(f"  provisioned  {done}")
print(f"  failed       {nodes - done}")
if first is not None and last is not None and last > first:
    span = (last - first) / 1e6
    print(f"  rate         {done / span * 60:,.0f} nodes/min (first request to last restart: {span:.1f} s)")
print(f"  wall clock   {wall:.1f} s from starting the provisioner")
PY
