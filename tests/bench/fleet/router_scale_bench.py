#!/usr/bin/env python3
"""Router scale bench: one kvfleet-router and `kvfleet simulate` with N workers.

For each N it starts a router (registration endpoint, policy kv), then the simulator with N
workers, waits until the router's /fleet lists N live workers, then for --duration seconds
sends completion requests at --rate per second and records:

  - router RSS over time (VmRSS of /proc/PID/status);
  - the index apply rate (kvfleet_router_events_applied_total) and the event lag
    (kvfleet_router_event_lag_seconds, p50 and p99 over the window);
  - routing p99 (kvfleet_router_routing_seconds: tokenization, hashing and the decision);
  - HTTP p50 and p99 as this client sees them, and every status that was not 200;
  - the CPU the router and the simulator used over the window, in cores.

It prints one table row per N (and the RSS series), and with --json writes the figures.
With --check it exits 1 unless every request was answered 200 and every worker was live at
the end: the CI test (tests/integration/router/CMakeLists.txt) runs it that way.

  router_scale_bench.py --kvfleet build/cli/kvfleet --router-bin build/router/kvfleet-router \
      --workers 100,500,1000 --duration 60 --blocks 100000
"""
import argparse
import http.client
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvfleet", required=True, help="the kvfleet CLI (for kvfleet simulate)")
    p.add_argument("--router-bin", required=True, help="kvfleet-router")
    p.add_argument("--workers", default="100,500,1000", help="comma-separated fleet sizes, one run each")
    p.add_argument("--duration", type=float, default=60, help="seconds of load per fleet size")
    p.add_argument("--rate", type=float, default=20, help="completion requests per second")
    p.add_argument("--blocks", type=int, default=100000, help="KV blocks per simulated worker")
    p.add_argument("--events-per-s", type=float, default=100, help="block events per worker per second")
    p.add_argument("--churn", type=float, default=0.10, help="fraction of workers replaced per minute")
    p.add_argument("--sim-threads", type=int, default=2, help="the simulator's poll-loop threads")
    p.add_argument("--max-tokens", type=int, default=8, help="max_tokens of each request")
    p.add_argument("--model", default="sim")
    p.add_argument("--port-base", type=int, default=19000,
                   help="router registration port; HTTP is +1, the simulator's workers from +10 (3 ports each)")
    p.add_argument("--ready-timeout", type=float, default=600, help="seconds to wait for N live workers")
    p.add_argument("--sample-interval", type=float, default=2, help="seconds between RSS and /metrics samples")
    p.add_argument("--work", default="/tmp/kvfleet-router-scale", help="logs go here")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--check", action="store_true", help="exit 1 unless every request got 200 and all workers were live")
    return p.parse_args()


# ---- processes -------------------------------------------------------------------------

def start_router(args, work):
    port = args.port_base
    cmd = [args.router_bin, "--registration", f"tcp://127.0.0.1:{port}", "--http-host", "127.0.0.1",
           "--http-port", str(port + 1), "--model", args.model, "--routing-policy", "kv"]
    log = open(os.path.join(work, "router.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), cmd


def start_simulator(args, n, work):
    cmd = [args.kvfleet, "simulate", "--router", f"tcp://127.0.0.1:{args.port_base}", "--workers", str(n),
           "--blocks", str(args.blocks), "--model", args.model, "--base-port", str(args.port_base + 10),
           "--events-per-s", str(args.events_per_s), "--churn", str(args.churn), "--threads", str(args.sim_threads),
           "--stats-interval", "10"]
    log = open(os.path.join(work, "simulate.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), cmd


def stop(proc, timeout=15):
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# ---- the router's HTTP side ------------------------------------------------------------

def get(port, path, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def live_workers(port):
    status, body = get(port, "/fleet")
    if status != 200:
        return 0
    return sum(1 for w in json.loads(body)["workers"]
               if w["state"] == "live" and w["routable"] and not w["said_bye"])


def scrape(port):
    """/metrics as {name: [(labels, value)]}."""
    status, body = get(port, "/metrics")
    out = {}
    if status != 200:
        return out
    for line in body.splitlines():
        m = METRIC_LINE.match(line)
        if m:
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def total(metrics, name):
    return sum(v for _, v in metrics.get(name, []))


def buckets(metrics, name):
    """A histogram's cumulative buckets as [(le, count)], le ascending."""
    out = []
    for labels, v in metrics.get(name + "_bucket", []):
        le = re.search(r'le="([^"]+)"', labels).group(1)
        out.append((float("inf") if le == "+Inf" else float(le), v))
    return sorted(out)


def histogram_quantile(q, before, after):
    """Prometheus's histogram_quantile over the counts added between two scrapes."""
    delta = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    if not delta or delta[-1][1] <= 0:
        return None
    rank = q * delta[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in delta:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_le, prev_count = le, count
    return prev_le


def cpu_seconds(pid):
    """User + system CPU time of a process so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


# ---- load ------------------------------------------------------------------------------

class Load:
    """Completion requests at a steady rate (open loop: a late answer delays no later send)."""

    def __init__(self, port, model, rate, max_tokens, senders=32):
        self.port, self.model, self.rate, self.max_tokens = port, model, rate, max_tokens
        self.jobs = queue.Queue()
        self.results = []  # (seconds, status)
        self.error_bodies = {}  # status -> the first answer's body with that status
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._send_loop, daemon=True) for _ in range(senders)]
        self.rng = random.Random(7)
        # A few shared system prompts, as the simulator's workers hold shared prefixes.
        self.prefixes = [f"system prompt {i}: " + "you are a helpful assistant. " * 8 for i in range(8)]

    def run(self, duration):
        for t in self.threads:
            t.start()
        start = time.monotonic()
        n = 0
        while True:
            due = start + n / self.rate
            if due - start >= duration:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            prompt = self.rng.choice(self.prefixes) + f"question {self.rng.randrange(1 << 30)}"
            self.jobs.put(prompt)
            n += 1
        self.jobs.join()
        for _ in self.threads:
            self.jobs.put(None)

    def _send_loop(self):
        conn = None
        while True:
            prompt = self.jobs.get()
            if prompt is None:
                return
            body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens})
            t0 = time.monotonic()
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                answer = r.read()
                status = r.status
                if status != 200:
                    with self.lock:
                        self.error_bodies.setdefault(str(status), answer[:300].decode(errors="replace"))
            except (OSError, http.client.HTTPException) as e:
                status = f"error: {type(e).__name__}"
                conn = None
            with self.lock:
                self.results.append((time.monotonic() - t0, status))
            self.jobs.task_done()


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---- one fleet size --------------------------------------------------------------------

def wait_live(port, n, timeout, router, sim):
    start = time.monotonic()
    live = 0
    while time.monotonic() - start < timeout:
        if router.poll() is not None or sim.poll() is not None:
            raise RuntimeError("the router or the simulator exited while the fleet was starting")
        try:
            live = live_workers(port)
        except OSError:
            live = 0
        if live >= n:
            return time.monotonic() - start
        time.sleep(0.5)
    raise RuntimeError(f"{live} of {n} workers live after {timeout:.0f} s")


def sample_loop(router, port, interval, samples, done):
    t0 = time.monotonic()
    while not done.wait(interval):
        try:
            m = scrape(port)
        except OSError:
            continue
        samples.append({"t": time.monotonic() - t0, "rss_mib": rss_mib(router.pid),
                        "applied": total(m, "kvfleet_router_events_applied_total"),
                        "index_blocks": total(m, "kvfleet_router_index_blocks")})


def run_one(args, n):
    work = os.path.join(args.work, f"n{n}")
    os.makedirs(work, exist_ok=True)
    http_port = args.port_base + 1
    router, _ = start_router(args, work)
    sim = None
    try:
        wait_http(http_port, router)
        sim, sim_cmd = start_simulator(args, n, work)
        ready_s = wait_live(http_port, n, args.ready_timeout, router, sim)
        return measure(args, n, router, sim, ready_s, http_port)
    finally:
        if sim is not None:
            stop(sim)
        stop(router)


def wait_http(port, router, timeout=30):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if router.poll() is not None:
            raise RuntimeError(f"the router exited with {router.returncode}")
        try:
            if get(port, "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the router's HTTP port did not answer")


def measure(args, n, router, sim, ready_s, port):
    before = scrape(port)
    samples, done = [], threading.Event()
    sampler = threading.Thread(target=sample_loop, args=(router, port, args.sample_interval, samples, done))
    sampler.start()
    rss_start = rss_mib(router.pid)
    cpu_start = cpu_seconds(router.pid), cpu_seconds(sim.pid)
    t0 = time.monotonic()
    load = Load(port, args.model, args.rate, args.max_tokens)
    load.run(args.duration)
    window = time.monotonic() - t0
    cpu = [(cpu_seconds(p.pid) - s) / window for p, s in zip((router, sim), cpu_start)]
    done.set()
    sampler.join()
    after = scrape(port)
    live_end = settle_live(port, n)
    if router.poll() is not None or sim.poll() is not None:
        raise RuntimeError("the router or the simulator exited during the run")
    row = summarize(n, ready_s, window, rss_start, samples, before, after, load.results, live_end)
    row["error_examples"] = load.error_bodies
    row["router_cpu_cores"], row["sim_cpu_cores"] = cpu
    return row


def settle_live(port, n, timeout=10):
    """Live workers at the end, allowing a worker churn just started time to sync."""
    start = time.monotonic()
    live = live_workers(port)
    while live < n and time.monotonic() - start < timeout:
        time.sleep(0.5)
        live = live_workers(port)
    return live


def summarize(n, ready_s, window, rss_start, samples, before, after, results, live_end):
    latencies = [s for s, status in results if status == 200]
    errors = {}
    for _, status in results:
        if status != 200:
            errors[str(status)] = errors.get(str(status), 0) + 1
    applied = total(after, "kvfleet_router_events_applied_total") - total(before, "kvfleet_router_events_applied_total")
    lag_b, lag_a = buckets(before, "kvfleet_router_event_lag_seconds"), buckets(after, "kvfleet_router_event_lag_seconds")
    rt_b, rt_a = buckets(before, "kvfleet_router_routing_seconds"), buckets(after, "kvfleet_router_routing_seconds")
    rss = [rss_start] + [s["rss_mib"] for s in samples]
    return {
        "workers": n, "ready_s": ready_s, "window_s": window, "live_workers_end": live_end,
        "requests": len(results), "ok": len(latencies), "errors": errors,
        "rss_mib_start": rss_start, "rss_mib_max": max(rss), "rss_mib_end": rss[-1],
        "index_blocks_end": total(after, "kvfleet_router_index_blocks"),
        "apply_events_per_s": applied / window,
        "event_lag_p50_s": histogram_quantile(0.5, lag_b, lag_a),
        "event_lag_p99_s": histogram_quantile(0.99, lag_b, lag_a),
        "routing_p99_s": histogram_quantile(0.99, rt_b, rt_a),
        "http_p50_s": percentile(latencies, 0.5), "http_p99_s": percentile(latencies, 0.99),
        "rss_series": [(round(s["t"], 1), round(s["rss_mib"], 1)) for s in samples],
    }


# ---- report ----------------------------------------------------------------------------

def ms(v):
    return "n/a" if v is None else f"{v * 1000:.2f}"


def print_table(rows):
    print(f"{'workers':>7} {'ready s':>7} {'live':>5} {'reqs':>6} {'non-200':>7} {'rss MiB start/max/end':>22} "
          f"{'index blocks':>12} {'apply ev/s':>10} {'lag p50 ms':>10} {'lag p99 ms':>10} {'route p99 ms':>12} "
          f"{'http p50 ms':>11} {'http p99 ms':>11} {'cpu router/sim':>14}")
    for r in rows:
        rss = f"{r['rss_mib_start']:.0f}/{r['rss_mib_max']:.0f}/{r['rss_mib_end']:.0f}"
        print(f"{r['workers']:>7} {r['ready_s']:>7.1f} {r['live_workers_end']:>5} {r['requests']:>6} "
              f"{r['requests'] - r['ok']:>7} {rss:>22} {r['index_blocks_end']:>12.0f} {r['apply_events_per_s']:>10.0f} "
              f"{ms(r['event_lag_p50_s']):>10} {ms(r['event_lag_p99_s']):>10} {ms(r['routing_p99_s']):>12} "
              f"{ms(r['http_p50_s']):>11} {ms(r['http_p99_s']):>11} "
              f"{r['router_cpu_cores']:>7.2f}/{r['sim_cpu_cores']:.2f}")
    for r in rows:
        series = " ".join(f"{t:.0f}s:{v:.0f}" for t, v in r["rss_series"])
        print(f"router RSS MiB over time, {r['workers']} workers: {series}")
        if r["errors"]:
            print(f"non-200 answers, {r['workers']} workers: {r['errors']}")
            for status, body in r.get("error_examples", {}).items():
                print(f"  first {status}: {body}")


def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    sizes = [int(x) for x in args.workers.split(",") if x]
    print(f"# router scale: {args.duration:.0f} s at {args.rate} requests/s per size; {args.blocks} blocks and "
          f"{args.events_per_s} block events/s per worker; churn {args.churn}/min; {os.cpu_count()} cores",
          flush=True)
    rows, failures = [], []
    for n in sizes:
        try:
            rows.append(run_one(args, n))
        except RuntimeError as e:
            failures.append(f"{n} workers: {e}")
            print(f"# {n} workers: {e} (logs in {os.path.join(args.work, f'n{n}')})", flush=True)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.check:
        for r in rows:
            if r["ok"] != r["requests"] or r["requests"] == 0:
                failures.append(f"{r['workers']} workers: {r['requests'] - r['ok']} of {r['requests']} requests not 200")
            if r["live_workers_end"] < r["workers"]:
                failures.append(f"{r['workers']} workers: only {r['live_workers_end']} live at the end")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
