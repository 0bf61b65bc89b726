#!/usr/bin/env python3
"""Runs a real Prometheus (Debian package `prometheus`) on loopback with the scrape jobs of
deploy/prometheus/prometheus.yml, and evaluates every query of deploy/grafana/kvfleet.json.

  prometheus_check.py ROOT [--router HOST:PORT --workers HOST:PORT,...]

Without --router, the targets are exporters started here that serve every metric the
issues define (a router and two workers, with the label sets the dashboard groups by), so
the check proves the config loads, every target is up, and every dashboard query is valid
PromQL that returns series. With --router/--workers (a running `kvfleet up` fleet), it
checks the real fleet instead: every target up and the key series present.
Exit 0: pass; 1: a finding; 77: prometheus is not installed.
"""
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_check import KNOWN_METRICS  # noqa: E402

SKIP = 77
# Seconds: scrape often so that rate() has two samples quickly; wait at most this long.
SCRAPE_INTERVAL = "1s"
DEADLINE_S = 40
# Series the fleet must export for the dashboard's headline panels.
KEY_SERIES = ["kvfleet_router_requests_total", "kvfleet_router_time_to_first_token_seconds_bucket",
              "kvfleet_worker_kv_blocks", "kvfleet_worker_prefix_hit_tokens_total"]

HISTOGRAMS = {"kvfleet_router_routing_seconds", "kvfleet_router_matched_blocks",
              "kvfleet_router_time_to_first_token_seconds", "kvfleet_router_inter_token_seconds",
              "kvfleet_router_event_lag_seconds", "kvfleet_worker_step_seconds", "kvfleet_worker_batch_tokens",
              "kvfleet_worker_time_to_first_token_seconds", "kvfleet_router_request_duration_seconds",
              "kvfleet_router_queue_time_seconds"}
GAUGES = {"kvfleet_router_index_blocks", "kvfleet_router_worker_state", "kvfleet_router_inflight",
          "kvfleet_worker_kv_blocks", "kvfleet_worker_requests", "kvfleet_build_info"}
LABELS = {
    "kvfleet_router_requests_total": [{"model": "tiny", "worker": w, "status": "200"} for w in ("w0", "w1")],
    "kvfleet_router_cached_tokens_total": [{"kind": "predicted"}, {"kind": "actual"}],
    "kvfleet_router_inflight": [{"worker": "w0"}, {"worker": "w1"}],
    "kvfleet_router_events_applied_total": [{"type": "stored"}, {"type": "removed"}],
    "kvfleet_router_index_blocks": [{"worker": "w0", "tier": "device"}, {"worker": "w1", "tier": "host"}],
    "kvfleet_router_worker_state": [{"worker": "w0", "state": "LIVE"}, {"worker": "w1", "state": "LIVE"}],
    "kvfleet_worker_kv_blocks": [{"tier": t, "state": s} for t in ("device", "host") for s in ("free", "in_use", "cached")],
    "kvfleet_worker_evictions_total": [{"priority": "35"}],
    "kvfleet_worker_requests": [{"state": "running"}, {"state": "waiting"}],
    "kvfleet_router_requests_refused_total": [{"model": "tiny", "reason": "predicted_ttft"}],
    "kvfleet_worker_requests_refused_total": [{"code": "overloaded"}],
    "kvfleet_router_prompt_tokens_total": [{"model": "tiny"}],
    "kvfleet_router_generation_tokens_total": [{"model": "tiny"}],
    "kvfleet_build_info": [{"version": "0.1.0", "git_sha": "0123456789ab", "build_type": "Release"}],
}


def exposition(component, tick):
    lines = []
    for name in sorted(KNOWN_METRICS):
        # kvfleet_build_info has no component in its name: every process exports it.
        if not name.startswith(f"kvfleet_{component}_") and name != "kvfleet_build_info":
            continue
        kind = "histogram" if name in HISTOGRAMS else "gauge" if name in GAUGES else "counter"
        lines.append(f"# TYPE {name} {kind}")
        for labels in LABELS.get(name, [{}]):
            lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
            if kind == "histogram":
                for le, frac in (("0.01", 0.5), ("0.1", 0.9), ("1", 0.99), ("+Inf", 1.0)):
                    sep = "," if lab else ""
                    lines.append(f'{name}_bucket{{{lab}{sep}le="{le}"}} {int(100 * tick * frac)}')
                lines.append(f"{name}_sum{{{lab}}} {tick}")
                lines.append(f"{name}_count{{{lab}}} {100 * tick}")
            else:
                lines.append(f"{name}{{{lab}}} {10 * tick}")
    return "\n".join(lines) + "\n"


def start_exporter(component):
    start = time.time()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = exposition(component, int((time.time() - start) * 10) + 1).encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def main(argv):
    import yaml
    root = argv[1]
    opts = dict(zip(argv[2::2], argv[3::2]))
    prometheus = shutil.which("prometheus")
    if not prometheus:
        print("prometheus not installed (Debian package prometheus)")
        return SKIP
    servers = []
    if "--router" in opts:
        router, workers = opts["--router"], opts.get("--workers", "").split(",")
    else:
        s, router = start_exporter("router")
        servers.append(s)
        workers = []
        for _ in range(2):
            s, w = start_exporter("worker")
            servers.append(s)
            workers.append(w)

    cfg = yaml.safe_load(open(os.path.join(root, "deploy/prometheus/prometheus.yml")))
    cfg["global"]["scrape_interval"] = SCRAPE_INTERVAL
    cfg["global"]["evaluation_interval"] = SCRAPE_INTERVAL
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    jobs["kvfleet-router"]["static_configs"][0]["targets"] = [router]
    jobs["kvfleet-worker"]["static_configs"][0]["targets"] = [w for w in workers if w]

    findings = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "prometheus.yml")
        yaml.safe_dump(cfg, open(path, "w"))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([prometheus, f"--config.file={path}", f"--storage.tsdb.path={tmp}/data",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "log"), "w"))
        try:
            deadline = time.time() + DEADLINE_S
            targets = []
            while time.time() < deadline:
                try:
                    targets = get_json(base + "/api/v1/targets")["data"]["activeTargets"]
                    up = [t for t in targets if t["health"] == "up"]
                    if targets and len(up) == len(targets):
                        break
                except OSError:
                    pass
                time.sleep(0.5)
            down = [t["scrapeUrl"] for t in targets if t["health"] != "up"]
            if not targets or down:
                findings.append(f"targets not up after {DEADLINE_S}s: {down or 'none listed'}")
            time.sleep(3)  # a few scrapes, so rate() has samples

            def query(expr):
                url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
                try:
                    return get_json(url)
                except urllib.error.HTTPError as e:
                    return json.load(e)

            for series in KEY_SERIES:
                if not query(series).get("data", {}).get("result"):
                    findings.append(f"no series {series}")
            dash = json.load(open(os.path.join(root, "deploy/grafana/kvfleet.json")))
            for p in dash["panels"]:
                for t in p.get("targets", []):
                    expr = t["expr"].replace("$__rate_interval", "10s")
                    r = query(expr)
                    if r.get("status") != "success":
                        findings.append(f"panel '{p['title']}': {r.get('error')}: {expr}")
                    elif not r["data"]["result"] and "--router" not in opts:
                        findings.append(f"panel '{p['title']}': no series for {expr}")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            for s in servers:
                s.shutdown()
    for f in findings:
        print("FAIL:", f)
    print("prometheus: ok" if not findings else f"prometheus: {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
