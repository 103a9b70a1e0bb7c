#!/usr/bin/env python3
"""Data side of scripts/bench.sh: polling, /proc sampling, journal checks and
the summary table. Standard library only.

    bench_report.py machine                          -> JSON: nproc, CPU, memory, kernel, date, load
    bench_report.py snap [NAME=PID ...]              -> JSON: /proc/stat totals + per-process CPU/RSS
    bench_report.py wait --url U --target N --timeout S --pid P
                                                     -> JSON: when `choria_provisioner_provisioned`
                                                        reached N, first-discovery figures
    bench_report.py metrics --url U                  -> JSON: every series of /metrics, summed over labels
                                                        except `rpc`
    bench_report.py journal FILE --nodes N           -> JSON: exactly-once checks, rate, per-node times
    bench_report.py record KEY=VALUE... --wait F --snap0 F --snap1 F --journal F --metrics F
                                                     -> one JSON result line (stdout)
    bench_report.py summary RESULTS.jsonl --machine F [--go-status TEXT]
                                                     -> Markdown report (stdout)
    bench_report.py perf-buckets PERF_SCRIPT_TEXT [--cpu-s S --nodes N]
                                                     -> where the profiled process's CPU went
"""

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- /proc ----

def proc_stats(pid):
    """CPU seconds (own and reaped children) and memory of one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime is field 14 -> index 11.
    utime, stime, cutime, cstime = (int(x) / CLK_TCK for x in fields[11:15])
    mem = {}
    for line in status.splitlines():
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS"):
            mem[k] = int(v.split()[0])  # kB
    return {
        "pid": int(pid),
        "utime_s": utime,
        "stime_s": stime,
        "cpu_s": utime + stime,
        "children_cpu_s": cutime + cstime,
        "hwm_kib": mem.get("VmHWM"),
        "rss_kib": mem.get("VmRSS"),
    }


def system_cpu():
    """/proc/stat aggregate in seconds: busy (all but idle+iowait) and total."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(x) / CLK_TCK for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    # guest time is already counted in user/nice
    total = sum(vals[:8])
    return {"busy_s": total - idle, "total_s": total}


def cmd_snap(args):
    """name=pid, or name=pid+pid+... for several processes counted as one
    (the replicas of a sharded run): CPU, peak RSS and children summed."""
    out = {"time_ns": time.time_ns(), "system": system_cpu(), "procs": {}}
    for a in args:
        name, _, pids = a.partition("=")
        if not pids:
            continue
        stats = [proc_stats(p) for p in pids.split("+")]
        stats = [s for s in stats if s]
        if len(stats) == 1:
            out["procs"][name] = stats[0]
        elif stats:
            summed = {}
            for s in stats:
                for k, v in s.items():
                    if isinstance(v, (int, float)):
                        summed[k] = summed.get(k, 0) + v
            out["procs"][name] = summed
    print(json.dumps(out))


def cmd_machine(_args):
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:  # noqa: BLE001 - informational only
            return ""
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "rustc": run(["rustc", "--version"]),
        "go": run(["go", "version"]),
    }))


# -------------------------------------------------------------- metrics ----

METRIC_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def scrape(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_RE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        rpc = re.search(r'rpc="([^"]*)"', labels)
        quant = re.search(r'quantile="([^"]*)"', labels)
        key = name
        if rpc:
            key += f"[{rpc.group(1)}]"
        if quant:
            key += f"{{q={quant.group(1)}}}"
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            pass
    return out


def cmd_metrics(args):
    """One replica's metrics, or several summed (cycles: the largest)."""
    urls = args[args.index("--url") + 1].split(",")
    try:
        m = {}
        for url in urls:
            for k, v in scrape(url).items():
                if k == "choria_provisioner_discover_cycles":
                    m[k] = max(m.get(k, 0), v)
                else:
                    m[k] = m.get(k, 0) + v
        print(json.dumps(m))
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"error": str(e)}))


def cmd_wait(args):
    """Polls /metrics every 50 ms until the provisioned counter reaches the
    target. Also remembers what the first discovery cycle queued: every
    `discovered` value read while `discover_cycles` is 1 belongs to it (the
    counter of cycles is bumped when a cycle starts)."""
    opt = dict(zip(args[::2], args[1::2]))
    urls, target = opt["--url"].split(","), int(opt["--target"])
    timeout, pids = float(opt["--timeout"]), (opt.get("--pid") or "").split("+")
    start = time.monotonic()
    res = {"reached": False, "timed_out": False, "died": False,
           "first_cycle_discovered": None, "first_cycle_done_ns": None,
           "peak_queue": 0, "last": {}}
    while True:
        now = time.monotonic()
        if now - start > timeout:
            res["timed_out"] = True
            break
        if any(p and not os.path.exists(f"/proc/{p}") for p in pids):
            res["died"] = True
            break
        try:
            # Several replicas: counters add up, cycles are each one's own.
            m = {}
            for url in urls:
                for k, v in scrape(url, timeout=1.0).items():
                    if k == "choria_provisioner_discover_cycles":
                        m[k] = max(m.get(k, 0), v)
                    else:
                        m[k] = m.get(k, 0) + v
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(0.05)
            continue
        res["last"] = m
        cycles = m.get("choria_provisioner_discover_cycles", 0)
        disc = m.get("choria_provisioner_discovered", 0)
        res["peak_queue"] = max(res["peak_queue"], m.get("choria_provisioner_work_queue_entries", 0))
        if cycles == 1 and disc > (res["first_cycle_discovered"] or 0):
            res["first_cycle_discovered"] = disc
            res["first_cycle_done_ns"] = time.time_ns()
        if m.get("choria_provisioner_provisioned", 0) >= target:
            res["reached"] = True
            res["end_ns"] = time.time_ns()
            break
        time.sleep(0.05)
    res["final_cycles"] = res["last"].get("choria_provisioner_discover_cycles")
    res["provisioned"] = res["last"].get("choria_provisioner_provisioned")
    print(json.dumps(res))


# -------------------------------------------------------------- journal ----

def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def cmd_journal(args):
    path = args[0]
    nodes = int(args[args.index("--nodes") + 1])
    per = {}
    finals = {}
    first_ping = first_req = last_restart = None
    outcomes = {}
    bad_lines = 0
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                bad_lines += 1
                continue
            kind = e.get("kind")
            if kind == "final":
                if e["node"] in finals:
                    finals[e["node"]]["dup"] = True
                finals[e["node"]] = e
                continue
            if kind != "action":
                continue
            node, action, t, outcome = e["node"], e["action"], e["time_us"], e["outcome"]
            outcomes[f"{action}:{outcome}"] = outcomes.get(f"{action}:{outcome}", 0) + 1
            n = per.setdefault(node, {"first": None, "configure_ok": 0, "restart_ok": 0,
                                      "restart_t": None, "ping": None, "requests": 0})
            if action == "ping":
                first_ping = t if first_ping is None else min(first_ping, t)
                if n["ping"] is None:
                    n["ping"] = t
                continue
            n["requests"] += 1
            first_req = t if first_req is None else min(first_req, t)
            if n["first"] is None or t < n["first"]:
                n["first"] = t
            if outcome == "ok" and action == "configure":
                n["configure_ok"] += 1
            if outcome == "ok" and action == "restart":
                n["restart_ok"] += 1
                n["restart_t"] = t
                last_restart = t if last_restart is None else max(last_restart, t)

    problems = []
    if len(finals) != nodes:
        problems.append(f"{len(finals)} final states for {nodes} nodes")
    for name, fs in finals.items():
        p = per.get(name, {})
        why = []
        if fs.get("state") != "provisioned":
            why.append(f"final state {fs.get('state')}")
        if fs.get("configured") != 1 or p.get("configure_ok") != 1:
            why.append(f"configure ok {p.get('configure_ok', 0)}x (node says {fs.get('configured')})")
        if fs.get("restarts") != 1 or p.get("restart_ok") != 1:
            why.append(f"restart ok {p.get('restart_ok', 0)}x (node says {fs.get('restarts')})")
        if fs.get("dup"):
            why.append("two final lines")
        if why:
            problems.append(f"{name}: " + ", ".join(why))
    service = [(p["restart_t"] - p["first"]) / 1e6 for p in per.values()
               if p["restart_t"] is not None and p["first"] is not None]
    waiting = [(p["first"] - p["ping"]) / 1e6 for p in per.values()
               if p["ping"] is not None and p["first"] is not None]
    start = first_ping if first_ping is not None else first_req
    span = (last_restart - start) / 1e6 if start is not None and last_restart else None
    ok = not problems and bad_lines == 0
    print(json.dumps({
        "ok": ok,
        "problems": problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else []),
        "problem_count": len(problems),
        "nodes": nodes,
        "provisioned": sum(1 for f in finals.values() if f.get("state") == "provisioned"),
        "bad_lines": bad_lines,
        "outcomes": outcomes,
        "first_ping_us": first_ping,
        "first_request_us": first_req,
        "last_restart_us": last_restart,
        "span_s": span,
        "nodes_per_min": nodes / span * 60 if span else None,
        "work_span_s": (last_restart - first_req) / 1e6 if first_req and last_restart else None,
        "per_node_p50_s": pct(service, 50),
        "per_node_p99_s": pct(service, 99),
        "per_node_mean_s": statistics.fmean(service) if service else None,
        "queue_wait_p50_s": pct(waiting, 50),
        "queue_wait_p99_s": pct(waiting, 99),
        "requests_per_node": statistics.fmean([p["requests"] for p in per.values()]) if per else None,
    }))


# --------------------------------------------------------------- record ----

def load(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return json.loads(text.splitlines()[-1]) if text else {}
    except (OSError, ValueError, IndexError):
        return {}


def cmd_record(args):
    rec = {}
    files = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            files[a[2:]] = load(args[i + 1])
            i += 2
            continue
        k, _, v = a.partition("=")
        try:
            rec[k] = int(v)
        except ValueError:
            rec[k] = v
        i += 1
    wait, s0, s1, j, m = (files.get(k, {}) for k in ("wait", "snap0", "snap1", "journal", "metrics"))
    start_ns = int(rec.get("start_ns", 0))
    p1 = s1.get("procs", {})
    p0 = s0.get("procs", {})
    def cpu(name, delta=False):
        a = (p1.get(name) or {}).get("cpu_s")
        if a is None:
            return None
        if delta:
            b = (p0.get(name) or {}).get("cpu_s") or 0.0
            return a - b
        return a
    def hwm(name):
        v = (p1.get(name) or {}).get("hwm_kib")
        return v / 1024 if v else None
    wall = (wait.get("end_ns", 0) - start_ns) / 1e9 if wait.get("reached") else None
    sys0, sys1 = s0.get("system", {}), s1.get("system", {})
    busy = sys1.get("busy_s", 0) - sys0.get("busy_s", 0)
    total = sys1.get("total_s", 0) - sys0.get("total_s", 0)
    ours = sum(x for x in (
        cpu("provisioner"),
        (p1.get("provisioner") or {}).get("children_cpu_s"),
        cpu("fleet", True),
        cpu("nats", True)) if x)
    rec.update({
        "valid": bool(j.get("ok")) and bool(wait.get("reached")),
        "reached": wait.get("reached"),
        "provisioned_at_end": wait.get("provisioned"),
        "timed_out": wait.get("timed_out"),
        "died": wait.get("died"),
        "e2e_s": wall,
        "nodes_per_min": j.get("nodes_per_min"),
        "span_s": j.get("span_s"),
        "per_node_p50_s": j.get("per_node_p50_s"),
        "per_node_p99_s": j.get("per_node_p99_s"),
        "queue_wait_p99_s": j.get("queue_wait_p99_s"),
        "prov_cpu_s": cpu("provisioner"),
        "prov_hwm_mib": hwm("provisioner"),
        "helper_cpu_s": (p1.get("provisioner") or {}).get("children_cpu_s"),
        "fleet_cpu_s": cpu("fleet", True),
        "fleet_hwm_mib": hwm("fleet"),
        "nats_cpu_s": cpu("nats", True),
        "nats_hwm_mib": hwm("nats"),
        "machine_busy_pct": 100 * busy / total if total else None,
        # CPU used by everything else on the machine (other engineers' builds...)
        "other_cpu_s": busy - ours if total else None,
        "first_cycle_discovered": wait.get("first_cycle_discovered"),
        "discover_cycles": (m or wait.get("last", {})).get("choria_provisioner_discover_cycles"),
        "discovered_total": (m or {}).get("choria_provisioner_discovered"),
        "event_discovered": (m or {}).get("choria_provisioner_event_discovered"),
        "provision_errors": (m or {}).get("choria_provisioner_provision_errors"),
        "peak_queue": wait.get("peak_queue"),
        "journal_ok": j.get("ok"),
        "journal_problem_count": j.get("problem_count"),
        "journal_problems": j.get("problems"),
        "outcomes": j.get("outcomes"),
        "rpc_mean_ms": rpc_means(m or {}),
        "metrics": {"choria_provisioner_lock_refusals": (m or {}).get("choria_provisioner_lock_refusals")},
    })
    print(json.dumps(rec))


def rpc_means(m):
    """Mean time per RPC and per helper run from the summaries' _sum/_count."""
    out = {}
    for k, count in m.items():
        mt = re.match(r"^choria_provisioner_(rpc_time|helper_time)_count(\[[^\]]*\])?$", k)
        if not mt or not count:
            continue
        total = m.get(f"choria_provisioner_{mt.group(1)}_sum{mt.group(2) or ''}")
        if total is None:
            continue
        name = (mt.group(2) or "[helper]").strip("[]")
        out[name] = 1000 * total / count
    return out


# ----------------------------------------------------------------- perf ----

# Where a sample's CPU went: the leaf-most frame matching one of these wins
# (so serde_json under the Choria decoder counts as JSON, malloc under it as
# JSON too). Frames matching nothing (malloc, memcpy, generic kernel entry) are
# skipped; a stack with no match at all falls into the generic buckets below.
PERF_BUCKETS = [
    ("crypto: RSA verify of the provisioning JWT", ("num_bigint_dig", "rsa::")),
    ("crypto: ed25519/x25519/hashes/AES", ("ed25519", "curve25519", "x25519", "sha2::", "md5", "aes::", "cbc::")),
    ("jwt_verify_cert re-read per node", ("TokenVerifyKey::from_setting", "load_verify_key", "pem::parse")),
    ("JWT parse and claim checks", ("security::tokens",)),
    ("helper: process start, pipes, reaping", ("std::process", "tokio::process", "sys::process", "Command>::spawn",
                                               "clone3", "kernel_clone", "copy_process", "execve", "exec_binprm",
                                               "wait4", "do_wait", "pipe2", "create_pipe", "anon_pipe", "pidfd",
                                               "posix_spawn", "sigchld", "helper::Helper", "mm_release",
                                               "exit_mm", "wake_up_new_task")),
    ("JSON (serde_json, Go formatter)", ("serde_json", "GoFormatter", "choria::json", "serde::")),
    ("Choria codec (envelopes, base64, filters, ids)", ("choria::protocol", "base64", "mcorpc", "choria::filter",
                                                        "choria::ids", "subjects", "ksuid", "uuid")),
    ("NATS client and sockets", ("async_nats", "mio::", "tcp_", "sock_", "writev", "readv", "recvfrom", "sendto",
                                 "__sys_recv", "__sys_send", "ip_", "net_rx", "__netif", "skb", "epoll_ctl")),
    ("logging (tracing)", ("tracing",)),
    ("metrics and /metrics endpoint", ("prometheus", "axum", "hyper", "metrics::", "monitor::")),
    ("registry, queue, worker loop", ("provision::registry", "async_channel", "provision::worker",
                                      "provision::gate", "HostSequence", "provision::")),
    ("tokio runtime: scheduling, timers, wakeups", ("tokio::", "futex", "schedule", "epoll_wait", "finish_task_switch",
                                                   "parking_lot", "std::thread")),
]


def perf_bucket(frames):
    for f in frames:
        for name, pats in PERF_BUCKETS:
            if any(p in f for p in pats):
                return name
    leaf = frames[0] if frames else ""
    if any(p in leaf for p in ("malloc", "free", "memmove", "memcpy", "memset", "realloc")):
        return "allocation (caller not unwound)"
    if "kallsyms" in leaf or leaf.startswith("["):
        return "kernel, other"
    return "other"


def cmd_perf_buckets(args):
    """Reads `perf script -F comm,tid,period,ip,sym,dso` (one process) and
    prints the share of samples per bucket, and µs per node when --cpu-s and
    --nodes are given."""
    path = args[0]
    opt = dict(zip(args[1::2], args[2::2]))
    counts, total, frames, in_sample = {}, 0, [], False
    def flush():
        nonlocal total
        if in_sample:
            b = perf_bucket(frames)
            counts[b] = counts.get(b, 0) + 1
            total += 1
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                flush()
                in_sample, frames = False, []
            elif line[0] not in " \t":
                flush()
                in_sample, frames = True, []
            else:
                parts = line.strip().split(None, 1)
                frames.append(parts[1] if len(parts) > 1 else parts[0])
    flush()
    cpu, nodes = float(opt.get("--cpu-s", 0)), int(opt.get("--nodes", 0))
    print(f"{total} samples" + (f", {cpu:.2f} CPU s, {nodes} nodes" if cpu and nodes else ""))
    print()
    print("| where | share | µs per node |")
    print("|---|---|---|")
    for name, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        share = c / total if total else 0
        per = f"{share * cpu / nodes * 1e6:.0f}" if cpu and nodes else "–"
        print(f"| {name} | {100 * share:.1f} % | {per} |")


# -------------------------------------------------------------- summary ----

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec="{:,.0f}"):
    return "–" if x is None else spec.format(x)


def cmd_summary(args):
    path = args[0]
    opt = dict(zip(args[1::2], args[2::2]))
    machine = load(opt["--machine"]) if "--machine" in opt else {}
    go_status = opt.get("--go-status", "")
    broker = {
        "choria": "the real Choria broker (`choria broker run`): TLS, x509 security, provisioning "
                  "JWTs checked by the broker, the provisioner logged in as `provisioner` with a "
                  "client certificate; protocol v1 signed with the provisioner's RSA key",
        "choria/issuer": "the real Choria broker (`choria broker run`) on an Organization Issuer "
                         "network: TLS, provisioning JWTs signed by the issuer (ed25519) and checked "
                         "by the broker, the provisioner logged in as `provisioner` with a client JWT "
                         "the issuer signed; protocol v2 signed with the provisioner's ed25519 key, "
                         "each node's ed25519 key fetched and a server JWT signed for it as a chain "
                         "issuer",
    }
    broker = broker.get(
        opt.get("--broker", "nats") + ("/issuer" if opt.get("--security") == "issuer" else ""),
        "nats-server, protocol v1 without TLS or signatures (`choria_insecure`)")
    rows = [json.loads(l) for l in open(path) if l.strip()]
    groups = {}
    for r in rows:
        # pki-ca rows name the built-in CA's key kind (--ca-key-kind).
        scenario = r["scenario"] + (f" ({r['ca_key']})" if r.get("ca_key") else "")
        groups.setdefault((scenario, r["nodes"], r["workers"], r["impl"]), []).append(r)
    out = []
    w = out.append
    w("## Machine")
    w("")
    w(f"- date: {machine.get('date', '?')}")
    w(f"- {machine.get('nproc', '?')} CPUs, {machine.get('cpu_model', '?')}, "
      f"{machine.get('mem_gib', '?')} GiB, kernel {machine.get('kernel', '?')}")
    w(f"- load average at start: {' '.join(machine.get('loadavg', []))}")
    if machine.get("rustc"):
        w(f"- {machine['rustc']}" + (f"; {machine['go']}" if machine.get("go") else ""))
    w("")
    w(f"Go provisioner: {go_status or 'not attempted'}")
    w("")
    w(f"Broker: {broker} (its CPU is the `broker CPU s` column)")
    w("")
    slow = [r for r in rows if r.get("slow_consumers") not in (None, "")]
    if slow:
        hit = [r for r in slow if r["slow_consumers"]]
        w("Slow consumers in the broker's log: " + (
            "none in any run" if not hit else "; ".join(
                f"{r['slow_consumers']} lines in {r['scenario']} {r['nodes']:,} {r['impl']} run {r['run']}"
                for r in hit)))
        w("")
    if any(r.get("ca_key") for r in rows):
        w(f"pki-ca: ours signs every CSR with its built-in CA (`ca:`, {opt.get('--ca-key') or 'key ?'}) "
          "and renders the configuration from a `configuration_template`, without a helper; the Go "
          "provisioner has no CA of its own and runs `fleet-helper --ca-cert --ca-key` (a CA of the "
          "same kind in files) as in pki")
        w("")
    w("## Results (medians of the valid runs)")
    w("")
    w("| scenario | nodes | workers | impl | valid/runs | nodes/min | e2e s | p50 s/node | p99 s/node "
      "| prov CPU s | prov peak RSS MiB | helper CPU s | fleet CPU s | fleet RSS MiB | broker CPU s "
      "| machine busy % | other CPU s | 1st discovery | cycles |")
    w("|" + "---|" * 19)
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] != "rust")):
        rs = groups[key]
        ok = [r for r in rs if r.get("valid")]
        g = lambda f: med([r.get(f) for r in ok])  # noqa: E731
        disc = med([r.get("first_cycle_discovered") for r in ok])
        w(f"| {key[0]} | {key[1]:,} | {key[2]} | {key[3]} | {len(ok)}/{len(rs)} "
          f"| {fmt(g('nodes_per_min'))} | {fmt(g('e2e_s'), '{:.1f}')} "
          f"| {fmt(g('per_node_p50_s'), '{:.3f}')} | {fmt(g('per_node_p99_s'), '{:.3f}')} "
          f"| {fmt(g('prov_cpu_s'), '{:.2f}')} | {fmt(g('prov_hwm_mib'), '{:.1f}')} "
          f"| {fmt(g('helper_cpu_s'), '{:.2f}')} | {fmt(g('fleet_cpu_s'), '{:.2f}')} "
          f"| {fmt(g('fleet_hwm_mib'), '{:.0f}')} | {fmt(g('nats_cpu_s'), '{:.2f}')} "
          f"| {fmt(g('machine_busy_pct'), '{:.0f}')} | {fmt(g('other_cpu_s'), '{:.1f}')} "
          f"| {fmt(disc)}/{key[1]:,} | {fmt(g('discover_cycles'))} |")
    # CPU per node of each process: where the time goes, whatever the rate
    w("")
    w("| scenario | nodes | workers | impl | prov CPU ms/node | helper CPU ms/node "
      "| fleet CPU ms/node | broker CPU ms/node |")
    w("|" + "---|" * 8)
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] != "rust")):
        ok = [r for r in groups[key] if r.get("valid")]
        per = lambda f: med([r[f] * 1000 / r["nodes"] for r in ok if r.get(f) is not None])  # noqa: E731
        w(f"| {key[0]} | {key[1]:,} | {key[2]} | {key[3]} | {fmt(per('prov_cpu_s'), '{:.2f}')} "
          f"| {fmt(per('helper_cpu_s'), '{:.2f}')} | {fmt(per('fleet_cpu_s'), '{:.2f}')} "
          f"| {fmt(per('nats_cpu_s'), '{:.2f}')} |")
    # ratios when both implementations ran
    ratio_lines = []
    for (sc, n, wk, impl), rs in sorted(groups.items()):
        if impl != "rust" or (sc, n, wk, "go") not in groups:
            continue
        ours = med([r.get("nodes_per_min") for r in rs if r.get("valid")])
        go = med([r.get("nodes_per_min") for r in groups[(sc, n, wk, "go")] if r.get("valid")])
        if ours and go:
            ratio_lines.append(f"| {sc} | {n:,} | {wk} | {ours / go:.2f}× |")
    if ratio_lines:
        w("")
        w("| scenario | nodes | workers | ours / Go (nodes/min) |")
        w("|---|---|---|---|")
        out.extend(ratio_lines)
    # shards: R replicas against one
    shard_lines = []
    for (sc, n, wk, impl), rs in sorted(groups.items()):
        if not impl.startswith("rust-x") or (sc, n, wk, "rust") not in groups:
            continue
        many = med([r.get("nodes_per_min") for r in rs if r.get("valid")])
        one = med([r.get("nodes_per_min") for r in groups[(sc, n, wk, "rust")] if r.get("valid")])
        refusals = med([(r.get("metrics") or {}).get("choria_provisioner_lock_refusals") for r in rs])
        if many and one:
            shard_lines.append(f"| {sc} | {n:,} | {wk} | {impl[len('rust-x'):]} | {one:,.0f} | {many:,.0f} "
                               f"| {many / one:.2f}× | {fmt(refusals)} |")
    if shard_lines:
        w("")
        w("| scenario | nodes | workers each | replicas | 1 replica nodes/min | R replicas nodes/min | speed-up | lock refusals |")
        w("|---|---|---|---|---|---|---|---|")
        out.extend(shard_lines)
    # RPC latency breakdown as the provisioner saw it
    w("")
    w("## Mean latency per step as the provisioner measured it (ms, median over runs)")
    w("")
    steps = sorted({s for r in rows for s in (r.get("rpc_mean_ms") or {})})
    if steps:
        w("| scenario | nodes | workers | impl | " + " | ".join(steps) + " |")
        w("|" + "---|" * (4 + len(steps)))
        for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] != "rust")):
            ok = [r for r in groups[key] if r.get("valid")]
            vals = [med([(r.get("rpc_mean_ms") or {}).get(s) for r in ok]) for s in steps]
            w(f"| {key[0]} | {key[1]:,} | {key[2]} | {key[3]} | "
              + " | ".join(fmt(v, "{:.1f}") for v in vals) + " |")
    if opt.get("--scale") == "1":
        out.extend(scale_table(groups))
    bad = [r for r in rows if not r.get("valid")]
    if bad:
        w("")
        w("## Runs not reported as figures")
        w("")
        for r in bad:
            why = []
            if r.get("note"):
                why.append(str(r["note"]))
            elif not r.get("reached"):
                why.append(f"choria_provisioner_provisioned reached {fmt(r.get('provisioned_at_end'))}, not N"
                           + (" (timed out)" if r.get("timed_out") else "")
                           + (" (process died)" if r.get("died") else ""))
            if not r.get("journal_ok"):
                why.append(f"journal check failed ({r.get('journal_problem_count')} problems: "
                           + "; ".join((r.get("journal_problems") or [])[:3]) + ")")
            w(f"- {r['scenario']} {r['nodes']:,} nodes, {r['workers']} workers, {r['impl']} run {r['run']}: "
              + "; ".join(why))
    print("\n".join(out))


def scale_table(groups):
    """Per-node costs of the rust runs by fleet size, and the scale targets."""
    out = []
    w = out.append
    w("")
    w("## Scale: cost per node (ours, medians of the valid runs)")
    w("")
    w("| nodes | nodes/min | e2e s | prov CPU ms/node | prov RSS MiB | prov RSS KiB/node "
      "| fleet CPU ms/node | fleet RSS MiB | fleet RSS KiB/node "
      "| nats CPU ms/node | nats RSS MiB | nats RSS KiB/node | 1st discovery | cycles |")
    w("|" + "---|" * 14)
    per = {}
    for (sc, n, wk, impl), rs in sorted(groups.items(), key=lambda kv: kv[0][1]):
        if impl != "rust":
            continue
        ok = [r for r in rs if r.get("valid")]
        g = lambda f: med([r.get(f) for r in ok])  # noqa: E731
        ms = lambda f: None if g(f) is None else 1000 * g(f) / n  # noqa: E731
        kib = lambda f: None if g(f) is None else 1024 * g(f) / n  # noqa: E731
        per[n] = {"rate": g("nodes_per_min"), "e2e": g("e2e_s"), "rss": g("prov_hwm_mib")}
        w(f"| {n:,} | {fmt(g('nodes_per_min'))} | {fmt(g('e2e_s'), '{:.1f}')} "
          f"| {fmt(ms('prov_cpu_s'), '{:.3f}')} | {fmt(g('prov_hwm_mib'), '{:.0f}')} | {fmt(kib('prov_hwm_mib'), '{:.2f}')} "
          f"| {fmt(ms('fleet_cpu_s'), '{:.3f}')} | {fmt(g('fleet_hwm_mib'), '{:.0f}')} | {fmt(kib('fleet_hwm_mib'), '{:.2f}')} "
          f"| {fmt(ms('nats_cpu_s'), '{:.3f}')} | {fmt(g('nats_hwm_mib'), '{:.0f}')} | {fmt(kib('nats_hwm_mib'), '{:.2f}')} "
          f"| {fmt(g('first_cycle_discovered'))}/{n:,} | {fmt(g('discover_cycles'))} |")
    sizes = sorted(per)
    if 10000 in per and len(sizes) > 1 and sizes[-1] > 10000:
        big, base = sizes[-1], per[10000]
        b = per[big]
        w("")
        w("| target | measured | met |")
        w("|---|---|---|")
        if base["rate"] and b["rate"]:
            share = b["rate"] / base["rate"]
            w(f"| {big:,} nodes at >= 90 % of the 10,000-node rate | {share * 100:.0f} % "
              f"({b['rate']:,.0f} vs {base['rate']:,.0f}/min) | {'yes' if share >= 0.9 else 'NO'} |")
            bound = 1.2 * big / (base["rate"] / 60)
            if b["e2e"]:
                w(f"| end to end <= 1.2 x {big:,} / the 10,000-node rate = {bound:.1f} s | {b['e2e']:.1f} s "
                  f"| {'yes' if b['e2e'] <= bound else 'NO'} |")
        small = sizes[0]
        if per[small]["rss"] and b["rss"] and big > small:
            marginal = 1024 * (b["rss"] - per[small]["rss"]) / (big - small)
            w(f"| provisioner RSS per node <= 1 KiB (marginal, {small:,} to {big:,}) | {marginal:.2f} KiB "
              f"| {'yes' if marginal <= 1.0 else 'NO'} |")
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    cmd, args = sys.argv[1], sys.argv[2:]
    {
        "snap": cmd_snap,
        "machine": cmd_machine,
        "wait": cmd_wait,
        "metrics": cmd_metrics,
        "journal": cmd_journal,
        "record": cmd_record,
        "summary": cmd_summary,
        "perf-buckets": cmd_perf_buckets,
    }[cmd](args)


if __name__ == "__main__":
    main()
