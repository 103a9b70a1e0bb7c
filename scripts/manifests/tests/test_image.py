import os
import subprocess
import unittest

from manifests.common import read
from manifests.image import (CONTRACT_KEYS, check_book_dockerfiles, check_dockerfile, dockerfile_block,
                             dockerignore_included, parse_contract)

from .support import TreeCase

CONTRACT = {
    "IMAGE_NAME": "choria-provisioner",
    "IMAGE_USER": "65532:65532",
    "IMAGE_USER_NAME": "nonroot",
    "IMAGE_HOME": "/tmp",
    "IMAGE_WORKDIR": "/tmp",
    "IMAGE_BINARY": "/usr/local/bin/choria-provisioner",
    "IMAGE_ENTRYPOINT": '["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"]',
    "IMAGE_CMD": '["--help"]',
    "IMAGE_PACKAGES": "ca-certificates tini",
    "IMAGE_TITLE": "choria-provisioner",
    "IMAGE_DESCRIPTION": "Choria provisioner",
    "IMAGE_LICENSES": "Apache-2.0",
}

DOCKERFILE = """\
FROM docker.io/library/rust:1.95-trixie AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release && install -D target/release/choria-provisioner /out/choria-provisioner

FROM docker.io/library/debian:trixie-slim
ARG VERSION=0.1.0
# >>> image contract: generated from scripts/image-contract.env by
# scripts/check-manifests.sh --write-deploy; edit that file, not these lines.
LABEL org.opencontainers.image.title="choria-provisioner" \\
      org.opencontainers.image.description="Choria provisioner" \\
      org.opencontainers.image.version="${VERSION}" \\
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \\
 && apt-get install -y --no-install-recommends ca-certificates tini \\
 && rm -rf /var/lib/apt/lists/* \\
 && groupadd --gid 65532 nonroot \\
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin nonroot \\
 && chmod 1777 /tmp
COPY --from=build /out/choria-provisioner /usr/local/bin/choria-provisioner
ENV HOME=/tmp
WORKDIR /tmp
USER 65532:65532
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"]
CMD ["--help"]
# <<< image contract
"""

OPERATOR = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: op}
spec:
  template:
    spec:
      containers: [{name: operator, image: "choria-provisioner:0.1.0"}]
"""
EXAMPLE = """\
apiVersion: provisioning.choria.io/v1alpha1
kind: Provisioner
metadata: {name: p}
spec: {replicas: 2}
"""


def contract_text(values):
    return "".join(f"{k}='{v}'\n" for k, v in values.items())


class ImageCase(TreeCase):
    """A repository with a Dockerfile, its context, deploy/ and the image
    contract, all agreeing."""

    def setUp(self):
        super().setUp()
        self.put("Cargo.toml", '[workspace]\nmembers = []\n\n[workspace.package]\nversion = "0.1.0"\n')
        self.put("Cargo.lock", "")
        self.put("src/main.rs", "fn main() {}\n")
        self.put(".dockerignore", "# the context\n*\n!Cargo.toml\n!Cargo.lock\n!src/\n")
        self.put("deploy/operator.yaml", OPERATOR)
        self.put("deploy/example-provisioner.yaml", EXAMPLE)
        self.put("Dockerfile", DOCKERFILE)
        self.put_contract(CONTRACT)

    def put_contract(self, values, text=None):
        self.put("scripts/image-contract.env", "# the image\n\n" + (text if text is not None else contract_text(values)))

    def check(self, write_block=False):
        check_dockerfile(self.report, self.tree, write_block)


class ContractTest(unittest.TestCase):
    def test_literal_lines_are_read_and_comments_skipped(self):
        values, bad = parse_contract("# c\n\nIMAGE_NAME='x'\nIMAGE_CMD='[\"--help\"]'\nIMAGE_DESCRIPTION='a b'\n")
        self.assertEqual(values, {"IMAGE_NAME": "x", "IMAGE_CMD": '["--help"]', "IMAGE_DESCRIPTION": "a b"})
        self.assertEqual(bad, [])

    def test_a_line_that_is_not_one_literal_is_refused(self):
        for line in ("IMAGE_NAME=$NAME", "IMAGE_NAME='a' 'b'", "image_name='x'", "export IMAGE_NAME='x'",
                     "IMAGE_NAME=\"${X}\""):
            with self.subTest(line=line):
                values, bad = parse_contract(line + "\n")
                self.assertEqual((values, bad), ({}, [line]))

    def test_dockerignore_exceptions_let_paths_in(self):
        rules = ["*", "!Cargo.toml", "!src/"]
        self.assertTrue(dockerignore_included(rules, "Cargo.toml"))
        self.assertTrue(dockerignore_included(rules, "src"))
        self.assertTrue(dockerignore_included(rules, "src/main.rs"))
        self.assertFalse(dockerignore_included(rules, "crates"))
        self.assertFalse(dockerignore_included(rules, "target"))


class ContractReadersTest(unittest.TestCase):
    def test_the_shell_and_python_read_the_same_contract(self):
        """scripts/lib.sh load_image_contract sources the file, Python parses it:
        the same names and values, and the same list of required names."""
        scripts = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run(
            ["bash", "-c", 'set -eu; source "$1/lib.sh"; load_image_contract; echo "$IMAGE_CONTRACT_VARS"; '
             'for v in $IMAGE_CONTRACT_VARS; do printf "%s=%s\\n" "$v" "${!v}"; done', "_", scripts],
            check=True, capture_output=True, text=True).stdout.splitlines()
        self.assertEqual(out[0].split(), CONTRACT_KEYS)
        values, bad = parse_contract(read(os.path.join(scripts, "image-contract.env")))
        self.assertEqual(bad, [])
        self.assertEqual(dict(line.split("=", 1) for line in out[1:]), values)


class DockerfileTest(ImageCase):
    def test_a_dockerfile_that_agrees_with_the_contract_passes(self):
        self.check()
        self.assertNoFailure()
        self.assertIn("ok    Dockerfile parses (15 instructions, 2 stages)", self.output())

    def test_a_dockerfile_that_does_not_parse_is_reported(self):
        self.put("Dockerfile", "FROM a\nRUN <<EOF\n")
        self.check()
        self.assertFailure("Dockerfile does not parse")

    def test_a_final_stage_running_as_root_is_reported(self):
        self.put("Dockerfile", DOCKERFILE + "USER 0:0\n")
        self.check()
        self.assertFailure("final stage runs as UID 65532 (USER 0:0)")
        self.assertFailure("agree: USER 65532:65532 (Dockerfile: 0:0)")

    def test_an_entrypoint_without_tini_is_reported(self):
        self.put("Dockerfile", DOCKERFILE.replace('["/usr/bin/tini", "--", ', "["))
        self.check()
        self.assertFailure('ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"] (tini reaps')
        self.assertFailure('agree: ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"] '
                           "(Dockerfile: ['/usr/local/bin/choria-provisioner'])")

    def test_a_copy_source_the_dockerignore_keeps_out_is_reported(self):
        self.put(".dockerignore", "*\n!Cargo.toml\n!Cargo.lock\n")
        self.check()
        self.assertFailure("COPY sources exist and pass .dockerignore: Cargo.toml, Cargo.lock, src (not: ['src'])")

    def test_a_copy_source_that_does_not_exist_is_reported(self):
        self.put("Dockerfile", DOCKERFILE.replace("COPY src ./src\n", "COPY src ./src\nCOPY benches ./benches\n"))
        self.put(".dockerignore", "*\n!Cargo.toml\n!Cargo.lock\n!src/\n!benches/\n")
        self.check()
        self.assertFailure("(not: ['benches'])")

    def test_each_difference_from_the_contract_is_reported(self):
        cases = [
            ("CMD", "IMAGE_CMD", '["--version"]', 'agree: CMD ["--version"] (Dockerfile: [\'--help\'])'),
            ("WORKDIR", "IMAGE_WORKDIR", "/work", "agree: WORKDIR /work (Dockerfile: /tmp)"),
            ("HOME", "IMAGE_HOME", "/home/nonroot", "agree: ENV HOME=/home/nonroot (Dockerfile: /tmp)"),
            ("binary", "IMAGE_BINARY", "/usr/bin/choria-provisioner",
             "agree: the binary at /usr/bin/choria-provisioner (Dockerfile: ['/usr/local/bin/choria-provisioner'])"),
            ("packages", "IMAGE_PACKAGES", "ca-certificates tini curl",
             "agree: packages ca-certificates curl tini (Dockerfile: ca-certificates tini)"),
            ("user name", "IMAGE_USER_NAME", "provisioner", "agree: user provisioner 65532:65532 with home /tmp"),
            ("title", "IMAGE_TITLE", "other", "agree: label org.opencontainers.image.title (Dockerfile: choria-provisioner)"),
            ("licenses", "IMAGE_LICENSES", "MIT", "agree: label org.opencontainers.image.licenses (Dockerfile: Apache-2.0)"),
        ]
        for what, key, value, want in cases:
            with self.subTest(what=what):
                self.setUp()
                self.put_contract(dict(CONTRACT, **{key: value}))
                self.check()
                self.assertFailure(want)

    def test_an_entrypoint_not_ending_in_the_binary_is_reported(self):
        self.put_contract(dict(CONTRACT, IMAGE_ENTRYPOINT='["/usr/bin/tini", "--", "/bin/sh"]'))
        self.check()
        self.assertFailure("the entrypoint ends in the binary /usr/local/bin/choria-provisioner")

    def test_an_entrypoint_that_is_not_json_is_reported(self):
        self.put_contract(dict(CONTRACT, IMAGE_ENTRYPOINT="/usr/bin/tini"))
        self.check()
        self.assertFailure("IMAGE_ENTRYPOINT is not a JSON list: /usr/bin/tini")

    def test_a_contract_missing_a_value_is_reported(self):
        self.put_contract({k: v for k, v in CONTRACT.items() if k != "IMAGE_LICENSES"})
        self.check()
        self.assertFailure("declares the image contract (11 values); missing ['IMAGE_LICENSES']")

    def test_a_contract_line_that_is_not_a_literal_is_reported(self):
        self.put_contract(CONTRACT, contract_text(CONTRACT) + "IMAGE_EXTRA=$(date)\n")
        self.check()
        self.assertFailure("image contract: not a NAME='literal' line: IMAGE_EXTRA=$(date)")

    def test_a_version_other_than_cargos_is_reported(self):
        self.put("Cargo.toml", '[workspace.package]\nversion = "0.2.0"\n')
        self.check()
        self.assertFailure("Dockerfile: label version ${VERSION} with ARG VERSION=0.2.0, Cargo.toml's version "
                           "(found ['VERSION=0.1.0'])")
        self.assertFailure("deploy/ names the image build-image.sh tags, choria-provisioner:0.2.0 (not: "
                           "['deploy/operator.yaml: choria-provisioner:0.1.0'])")

    def test_deploy_naming_another_image_is_reported(self):
        self.put("deploy/operator.yaml", OPERATOR.replace("choria-provisioner:0.1.0", "elsewhere:1"))
        self.check()
        self.assertFailure("deploy/ names the image build-image.sh tags, choria-provisioner:0.1.0 "
                           "(not: ['deploy/operator.yaml: elsewhere:1'])")

    def test_an_example_provisioner_naming_an_image_is_reported(self):
        # The operator's default policy refuses any image but its own, which
        # each install chooses: an example that names one does not apply.
        self.put("deploy/example-provisioner-x.yaml", EXAMPLE.replace("{replicas: 2}", '{image: "choria-provisioner:0.1.0"}'))
        self.check()
        self.assertFailure("deploy/'s example Provisioners name no image (the operator's own runs) "
                           "(they do: ['deploy/example-provisioner-x.yaml: choria-provisioner:0.1.0'])")


class GeneratedBlockTest(ImageCase):
    def test_the_block_is_what_the_contract_makes(self):
        self.assertIn(dockerfile_block(CONTRACT), DOCKERFILE)
        self.check()
        self.assertIn("ok    Dockerfile's image contract block is generated from scripts/image-contract.env", self.output())

    def test_a_contract_change_not_written_to_the_dockerfile_is_reported(self):
        self.put_contract(dict(CONTRACT, IMAGE_DESCRIPTION="something else"))
        self.check()
        self.assertFailure("Dockerfile's image contract block differs from what scripts/image-contract.env makes "
                           "(refresh: scripts/check-manifests.sh --write-deploy)")

    def test_a_hand_edit_inside_the_block_is_reported(self):
        self.put("Dockerfile", DOCKERFILE.replace("--no-install-recommends ca-certificates tini",
                                                  "--no-install-recommends ca-certificates tini curl"))
        self.check()
        self.assertFailure("Dockerfile's image contract block differs")

    def test_write_mode_regenerates_the_block_and_keeps_the_rest(self):
        self.put_contract(dict(CONTRACT, IMAGE_WORKDIR="/work", IMAGE_LICENSES="MIT"))
        self.check(write_block=True)
        self.assertNoFailure()
        text = read(os.path.join(self.root, "Dockerfile"))
        self.assertIn("WORKDIR /work\n", text)
        self.assertIn('org.opencontainers.image.licenses="MIT"\n', text)
        self.assertTrue(text.startswith(DOCKERFILE.split("# >>>")[0]))

    def test_an_instruction_after_the_block_that_overrides_it_is_reported(self):
        self.put("Dockerfile", DOCKERFILE + "WORKDIR /\n")
        self.check()
        self.assertIn("ok    Dockerfile's image contract block is generated", self.output())
        self.assertFailure("agree: WORKDIR /tmp (Dockerfile: /)")

    def test_a_dockerfile_without_the_block_is_reported(self):
        self.put("Dockerfile", DOCKERFILE.replace("# >>> image contract", "# image contract"))
        self.check(write_block=True)
        self.assertFailure("Dockerfile has 0 '# >>> image contract' ... '# <<< image contract' blocks, want 1")

    def test_a_missing_contract_is_reported(self):
        os.remove(os.path.join(self.root, "scripts", "image-contract.env"))
        self.check()
        self.assertFailure("scripts/image-contract.env is missing: it is the image's one definition")

    def test_label_values_are_quoted(self):
        block = dockerfile_block(dict(CONTRACT, IMAGE_DESCRIPTION='the "provisioner"'))
        self.assertIn('org.opencontainers.image.description="the \\"provisioner\\"" \\\n', block)


DERIVED = """\
ARG BASE=registry.example.net/choria-provisioner:0.1.0-abc
FROM ${BASE}
USER root
RUN printf 'exec /usr/bin/tini -s -- /usr/local/bin/choria-provisioner "$@"' >/usr/sbin/choria-provisioner
USER 65532:65532
"""


class BookDockerfileTest(ImageCase):
    def check_book(self, text):
        self.put("docs/src/examples/migrating/Dockerfile", text)
        check_book_dockerfiles(self.report, self.tree)

    def test_an_image_made_from_ours_passes(self):
        self.check_book(DERIVED)
        self.assertNoFailure()
        self.assertIn("ok    docs/src/examples/migrating/Dockerfile: FROM our image (ARG BASE)", self.output())

    def test_another_base_is_reported(self):
        self.check_book(DERIVED.replace("registry.example.net/choria-provisioner:0.1.0-abc", "debian:trixie-slim"))
        self.assertFailure("FROM ['${BASE}'] with ARG BASE=['debian:trixie-slim'], want FROM ${BASE} defaulting "
                           "to choria-provisioner:")

    def test_ending_as_root_is_reported(self):
        self.check_book(DERIVED.replace("USER 65532:65532\n", ""))
        self.assertFailure("ends as USER root, want 65532:65532")

    def test_a_binary_path_the_image_does_not_have_is_reported(self):
        self.check_book(DERIVED.replace("/usr/local/bin/choria-provisioner", "/usr/sbin/choria-provisioner.real"))
        self.assertFailure("names no /usr/local/bin/choria-provisioner")


if __name__ == "__main__":
    unittest.main()
