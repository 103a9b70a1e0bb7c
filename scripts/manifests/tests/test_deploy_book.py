import os
import unittest

from manifests import deploy
from manifests.book import check_examples, check_runbooks
from manifests.common import load_docs, read
from manifests.validate import Validator

from .support import TreeCase


def obj(kind, name, namespace="choria-provisioner", api="v1", **extra):
    d = {"apiVersion": api, "kind": kind,
         "metadata": {"name": name, "namespace": namespace,
                      "labels": {"app.kubernetes.io/name": "x", "helm.sh/chart": "c-0.1.0",
                                 "app.kubernetes.io/managed-by": "Helm"}}}
    d.update(extra)
    return d


def default_render():
    return [obj("Service", "svc", spec={"ports": [{"port": 80}]}),
            obj("ServiceAccount", "sa"),
            obj("CustomResourceDefinition", "crd", namespace=None),
            obj("Deployment", "op", api="apps/v1", spec={"replicas": 2})]


class DeployTest(TreeCase):
    def test_deploy_is_the_render_without_helm_labels_in_file_order(self):
        want = deploy.expected_deploy(default_render())
        self.assertEqual([d["kind"] for d in want["rbac.yaml"]], ["ServiceAccount"])
        self.assertEqual([d["kind"] for d in want["operator.yaml"]], ["Deployment", "Service"])
        for d in want["rbac.yaml"] + want["operator.yaml"]:
            self.assertEqual(d["metadata"]["labels"], {"app.kubernetes.io/name": "x"})

    def test_written_deploy_matches_the_render(self):
        os.makedirs(self.tree.deploy)
        deploy.write_deploy(self.report, self.tree, default_render())
        text = read(os.path.join(self.tree.deploy, "operator.yaml"))
        self.assertTrue(text.startswith(deploy.HEADER + "---\n"))
        have = {n: load_docs(read(os.path.join(self.tree.deploy, n))) for n in ("rbac.yaml", "operator.yaml")}
        deploy.check_matches_render(self.report, have, default_render())
        self.assertNoFailure()
        self.assertIn("ok    deploy/operator.yaml matches (2 objects)", self.output())

    def test_deploy_differing_from_the_render_is_reported_with_a_diff(self):
        have = deploy.expected_deploy(default_render())
        have["operator.yaml"][0]["spec"]["replicas"] = 3
        deploy.check_matches_render(self.report, have, default_render())
        self.assertEqual(self.report.failures, ["deploy/operator.yaml differs from the chart's default render "
                                                "(run scripts/check-manifests.sh --write-deploy)"])
        self.assertIn("        -  replicas: 2\n        +  replicas: 3\n", self.output())

    def test_a_missing_deploy_file_is_reported(self):
        have = deploy.expected_deploy(default_render())
        del have["rbac.yaml"]
        deploy.check_matches_render(self.report, have, default_render())
        self.assertFailure("deploy/rbac.yaml missing (run scripts/check-manifests.sh --write-deploy)")

    def test_an_operator_object_in_another_namespace_is_reported(self):
        have = deploy.expected_deploy(default_render())
        have["extra.yaml"] = [obj("Service", "elsewhere", namespace="default")]
        deploy.check_matches_render(self.report, have, default_render())
        self.assertFailure("deploy/: operator objects are in namespace choria-provisioner")

    def test_short_string_lists_are_written_on_one_line(self):
        text = deploy.dump([{"verbs": ["get", "list"], "args": ["--a=" + "x" * 80]}])
        self.assertIn("verbs: [get, list]", text)
        self.assertIn("args:\n  - --a=", text)

    def test_the_example_must_carry_the_helper_unchanged(self):
        self.put("examples/helper.sh", "#!/bin/sh\necho hi\n")
        example = [obj("Provisioner", "p", api="provisioning.choria.io/v1alpha1"),
                   obj("ConfigMap", "helper", data={"helper.sh": "#!/bin/sh\necho hi\n"})]
        deploy.check_example(self.report, self.tree, {"example-provisioner.yaml": example})
        self.assertNoFailure()
        example[1]["data"]["helper.sh"] = "#!/bin/sh\necho changed\n"
        deploy.check_example(self.report, self.tree, {"example-provisioner.yaml": example})
        self.assertEqual(self.report.failures, ["a ConfigMap carries examples/helper.sh unchanged"])

    def test_every_deploy_file_must_exist(self):
        self.put("deploy/namespace.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: choria-provisioner}\n")
        docs = deploy.load_deploy(self.report, self.tree, Validator(self.report, None, "crds/provisioner.yaml"))
        self.assertEqual(list(docs), ["namespace.yaml"])
        self.assertFailure("deploy/crd.yaml exists")
        self.assertFailure("deploy/example-provisioner.yaml exists")
        self.assertNotIn("deploy/namespace.yaml exists", self.report.failures)


ALERTS_MD = """# Alerts and runbooks

## ChoriaProvisionerNoLeader

No leader.

## ChoriaProvisionerHelperErrors

The helper fails.
"""


def rule_render(*alerts):
    return [{"kind": "PrometheusRule", "metadata": {"name": "r"},
             "spec": {"groups": [{"name": "g", "rules": [{"alert": a} for a in alerts]}]}}]


class RunbookTest(TreeCase):
    def setUp(self):
        super().setUp()
        self.put("docs/src/operations/alerts.md", ALERTS_MD)

    def test_every_shipped_alert_with_a_section_passes(self):
        check_runbooks(self.report, self.tree, rule_render("ChoriaProvisionerNoLeader", "ChoriaProvisionerHelperErrors"))
        self.assertNoFailure()

    def test_an_alert_without_a_runbook_section_is_reported(self):
        check_runbooks(self.report, self.tree, rule_render("ChoriaProvisionerNoLeader", "ChoriaProvisionerHelperErrors",
                                                           "ChoriaProvisionerRenewalStranded"))
        self.assertFailure("docs/src/operations/alerts.md has a section for each of",
                           "(missing: ['ChoriaProvisionerRenewalStranded'])")

    def test_a_section_for_an_alert_no_longer_shipped_is_reported(self):
        check_runbooks(self.report, self.tree, rule_render("ChoriaProvisionerNoLeader"))
        self.assertFailure("documents no alert the chart does not ship (stale: ['ChoriaProvisionerHelperErrors'])")

    def test_without_a_rule_render_nothing_is_checked(self):
        check_runbooks(self.report, self.tree, None)
        self.assertNoFailure()


class BookExamplesTest(TreeCase):
    def test_book_examples_are_validated_and_cert_manager_kinds_skipped(self):
        self.put("docs/src/examples/k8s/good.yaml",
                 "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n---\n"
                 "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: i}\nspec: {bogus: 1}\n")
        self.put("docs/src/examples/provisioner.yaml", "workers: 4\n")  # not a Kubernetes object
        check_examples(self.report, self.tree, Validator(self.report, None, "crds/provisioner.yaml"))
        self.assertNoFailure()
        self.assertEqual(self.report.counts, {"validated": 1, "crs": 0, "skipped": 1})
        self.assertIn("note  docs/src/examples/k8s/good.yaml: Issuer/i skipped", self.output())

    def test_an_invalid_book_example_is_reported(self):
        self.put("docs/src/examples/bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndatta: {a: b}\n")
        check_examples(self.report, self.tree, Validator(self.report, None, "crds/provisioner.yaml"))
        self.assertFailure("docs/src/examples/bad.yaml: ConfigMap/c")

    def test_an_example_that_is_not_yaml_is_reported(self):
        self.put("docs/src/examples/broken.yaml", "a: [b\n")
        check_examples(self.report, self.tree, Validator(self.report, None, "crds/provisioner.yaml"))
        self.assertFailure("docs/src/examples/broken.yaml: not YAML")


if __name__ == "__main__":
    unittest.main()
