import unittest

from manifests import chart
from manifests.chart import VARIANTS, Chart, check_lint, check_renders

from .support import TreeCase, deployment, good_operator_docs

CHART_YAML = "apiVersion: v2\nname: tiny\nversion: 0.1.0\nicon: https://example.net/icon.png\n"
VALUES = "replicas: 1\nwildcard: false\n"
SCHEMA = """{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "replicas": {"type": "integer", "minimum": 1},
    "wildcard": {"type": "boolean"}
  }
}
"""
TEMPLATE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .Release.Name }}-lease
  namespace: {{ .Release.Namespace }}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [{{ if .Values.wildcard }}"*"{{ else }}create{{ end }}]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    resourceNames: [choria-provisioner-operator]
    verbs: [get, update]
"""


class TinyChartCase(TreeCase):
    """A chart of one Role whose verbs a value turns into a wildcard, with a
    values.schema.json that wants replicas an integer of at least 1."""

    def setUp(self):
        super().setUp()
        self.put("chart/Chart.yaml", CHART_YAML)
        self.put("chart/values.yaml", VALUES)
        self.put("chart/values.schema.json", SCHEMA)
        self.put("chart/templates/role.yaml", TEMPLATE)
        self.chart = Chart(self.root + "/chart")


class LintTest(TinyChartCase):
    def test_a_value_the_schema_refuses_fails_lint(self):
        self.assertTrue(self.chart.lint({"replicas": "two"}, self.report))
        self.assertTrue(self.chart.lint({"replica": 2}, self.report))

    def test_good_values_lint_clean(self):
        self.assertEqual(self.chart.lint({"replicas": 3}, self.report), [])

    def test_a_variant_that_fails_lint_is_reported(self):
        check_lint(self.report, self.chart, variants=[("ok", {}, None), ("bad", {"replicas": 0}, None)], refused=[])
        self.assertEqual(len(self.report.failures), 1)
        self.assertFailure("lint bad: ", "replicas")

    def test_a_value_that_must_be_refused_but_is_accepted_is_reported(self):
        check_lint(self.report, self.chart, variants=[],
                   refused=[("replicas: two", {"replicas": "two"}), ("three replicas", {"replicas": 3})])
        self.assertEqual(self.report.failures, ["refused: three replicas -- was accepted"])
        self.assertIn("ok    refused: replicas: two (", self.output())


class RenderTest(TinyChartCase):
    def test_a_variant_rendering_a_wildcard_is_reported(self):
        seen = []
        variants = [("plain", {}, lambda d, r, t: seen.append(("plain", d))),
                    ("wild", {"wildcard": True}, lambda d, r, t: seen.append(("wild", d)))]
        rendered = check_renders(self.report, self.tree, self.chart, None, variants)
        self.assertEqual(sorted(rendered), ["plain", "wild"])
        self.assertEqual([label for label, _ in seen], ["plain", "wild"], "each variant's expectation runs")
        self.assertFailure("wild: Role/choria-provisioner/choria-provisioner-operator-lease has a wildcard in verbs")
        self.assertFalse([f for f in self.report.failures if f.startswith("plain")])
        self.assertIn("ok    plain: RBAC without wildcards", self.output())

    def test_a_variant_that_does_not_render_is_reported(self):
        check_renders(self.report, self.tree, self.chart, None, [("bad", {"replicas": "two"}, None)])
        self.assertFailure("render bad: ")


def variant(label):
    return next(expect for name, _, expect in VARIANTS if name == label)


class VariantExpectationTest(TreeCase):
    """The expectations of the chart's variants, on objects made by hand."""

    def test_default_wants_exactly_the_base_kinds(self):
        docs = good_operator_docs() + [{"kind": k, "metadata": {"name": k.lower()}} for k in (
            "ClusterRoleBinding", "CustomResourceDefinition", "PodDisruptionBudget", "RoleBinding", "Service",
            "ServiceAccount")]
        variant("default")(docs, self.report, self.tree)
        self.assertNoFailure()
        variant("default")(docs + [{"kind": "ServiceMonitor", "metadata": {"name": "s"}}], self.report, self.tree)
        self.assertFailure("default: objects", "'ServiceMonitor'")

    def test_single_wants_no_pdb_and_leader_election_off(self):
        docs = [deployment(["operator", "--leader-election=false"])]
        variant("single")(docs, self.report, self.tree)
        self.assertNoFailure()
        variant("single")(docs + [{"kind": "PodDisruptionBudget", "metadata": {"name": "p"}}], self.report, self.tree)
        self.assertFailure("single: no PDB, no Lease Role, --leader-election=false")

    def test_digest_wants_the_image_by_digest(self):
        dep = deployment()
        variant("digest")([dep], self.report, self.tree)
        self.assertFailure("digest: image by digest")

    def test_every_variant_has_a_label_values_and_an_expectation(self):
        labels = [label for label, _, _ in VARIANTS]
        self.assertEqual(len(labels), len(set(labels)))
        self.assertEqual(labels[0], "default", "the CRD and deploy/ are compared with the default render")
        self.assertIn("prometheusRule", labels, "the runbooks are checked against this render")
        self.assertTrue(all(callable(e) for _, _, e in VARIANTS))
        self.assertTrue(chart.REFUSED)


if __name__ == "__main__":
    unittest.main()
