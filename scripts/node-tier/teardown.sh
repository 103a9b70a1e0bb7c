# shellcheck shell=bash
# Sourced by scripts/node-tier.sh once the prerequisites are there: the work
# directory, a note of what the host had before the tier, and the teardown
# that runs on every exit (cleanup, the EXIT trap). It stops what the tier
# started, in reverse (control plane writers, kubelet, pod processes,
# containerd and its shims, the rest), and removes from the host what was
# not there before: network namespaces, mounts, cgroups, libcni's cache
# entries, the kubelet's and containerd's hard-wired paths, iptables chains
# and the bridge. The work directory is kept on failure or with --keep.

W="$(mktemp -d "$CACHE_DIR/node-tier.XXXXXX")"
chmod 0755 "$W"
SOCK="$W/containerd/containerd.sock"
KUBELET_DIR="$W/kubelet"
PIDS=()          # in start order; stopped in reverse
NETNS_BEFORE="$(ls /run/netns 2>/dev/null || true)"
IPT_BEFORE="$(iptables-save 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | sort -u || true)"
IP6T_BEFORE="$(ip6tables-save 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | sort -u || true)"
CNI_RESULTS_BEFORE="$(ls /var/lib/cni/results 2>/dev/null || true)"
# Paths the kubelet and containerd use whatever their configuration says:
# removed at the end when they were not there before.
HOST_DIRS=(/var/lib/kubelet /var/log/containers /run/containerd /var/lib/cni/results /var/lib/cni)
HOST_DIRS_NEW=()
for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] || HOST_DIRS_NEW+=("$d"); done
ADDED_BRIDGE=0
ADDED_IPT=0
CGROUP_OWNED=0

# Processes in the kubelet's pod cgroups (every hierarchy has the same tree).
pod_pids() {
  local d
  for d in /sys/fs/cgroup/*/kubepods; do
    [ -d "$d" ] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

# Shims of our containerd (found by their -address, which is our socket).
our_shims() {
  local p
  for p in /proc/[0-9]*; do
    grep -q -- "-address $SOCK " <<<"$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null)" && echo "${p#/proc/}"
  done
  return 0
}

cleanup() {
  local rc=$? e pid name p i
  trap - EXIT INT TERM
  # Best effort from here on: every step runs whatever failed before it.
  set +e +o pipefail
  step_done
  [ -n "${HOLD_PID:-}" ] && kill "$HOLD_PID" 2>/dev/null
  # Ctrl-C or SIGTERM while holding after every check passed is the normal end.
  [ "$PASSED" = 1 ] && { [ "$rc" = 130 ] || [ "$rc" = 143 ]; } && rc=0
  local t_down
  t_down=$(now)
  log "node-tier: tearing down"
  # The control plane's writers first (no new pods), then the kubelet.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    e="${PIDS[$i]}"
    name="${e#*:}"
    case "$name" in kube-controller-manager | kube-scheduler | kubelet) stop_pid "${e%%:*}" "$name" ;; esac
  done
  # Every pod process, then containerd and its shims.
  if [ "$CGROUP_OWNED" = 1 ]; then
    for i in $(seq 50); do
      p="$(pod_pids)"
      [ -z "$p" ] && break
      # shellcheck disable=SC2086 # a list of PIDs
      kill -KILL $p 2>/dev/null || true
      sleep 0.1
    done
  fi
  local shims
  shims="$(our_shims)"
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    e="${PIDS[$i]}"
    [ "${e#*:}" = containerd ] && stop_pid "${e%%:*}" containerd
  done
  shims="$shims $(our_shims)"
  for pid in $shims; do
    # its socket: /run/containerd/s/sha256(<our socket>/<namespace>/<id>)
    local id
    id="$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | sed -n '/^-id$/{n;p;}')" || true
    kill -KILL "$pid" 2>/dev/null || true
    [ -n "$id" ] && rm -f "/run/containerd/s/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -d' ' -f1)"
  done
  # kube-apiserver drains for longer than 10 s after SIGTERM (nothing left to
  # serve, its etcd data is thrown away): 2 s for it.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    e="${PIDS[$i]}"
    case "${e#*:}" in
      kube-apiserver) stop_pid "${e%%:*}" kube-apiserver 2 2>/dev/null ;;
      *) stop_pid "${e%%:*}" "${e#*:}" ;;
    esac
  done
  # Network namespaces that containerd made (cni-*), mounts under the work
  # directory (containerd's rootfs and shm, the kubelet's volumes), cgroups.
  for e in $(ls /run/netns 2>/dev/null || true); do
    case "$e" in cni-*) grep -qxF "$e" <<<"$NETNS_BEFORE" || { umount "/run/netns/$e" 2>/dev/null || true; rm -f "/run/netns/$e"; } ;; esac
  done
  for i in 1 2 3; do
    local mounts
    mounts="$(awk -v w="$W" '$5 == w || index($5, w "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)"
    [ -z "$mounts" ] && break
    for p in $mounts; do umount "$p" 2>/dev/null || umount -l "$p" 2>/dev/null || true; done
  done
  if [ "$CGROUP_OWNED" = 1 ]; then
    for p in /sys/fs/cgroup/*/kubepods; do
      if [ -d "$p" ]; then find "$p" -depth -type d -exec rmdir {} + 2>/dev/null; fi
    done
  fi
  # libcni's result cache (/var/lib/cni/results, not configurable in
  # containerd 1.6) of the sandboxes torn down without a CNI DEL; the kubelet's
  # /var/log/containers links into our pod log dir; the hard-wired
  # /var/lib/kubelet (device-plugins socket) and /run/containerd (shim sockets).
  for e in $(ls /var/lib/cni/results 2>/dev/null || true); do
    grep -qxF "$e" <<<"$CNI_RESULTS_BEFORE" || rm -f "/var/lib/cni/results/$e"
  done
  for p in /var/log/containers/*; do
    [ -L "$p" ] && case "$(readlink "$p")" in "$W"/*) rm -f "$p" ;; esac
  done
  for p in "${HOST_DIRS_NEW[@]+"${HOST_DIRS_NEW[@]}"}"; do
    case "$p" in
      /var/lib/kubelet) rm -rf "$p" ;;
      *) find "$p" -depth -type d -empty -delete 2>/dev/null ;;
    esac
  done
  # The host's network: our chains, the kubelet's canary chains, the bridge.
  if [ "$ADDED_IPT" = 1 ]; then
    iptables -t nat -D PREROUTING -j "$CHAIN" 2>/dev/null || true
    iptables -t nat -D OUTPUT -j "$CHAIN" 2>/dev/null || true
    iptables -t filter -D FORWARD -j "$CHAIN" 2>/dev/null || true
    for e in nat filter; do
      iptables -t "$e" -F "$CHAIN" 2>/dev/null || true
      iptables -t "$e" -X "$CHAIN" 2>/dev/null || true
    done
  fi
  # The kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...) that were
  # not there before: the jumps to them, then the chains.
  local ipt before t c r
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    if [ "$ipt" = iptables ]; then before="$IPT_BEFORE"; else before="$IP6T_BEFORE"; fi
    for t in mangle nat filter; do
      for c in $("$ipt" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[^ ]*\)$/\1/p'); do
        grep -qxF "$c" <<<"$before" && continue
        "$ipt" -t "$t" -S 2>/dev/null | grep -E -- "^-A [^ ]+ .*-j $c( |\$)" | while read -r r; do
          # shellcheck disable=SC2086 # the rule's own words
          eval "$ipt -t $t ${r/#-A/-D}" 2>/dev/null || true
        done
        "$ipt" -t "$t" -F "$c" 2>/dev/null || true
      done
      for c in $("$ipt" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[^ ]*\)$/\1/p'); do
        grep -qxF "$c" <<<"$before" || "$ipt" -t "$t" -X "$c" 2>/dev/null || true
      done
    done
  done
  if [ "$ADDED_BRIDGE" = 1 ]; then
    ip route del "$SVC_CIDR" dev "$BRIDGE" 2>/dev/null || true
    ip link del "$BRIDGE" 2>/dev/null || true
  fi
  if [ "$rc" = 0 ] && [ "$FAILED" = 0 ] && [ "$KEEP" = 0 ]; then
    rm -rf "$W"
  else
    log "node-tier: work directory kept: $W"
  fi
  TIMINGS+=("$(printf '%-52s %6s s' "teardown" "$(secs "$t_down" "$(now)")")")
  TIMINGS+=("$(printf '%-52s %6s s' "total" "$(secs "$began" "$(now)")")")
  printf '  %s\n' "${TIMINGS[@]}" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
