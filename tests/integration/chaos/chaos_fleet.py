"""The fleet side of chaos.py: a `kvfleet up` fleet, /fleet and gossip pollers, the bench
runner, the metrics readers and the checks every scenario shares."""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

# The generated trace: prompts of SHARED_BLOCKS blocks from one of GROUPS shared prefixes,
# then UNIQUE_BLOCKS blocks of their own; lengths in trace tokens (512 per block), replayed
# with --length-scale LENGTH_SCALE so a block is 32 tokens, the workers' block size.
TRACE_BLOCK = 512
LENGTH_SCALE = 16
BLOCK_SIZE = TRACE_BLOCK // LENGTH_SCALE
GROUPS = 24
SHARED_BLOCKS = 6
UNIQUE_BLOCKS = 2
OUTPUT_TOKENS = 64         # after scaling: long enough that a kill catches requests mid-stream
# Router liveness: a worker silent this long on its event stream is dead (router default).
HEARTBEAT_TIMEOUT_S = 3.0
# /fleet is polled this often; a state change is seen at most this late.
POLL_S = 0.1
# A client request that takes longer than this is a hang.
REQUEST_TIMEOUT_S = 30
# kvfleet up --restart-delay-s for the router restart: as quick as systemd's RestartSec.
ROUTER_RESTART_DELAY_S = 0.5
# Index rebuild target after a router restart (issue 9).
INDEX_REBUILD_TARGET_S = 2.0
# drop: mean seconds between two requests of one shared prefix; above the router's
# predicted-entry TTL (2 s), so that hits come from events, not from the router's own guesses.
DROP_GROUP_PERIOD_S = 6.0
# drop: of the requests whose prefix a worker already held, the fraction the router's index
# may have shown no worker holding (a hit the router could not see).
DROP_BLIND_TOLERANCE = 0.05
# drop: a worker holds a prefix once its first token for it is this old (the event that says
# so has reached the router well before).
DROP_SETTLE_S = 0.1


def log(msg):
    print(f"chaos: {msg}", file=sys.stderr, flush=True)


def http_get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except Exception as e:  # connection refused, reset, timeout: the server is not there
        return 0, str(e)


def parse_metrics(text, name):
    """{frozenset(labels.items()): value} for every sample of metric `name`."""
    out = {}
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        m = re.match(r'([a-zA-Z_:]+)(\{(.*)\})?\s+(\S+)', line)
        if not m or m.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        out[frozenset(labels.items())] = float(m.group(4))
    return out


def metric_sum(text, name, **want):
    total = 0.0
    for labels, v in parse_metrics(text, name).items():
        d = dict(labels)
        if all(d.get(k) == val for k, val in want.items()):
            total += v
    return total


def write_trace(path, duration_s, rate, seed, groups=GROUPS):
    """A Mooncake-format trace: Poisson arrivals at `rate`/s for `duration_s`, each prompt
    one of `groups` shared prefixes plus blocks of its own."""
    rng = random.Random(seed)
    t, n = 0.0, 0
    next_unique = 10_000_000
    with open(path, "w") as f:
        while True:
            t += rng.expovariate(rate)
            if t >= duration_s:
                break
            g = rng.randrange(groups)
            ids = [g * 1000 + k for k in range(SHARED_BLOCKS)]
            ids += list(range(next_unique, next_unique + UNIQUE_BLOCKS))
            next_unique += UNIQUE_BLOCKS
            f.write(json.dumps({"timestamp": int(t * 1000), "input_length": len(ids) * TRACE_BLOCK,
                                "output_length": OUTPUT_TOKENS * LENGTH_SCALE, "hash_ids": ids}) + "\n")
            n += 1
    return n


def index_blind_hits(trace_path, reqs, decisions):
    """What the router's index showed of the prefixes the workers held, per request.

    The truth comes from the clients' side: a worker holds a request's shared prefix once an
    earlier request of the same group got its first token from it DROP_SETTLE_S before this one
    was sent. The index's view is the request's decision-log line (joined by its X-Request-Id):
    the blocks each candidate matched. Returns {"held", "blind", "undecided"}: `held` requests
    whose prefix some worker held, `blind` those of them for which the index showed no holder
    with the whole prefix, `undecided` completed requests with no decision line."""
    groups = []
    with open(trace_path) as f:
        for line in f:
            if line.strip():
                groups.append(json.loads(line)["hash_ids"][0] // 1000)
    by_id = {d["request_id"]: d for d in decisions if d.get("request_id")}
    sent = sorted((r for r in reqs if r["ok"]), key=lambda r: r["sent_unix_s"])
    out = {"held": 0, "blind": 0, "undecided": sum(1 for r in sent if r["request_id"] not in by_id)}
    names = {}  # the decision log's worker number -> the name the client saw
    for r in sent:
        if r["request_id"] in by_id:
            names[by_id[r["request_id"]]["worker"]] = r["worker"]
    ready = {}  # group -> {worker name: unix time of its first token}
    for r in sent:
        g = groups[r["index"]]
        d = by_id.get(r["request_id"])
        holders = [w for w, t in ready.get(g, {}).items() if t <= r["sent_unix_s"] - DROP_SETTLE_S]
        if holders and d is not None:
            out["held"] += 1
            seen = max((c["device_blocks"] + c["host_blocks"] for c in d["candidates"]
                        if names.get(c["worker"]) in holders), default=0)
            if seen < SHARED_BLOCKS:
                out["blind"] += 1
        ready.setdefault(g, {}).setdefault(r["worker"], r["sent_unix_s"] + r["ttft_s"])
    return out


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def child_args(pid):
    """[(pid, argv)] of the processes whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            if int(stat[stat.rindex(")") + 2:].split()[1]) != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out.append((int(entry), [a.decode() for a in f.read().split(b"\0")]))
        except (OSError, ValueError):
            continue
    return out


def children(pid):
    """{name: pid} of the router and workers `kvfleet up` (pid) started."""
    out = {}
    for entry, args in child_args(pid):
        if "--worker-id" in args:
            out[args[args.index("--worker-id") + 1]] = entry
        elif args and args[0].endswith("kvfleet-router"):
            out["router"] = entry
    return out


class Fleet:
    """`kvfleet up --restart` in its own process group."""

    def __init__(self, args, name, router_args=(), restart_delay_s=None, worker_args=(), routers=1):
        self.args = args
        self.dir = os.path.join(args.work, name)
        os.makedirs(self.dir, exist_ok=True)
        p = args.port_base
        self.url = f"http://127.0.0.1:{p}"
        # Router i: HTTP p+i, registration p+5+i, gossip p+90+i.
        self.urls = [f"http://127.0.0.1:{p + i}" for i in range(routers)]
        self.worker_http = [f"http://127.0.0.1:{p + 50 + i}" for i in range(args.workers)]
        cmd = [args.kvfleet, "up", "--backend", "mock", "--workers", str(args.workers), "--http-port", str(p),
               "--routers", str(routers), "--gossip-base-port", str(p + 90),
               "--registration-port", str(p + 5), "--worker-base-port", str(p + 10),
               "--worker-http-base-port", str(p + 50), "--block-size", str(BLOCK_SIZE),
               "--log-dir", os.path.join(self.dir, "logs"), "--restart",
               "--restart-delay-s", str(args.restart_delay_s if restart_delay_s is None else restart_delay_s),
               f"--router-arg=--heartbeat-timeout-ms={int(HEARTBEAT_TIMEOUT_S * 1000)}"]
        cmd += [f"--router-arg={a}" for a in router_args]
        cmd += [f"--worker-arg={a}" for a in worker_args]
        if args.router_bin:
            cmd += ["--router-bin", args.router_bin]
        if args.worker_bin:
            cmd += ["--worker-bin", args.worker_bin]
        self.up_log = open(os.path.join(self.dir, "up.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.up_log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s=60):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvfleet up exited (see {self.dir}/up.log)")
            ready = 0
            for url in self.urls:
                st, body = http_get(url + "/fleet")
                if st == 200 and len([w for w in json.loads(body)["workers"] if w["routable"]]) == self.args.workers:
                    ready += 1
            if ready == len(self.urls):
                return
            time.sleep(0.2)
        raise RuntimeError(f"fleet not ready with {self.args.workers} routable workers in {timeout_s} s")

    def pids(self):
        return children(self.proc.pid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.up_log.close()


class FleetPoller(threading.Thread):
    """Samples /fleet every POLL_S: [(t, {worker name: routable})]."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.samples, self.stopping = url, [], False

    def run(self):
        while not self.stopping:
            t = time.time()
            st, body = http_get(self.url + "/fleet", timeout=1.0)
            if st == 200:
                try:
                    self.samples.append((t, {w["name"]: w["routable"] for w in json.loads(body)["workers"]}))
                except (ValueError, KeyError):
                    pass
            time.sleep(POLL_S)


def run_bench(args, fleet, trace, name, extra=()):
    """Starts `kvfleet bench` on `trace`; returns (Popen, out json path, requests path)."""
    out = os.path.join(fleet.dir, f"{name}.json")
    reqs = os.path.join(fleet.dir, f"{name}.requests.jsonl")
    cmd = [args.kvfleet, "bench", "--router", ",".join(fleet.urls), "--trace", trace, "--length-scale", str(LENGTH_SCALE),
           "--request-timeout", str(REQUEST_TIMEOUT_S), "--policy", "kv", "--out", out, "--requests-out", reqs,
           "--quiet", *extra]
    log(" ".join(cmd))
    p = subprocess.Popen(cmd, stdout=open(os.path.join(fleet.dir, f"{name}.txt"), "w"),
                         stderr=open(os.path.join(fleet.dir, f"{name}.err"), "w"))
    return p, out, reqs


def wait_bench(p, deadline_s):
    """The bench's exit code; None when it outlived `deadline_s` (a hang)."""
    try:
        return p.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None


def load_requests(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summary_of(out_path):
    with open(out_path) as f:
        runs = json.load(f)["runs"]
    return runs[0]


class Checks:
    def __init__(self):
        self.failures, self.figures = [], {}

    def check(self, ok, what):
        log(("ok: " if ok else "FAILED: ") + what)
        if not ok:
            self.failures.append(what)

    def figure(self, key, value):
        self.figures[key] = value
        log(f"figure {key} = {value}")


def client_checks(c, reqs, expected, bench_rc, span_s):
    """No hang, every request accounted for, errors clean (an error kind, no timeout)."""
    c.check(bench_rc is not None, f"kvfleet bench ended within its deadline (rc {bench_rc})")
    c.check(len(reqs) == expected, f"every request has an outcome ({len(reqs)} of {expected})")
    errors = {}
    for r in reqs:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    c.figure("requests", len(reqs))
    c.figure("errors_by_kind", errors)
    c.check(all(r["ok"] or r["error"] for r in reqs), "every request completed or ended with a named error")
    c.check(all(r["worker"] for r in reqs if r["ok"]), "every completed request names the worker that served it")
    c.check("timeout" not in errors, f"no request timed out ({errors.get('timeout', 0)} did)")
    return errors
