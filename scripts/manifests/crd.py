"""The CRD: crds/provisioner.yaml (the committed output of `choria-provisioner
crd`), its copies in the chart and deploy/, and the Provisioner schema derived
from it."""

import copy
import os

from .common import load_docs, read, write


def provisioner_schema(crd):
    """The stored version's openAPIV3Schema of the CRD document `crd` as JSON
    Schema, for Provisioner objects."""
    versions = crd["spec"]["versions"]
    stored = next((v for v in versions if v.get("storage")), versions[0])

    def strip(node):
        # OpenAPI extensions out; and, as kubectl's strict field validation does,
        # unknown fields refused wherever the schema does not preserve them.
        if isinstance(node, dict):
            out = {k: strip(v) for k, v in node.items()
                   if k != "nullable" and not k.startswith("x-kubernetes-")}
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                out["additionalProperties"] = False
            return out
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    schema = strip(stored["schema"]["openAPIV3Schema"])
    # The apiserver fills apiVersion/kind/metadata itself; check them here.
    group = crd["spec"]["group"]
    schema.setdefault("properties", {})
    schema["properties"]["apiVersion"] = {"const": f"{group}/{stored['name']}"}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                "maxLength": 63}},
    }
    schema.setdefault("required", [])
    schema["required"] = sorted(set(schema["required"]) | {"apiVersion", "kind", "metadata"})
    return schema


def check_copies(report, tree, write_copies=False):
    """crds/provisioner.yaml exists and the chart's and deploy/'s copies equal
    it (written first with write_copies). Returns the Provisioner schema, or
    None without the source."""
    report.section("CRD copies")
    rel = tree.rel
    if not report.check(os.path.exists(tree.crd_src),
                        f"{rel(tree.crd_src)} exists (committed output of `choria-provisioner crd`)"):
        return None
    src = read(tree.crd_src)
    schema = provisioner_schema(load_docs(src)[0])
    for dst in (tree.chart_crd, os.path.join(tree.deploy, "crd.yaml")):
        if write_copies:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            write(dst, src)
            report.line(f"  wrote {rel(dst)}")
        same = os.path.exists(dst) and read(dst) == src
        report.check(same, f"{rel(dst)} is identical to {rel(tree.crd_src)}" if same else
                     f"{rel(dst)} differs from {rel(tree.crd_src)} (refresh: scripts/check-manifests.sh --write-deploy)")
    return schema


def check_rendered(report, tree, label, rendered_crd):
    """The CRD the chart renders is crds/provisioner.yaml apart from labels and
    annotations."""
    c = copy.deepcopy(rendered_crd)
    for key in ("labels", "annotations"):
        c["metadata"].pop(key, None)
    s = load_docs(read(tree.crd_src))[0]
    for key in ("labels", "annotations"):
        s["metadata"].pop(key, None)
    report.check(c == s, f"{label}: rendered CRD equals {tree.rel(tree.crd_src)} apart from labels/annotations")
