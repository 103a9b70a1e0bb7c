import unittest

from manifests import readme

from .support import FULLNAME, TreeCase, named

README = """# chart

## Values

| Key | Default | Meaning |
|---|---|---|
| `replicas` | `2` | operator replicas |
| `prometheusRule.alerts.noLeader.enabled`, `.for` | `true`, `5m` | `ChoriaProvisionerNoLeader` |
| `prometheusRule.alerts.helperErrors.…` | `true` | `ChoriaProvisionerHelperErrors` |

## RBAC

### The operator's ClusterRole `<fullname>`

| API group | Resources | Verbs | Why |
|---|---|---|---|
| `provisioning.choria.io` | `provisioners` | get, list, watch | the watch |
| core | `configmaps`, `services` | get, create, patch | built |
| `rbac.authorization.k8s.io` | `clusterroles` named `<fullname>-leases` | bind | bind it |

### The ClusterRoles bound to provisioner pods

| ClusterRole | API group | Resources | Verbs | Bound for |
|---|---|---|---|---|
| `<fullname>-leases` | `coordination.k8s.io` | `leases` | get, list, create, update, delete | the Lease election |

### The Lease Role `<fullname>-leader-election`

| API group | Resources | Verbs | Why |
|---|---|---|---|
| `coordination.k8s.io` | `leases` | create | the first campaign |
| `coordination.k8s.io` | `leases` named `choria-provisioner-operator` | get, update | renewing |

## Alerts

| Alert | Fires when | Default |
|---|---|---|
| `ChoriaProvisionerNoLeader` | no leader | 5m |
| `ChoriaProvisionerHelperErrors` | the helper fails | 15m |
"""


def role(kind, name, rules, namespace=None):
    md = {"name": name}
    if namespace:
        md["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": md, "rules": rules}


def render():
    """What the README above describes, as the chart would render it."""
    return [
        role("ClusterRole", FULLNAME, [
            {"apiGroups": ["provisioning.choria.io"], "resources": ["provisioners"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "create", "patch"]},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
             "resourceNames": [FULLNAME + "-leases"], "verbs": ["bind"]}]),
        role("ClusterRole", FULLNAME + "-leases", [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "create", "update", "delete"]}]),
        role("Role", FULLNAME + "-leader-election", [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["choria-provisioner-operator"], "verbs": ["get", "update"]}], "choria-provisioner"),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": FULLNAME}},
    ]


SHIPPED = ["ChoriaProvisionerHelperErrors", "ChoriaProvisionerNoLeader"]
KEYS = ["noLeader", "helperErrors"]


class RbacTablesTest(unittest.TestCase):
    def problems(self, text=README, docs=None):
        return readme.rbac_problems(text, render() if docs is None else docs, FULLNAME)

    def test_tables_that_hold_every_rule_pass(self):
        self.assertEqual(self.problems(), [])

    def test_a_verb_the_chart_grants_and_the_readme_leaves_out_is_reported(self):
        # The drift this check was made for: the README said get, create,
        # update on leases while the chart granted list and delete too.
        text = README.replace("| get, list, create, update, delete |", "| get, create, update |")
        self.assertEqual(self.problems(text), [
            f"ClusterRole {FULLNAME}-leases: coordination.k8s.io/leases: the README says create, get, update, "
            "the chart grants create, delete, get, list, update"])

    def test_a_rule_only_the_readme_has_is_reported(self):
        docs = render()
        named(docs, "ClusterRole", FULLNAME)["rules"].pop(1)
        self.assertEqual(self.problems(docs=docs), [
            f"ClusterRole {FULLNAME}: core/configmaps: the README says create, get, patch, the chart grants nothing",
            f"ClusterRole {FULLNAME}: core/services: the README says create, get, patch, the chart grants nothing"])

    def test_resource_names_are_part_of_a_rule(self):
        text = README.replace("`leases` named `choria-provisioner-operator`", "`leases`")
        problems = self.problems(text)
        self.assertIn(f"Role {FULLNAME}-leader-election: coordination.k8s.io/leases named choria-provisioner-operator: "
                      "the README says nothing, the chart grants get, update", problems)
        self.assertIn(f"Role {FULLNAME}-leader-election: coordination.k8s.io/leases: the README says create, get, update, "
                      "the chart grants create", problems)

    def test_a_role_without_a_table_is_reported(self):
        docs = render() + [role("ClusterRole", FULLNAME + "-pod-certificaterequests", [
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies"],
             "verbs": ["create"]}])]
        self.assertEqual(self.problems(docs=docs), [
            f"ClusterRole {FULLNAME}-pod-certificaterequests: the chart renders it, the README has no table for it"])

    def test_a_table_for_a_role_the_chart_does_not_render_is_reported(self):
        docs = [d for d in render() if d["kind"] != "Role"]
        self.assertEqual(self.problems(docs=docs), [
            f"Role {FULLNAME}-leader-election: the README documents it, the chart does not render it"])

    def test_a_rule_row_under_a_heading_that_names_no_role_is_reported(self):
        text = README.replace("### The Lease Role `<fullname>-leader-election`", "### The Lease")
        problems = self.problems(text)
        self.assertTrue(any(p.startswith("a rule row names no role (heading 'The Lease')") for p in problems), problems)


class AlertTablesTest(unittest.TestCase):
    def test_the_shipped_alerts_in_any_order_pass(self):
        self.assertEqual(readme.alert_problems(README, SHIPPED, KEYS), [])

    def test_an_alert_the_table_leaves_out_is_reported(self):
        shipped = SHIPPED + ["ChoriaProvisionerRenewalStranded"]
        self.assertEqual(readme.alert_problems(README, shipped, KEYS), [
            "its Alert table lists ['ChoriaProvisionerNoLeader', 'ChoriaProvisionerHelperErrors'], the chart's "
            f"PrometheusRule ships {shipped}"])

    def test_a_value_the_values_table_leaves_out_is_reported(self):
        problems = readme.alert_problems(README, SHIPPED, KEYS + ["renewalStranded"])
        self.assertEqual(problems, ["its Values table has prometheusRule.alerts.{helperErrors, noLeader}, "
                                    "values.yaml has {helperErrors, noLeader, renewalStranded}"])

    def test_a_values_row_naming_an_alert_not_shipped_is_reported(self):
        text = README.replace("| `true` | `ChoriaProvisionerHelperErrors` |", "| `true` | `ChoriaProvisionerHelperErrs` |")
        self.assertEqual(readme.alert_problems(text, SHIPPED, KEYS), [
            "its Values row for prometheusRule.alerts.helperErrors names ChoriaProvisionerHelperErrs, which the chart "
            "does not ship"])


class ChartReadmeTest(TreeCase):
    def test_the_readme_is_checked_against_the_render_and_values(self):
        self.put("charts/choria-provisioner-operator/README.md", README)
        self.put("charts/choria-provisioner-operator/values.yaml",
                 "prometheusRule:\n  alerts:\n    noLeader: {enabled: true}\n    helperErrors: {enabled: true}\n")
        rule = [{"kind": "PrometheusRule", "metadata": {"name": "r"},
                 "spec": {"groups": [{"name": "g", "rules": [{"alert": a} for a in SHIPPED]}]}}]
        readme.check_chart_readme(self.report, self.tree, render(), rule, FULLNAME)
        self.assertNoFailure()
        self.assertIn("every rule of every ClusterRole and Role, verb for verb", self.output())

    def test_a_missing_readme_is_reported(self):
        readme.check_chart_readme(self.report, self.tree, render(), None, FULLNAME)
        self.assertFailure("charts/choria-provisioner-operator/README.md is missing")


if __name__ == "__main__":
    unittest.main()
