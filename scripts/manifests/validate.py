"""Validation of Kubernetes objects: kubernetes-validate (strict: unknown fields
fail) against Kubernetes KUBE for built-in kinds, the CRD's schema (jsonschema)
for Provisioner objects."""

import functools

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kv

from .common import KUBE, kn

# kubernetes-validate reads and parses its JSON schemas (several MB) on every
# call; they do not change, so read each once.
if not hasattr(kv.schema_contents, "cache_info"):
    kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)

# Kinds kubernetes-validate has no schema for; each is skipped with a note.
NO_SCHEMA = ("ServiceMonitor", "PrometheusRule")


class Validator:
    """prov_schema: the Provisioner schema (crd.provisioner_schema), or None
    when the CRD is missing (a Provisioner then fails); crd_name: how the
    messages name the CRD's file."""

    def __init__(self, report, prov_schema, crd_name):
        self.report = report
        self.prov_schema = prov_schema
        self.crd_name = crd_name

    def validate_doc(self, doc, where):
        """Returns the object's kind/namespace/name when kubernetes-validate
        passed it, None otherwise (failed, skipped, or a Provisioner)."""
        r = self.report
        kind = doc.get("kind")
        if kind in NO_SCHEMA:
            r.counts["skipped"] += 1
            r.note(f"{where}: {kn(doc)} skipped (monitoring.coreos.com has no schema in kubernetes-validate)")
            return None
        if kind == "Provisioner":
            if self.prov_schema is None:
                r.fail(f"{where}: {kn(doc)} cannot be validated: {self.crd_name} is missing")
                return None
            errors = sorted(jsonschema.Draft7Validator(self.prov_schema).iter_errors(doc), key=lambda e: list(e.path))
            if errors:
                for e in errors:
                    r.fail(f"{where}: {kn(doc)}: {'.'.join(map(str, e.path)) or '<root>'}: {e.message}")
            else:
                r.counts["crs"] += 1
                r.ok(f"{where}: {kn(doc)} valid against the CRD's openAPIV3Schema")
            return None
        try:
            kubernetes_validate.validate(doc, KUBE, strict=True)
            r.counts["validated"] += 1
            return kn(doc)
        except kv.ValidationError as e:
            r.fail(f"{where}: {kn(doc)}: {'.'.join(map(str, e.path))}: {e.message}")
        except kv.SchemaNotFoundError as e:
            r.fail(f"{where}: {e.message}")
        return None

    def validate_all(self, docs, where):
        valid = [v for v in (self.validate_doc(d, where) for d in docs) if v]
        if valid:
            self.report.ok(f"{where}: {len(valid)} valid: {', '.join(sorted(v.split('/')[0] for v in valid))}")
