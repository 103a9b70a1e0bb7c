"""The manifest checks scripts/check-manifests.sh runs, as a package.

scripts/check-manifests.sh sets up the virtualenv with the tools
(scripts/lib.sh ensure_manifest_tools) and runs `python -m manifests ROOT
[--write-deploy]` with PYTHONPATH=scripts; `--self-test` runs the unit tests in
manifests/tests instead. One module per group of checks:

  report      the ok/FAIL/note lines, the failures and counts
  common      the repository's paths (Tree) and YAML helpers
  crd         the CRD copies and the Provisioner schema derived from the CRD
  validate    kubernetes-validate (strict) and the CRD schema for Provisioners
  rbac        RBAC least privilege and Pod Security "restricted"
  monitoring  the Grafana dashboard and the PrometheusRule
  chart       helm lint and render of the chart, its variants and refused values
  deploy      deploy/ as the chart's default render
  book        the book's Kubernetes examples and the alerts' runbooks
  readme      the chart's README: its alert and RBAC tables against the render
  image       scripts/image-contract.env, the Dockerfile and .dockerignore
  __main__    the order the checks run in, the summary and the exit status
"""
