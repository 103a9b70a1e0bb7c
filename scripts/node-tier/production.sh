# shellcheck shell=bash
# Sourced by scripts/node-tier.sh after provisioner.sh: check 7 of its
# header, the production guide, part one on the host and part two's pods.
# docs/src/guides/production.md from its own text (tests/it/production.rs): a
# real go-choria server provisioned and renewed behind the real Choria broker
# on the host, then a Provisioner whose pods take it over and renew it. The
# guide makes its own `choria` namespace: 6.'s goes first.
step "production guide: part one on the host, part two's pods renew its node"
STEP_LOGS=("$W/production.log")
kc delete namespace "$PNS" --wait=true --timeout=180s >"$W/production.log" 2>&1 ||
  die "kubectl delete namespace $PNS did not finish"
t0=$(now)
NODE_TIER_ADDRESS="$GW" NODE_TIER_KUBECONFIG="$KUBECONFIG_FILE" NODE_TIER_KUBECTL="$KUBECTL" \
  CHORIA_BIN="$CACHE_BIN/choria" \
  cargo test --workspace --quiet --test it production::the_whole_page_on_a_real_kubelet -- --ignored --exact --nocapture \
  >>"$W/production.log" 2>&1 || die "the production guide did not run through on the kubelet"
GUIDE_S="$(secs "$t0" "$(now)")"
summary "production guide, both parts (part one, then the pods renew)" "$GUIDE_S s"
pass "the guide's every command ran; the pods renewed part one's node in $GUIDE_S s (both parts)"
