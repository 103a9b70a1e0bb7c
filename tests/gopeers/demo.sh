#!/usr/bin/env bash
# End-to-end check of the real go-choria peers (see RECIPE.md for the prose):
#
#   * nats-server on a free loopback port, TLS offered + allow_non_tls
#   * a v1 (RSA-signed) and a v2 (ed25519, --protocol-v2) provisioning JWT
#   * node1.example.net (v1) and node2.example.net (v2): real `choria server
#     run` processes in provisioning mode, each in its own directory (the
#     binary has ProvisionJWTFile=provisioning.jwt, relative to the cwd) and
#     its own UTS namespace (hostname = identity)
#   * natstap records every NATS message to tap.jsonl
#   * the `choria` CLI then walks both nodes through a full provisioning
#     (ping, rpcutil#inventory, choria_provision jwt, gencsr|gen25519,
#     configure, restart) and the script waits for each node's
#     choria.lifecycle.event.startup.server after its re-exec.
#
# Usage: tests/gopeers/demo.sh            (needs root for unshare --uts)
#   KEEP=1     keep the work directory (printed at the end)
#   OUT=FILE   copy the raw capture (JSON lines, see natstap) to FILE
#   CLIENT_SEED_OUT=FILE  copy the v2 client's ed25519 seed (it signed the
#              captured v2 requests; a throwaway key) to FILE
# Exit status 0 only if every step worked. All processes it starts are
# killed on exit (by PID).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: needs root (unshare --uts gives every server its own hostname)" >&2
  exit 1
fi

ensure_nats_server
"$ROOT/scripts/build-go-peers.sh" choria natstap >/dev/null
C="$CACHE_BIN/choria"

W="$(mktemp -d "${TMPDIR:-/tmp}/gopeers-demo.XXXXXX")"
PIDS=()
cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "${OUT:-}" ] && [ -f "$W/tap.jsonl" ]; then cp "$W/tap.jsonl" "$OUT"; fi
  if [ -n "${CLIENT_SEED_OUT:-}" ] && [ -f "$W/client.seed" ]; then cp "$W/client.seed" "$CLIENT_SEED_OUT"; fi
  if [ -n "${KEEP:-}" ] || [ $rc -ne 0 ]; then log "work directory kept: $W"; else rm -rf "$W"; fi
  exit $rc
}
trap cleanup EXIT

fail() { echo "demo.sh: FAILED: $*" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_for SECONDS DESCRIPTION COMMAND...
wait_for() {
  local secs="$1" what="$2"; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then echo "demo.sh: timed out waiting for $what" >&2; return 1; fi
    sleep 0.2
  done
  log "ok: $what"
}

# tap_has SUBJECT IDENTITY: the capture holds a message on SUBJECT mentioning IDENTITY
tap_has() { grep -F "\"subject\":\"$1\"" "$W/tap.jsonl" | grep -qF "$2"; }

# rpc_ok FILE: every reply in a `choria req --json` output has statuscode 0
rpc_ok() {
  python3 - "$1" <<'EOF' || fail "RPC in $1"
import json, sys
d = json.load(open(sys.argv[1]))
reps = d["replies"]
assert reps, "no replies"
for r in reps:
    assert r["statuscode"] == 0, r
print("==> ok: %s#%s -> %s" % (d["agent"], d["action"], ", ".join(r["sender"] for r in reps)), file=sys.stderr)
EOF
}

json_get() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["replies"][0]["data"]; print(d[sys.argv[2]])' "$1" "$2"; }

cd "$W"
PORT="$(free_port)"
MPORT="$(free_port)"

# --- 1. nats-server with TLS available (certificate from a throwaway CA) ---
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca.pem -days 30 -subj "/CN=Test CA" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout nats-key.pem -out nats.csr -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >san.ext
openssl x509 -req -in nats.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out nats-cert.pem -days 30 -extfile san.ext 2>/dev/null
cat >nats.conf <<EOF
listen: 127.0.0.1:$PORT
http: 127.0.0.1:$MPORT
tls {
  cert_file: "$W/nats-cert.pem"
  key_file:  "$W/nats-key.pem"
}
allow_non_tls: true
EOF
"$CACHE_BIN/nats-server" -c nats.conf >nats.log 2>&1 &
PIDS+=($!)
wait_for 20 "nats-server on 127.0.0.1:$PORT" grep -q 'Server is ready' nats.log

"$CACHE_BIN/natstap" --server "nats://127.0.0.1:$PORT" >tap.jsonl 2>tap.err &
PIDS+=($!)
wait_for 20 "natstap subscribed to >" grep -q listening tap.err

# --- 2. provisioning JWTs: v1 signed with RSA, v2 signed with an ed25519 seed ---
openssl genrsa -out prov-signer-key.pem 2048 2>/dev/null
openssl rsa -in prov-signer-key.pem -pubout -out prov-signer-public.pem 2>/dev/null
"$C" jwt keys issuer.seed issuer.public >/dev/null
mkdir -p node1 node2
"$C" jwt prov node1/provisioning.jwt prov-signer-key.pem --token s3cret --urls "nats://127.0.0.1:$PORT" --default >/dev/null
"$C" jwt prov node2/provisioning.jwt issuer.seed --token s3cret --urls "nats://127.0.0.1:$PORT" --default --protocol-v2 >/dev/null
"$C" jwt view node1/provisioning.jwt >node1/jwt-view.txt
"$C" jwt view node2/provisioning.jwt >node2/jwt-view.txt

# --- 3. the servers: own cwd (relative provisioning.jwt), own hostname ---
for n in 1 2; do
  echo 'loglevel = debug   # ignored in provisioning mode' >"node$n/server.conf"
  (cd "node$n" && exec unshare --uts sh -c "hostname node$n.example.net; exec '$C' server run --config '$W/node$n/server.conf'") >"node$n/server.log" 2>&1 &
  PIDS+=($!)
done
wait_for 30 "node1 startup event (provision_mode_server)" tap_has choria.lifecycle.event.startup.provision_mode_server node1.example.net
wait_for 30 "node2 startup event (provision_mode_server)" tap_has choria.lifecycle.event.startup.provision_mode_server node2.example.net

python3 - "$MPORT" <<'EOF'
import json, sys, urllib.request
d = json.load(urllib.request.urlopen("http://127.0.0.1:%s/connz?subs=1" % sys.argv[1]))
for c in d["connections"]:
    if c.get("name", "").endswith(".example.net"):
        assert c.get("tls_version"), "%s is not using TLS" % c["name"]
        print("==> ok: %s connected with TLS %s, subscriptions %s" % (c["name"], c["tls_version"], sorted(c.get("subscriptions_list") or [])), file=sys.stderr)
EOF

# --- 4. v1: insecure x509 client (file provider + INSECURE_YES_REALLY) -> node1 ---
cat >client-v1.conf <<EOF
plugin.choria.middleware_hosts = nats://127.0.0.1:$PORT
plugin.choria.use_srv = false
collectives = provisioning
main_collective = provisioning
identity = provisioner.example.net
plugin.security.provider = file
plugin.security.file.certificate = $W/nats-cert.pem
plugin.security.file.key = $W/nats-key.pem
plugin.security.file.ca = $W/ca.pem
EOF
v1() { INSECURE_YES_REALLY=true timeout 60 "$C" "$@" --config client-v1.conf; }
v1 ping >v1-ping.txt 2>/dev/null
grep -q node1.example.net v1-ping.txt || fail "node1 did not answer the v1 ping"
if grep -q node2.example.net v1-ping.txt; then fail "v2 node2 answered a v1 ping"; fi
log "ok: v1 ping answered by node1 only"
v1 req rpcutil inventory -I node1.example.net --json >v1-inventory.json 2>/dev/null
rpc_ok v1-inventory.json
v1 req choria_provision jwt token=s3cret -I node1.example.net --json >v1-jwt.json 2>/dev/null
rpc_ok v1-jwt.json
v1 req choria_provision gencsr token=s3cret cn=node1.example.net -I node1.example.net --json >v1-gencsr.json 2>/dev/null
rpc_ok v1-gencsr.json
json_get v1-gencsr.json csr >node1.csr
openssl x509 -req -in node1.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out node1-cert.pem -days 30 2>/dev/null
SSL1="$W/node1/ssl"
CFG1="$(python3 -c 'import json,sys; d=sys.argv[2]; print(json.dumps({"plugin.choria.server.provision":"false","identity":"node1.example.net","plugin.choria.middleware_hosts":"nats://127.0.0.1:"+sys.argv[1],"plugin.choria.use_srv":"false","plugin.security.provider":"file","plugin.security.file.certificate":d+"/certificate.pem","plugin.security.file.key":d+"/private.pem","plugin.security.file.ca":d+"/ca.pem","loglevel":"info"}, separators=(",",":")))' "$PORT" "$SSL1")"
v1 req choria_provision configure token=s3cret "config=$CFG1" "certificate=$(cat node1-cert.pem)" "ca=$(cat ca.pem)" "ssldir=$SSL1" -I node1.example.net --json >v1-configure.json 2>/dev/null
rpc_ok v1-configure.json
v1 req choria_provision restart token=s3cret splay=1 -I node1.example.net --json >v1-restart.json 2>/dev/null
rpc_ok v1-restart.json
wait_for 30 "node1 re-exec'd into normal mode (startup.server)" tap_has choria.lifecycle.event.startup.server node1.example.net

# --- 5. v2: choria (ed25519 JWT) client, plaintext -> node2 ---
"$C" jwt keys client.seed client.public >/dev/null
"$C" jwt client client.jwt provisioner issuer.seed --public-key="$(cat client.public)" --server-provisioner --validity 24h >/dev/null
cat >client-v2.conf <<EOF
plugin.choria.middleware_hosts = nats://127.0.0.1:$PORT
plugin.choria.use_srv = false
collectives = provisioning
main_collective = provisioning
identity = provisioner.example.net
plugin.security.provider = choria
plugin.security.choria.token_file = $W/client.jwt
plugin.security.choria.seed_file = $W/client.seed
plugin.security.issuer.names = choria
plugin.security.issuer.choria.public = $(cat issuer.public)
EOF
v2() { USER="${USER:-root}" INSECURE_DISABLE_TLS=true timeout 60 "$C" "$@" --config client-v2.conf; }
v2 ping >v2-ping.txt 2>/dev/null
grep -q node2.example.net v2-ping.txt || fail "node2 did not answer the v2 ping"
if grep -q node1.example.net v2-ping.txt; then fail "v1 node1 answered a v2 ping"; fi
log "ok: v2 ping answered by node2 only"
v2 req rpcutil inventory -I node2.example.net --json >v2-inventory.json 2>/dev/null
rpc_ok v2-inventory.json
v2 req choria_provision jwt token=s3cret -I node2.example.net --json >v2-jwt.json 2>/dev/null
rpc_ok v2-jwt.json
NONCE="$(python3 -c 'import uuid; print(uuid.uuid4().hex)')"
v2 req choria_provision gen25519 token=s3cret "nonce=$NONCE" -I node2.example.net --json >v2-gen25519.json 2>/dev/null
rpc_ok v2-gen25519.json
"$C" jwt server node2-server.jwt node2.example.net "$(json_get v2-gen25519.json public_key)" issuer.seed --collectives=choria >/dev/null
CFG2="$(python3 -c 'import json,sys; d=sys.argv[2]; print(json.dumps({"plugin.choria.server.provision":"false","identity":"node2.example.net","plugin.choria.middleware_hosts":"nats://127.0.0.1:"+sys.argv[1],"plugin.choria.use_srv":"false","plugin.security.provider":"choria","plugin.security.choria.token_file":d+"/server.jwt","plugin.security.choria.seed_file":d+"/server.seed","plugin.security.issuer.names":"choria","plugin.security.issuer.choria.public":sys.argv[3],"loglevel":"info"}, separators=(",",":")))' "$PORT" "$W/node2" "$(cat issuer.public)")"
v2 req choria_provision configure token=s3cret "config=$CFG2" "server_jwt=$(cat node2-server.jwt)" -I node2.example.net --json >v2-configure.json 2>/dev/null
rpc_ok v2-configure.json
v2 req choria_provision restart token=s3cret splay=1 -I node2.example.net --json >v2-restart.json 2>/dev/null
rpc_ok v2-restart.json
wait_for 30 "node2 re-exec'd into normal mode (startup.server)" tap_has choria.lifecycle.event.startup.server node2.example.net

log "captured $(wc -l <tap.jsonl) NATS messages:"
python3 - tap.jsonl <<'EOF' >&2
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("    %s %s (%d bytes)" % (r["time"][11:23], r["subject"], r["size"]))
EOF
log "demo.sh: OK"
