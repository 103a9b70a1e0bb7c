#!/usr/bin/env python3
"""Decode a natstap capture (JSON lines) layer by layer.

    python3 tests/gopeers/decode_capture.py tests/gopeers/captures/provisioning-v1-v2.jsonl

For every message prints the subject, then the Choria layers:
  v1: transport -> base64 .data -> secure request/reply -> .message (JSON
      string) -> request/reply -> .message (the payload; for requests the
      server base64-decodes it when it can, e.g. "cGluZw==" -> "ping")
  v2: transport -> base64 .data -> secure request/reply -> base64
      .request/.reply -> request/reply -> base64 .message -> payload
Lifecycle events (CloudEvents) are printed as they are.
"""
import base64
import json
import sys


def b64(s):
    return base64.b64decode(s, validate=True)


def show(label, value, indent="    "):
    print("%s%s: %s" % (indent, label, value))


def decode(rec):
    print("=== %s  subject=%s  size=%d" % (rec["time"], rec["subject"], rec["size"]))
    if "data" not in rec:
        show("data_b64", rec["data_b64"])
        return
    raw = rec["data"]
    try:
        t = json.loads(raw)
    except ValueError:
        show("raw", raw)
        return
    proto = t.get("protocol", "") if isinstance(t, dict) else ""
    if proto == "choria:transport:1":
        show("transport.headers", json.dumps(t.get("headers"), separators=(",", ":")))
        sec_raw = b64(t["data"]).decode()
        show("secure (transport.data, base64-decoded)", sec_raw)
        sec = json.loads(sec_raw)
        inner = json.loads(sec["message"])
        show("%s (secure.message, a JSON string)" % inner["protocol"], sec["message"])
        payload = inner["message"]
        show("payload (.message)", json.dumps(payload))
        if inner["protocol"] == "choria:request:1":
            try:
                show("payload as the server sees it (base64-decoded when valid)", b64(payload))
            except ValueError:
                pass
    elif proto == "io.choria.protocol.v2.transport":
        show("transport.headers", json.dumps(t.get("headers"), separators=(",", ":")))
        sec_raw = b64(t["data"]).decode()
        show("secure (transport.data, base64-decoded)", sec_raw)
        sec = json.loads(sec_raw)
        key = "request" if "request" in sec else "reply"
        inner_raw = b64(sec[key]).decode()
        show("%s (secure.%s, base64-decoded)" % (json.loads(inner_raw)["protocol"], key), inner_raw)
        inner = json.loads(inner_raw)
        show("payload (.message, base64-decoded)", b64(inner["message"]).decode())
    else:
        show("payload", raw)
    print()


def main():
    for path in sys.argv[1:] or ["-"]:
        f = sys.stdin if path == "-" else open(path)
        for line in f:
            if line.strip():
                decode(json.loads(line))


if __name__ == "__main__":
    main()
