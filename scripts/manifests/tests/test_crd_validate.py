import os
import unittest

import yaml

from manifests.common import load_docs
from manifests.crd import check_copies, check_rendered, provisioner_schema
from manifests.validate import Validator

from .support import TreeCase

CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: provisioners.provisioning.choria.io
  labels: {app: x}
spec:
  group: provisioning.choria.io
  names: {kind: Provisioner, plural: provisioners}
  scope: Namespaced
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [image]
            properties:
              image: {type: string, nullable: true}
              replicas: {type: integer, minimum: 1}
              extra:
                type: object
                x-kubernetes-preserve-unknown-fields: true
                properties:
                  known: {type: string}
"""


def provisioner(**spec):
    return {"apiVersion": "provisioning.choria.io/v1alpha1", "kind": "Provisioner",
            "metadata": {"name": "fleet", "namespace": "choria"}, "spec": spec}


class ProvisionerSchemaTest(unittest.TestCase):
    def setUp(self):
        import jsonschema
        self.validator = jsonschema.Draft7Validator(provisioner_schema(yaml.safe_load(CRD)))

    def errors(self, doc):
        return [e.message for e in self.validator.iter_errors(doc)]

    def test_a_valid_provisioner_passes(self):
        self.assertEqual(self.errors(provisioner(image="choria-provisioner:0.1.0", replicas=2)), [])

    def test_an_unknown_field_is_refused_as_strict_field_validation_would(self):
        self.assertTrue(any("'imag' was unexpected" in e for e in self.errors(provisioner(image="x", imag="y"))))

    def test_unknown_fields_are_kept_where_the_schema_preserves_them(self):
        self.assertEqual(self.errors(provisioner(image="x", extra={"known": "a", "anything": 1})), [])

    def test_the_schema_bounds_are_kept(self):
        self.assertTrue(self.errors(provisioner(image="x", replicas=0)))

    def test_api_version_kind_and_name_are_checked(self):
        doc = provisioner(image="x")
        doc["apiVersion"] = "provisioning.choria.io/v1"
        self.assertTrue(self.errors(doc))
        doc = provisioner(image="x")
        doc["metadata"]["name"] = "Not_A_Name"
        self.assertTrue(self.errors(doc))
        doc = provisioner(image="x")
        del doc["kind"]
        self.assertTrue(self.errors(doc))


class CrdCopiesTest(TreeCase):
    def test_copies_identical_to_the_source_pass_and_give_the_schema(self):
        for path in ("crds/provisioner.yaml", "charts/choria-provisioner-operator/files/crds/provisioner.yaml",
                     "deploy/crd.yaml"):
            self.put(path, CRD)
        self.assertIsNotNone(check_copies(self.report, self.tree))
        self.assertNoFailure()

    def test_a_copy_that_differs_is_reported_with_how_to_refresh_it(self):
        self.put("crds/provisioner.yaml", CRD)
        self.put("charts/choria-provisioner-operator/files/crds/provisioner.yaml", CRD)
        self.put("deploy/crd.yaml", CRD.replace("minimum: 1", "minimum: 0"))
        check_copies(self.report, self.tree)
        self.assertFailure("deploy/crd.yaml differs from crds/provisioner.yaml "
                           "(refresh: scripts/check-manifests.sh --write-deploy)")

    def test_write_mode_writes_the_copies(self):
        self.put("crds/provisioner.yaml", CRD)
        check_copies(self.report, self.tree, write_copies=True)
        self.assertNoFailure()
        with open(os.path.join(self.root, "deploy", "crd.yaml"), encoding="utf-8") as f:
            self.assertEqual(f.read(), CRD)

    def test_a_missing_source_is_reported(self):
        self.assertIsNone(check_copies(self.report, self.tree))
        self.assertFailure("crds/provisioner.yaml exists")

    def test_the_rendered_crd_must_equal_the_source_apart_from_labels(self):
        self.put("crds/provisioner.yaml", CRD)
        rendered = load_docs(CRD)[0]
        rendered["metadata"]["labels"] = {"helm.sh/chart": "c"}
        rendered["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
        check_rendered(self.report, self.tree, "default", rendered)
        self.assertNoFailure()
        rendered["spec"]["scope"] = "Cluster"
        check_rendered(self.report, self.tree, "default", rendered)
        self.assertFailure("default: rendered CRD equals crds/provisioner.yaml apart from labels/annotations")


class ValidatorTest(TreeCase):
    def validator(self, schema=True):
        return Validator(self.report, provisioner_schema(yaml.safe_load(CRD)) if schema else None, "crds/provisioner.yaml")

    def test_a_valid_built_in_object_is_counted(self):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
        self.validator().validate_all([cm], "here")
        self.assertNoFailure()
        self.assertEqual(self.report.counts["validated"], 1)
        self.assertIn("here: 1 valid: ConfigMap", self.output())

    def test_an_unknown_field_in_a_built_in_object_fails_strict_validation(self):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "dataa": {"a": "b"}}
        self.validator().validate_all([cm], "here")
        self.assertFailure("here: ConfigMap/c")

    def test_a_wrong_type_in_a_deployment_fails(self):
        dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"replicas": "two", "selector": {"matchLabels": {"a": "b"}},
                        "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}}
        self.validator().validate_all([dep], "here")
        self.assertFailure("here: Deployment/d: spec.replicas")

    def test_an_unknown_kind_fails(self):
        self.validator().validate_all([{"apiVersion": "example.net/v1", "kind": "Gadget", "metadata": {"name": "g"}}],
                                      "here")
        self.assertEqual(len(self.report.failures), 1)

    def test_a_provisioner_is_validated_against_the_crd(self):
        v = self.validator()
        v.validate_all([provisioner(image="x")], "here")
        self.assertNoFailure()
        self.assertEqual(self.report.counts["crs"], 1)
        v.validate_all([provisioner(image="x", replicas=0)], "there")
        self.assertFailure("there: Provisioner/choria/fleet: spec.replicas:")

    def test_a_provisioner_without_the_crd_fails(self):
        self.validator(schema=False).validate_all([provisioner(image="x")], "here")
        self.assertFailure("cannot be validated: crds/provisioner.yaml is missing")

    def test_monitoring_kinds_are_skipped_with_a_note(self):
        sm = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "s"},
              "spec": {"bogus": True}}
        self.validator().validate_all([sm], "here")
        self.assertNoFailure()
        self.assertEqual(self.report.counts["skipped"], 1)
        self.assertIn("note  here: ServiceMonitor/s skipped", self.output())


if __name__ == "__main__":
    unittest.main()
