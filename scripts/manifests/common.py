"""The repository's paths, and helpers for the YAML documents every check reads."""

import os

import yaml

KUBE = "1.34"
NAMESPACE = "choria-provisioner"
RELEASE = "choria-provisioner-operator"
LEASE = "choria-provisioner-operator"


class Tree:
    """Where each checked file lives, under the repository's root."""

    def __init__(self, root):
        self.root = root
        self.chart = os.path.join(root, "charts", "choria-provisioner-operator")
        self.chart_crd = os.path.join(self.chart, "files", "crds", "provisioner.yaml")
        self.chart_readme = os.path.join(self.chart, "README.md")
        self.chart_values = os.path.join(self.chart, "values.yaml")
        self.chart_dashboard = os.path.join(self.chart, "dashboards", "choria-provisioner.json")
        self.our_dashboard = os.path.join(self.chart, "dashboards", "choria-provisioner-day-two.json")
        self.upstream_dashboard = os.path.join(root, "..", "shared", "peers", "go-provisioner", "dashboard.json")
        self.crd_src = os.path.join(root, "crds", "provisioner.yaml")
        self.deploy = os.path.join(root, "deploy")
        self.book_examples = os.path.join(root, "docs", "src", "examples")
        self.book_alerts = os.path.join(root, "docs", "src", "operations", "alerts.md")
        self.metrics_rs = os.path.join(root, "crates", "core", "src", "provision", "metrics.rs")
        self.dockerfile = os.path.join(root, "Dockerfile")
        self.dockerignore = os.path.join(root, ".dockerignore")
        self.image_contract = os.path.join(root, "scripts", "image-contract.env")
        self.cargo_toml = os.path.join(root, "Cargo.toml")
        self.helper = os.path.join(root, "examples", "helper.sh")

    def rel(self, path):
        return os.path.relpath(path, self.root)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def load_docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def kn(doc):
    """Kind/namespace/name, as the messages name an object."""
    ns = doc.get("metadata", {}).get("namespace")
    name = doc.get("metadata", {}).get("name", "?")
    return f"{doc.get('kind', '?')}/{ns + '/' if ns else ''}{name}"


def find(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def kinds(docs):
    return sorted({d["kind"] for d in docs})


def deployment_args(docs):
    dep = find(docs, "Deployment")
    return dep[0]["spec"]["template"]["spec"]["containers"][0].get("args", []) if dep else []
