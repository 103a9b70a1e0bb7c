"""What the tests share: a throw-away repository tree, a quiet Report, and
objects shaped like the chart's default render that pass every RBAC and
Pod Security check."""

import copy
import io
import os
import tempfile
import unittest

from manifests.common import LEASE, Tree
from manifests.rbac import (ADMISSION_POLICIES, ADMISSION_RESOURCES, ADMISSION_SUFFIX, NEEDED, POD_CLUSTER_ROLES,
                            POD_ROLE_FLAGS)
from manifests.report import Report

FULLNAME = "choria-provisioner-operator"


class TreeCase(unittest.TestCase):
    """A test with a temporary repository root (self.tree) and a Report whose
    lines go to a buffer (self.report, self.output())."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        # The repository is a directory of its own, so that ../shared (the
        # Go provisioner's files) can be made next to it.
        self.root = os.path.join(self._tmp.name, "repo")
        os.makedirs(self.root)
        self.tree = Tree(self.root)
        self.report = Report(io.StringIO())

    def put(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def output(self):
        return self.report.out.getvalue()

    def assertFailure(self, *parts):
        """Some failure message contains every one of parts."""
        hits = [f for f in self.report.failures if all(p in f for p in parts)]
        self.assertTrue(hits, f"no failure with {parts}; failures: {self.report.failures}")

    def assertNoFailure(self):
        self.assertEqual(self.report.failures, [], self.output())


def assertProblem(case, problems, *parts):
    hits = [p for p in problems if all(x in p for x in parts)]
    case.assertTrue(hits, f"no problem with {parts}; problems: {problems}")


def meta(name, namespace=None, **extra):
    md = {"name": name}
    if namespace:
        md["namespace"] = namespace
    md.update(extra)
    return md


def deployment(args=None):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(FULLNAME, "choria-provisioner"),
        "spec": {"template": {"spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "operator", "image": "choria-provisioner:0.1.0",
                "args": list(args) if args is not None else default_args(),
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        }}},
    }


def default_args():
    args = [f"{POD_ROLE_FLAGS[s]}={FULLNAME}{s}" for s in POD_CLUSTER_ROLES]
    return ["operator"] + args + [f"{flag}={FULLNAME}{s}" for s, flag in ADMISSION_POLICIES.items()]


def good_operator_docs():
    """The RBAC objects and Deployment of a render that meets every rule."""
    rules = [{"apiGroups": [g], "resources": [res], "verbs": sorted(v)} for g, res, v in NEEDED]
    rules.append({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
                  "resourceNames": sorted(FULLNAME + s for s in POD_CLUSTER_ROLES)})
    docs = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(FULLNAME),
             "rules": rules}]
    for suffix, (g, res, verbs) in POD_CLUSTER_ROLES.items():
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": meta(FULLNAME + suffix),
                     "rules": [{"apiGroups": [g], "resources": [res], "verbs": sorted(verbs)}]})
    admission = FULLNAME + ADMISSION_SUFFIX
    docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(admission),
                 "rules": [
                     {"apiGroups": ["admissionregistration.k8s.io"], "resources": list(ADMISSION_RESOURCES),
                      "verbs": ["create"]},
                     {"apiGroups": ["admissionregistration.k8s.io"], "resources": list(ADMISSION_RESOURCES),
                      "resourceNames": [FULLNAME + s for s in ADMISSION_POLICIES], "verbs": ["get", "patch"]}]})
    docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": meta(FULLNAME + "-lease", "choria-provisioner"),
                 "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                           {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                            "resourceNames": [LEASE], "verbs": ["get", "update"]}]})
    docs.append(deployment())
    return copy.deepcopy(docs)


def named(docs, kind, name):
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
