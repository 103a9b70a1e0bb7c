#!/usr/bin/env bash
# Renewal at scale: N simulated nodes provisioned with short-lived server JWTs
# all fall due at once; the provisioner renews them (`reprovision` in their
# collective) at no more than `renewal.rate`, while M new nodes start and are
# provisioned meanwhile. Reports the renewal rate measured against the rate
# set, how long the whole fleet took to be renewed, and how long the new
# nodes took (and, for comparison, the same M nodes on an idle provisioner).
#
#   scripts/bench-renewal.sh                      # 10,000 due, rate 6,000/min, 2,000 new
#   scripts/bench-renewal.sh --nodes 2000 --rate 1200 --new 500
#
# A real nats-server with JetStream holds the records; the fleet is the
# simulator with --serve-provisioned (provisioned nodes answer reprovision
# as go-choria 0.30.2 does) and --directed shared.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"

NODES=10000
RATE=6000
NEW=2000
BIN=""
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --new) NEW="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) echo "bench-renewal.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
ensure_nats_server
if [ -z "$BIN" ]; then
  ensure_rust
  log "building choria-provisioner (release)"
  cargo build --release --quiet
  BIN="$CARGO_TARGET_DIR/release/choria-provisioner"
fi
OUT="${OUT:-$CACHE_DIR/bench-results/renewal-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cp "$BIN" "$OUT/choria-provisioner"
BIN="$OUT/choria-provisioner"

PIDS=()
cleanup() { for p in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

port="$(free_port)"
monitor="$(free_port)"
mkdir -p "$OUT/js"
printf 'listen: 127.0.0.1:%s\nmax_payload: 4MB\njetstream { store_dir: "%s" }\n' "$port" "$OUT/js" >"$OUT/nats.conf"
"$CACHE_BIN/nats-server" -c "$OUT/nats.conf" >"$OUT/nats.log" 2>&1 &
PIDS+=("$!")
wait_for_port "$port"
url="nats://127.0.0.1:$port"

openssl genrsa -out "$OUT/signer.key" 2048 2>/dev/null
openssl rsa -in "$OUT/signer.key" -pubout -out "$OUT/signer.pub" 2>/dev/null
python3 -c 'import os; print(os.urandom(32).hex())' >"$OUT/server-signer.seed"
python3 -c 'import os; print(os.urandom(32).hex())' >"$OUT/records.seed"

fleet() { # prefix nodes journal
  "$BIN" fleet --nats "$url" --nodes "$2" --token s3cret --jwt-signer "$OUT/signer.key" \
    --identity-prefix "$1" --journal "$3" --directed shared --serve-provisioned --log warn \
    >"$3.out" 2>"$3.log" &
  PIDS+=("$!")
}
count() { local c; c="$(grep -c "$2" "$1" 2>/dev/null)" || true; echo "${c:-0}"; }
wait_count() { # file pattern n timeout_s
  local i
  for i in $(seq $(( $4 * 10 ))); do
    [ "$(count "$1" "$2")" -ge "$3" ] && return 0
    sleep 0.1
  done
  log "only $(count "$1" "$2") of $3 '$2' in $1 after $4 s"; return 1
}
now() { date +%s.%N; }

cat >"$OUT/renewal.cfg" <<EOF
identity = renewal.bench
plugin.choria.middleware_hosts = $url
EOF
cat >"$OUT/choria.cfg" <<EOF
identity = provisioner.bench
plugin.choria.middleware_hosts = $url
plugin.security.provider = file
EOF
cat >"$OUT/provisioner.yaml" <<EOF
workers: 16
interval: 10m
token: s3cret
site: bench
choria_insecure: true
monitor_port: $monitor
loglevel: warn
jwt_verify_cert: $OUT/signer.pub
jwt_signing_key: $OUT/server-signer.seed
server_jwt_validity: 2h
features:
  ed25519: true
configuration_template:
  configuration:
    identity: '{{ identity }}'
    plugin.choria.server.provision: 'false'
records:
  url: $url
  bucket: BENCH_RECORDS
  signing_key: $OUT/records.seed
renewal:
  before: 99.9%
  rate: $RATE
  retry: 30m
  choria_config: $OUT/renewal.cfg
EOF

log "starting $NODES nodes"
fleet node- "$NODES" "$OUT/fleet.jsonl"
wait_count "$OUT/fleet.jsonl" '"event":"startup"' "$NODES" 300
t0=$(now)
"$BIN" run --config "$OUT/provisioner.yaml" --choria-config "$OUT/choria.cfg" >"$OUT/provisioner.log" 2>&1 &
PIDS+=("$!")
prov_pid=$!
wait_count "$OUT/fleet.jsonl" '"action":"restart"' "$NODES" 600
t_provisioned=$(now)
log "provisioned $NODES in $(python3 -c "print(round($t_provisioned-$t0,1))") s; waiting for renewal"
wait_count "$OUT/fleet.jsonl" '"action":"reprovision"' 1 120
t_first=$(now)
log "renewal started; starting $NEW new nodes"
fleet new- "$NEW" "$OUT/new.jsonl"
t_new=$(now)
wait_count "$OUT/new.jsonl" '"action":"restart"' "$NEW" 900
t_new_done=$(now)
wait_count "$OUT/fleet.jsonl" '"action":"reprovision"' "$NODES" 3600
t_last=$(now)
# Renewed: a second configure for every node.
python3 - "$OUT/fleet.jsonl" "$NODES" 900 <<'PY'
import json, sys, time
path, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.time() + timeout
while True:
    counts = {}
    for line in open(path):
        e = json.loads(line)
        if e.get("kind") == "action" and e.get("action") == "configure" and e.get("outcome") == "ok":
            counts[e["node"]] = counts.get(e["node"], 0) + 1
    if sum(1 for c in counts.values() if c >= 2) >= n or time.time() > end:
        break
    time.sleep(1)
PY
t_renewed=$(now)
curl -s "http://127.0.0.1:$monitor/metrics" >"$OUT/metrics.txt" || true
kill "$prov_pid" 2>/dev/null || true

python3 - "$OUT" "$NODES" "$RATE" "$NEW" "$t0" "$t_provisioned" "$t_first" "$t_new" "$t_new_done" "$t_last" "$t_renewed" <<'PY' | tee "$OUT/report.md"
import json, sys
out, n, rate, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0, t_prov, t_first, t_new, t_new_done, t_last, t_renewed = map(float, sys.argv[5:])
times = sorted(json.loads(l)["time_us"] / 1e6 for l in open(f"{out}/fleet.jsonl")
               if '"action":"reprovision"' in l)
span = times[-1] - times[0] if len(times) > 1 else 0
per_min = (len(times) - 1) / span * 60 if span else float("nan")
worst = 0
for i, t in enumerate(times):
    # the most requests in any 60 s window starting at a request
    j = i
    while j < len(times) and times[j] < t + 60:
        j += 1
    worst = max(worst, j - i)
renewed = {}
for l in open(f"{out}/fleet.jsonl"):
    e = json.loads(l)
    if e.get("kind") == "action" and e.get("action") == "configure" and e.get("outcome") == "ok":
        renewed[e["node"]] = renewed.get(e["node"], 0) + 1
twice = sum(1 for c in renewed.values() if c >= 2)
metrics = {}
for l in open(f"{out}/metrics.txt"):
    if l.startswith("choria_provisioner_renewals{") or l.startswith("choria_provisioner_records_written"):
        metrics[l.rsplit(" ", 1)[0]] = l.rsplit(" ", 1)[1].strip()
print(f"| nodes due at once | rate set (/min) | reprovision sent | measured rate (/min) | most in any 60 s | fleet renewed (s from first request) | renewed twice-configured | new nodes | new nodes provisioned in (s) |")
print("|---|---|---|---|---|---|---|---|---|")
print(f"| {n:,} | {rate:,} | {len(times):,} | {per_min:,.0f} | {worst:,} | {t_renewed - t_first:.1f} | {twice:,} | {new:,} | {t_new_done - t_new:.1f} |")
print()
print(f"first provisioning of {n:,}: {t_prov - t0:.1f} s; metrics: {metrics}")
PY
