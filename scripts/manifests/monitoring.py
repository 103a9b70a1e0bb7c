"""The chart's monitoring: the Grafana dashboards (the Go provisioner's,
unchanged, and ours) and the PrometheusRule's alerts."""

import json
import os
import re

from .common import NAMESPACE, find, kn, read


def check_dashboard_copy(report, tree):
    """The chart's copy of the Go provisioner's dashboard is JSON with panels,
    and dashboard.json itself when ../shared/peers has it."""
    report.section("Grafana dashboard copy")
    rel, path = tree.rel, tree.chart_dashboard
    if not report.check(os.path.exists(path), f"{rel(path)} exists"):
        return
    try:
        report.check(bool(json.loads(read(path)).get("panels")), f"{rel(path)} is JSON with panels")
    except ValueError as e:
        report.fail(f"{rel(path)} is not JSON: {e}")
    if os.path.exists(tree.upstream_dashboard):
        report.check(read(path) == read(tree.upstream_dashboard),
                     f"{rel(path)} is the Go provisioner's dashboard.json unchanged")
    else:
        report.note(f"{os.path.normpath(tree.upstream_dashboard)} absent: copy not compared with upstream")


def dashboard_problems(docs, tree, label="grafana_dashboard", value="1", namespace=NAMESPACE, datasource="Prometheus"):
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
    files = {"choria-provisioner.json": tree.chart_dashboard, "choria-provisioner-day-two.json": tree.our_dashboard}
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
            problems.append(f"{kn(cm)}: {key} is not {tree.rel(path)} with datasource {datasource!r}")
    return problems


RULE_ALERTS = ["ChoriaProvisionerNoLeader", "ChoriaProvisionerElectionErrors",
               "ChoriaProvisionerHelperErrors", "ChoriaProvisionerProvisionErrors",
               "ChoriaProvisionerRenewalFailing", "ChoriaProvisionerRenewalStranded"]


def our_metrics(tree):
    """The provisioner's metric names, as src/provision/metrics.rs registers them."""
    return set(re.findall(r'"(choria_provisioner_[a-z_]+)"', read(tree.metrics_rs)))


def rule_problems(docs, tree, alerts=RULE_ALERTS, labels=None, expr_has=None):
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
    ours = our_metrics(tree)
    for r in got:
        expr = str(r.get("expr") or "").strip()
        used = set(re.findall(r"choria_provisioner_[a-z_]+", expr))
        if not used:
            problems.append(f"{r.get('alert')}: expr {expr!r} reads none of our metrics")
        elif used - ours:
            problems.append(f"{r.get('alert')}: {sorted(used - ours)} are not metrics of {tree.rel(tree.metrics_rs)}")
        for part in (expr_has or {}).get(r.get("alert"), []):
            if part not in expr:
                problems.append(f"{r.get('alert')}: expr {expr!r} lacks {part!r}")
        if not r.get("for") or not (r.get("labels") or {}).get("severity"):
            problems.append(f"{r.get('alert')}: no for or no severity")
        if not all((r.get("annotations") or {}).get(a) for a in ("summary", "description")):
            problems.append(f"{r.get('alert')}: no summary or description")
    return problems
