"""The Helm chart: helm lint --strict and render (helm-python-sdk, Helm's own Go
engine) with default values and variants, each variant's expectations, the
values that must be refused, and RBAC and Pod Security in every render."""

import helm_python as helm

from . import crd
from .common import KUBE, NAMESPACE, RELEASE, deployment_args, find, kinds, load_docs
from .monitoring import RULE_ALERTS, dashboard_problems, rule_problems
from .rbac import ADMISSION_SUFFIX, rbac_problems, security_problems


class Chart:
    """A chart directory, rendered as release RELEASE in namespace NAMESPACE."""

    def __init__(self, path):
        self.path = path
        self.infos = set()  # lint's informational messages, each printed once

    def render(self, values):
        with helm.Chart.load(self.path) as ch:
            out = ch.render(values, name=RELEASE, namespace=NAMESPACE)
        docs = []
        for path in sorted(out):
            if path.endswith("NOTES.txt"):
                continue
            docs.extend(load_docs(out[path]))
        return docs, out

    def lint(self, values, report):
        """helm lint --strict: the messages worse than info (printed once each)."""
        res = helm.lint(self.path, strict=True, kube_version=f"v{KUBE}.0", values=values)
        msgs = res.get("messages", [])
        for m in msgs:
            info = f"{m['path']}: {m['error'].strip()}"
            if m["severity"] <= 1 and info not in self.infos:
                self.infos.add(info)
                report.line(f"  info  lint (not a failure): {info}")
        return [m for m in msgs if m["severity"] > 1] + [{"path": "", "error": e} for e in res.get("errors", [])]


BASE_KINDS = ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
              "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"]

# (label, values, expect): each variant is linted and rendered, and
# expect(docs, report, tree) checks what its render must contain.
VARIANTS = [
    ("default", {}, lambda d, r, t: r.check(kinds(d) == BASE_KINDS, f"default: objects {kinds(d)} "
                                            "(no dashboard ConfigMap, no PrometheusRule, no ServiceMonitor)")),
    ("serviceMonitor", {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
     lambda d, r, t: r.check(len(find(d, "ServiceMonitor")) == 1
                             and find(d, "ServiceMonitor")[0]["spec"]["endpoints"][0]["port"] == "metrics",
                             "serviceMonitor: one ServiceMonitor scraping port 'metrics'")),
    ("grafanaDashboard", {"grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Choria"}}},
     lambda d, r, t: r.no_problems(dashboard_problems(d, t), "grafanaDashboard: a ConfigMap labelled grafana_dashboard=1 "
                                   "with the chart's dashboard, data source Prometheus")),
    ("grafanaDashboard-custom", {"grafanaDashboard": {"enabled": True, "label": "grafana.example.net/dashboard",
                                                      "labelValue": "choria", "namespace": "monitoring",
                                                      "datasource": ""}},
     lambda d, r, t: r.no_problems(dashboard_problems(d, t, "grafana.example.net/dashboard", "choria", "monitoring", ""),
                                   "grafanaDashboard-custom: own label and namespace, ${DS_PROMETHEUS} kept")),
    ("prometheusRule", {"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}},
     lambda d, r, t: r.no_problems(rule_problems(d, t, labels={"release": "prometheus"}, expr_has={
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
     lambda d, r, t: r.no_problems(rule_problems(d, t, RULE_ALERTS[1:], expr_has={
         "ChoriaProvisionerElectionErrors": ['election_errors{namespace="choria"}[10m]'],
         "ChoriaProvisionerHelperErrors": ['helper_errors{namespace="choria"}[30m]', "> 3"],
         "ChoriaProvisionerProvisionErrors": ['provision_errors{namespace="choria"}[15m]'],
         "ChoriaProvisionerRenewalFailing": ['renewals_due{namespace="choria"}',
                                             'renewals{namespace="choria",outcome!="sent"}[30m]'],
         "ChoriaProvisionerRenewalStranded": ['renewals_stranded{namespace="choria"}']}),
         "prometheusRule-scoped: queries limited to watchNamespace, noLeader off, helper threshold 3 over 30m")),
    ("policy", {"policy": {"allowedImages": ["registry.example.net/choria-provisioner:*"],
                           "allowedClusterIssuers": ["corp-ca", "AWSPCAClusterIssuer.awspca.cert-manager.io/pca"],
                           "allowedUsages": ["client auth", "server auth"],
                           "allowedPriorityClasses": ["choria-*"],
                           "allowedVolumeTypes": ["secret", "persistentVolumeClaim"]}},
     lambda d, r, t: r.check([a for a in deployment_args(d) if a.startswith(("--image", "--allowed-"))] == [
         "--image=choria-provisioner:0.1.0",
         "--allowed-image=registry.example.net/choria-provisioner:*",
         "--allowed-cluster-issuer=corp-ca",
         "--allowed-cluster-issuer=AWSPCAClusterIssuer.awspca.cert-manager.io/pca",
         "--allowed-usage=client auth", "--allowed-usage=server auth",
         "--allowed-priority-class=choria-*",
         "--allowed-volume-type=secret", "--allowed-volume-type=persistentVolumeClaim"],
         "policy: --image, --allowed-image, --allowed-cluster-issuer, --allowed-usage, "
         "--allowed-priority-class and --allowed-volume-type from policy")),
    ("single", {"replicas": 1, "leaderElection": {"enabled": False}},
     lambda d, r, t: r.check(not find(d, "PodDisruptionBudget") and not find(d, "Role")
                             and "--leader-election=false" in deployment_args(d),
                             "single: no PDB, no Lease Role, --leader-election=false")),
    ("single-elected", {"replicas": 1},
     lambda d, r, t: r.check(not find(d, "PodDisruptionBudget") and find(d, "Role"),
                             "single-elected: no PDB with one replica, Lease Role kept")),
    ("pdb-3", {"replicas": 3, "podDisruptionBudget": {"minAvailable": 2}},
     lambda d, r, t: r.check([(p["spec"]["minAvailable"], p["spec"].get("unhealthyPodEvictionPolicy"))
                              for p in find(d, "PodDisruptionBudget")] == [(2, "AlwaysAllow")],
                             "pdb-3: PDB minAvailable 2, unhealthy pods always evictable")),
    ("pdb-off", {"podDisruptionBudget": {"enabled": False}},
     lambda d, r, t: r.check(not find(d, "PodDisruptionBudget"), "pdb-off: no PDB")),
    ("watchNamespace", {"watchNamespace": "choria"},
     lambda d, r, t: r.check([b["metadata"]["name"] for b in find(d, "ClusterRoleBinding")]
                             == ["choria-provisioner-operator" + ADMISSION_SUFFIX]
                             and any(b["metadata"].get("namespace") == "choria" and b["roleRef"]["kind"] == "ClusterRole"
                                     for b in find(d, "RoleBinding"))
                             and "--namespace=choria" in deployment_args(d)
                             and [x["metadata"]["namespace"] for x in find(d, "Role")] == ["choria"],
                             "watchNamespace: RoleBinding in 'choria' instead of a ClusterRoleBinding (but the "
                             "admission policy's, cluster-scoped), "
                             "--namespace=choria, Lease Role in 'choria' (the operator keeps its Lease there)")),
    ("crds-off", {"crds": {"install": False}},
     lambda d, r, t: r.check(not find(d, "CustomResourceDefinition"), "crds-off: no CRD")),
    ("crds-not-kept", {"crds": {"keep": False}},
     lambda d, r, t: r.check(all("helm.sh/resource-policy" not in (c["metadata"].get("annotations") or {})
                                 for c in find(d, "CustomResourceDefinition")), "crds-not-kept: no resource-policy")),
    ("digest", {"image": {"repository": "registry.example.net/choria-provisioner", "digest": "sha256:" + "a" * 64}},
     lambda d, r, t: r.check(find(d, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["image"]
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
    ("hostPath volumes", {"policy": {"allowedVolumeTypes": ["hostPath"]}}),
    ("priority class list in one string", {"policy": {"allowedPriorityClasses": ["a,b"]}}),
    ("bad logFormat", {"logFormat": "xml"}),
    ("bad watchNamespace", {"watchNamespace": "Not_A_Namespace"}),
    ("grafanaDashboard.enabled: yes", {"grafanaDashboard": {"enabled": "yes"}}),
    ("bad grafanaDashboard.label", {"grafanaDashboard": {"label": "not a label"}}),
    ("prometheusRule duration", {"prometheusRule": {"alerts": {"noLeader": {"for": "five minutes"}}}}),
    ("prometheusRule negative threshold", {"prometheusRule": {"alerts": {"helperErrors": {"threshold": -1}}}}),
    ("prometheusRule selector in braces", {"prometheusRule": {"selector": '{namespace="choria"}'}}),
    ("unknown prometheusRule alert", {"prometheusRule": {"alerts": {"noleader": {"enabled": False}}}}),
]


def check_lint(report, chart, variants=VARIANTS, refused=REFUSED):
    """Every variant lints clean; every refused value fails lint."""
    report.section(f"helm lint --strict (kube {KUBE})")
    for label, values, _ in variants:
        bad = chart.lint(values, report)
        report.check(not bad, f"lint {label}"
                     + (": " + "; ".join(f"{m['path']}: {m['error'].strip()}" for m in bad) if bad else ""))
    for label, values in refused:
        bad = chart.lint(values, report)
        report.check(bool(bad), f"refused: {label}"
                     + (f" ({bad[0]['error'].strip().splitlines()[-1]})" if bad else " -- was accepted"))


def check_renders(report, tree, chart, prov_schema, variants=VARIANTS):
    """Renders each variant, checks its expectations, its RBAC and Pod Security,
    and (default) its CRD. Returns label -> rendered objects."""
    report.section("render variants")
    rendered = {}
    for label, values, expect in variants:
        try:
            docs, _ = chart.render(values)
        except helm.HelmError as e:
            report.fail(f"render {label}: {e}")
            continue
        rendered[label] = docs
        expect(docs, report, tree)
        problems = rbac_problems(docs) + security_problems(docs)
        for p in problems:
            report.fail(f"{label}: {p}")
        if not problems:
            report.ok(f"{label}: RBAC without wildcards, holds what the operator does and delegates; "
                      "own Lease covered; pod security 'restricted'")
        crds = find(docs, "CustomResourceDefinition")
        if label == "default" and crds and prov_schema is not None:
            crd.check_rendered(report, tree, label, crds[0])
    return rendered
