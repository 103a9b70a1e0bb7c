"""python -m manifests ROOT [--write-deploy]: every manifest check, in order;
exit 1 on any failure (scripts/check-manifests.sh says what each does)."""

import os
import sys
from importlib.metadata import version

from . import book, chart, crd, deploy, image, monitoring, readme
from .common import KUBE, RELEASE, Tree
from .report import Report
from .validate import Validator


def run(tree, write_generated, report):
    helm = chart.helm
    report.line(f"helm-python-sdk {helm.helm_c_version()} (Helm SDK {helm.helm_sdk_version()}), "
                f"kubernetes-validate {version('kubernetes-validate')} (schemas for Kubernetes {KUBE}), "
                f"jsonschema {version('jsonschema')}")

    prov_schema = crd.check_copies(report, tree, write_generated)
    validator = Validator(report, prov_schema, tree.rel(tree.crd_src))
    monitoring.check_dashboard_copy(report, tree)

    the_chart = chart.Chart(tree.chart)
    chart.check_lint(report, the_chart)
    rendered = chart.check_renders(report, tree, the_chart, prov_schema)

    report.section(f"kubernetes-validate {KUBE} --strict: rendered chart")
    for label, docs in rendered.items():
        validator.validate_all(docs, f"chart[{label}]")

    if write_generated and "default" in rendered:
        deploy.write_deploy(report, tree, rendered["default"])

    report.section(f"kubernetes-validate {KUBE} --strict: deploy/")
    deploy_docs = deploy.load_deploy(report, tree, validator)

    report.section("deploy/ equals the chart's default render")
    if "default" in rendered:
        deploy.check_matches_render(report, deploy_docs, rendered["default"])
    deploy.check_example(report, tree, deploy_docs)

    book.check_examples(report, tree, validator)
    book.check_runbooks(report, tree, rendered.get("prometheusRule"))
    readme.check_chart_readme(report, tree, rendered.get("default"), rendered.get("prometheusRule"), RELEASE)

    report.section("Dockerfile")
    image.check_dockerfile(report, tree, write_generated)
    image.check_book_dockerfiles(report, tree)

    report.line("\n== summary")
    counts = report.counts
    report.line(f"  {counts['validated']} objects valid against Kubernetes {KUBE} (strict), "
                f"{counts['crs']} Provisioner(s) valid against the CRD, "
                f"{counts['skipped']} ServiceMonitor/PrometheusRule/cert-manager object(s) skipped (no schema)")
    if report.failures:
        report.line(f"  {len(report.failures)} FAILURE(S):")
        for f in report.failures:
            report.line(f"    - {f}")
        return 1
    report.line("  all manifest checks passed")
    return 0


def main(argv):
    if not argv:
        sys.exit("usage: python -m manifests ROOT [--write-deploy]")
    root, args = argv[0], argv[1:]
    for arg in args:
        if arg != "--write-deploy":
            sys.exit(f"check-manifests: unknown argument {arg}")
    return run(Tree(os.path.abspath(root)), "--write-deploy" in args, Report())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
