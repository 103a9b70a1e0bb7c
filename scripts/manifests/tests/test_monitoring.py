import json
import os
import unittest

from manifests.monitoring import check_dashboard_copy, dashboard_problems, rule_problems

from .support import TreeCase, assertProblem

METRICS_RS = '''
    register("choria_provisioner_leader", "...");
    register("choria_provisioner_helper_errors", "...");
'''
DASHBOARD = '{"title": "x", "panels": [{"datasource": "${DS_PROMETHEUS}"}]}\n'
OURS = '{"title": "day two", "panels": [{"id": 1}]}\n'


def rule(alert="ChoriaProvisionerHelperErrors", expr="increase(choria_provisioner_helper_errors[15m]) > 0", **extra):
    r = {"alert": alert, "expr": expr, "for": "5m", "labels": {"severity": "warning"},
         "annotations": {"summary": "s", "description": "d"}}
    r.update(extra)
    return r


def prometheus_rule(*rules, labels=None):
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "p", "namespace": "choria-provisioner", "labels": labels or {}},
            "spec": {"groups": [{"name": "g", "rules": list(rules)}]}}


class RuleTest(TreeCase):
    def setUp(self):
        super().setUp()
        self.put("crates/core/src/provision/metrics.rs", METRICS_RS)
        self.alerts = ["ChoriaProvisionerHelperErrors"]

    def test_a_rule_over_our_metrics_with_for_severity_and_annotations_passes(self):
        self.assertEqual(rule_problems([prometheus_rule(rule())], self.tree, self.alerts), [])

    def test_an_expr_over_a_metric_we_do_not_register_is_reported(self):
        docs = [prometheus_rule(rule(expr="choria_provisioner_made_up > 0"))]
        assertProblem(self, rule_problems(docs, self.tree, self.alerts),
                      "['choria_provisioner_made_up'] are not metrics of crates/core/src/provision/metrics.rs")

    def test_an_expr_reading_none_of_our_metrics_is_reported(self):
        docs = [prometheus_rule(rule(expr="up == 0"))]
        assertProblem(self, rule_problems(docs, self.tree, self.alerts), "reads none of our metrics")

    def test_a_rule_without_severity_is_reported(self):
        docs = [prometheus_rule(rule(labels={}))]
        assertProblem(self, rule_problems(docs, self.tree, self.alerts), "ChoriaProvisionerHelperErrors: no for or no severity")

    def test_a_rule_without_for_is_reported(self):
        r = rule()
        del r["for"]
        assertProblem(self, rule_problems([prometheus_rule(r)], self.tree, self.alerts), "no for or no severity")

    def test_a_rule_without_description_is_reported(self):
        docs = [prometheus_rule(rule(annotations={"summary": "s"}))]
        assertProblem(self, rule_problems(docs, self.tree, self.alerts), "no summary or description")

    def test_other_alerts_than_wanted_are_reported(self):
        docs = [prometheus_rule(rule(), rule(alert="ChoriaProvisionerNoLeader", expr="choria_provisioner_leader == 0"))]
        assertProblem(self, rule_problems(docs, self.tree, self.alerts), "alerts ['ChoriaProvisionerHelperErrors', "
                      "'ChoriaProvisionerNoLeader'], want ['ChoriaProvisionerHelperErrors']")

    def test_an_expr_lacking_a_wanted_part_is_reported(self):
        docs = [prometheus_rule(rule())]
        problems = rule_problems(docs, self.tree, self.alerts,
                                 expr_has={"ChoriaProvisionerHelperErrors": ['{namespace="choria"}']})
        assertProblem(self, problems, "lacks '{namespace=\"choria\"}'")

    def test_a_missing_label_is_reported(self):
        problems = rule_problems([prometheus_rule(rule())], self.tree, self.alerts, labels={"release": "prometheus"})
        assertProblem(self, problems, "lacks the label release: prometheus")

    def test_no_prometheus_rule_is_reported(self):
        self.assertEqual(rule_problems([], self.tree, self.alerts), ["0 PrometheusRules, want 1"])


class DashboardTest(TreeCase):
    def setUp(self):
        super().setUp()
        self.put("charts/choria-provisioner-operator/dashboards/choria-provisioner.json", DASHBOARD)
        self.put("charts/choria-provisioner-operator/dashboards/choria-provisioner-day-two.json", OURS)

    def config_map(self, datasource="Prometheus", label="grafana_dashboard", value="1", namespace="choria-provisioner"):
        ours = DASHBOARD.replace('"${DS_PROMETHEUS}"', json.dumps(datasource)) if datasource else DASHBOARD
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "d", "namespace": namespace, "labels": {label: value}},
                "data": {"choria-provisioner.json": ours, "choria-provisioner-day-two.json": OURS}}

    def test_the_chart_dashboard_with_its_data_source_passes(self):
        self.assertEqual(dashboard_problems([self.config_map()], self.tree), [])

    def test_an_empty_data_source_keeps_the_placeholder(self):
        docs = [self.config_map(datasource="")]
        self.assertEqual(dashboard_problems(docs, self.tree, datasource=""), [])
        assertProblem(self, dashboard_problems(docs, self.tree), "is not charts/choria-provisioner-operator/"
                      "dashboards/choria-provisioner.json with datasource 'Prometheus'")

    def test_a_dashboard_without_the_sidecar_label_is_reported(self):
        docs = [self.config_map(label="other")]
        assertProblem(self, dashboard_problems(docs, self.tree), "lacks the label grafana_dashboard: '1'")

    def test_a_dashboard_in_another_namespace_is_reported(self):
        docs = [self.config_map(namespace="default")]
        assertProblem(self, dashboard_problems(docs, self.tree), "is not in namespace choria-provisioner")

    def test_an_edited_dashboard_is_reported(self):
        cm = self.config_map()
        cm["data"]["choria-provisioner-day-two.json"] = '{"title": "edited", "panels": [{"id": 1}]}'
        assertProblem(self, dashboard_problems([cm], self.tree), "choria-provisioner-day-two.json is not")

    def test_a_dashboard_without_panels_is_reported(self):
        cm = self.config_map()
        cm["data"]["choria-provisioner-day-two.json"] = '{"title": "day two"}'
        assertProblem(self, dashboard_problems([cm], self.tree), "choria-provisioner-day-two.json has no panels")

    def test_missing_data_keys_are_reported(self):
        cm = self.config_map()
        del cm["data"]["choria-provisioner-day-two.json"]
        assertProblem(self, dashboard_problems([cm], self.tree), "data keys ['choria-provisioner.json']")

    def test_the_copy_of_the_go_dashboard_must_be_unchanged(self):
        upstream = os.path.join(self.root, "..", "shared", "peers", "go-provisioner", "dashboard.json")
        os.makedirs(os.path.dirname(upstream))
        with open(upstream, "w", encoding="utf-8") as f:
            f.write(DASHBOARD)
        check_dashboard_copy(self.report, self.tree)
        self.assertNoFailure()
        with open(upstream, "w", encoding="utf-8") as f:
            f.write(DASHBOARD.replace('"x"', '"upstream moved on"'))
        check_dashboard_copy(self.report, self.tree)
        self.assertFailure("choria-provisioner.json is the Go provisioner's dashboard.json unchanged")

    def test_without_the_go_dashboard_the_copy_is_only_noted(self):
        check_dashboard_copy(self.report, self.tree)
        self.assertNoFailure()
        self.assertIn("absent: copy not compared with upstream", self.output())

    def test_a_copy_that_is_not_json_is_reported(self):
        self.put("charts/choria-provisioner-operator/dashboards/choria-provisioner.json", "{not json")
        check_dashboard_copy(self.report, self.tree)
        self.assertFailure("choria-provisioner.json is not JSON")


if __name__ == "__main__":
    unittest.main()
