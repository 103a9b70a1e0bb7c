import unittest

from manifests.common import LEASE
from manifests.rbac import granted, rbac_problems, security_problems

from .support import FULLNAME, assertProblem, default_args, deployment, good_operator_docs, named


class RbacTest(unittest.TestCase):
    def test_a_render_holding_exactly_what_the_operator_needs_passes(self):
        self.assertEqual(rbac_problems(good_operator_docs()), [])

    def test_a_wildcard_verb_in_a_role_is_refused(self):
        docs = good_operator_docs()
        named(docs, "Role", FULLNAME + "-lease")["rules"][0]["verbs"] = ["*"]
        assertProblem(self, rbac_problems(docs), f"Role/choria-provisioner/{FULLNAME}-lease has a wildcard in verbs")

    def test_a_wildcard_resource_in_a_cluster_role_is_refused(self):
        docs = good_operator_docs()
        named(docs, "ClusterRole", FULLNAME + "-leases")["rules"][0]["resources"] = ["*"]
        assertProblem(self, rbac_problems(docs), f"ClusterRole/{FULLNAME}-leases has a wildcard in resources")

    def test_a_wildcard_api_group_is_refused(self):
        docs = good_operator_docs()
        named(docs, "ClusterRole", FULLNAME)["rules"][0]["apiGroups"] = ["*.choria.io"]
        assertProblem(self, rbac_problems(docs), "has a wildcard in apiGroups")

    def test_a_verb_the_operator_needs_and_lacks_is_reported(self):
        docs = good_operator_docs()
        rule = next(r for r in named(docs, "ClusterRole", FULLNAME)["rules"] if r["resources"] == ["poddisruptionbudgets"])
        rule["verbs"].remove("delete")
        assertProblem(self, rbac_problems(docs), "ClusterRole lacks ['delete'] on policy/poddisruptionbudgets")

    def test_a_verb_the_operator_does_not_need_is_reported(self):
        docs = good_operator_docs()
        rule = next(r for r in named(docs, "ClusterRole", FULLNAME)["rules"] if r["resources"] == ["secrets"])
        rule["verbs"] = ["create", "get"]
        assertProblem(self, rbac_problems(docs), "ClusterRole grants more than needed: ['get'] on core/secrets")

    def test_a_resource_the_operator_does_not_use_is_reported(self):
        docs = good_operator_docs()
        named(docs, "ClusterRole", FULLNAME)["rules"].append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]})
        assertProblem(self, rbac_problems(docs), "ClusterRole grants more than needed: ['get'] on core/nodes")

    def test_bind_beyond_the_pod_cluster_roles_is_reported(self):
        docs = good_operator_docs()
        rule = next(r for r in named(docs, "ClusterRole", FULLNAME)["rules"] if r["resources"] == ["clusterroles"])
        rule["resourceNames"].append("cluster-admin")
        assertProblem(self, rbac_problems(docs), "the operator's clusterroles rule is not bind on exactly")

    def test_a_pod_cluster_role_holding_more_than_its_rule_is_reported(self):
        docs = good_operator_docs()
        named(docs, "ClusterRole", FULLNAME + "-leases")["rules"][0]["verbs"].append("patch")
        assertProblem(self, rbac_problems(docs), f"ClusterRole {FULLNAME}-leases holds", "want exactly")

    def test_a_missing_pod_cluster_role_is_reported(self):
        docs = [d for d in good_operator_docs() if d["metadata"]["name"] != FULLNAME + "-certificaterequests"]
        assertProblem(self, rbac_problems(docs), f"ClusterRole {FULLNAME}-certificaterequests holds None")

    def test_the_deployment_must_name_each_pod_cluster_role(self):
        docs = [d for d in good_operator_docs() if d["kind"] != "Deployment"]
        docs.append(deployment([a for a in default_args() if not a.startswith("--lease-cluster-role")]))
        assertProblem(self, rbac_problems(docs), f"the operator is not told --lease-cluster-role={FULLNAME}-leases")

    def test_the_admission_policy_role_must_be_exactly_create_and_get_patch_by_name(self):
        docs = good_operator_docs()
        named(docs, "ClusterRole", FULLNAME + "-pod-certificaterequests")["rules"][1].pop("resourceNames")
        assertProblem(self, rbac_problems(docs), f"ClusterRole {FULLNAME}-pod-certificaterequests holds")

    def test_the_deployment_must_name_the_admission_policy(self):
        docs = [d for d in good_operator_docs() if d["kind"] != "Deployment"]
        docs.append(deployment([a for a in default_args() if not a.startswith("--admission-policy")]))
        assertProblem(self, rbac_problems(docs), "the operator is not told --admission-policy=")

    def test_the_admission_policy_role_must_name_the_provisioners_policy(self):
        docs = good_operator_docs()
        rule = named(docs, "ClusterRole", FULLNAME + "-pod-certificaterequests")["rules"][1]
        rule["resourceNames"] = [FULLNAME + "-pod-certificaterequests"]
        assertProblem(self, rbac_problems(docs), f"ClusterRole {FULLNAME}-pod-certificaterequests holds")

    def test_the_deployment_must_name_the_provisioners_admission_policy(self):
        docs = [d for d in good_operator_docs() if d["kind"] != "Deployment"]
        docs.append(deployment([a for a in default_args() if not a.startswith("--provisioner-admission-policy")]))
        assertProblem(self, rbac_problems(docs),
                      f"the operator is not told --provisioner-admission-policy={FULLNAME}-provisioners")

    def test_a_lease_role_that_does_not_cover_the_operators_own_lease_is_reported(self):
        docs = good_operator_docs()
        named(docs, "Role", FULLNAME + "-lease")["rules"][1]["resourceNames"] = ["someone-else"]
        assertProblem(self, rbac_problems(docs), f"does not cover the operator's own Lease {LEASE}")

    def test_two_cluster_roles_with_bind_are_refused(self):
        docs = good_operator_docs()
        named(docs, "ClusterRole", FULLNAME + "-leases")["rules"][0]["verbs"].append("bind")
        self.assertEqual(rbac_problems(docs)[-1], "2 ClusterRoles with a bind rule, want the operator's one")

    def test_granted_ignores_rules_limited_to_resource_names(self):
        rules = [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["x"], "verbs": ["get"]},
                 {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
        self.assertEqual(granted(rules, "", "secrets"), {"create"})


class PodSecurityTest(unittest.TestCase):
    def test_a_restricted_deployment_passes(self):
        self.assertEqual(security_problems([deployment()]), [])

    def test_each_restricted_requirement_is_enforced(self):
        cases = [
            (lambda pod, c: pod.pop("runAsNonRoot"), "pod runAsNonRoot"),
            (lambda pod, c: pod.pop("seccompProfile"), "pod seccompProfile RuntimeDefault"),
            (lambda pod, c: c.update(allowPrivilegeEscalation=True), "operator allowPrivilegeEscalation false"),
            (lambda pod, c: c.pop("readOnlyRootFilesystem"), "operator readOnlyRootFilesystem"),
            (lambda pod, c: c.update(capabilities={"drop": ["NET_RAW"]}), "operator drop ALL"),
            (lambda pod, c: c.update(runAsUser=0), "operator non-root UID"),
        ]
        for mutate, want in cases:
            with self.subTest(want=want):
                dep = deployment()
                spec = dep["spec"]["template"]["spec"]
                mutate(spec["securityContext"], spec["containers"][0]["securityContext"])
                self.assertIn(f"Pod Security 'restricted' not met: {want}", security_problems([dep]))


if __name__ == "__main__":
    unittest.main()
