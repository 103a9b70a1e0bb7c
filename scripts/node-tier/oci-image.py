#!/usr/bin/env python3
"""An OCI image archive of one static binary, as `ctr images import` takes it.

    oci-image.py BINARY OUT.tar REF [--user UID:GID] [--name PATH]

The binary is the image's one file (at /NAME, its base name unless --name)
and its entrypoint; REF (`registry/name:tag`) is the name containerd gives
the image. The node tier makes the pod sandbox's pause image this way, and
the images its pages name that no registry here can serve (the quick start's
`nats:2.10`, from the nats-server the suite installs).

    oci-image.py --self-test
"""
import hashlib
import io
import json
import sys
import tarfile


def tar_bytes(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime, ti.uid, ti.gid = len(data), mode, 0, 0, 0
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def image(binary, ref, name, user):
    """The archive's bytes: one layer holding `binary` at /name."""
    layer = tar_bytes([(name, binary, 0o755)])
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/" + name], "User": user},
        "rootfs": {"type": "layers", "diff_ids": [sha(layer)]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": sha(layer), "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha(manifest), "size": len(manifest),
        "annotations": {"io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
    }]}).encode()
    blobs = [(f"blobs/sha256/{sha(b)[7:]}", b, 0o644) for b in (layer, config, manifest)]
    return tar_bytes([("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
                      ("index.json", index, 0o644)] + blobs)


def self_test():
    out = image(b"\x7fELF", "localhost/x/pause:1", "pause", "65535:65535")
    with tarfile.open(fileobj=io.BytesIO(out)) as t:
        index = json.load(t.extractfile("index.json"))
        m = index["manifests"][0]
        assert m["annotations"]["io.containerd.image.name"] == "localhost/x/pause:1"
        manifest = json.load(t.extractfile("blobs/sha256/" + m["digest"][7:]))
        config = json.load(t.extractfile("blobs/sha256/" + manifest["config"]["digest"][7:]))
        assert config["config"]["Entrypoint"] == ["/pause"], config
        layer = t.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"][7:]).read()
        with tarfile.open(fileobj=io.BytesIO(layer)) as l:
            assert l.extractfile("pause").read() == b"\x7fELF"
            assert l.getmember("pause").mode == 0o755
    print("oci-image: self-test passed")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    args, opts = [], {"--user": "65534:65534", "--name": None}
    it = iter(argv)
    for a in it:
        if a in opts:
            opts[a] = next(it)
        else:
            args.append(a)
    if len(args) != 3 or ":" not in args[2].rsplit("/", 1)[-1]:
        print(__doc__, file=sys.stderr)
        return 2
    src, out, ref = args
    name = opts["--name"] or src.rsplit("/", 1)[-1]
    with open(src, "rb") as f:
        data = image(f.read(), ref, name, opts["--user"])
    with open(out, "wb") as f:
        f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
