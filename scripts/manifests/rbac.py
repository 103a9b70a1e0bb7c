"""RBAC least privilege and Pod Security "restricted", over a rendered chart or
deploy/. Each function returns a list of problems; empty means it holds."""

from .common import LEASE, deployment_args, find, kn

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
# The ClusterRole for the admission policies (crates/operator/src/admission.rs):
# create, and get/patch of exactly the operator's two policies and their
# bindings, bounding provisioner pods' CertificateRequests and Provisioners'
# spec.pod. Each suffix of the release's full name -> the flag naming it.
ADMISSION_SUFFIX = "-pod-certificaterequests"
ADMISSION_POLICIES = {ADMISSION_SUFFIX: "--admission-policy", "-provisioners": "--provisioner-admission-policy"}
ADMISSION_RESOURCES = ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]
# The ClusterRoles the operator binds to provisioner pods (suffix of the release's
# full name -> the one rule they hold), holding only `bind` on them by name.
POD_CLUSTER_ROLES = {
    "-leases": ("coordination.k8s.io", "leases", {"get", "list", "create", "update", "delete"}),
    "-certificaterequests": ("cert-manager.io", "certificaterequests", {"create", "list", "watch", "delete"}),
}
POD_ROLE_FLAGS = {"-leases": "--lease-cluster-role", "-certificaterequests": "--cert-manager-cluster-role"}


def granted(rules, group, resource):
    """The verbs `rules` grant on every object of group/resource (rules limited
    to resourceNames grant nothing here)."""
    verbs = set()
    for r in rules:
        if r.get("resourceNames"):
            continue
        if group in r.get("apiGroups", []) and resource in r.get("resources", []):
            verbs |= set(r.get("verbs", []))
    return verbs


def wildcard_problems(docs):
    problems = []
    for d in docs:
        for r in d.get("rules", []) if d["kind"] in ("ClusterRole", "Role") else []:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                if any("*" in str(x) for x in r.get(key, [])):
                    problems.append(f"{kn(d)} has a wildcard in {key}: {r}")
    return problems


def operator_role_problems(docs, own):
    """The operator's ClusterRole `own` holds exactly NEEDED plus `bind` on its
    pod ClusterRoles, which hold exactly their rule and which the Deployment's
    args name; so does the admission policies' ClusterRole."""
    problems = []
    rules = own["rules"]
    fullname = own["metadata"]["name"]
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
         "resourceNames": [fullname + suffix for suffix in ADMISSION_POLICIES], "verbs": ["get", "patch"]},
    ]
    have = [dict(r, verbs=sorted(r.get("verbs", []))) for r in found[0]["rules"]] if found else None
    if have != want:
        problems.append(f"ClusterRole {name} holds {have}, want exactly {want}")
    for suffix, flag in ADMISSION_POLICIES.items():
        if args and f"{flag}={fullname}{suffix}" not in args:
            problems.append(f"the operator is not told {flag}={fullname}{suffix}: {args}")
    return problems


def rbac_problems(docs):
    problems = wildcard_problems(docs)
    roles = find(docs, "ClusterRole")
    # The operator's ClusterRole is the one that binds the others.
    own = [r for r in roles if any("bind" in x.get("verbs", []) for x in r["rules"])]
    if roles and len(own) != 1:
        return problems + [f"{len(own)} ClusterRoles with a bind rule, want the operator's one"]
    if own:
        problems += operator_role_problems(docs, own[0])
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
