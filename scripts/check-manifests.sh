#!/usr/bin/env bash
# Checks the Kubernetes manifests without a cluster, helm binary or network
# (after the first run): the Helm chart in charts/choria-provisioner-operator and
# the plain manifests in deploy/.
#
#   scripts/check-manifests.sh                 check; exit 1 on any failure
#   scripts/check-manifests.sh --write-deploy  regenerate deploy/crd.yaml,
#       deploy/rbac.yaml, deploy/operator.yaml and the chart's CRD copy from
#       crds/provisioner.yaml and the chart's default render, then check
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
#      its final stage and the image contract block of scripts/build-image.sh
#      (which builds the image here from Debian packages, no registry) agree on
#      user, entrypoint, cmd, workdir, HOME, binary path, packages and labels;
#      its version is Cargo.toml's and deploy/ names that image. No image is
#      built here (scripts/image-smoke.sh builds one and checks it);
#   7. the book: every Kubernetes object under docs/src/examples/ validates as
#      in 3 (cert-manager's kinds have no schema there and are skipped with a
#      note), and every alert the chart's PrometheusRule ships has its runbook,
#      a `## <alert>` section of docs/src/operations/alerts.md.
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

exec "$VENV/bin/python" - "$ROOT" "$@" <<'PYTHON'
import copy
import difflib
import fnmatch
import functools
import json
import os
import re
import sys
from importlib.metadata import version

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kv
import yaml

# kubernetes-validate reads and parses its JSON schemas (several MB) on every
# call; they do not change, so read each once.
kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)

import helm_python as helm  # noqa: E402

ROOT = sys.argv[1]
WRITE = "--write-deploy" in sys.argv[2:]
for arg in sys.argv[2:]:
    if arg != "--write-deploy":
        sys.exit(f"check-manifests: unknown argument {arg}")

CHART = os.path.join(ROOT, "charts", "choria-provisioner-operator")
CHART_CRD = os.path.join(CHART, "files", "crds", "provisioner.yaml")
CHART_DASHBOARD = os.path.join(CHART, "dashboards", "choria-provisioner.json")
OUR_DASHBOARD = os.path.join(CHART, "dashboards", "choria-provisioner-day-two.json")
UPSTREAM_DASHBOARD = os.path.join(ROOT, "..", "shared", "peers", "go-provisioner", "dashboard.json")
CRD_SRC = os.path.join(ROOT, "crds", "provisioner.yaml")
DEPLOY = os.path.join(ROOT, "deploy")
BOOK_EXAMPLES = os.path.join(ROOT, "docs", "src", "examples")
BOOK_ALERTS = os.path.join(ROOT, "docs", "src", "operations", "alerts.md")
KUBE = "1.34"
NAMESPACE = "choria-provisioner"
RELEASE = "choria-provisioner-operator"
LEASE = "choria-provisioner-operator"

failures = []
counts = {"validated": 0, "crs": 0, "skipped": 0}


def ok(msg):
    print(f"  ok    {msg}")


def fail(msg):
    failures.append(msg)
    print(f"  FAIL  {msg}")


def check(cond, msg):
    if cond:
        ok(msg)
    else:
        fail(msg)
    return cond


def section(title):
    print(f"\n== {title}")


def rel(path):
    return os.path.relpath(path, ROOT)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def kn(doc):
    ns = doc.get("metadata", {}).get("namespace")
    name = doc.get("metadata", {}).get("name", "?")
    return f"{doc.get('kind', '?')}/{ns + '/' if ns else ''}{name}"


# ---------------------------------------------------------------------------
# The CRD: source, copies, and the Provisioner schema derived from it.

def provisioner_schema():
    """The stored version's openAPIV3Schema as JSON Schema, for Provisioner objects."""
    if not os.path.exists(CRD_SRC):
        return None
    crd = load_docs(read(CRD_SRC))[0]
    versions = crd["spec"]["versions"]
    stored = next((v for v in versions if v.get("storage")), versions[0])

    def strip(node):
        # OpenAPI extensions out; and, as kubectl's strict field validation does,
        # unknown fields refused wherever the schema does not preserve them.
        if isinstance(node, dict):
            out = {k: strip(v) for k, v in node.items()
                   if k != "nullable" and not k.startswith("x-kubernetes-")}
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                out["additionalProperties"] = False
            return out
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    schema = strip(stored["schema"]["openAPIV3Schema"])
    # The apiserver fills apiVersion/kind/metadata itself; check them here.
    group = crd["spec"]["group"]
    schema.setdefault("properties", {})
    schema["properties"]["apiVersion"] = {"const": f"{group}/{stored['name']}"}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                "maxLength": 63}},
    }
    schema.setdefault("required", [])
    schema["required"] = sorted(set(schema["required"]) | {"apiVersion", "kind", "metadata"})
    return schema


PROV_SCHEMA = None


def validate_doc(doc, where):
    """kubernetes-validate strict for built-in kinds; the CRD schema for Provisioner."""
    kind = doc.get("kind")
    if kind in ("ServiceMonitor", "PrometheusRule"):
        counts["skipped"] += 1
        print(f"  note  {where}: {kn(doc)} skipped (monitoring.coreos.com has no schema in kubernetes-validate)")
        return
    if kind == "Provisioner":
        if PROV_SCHEMA is None:
            fail(f"{where}: {kn(doc)} cannot be validated: {rel(CRD_SRC)} is missing")
            return
        errors = sorted(jsonschema.Draft7Validator(PROV_SCHEMA).iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            for e in errors:
                fail(f"{where}: {kn(doc)}: {'.'.join(map(str, e.path)) or '<root>'}: {e.message}")
        else:
            counts["crs"] += 1
            ok(f"{where}: {kn(doc)} valid against the CRD's openAPIV3Schema")
        return
    try:
        kubernetes_validate.validate(doc, KUBE, strict=True)
        counts["validated"] += 1
        return kn(doc)
    except kv.ValidationError as e:
        fail(f"{where}: {kn(doc)}: {'.'.join(map(str, e.path))}: {e.message}")
    except kv.SchemaNotFoundError as e:
        fail(f"{where}: {e.message}")


def validate_all(docs, where):
    valid = [v for v in (validate_doc(d, where) for d in docs) if v]
    if valid:
        ok(f"{where}: {len(valid)} valid: {', '.join(sorted(v.split('/')[0] for v in valid))}")


# ---------------------------------------------------------------------------
# Rendering.

def render(values):
    with helm.Chart.load(CHART) as ch:
        out = ch.render(values, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for path in sorted(out):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(load_docs(out[path]))
    return docs, out


def find(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def deployment_args(docs):
    dep = find(docs, "Deployment")
    return dep[0]["spec"]["template"]["spec"]["containers"][0].get("args", []) if dep else []


# What the Roles built by the operator for provisioner pods grant
# (src/operator/build/rbac.rs): the operator may only create them while holding the
# same permissions itself.
DELEGATED = [
    ("provisioning.choria.io", "provisioners", {"get", "list", "watch"}),
    ("provisioning.choria.io", "provisioners/status", {"patch"}),
]
# What the operator itself does, cluster-wide (or in the watched namespace).
NEEDED = DELEGATED + [
    ("", "configmaps", {"get", "list", "watch", "create", "patch"}),
    ("", "services", {"get", "list", "watch", "create", "patch"}),
    ("", "serviceaccounts", {"get", "list", "watch", "create", "patch"}),
    ("apps", "deployments", {"get", "list", "watch", "create", "patch"}),
    ("policy", "poddisruptionbudgets", {"get", "list", "watch", "create", "patch", "delete"}),
    ("rbac.authorization.k8s.io", "roles", {"get", "list", "watch", "create", "patch"}),
    ("rbac.authorization.k8s.io", "rolebindings", {"get", "list", "watch", "create", "patch"}),
    ("events.k8s.io", "events", {"create", "patch"}),
    # The signing key Secret of a Provisioner whose spec names none: create
    # only, never read.
    ("", "secrets", {"create"}),
]
# The ClusterRole for the admission policy bounding provisioner pods'
# CertificateRequests (src/operator/admission.rs): create, and get/patch of
# exactly that policy and its binding.
ADMISSION_SUFFIX = "-pod-certificaterequests"
ADMISSION_RESOURCES = ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]
# The ClusterRoles the operator binds to provisioner pods (suffix of the release's
# full name -> the one rule they hold), holding only `bind` on them by name.
POD_CLUSTER_ROLES = {
    "-leases": ("coordination.k8s.io", "leases", {"get", "list", "create", "update", "delete"}),
    "-certificaterequests": ("cert-manager.io", "certificaterequests", {"create", "list", "watch", "delete"}),
}
POD_ROLE_FLAGS = {"-leases": "--lease-cluster-role", "-certificaterequests": "--cert-manager-cluster-role"}


def granted(rules, group, resource):
    verbs = set()
    for r in rules:
        if r.get("resourceNames"):
            continue
        if group in r.get("apiGroups", []) and resource in r.get("resources", []):
            verbs |= set(r.get("verbs", []))
    return verbs


def rbac_problems(docs):
    problems = []
    for d in docs:
        for r in d.get("rules", []) if d["kind"] in ("ClusterRole", "Role") else []:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                if any("*" in str(x) for x in r.get(key, [])):
                    problems.append(f"{kn(d)} has a wildcard in {key}: {r}")
    roles = find(docs, "ClusterRole")
    # The operator's ClusterRole is the one that binds the others.
    own = [r for r in roles if any("bind" in x.get("verbs", []) for x in r["rules"])]
    if roles and len(own) != 1:
        return problems + [f"{len(own)} ClusterRoles with a bind rule, want the operator's one"]
    if own:
        rules = own[0]["rules"]
        fullname = own[0]["metadata"]["name"]
        for g, res, v in NEEDED:
            if v - granted(rules, g, res):
                problems.append(f"ClusterRole lacks {sorted(v - granted(rules, g, res))} on {g or 'core'}/{res}")
        # Least privilege both ways: nothing beyond what is needed.
        allowed = {(g, res): v for g, res, v in NEEDED}
        pod_roles = sorted(fullname + suffix for suffix in POD_CLUSTER_ROLES)
        for r in rules:
            if r.get("resources") == ["clusterroles"]:
                if r.get("verbs") != ["bind"] or sorted(r.get("resourceNames", [])) != pod_roles:
                    problems.append(f"the operator's clusterroles rule is not bind on exactly {pod_roles}: {r}")
                continue
            for g in r.get("apiGroups", []):
                for res in r.get("resources", []):
                    extra = set(r.get("verbs", [])) - allowed.get((g, res), set())
                    if extra:
                        problems.append(f"ClusterRole grants more than needed: {sorted(extra)} on {g or 'core'}/{res}")
        args = deployment_args(docs)
        for suffix, (g, res, verbs) in POD_CLUSTER_ROLES.items():
            name = fullname + suffix
            found = find(docs, "ClusterRole", name)
            want = [{"apiGroups": [g], "resources": [res], "verbs": sorted(verbs)}]
            have = [dict(r, verbs=sorted(r.get("verbs", []))) for r in found[0]["rules"]] if found else None
            if have != want:
                problems.append(f"ClusterRole {name} holds {have}, want exactly {want}")
            if args and f"{POD_ROLE_FLAGS[suffix]}={name}" not in args:
                problems.append(f"the operator is not told {POD_ROLE_FLAGS[suffix]}={name}: {args}")
        name = fullname + ADMISSION_SUFFIX
        found = find(docs, "ClusterRole", name)
        want = [
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ADMISSION_RESOURCES, "verbs": ["create"]},
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ADMISSION_RESOURCES,
             "resourceNames": [name], "verbs": ["get", "patch"]},
        ]
        have = [dict(r, verbs=sorted(r.get("verbs", []))) for r in found[0]["rules"]] if found else None
        if have != want:
            problems.append(f"ClusterRole {name} holds {have}, want exactly {want}")
        if args and f"--admission-policy={name}" not in args:
            problems.append(f"the operator is not told --admission-policy={name}: {args}")
    for role in find(docs, "Role"):
        r = role["rules"]
        own_lease = [x for x in r if LEASE in x.get("resourceNames", [])]
        if not (any("create" in x["verbs"] for x in r) and own_lease and {"get", "update"} <= set(own_lease[0]["verbs"])):
            problems.append(f"{kn(role)} does not cover the operator's own Lease {LEASE}")
    return problems


def security_problems(docs):
    problems = []
    for dep in find(docs, "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        pod = spec.get("securityContext", {})
        if pod.get("runAsNonRoot") is not True:
            problems.append("pod runAsNonRoot")
        if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append("pod seccompProfile RuntimeDefault")
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{c['name']} allowPrivilegeEscalation false")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{c['name']} readOnlyRootFilesystem")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                problems.append(f"{c['name']} drop ALL")
            if (sc.get("runAsUser", pod.get("runAsUser")) or 0) == 0:
                problems.append(f"{c['name']} non-root UID")
    return [f"Pod Security 'restricted' not met: {p}" for p in problems]


def kinds(docs):
    return sorted({d["kind"] for d in docs})


def dashboard_problems(docs, label="grafana_dashboard", value="1", namespace=NAMESPACE, datasource="Prometheus"):
    """The Grafana dashboard ConfigMap: the sidecar's label, and the chart's JSON with
    ${DS_PROMETHEUS} replaced by the data source (kept when that is empty)."""
    cms = find(docs, "ConfigMap")
    if len(cms) != 1:
        return [f"{len(cms)} ConfigMaps, want the dashboard's only"]
    cm, problems = cms[0], []
    if (cm["metadata"].get("labels") or {}).get(label) != value:
        problems.append(f"{kn(cm)} lacks the label {label}: {value!r}")
    if cm["metadata"].get("namespace") != namespace:
        problems.append(f"{kn(cm)} is not in namespace {namespace}")
    data = cm.get("data") or {}
    files = {"choria-provisioner.json": CHART_DASHBOARD, "choria-provisioner-day-two.json": OUR_DASHBOARD}
    if sorted(data) != sorted(files):
        return problems + [f"{kn(cm)} data keys {list(data)}"]
    for key, path in files.items():
        try:
            dashboard = json.loads(data[key])
        except ValueError as e:
            problems.append(f"{kn(cm)}: {key} is not JSON: {e}")
            continue
        shipped = read(path)
        if datasource:
            shipped = shipped.replace('"${DS_PROMETHEUS}"', json.dumps(datasource))
        if not dashboard.get("panels"):
            problems.append(f"{kn(cm)}: {key} has no panels")
        if dashboard != json.loads(shipped):
            problems.append(f"{kn(cm)}: {key} is not {rel(path)} with datasource {datasource!r}")
    return problems


RULE_ALERTS = ["ChoriaProvisionerNoLeader", "ChoriaProvisionerElectionErrors",
               "ChoriaProvisionerHelperErrors", "ChoriaProvisionerProvisionErrors",
               "ChoriaProvisionerRenewalFailing", "ChoriaProvisionerRenewalStranded"]


def rule_problems(docs, alerts=RULE_ALERTS, labels=None, expr_has=None):
    """The PrometheusRule: exactly these alerts, each with an expr over our metrics,
    a for, a severity and both annotations; expr_has: alert -> substrings."""
    rules = find(docs, "PrometheusRule")
    if len(rules) != 1:
        return [f"{len(rules)} PrometheusRules, want 1"]
    pr, problems = rules[0], []
    for k, v in (labels or {}).items():
        if (pr["metadata"].get("labels") or {}).get(k) != v:
            problems.append(f"{kn(pr)} lacks the label {k}: {v}")
    got = [r for g in pr["spec"]["groups"] for r in (g.get("rules") or [])]
    if [r.get("alert") for r in got] != alerts:
        problems.append(f"{kn(pr)} alerts {[r.get('alert') for r in got]}, want {alerts}")
    # The provisioner's metric names, as src/provision/metrics.rs registers them.
    ours = set(re.findall(r'"(choria_provisioner_[a-z_]+)"', read(os.path.join(ROOT, "crates", "core", "src", "provision", "metrics.rs"))))
    for r in got:
        expr = str(r.get("expr") or "").strip()
        used = set(re.findall(r"choria_provisioner_[a-z_]+", expr))
        if not used:
            problems.append(f"{r.get('alert')}: expr {expr!r} reads none of our metrics")
        elif used - ours:
            problems.append(f"{r.get('alert')}: {sorted(used - ours)} are not metrics of crates/core/src/provision/metrics.rs")
        for part in (expr_has or {}).get(r.get("alert"), []):
            if part not in expr:
                problems.append(f"{r.get('alert')}: expr {expr!r} lacks {part!r}")
        if not r.get("for") or not (r.get("labels") or {}).get("severity"):
            problems.append(f"{r.get('alert')}: no for or no severity")
        if not all((r.get("annotations") or {}).get(a) for a in ("summary", "description")):
            problems.append(f"{r.get('alert')}: no summary or description")
    return problems


def no_problems(problems, msg):
    for p in problems:
        fail(f"{msg}: {p}")
    if not problems:
        ok(msg)


BASE_KINDS = ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
              "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"]

VARIANTS = [
    ("default", {}, lambda d: check(kinds(d) == BASE_KINDS, f"default: objects {kinds(d)} "
                                    "(no dashboard ConfigMap, no PrometheusRule, no ServiceMonitor)")),
    ("serviceMonitor", {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
     lambda d: check(len(find(d, "ServiceMonitor")) == 1
                     and find(d, "ServiceMonitor")[0]["spec"]["endpoints"][0]["port"] == "metrics",
                     "serviceMonitor: one ServiceMonitor scraping port 'metrics'")),
    ("grafanaDashboard", {"grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Choria"}}},
     lambda d: no_problems(dashboard_problems(d), "grafanaDashboard: a ConfigMap labelled grafana_dashboard=1 "
                           "with the chart's dashboard, data source Prometheus")),
    ("grafanaDashboard-custom", {"grafanaDashboard": {"enabled": True, "label": "grafana.example.net/dashboard",
                                                      "labelValue": "choria", "namespace": "monitoring",
                                                      "datasource": ""}},
     lambda d: no_problems(dashboard_problems(d, "grafana.example.net/dashboard", "choria", "monitoring", ""),
                           "grafanaDashboard-custom: own label and namespace, ${DS_PROMETHEUS} kept")),
    ("prometheusRule", {"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}},
     lambda d: no_problems(rule_problems(d, labels={"release": "prometheus"}, expr_has={
         "ChoriaProvisionerNoLeader": ["choria_provisioner_leader", "choria_provisioner_paused"],
         "ChoriaProvisionerProvisionErrors": ["increase(choria_provisioner_provision_errors[15m])", "> 0"],
         "ChoriaProvisionerElectionErrors": ["increase(choria_provisioner_election_errors[10m])"],
         "ChoriaProvisionerHelperErrors": ["increase(choria_provisioner_helper_errors[15m])"],
         "ChoriaProvisionerRenewalFailing": ["choria_provisioner_renewals_due) > 0",
                                             'increase(choria_provisioner_renewals{outcome!="sent"}[30m])',
                                             'unless on', 'increase(choria_provisioner_renewals{outcome="sent"}[30m])'],
         "ChoriaProvisionerRenewalStranded": ["choria_provisioner_renewals_stranded) > 0"]}),
         "prometheusRule: a PrometheusRule with the six alerts over our metrics")),
    ("prometheusRule-scoped", {"watchNamespace": "choria", "prometheusRule": {"enabled": True, "alerts": {
        "noLeader": {"enabled": False}, "helperErrors": {"window": "30m", "threshold": 3}}}},
     lambda d: no_problems(rule_problems(d, RULE_ALERTS[1:], expr_has={
         "ChoriaProvisionerElectionErrors": ['election_errors{namespace="choria"}[10m]'],
         "ChoriaProvisionerHelperErrors": ['helper_errors{namespace="choria"}[30m]', "> 3"],
         "ChoriaProvisionerProvisionErrors": ['provision_errors{namespace="choria"}[15m]'],
         "ChoriaProvisionerRenewalFailing": ['renewals_due{namespace="choria"}',
                                             'renewals{namespace="choria",outcome!="sent"}[30m]'],
         "ChoriaProvisionerRenewalStranded": ['renewals_stranded{namespace="choria"}']}),
         "prometheusRule-scoped: queries limited to watchNamespace, noLeader off, helper threshold 3 over 30m")),
    ("policy", {"policy": {"allowedImages": ["registry.example.net/choria-provisioner:*"],
                           "allowedClusterIssuers": ["corp-ca", "AWSPCAClusterIssuer.awspca.cert-manager.io/pca"],
                           "allowedUsages": ["client auth", "server auth"]}},
     lambda d: check([a for a in deployment_args(d) if a.startswith(("--image", "--allowed-"))] == [
         "--image=choria-provisioner:0.1.0",
         "--allowed-image=registry.example.net/choria-provisioner:*",
         "--allowed-cluster-issuer=corp-ca",
         "--allowed-cluster-issuer=AWSPCAClusterIssuer.awspca.cert-manager.io/pca",
         "--allowed-usage=client auth", "--allowed-usage=server auth"],
         "policy: --image, --allowed-image, --allowed-cluster-issuer and --allowed-usage from policy")),
    ("single", {"replicas": 1, "leaderElection": {"enabled": False}},
     lambda d: check(not find(d, "PodDisruptionBudget") and not find(d, "Role")
                     and "--leader-election=false" in deployment_args(d),
                     "single: no PDB, no Lease Role, --leader-election=false")),
    ("single-elected", {"replicas": 1},
     lambda d: check(not find(d, "PodDisruptionBudget") and find(d, "Role"),
                     "single-elected: no PDB with one replica, Lease Role kept")),
    ("pdb-3", {"replicas": 3, "podDisruptionBudget": {"minAvailable": 2}},
     lambda d: check([(p["spec"]["minAvailable"], p["spec"].get("unhealthyPodEvictionPolicy"))
                      for p in find(d, "PodDisruptionBudget")] == [(2, "AlwaysAllow")],
                     "pdb-3: PDB minAvailable 2, unhealthy pods always evictable")),
    ("pdb-off", {"podDisruptionBudget": {"enabled": False}},
     lambda d: check(not find(d, "PodDisruptionBudget"), "pdb-off: no PDB")),
    ("watchNamespace", {"watchNamespace": "choria"},
     lambda d: check([b["metadata"]["name"] for b in find(d, "ClusterRoleBinding")]
                     == ["choria-provisioner-operator" + ADMISSION_SUFFIX]
                     and any(b["metadata"].get("namespace") == "choria" and b["roleRef"]["kind"] == "ClusterRole"
                             for b in find(d, "RoleBinding"))
                     and "--namespace=choria" in deployment_args(d)
                     and [r["metadata"]["namespace"] for r in find(d, "Role")] == ["choria"],
                     "watchNamespace: RoleBinding in 'choria' instead of a ClusterRoleBinding (but the "
                     "admission policy's, cluster-scoped), "
                     "--namespace=choria, Lease Role in 'choria' (the operator keeps its Lease there)")),
    ("crds-off", {"crds": {"install": False}},
     lambda d: check(not find(d, "CustomResourceDefinition"), "crds-off: no CRD")),
    ("crds-not-kept", {"crds": {"keep": False}},
     lambda d: check(all("helm.sh/resource-policy" not in (c["metadata"].get("annotations") or {})
                         for c in find(d, "CustomResourceDefinition")), "crds-not-kept: no resource-policy")),
    ("digest", {"image": {"repository": "registry.example.net/choria-provisioner", "digest": "sha256:" + "a" * 64}},
     lambda d: check(find(d, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["image"]
                     == "registry.example.net/choria-provisioner@sha256:" + "a" * 64, "digest: image by digest")),
]

# Values that must be refused (values.schema.json or the templates' own checks).
REFUSED = [
    ("replicas: two", {"replicas": "two"}),
    ("replicas: 0", {"replicas": 0}),
    ("2 replicas without leader election", {"replicas": 2, "leaderElection": {"enabled": False}}),
    ("unknown key", {"replica": 2}),
    ("unknown key usage", {"policy": {"allowedUsages": ["everything"]}}),
    ("cluster issuer with a space", {"policy": {"allowedClusterIssuers": ["corp ca"]}}),
    ("allowed image list in one string", {"policy": {"allowedImages": ["a:1,b:2"]}}),
    ("bad logFormat", {"logFormat": "xml"}),
    ("bad watchNamespace", {"watchNamespace": "Not_A_Namespace"}),
    ("grafanaDashboard.enabled: yes", {"grafanaDashboard": {"enabled": "yes"}}),
    ("bad grafanaDashboard.label", {"grafanaDashboard": {"label": "not a label"}}),
    ("prometheusRule duration", {"prometheusRule": {"alerts": {"noLeader": {"for": "five minutes"}}}}),
    ("prometheusRule negative threshold", {"prometheusRule": {"alerts": {"helperErrors": {"threshold": -1}}}}),
    ("prometheusRule selector in braces", {"prometheusRule": {"selector": '{namespace="choria"}'}}),
    ("unknown prometheusRule alert", {"prometheusRule": {"alerts": {"noleader": {"enabled": False}}}}),
]


INFOS = set()


def lint(values, label):
    res = helm.lint(CHART, strict=True, kube_version=f"v{KUBE}.0", values=values)
    msgs = res.get("messages", [])
    for m in msgs:
        info = f"{m['path']}: {m['error'].strip()}"
        if m["severity"] <= 1 and info not in INFOS:
            INFOS.add(info)
            print(f"  info  lint (not a failure): {info}")
    bad = [m for m in msgs if m["severity"] > 1] + [{"path": "", "error": e} for e in res.get("errors", [])]
    return bad


# ---------------------------------------------------------------------------
# deploy/ as the chart's default render, without Helm's bookkeeping.

HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
DEPLOY_FILES = {
    "rbac.yaml": ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"],
    "operator.yaml": ["Deployment", "Service", "PodDisruptionBudget"],
}


def plain(doc):
    doc = copy.deepcopy(doc)
    md = doc.get("metadata", {})
    for key in HELM_LABELS:
        (md.get("labels") or {}).pop(key, None)
    return doc


class Dumper(yaml.SafeDumper):
    def increase_indent(self, flow=False, indentless=False):  # indent lists under their key
        return super().increase_indent(flow, False)


def _list(dumper, data):
    # Short lists of strings (RBAC verbs, args) on one line, as people write them.
    flow = bool(data) and all(isinstance(x, str) for x in data) and sum(len(x) + 4 for x in data) < 80
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


Dumper.add_representer(list, _list)


def dump(docs):
    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)
                        for d in docs)


def expected_deploy(default_docs):
    out = {}
    for name, order in DEPLOY_FILES.items():
        out[name] = [plain(d) for k in order for d in default_docs if d["kind"] == k]
    return out


HEADER = ("# Generated by scripts/check-manifests.sh --write-deploy from the Helm chart\n"
          "# charts/choria-provisioner-operator (default values, namespace choria-provisioner).\n"
          "# Edit the chart, not this file; scripts/check-manifests.sh fails when they differ.\n")


def write_deploy(default_docs):
    section("--write-deploy")
    for name, docs in expected_deploy(default_docs).items():
        path = os.path.join(DEPLOY, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(HEADER + "---\n" + dump(docs))
        print(f"  wrote {rel(path)} ({', '.join(kn(d) for d in docs)})")


def check_dockerfile():
    import dockerfile
    try:
        cmds = dockerfile.parse_file(os.path.join(ROOT, "Dockerfile"))
    except dockerfile.GoParseError as e:
        fail(f"Dockerfile does not parse: {e}")
        return
    ok(f"Dockerfile parses ({len(cmds)} instructions, {sum(c.cmd == 'FROM' for c in cmds)} stages)")
    last = max(i for i, c in enumerate(cmds) if c.cmd == "FROM")
    final = cmds[last:]
    user = [c.value[0] for c in final if c.cmd == "USER"]
    check(user and user[-1].split(":")[0] == "65532", f"final stage runs as UID 65532 (USER {user[-1] if user else '-'})")
    entry = [c for c in final if c.cmd == "ENTRYPOINT"]
    check(entry and entry[-1].json
          and list(entry[-1].value) == ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"],
          'ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"] (tini reaps escaped helpers)')
    installs = " ".join(" ".join(c.value) for c in final if c.cmd == "RUN")
    check(re.search(r"apt-get install[^&]*\btini\b", installs) is not None,
          "the final stage installs tini (Debian package) for its ENTRYPOINT")
    # .dockerignore: "*" then "!path" exceptions; every context COPY source must be let in.
    rules = [line.strip() for line in read(os.path.join(ROOT, ".dockerignore")).splitlines()
             if line.strip() and not line.startswith("#")]

    def included(path):
        keep = True
        for r in rules:
            neg = r.startswith("!")
            pat = r[1:].rstrip("/") if neg else r.rstrip("/")
            if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
                keep = neg
        return keep

    sources = [v for c in cmds if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags)
               for v in c.value[:-1]]
    missing = [s for s in sources if not included(s) or not os.path.exists(os.path.join(ROOT, s))]
    check(not missing, f"COPY sources exist and pass .dockerignore: {', '.join(sources)}"
          + (f" (not: {missing})" if missing else ""))
    check_image_contract(cmds, final)


BUILD_IMAGE = os.path.join(ROOT, "scripts", "build-image.sh")


def image_contract():
    """The values scripts/build-image.sh declares between its `# >>> image
    contract` and `# <<< image contract` lines (NAME='literal' only)."""
    import shlex
    m = re.search(r"^# >>> image contract\n(.*?)^# <<< image contract$", read(BUILD_IMAGE), re.M | re.S)
    if not m:
        fail(f"{rel(BUILD_IMAGE)} has no '# >>> image contract' ... '# <<< image contract' block")
        return None
    values = {}
    for line in m.group(1).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kv_ = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", line)
        words = shlex.split(kv_.group(2)) if kv_ else []
        if not kv_ or len(words) != 1 or "$" in kv_.group(2):
            fail(f"{rel(BUILD_IMAGE)} image contract: not a NAME='literal' line: {line}")
            continue
        values[kv_.group(1)] = words[0]
    return values


def check_image_contract(cmds, final):
    """The image scripts/build-image.sh makes without a registry and the
    Dockerfile's final stage promise the same user, entrypoint, cmd, workdir,
    HOME, binary path, packages and labels (scripts/image-smoke.sh then holds
    the built image to the same block)."""
    c = image_contract()
    if c is None:
        return
    need = ["IMAGE_NAME", "IMAGE_USER", "IMAGE_USER_NAME", "IMAGE_HOME", "IMAGE_WORKDIR", "IMAGE_BINARY",
            "IMAGE_ENTRYPOINT", "IMAGE_CMD", "IMAGE_PACKAGES", "IMAGE_TITLE", "IMAGE_DESCRIPTION", "IMAGE_LICENSES"]
    missing = [k for k in need if k not in c]
    if not check(not missing, f"{rel(BUILD_IMAGE)} declares the image contract ({len(c)} values)"
                 + (f"; missing {missing}" if missing else "")):
        return
    who = f"Dockerfile and {rel(BUILD_IMAGE)}"

    def agree(what, dockerfile, want):
        return check(dockerfile == want, f"{who} agree: {what}"
                     + ("" if dockerfile == want else f" (Dockerfile: {dockerfile})"))

    def last(cmd):
        found = [x for x in final if x.cmd == cmd]
        return found[-1] if found else None

    user = last("USER")
    agree(f"USER {c['IMAGE_USER']}", user.value[0] if user else None, c["IMAGE_USER"])
    for cmd, key in (("ENTRYPOINT", "IMAGE_ENTRYPOINT"), ("CMD", "IMAGE_CMD")):
        x = last(cmd)
        try:
            want = json.loads(c[key])
        except ValueError:
            fail(f"{rel(BUILD_IMAGE)}: {key} is not a JSON list: {c[key]}")
            continue
        agree(f"{cmd} {json.dumps(want)}", list(x.value) if x is not None and x.json else None, want)
    workdir = last("WORKDIR")
    agree(f"WORKDIR {c['IMAGE_WORKDIR']}", workdir.value[0] if workdir else None, c["IMAGE_WORKDIR"])
    env = {}
    for x in final:
        if x.cmd == "ENV":
            env.update(zip(x.value[::2], x.value[1::2]))
    agree(f"ENV HOME={c['IMAGE_HOME']}", env.get("HOME"), c["IMAGE_HOME"])
    dest = [x.value[-1] for x in final if x.cmd == "COPY" and any(f.startswith("--from=") for f in x.flags)]
    agree(f"the binary at {c['IMAGE_BINARY']}", dest, [c["IMAGE_BINARY"]])
    try:
        check(json.loads(c["IMAGE_ENTRYPOINT"])[-1] == c["IMAGE_BINARY"],
              f"{rel(BUILD_IMAGE)}: the entrypoint ends in the binary {c['IMAGE_BINARY']}")
    except (ValueError, IndexError):
        pass
    runs = " && ".join(" ".join(x.value) for x in final if x.cmd == "RUN")
    installed = set()
    for m in re.finditer(r"apt-get install((?:\s+[^&;|\s]+)*)", runs):
        installed.update(w for w in m.group(1).split() if not w.startswith("-"))
    want = set(c["IMAGE_PACKAGES"].split())
    agree(f"packages {' '.join(sorted(want))}", " ".join(sorted(installed)), " ".join(sorted(want)))
    uid, _, gid = c["IMAGE_USER"].partition(":")
    useradd = re.search(r"useradd\s[^&;|]*", runs)
    ua = useradd.group(0).split() if useradd else []

    def opt(name):
        return ua[ua.index(name) + 1] if name in ua and ua.index(name) + 1 < len(ua) else None
    agree(f"user {c['IMAGE_USER_NAME']} {uid}:{gid} with home {c['IMAGE_HOME']}",
          ' '.join(ua) if ua else None,
          ' '.join(ua) if ua and (opt("--uid"), opt("--gid"), opt("--home-dir"), ua[-1])
          == (uid, gid, c["IMAGE_HOME"], c["IMAGE_USER_NAME"]) else "a useradd line with these values")
    labels = {}
    for x in final:
        if x.cmd == "LABEL":
            labels.update((k, v.strip('"')) for k, v in zip(x.value[::2], x.value[1::2]))
    for key, label in (("IMAGE_TITLE", "title"), ("IMAGE_DESCRIPTION", "description"), ("IMAGE_LICENSES", "licenses")):
        have = labels.get(f"org.opencontainers.image.{label}")
        agree(f"label org.opencontainers.image.{label}", have, c[key])
    # The version: Cargo.toml's (build-image.sh labels and tags with it), the
    # Dockerfile's ARG VERSION default, and the image the manifests name.
    cargo = re.search(r'^\[workspace\.package\]\n(?:[^\[].*\n)*?version\s*=\s*"([^"]+)"', read(os.path.join(ROOT, "Cargo.toml")), re.M)
    cargo = cargo.group(1) if cargo else None
    args = [v for x in final if x.cmd == "ARG" for v in x.value if v.startswith("VERSION=")]
    check(labels.get("org.opencontainers.image.version") == "${VERSION}" and args == [f"VERSION={cargo}"],
          f"Dockerfile: label version ${{VERSION}} with ARG VERSION={cargo}, Cargo.toml's version"
          + ("" if args == [f"VERSION={cargo}"] else f" (found {args})"))
    tag = f"{c['IMAGE_NAME']}:{cargo}"
    named = []
    for f in ("operator.yaml", "example-provisioner.yaml"):
        for d in load_docs(read(os.path.join(DEPLOY, f))):
            if d.get("kind") == "Deployment":
                named += [(f, k["image"]) for k in d["spec"]["template"]["spec"]["containers"]]
            elif d.get("kind") == "Provisioner":
                named.append((f, d.get("spec", {}).get("image")))
    wrong = [f"deploy/{f}: {i}" for f, i in named if i != tag]
    check(bool(named) and not wrong, f"deploy/ names the image build-image.sh tags, {tag}"
          + (f" (not: {wrong})" if wrong else ""))


# ---------------------------------------------------------------------------

def main():
    global PROV_SCHEMA
    print(f"helm-python-sdk {helm.helm_c_version()} (Helm SDK {helm.helm_sdk_version()}), "
          f"kubernetes-validate {version('kubernetes-validate')} (schemas for Kubernetes {KUBE}), "
          f"jsonschema {version('jsonschema')}")

    section("CRD copies")
    if check(os.path.exists(CRD_SRC), f"{rel(CRD_SRC)} exists (committed output of `choria-provisioner crd`)"):
        PROV_SCHEMA = provisioner_schema()
        src = read(CRD_SRC)
        for dst in (CHART_CRD, os.path.join(DEPLOY, "crd.yaml")):
            if WRITE:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with open(dst, "w", encoding="utf-8") as f:
                    f.write(src)
                print(f"  wrote {rel(dst)}")
            same = os.path.exists(dst) and read(dst) == src
            check(same, f"{rel(dst)} is identical to {rel(CRD_SRC)}" if same else
                  f"{rel(dst)} differs from {rel(CRD_SRC)} (refresh: scripts/check-manifests.sh --write-deploy)")

    section("Grafana dashboard copy")
    if check(os.path.exists(CHART_DASHBOARD), f"{rel(CHART_DASHBOARD)} exists"):
        try:
            check(bool(json.loads(read(CHART_DASHBOARD)).get("panels")), f"{rel(CHART_DASHBOARD)} is JSON with panels")
        except ValueError as e:
            fail(f"{rel(CHART_DASHBOARD)} is not JSON: {e}")
        if os.path.exists(UPSTREAM_DASHBOARD):
            check(read(CHART_DASHBOARD) == read(UPSTREAM_DASHBOARD),
                  f"{rel(CHART_DASHBOARD)} is the Go provisioner's dashboard.json unchanged")
        else:
            print(f"  note  {os.path.normpath(UPSTREAM_DASHBOARD)} absent: copy not compared with upstream")

    section(f"helm lint --strict (kube {KUBE})")
    for label, values, _ in VARIANTS:
        bad = lint(values, label)
        check(not bad, f"lint {label}" + (": " + "; ".join(f"{m['path']}: {m['error'].strip()}" for m in bad) if bad else ""))
    for label, values in REFUSED:
        bad = lint(values, label)
        check(bool(bad), f"refused: {label}" + (f" ({bad[0]['error'].strip().splitlines()[-1]})" if bad else " -- was accepted"))

    section("render variants")
    rendered = {}
    for label, values, expect in VARIANTS:
        try:
            docs, _ = render(values)
        except helm.HelmError as e:
            fail(f"render {label}: {e}")
            continue
        rendered[label] = docs
        expect(docs)
        problems = rbac_problems(docs) + security_problems(docs)
        for p in problems:
            fail(f"{label}: {p}")
        if not problems:
            ok(f"{label}: RBAC without wildcards, holds what the operator does and delegates; "
               "own Lease covered; pod security 'restricted'")
        crds = find(docs, "CustomResourceDefinition")
        if label == "default" and crds and PROV_SCHEMA is not None:
            c = copy.deepcopy(crds[0])
            for key in ("labels", "annotations"):
                c["metadata"].pop(key, None)
            s = load_docs(read(CRD_SRC))[0]
            for key in ("labels", "annotations"):
                s["metadata"].pop(key, None)
            check(c == s, f"{label}: rendered CRD equals {rel(CRD_SRC)} apart from labels/annotations")

    section(f"kubernetes-validate {KUBE} --strict: rendered chart")
    for label, docs in rendered.items():
        validate_all(docs, f"chart[{label}]")

    if WRITE and "default" in rendered:
        write_deploy(rendered["default"])

    section(f"kubernetes-validate {KUBE} --strict: deploy/")
    names = sorted(n for n in os.listdir(DEPLOY) if n.endswith((".yaml", ".yml")))
    for n in ("namespace.yaml", "crd.yaml", "rbac.yaml", "operator.yaml", "example-provisioner.yaml"):
        check(n in names, f"deploy/{n} exists")
    deploy_docs = {}
    for n in names:
        try:
            deploy_docs[n] = load_docs(read(os.path.join(DEPLOY, n)))
        except yaml.YAMLError as e:
            fail(f"deploy/{n}: not YAML: {e}")
            continue
        validate_all(deploy_docs[n], f"deploy/{n}")

    section("deploy/ equals the chart's default render")
    if "default" in rendered:
        for n, want in expected_deploy(rendered["default"]).items():
            have = deploy_docs.get(n)
            key = lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])  # noqa: E731
            if have is None:
                fail(f"deploy/{n} missing (run scripts/check-manifests.sh --write-deploy)")
            elif sorted(have, key=key) == sorted(want, key=key):
                ok(f"deploy/{n} matches ({len(want)} objects)")
            else:
                a = dump(sorted(want, key=key)).splitlines()
                b = dump(sorted(have, key=key)).splitlines()
                diff = list(difflib.unified_diff(a, b, "chart render", f"deploy/{n}", lineterm="", n=1))
                print("\n".join("        " + line for line in diff[:30]))
                fail(f"deploy/{n} differs from the chart's default render (run scripts/check-manifests.sh --write-deploy)")
        ns_docs = [d for docs in deploy_docs.values() for d in docs if d.get("metadata", {}).get("namespace")]
        check(all(d["metadata"]["namespace"] in (NAMESPACE, ) or d["kind"] in ("Provisioner", "ConfigMap", "Secret")
                  for d in ns_docs), f"deploy/: operator objects are in namespace {NAMESPACE}")

    section("deploy/example-provisioner.yaml")
    ex = deploy_docs.get("example-provisioner.yaml", [])
    check(len(find(ex, "Provisioner")) == 1, "one Provisioner")
    helper = read(os.path.join(ROOT, "examples", "helper.sh"))
    cms = [c for c in find(ex, "ConfigMap") if helper in (c.get("data") or {}).values()]
    check(bool(cms), "a ConfigMap carries examples/helper.sh unchanged")

    section("the book's Kubernetes examples (docs/src/examples)")
    for directory, _, files in sorted(os.walk(BOOK_EXAMPLES)):
        for n in sorted(f for f in files if f.endswith((".yaml", ".yml"))):
            path = os.path.join(directory, n)
            try:
                docs = load_docs(read(path))
            except yaml.YAMLError as e:
                fail(f"{rel(path)}: not YAML: {e}")
                continue
            objects = [d for d in docs if "apiVersion" in d]
            for d in objects:
                if d["apiVersion"].startswith("cert-manager.io/"):
                    counts["skipped"] += 1
                    print(f"  note  {rel(path)}: {kn(d)} skipped (cert-manager.io has no schema in kubernetes-validate)")
            validate_all([d for d in objects if not d["apiVersion"].startswith("cert-manager.io/")], rel(path))

    section("every shipped alert has a runbook in the book")
    if "prometheusRule" in rendered:
        shipped = [r.get("alert") for g in find(rendered["prometheusRule"], "PrometheusRule")[0]["spec"]["groups"]
                   for r in g.get("rules", [])]
        headings = set(re.findall(r"^## (\S+)\s*$", read(BOOK_ALERTS), re.M)) if os.path.exists(BOOK_ALERTS) else set()
        missing = [a for a in shipped if a not in headings]
        check(shipped and not missing, f"{rel(BOOK_ALERTS)} has a section for each of {shipped}"
              + (f" (missing: {missing})" if missing else ""))
        stale = sorted(h for h in headings if h.startswith("ChoriaProvisioner") and h not in shipped)
        check(not stale, f"{rel(BOOK_ALERTS)} documents no alert the chart does not ship"
              + (f" (stale: {stale})" if stale else ""))

    section("Dockerfile")
    check_dockerfile()

    print("\n== summary")
    print(f"  {counts['validated']} objects valid against Kubernetes {KUBE} (strict), "
          f"{counts['crs']} Provisioner(s) valid against the CRD, "
          f"{counts['skipped']} ServiceMonitor/PrometheusRule/cert-manager object(s) skipped (no schema)")
    if failures:
        print(f"  {len(failures)} FAILURE(S):")
        for f in failures:
            print(f"    - {f}")
        return 1
    print("  all manifest checks passed")
    return 0


sys.exit(main())
PYTHON
