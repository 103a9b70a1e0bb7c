"""The book (docs/): its Kubernetes examples validate, and every alert the
chart ships has its runbook."""

import os
import re

import yaml

from .common import find, kn, load_docs, read


def check_examples(report, tree, validator):
    """Every Kubernetes object under docs/src/examples validates (cert-manager's
    kinds have no schema in kubernetes-validate and are skipped with a note)."""
    report.section("the book's Kubernetes examples (docs/src/examples)")
    for directory, _, files in sorted(os.walk(tree.book_examples)):
        for n in sorted(f for f in files if f.endswith((".yaml", ".yml"))):
            path = os.path.join(directory, n)
            try:
                docs = load_docs(read(path))
            except yaml.YAMLError as e:
                report.fail(f"{tree.rel(path)}: not YAML: {e}")
                continue
            objects = [d for d in docs if "apiVersion" in d]
            for d in objects:
                if d["apiVersion"].startswith("cert-manager.io/"):
                    report.counts["skipped"] += 1
                    report.note(f"{tree.rel(path)}: {kn(d)} skipped (cert-manager.io has no schema in kubernetes-validate)")
            validator.validate_all([d for d in objects if not d["apiVersion"].startswith("cert-manager.io/")],
                                   tree.rel(path))


def shipped_alerts(docs):
    """The alerts of the (one) PrometheusRule in a render, in order."""
    return [r.get("alert") for g in find(docs, "PrometheusRule")[0]["spec"]["groups"]
            for r in g.get("rules", [])]


def check_runbooks(report, tree, rule_docs):
    """docs/src/operations/alerts.md has a `## <alert>` section for each alert
    the chart's PrometheusRule ships, and none for an alert it does not."""
    report.section("every shipped alert has a runbook in the book")
    if rule_docs is None:
        return
    rel = tree.rel(tree.book_alerts)
    shipped = shipped_alerts(rule_docs)
    headings = set(re.findall(r"^## (\S+)\s*$", read(tree.book_alerts), re.M)) if os.path.exists(tree.book_alerts) else set()
    missing = [a for a in shipped if a not in headings]
    report.check(shipped and not missing, f"{rel} has a section for each of {shipped}"
                 + (f" (missing: {missing})" if missing else ""))
    stale = sorted(h for h in headings if h.startswith("ChoriaProvisioner") and h not in shipped)
    report.check(not stale, f"{rel} documents no alert the chart does not ship"
                 + (f" (stale: {stale})" if stale else ""))
