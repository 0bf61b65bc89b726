#!/usr/bin/env python3
"""Chaos and soak tests of a whole local fleet (the fleet side is in chaos_fleet.py).

Each scenario starts `kvfleet up --backend mock --restart` (router + N mock workers, the
router and workers restarted by `kvfleet up` when they die, as systemd or Kubernetes would),
replays a generated Mooncake-format trace through `kvfleet bench --requests-out`, does
something unkind to the fleet while the bench runs, and checks what clients saw:

  kill            SIGKILL a random worker every --kill-period-s seconds. No request hangs
                  (no bench timeout, the bench ends in time); every request completes or
                  ends with a clean error; the router stops routing to the killed worker
                  (/fleet "routable" false) within the heartbeat timeout.
  drop            Two runs on fresh fleets, clean and with the router's testing-only
                  --debug-drop-events RATE. In each, of the requests whose prefix a worker
                  already held, the router's index (its --decision-log) showed a holder for
                  all but 5%; idle after the run, the index equals every worker's cache. The
                  cached-token ratios are figures: they also move with load.
  router_restart  SIGKILL the router mid-run. Requests sent while it is down fail cleanly
                  (connect errors, counted); requests sent once it is ready again succeed;
                  the index is rebuilt (router index blocks per worker equal to the
                  workers' own device blocks) within 2 s of the new router's start.
  gossip          Two gossiping routers (kvfleet up --routers 2), the bench spread over both,
                  the gossip channel down for --gossip-outage-s from 3 s after start-up
                  (--debug-drop-gossip, testing only): each router forgets its peer within
                  the ttl and routes alone, hears it again once the channel is back, and
                  every request completes.
  router_kill     Three gossiping routers (kvfleet up --routers 3), the bench spread over all
                  three; the second router SIGKILLed halfway and not restarted within the run.
                  Clients of the other two see no error; the killed router's clients see only
                  connection errors (read/write/connect, no timeout), and requests whose
                  connection it refused are sent to another router by the bench and served.
  soak            A steady rate for --duration-s; router and worker RSS sampled at start
                  and end (and every 30 s). With --asan, the binaries are ASan/LSan
                  builds and any sanitizer report in the logs fails the run.

Prints one summary line per figure and writes them as JSON to --out. Exit 0: pass, 1: a
check failed, 77: skipped (binaries missing).
"""

import argparse
import json
import os
import random
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from chaos_fleet import (  # noqa: E402
    GROUPS, HEARTBEAT_TIMEOUT_S, POLL_S, REQUEST_TIMEOUT_S, ROUTER_RESTART_DELAY_S, INDEX_REBUILD_TARGET_S,
    DROP_GROUP_PERIOD_S, DROP_BLIND_TOLERANCE, log, http_get, parse_metrics, metric_sum,
    write_trace, index_blind_hits, rss_kb, Fleet, FleetPoller, run_bench, wait_bench, child_args,
    load_requests, summary_of, Checks, client_checks,
)


def scenario_kill(args, c):
    trace = os.path.join(args.work, "kill.trace.jsonl")
    n = write_trace(trace, args.duration_s, args.rate, seed=1)
    fleet = Fleet(args, "kill")
    try:
        fleet.wait_ready()
        poller = FleetPoller(fleet.url)
        poller.start()
        p, out, reqs_path = run_bench(args, fleet, trace, "kill")
        start = time.time()
        kills = []
        rng = random.Random(7)
        next_kill = start + args.kill_period_s
        while p.poll() is None and time.time() < start + args.duration_s + REQUEST_TIMEOUT_S + 30:
            if time.time() >= next_kill and time.time() < start + args.duration_s - 1:
                pids = {k: v for k, v in fleet.pids().items() if k != "router"}
                if pids:
                    name = rng.choice(sorted(pids))
                    os.kill(pids[name], signal.SIGKILL)
                    kills.append((time.time(), name))
                    log(f"SIGKILL {name} (pid {pids[name]})")
                next_kill += args.kill_period_s
            time.sleep(0.05)
        rc = wait_bench(p, REQUEST_TIMEOUT_S + 30)
        poller.stopping = True
        poller.join()
        reqs = load_requests(reqs_path) if os.path.exists(reqs_path) else []
        client_checks(c, reqs, n, rc, args.duration_s)
        c.figure("kills", len(kills))
        c.check(len(kills) >= 1, "at least one worker was killed during the run")
        # The router stops routing to a killed worker within the heartbeat timeout.
        worst = 0.0
        for t_kill, name in kills:
            seen = [t for t, ws in poller.samples if t >= t_kill and not ws.get(name, False)]
            delay = (seen[0] - t_kill) if seen else float("inf")
            worst = max(worst, delay)
            c.check(delay <= HEARTBEAT_TIMEOUT_S + POLL_S * 2,
                    f"{name} unroutable {delay:.2f} s after SIGKILL (limit {HEARTBEAT_TIMEOUT_S} s)")
        c.figure("worst_unroutable_after_kill_s", round(worst, 3))
        # No request that started once the router had dropped a worker ran on it before it
        # came back (its restarted process is the same name, so look only at the dead window).
        on_dead = 0
        for t_kill, name in kills:
            down = [t for t, ws in poller.samples if t >= t_kill and not ws.get(name, False)]
            back = [t for t, ws in poller.samples if down and t > down[0] and ws.get(name, False)]
            if not down:
                continue
            end = back[0] if back else float("inf")
            on_dead += sum(1 for r in reqs if r["worker"] == name and down[0] + POLL_S < r["sent_unix_s"] < end - 1.0)
        c.figure("requests_served_by_a_dead_worker", on_dead)
        c.check(on_dead == 0, "no request sent in a worker's dead window was served by it")
        ok = sum(1 for r in reqs if r["ok"])
        c.figure("completed", ok)
        st, metrics = http_get(fleet.url + "/metrics")
        c.figure("router_retries", metric_sum(metrics, "kvfleet_router_retries_total") if st == 200 else None)
        # KV pulls (a busy holder's prefix pulled by another worker) cross the kills too: a
        # holder killed mid-pull costs its puller a recompute, never the request (checked above).
        c.figure("router_pulls", metric_sum(metrics, "kvfleet_router_pulls_total") if st == 200 else None)
        fallbacks = 0.0
        for url in fleet.worker_http:
            wst, wm = http_get(url + "/metrics")
            if wst == 200:
                fallbacks += metric_sum(wm, "kvfleet_worker_kv_pull_fallbacks_total")
        c.figure("pull_fallbacks_since_restarts", fallbacks)
        try:
            fleet.wait_ready(timeout_s=args.restart_delay_s + 15)
            back = True
        except RuntimeError:
            back = False
        c.check(back, "kvfleet up restarted every killed worker and the router routes to it again")
    finally:
        fleet.stop()


def scenario_drop(args, c):
    trace = os.path.join(args.work, "drop.trace.jsonl")
    # A prefix comes back every DROP_GROUP_PERIOD_S on average, after the router's predicted
    # entries for it have expired: its hits are found through the event-fed index alone.
    n = write_trace(trace, args.duration_s, args.rate, seed=2, groups=max(GROUPS, int(args.rate * DROP_GROUP_PERIOD_S)))
    for name, extra in (("clean", ()), ("drop", (f"--debug-drop-events={args.drop_rate}",))):
        decisions_path = os.path.join(args.work, f"drop-{name}.decisions.jsonl")
        if os.path.exists(decisions_path):
            os.remove(decisions_path)
        fleet = Fleet(args, f"drop-{name}", router_args=extra + (f"--decision-log={decisions_path}",))
        try:
            fleet.wait_ready()
            p, out, reqs_path = run_bench(args, fleet, trace, name)
            rc = wait_bench(p, args.duration_s + REQUEST_TIMEOUT_S + 30)
            reqs = load_requests(reqs_path) if os.path.exists(reqs_path) else []
            client_checks(c, reqs, n, rc, args.duration_s)
            s = summary_of(out)
            c.figure(f"{name}_cached_token_ratio", round(s["cached_token_ratio"], 4))
            c.figure(f"{name}_ttft_mean_ms", round(s["ttft_ms"]["mean"], 1))
            # Idle, the index holds exactly what each worker holds: what was lost came back.
            deadline, converged = time.time() + 2 * HEARTBEAT_TIMEOUT_S, False
            while not converged and time.time() < deadline:
                converged = index_matches(fleet, 0)
                time.sleep(POLL_S)
            c.check(converged, f"idle, the router's index equals every worker's cache [{name}]")
            st, metrics = http_get(fleet.url + "/metrics")
            if st == 200:
                c.figure(f"{name}_event_gaps", metric_sum(metrics, "kvfleet_router_event_gaps_total"))
                c.figure(f"{name}_event_replays", metric_sum(metrics, "kvfleet_router_event_replays_total"))
        finally:
            fleet.stop()
        # Lost events may cost hits only while the loss goes unnoticed. Whether a hit is taken
        # also depends on load, which differs from run to run, so what is checked is what the
        # router saw: of the requests whose prefix some worker held, those for which the index
        # showed no holder with it.
        decisions = load_requests(decisions_path) if os.path.exists(decisions_path) else []
        b = index_blind_hits(trace, reqs, decisions)
        c.check(b["undecided"] == 0, f"every completed request has its decision-log line [{name}] "
                                     f"({b['undecided']} have none)")
        c.figure(f"{name}_held_prefix_requests", b["held"])
        c.figure(f"{name}_index_blind_requests", b["blind"])
        c.check(b["held"] > 0, f"some requests came to a prefix a worker held [{name}]")
        c.check(b["blind"] <= DROP_BLIND_TOLERANCE * b["held"],
                f"the index showed a holder for all but {DROP_BLIND_TOLERANCE:.0%} of the {b['held']} requests "
                f"whose prefix a worker held [{name}]: {b['blind']} blind")
    c.check(c.figures.get("drop_event_gaps", 0) > 0, "the router saw the dropped batches as gaps")


class GossipPoller(threading.Thread):
    """Samples each router's kvfleet_router_gossip_peers every POLL_S: [(t, [peers per router])]."""

    def __init__(self, urls):
        super().__init__(daemon=True)
        self.urls, self.samples, self.stopping = urls, [], False

    def run(self):
        while not self.stopping:
            t, peers = time.time(), []
            for url in self.urls:
                st, body = http_get(url + "/metrics", timeout=1.0)
                peers.append(metric_sum(body, "kvfleet_router_gossip_peers") if st == 200 else None)
            self.samples.append((t, peers))
            time.sleep(POLL_S)


def scenario_gossip(args, c):
    trace = os.path.join(args.work, "gossip.trace.jsonl")
    n = write_trace(trace, args.duration_s, args.rate, seed=3)
    # Short gossip periods, so that the outage and the recovery each show within a second.
    router_args = ("--gossip-interval-ms=20", "--gossip-ttl-ms=300",
                   f"--debug-drop-gossip=3:{args.gossip_outage_s}")
    t0 = time.time()  # the routers start just after: their outage is [t0 + 3, t0 + 3 + outage) and a little later
    fleet = Fleet(args, "gossip", router_args=router_args, routers=2)
    poller = GossipPoller(fleet.urls)
    try:
        fleet.wait_ready()
        poller.start()
        p, _, reqs_path = run_bench(args, fleet, trace, "gossip")
        rc = wait_bench(p, args.duration_s + REQUEST_TIMEOUT_S + 30)
        time.sleep(1.0)  # past the outage's end when the run was shorter
        poller.stopping = True
        poller.join()
        reqs = load_requests(reqs_path) if os.path.exists(reqs_path) else []
        errors = client_checks(c, reqs, n, rc, args.duration_s)
        c.check(not errors, f"no request failed while the gossip channel was down ({errors})")
        down_from, down_to = t0 + 3 + 1.5, t0 + 3 + args.gossip_outage_s  # a start-up's and a ttl's slack
        for r, url in enumerate(fleet.urls):
            during = [s[1][r] for s in poller.samples if down_from <= s[0] < down_to and s[1][r] is not None]
            after = [s[1][r] for s in poller.samples if s[0] >= down_to + 2 and s[1][r] is not None]
            c.figure(f"router{r}_gossip_peers_during_after", [sorted(set(during)), sorted(set(after))])
            c.check(0 in during, f"router {r} forgot its peer while the channel was down")
            c.check(bool(after) and after[-1] == 1, f"router {r} hears its peer again after the outage")
            st, metrics = http_get(url + "/metrics")
            if st == 200:
                c.figure(f"router{r}_gossip_applied",
                         metric_sum(metrics, "kvfleet_router_gossip_frames_total", direction="applied"))
    finally:
        poller.stopping = True
        fleet.stop()


def router_pid(fleet, url):
    """The pid of the router `kvfleet up` started to serve `url` (its --http-port)."""
    port = url.rsplit(":", 1)[1]
    for pid, args in child_args(fleet.proc.pid):
        if args and args[0].endswith("kvfleet-router") and "--http-port" in args and \
                args[args.index("--http-port") + 1] == port:
            return pid
    return None


def scenario_router_kill(args, c):
    trace = os.path.join(args.work, "router_kill.trace.jsonl")
    n = write_trace(trace, args.duration_s, args.rate, seed=4)
    # Restarted only well after the run: the killed router stays down for its second half.
    fleet = Fleet(args, "router_kill", routers=3, restart_delay_s=args.duration_s + 60)
    try:
        fleet.wait_ready()
        p, _, reqs_path = run_bench(args, fleet, trace, "router_kill")
        time.sleep(args.duration_s / 2)
        victim = fleet.urls[1]
        pid = router_pid(fleet, victim)
        c.check(pid is not None, f"found the router serving {victim}")
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            log(f"SIGKILL router {victim} (pid {pid})")
        rc = wait_bench(p, args.duration_s + REQUEST_TIMEOUT_S + 30)
        reqs = load_requests(reqs_path) if os.path.exists(reqs_path) else []
        c.check(rc is not None, f"kvfleet bench ended within its deadline (rc {rc})")
        c.check(len(reqs) == n, f"every request has an outcome ({len(reqs)} of {n})")
        others = [r for r in reqs if r["router"] != victim]
        failed_others = [r for r in others if not r["ok"]]
        c.figure("served_by_others", len(others))
        c.check(not failed_others, f"clients of the other routers saw no error ({len(failed_others)} did: "
                                   f"{sorted({r['error'] for r in failed_others})})")
        on_victim = [r for r in reqs if r["router"] == victim]
        kinds = {}
        for r in on_victim:
            if not r["ok"]:
                kinds[r["error"]] = kinds.get(r["error"], 0) + 1
        c.figure("killed_router_errors_by_kind", kinds)
        c.check(set(kinds) <= {"connect", "read", "write"},
                f"the killed router's clients saw only connection errors ({kinds})")
        retried = [r for r in reqs if r.get("connect_retries", 0) > 0]
        c.figure("sent_to_another_router", len(retried))
        c.check(len(retried) > 0 and all(r["ok"] for r in retried),
                f"requests the killed router refused went to another router and were served "
                f"({sum(r['ok'] for r in retried)} of {len(retried)})")
    finally:
        fleet.stop()


def index_matches(fleet, tolerance):
    """True when, for every worker, the router's device-tier index blocks equal the worker's
    own device blocks holding a hash (in use or cached), within `tolerance` (a fraction)."""
    st, rm = http_get(fleet.url + "/metrics", timeout=1.0)
    if st != 200:
        return False
    index = parse_metrics(rm, "kvfleet_router_index_blocks")
    for i, wurl in enumerate(fleet.worker_http):
        st, wm = http_get(wurl + "/metrics", timeout=1.0)
        if st != 200:
            return False
        own = metric_sum(wm, "kvfleet_worker_kv_blocks", tier="device", state="cached") + \
            metric_sum(wm, "kvfleet_worker_kv_blocks", tier="device", state="in_use")
        have = index.get(frozenset({"worker": f"worker-{i}", "tier": "device"}.items()))
        if have is None:
            return False
        if tolerance == 0:
            # Idle: nothing in use, so every block the worker has is a cached, hashed one.
            if have != own:
                return False
        elif have < own * (1 - tolerance):
            return False
    return True


def restart_router_and_time(fleet, c, label, tolerance):
    """SIGKILLs the router; `kvfleet up` starts a new one. Returns the new router's start time."""
    old = fleet.pids().get("router")
    os.kill(old, signal.SIGKILL)
    t_kill = time.time()
    log(f"SIGKILL router (pid {old}) [{label}]")
    new = None
    while new is None and time.time() < t_kill + 10:
        p = fleet.pids().get("router")
        if p and p != old:
            new = p
        else:
            time.sleep(0.01)
    t_start = time.time()
    c.check(new is not None, f"kvfleet up started a new router [{label}]")
    ready = rebuilt = None
    while time.time() < t_start + 15 and (ready is None or rebuilt is None):
        if ready is None and http_get(fleet.url + "/ready", timeout=0.5)[0] == 200:
            ready = time.time() - t_start
        if rebuilt is None and index_matches(fleet, tolerance):
            rebuilt = time.time() - t_start
        time.sleep(0.02)
    c.figure(f"{label}_router_ready_s", None if ready is None else round(ready, 3))
    c.figure(f"{label}_index_rebuilt_s", None if rebuilt is None else round(rebuilt, 3))
    c.check(rebuilt is not None and rebuilt <= INDEX_REBUILD_TARGET_S,
            f"index rebuilt within {INDEX_REBUILD_TARGET_S} s of the router's start [{label}]: {rebuilt}")
    return t_kill, t_start + (ready or 0)


def scenario_router_restart(args, c):
    trace = os.path.join(args.work, "router.trace.jsonl")
    n = write_trace(trace, args.duration_s, args.rate, seed=3)
    # The router comes back as fast as a supervisor would restart it.
    fleet = Fleet(args, "router_restart", restart_delay_s=ROUTER_RESTART_DELAY_S)
    try:
        fleet.wait_ready()
        p, out, reqs_path = run_bench(args, fleet, trace, "router_restart")
        time.sleep(args.duration_s / 2)
        # Under load: the index is rebuilt once it holds what the workers hold, give or take
        # the blocks whose events are in flight (5%).
        t_kill, t_ready = restart_router_and_time(fleet, c, "loaded", 0.05)
        rc = wait_bench(p, args.duration_s + REQUEST_TIMEOUT_S + 30)
        reqs = load_requests(reqs_path) if os.path.exists(reqs_path) else []
        errors = client_checks(c, reqs, n, rc, args.duration_s)
        # A restarted router that has not yet re-learned a model answers 503 with Retry-After
        # (--unknown-model-grace-s), never 404: the model exists, its workers are re-registering.
        c.check("http_404" not in errors, f"no request got 404 after the restart ({errors.get('http_404', 0)} did)")
        late = [r for r in reqs if r["sent_unix_s"] > t_ready + 0.5]
        c.figure("requests_after_restart", len(late))
        c.check(late and all(r["ok"] for r in late), "every request sent once the new router was ready completed")
        down = [r for r in reqs if t_kill <= r["sent_unix_s"] <= t_ready]
        c.figure("errors_while_router_down", sum(1 for r in down if not r["ok"]))
        # Idle: exact equality with the workers' blocks.
        time.sleep(1)
        restart_router_and_time(fleet, c, "idle", 0)
    finally:
        fleet.stop()


def scenario_soak(args, c):
    trace = os.path.join(args.work, "soak.trace.jsonl")
    n = write_trace(trace, args.duration_s, args.rate, seed=4)
    # A bounded KV cache per worker: the workers evict, so the index and every cache reach
    # a steady size, and growing memory would mean a leak, not a fuller cache.
    worker_args = [f"--kv-cache-bytes={args.kv_cache_mib << 20}"] if args.kv_cache_mib else []
    # The replay ring fills for its first --event-ring-batches batches (heartbeats included),
    # which a soak shorter than that sees as growth; a small ring shows the steady state.
    if args.event_ring_batches:
        worker_args.append(f"--event-ring-batches={args.event_ring_batches}")
    fleet = Fleet(args, "soak-asan" if args.asan else "soak", worker_args=worker_args)
    try:
        fleet.wait_ready(timeout_s=180)
        p, out, reqs_path = run_bench(args, fleet, trace, "soak")
        start = time.time()
        series = []
        next_sample = start + 10
        while p.poll() is None and time.time() < start + args.duration_s + REQUEST_TIMEOUT_S + 30:
            if time.time() >= next_sample:
                sample = {name: rss_kb(pid) for name, pid in fleet.pids().items()}
                st, metrics = http_get(fleet.url + "/metrics")
                sample["router_index_blocks"] = metric_sum(metrics, "kvfleet_router_index_blocks") if st == 200 else None
                series.append((round(time.time() - start), sample))
                log(f"RSS kB at {series[-1][0]} s: {sample}")
                next_sample += 30
            time.sleep(0.2)
        rc = wait_bench(p, REQUEST_TIMEOUT_S + 30)
        reqs = load_requests(reqs_path) if os.path.exists(reqs_path) else []
        client_checks(c, reqs, n, rc, args.duration_s)
        c.check(all(r["ok"] for r in reqs), "every soak request completed")
        if series:
            c.figure("rss_kb_start", series[0])
            c.figure("rss_kb_end", series[-1])
            c.figure("rss_kb_series", series)
        s = summary_of(out) if os.path.exists(out) else None
        if s:
            c.figure("soak_cached_token_ratio", round(s["cached_token_ratio"], 4))
            c.figure("soak_ttft_ms", s["ttft_ms"])
    finally:
        fleet.stop()
    if args.asan:
        reports = []
        logs = os.path.join(fleet.dir, "logs")
        for name in sorted(os.listdir(logs)):
            with open(os.path.join(logs, name), errors="replace") as f:
                text = f.read()
            for marker in ("ERROR: LeakSanitizer", "ERROR: AddressSanitizer", "runtime error:"):
                if marker in text:
                    reports.append(f"{name}: {marker}")
        c.figure("sanitizer_reports", reports)
        c.check(not reports, "no ASan/LSan report in the router's or workers' logs")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", required=True,
                    choices=["kill", "drop", "router_restart", "router_kill", "gossip", "soak"])
    ap.add_argument("--kvfleet", required=True)
    ap.add_argument("--router-bin", default="")
    ap.add_argument("--worker-bin", default="")
    ap.add_argument("--work", required=True)
    ap.add_argument("--port-base", type=int, default=21000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--duration-s", type=float, default=30)
    ap.add_argument("--rate", type=float, default=10, help="requests per second")
    ap.add_argument("--kill-period-s", type=float, default=10)
    ap.add_argument("--restart-delay-s", type=float, default=4,
                    help="kvfleet up --restart-delay-s (longer than the heartbeat timeout, so the dead window shows)")
    ap.add_argument("--drop-rate", type=float, default=0.05)
    ap.add_argument("--gossip-outage-s", type=float, default=10,
                    help="gossip: how long the gossip channel is down, from 3 s after start-up")
    ap.add_argument("--event-ring-batches", type=int, default=0,
                    help="soak: each worker's replay ring in batches (0: the worker's default, 10,000)")
    ap.add_argument("--kv-cache-mib", type=int, default=1024,
                    help="soak: each mock worker's KV cache (MiB; 0: the backend's default, 54 GiB)")
    ap.add_argument("--asan", action="store_true", help="the binaries are ASan builds: fail on sanitizer reports")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    for b in (args.kvfleet, args.router_bin, args.worker_bin):
        if b and not os.access(b, os.X_OK):
            log(f"skipped: {b} is missing")
            return 77
    os.makedirs(args.work, exist_ok=True)
    c = Checks()
    loadavg = os.getloadavg()
    c.figure("load_average_at_start", [round(x, 2) for x in loadavg])
    {"kill": scenario_kill, "drop": scenario_drop, "router_restart": scenario_router_restart,
     "router_kill": scenario_router_kill, "gossip": scenario_gossip, "soak": scenario_soak}[args.scenario](args, c)
    c.figure("load_average_at_end", [round(x, 2) for x in os.getloadavg()])
    result = {"scenario": args.scenario, "workers": args.workers, "duration_s": args.duration_s, "rate": args.rate,
              "asan": args.asan, "passed": not c.failures, "failures": c.failures, "figures": c.figures}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    log(("PASSED " if not c.failures else "FAILED ") + args.scenario + (": " + "; ".join(c.failures) if c.failures else ""))
    return 0 if not c.failures else 1


if __name__ == "__main__":
    sys.exit(main())
