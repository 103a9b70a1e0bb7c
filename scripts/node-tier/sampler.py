#!/usr/bin/env python3
"""The node tier's timeline: every pod's leadership gauges, sampled on a fixed cadence.

    sampler.py IPAM_DIR PORT OUT PERIOD_MS

Every PERIOD_MS ms it scrapes http://IP:PORT/metrics of every address that
host-local holds (the files in IPAM_DIR named by address) and appends one
line to OUT: the time in ms, then a cell per pod, `IP:LEADER:PAUSED:PROVISIONED`
(the sums of choria_provisioner_leader, _paused and _provisioned), or `IP:-`
for a pod that answered before and does not now; an address that never
exported choria_provisioner_leader (not a provisioner) has no cell. It runs
until it is killed. tests/it/node_tier.rs reads the timeline.

    sampler.py --self-test
"""
import concurrent.futures as cf
import http.server
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

NAMES = ("choria_provisioner_leader", "choria_provisioner_paused", "choria_provisioner_provisioned")
# Not through a proxy the environment names: pod IPs are on our bridge.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse(body):
    """The gauges' sums by name, or None when the leader gauge is not there."""
    v = dict.fromkeys(NAMES, 0.0)
    seen = False
    for line in body.splitlines():
        for n in NAMES:
            if line.startswith(n + " ") or line.startswith(n + "{"):
                v[n] += float(line.rsplit(None, 1)[1])
                seen = seen or n == NAMES[0]
    return v if seen else None


def scrape(ip, port):
    try:
        with OPENER.open(f"http://{ip}:{port}/metrics", timeout=0.5) as r:
            body = r.read().decode()
    except Exception:
        return ip, None
    return ip, parse(body)


class Sampler:
    """A fixed cadence: a scrape not answered within the period (a pod going
    away whose address no longer answers) is recorded as unknown ("ip:-") and
    not waited for; that address is asked again once the request has ended."""

    def __init__(self, ipam, port, period):
        self.ipam, self.port, self.period = ipam, port, period
        self.known, self.pending = set(), {}
        self.pool = cf.ThreadPoolExecutor(16)

    def line(self, t):
        """The sample started at time `t` (s), as a timeline line."""
        try:
            ips = sorted(x for x in os.listdir(self.ipam) if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", x))
        except FileNotFoundError:
            ips = []
        pending = self.pending
        for ip in [i for i in pending if i not in ips and pending[i].done()]:
            del pending[ip]
        for ip in ips:
            if ip not in pending:
                pending[ip] = self.pool.submit(scrape, ip, self.port)
        cf.wait([pending[ip] for ip in ips], timeout=max(0.0, t + 0.8 * self.period - time.time()))
        cells = []
        for ip in ips:
            fut = pending[ip]
            v = fut.result() if fut.done() else (ip, None)
            v = v[1]
            if fut.done():
                del pending[ip]
            if v is not None:
                self.known.add(ip)
                cells.append("%s:%d:%d:%d" % (ip, v[NAMES[0]], v[NAMES[1]], v[NAMES[2]]))
            elif ip in self.known:
                cells.append(ip + ":-")
        return "%d %s\n" % (t * 1000, " ".join(cells))

    def run(self, out):
        with open(out, "a", buffering=1) as f:
            while True:
                t = time.time()
                f.write(self.line(t))
                time.sleep(max(0.0, self.period - (time.time() - t)))


def self_test():
    v = parse("# HELP choria_provisioner_leader x\nchoria_provisioner_leader 1\n"
              "choria_provisioner_leader_changes_total 7\n"
              'choria_provisioner_provisioned{site="a"} 3\nchoria_provisioner_provisioned{site="b"} 2\n')
    assert v == {NAMES[0]: 1, NAMES[1]: 0, NAMES[2]: 5}, v
    assert parse("choria_provisioner_leader_changes_total 1\nother 1\n") is None

    # A pod on 127.0.0.1 whose answer the test sets; 127.0.0.2 answers
    # nothing on that port (never a provisioner: no cell).
    state = {"body": "choria_provisioner_leader 1\nchoria_provisioner_paused 0\n"
                     "choria_provisioner_provisioned 4\n", "gate": None, "requests": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            state["requests"] += 1
            if state["gate"]:
                state["gate"].wait(2)
            body = state["body"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, *args):
            pass  # a client that gave up (a scrape's timeout)

    server = Server(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as ipam:
        # host-local's own files are not addresses.
        for name in ("127.0.0.1", "127.0.0.2", "last_reserved_ip.0", "lock"):
            open(os.path.join(ipam, name), "w").close()
        # A long period: a sample waits for the answers (up to 0.8 s), not longer.
        s = Sampler(ipam, port, 1.0)
        assert s.line(time.time()).split(" ", 1)[1] == "127.0.0.1:1:0:4\n"
        state["body"] = "choria_provisioner_leader 0\nchoria_provisioner_paused 1\n"
        t = time.time()
        line = s.line(t)
        assert line == "%d 127.0.0.1:0:1:0\n" % (t * 1000), line
        # A known pod that stops exporting the gauge is unknown, not gone.
        state["body"] = "other 1\n"
        assert s.line(time.time()).endswith(" 127.0.0.1:-\n")
        # An answer held back is not waited for past 0.8 periods (0.08 s),
        # nor asked for again while its request is under way (the request's
        # own timeout is 0.5 s); once it came, it counts.
        s.period, state["body"], state["requests"] = 0.1, "choria_provisioner_leader 1\n", 0
        state["gate"] = threading.Event()
        t = time.time()
        assert s.line(t).endswith(" 127.0.0.1:-\n")
        assert time.time() - t < 0.3, time.time() - t
        assert s.line(time.time()).endswith(" 127.0.0.1:-\n")
        assert state["requests"] == 1, state["requests"]
        state["gate"].set()
        deadline = time.time() + 1
        while not s.pending["127.0.0.1"].done() and time.time() < deadline:
            time.sleep(0.01)
        state["gate"] = None
        assert s.line(time.time()).endswith(" 127.0.0.1:1:0:0\n")
        # An address host-local released: no cell once its request ended.
        os.remove(os.path.join(ipam, "127.0.0.1"))
        t = time.time()
        assert s.line(t) == "%d \n" % (t * 1000)
        assert "127.0.0.1" not in s.pending, s.pending
        # As the node tier runs it: a line every period until killed.
        out = os.path.join(ipam, "timeline.txt")
        open(os.path.join(ipam, "127.0.0.1"), "w").close()
        p = subprocess.Popen([sys.executable, __file__, ipam, str(server.server_address[1]), out, "100"])
        time.sleep(1.0)
        p.kill()
        p.wait()
        with open(out) as f:
            lines = f.read().splitlines()
        times = [int(l.split(" ", 1)[0]) for l in lines]
        assert len(lines) >= 3 and any(l.endswith(" 127.0.0.1:1:0:0") for l in lines), lines
        assert all(90 <= b - a < 1000 for a, b in zip(times, times[1:])), times
    server.shutdown()
    print("sampler: self-test passed")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    ipam, port, out, period_ms = argv
    Sampler(ipam, port, float(period_ms) / 1000).run(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
