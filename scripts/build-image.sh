#!/usr/bin/env bash
# Builds the release image on this machine without a container registry: the
# root filesystem is made from Debian packages with mmdebstrap (the machine's
# own apt sources, the machine's own Debian release, so the glibc the binary
# was linked against here is the one it runs with), and podman turns it and
# the binary from `cargo build --release` into choria-provisioner:<version>,
# tagged choria-provisioner:<version>-<id> as well: <id> is the first 12 hex
# digits of the image's ID (the digest of its configuration, which names every
# layer), so that tag changes whenever the image does. Push that one: a tag
# pushed again with another image never reaches a node that cached the first
# (pullPolicy IfNotPresent).
#
#   scripts/build-image.sh                  build, or reuse when nothing changed
#   scripts/build-image.sh --bin PATH       put this binary in (no cargo build)
#   scripts/build-image.sh --refresh-base   make the Debian root filesystem again
#                                           (security updates of its packages)
#
# The Dockerfile builds the same image for those with registry access. What
# the image is (user, entrypoint, cmd, workdir, HOME, binary path, packages,
# labels) is written once, in scripts/image-contract.env: this script builds
# from it, the Dockerfile's final stage is generated from it
# (scripts/check-manifests.sh --write-deploy, which fails when they differ),
# and scripts/image-smoke.sh compares `podman image inspect` of the image this
# script built with it.
#
# What it makes, all in the project cache ($HOME/.cache/choria-provisioner-rs/image):
#   rootfs-<release>-<key>.tar      the Debian part (mmdebstrap --variant=essential
#                                   plus ca-certificates and tini, no apt, no
#                                   documentation but copyright files), reused
#                                   until its recipe or the apt sources change
#   choria-provisioner-<version>.oci.tar   `podman save --format oci-archive`
#   choria-provisioner-<version>.stamp     what the archive was built from
# and the image in podman's storage, under both tags (the previous build's own
# tag is removed when a new image replaces it). The binary goes in without its debug
# information (`debug = 1` in Cargo.toml's release profile is for perf; symbols
# stay, so a panic's backtrace still names functions).
#
# Nothing is rebuilt when the stamp (a hash of the binary, this script, the
# image contract and the root filesystem's recipe) matches; an image missing
# from podman's storage is loaded back from the archive. Prints the image, its
# build's own tag, the archive and the sizes on stdout.
#
# Needs root (mmdebstrap, podman) and Debian; installs podman, runc, mmdebstrap
# and binutils with apt-get when missing (scripts/lib.sh ensure_image_tools).
# Environment:
#   IMAGE_APT_SOURCES   apt source files to build from (default: the machine's
#                       files that name its release)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/scripts/build-image.sh"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"

# The image contract: IMAGE_NAME, IMAGE_USER, ... (scripts/image-contract.env).
load_image_contract || exit 1

BIN=""
REFRESH_BASE=0
usage() { sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --refresh-base) REFRESH_BASE=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "build-image.sh: unknown option $1" >&2; usage ;;
  esac
done

began=$(date +%s%N)
elapsed() { awk -v a="$began" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
die() { log "build-image: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap makes a Debian root filesystem, podman stores the image)"
[ -r /etc/os-release ] || die "no /etc/os-release: cannot tell which Debian release to build from"
# shellcheck disable=SC1091 # the machine's own file
RELEASE="$(. /etc/os-release && [ "${ID:-}" = debian ] && printf '%s' "${VERSION_CODENAME:-}")" || true
[ -n "$RELEASE" ] || die "this machine is not Debian (/etc/os-release): the root filesystem must be its release so that glibc matches the binary"
VERSION="$(image_version)"
[ -n "$VERSION" ] || die "no workspace.package version in Cargo.toml"
TAG="$IMAGE_NAME:$VERSION"

ensure_image_tools

IMAGE_DIR="$CACHE_DIR/image"
mkdir -p "$IMAGE_DIR"
ARCHIVE="$IMAGE_DIR/$IMAGE_NAME-$VERSION.oci.tar"
STAMP_FILE="$IMAGE_DIR/$IMAGE_NAME-$VERSION.stamp"
# One build at a time (the smoke tier and a user may run this together).
exec 9>"$IMAGE_DIR/.lock"
flock 9

# ---- the binary -------------------------------------------------------------
if [ -z "$BIN" ]; then
  ensure_rust
  log "cargo build --release (choria-provisioner)"
  cargo build --release --locked --quiet --bin choria-provisioner
  BIN="$CARGO_TARGET_DIR/release/choria-provisioner"
fi
[ -x "$BIN" ] || die "no executable at $BIN"

# ---- the root filesystem's recipe -------------------------------------------
# The machine's apt sources for its release (a file given to mmdebstrap as a
# mirror is pasted into the new system's sources; it is removed again below,
# as the image has no apt).
sources=()
if [ -n "${IMAGE_APT_SOURCES:-}" ]; then
  read -r -a sources <<<"$IMAGE_APT_SOURCES"
else
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    if [ -f "$f" ] && grep -Eq "^[^#]*[[:space:]]$RELEASE(-[a-z]+)?([[:space:]]|$)" "$f"; then
      sources+=("$f")
    fi
  done
fi
[ ${#sources[@]} -gt 0 ] || die "no apt source file names release $RELEASE (set IMAGE_APT_SOURCES)"
for f in "${sources[@]}"; do [ -r "$f" ] || die "cannot read apt source file $f"; done

uid="${IMAGE_USER%%:*}"
gid="${IMAGE_USER##*:}"
# Run by mmdebstrap on the finished tree ($1). The user is written into the
# files directly: useradd (package passwd) is not part of the essential set.
# The image has no apt: the machine's apt sources are taken out again (the
# rest of /etc/apt must stay until mmdebstrap's own clean-up has run), and so
# are the machine's resolv.conf and hostname (the container runtime provides
# both).
ROOTFS_HOOK="$(cat <<EOF
set -eu
r="\$1"
grep -q '^$IMAGE_USER_NAME:' "\$r/etc/group" || echo '$IMAGE_USER_NAME:x:$gid:' >>"\$r/etc/group"
grep -q '^$IMAGE_USER_NAME:' "\$r/etc/passwd" || echo '$IMAGE_USER_NAME:x:$uid:$gid::$IMAGE_HOME:/usr/sbin/nologin' >>"\$r/etc/passwd"
if [ -f "\$r/etc/shadow" ]; then grep -q '^$IMAGE_USER_NAME:' "\$r/etc/shadow" || echo '$IMAGE_USER_NAME:!:::::::' >>"\$r/etc/shadow"; fi
if [ -f "\$r/etc/gshadow" ]; then grep -q '^$IMAGE_USER_NAME:' "\$r/etc/gshadow" || echo '$IMAGE_USER_NAME:!::' >>"\$r/etc/gshadow"; fi
mkdir -p "\$r/tmp" && chmod 1777 "\$r/tmp"
if [ ! -e "\$r/usr/bin/apt-get" ]; then rm -rf "\$r/etc/apt/sources.list" "\$r/etc/apt/sources.list.d" "\$r/var/log/apt"; fi
rm -f "\$r"/var/log/*.log "\$r"/var/cache/debconf/*-old "\$r"/var/lib/dpkg/*-old
rm -f "\$r/etc/resolv.conf" "\$r/etc/hostname"
EOF
)"
# Merged /usr the debootstrap way (symlinks and the empty usr-is-merged
# package): without it bookworm's essential set pulls in usrmerge and, with
# it, perl (~45 MiB).
MERGED_USR_HOOKS=/usr/share/mmdebstrap/hooks/merged-usr
MMDEBSTRAP_ARGS=(
  --variant=essential
  --include="${IMAGE_PACKAGES// /,}"
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --customize-hook="$ROOTFS_HOOK"
  --format=tar
)
if [ -d "$MERGED_USR_HOOKS" ]; then MMDEBSTRAP_ARGS+=(--hook-dir="$MERGED_USR_HOOKS"); fi
BASE_KEY="$({ printf '%s\n' "$RELEASE" "${MMDEBSTRAP_ARGS[@]}"; cat "${sources[@]}"; } | sha256sum | cut -c1-16)"
BASE="$IMAGE_DIR/rootfs-$RELEASE-$BASE_KEY.tar"

BIN_SUM="$(sha256sum "$BIN" | cut -d' ' -f1)"
STAMP="$(printf '%s\n' "$BIN_SUM" "$(sha256sum "$SELF" | cut -d' ' -f1)" "$(sha256sum "$IMAGE_CONTRACT" | cut -d' ' -f1)" \
  "$BASE_KEY" "$VERSION" | sha256sum | cut -d' ' -f1)"
stamp_field() { if [ -f "$STAMP_FILE" ]; then sed -n "s/^$1=//p" "$STAMP_FILE" | head -n1; fi; }
image_id() { podman_cmd image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true; }
# build_tag ID: the tag of this build alone, <name>:<version>-<12 hex of ID>.
build_tag() { printf '%s:%s-%s' "$IMAGE_NAME" "$VERSION" "${1:0:12}"; }
# drop_untagged ID: removes image ID (and its intermediate layers) when no
# name is left on it, say an earlier build of ours whose tag moved on; an
# image someone tagged or a container uses stays.
drop_untagged() {
  if [ -n "$1" ] && [ "$(podman_cmd image inspect --format '{{len .RepoTags}}' "$1" 2>/dev/null)" = 0 ]; then
    podman_cmd image rm "$1" >/dev/null 2>&1 || true
  fi
}

report() {
  local id size archive_size
  id="$(image_id)"
  size="$(podman_cmd image inspect --format '{{.Size}}' "$TAG")"
  archive_size="$(stat -c %s "$ARCHIVE")"
  printf 'image:   %s (%s)\n' "$TAG" "${id:0:12}"
  printf 'build:   %s (this image only: push this tag)\n' "$(build_tag "$id")"
  printf 'archive: %s\n' "$ARCHIVE"
  printf 'size:    %s MiB image, %s MiB archive\n' \
    "$(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }')" \
    "$(awk -v s="$archive_size" 'BEGIN { printf "%.1f", s / 1048576 }')"
}

# ---- up to date? --------------------------------------------------------------
if [ "$REFRESH_BASE" = 0 ] && [ -f "$ARCHIVE" ] && [ "$(stamp_field stamp)" = "$STAMP" ]; then
  want="$(stamp_field image_id)"
  have="$(image_id)"
  if [ "$have" != "$want" ]; then
    log "$TAG in podman's storage is not the one built from this binary: loading $ARCHIVE"
    podman_cmd load --quiet --input "$ARCHIVE" >/dev/null
    podman_cmd tag "$want" "$TAG"
    drop_untagged "$have"
  fi
  [ "$(image_id)" = "$want" ] || die "loading $ARCHIVE did not give image $want"
  podman_cmd tag "$want" "$(build_tag "$want")"
  log "$TAG is up to date (stamp matches) ($(elapsed) s)"
  report
  exit 0
fi

WORK="$(mktemp -d "$IMAGE_DIR/work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# ---- the root filesystem --------------------------------------------------------
if [ "$REFRESH_BASE" = 1 ] || [ ! -s "$BASE" ]; then
  log "mmdebstrap: Debian $RELEASE, essential + $IMAGE_PACKAGES (log: $IMAGE_DIR/mmdebstrap.log)"
  t=$(date +%s)
  # stdin from /dev/null: mmdebstrap reads sources from a stdin that is not a terminal
  if ! mmdebstrap "${MMDEBSTRAP_ARGS[@]}" "$RELEASE" "$WORK/rootfs.tar" "${sources[@]}" \
    </dev/null >"$IMAGE_DIR/mmdebstrap.log" 2>&1; then
    tail -n 30 "$IMAGE_DIR/mmdebstrap.log" | sed 's/^/  | /' >&2
    die "mmdebstrap failed (full log: $IMAGE_DIR/mmdebstrap.log)"
  fi
  rm -f "$IMAGE_DIR"/rootfs-*.tar
  mv "$WORK/rootfs.tar" "$BASE"
  log "root filesystem: $(du -m "$BASE" | cut -f1) MiB in $(($(date +%s) - t)) s"
fi

# ---- the image -------------------------------------------------------------------
ctx="$WORK/context"
mkdir -p "$ctx"
ln "$BASE" "$ctx/rootfs.tar" 2>/dev/null || cp "$BASE" "$ctx/rootfs.tar"
strip --strip-debug -o "$ctx/choria-provisioner" "$BIN"
chmod 0755 "$ctx/choria-provisioner"
"$ctx/choria-provisioner" --version >/dev/null || die "the stripped binary does not run"
{
  echo "FROM scratch"
  echo "ADD rootfs.tar /"
  echo "COPY choria-provisioner $IMAGE_BINARY"
  printf 'LABEL org.opencontainers.image.title="%s" org.opencontainers.image.description="%s" org.opencontainers.image.version="%s" org.opencontainers.image.licenses="%s"\n' \
    "$IMAGE_TITLE" "$IMAGE_DESCRIPTION" "$VERSION" "$IMAGE_LICENSES"
  echo "ENV HOME=$IMAGE_HOME"
  echo "WORKDIR $IMAGE_WORKDIR"
  echo "USER $IMAGE_USER"
  echo "ENTRYPOINT $IMAGE_ENTRYPOINT"
  echo "CMD $IMAGE_CMD"
} >"$ctx/Containerfile"

old_id="$(stamp_field image_id)"
log "podman build $TAG"
podman_cmd build --quiet --layers --format oci --tag "$TAG" --file "$ctx/Containerfile" "$ctx" >"$WORK/build.out" \
  || die "podman build failed"
new_id="$(image_id)"
[ -n "$new_id" ] || die "podman build made no image $TAG"
podman_cmd tag "$new_id" "$(build_tag "$new_id")"
# The image this script made last time: its own tag goes, and the image too
# when no other name is left on it.
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  podman_cmd untag "$old_id" "$(build_tag "$old_id")" >/dev/null 2>&1 || true
  drop_untagged "$old_id"
fi

log "podman save --format oci-archive"
rm -f "$ARCHIVE" "$STAMP_FILE"
podman_cmd save --quiet --format oci-archive --output "$WORK/image.oci.tar" "$TAG"
mv "$WORK/image.oci.tar" "$ARCHIVE"
printf 'stamp=%s\nimage_id=%s\nbuild_tag=%s\nbinary_sha256=%s\nrelease=%s\nbase=%s\n' \
  "$STAMP" "$new_id" "$(build_tag "$new_id")" "$BIN_SUM" "$RELEASE" "$(basename "$BASE")" >"$STAMP_FILE"
log "built $TAG in $(elapsed) s"
report
