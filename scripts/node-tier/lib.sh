# shellcheck shell=bash
# Sourced by scripts/node-tier.sh first: the helpers every part uses. Steps
# and their timings (step, pass, die with the tail of the step's logs),
# waiting (wait_until), the processes the tier starts (spawn, alive,
# stop_pid), the summary's figures (summary) and the configs and manifests
# kept as files next to this one (render).

now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
began=$(now)
TIMINGS=()
STEP=""
STEP_T0=""
STEP_LOGS=()
step_done() {
  [ -n "$STEP" ] && TIMINGS+=("$(printf '%-52s %6s s' "$STEP" "$(secs "$STEP_T0" "$(now)")")")
  STEP=""
}
step() {
  step_done
  STEP="$1"
  STEP_T0=$(now)
  STEP_LOGS=()
  log "node-tier: $STEP"
}
FAILED=0
PASSED=0
die() {
  FAILED=1
  log "node-tier: FAILED in step '${STEP:-?}': $*"
  local f
  for f in "${STEP_LOGS[@]+"${STEP_LOGS[@]}"}"; do
    [ -s "$f" ] || continue
    echo "---- last 40 lines of $f" >&2
    tail -n 40 "$f" | sed 's/^/  | /' >&2
  done
  [ ${#STEP_LOGS[@]} -gt 0 ] && log "node-tier: FAILED in step '${STEP:-?}': $*"
  exit 1
}
pass() { log "node-tier: ok: $*"; }

# wait_until SECONDS WHAT CMD...: runs CMD every 0.2 s until it succeeds.
wait_until() {
  local limit="$1" what="$2" deadline
  shift 2
  deadline=$(($(date +%s) + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$what: not within ${limit} s"
    sleep 0.2
  done
}

# render FILE: FILE with every ${NAME} replaced by the value of the shell
# variable NAME (unset: an error), left to right, values not read again.
# The configs (config/) and manifests (manifests/) are written this way.
render() {
  local line name out
  while IFS= read -r line || [ -n "$line" ]; do
    out=""
    while [[ "$line" =~ \$\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do
      name="${BASH_REMATCH[1]}"
      out+="${line%%"${BASH_REMATCH[0]}"*}${!name}"
      line="${line#*"${BASH_REMATCH[0]}"}"
    done
    printf '%s\n' "$out$line"
  done <"$1"
}

SUMMARY=()
# summary WHAT FIGURE: a row of the measured figures printed at the end.
summary() { SUMMARY+=("$(printf '%-58s %s' "$1" "$2")"); }

# spawn NAME CMD...: in the background, its output in $W/NAME.log, killed with
# this script (pdeathsig) too.
spawn() {
  local name="$1"
  shift
  setpriv --pdeathsig KILL "$@" </dev/null >"$W/$name.log" 2>&1 &
  PIDS+=("$!:$name")
}

# alive PID: running (not gone, not a zombie).
alive() {
  local st
  st="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
  [ -n "$st" ] && [ "$st" != Z ]
}
stop_pid() { # PID NAME [SECONDS]: SIGTERM, SIGKILL after SECONDS (10)
  local pid="$1" i limit="${3:-10}"
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq $((limit * 10))); do
    alive "$pid" || break
    sleep 0.1
  done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null && log "node-tier: ${2:-$pid} was still running $limit s after SIGTERM: killed"
  wait "$pid" 2>/dev/null || true
}

