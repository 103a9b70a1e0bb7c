#!/usr/bin/env bash
# Provisioning throughput benchmark: a local nats-server, the `fleet`
# simulator and a provisioner (ours, and the Go one when it can be built),
# the same scenario for both, several runs each, medians reported.
#
#   scripts/bench.sh                      # jwt and pki, 1,000 and 10,000 nodes, 3 runs each
#   scripts/bench.sh --quick              # 1,000 nodes, 1 run, both scenarios
#   scripts/bench.sh --scenario jwt --nodes 10000 --workers 16,32,64,128 --runs 1
#   scripts/bench.sh --scale              # template, 1,000 / 10,000 / 100,000 nodes, per-node costs
#   scripts/bench.sh --scale --nodes 250000   # one larger fleet
#   scripts/bench.sh --scenario pki-ca --nodes 10000     # the built-in CA (ECDSA P-256 file key)
#   scripts/bench.sh --scenario pki-ca --ca-key-kind softhsm --no-go --runs 1
#   scripts/bench.sh --broker choria --security issuer --nodes 1000 --runs 1
#
# Options:
#   --nodes N[,N...]      fleet sizes (default 1000,10000)
#   --runs R              runs per configuration and implementation (default 3)
#   --workers W[,W...]    provisioner `workers` (default 16: on 2 cores the run is
#                         CPU-bound from 16 on, more workers only add latency)
#   --scenario S          jwt | pki | pki-ca | template | all (default all: jwt and pki)
#   --ca-key-kind K       pki-ca: the built-in CA's key, made with openssl for the
#                         bench: ecdsa (default; P-256 in a PKCS#8 file), rsa (2048
#                         bits in a file), softhsm (the P-256 key imported into a
#                         SoftHSM2 token made in the bench's work directory, its
#                         file removed, ca.key a pkcs11: URI with the PIN in a file)
#                         or softhsm-rsa (the same with the RSA 2048 key)
#   --quick               --nodes 1000 --runs 1
#   --scale               the scale run: --scenario template --nodes 1000,10000,100000
#                         --runs 1 --no-go, and a per-node table (CPU and RSS per node
#                         of the provisioner, the simulator and nats-server) with the
#                         targets checked (100,000 nodes at >= 90 % of the 10,000-node
#                         rate, end to end <= 1.2 x N / that rate, provisioner RSS
#                         per node <= 1 KiB); --nodes after --scale picks other sizes
#   --helper CMD          helper command line for the jwt scenario instead of
#                         examples/helper.sh (experiments)
#   --set KEY=VALUE       extra provisioner.yaml line (repeatable), e.g.
#                         --set discovery_window=300ms; the Go provisioner gets
#                         the same file (it ignores keys it does not know)
#   --timeout S           give up on one run of ours after S seconds (default 900);
#                         a Go run is capped at 300 s, or 60 s per 500 nodes for
#                         larger fleets (see GO_TIMEOUT)
#   --bin PATH            use this choria-provisioner binary instead of building
#   --no-go               do not try to build the Go provisioner
#   --replicas R[,R...]   ours as R replicas in shards mode (election.mode: shards,
#                         heartbeats over the broker), each with `workers`; a row per R
#                         (impl rust-xR), and the speed-up over one replica
#   --helper-sleep S      the helper takes S seconds more per node (a helper that calls
#                         a CA or an inventory: what shards are for), e.g. 0.3
#   --directed MODE       the simulator's `--directed` (per-node, the default, or
#                         shared: one queue subscription per connection, ~1 KiB
#                         per simulated node instead of ~10 KiB; --scale uses it)
#   --broker KIND         nats (default): a plain nats-server, protocol v1 without
#                         TLS or signatures (`choria_insecure`). choria: the path
#                         production runs, the real Choria broker (`choria broker run`
#                         from go-choria, built by scripts/build-go-peers.sh choria)
#                         with TLS and x509 security: the nodes connect with their
#                         provisioning JWTs (checked by the broker against the
#                         signer), the provisioner logs in as `provisioner` with the
#                         broker's password and a client certificate of the run's
#                         CA, and signs every request with its RSA key
#   --security KIND       with --broker choria: x509 (default, as above) or issuer:
#                         an Organization Issuer network, protocol v2 with ed25519
#                         (implies --broker choria; scenarios jwt and template). The
#                         broker trusts the issuer's public key
#                         (plugin.security.issuer.*), the fleet speaks v2 with
#                         provisioning JWTs the issuer signed (`v2` claim), both
#                         provisioners log in as `provisioner` with the broker's
#                         password and a client JWT the issuer signed for them
#                         (--server-provisioner, `choria jwt client`), sign every
#                         request with its ed25519 seed, verify the provisioning
#                         JWTs with the issuer's public key, fetch each node's
#                         ed25519 key (gen25519) and send it a server JWT signed
#                         as a chain issuer (features.ed25519, jwt_signing_key and
#                         jwt_signing_token: a client JWT with --issuer)
#   --profile             perf-record our provisioner in every run (perf.data +
#                         perf-report.txt in the run directory)
#   --out DIR             where results go (default ~/.cache/choria-provisioner-rs/bench-results/<date>)
#
# Environment: GO_PROVISIONER_BIN=PATH uses a Go provisioner built elsewhere
# instead of scripts/build-go-peers.sh provisioner (which builds it from the
# source copy in ../shared/peers/go-provisioner, see tests/gopeers/RECIPE.md).
#
# Scenarios (both with the `jwt` feature: the fleet's provisioning JWTs are
# signed by an RSA key made with openssl and the provisioner verifies them):
#   jwt   helper examples/helper.sh (sh + sed: configuration only)
#   pki   features jwt + pki; helper `choria-provisioner fleet-helper --ca-cert
#         --ca-key`, which signs each node's CSR with a CA made by openssl
#   pki-ca  features jwt + pki, and ours has no helper: a configuration_template
#         (as in template) and the built-in CA (`ca:`, see --ca-key-kind) that
#         signs each node's CSR in-process. The Go provisioner has no CA of its
#         own and runs the pki scenario's helper with a CA of the same kind in
#         files (P-256 for softhsm, RSA for softhsm-rsa): what each offers for
#         signing, as in template (ours' row shows no helper CPU)
#   template  jwt, but ours has no helper: a configuration_template renders the
#         same four settings examples/helper.sh prints (no process per node).
#         The Go provisioner has no templates and runs examples/helper.sh, so
#         this compares what each offers for that configuration, not one
#         harness (ours' row shows no helper CPU)
#
# For every run: nodes/min from the journal (first discovery request a node
# received to the last `restart` acknowledged), the end-to-end time from
# starting `run` until choria_provisioner_provisioned reaches N, the
# provisioner's CPU seconds and peak RSS (/proc/<pid>/stat utime+stime,
# /proc/<pid>/status VmHWM, read just before it is stopped), the CPU of the
# helper processes (reaped children, cutime+cstime), the fleet's and
# nats-server's CPU during the run and peak RSS, p50/p99 time per node (first
# request to the node -> its restart acknowledged) and how busy the whole
# machine was. A run whose journal does not show every node configured once,
# restarted once and finally provisioned is listed but not reported as a figure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
REPORT="$ROOT/scripts/bench_report.py"
ORIG_ARGS="$*"

NODES_LIST="1000,10000"
RUNS=3
WORKERS_LIST="16"
SCENARIO="all"
TIMEOUT=900
# A Go run's limit: 300 s, or 60 s per 500 nodes when that is longer. Go
# provisions ~1,200 nodes/min through the Choria broker on 2 cores, so a
# fixed 300 s cut 10,000-node runs off (~8.5 min) before they were done;
# 500 nodes/min leaves room for a loaded machine without letting a stuck
# run go on for ever.
GO_TIMEOUT=300
GO_NODES_PER_MIN=500
BIN=""
TRY_GO=1
PROFILE=0
OUT=""
EXTRA=()
SCALE=0
DIRECTED=per-node
REPLICAS_LIST=1
HELPER_SLEEP=""
JWT_HELPER="$ROOT/examples/helper.sh"
BROKER_KIND=nats
SECURITY=x509
CA_KEY_KIND=ecdsa

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit "${1:-2}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES_LIST="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --workers) WORKERS_LIST="$2"; shift 2 ;;
    --scenario) SCENARIO="$2"; shift 2 ;;
    --quick) NODES_LIST=1000; RUNS=1; shift ;;
    --scale) SCALE=1; SCENARIO=template; NODES_LIST=1000,10000,100000; RUNS=1; TRY_GO=0; DIRECTED=shared; shift ;;
    --directed) DIRECTED="$2"; shift 2 ;;
    --replicas) REPLICAS_LIST="$2"; shift 2 ;;
    --helper-sleep) HELPER_SLEEP="$2"; shift 2 ;;
    --set) EXTRA+=("$2"); shift 2 ;;
    --helper) JWT_HELPER="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --no-go) TRY_GO=0; shift ;;
    --broker) BROKER_KIND="$2"; shift 2 ;;
    --security) SECURITY="$2"; shift 2 ;;
    --ca-key-kind) CA_KEY_KIND="$2"; shift 2 ;;
    --profile) PROFILE=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "bench.sh: unknown option $1" >&2; usage ;;
  esac
done
case "$SECURITY" in
  x509) ;;
  issuer)
    BROKER_KIND=choria
    # v2 servers take an ed25519 key and a server JWT, not a certificate:
    # the pki scenarios have no v2 form (and Go refuses pki with ed25519).
    case "$SCENARIO" in
      all) SCENARIO=jwt ;;
      jwt | template) ;;
      *) echo "bench.sh: --security issuer runs the jwt and template scenarios only" >&2; exit 2 ;;
    esac
    ;;
  *) echo "bench.sh: --security must be x509 or issuer" >&2; exit 2 ;;
esac
case "$SCENARIO" in
  jwt) SCENARIOS=(jwt) ;;
  pki) SCENARIOS=(pki) ;;
  pki-ca) SCENARIOS=(pki-ca) ;;
  template) SCENARIOS=(template) ;;
  all) SCENARIOS=(jwt pki) ;;
  *) echo "bench.sh: --scenario must be jwt, pki, pki-ca, template or all" >&2; exit 2 ;;
esac
case "$CA_KEY_KIND" in
  ecdsa | rsa | softhsm | softhsm-rsa) ;;
  *) echo "bench.sh: --ca-key-kind must be ecdsa, rsa, softhsm or softhsm-rsa" >&2; exit 2 ;;
esac
case "$BROKER_KIND" in
  nats | choria) ;;
  *) echo "bench.sh: --broker must be nats or choria" >&2; exit 2 ;;
esac
IFS=, read -r -a NODES_ARR <<<"$NODES_LIST"
IFS=, read -r -a WORKERS_ARR <<<"$WORKERS_LIST"
IFS=, read -r -a REPLICAS_ARR <<<"$REPLICAS_LIST"
for e in "${EXTRA[@]+"${EXTRA[@]}"}"; do
  case "$e" in *=*) ;; *) echo "bench.sh: --set wants KEY=VALUE, got '$e'" >&2; exit 2 ;; esac
done

if [ "$PROFILE" = 1 ] && ! command -v perf >/dev/null; then
  log "--profile: perf is not installed (apt-get install linux-perf); running without a profile"
  PROFILE=0
fi
command -v openssl >/dev/null || { log "openssl is needed (JWT signer, CA)"; exit 1; }
command -v python3 >/dev/null || { log "python3 is needed"; exit 1; }
ensure_nats_server

OUT="${OUT:-$CACHE_DIR/bench-results/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT/runs"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/work"
mkdir -p "$WORK"

# ---- binaries --------------------------------------------------------------
if [ -z "$BIN" ]; then
  ensure_rust
  log "building choria-provisioner (release)"
  cargo build --release --quiet
  BIN="$CARGO_TARGET_DIR/release/choria-provisioner"
fi
[ -x "$BIN" ] || { log "no executable at $BIN"; exit 1; }
# A private copy: a rebuild elsewhere must not swap the binary mid-benchmark.
cp "$BIN" "$WORK/choria-provisioner"
BIN="$WORK/choria-provisioner"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no -- src crates Cargo.toml Cargo.lock 2>/dev/null)" ]; then
  COMMIT="$COMMIT+dirty"
fi

GO_BIN=""
GO_STATUS=""
if [ -n "${GO_PROVISIONER_BIN:-}" ]; then
  # A Go provisioner built elsewhere.
  [ -x "$GO_PROVISIONER_BIN" ] || { log "GO_PROVISIONER_BIN=$GO_PROVISIONER_BIN is not executable"; exit 1; }
  GO_BIN="$GO_PROVISIONER_BIN"
  GO_STATUS="given: $GO_BIN ($("$GO_BIN" --version 2>&1 | head -n1 || true))"
elif [ "$TRY_GO" = 1 ]; then
  log "building the Go provisioner peer (scripts/build-go-peers.sh provisioner)"
  if GO_OUT="$("$ROOT/scripts/build-go-peers.sh" provisioner 2>"$OUT/go-build.log")"; then
    GO_BIN="$(printf '%s\n' "$GO_OUT" | grep 'choria-go-provisioner$' | tail -n1)"
    GO_STATUS="built: $GO_BIN"
  else
    reason="$(grep -m1 -E '403|Forbidden|not available' "$OUT/go-build.log" ||
      grep -m1 -E 'FAILED|error' "$OUT/go-build.log" || true)"
    reason="$(printf '%s' "$reason" | sed 's/^[ |]*//; s/^go: //')"
    GO_STATUS="unavailable: ${reason:-see $OUT/go-build.log}"
  fi
else
  GO_STATUS="unavailable: not attempted (--no-go)"
fi
if [ -z "$GO_BIN" ]; then
  {
    echo
    echo "################################################################################"
    echo "#  THE GO PROVISIONER IS NOT AVAILABLE: reporting choria-provisioner-rs ONLY."
    echo "#  $GO_STATUS"
    echo "#  (build log: $OUT/go-build.log; see tests/gopeers/RECIPE.md)"
    echo "################################################################################"
    echo
  } >&2
fi

# ---- shared material -------------------------------------------------------
openssl genrsa -out "$WORK/signer.key" 2048 2>/dev/null
openssl rsa -in "$WORK/signer.key" -pubout -out "$WORK/signer.pub" 2>/dev/null
python3 -c 'import os; print(os.urandom(32).hex())' >"$WORK/shards.seed"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$WORK/ca.key" -out "$WORK/ca.pem" \
  -days 30 -subj "/CN=bench CA" 2>/dev/null

# pki-ca: the built-in CA's certificate and key (BUILTIN_CA_CERT, and
# BUILTIN_CA_KEY, a file or a pkcs11: URI) and the files the Go side's
# helper signs with (GO_CA_CERT, GO_CA_KEY): the same CA, but for a key in
# a token, whose file is gone, another of the same kind.
# new_ca DIR rsa|ecdsa: DIR/ca.key (PKCS#8) and DIR/ca.pem, self-signed.
new_ca() {
  mkdir -p "$1"
  if [ "$2" = rsa ]; then
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1/ca.key" 2>/dev/null
  else
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1/ca.key" 2>/dev/null
  fi
  openssl req -x509 -new -key "$1/ca.key" -out "$1/ca.pem" -days 30 -subj "/CN=bench built-in CA" 2>/dev/null
}
if [[ " ${SCENARIOS[*]} " == *" pki-ca "* ]]; then
  case "$CA_KEY_KIND" in *rsa) ca_alg=rsa ;; *) ca_alg=ecdsa ;; esac
  new_ca "$WORK/builtin-ca" "$ca_alg"
  BUILTIN_CA_CERT="$WORK/builtin-ca/ca.pem"
  BUILTIN_CA_KEY="$WORK/builtin-ca/ca.key"
  GO_CA_CERT="$BUILTIN_CA_CERT"
  GO_CA_KEY="$BUILTIN_CA_KEY"
  CA_KEY_DESC="$([ "$ca_alg" = rsa ] && echo "RSA 2048" || echo "ECDSA P-256")"
  case "$CA_KEY_KIND" in
    softhsm*)
      module="${SOFTHSM2_MODULE:-/usr/lib/softhsm/libsofthsm2.so}"
      command -v softhsm2-util >/dev/null && [ -e "$module" ] ||
        { log "--ca-key-kind $CA_KEY_KIND: SoftHSM2 is needed (softhsm2-util and $module)"; exit 1; }
      # A token of the bench's own: SoftHSM reads SOFTHSM2_CONF, which the
      # provisioner inherits.
      hsm="$WORK/builtin-ca/softhsm"
      mkdir -p "$hsm/tokens"
      printf 'directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n' "$hsm/tokens" >"$hsm/softhsm2.conf"
      export SOFTHSM2_CONF="$hsm/softhsm2.conf"
      pin="$(python3 -c 'import os; print(os.urandom(8).hex())')"
      printf '%s\n' "$pin" >"$hsm/pin"
      softhsm2-util --init-token --free --label bench-ca --pin "$pin" --so-pin "$pin-so" >"$hsm/init.log" 2>&1 ||
        { log "softhsm2-util --init-token failed (see $hsm/init.log)"; exit 1; }
      softhsm2-util --import "$BUILTIN_CA_KEY" --token bench-ca --label ca --id 01 --pin "$pin" >"$hsm/import.log" 2>&1 ||
        { log "softhsm2-util --import failed (see $hsm/import.log)"; exit 1; }
      # From here on the key exists only in the token.
      rm -f "$BUILTIN_CA_KEY"
      BUILTIN_CA_KEY="pkcs11:token=bench-ca;object=ca?module-path=$module&pin-source=file:$hsm/pin"
      CA_KEY_DESC="$CA_KEY_DESC in a SoftHSM2 token"
      new_ca "$WORK/go-ca" "$ca_alg"
      GO_CA_CERT="$WORK/go-ca/ca.pem"
      GO_CA_KEY="$WORK/go-ca/ca.key"
      ;;
    *) CA_KEY_DESC="$CA_KEY_DESC file" ;;
  esac
fi

# --broker choria: go-choria's broker, with certificates of the run's CA
# for itself and for the provisioner's login.
CHORIA=""
if [ "$BROKER_KIND" = choria ]; then
  log "building go-choria's choria (scripts/build-go-peers.sh choria)"
  CHORIA="$("$ROOT/scripts/build-go-peers.sh" choria 2>"$OUT/choria-build.log" | grep '/choria$' | tail -n1)" ||
    { log "go-choria's choria could not be built (see $OUT/choria-build.log)"; exit 1; }
  [ -x "$CHORIA" ] || { log "go-choria's choria could not be built (see $OUT/choria-build.log)"; exit 1; }
  issue_cert() { # name, CN, subjectAltName
    openssl req -newkey rsa:2048 -nodes -keyout "$WORK/$1.key" -out "$WORK/$1.csr" -subj "/CN=$2" 2>/dev/null
    printf 'subjectAltName=%s\n' "$3" >"$WORK/$1.ext"
    openssl x509 -req -in "$WORK/$1.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial \
      -out "$WORK/$1.pem" -days 30 -extfile "$WORK/$1.ext" 2>/dev/null
  }
  issue_cert broker broker.bench.example.net "DNS:broker.bench.example.net,DNS:localhost,IP:127.0.0.1"
  issue_cert provisioner provisioner.bench "DNS:provisioner.bench"
  BROKER_PASSWORD="$(python3 -c 'import os; print(os.urandom(12).hex())')"
fi

# --security issuer: the Organization Issuer (an ed25519 key the broker
# trusts, made with the real `choria jwt keys`) and, issued by it with
# `choria jwt client`, the provisioners' login (`provisioner`, allowed to
# provision servers) and the chain issuer they sign server JWTs as.
# Both provisioners use the same files.
if [ "$SECURITY" = issuer ]; then
  choria_jwt() { (cd "$WORK" && HOME="$WORK" "$CHORIA" jwt "$@" >>"$WORK/choria-jwt.log" 2>&1) ||
    { log "choria jwt $1 failed (see $WORK/choria-jwt.log)"; exit 1; }; }
  # issue_client NAME CALLER FLAGS...: NAME.seed, NAME.public, NAME.jwt.
  issue_client() {
    local name="$1" caller="$2"
    shift 2
    choria_jwt keys "$name.seed" "$name.public"
    choria_jwt client "$name.jwt" "$caller" "$WORK/issuer.seed" --validity 24h \
      "--public-key=$(cat "$WORK/$name.public")" "$@"
  }
  choria_jwt keys issuer.seed issuer.public
  ISSUER_HEX="$(cat "$WORK/issuer.public")"
  issue_client provisioner-client provisioner --server-provisioner
  issue_client chain-signer provisioner-signer --issuer
fi

python3 "$REPORT" machine >"$OUT/machine.json"
{
  echo "command: scripts/bench.sh $ORIG_ARGS"
  echo "commit: $COMMIT"
  echo "simulator: --directed $DIRECTED"
  echo "binary: $BIN"
  echo "go: $GO_STATUS"
  echo "broker: $BROKER_KIND${CHORIA:+ ($CHORIA)}"
  [ "$BROKER_KIND" = choria ] && echo "security: $SECURITY"
  [ -n "${CA_KEY_DESC:-}" ] && echo "pki-ca key: $CA_KEY_DESC ($CA_KEY_KIND)"
} >"$OUT/info.txt"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"

# ---- one run ---------------------------------------------------------------
# go-choria's broker on $2, configured in $1 as a production broker is for
# provisioning (the provisioning signer, the provisioner's password, Choria
# Streams), logging at warn; its pid in BROKER_PID.
start_choria_broker() {
  local dir="$1" port="$2"
  cat >"$dir/broker.conf" <<EOF
identity = broker.bench.example.net
logfile = $dir/broker.log
loglevel = warn
plugin.choria.broker_network = true
plugin.choria.network.listen_address = 127.0.0.1
plugin.choria.network.client_port = $port
plugin.choria.stats_address = 127.0.0.1
plugin.choria.stats_port = $(free_port)
plugin.choria.use_srv = false
plugin.security.provider = file
plugin.security.file.certificate = $WORK/broker.pem
plugin.security.file.key = $WORK/broker.key
plugin.security.file.ca = $WORK/ca.pem
plugin.choria.network.system.user = system
plugin.choria.network.system.password = $BROKER_PASSWORD-system
plugin.choria.network.provisioning.client_password = $BROKER_PASSWORD
plugin.choria.network.provisioning.signer_cert = $WORK/signer.pub
plugin.choria.network.stream.store = $dir/streams
EOF
  if [ "$SECURITY" = issuer ]; then
    # An Organization Issuer network: ed25519 provisioning JWTs and client
    # JWTs are checked against the issuer (RSA provisioning JWTs would still
    # be checked against signer_cert); TLS stays the file provider's.
    printf 'plugin.security.issuer.names = choria\nplugin.security.issuer.choria.public = %s\n' \
      "$ISSUER_HEX" >>"$dir/broker.conf"
  fi
  (cd "$dir" && HOME="$dir" exec "$CHORIA" broker run --config "$dir/broker.conf" >"$dir/broker.out" 2>&1) &
  BROKER_PID=$!
  PIDS+=("$BROKER_PID")
  wait_for_port "$port"
}

PIDS=()
cleanup() {
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# stop PID [SECONDS]: SIGTERM, then SIGKILL after SECONDS (default 15).
stop() {
  local pid="$1" grace="${2:-15}"
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.1
  done
  log "pid $pid ignored SIGTERM for ${grace}s: killing it"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# run_one IMPL SCENARIO NODES WORKERS RUN
run_one() {
  local impl="$1" scenario="$2" nodes="$3" workers="$4" run="$5" replicas="${6:-1}"
  # Several replicas of ours (shards mode) are reported as impl rust-xR.
  local label="$impl"
  [ "$replicas" -gt 1 ] && label="$impl-x$replicas"
  local dir="$OUT/runs/$scenario-$nodes-w$workers-$label-r$run"
  mkdir -p "$dir"
  local port monitor limit prov_bin
  port="$(free_port)"
  monitor="$(free_port)"
  if [ "$impl" = go ]; then
    limit=$(( nodes * 60 / GO_NODES_PER_MIN > GO_TIMEOUT ? nodes * 60 / GO_NODES_PER_MIN : GO_TIMEOUT ))
    prov_bin="$GO_BIN"
  else
    limit="$TIMEOUT"; prov_bin="$BIN"
  fi

  local nats_pid fleet_tls=() fleet_sign=(--jwt-signer "$WORK/signer.key")
  # An issuer network's nodes speak v2, their provisioning JWT signed by the issuer.
  [ "$SECURITY" = issuer ] && fleet_sign=(--jwt-signer "$WORK/issuer.seed" --protocol v2)
  if [ "$BROKER_KIND" = choria ]; then
    start_choria_broker "$dir" "$port"
    nats_pid=$BROKER_PID
    # Provisioning-mode servers connect with TLS (verifying the broker
    # against the CA they were given) and their provisioning JWT.
    fleet_tls=(--tls-required --tls-ca "$WORK/ca.pem")
  else
    printf 'listen: 127.0.0.1:%s\nmax_payload: 4MB\n' "$port" >"$dir/nats.conf"
    "$CACHE_BIN/nats-server" -c "$dir/nats.conf" >"$dir/nats.log" 2>&1 &
    nats_pid=$!
    PIDS+=("$nats_pid")
    wait_for_port "$port"
  fi

  # pki, pki-ca: the nodes' CSRs are signed before the fleet starts (--presign-csrs),
  # so the simulator's RSA work is not counted against the provisioner.
  local fleet_extra=()
  case "$scenario" in pki | pki-ca) fleet_extra+=(--presign-csrs) ;; esac
  "$BIN" fleet --nats "nats://127.0.0.1:$port" --nodes "$nodes" --token s3cret \
    "${fleet_sign[@]}" --journal "$dir/journal.jsonl" --exit-when-done --directed "$DIRECTED" \
    "${fleet_extra[@]}" "${fleet_tls[@]}" --log warn >"$dir/fleet.out" 2>"$dir/fleet.log" &
  local fleet_pid=$!
  PIDS+=("$fleet_pid")
  # The provisioner starts only once every node has announced itself, so
  # discovery (not startup events) finds the fleet.
  local started=0
  # 120 s, or 1 s per 1,000 nodes for larger fleets.
  for _ in $(seq $(( nodes / 100 > 1200 ? nodes / 100 : 1200 ))); do
    started="$(grep -c '"event":"startup"' "$dir/journal.jsonl" 2>/dev/null || true)"
    [ "${started:-0}" -ge "$nodes" ] && break
    kill -0 "$fleet_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ "${started:-0}" -lt "$nodes" ]; then
    log "the fleet did not start $nodes nodes (see $dir/fleet.log)"
    stop "$fleet_pid"; stop "$nats_pid"
    PIDS=()
    python3 "$REPORT" record impl="$label" scenario="$scenario" nodes="$nodes" workers="$workers" \
      run="$run" commit="$COMMIT" dir="$dir" note="the fleet did not start" >>"$RESULTS"
    return 1
  fi

  local helper
  if [ "$scenario" = pki ]; then
    helper="$BIN fleet-helper --broker nats://broker.bench.example.net:4222 --ca-cert $WORK/ca.pem --ca-key $WORK/ca.key"
  elif [ "$scenario" = pki-ca ] && [ "$impl" = go ]; then
    helper="$BIN fleet-helper --broker nats://broker.bench.example.net:4222 --ca-cert $GO_CA_CERT --ca-key $GO_CA_KEY"
  elif { [ "$scenario" = template ] || [ "$scenario" = pki-ca ]; } && [ "$impl" = rust ]; then
    helper="(configuration_template)"
  else
    helper="$JWT_HELPER"
  fi
  if [ -n "$HELPER_SLEEP" ] && [ "$helper" != "(configuration_template)" ]; then
    # A helper that waits for something (a CA, Vault, an inventory).
    printf '#!/bin/sh\nsleep %s\nexec %s\n' "$HELPER_SLEEP" "$helper" >"$dir/slow-helper.sh"
    chmod +x "$dir/slow-helper.sh"
    helper="$dir/slow-helper.sh"
  fi
  {
    echo "workers: $workers"
    echo "interval: 1m"
    echo "token: s3cret"
    echo "site: bench"
    if [ "$helper" = "(configuration_template)" ]; then
      # What examples/helper.sh prints, as templates.
      echo "configuration_template:"
      echo "  configuration:"
      echo "    identity: '{{ identity }}'"
      echo "    loglevel: info"
      echo "    plugin.choria.server.provision: 'false'"
      echo "    plugin.choria.middleware_hosts: nats://broker.bench.example.net:4222"
    else
      echo "helper: $helper"
    fi
    if [ "$scenario" = pki-ca ] && [ "$impl" = rust ]; then
      echo "ca:"
      echo "  certificate: $BUILTIN_CA_CERT"
      echo "  key: '$BUILTIN_CA_KEY'"
    fi
    if [ "$BROKER_KIND" = choria ]; then
      echo "broker_provisioning_password: $BROKER_PASSWORD"
    else
      echo "choria_insecure: true"
    fi
    echo "monitor_port: $monitor"
    echo "loglevel: warn"
    # The Go provisioner's default logfile is a file named "info" in its
    # working directory; ours logs to stdout unless told otherwise.
    [ "$impl" = go ] && echo "logfile: $dir/go-provisioner.log"
    if [ "$SECURITY" = issuer ]; then
      # Provisioning JWTs verified with the issuer's public key (hex); each
      # node's server JWT signed with the chain issuer's seed and carrying
      # its JWT, as a production provisioner on an issuer network does.
      echo "jwt_verify_cert: $ISSUER_HEX"
      echo "jwt_signing_key: $WORK/chain-signer.seed"
      echo "jwt_signing_token: $WORK/chain-signer.jwt"
    else
      echo "jwt_verify_cert: $WORK/signer.pub"
    fi
    echo "features:"
    echo "  jwt: true"
    [ "$SECURITY" = issuer ] && echo "  ed25519: true"
    case "$scenario" in pki | pki-ca) echo "  pki: true" ;; esac
    for e in "${EXTRA[@]+"${EXTRA[@]}"}"; do echo "${e%%=*}: ${e#*=}"; done
    if [ "$replicas" -gt 1 ]; then
      echo "election:"
      echo "  mode: shards"
      echo "  backend: streams"
      echo "  name: bench"
      echo "  lease_duration: 6s"
      echo "  renew_deadline: 4s"
      echo "  retry_period: 1s"
      echo "  signing_key: $WORK/shards.seed"
    fi
  } >"$dir/provisioner.yaml"
  # The choria provider on an issuer network: protocol v2, logged in with
  # the client JWT (the nonce signed with its seed), TLS verified against
  # the broker's CA; else the file provider (x509, protocol v1).
  local provider=file
  [ "$SECURITY" = issuer ] && provider=choria
  cat >"$dir/choria.cfg" <<EOF
identity = provisioner.bench
plugin.choria.middleware_hosts = nats://127.0.0.1:$port
plugin.choria.use_srv = false
plugin.security.provider = $provider
EOF
  if [ "$SECURITY" = issuer ]; then
    cat >>"$dir/choria.cfg" <<EOF
plugin.security.choria.token_file = $WORK/provisioner-client.jwt
plugin.security.choria.seed_file = $WORK/provisioner-client.seed
plugin.security.choria.ca = $WORK/ca.pem
EOF
  elif [ "$BROKER_KIND" = choria ]; then
    cat >>"$dir/choria.cfg" <<EOF
plugin.security.file.certificate = $WORK/provisioner.pem
plugin.security.file.key = $WORK/provisioner.key
plugin.security.file.ca = $WORK/ca.pem
EOF
  fi

  python3 "$REPORT" snap fleet="$fleet_pid" nats="$nats_pid" >"$dir/snap0.json"
  local start_ns prov_pid perf_pid="" urls="http://127.0.0.1:$monitor/metrics" pids=()
  start_ns=$(date +%s%N)
  # go-choria's choria security provider takes a client's identity from
  # $USER and refuses to start without it (unset in some containers).
  USER="${USER:-provisioner}" BROKER=nats://broker.bench.example.net:4222 "$prov_bin" run --config "$dir/provisioner.yaml" \
    --choria-config "$dir/choria.cfg" >"$dir/provisioner.log" 2>&1 &
  prov_pid=$!
  PIDS+=("$prov_pid")
  pids+=("$prov_pid")
  # Further replicas: the same file but their own monitor port.
  local r
  for r in $(seq 2 "$replicas"); do
    local m
    m="$(free_port)"
    sed "s/^monitor_port: .*/monitor_port: $m/" "$dir/provisioner.yaml" >"$dir/provisioner-$r.yaml"
    USER="${USER:-provisioner}" BROKER=nats://broker.bench.example.net:4222 "$prov_bin" run --config "$dir/provisioner-$r.yaml" \
      --choria-config "$dir/choria.cfg" >"$dir/provisioner-$r.log" 2>&1 &
    PIDS+=("$!")
    pids+=("$!")
    urls="$urls,http://127.0.0.1:$m/metrics"
  done
  local all_pids
  all_pids="$(IFS=+; echo "${pids[*]}")"
  if [ "$PROFILE" = 1 ] && [ "$impl" = rust ] && command -v perf >/dev/null; then
    perf record -F 199 --call-graph dwarf,16384 -p "$prov_pid" -o "$dir/perf.data" >"$dir/perf.log" 2>&1 &
    perf_pid=$!
  fi

  python3 "$REPORT" wait --url "$urls" --target "$nodes" \
    --timeout "$limit" --pid "$all_pids" >"$dir/wait.json"
  # Read /proc just before stopping anything.
  python3 "$REPORT" snap provisioner="$all_pids" fleet="$fleet_pid" nats="$nats_pid" >"$dir/snap1.json"
  python3 "$REPORT" metrics --url "$urls" >"$dir/metrics.json"
  curl -s "http://127.0.0.1:$monitor/metrics" >"$dir/metrics.txt" 2>/dev/null || true
  [ -n "$perf_pid" ] && { kill -INT "$perf_pid" 2>/dev/null || true; wait "$perf_pid" 2>/dev/null || true; }
  for r in "${pids[@]}"; do stop "$r"; done

  # The fleet leaves by itself once every node restarted out of provisioning
  # mode (a 2-3 s splay after the last restart); it then writes the final states.
  for _ in $(seq 300); do kill -0 "$fleet_pid" 2>/dev/null || break; sleep 0.1; done
  stop "$fleet_pid"
  stop "$nats_pid"
  PIDS=()

  python3 "$REPORT" journal "$dir/journal.jsonl" --nodes "$nodes" >"$dir/journal-check.json"
  # The Choria broker logs (at warn) when it cuts a connection off for not
  # reading fast enough: a run with that is no figure of a healthy path.
  local slow=""
  if [ "$BROKER_KIND" = choria ]; then
    slow="$(grep -ci 'slow consumer' "$dir/broker.log" 2>/dev/null || true)"
  fi
  python3 "$REPORT" record impl="$label" scenario="$scenario" nodes="$nodes" workers="$workers" \
    run="$run" start_ns="$start_ns" commit="$COMMIT" dir="$dir" helper="$helper" \
    ca_key="$([ "$scenario" = pki-ca ] && echo "$CA_KEY_KIND")" \
    settings="${EXTRA[*]+"${EXTRA[*]}"}" slow_consumers="$slow" \
    --wait "$dir/wait.json" --snap0 "$dir/snap0.json" --snap1 "$dir/snap1.json" \
    --journal "$dir/journal-check.json" --metrics "$dir/metrics.json" >>"$RESULTS"
  python3 - "$RESULTS" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
f = lambda v, s="{:.1f}": "-" if v is None else s.format(v)
state = "ok" if r["valid"] else "NOT VALID"
print(f"    {r['impl']:4} {r['scenario']} {r['nodes']} nodes w{r['workers']} run {r['run']}: {state}; "
      f"{f(r['nodes_per_min'], '{:,.0f}')} nodes/min, e2e {f(r['e2e_s'])} s, "
      f"p50/p99 {f(r['per_node_p50_s'], '{:.3f}')}/{f(r['per_node_p99_s'], '{:.3f}')} s, "
      f"prov CPU {f(r['prov_cpu_s'], '{:.2f}')} s RSS {f(r['prov_hwm_mib'])} MiB, "
      f"helpers {f(r['helper_cpu_s'], '{:.2f}')} s, fleet {f(r['fleet_cpu_s'], '{:.2f}')} s, "
      f"nats {f(r['nats_cpu_s'], '{:.2f}')} s, machine busy {f(r['machine_busy_pct'], '{:.0f}')} %, "
      f"other {f(r['other_cpu_s'])} s, 1st discovery {f(r['first_cycle_discovered'], '{:.0f}')}, "
      f"cycles {f(r['discover_cycles'], '{:.0f}')}"
      + (f", broker slow consumers {r['slow_consumers']}" if r.get("slow_consumers") != "" else ""),
      file=sys.stderr)
if not r["valid"]:
    for p in (r.get("journal_problems") or [])[:5]:
        print(f"      {p}", file=sys.stderr)
PY
  if [ "$PROFILE" = 1 ] && [ -s "$dir/perf.data" ]; then
    # Only the provisioner's own threads (helper children are left out: their
    # CPU is the "helper CPU" figure), bucketed by what the stack was doing.
    perf report -i "$dir/perf.data" --pid "$prov_pid" --no-children --stdio --sort symbol \
      -g none --percent-limit 0.3 >"$dir/perf-report.txt" 2>/dev/null || true
    perf script -i "$dir/perf.data" --pid "$prov_pid" --no-inline -F comm,tid,period,ip,sym,dso \
      >"$dir/perf.script" 2>/dev/null || true
    python3 "$REPORT" perf-buckets "$dir/perf.script" --nodes "$nodes" \
      --cpu-s "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["procs"]["provisioner"]["cpu_s"])' "$dir/snap1.json")" \
      >"$dir/perf-buckets.md" 2>/dev/null || true
    rm -f "$dir/perf.script"
    log "profile: $dir/perf-buckets.md"
    cat "$dir/perf-buckets.md" >&2
  fi
}

# ---- the matrix ------------------------------------------------------------
log "results in $OUT"
for scenario in "${SCENARIOS[@]}"; do
  for nodes in "${NODES_ARR[@]}"; do
    for workers in "${WORKERS_ARR[@]}"; do
      for run in $(seq "$RUNS"); do
        log "$scenario, $nodes nodes, $workers workers, run $run/$RUNS"
        for replicas in "${REPLICAS_ARR[@]}"; do
          run_one rust "$scenario" "$nodes" "$workers" "$run" "$replicas" || log "run failed"
        done
        # Alternate with Go so both see the same background load.
        if [ -n "$GO_BIN" ]; then
          run_one go "$scenario" "$nodes" "$workers" "$run" || log "run failed"
        fi
      done
    done
  done
done

python3 "$REPORT" summary "$RESULTS" --machine "$OUT/machine.json" --go-status "$GO_STATUS" \
  --scale "$SCALE" --broker "$BROKER_KIND" --security "$SECURITY" --ca-key "${CA_KEY_DESC:-}" >"$OUT/report.md"
echo
cat "$OUT/report.md"
echo
log "report: $OUT/report.md; per-run data: $RESULTS and $OUT/runs/"
