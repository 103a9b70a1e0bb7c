#!/usr/bin/env bash
# A local demo: a nats-server, a simulated fleet of provisioning-mode Choria
# Servers, and our discovery finding them and reading a few inventories.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"

NODES="${NODES:-50}"
ensure_nats_server
log "building choria-provisioner (release)"
cargo build --release --quiet
BIN="$CARGO_TARGET_DIR/release/choria-provisioner"

WORK="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
cleanup() {
  [ -n "${FLEET_PID:-}" ] && kill "$FLEET_PID" 2>/dev/null || true
  [ -n "${NATS_PID:-}" ] && kill "$NATS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

printf 'listen: 127.0.0.1:%s\n' "$PORT" >"$WORK/nats.conf"
"$CACHE_BIN/nats-server" -c "$WORK/nats.conf" >"$WORK/nats.log" 2>&1 &
NATS_PID=$!
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
log "nats-server on nats://127.0.0.1:$PORT"

log "starting a simulated fleet of $NODES provisioning-mode servers"
"$BIN" fleet --nats "nats://127.0.0.1:$PORT" --nodes "$NODES" --token s3cret \
  --journal "$WORK/journal.jsonl" >"$WORK/fleet.out" 2>"$WORK/fleet.log" &
FLEET_PID=$!
for _ in $(seq 200); do
  [ "$(grep -c '"event":"startup"' "$WORK/journal.jsonl" 2>/dev/null || echo 0)" -ge "$NODES" ] && break
  sleep 0.1
done

log "discovering provisioning-mode servers and reading 3 inventories"
"$BIN" discover --nats "nats://127.0.0.1:$PORT" --inventory 3

kill "$FLEET_PID"; wait "$FLEET_PID" 2>/dev/null || true
FLEET_PID=
log "fleet summary: $(cat "$WORK/fleet.out")"
