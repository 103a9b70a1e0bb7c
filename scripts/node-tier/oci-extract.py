#!/usr/bin/env python3
"""One file out of an OCI image archive, as the image's filesystem has it.

    oci-extract.py ARCHIVE MEMBER OUT

MEMBER is a path in the image without its leading `/`; the topmost layer
that has it wins (an image index is followed to its first manifest). Exits 1
when no layer has it. The node tier runs its fleet on the host with the very
binary the release image's pods run, taken out of the archive this way.

    oci-extract.py --self-test
"""
import importlib.util
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile


def extract(archive, member, out):
    """True when `member` was written to `out`."""
    with tarfile.open(archive) as oci:
        blob = lambda d: oci.extractfile("blobs/" + d.replace(":", "/"))
        desc = json.load(oci.extractfile("index.json"))["manifests"][0]
        while "manifests" in (m := json.load(blob(desc["digest"]))):
            desc = m["manifests"][0]
        for layer in reversed(m["layers"]):
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r:*") as t:
                try:
                    f = t.extractfile(member)
                except KeyError:
                    continue
                with open(out, "wb") as o:
                    shutil.copyfileobj(f, o)
                return True
    return False


def self_test():
    # An archive as oci-image.py writes one (one layer, /pause), its index
    # wrapped in another index as multi-platform images have it.
    spec = importlib.util.spec_from_file_location(
        "oci_image", os.path.join(os.path.dirname(os.path.abspath(__file__)), "oci-image.py"))
    oci_image = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oci_image)
    data = oci_image.image(b"\x7fELF pause", "localhost/x/pause:1", "pause", "0:0")
    with tempfile.TemporaryDirectory() as d:
        flat = os.path.join(d, "flat.tar")
        with open(flat, "wb") as f:
            f.write(data)
        nested = os.path.join(d, "nested.tar")
        with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(nested, "w") as dst:
            inner = src.extractfile("index.json").read()
            for m in src.getmembers():
                if m.name != "index.json":
                    dst.addfile(m, src.extractfile(m))
            outer = json.dumps({"schemaVersion": 2, "manifests": [{
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "digest": oci_image.sha(inner), "size": len(inner)}]}).encode()
            for name, body in (("index.json", outer), ("blobs/sha256/" + oci_image.sha(inner)[7:], inner)):
                ti = tarfile.TarInfo(name)
                ti.size = len(body)
                dst.addfile(ti, io.BytesIO(body))
        for archive in (flat, nested):
            out = os.path.join(d, "out")
            assert extract(archive, "pause", out), archive
            with open(out, "rb") as f:
                assert f.read() == b"\x7fELF pause"
            assert not extract(archive, "usr/bin/choria-provisioner", os.path.join(d, "none"))
            assert not os.path.exists(os.path.join(d, "none"))
    print("oci-extract: self-test passed")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    return 0 if extract(*argv) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
