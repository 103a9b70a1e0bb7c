"""The release image: scripts/image-contract.env is its one definition (user,
entrypoint, cmd, workdir, HOME, binary path, packages, labels). The
Dockerfile's final stage is generated from it between its `# >>> image
contract` and `# <<< image contract` lines (--write-deploy writes them);
scripts/build-image.sh, scripts/image-smoke.sh and scripts/node-tier.sh
source the file. Here: the contract is NAME='literal' lines only, the
Dockerfile parses (BuildKit's parser), its block is what the contract makes,
nothing outside the block overrides it, .dockerignore lets in what it copies,
and the version is Cargo.toml's."""

import fnmatch
import json
import os
import re
import shlex

from .common import load_docs, read, write

CONTRACT_KEYS = ["IMAGE_NAME", "IMAGE_USER", "IMAGE_USER_NAME", "IMAGE_HOME", "IMAGE_WORKDIR", "IMAGE_BINARY",
                 "IMAGE_ENTRYPOINT", "IMAGE_CMD", "IMAGE_PACKAGES", "IMAGE_TITLE", "IMAGE_DESCRIPTION",
                 "IMAGE_LICENSES"]

# The Dockerfile's generated block: from its first marker line to its last.
BLOCK_BEGIN = ("# >>> image contract: generated from scripts/image-contract.env by\n"
               "# scripts/check-manifests.sh --write-deploy; edit that file, not these lines.\n")
BLOCK_END = "# <<< image contract\n"
BLOCK_RE = re.compile(r"^# >>> image contract\b.*?^# <<< image contract$\n?", re.M | re.S)
# Where the Dockerfile's build stage leaves the binary.
BUILD_OUTPUT = "/out/choria-provisioner"


def parse_contract(text):
    """NAME='literal' lines (comments and blank lines aside) -> (values,
    offending lines). A line that is not one literal (a `$`, two words, no
    NAME=) is refused: shells source the file, this reads it."""
    values, bad = {}, []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", line)
        try:
            words = shlex.split(m.group(2)) if m else []
        except ValueError:
            words = []
        if not m or len(words) != 1 or "$" in m.group(2):
            bad.append(line)
            continue
        values[m.group(1)] = words[0]
    return values, bad


def _quoted(value):
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dockerfile_block(c):
    """The Dockerfile's final stage as contract `c` makes it, marker lines included."""
    uid, _, gid = c["IMAGE_USER"].partition(":")
    name, home = c["IMAGE_USER_NAME"], c["IMAGE_HOME"]
    return "".join([
        BLOCK_BEGIN,
        f"LABEL org.opencontainers.image.title={_quoted(c['IMAGE_TITLE'])} \\\n",
        f"      org.opencontainers.image.description={_quoted(c['IMAGE_DESCRIPTION'])} \\\n",
        '      org.opencontainers.image.version="${VERSION}" \\\n',
        f"      org.opencontainers.image.licenses={_quoted(c['IMAGE_LICENSES'])}\n",
        "RUN apt-get update \\\n",
        f" && apt-get install -y --no-install-recommends {' '.join(c['IMAGE_PACKAGES'].split())} \\\n",
        " && rm -rf /var/lib/apt/lists/* \\\n",
        f" && groupadd --gid {gid} {name} \\\n",
        f" && useradd --uid {uid} --gid {gid} --no-create-home --home-dir {home} --shell /usr/sbin/nologin {name} \\\n",
        " && chmod 1777 /tmp\n",
        f"COPY --from=build {BUILD_OUTPUT} {c['IMAGE_BINARY']}\n",
        f"ENV HOME={home}\n",
        f"WORKDIR {c['IMAGE_WORKDIR']}\n",
        f"USER {c['IMAGE_USER']}\n",
        f"ENTRYPOINT {c['IMAGE_ENTRYPOINT']}\n",
        f"CMD {c['IMAGE_CMD']}\n",
        BLOCK_END,
    ])


def with_block(dockerfile_text, block):
    """The Dockerfile with its generated block replaced by `block`; None when
    it has not exactly one."""
    if len(BLOCK_RE.findall(dockerfile_text)) != 1:
        return None
    return BLOCK_RE.sub(lambda _: block, dockerfile_text)


def dockerignore_included(rules, path):
    """Whether .dockerignore's rules ("*" then "!path" exceptions) let `path`
    into the build context."""
    keep = True
    for r in rules:
        neg = r.startswith("!")
        pat = r[1:].rstrip("/") if neg else r.rstrip("/")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
            keep = neg
    return keep


def load_contract(report, tree):
    """scripts/image-contract.env's values (each offending line a failure);
    None without the file."""
    rel = tree.rel(tree.image_contract)
    if not os.path.exists(tree.image_contract):
        report.fail(f"{rel} is missing: it is the image's one definition")
        return None
    values, bad = parse_contract(read(tree.image_contract))
    for line in bad:
        report.fail(f"{rel} image contract: not a NAME='literal' line: {line}")
    return values


def check_dockerfile(report, tree, write_block=False):
    """Section "Dockerfile": everything about the Dockerfile and the contract."""
    import dockerfile

    c = load_contract(report, tree)
    complete = c is not None and all(k in c for k in CONTRACT_KEYS)
    if write_block and complete:
        new = with_block(read(tree.dockerfile), dockerfile_block(c))
        if new is not None:
            write(tree.dockerfile, new)
            report.line(f"  wrote {tree.rel(tree.dockerfile)} (its image contract block)")
    try:
        cmds = dockerfile.parse_file(tree.dockerfile)
    except dockerfile.GoParseError as e:
        report.fail(f"Dockerfile does not parse: {e}")
        return
    report.ok(f"Dockerfile parses ({len(cmds)} instructions, {sum(x.cmd == 'FROM' for x in cmds)} stages)")
    last = max(i for i, x in enumerate(cmds) if x.cmd == "FROM")
    final = cmds[last:]
    user = [x.value[0] for x in final if x.cmd == "USER"]
    report.check(user and user[-1].split(":")[0] == "65532", f"final stage runs as UID 65532 (USER {user[-1] if user else '-'})")
    entry = [x for x in final if x.cmd == "ENTRYPOINT"]
    report.check(entry and entry[-1].json
                 and list(entry[-1].value) == ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"],
                 'ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"] (tini reaps escaped helpers)')
    installs = " ".join(" ".join(x.value) for x in final if x.cmd == "RUN")
    report.check(re.search(r"apt-get install[^&]*\btini\b", installs) is not None,
                 "the final stage installs tini (Debian package) for its ENTRYPOINT")
    # .dockerignore: every context COPY source must be let in.
    rules = [line.strip() for line in read(tree.dockerignore).splitlines()
             if line.strip() and not line.startswith("#")]
    sources = [v for x in cmds if x.cmd == "COPY" and not any(f.startswith("--from") for f in x.flags)
               for v in x.value[:-1]]
    missing = [s for s in sources if not dockerignore_included(rules, s) or not os.path.exists(os.path.join(tree.root, s))]
    report.check(not missing, f"COPY sources exist and pass .dockerignore: {', '.join(sources)}"
                 + (f" (not: {missing})" if missing else ""))
    if c is not None:
        check_image_contract(report, tree, c, final)


def check_image_contract(report, tree, c, final):
    """The Dockerfile's final stage (`final`, parsed) is what contract `c`
    makes: its block is generated from it, and the stage as a whole (the
    lines outside the block could still override it) promises the same
    user, entrypoint, cmd, workdir, HOME, binary path, packages and labels
    (scripts/image-smoke.sh holds the built image to the same file)."""
    rel = tree.rel(tree.image_contract)
    missing = [k for k in CONTRACT_KEYS if k not in c]
    if not report.check(not missing, f"{rel} declares the image contract ({len(c)} values)"
                        + (f"; missing {missing}" if missing else "")):
        return
    text = read(tree.dockerfile)
    blocks = BLOCK_RE.findall(text)
    if len(blocks) != 1:
        report.fail(f"Dockerfile has {len(blocks)} '# >>> image contract' ... '# <<< image contract' blocks, want 1")
    else:
        report.check(blocks[0] == dockerfile_block(c),
                     f"Dockerfile's image contract block is generated from {rel}" if blocks[0] == dockerfile_block(c)
                     else f"Dockerfile's image contract block differs from what {rel} makes "
                          "(refresh: scripts/check-manifests.sh --write-deploy)")
    who = f"Dockerfile and {rel}"

    def agree(what, dockerfile, want):
        return report.check(dockerfile == want, f"{who} agree: {what}"
                            + ("" if dockerfile == want else f" (Dockerfile: {dockerfile})"))

    def last(cmd):
        found = [x for x in final if x.cmd == cmd]
        return found[-1] if found else None

    user = last("USER")
    agree(f"USER {c['IMAGE_USER']}", user.value[0] if user else None, c["IMAGE_USER"])
    for cmd, key in (("ENTRYPOINT", "IMAGE_ENTRYPOINT"), ("CMD", "IMAGE_CMD")):
        x = last(cmd)
        try:
            want = json.loads(c[key])
        except ValueError:
            report.fail(f"{rel}: {key} is not a JSON list: {c[key]}")
            continue
        agree(f"{cmd} {json.dumps(want)}", list(x.value) if x is not None and x.json else None, want)
    workdir = last("WORKDIR")
    agree(f"WORKDIR {c['IMAGE_WORKDIR']}", workdir.value[0] if workdir else None, c["IMAGE_WORKDIR"])
    env = {}
    for x in final:
        if x.cmd == "ENV":
            env.update(zip(x.value[::2], x.value[1::2]))
    agree(f"ENV HOME={c['IMAGE_HOME']}", env.get("HOME"), c["IMAGE_HOME"])
    dest = [x.value[-1] for x in final if x.cmd == "COPY" and any(f.startswith("--from=") for f in x.flags)]
    agree(f"the binary at {c['IMAGE_BINARY']}", dest, [c["IMAGE_BINARY"]])
    try:
        report.check(json.loads(c["IMAGE_ENTRYPOINT"])[-1] == c["IMAGE_BINARY"],
                     f"{rel}: the entrypoint ends in the binary {c['IMAGE_BINARY']}")
    except (ValueError, IndexError):
        pass
    runs = " && ".join(" ".join(x.value) for x in final if x.cmd == "RUN")
    installed = set()
    for m in re.finditer(r"apt-get install((?:\s+[^&;|\s]+)*)", runs):
        installed.update(w for w in m.group(1).split() if not w.startswith("-"))
    want = set(c["IMAGE_PACKAGES"].split())
    agree(f"packages {' '.join(sorted(want))}", " ".join(sorted(installed)), " ".join(sorted(want)))
    uid, _, gid = c["IMAGE_USER"].partition(":")
    useradd = re.search(r"useradd\s[^&;|]*", runs)
    ua = useradd.group(0).split() if useradd else []

    def opt(name):
        return ua[ua.index(name) + 1] if name in ua and ua.index(name) + 1 < len(ua) else None
    agree(f"user {c['IMAGE_USER_NAME']} {uid}:{gid} with home {c['IMAGE_HOME']}",
          ' '.join(ua) if ua else None,
          ' '.join(ua) if ua and (opt("--uid"), opt("--gid"), opt("--home-dir"), ua[-1])
          == (uid, gid, c["IMAGE_HOME"], c["IMAGE_USER_NAME"]) else "a useradd line with these values")
    labels = {}
    for x in final:
        if x.cmd == "LABEL":
            labels.update((k, v.strip('"')) for k, v in zip(x.value[::2], x.value[1::2]))
    for key, label in (("IMAGE_TITLE", "title"), ("IMAGE_DESCRIPTION", "description"), ("IMAGE_LICENSES", "licenses")):
        have = labels.get(f"org.opencontainers.image.{label}")
        agree(f"label org.opencontainers.image.{label}", have, c[key])
    # The version: Cargo.toml's (build-image.sh labels and tags with it), the
    # Dockerfile's ARG VERSION default, and the image the manifests name.
    cargo = re.search(r'^\[workspace\.package\]\n(?:[^\[].*\n)*?version\s*=\s*"([^"]+)"', read(tree.cargo_toml), re.M)
    cargo = cargo.group(1) if cargo else None
    args = [v for x in final if x.cmd == "ARG" for v in x.value if v.startswith("VERSION=")]
    report.check(labels.get("org.opencontainers.image.version") == "${VERSION}" and args == [f"VERSION={cargo}"],
                 f"Dockerfile: label version ${{VERSION}} with ARG VERSION={cargo}, Cargo.toml's version"
                 + ("" if args == [f"VERSION={cargo}"] else f" (found {args})"))
    tag = f"{c['IMAGE_NAME']}:{cargo}"
    named = []
    pinned = []
    for f in sorted(n for n in os.listdir(tree.deploy) if n.endswith((".yaml", ".yml"))):
        for d in load_docs(read(os.path.join(tree.deploy, f))):
            if d.get("kind") == "Deployment":
                named += [(f, k["image"]) for k in d["spec"]["template"]["spec"]["containers"]]
            elif d.get("kind") == "Provisioner" and (d.get("spec") or {}).get("image"):
                pinned.append(f"deploy/{f}: {d['spec']['image']}")
    wrong = [f"deploy/{f}: {i}" for f, i in named if i != tag]
    report.check(bool(named) and not wrong, f"deploy/ names the image build-image.sh tags, {tag}"
                 + (f" (not: {wrong})" if wrong else ""))
    # A Provisioner naming an image is refused by the operator's default
    # policy unless that is the operator's own image, which an install
    # chooses (image.repository): the examples leave spec.image out.
    report.check(not pinned, "deploy/'s example Provisioners name no image (the operator's own runs)"
                 + (f" (they do: {pinned})" if pinned else ""))


def check_book_dockerfiles(report, tree):
    """Every Dockerfile under docs/src/examples (an image made from ours, such
    as the one for the Choria Helm chart) parses, builds FROM an ARG BASE
    whose default is our image, still runs our binary and init from the
    contract's paths, and ends as the contract's user."""
    import dockerfile

    c = load_contract(report, tree)
    if c is None or any(k not in c for k in ("IMAGE_NAME", "IMAGE_BINARY", "IMAGE_USER", "IMAGE_ENTRYPOINT")):
        return
    init = json.loads(c["IMAGE_ENTRYPOINT"])[0]
    for directory, _, files in sorted(os.walk(tree.book_examples)):
        for n in sorted(f for f in files if f == "Dockerfile"):
            path = os.path.join(directory, n)
            rel = tree.rel(path)
            try:
                cmds = dockerfile.parse_file(path)
            except dockerfile.GoParseError as e:
                report.fail(f"{rel} does not parse: {e}")
                continue
            base = [v.split("=", 1)[1] for x in cmds if x.cmd == "ARG" for v in x.value if v.startswith("BASE=")]
            froms = [x.value[0] for x in cmds if x.cmd == "FROM"]
            users = [x.value[0] for x in cmds if x.cmd == "USER"]
            text = read(path)
            named = re.sub(r"[:@].*$", "", base[0]).rsplit("/", 1)[-1] if base else None
            problems = []
            if froms != ["${BASE}"] or named != c["IMAGE_NAME"]:
                problems.append(f"FROM {froms} with ARG BASE={base}, want FROM ${{BASE}} defaulting to {c['IMAGE_NAME']}:…")
            if not users or users[-1] != c["IMAGE_USER"]:
                problems.append(f"ends as USER {users[-1] if users else '-'}, want {c['IMAGE_USER']}")
            for what in (c["IMAGE_BINARY"], init):
                if what not in text:
                    problems.append(f"names no {what}")
            report.no_problems(problems, f"{rel}: FROM our image (ARG BASE), runs {c['IMAGE_BINARY']} "
                                         f"under {init}, ends as USER {c['IMAGE_USER']}")

