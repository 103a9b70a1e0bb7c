"""The chart's README.md says what the chart renders: its alert tables name the
alerts the PrometheusRule ships and the alerts values.yaml can tune, and its
RBAC tables hold every rule of every ClusterRole and Role, verb for verb."""

import os
import re

import yaml

from .book import shipped_alerts
from .common import find, read

# `<fullname>` in the README stands for the release's full name.
FULLNAME = "<fullname>"
ALERT = re.compile(r"`(ChoriaProvisioner\w+)`")
TICKED = re.compile(r"`([^`]+)`")


def tables(text):
    """Every markdown table: (the heading above it, its header cells, its rows
    of cells)."""
    out, heading, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-|: ]+\|$", lines[i + 1]):
            header = cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            out.append((heading, header, rows))
            continue
        i += 1
    return out


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


# ---- alerts --------------------------------------------------------------------

def documented_alerts(text):
    """The alerts of the table whose first column is `Alert`, in order."""
    for _, header, rows in tables(text):
        if header and header[0] == "Alert":
            return [m.group(1) for r in rows for m in [ALERT.fullmatch(r[0])] if m]
    return []


def tuned_alerts(text):
    """values key -> the alert its row of the Values table names, from rows
    such as `prometheusRule.alerts.noLeader.enabled`, ... | ChoriaProvisionerNoLeader."""
    out = {}
    for _, header, rows in tables(text):
        if not header or header[0] != "Key":
            continue
        for r in rows:
            m = re.match(r"`prometheusRule\.alerts\.(\w+)\.", r[0])
            if m:
                named = ALERT.search(r[-1])
                out[m.group(1)] = named.group(1) if named else None
    return out


def alert_problems(text, shipped, value_keys):
    """What the README says of the alerts that the chart does not do."""
    problems = []
    documented = documented_alerts(text)
    if sorted(documented) != sorted(shipped) or len(set(documented)) != len(documented):
        problems.append(f"its Alert table lists {documented}, the chart's PrometheusRule ships {shipped}")
    tuned = tuned_alerts(text)
    if sorted(tuned) != sorted(value_keys):
        problems.append(f"its Values table has prometheusRule.alerts.{{{', '.join(sorted(tuned))}}}, "
                        f"values.yaml has {{{', '.join(sorted(value_keys))}}}")
    for key, alert in sorted(tuned.items()):
        if alert not in shipped:
            problems.append(f"its Values row for prometheusRule.alerts.{key} names {alert}, which the chart does not ship")
    return problems


# ---- RBAC ----------------------------------------------------------------------

def rule_key(group, resource, names):
    return (group, resource, tuple(sorted(names)))


def rendered_roles(docs):
    """(kind, name) -> {(group, resource, resourceNames): verbs} for every
    ClusterRole and Role of a render."""
    out = {}
    for kind in ("ClusterRole", "Role"):
        for role in find(docs, kind):
            grants = out.setdefault((kind, role["metadata"]["name"]), {})
            for r in role.get("rules", []):
                for g in r.get("apiGroups", []):
                    for res in r.get("resources", []):
                        key = rule_key(g, res, r.get("resourceNames", []))
                        grants[key] = grants.get(key, set()) | set(r.get("verbs", []))
    return out


def parse_resources(cell, fullname):
    """`a`, `b` named `x`, `y` -> (["a", "b"], ["x", "y"])."""
    cell = cell.replace(FULLNAME, fullname)
    resources, _, names = cell.partition(" named ")
    return TICKED.findall(resources), TICKED.findall(names)


def role_of(heading):
    """The kind and name a heading such as ### The Lease Role `<fullname>-x`
    introduces, or None."""
    m = re.search(r"\b(ClusterRole|Role)\s+`([^`]+)`", heading)
    return (m.group(1), m.group(2)) if m else None


def documented_roles(text, fullname):
    """(kind, name) -> {(group, resource, resourceNames): verbs} from every
    table with API group, Resources and Verbs columns: the role is the row's
    ClusterRole or Role column, or else the one its heading names."""
    out = {}
    problems = []
    for heading, header, rows in tables(text):
        if not {"API group", "Resources", "Verbs"} <= set(header):
            continue
        col = {h: i for i, h in enumerate(header)}
        role_col = next((h for h in ("ClusterRole", "Role") if h in col), None)
        for r in rows:
            if role_col:
                names = TICKED.findall(r[col[role_col]])
                role = (role_col, names[0].replace(FULLNAME, fullname)) if names else None
            else:
                role = role_of(heading)
                if role:
                    role = (role[0], role[1].replace(FULLNAME, fullname))
            if role is None:
                problems.append(f"a rule row names no role (heading {heading!r}): {' | '.join(r)}")
                continue
            group_cell = r[col["API group"]]
            group = "" if group_cell == "core" else "".join(TICKED.findall(group_cell))
            resources, names = parse_resources(r[col["Resources"]], fullname)
            verbs = {v.strip() for v in r[col["Verbs"]].split(",") if v.strip()}
            grants = out.setdefault(role, {})
            for res in resources:
                key = rule_key(group, res, names)
                grants[key] = grants.get(key, set()) | verbs
    return out, problems


def describe(key):
    group, resource, names = key
    where = f"{group or 'core'}/{resource}"
    return where + (f" named {', '.join(names)}" if names else "")


def rbac_problems(text, docs, fullname):
    """Every rule the render grants is in the README's tables with the same
    verbs, and the tables hold nothing the render does not."""
    documented, problems = documented_roles(text, fullname)
    rendered = rendered_roles(docs)
    for role in sorted(set(rendered) | set(documented)):
        label = f"{role[0]} {role[1]}"
        if role not in documented:
            problems.append(f"{label}: the chart renders it, the README has no table for it")
            continue
        if role not in rendered:
            problems.append(f"{label}: the README documents it, the chart does not render it")
            continue
        have, want = documented[role], rendered[role]
        for key in sorted(set(have) | set(want)):
            if have.get(key) != want.get(key):
                problems.append(f"{label}: {describe(key)}: the README says "
                                f"{', '.join(sorted(have.get(key, ()))) or 'nothing'}, the chart grants "
                                f"{', '.join(sorted(want.get(key, ()))) or 'nothing'}")
    return problems


def check_chart_readme(report, tree, default_docs, rule_docs, fullname):
    """The chart's README against the default render (RBAC) and the
    PrometheusRule variant (alerts)."""
    report.section("the chart's README.md: its alert and RBAC tables are what the chart renders")
    rel = tree.rel(tree.chart_readme)
    if not os.path.exists(tree.chart_readme):
        report.fail(f"{rel} is missing")
        return
    text = read(tree.chart_readme)
    if rule_docs is not None:
        keys = list(yaml.safe_load(read(tree.chart_values))["prometheusRule"]["alerts"])
        report.no_problems(alert_problems(text, shipped_alerts(rule_docs), keys),
                           f"{rel}: the alerts the chart ships and values.yaml tunes")
    if default_docs is not None:
        report.no_problems(rbac_problems(text, default_docs, fullname),
                           f"{rel}: every rule of every ClusterRole and Role, verb for verb")
