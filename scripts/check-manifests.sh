#!/usr/bin/env bash
# Checks the Kubernetes manifests without a cluster, helm binary or network
# (after the first run): the Helm chart in charts/choria-provisioner-operator and
# the plain manifests in deploy/.
#
#   scripts/check-manifests.sh                 check; exit 1 on any failure
#   scripts/check-manifests.sh --write-deploy  regenerate deploy/crd.yaml,
#       deploy/rbac.yaml, deploy/operator.yaml and the chart's CRD copy from
#       crds/provisioner.yaml and the chart's default render, and the
#       Dockerfile's image contract block from scripts/image-contract.env,
#       then check
#   scripts/check-manifests.sh --self-test     the checks' own unit tests
#       (scripts/manifests/tests: each check on small inputs); exit 1 on failure
#
# What it does:
#   1. helm lint --strict (kube 1.34) with default values and variants, and checks
#      that values.schema.json refuses bad values;
#   2. renders the chart (helm-python-sdk, Helm's own Go engine) with default values
#      and variants (ServiceMonitor on, one replica without leader election and so
#      without PDB, one watched namespace, CRD off, PDB off, image by digest, the
#      Grafana dashboard ConfigMap and the PrometheusRule on) and checks what each
#      variant must contain; the chart's dashboard is checked to be the Go
#      provisioner's dashboard.json unchanged (when ../shared/peers has it);
#   3. validates every rendered object and everything in deploy/ with
#      kubernetes-validate against Kubernetes 1.34, strict (unknown fields fail).
#      ServiceMonitor and PrometheusRule have no schema there and are skipped with a
#      note; Provisioner
#      objects are validated against the CRD's openAPIV3Schema with jsonschema;
#   4. RBAC: no wildcards; the operator's ClusterRole holds exactly what the
#      operator does plus what the Roles it builds for provisioner pods grant
#      (Kubernetes refuses to let it create them otherwise), and `bind` on exactly
#      the two ClusterRoles it binds to provisioner pods (Leases,
#      CertificateRequests), which hold exactly the pods' verbs and which the
#      Deployment's args name; nothing more; its own Lease is covered;
#      the Deployment meets Pod Security "restricted";
#   5. the chart's CRD copy and deploy/crd.yaml equal crds/provisioner.yaml, and
#      deploy/ equals the chart's default render (namespace choria-provisioner);
#   6. the Dockerfile parses (BuildKit's parser, PyPI dockerfile), runs as 65532
#      with the documented entrypoint, and .dockerignore lets in what it copies;
#      scripts/image-contract.env (the image's one definition, which
#      scripts/build-image.sh builds from here with Debian packages, no
#      registry) holds NAME='literal' lines only, the Dockerfile's
#      `# >>> image contract` block is what it makes, and nothing outside the
#      block overrides user, entrypoint, cmd, workdir, HOME, binary path,
#      packages or labels; its version is Cargo.toml's and deploy/ names that
#      image (deploy/'s example Provisioners name none). A Dockerfile under
#      docs/src/examples/ (an image made from ours) parses, builds FROM an
#      ARG BASE defaulting to our image, names the contract's binary and
#      init and ends as its user. No image is built here
#      (scripts/image-smoke.sh builds one and checks it);
#   7. the book: every Kubernetes object under docs/src/examples/ validates as
#      in 3 (cert-manager's kinds have no schema there and are skipped with a
#      note), and every alert the chart's PrometheusRule ships has its runbook,
#      a `## <alert>` section of docs/src/operations/alerts.md;
#   8. the chart's README: its Alert table lists exactly the alerts the
#      PrometheusRule ships, its Values table tunes exactly the alerts
#      values.yaml has, and its RBAC tables hold every rule of every
#      ClusterRole and Role of the default render with the same verbs, and
#      nothing else.
#
# Tools (PyPI kubernetes-validate, helm-python-sdk, jsonschema, dockerfile) are installed once
# into the project cache's virtualenv ($HOME/.cache/choria-provisioner-rs/venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

ensure_manifest_tools
VENV="$CACHE_DIR/venv"

# The checks are the Python package scripts/manifests (one module per group of
# checks, see its __init__.py), run with the virtualenv's Python; no
# __pycache__ is written into the tree.
export PYTHONPATH="$ROOT/scripts" PYTHONDONTWRITEBYTECODE=1
if [ "${1:-}" = --self-test ]; then
  [ $# -eq 1 ] || { echo "check-manifests: --self-test takes no other argument" >&2; exit 1; }
  exec "$VENV/bin/python" -m unittest discover --start-directory "$ROOT/scripts/manifests/tests" \
    --top-level-directory "$ROOT/scripts"
fi
exec "$VENV/bin/python" -m manifests "$ROOT" "$@"
